//! Linkerd's opaque transport header: the first bytes a meshed client sends,
//! inside TLS negotiated with ALPN `transport.l5d.io/v1`, to the peer proxy's
//! inbound port, naming the port (and optionally the name and protocol) the
//! connection is for: `transport.l5d.io/v1\r\n\r\n`, a big-endian u32
//! length, then the protobuf message below.

use prost::Message;

pub const PREFACE: &[u8] = b"transport.l5d.io/v1\r\n\r\n";
/// The largest message accepted (Linkerd reads into a 64 KiB buffer).
pub const MAX_MESSAGE: usize = 64 * 1024;

#[derive(Clone, PartialEq, prost::Message)]
struct HeaderProto {
    #[prost(int32, tag = "1")]
    port: i32,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, optional, tag = "3")]
    session_protocol: Option<SessionProtocolProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SessionProtocolProto {
    #[prost(oneof = "Kind", tags = "1, 2")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(message, tag = "1")]
    Http1(Empty),
    #[prost(message, tag = "2")]
    Http2(Empty),
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
struct Empty {}

/// The protocol the client will speak after the header, when it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionProtocol {
    Http1,
    Http2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportHeader {
    pub port: u16,
    /// A gateway target's name; `None` for the pod's own port.
    pub name: Option<String>,
    pub protocol: Option<SessionProtocol>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("not a transport header (wrong preface)")]
    Preface,
    #[error("transport header of {0} bytes is over the {MAX_MESSAGE} byte limit")]
    TooLong(usize),
    #[error("transport header does not decode")]
    Decode,
    #[error("transport header names port {0}, outside 1-65535")]
    Port(i32),
}

impl TransportHeader {
    pub fn encode(&self) -> Vec<u8> {
        let msg = HeaderProto {
            port: i32::from(self.port),
            name: self.name.clone().unwrap_or_default(),
            session_protocol: self.protocol.map(|p| SessionProtocolProto {
                kind: Some(match p {
                    SessionProtocol::Http1 => Kind::Http1(Empty {}),
                    SessionProtocol::Http2 => Kind::Http2(Empty {}),
                }),
            }),
        };
        let body = msg.encode_to_vec();
        let mut out = Vec::with_capacity(PREFACE.len() + 4 + body.len());
        out.extend_from_slice(PREFACE);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a header from the start of `buf`: `Ok(None)` when more bytes
    /// are needed, else the header and how many bytes it took. A prefix of a
    /// valid header never errs.
    pub fn decode(buf: &[u8]) -> Result<Option<(Self, usize)>, HeaderError> {
        let n = buf.len().min(PREFACE.len());
        if buf[..n] != PREFACE[..n] {
            return Err(HeaderError::Preface);
        }
        let Some(len) = buf.get(PREFACE.len()..PREFACE.len() + 4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(HeaderError::TooLong(len));
        }
        let start = PREFACE.len() + 4;
        let Some(body) = buf.get(start..start + len) else {
            return Ok(None);
        };
        let msg = HeaderProto::decode(body).map_err(|_| HeaderError::Decode)?;
        let port = u16::try_from(msg.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or(HeaderError::Port(msg.port))?;
        let protocol = msg.session_protocol.and_then(|p| match p.kind? {
            Kind::Http1(_) => Some(SessionProtocol::Http1),
            Kind::Http2(_) => Some(SessionProtocol::Http2),
        });
        Ok(Some((
            Self {
                port,
                name: Some(msg.name).filter(|n| !n.is_empty()),
                protocol,
            },
            start + len,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_every_prefix_waits() {
        for h in [
            TransportHeader {
                port: 8080,
                name: None,
                protocol: None,
            },
            TransportHeader {
                port: 443,
                name: Some("web.shop.svc.cluster.local".into()),
                protocol: Some(SessionProtocol::Http2),
            },
        ] {
            let mut bytes = h.encode();
            bytes.extend_from_slice(b"payload");
            let (back, used) = TransportHeader::decode(&bytes).unwrap().unwrap();
            assert_eq!(back, h);
            assert_eq!(&bytes[used..], b"payload");
            for n in 0..used {
                assert_eq!(TransportHeader::decode(&bytes[..n]), Ok(None), "prefix {n}");
            }
        }
    }

    #[test]
    fn refuses_what_is_not_a_header() {
        assert_eq!(
            TransportHeader::decode(b"GET / HTTP/1.1"),
            Err(HeaderError::Preface)
        );
        let mut big = PREFACE.to_vec();
        big.extend_from_slice(&(MAX_MESSAGE as u32 + 1).to_be_bytes());
        assert!(matches!(
            TransportHeader::decode(&big),
            Err(HeaderError::TooLong(_))
        ));
        let mut zero = PREFACE.to_vec();
        zero.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(TransportHeader::decode(&zero), Err(HeaderError::Port(0)));
    }
}
