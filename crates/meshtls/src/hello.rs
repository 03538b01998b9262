//! The server name of a TLS ClientHello, read from a connection's first
//! bytes without consuming them, so an inbound proxy can decide whether to
//! terminate TLS (the name is its own identity) or pass it through.

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// Not enough bytes yet to decide; read more (up to [`MAX_RECORD`]).
    NeedMore,
    /// Not a TLS handshake.
    NotTls,
    /// A ClientHello, with its SNI host name if it sent one.
    ClientHello { server_name: Option<String> },
}

/// The largest first record read: the TLS plaintext limit plus its header.
pub const MAX_RECORD: usize = 5 + 16_384;

const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 0x01;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// Decides from `buf`, the bytes read so far. Never panics; the answer for a
/// prefix is `NeedMore` or the same answer as for the whole.
pub fn peek(buf: &[u8]) -> Peek {
    let Some(&kind) = buf.first() else {
        return Peek::NeedMore;
    };
    if kind != HANDSHAKE {
        return Peek::NotTls;
    }
    if buf.len() < 5 {
        // A TLS record's major version is 3.
        if buf.len() >= 2 && buf[1] != 3 {
            return Peek::NotTls;
        }
        return Peek::NeedMore;
    }
    if buf[1] != 3 {
        return Peek::NotTls;
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len > MAX_RECORD - 5 {
        return Peek::NotTls;
    }
    if buf.len() < 5 + len {
        return Peek::NeedMore;
    }
    let record = &buf[5..5 + len];
    match client_hello_sni(record) {
        Some(server_name) => Peek::ClientHello { server_name },
        None => Peek::NotTls,
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// `None`: not a ClientHello. `Some(None)`: a ClientHello without a host name
/// (or with one that is not a valid name, which no mesh identity is).
fn client_hello_sni(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(record);
    if r.u8()? != CLIENT_HELLO {
        return None;
    }
    let len = r.take(3)?;
    let len = usize::from(len[0]) << 16 | usize::from(len[1]) << 8 | usize::from(len[2]);
    // A hello split over several records: read what the first one holds.
    let body = &r.0[..len.min(r.0.len())];
    let mut r = Reader(body);
    let _version = r.u16()?;
    r.take(32)?;
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let Some(mut exts) = r.vec16().map(Reader) else {
        return Some(None);
    };
    while !exts.0.is_empty() {
        let Some(kind) = exts.u16() else {
            return Some(None);
        };
        let Some(data) = exts.vec16() else {
            return Some(None);
        };
        if kind != EXT_SERVER_NAME {
            continue;
        }
        let mut list = Reader(data);
        let Some(mut names) = list.vec16().map(Reader) else {
            return Some(None);
        };
        while let Some(name_type) = names.u8() {
            let Some(name) = names.vec16() else {
                return Some(None);
            };
            if name_type == NAME_TYPE_HOST {
                return Some(
                    std::str::from_utf8(name)
                        .ok()
                        .filter(|n| !n.is_empty() && n.len() <= crate::name::MAX_NAME_LEN)
                        .map(|n| n.to_ascii_lowercase()),
                );
            }
        }
        return Some(None);
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let mut entry = vec![NAME_TYPE_HOST];
            entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
            entry.extend_from_slice(name.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend_from_slice(&entry);
            exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
            exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
            exts.extend_from_slice(&list);
        }
        // An unrelated extension after it (supported_versions).
        exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0]); // session id
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
        body.extend_from_slice(&[0x01, 0x00]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![CLIENT_HELLO, 0, (body.len() >> 8) as u8, body.len() as u8];
        hs.extend_from_slice(&body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn reads_the_server_name() {
        let h = hello(Some(
            "Web.Shop.serviceaccount.identity.linkerd.cluster.local",
        ));
        assert_eq!(
            peek(&h),
            Peek::ClientHello {
                server_name: Some("web.shop.serviceaccount.identity.linkerd.cluster.local".into())
            }
        );
        assert_eq!(peek(&hello(None)), Peek::ClientHello { server_name: None });
    }

    #[test]
    fn every_prefix_needs_more() {
        let h = hello(Some("a.b"));
        for n in 0..h.len() {
            assert_eq!(peek(&h[..n]), Peek::NeedMore, "prefix {n}");
        }
    }

    #[test]
    fn other_protocols_are_not_tls() {
        assert_eq!(peek(b"GET / HTTP/1.1\r\n"), Peek::NotTls);
        assert_eq!(peek(b"PRI * HTTP/2.0"), Peek::NotTls);
        assert_eq!(peek(&[0x16, 0x02]), Peek::NotTls);
        assert_eq!(peek(&[0x16, 3, 1, 0, 0]), Peek::NotTls);
        // A record that holds something other than a ClientHello.
        assert_eq!(peek(&[0x16, 3, 3, 0, 1, 2]), Peek::NotTls);
    }

    #[test]
    fn a_real_rustls_hello_names_its_server() {
        use std::sync::Arc;
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name =
            rustls::pki_types::ServerName::try_from("x.y.serviceaccount.identity.l.c").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        assert_eq!(
            peek(&out),
            Peek::ClientHello {
                server_name: Some("x.y.serviceaccount.identity.l.c".into())
            }
        );
    }
}
