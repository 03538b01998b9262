//! The snapshot file's format (pure: bytes in, bytes out).
//!
//! `MAGIC`, the format's version (u32), the body's length (u64) and an
//! FNV-1a hash of the body (u64), all little-endian, then the body: a
//! protobuf [`Body`] whose entries each hold one message as the controller
//! sent it (or, for endpoints, one `Update` adding the whole set). A file
//! that is cut short, damaged, of another version or another pod's is
//! refused whole: nothing of it is used.

use bytes::Bytes;
use prost::Message;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const MAGIC: &[u8; 12] = b"BALLASTSNAP\n";
pub const VERSION: u32 = 1;
const HEADER: usize = MAGIC.len() + 4 + 8 + 8;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `InboundServerPolicies.WatchPort`: a `Server`, by port.
    Inbound = 1,
    /// `OutboundPolicies.Watch`: an `OutboundPolicy`, by target.
    Outbound = 2,
    /// `GetProfile`: a `DestinationProfile`, by address.
    Profile = 3,
    /// `Get`: an `Update` with the whole set, by authority.
    Endpoints = 4,
}

impl Kind {
    /// In the order a snapshot keeps them when it cannot keep all: inbound
    /// policy first (without it a port falls to its default policy).
    pub const ALL: [Kind; 4] = [
        Kind::Inbound,
        Kind::Outbound,
        Kind::Profile,
        Kind::Endpoints,
    ];

    /// Its place in [`Kind::ALL`].
    pub fn index(self) -> usize {
        self as usize - 1
    }

    fn from_wire(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == v)
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Inbound => "inbound_policy",
            Kind::Outbound => "outbound_policy",
            Kind::Profile => "profile",
            Kind::Endpoints => "endpoints",
        }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct Body {
    /// Whose snapshot it is (`PortSpec.workload`, the pod's namespace and name).
    #[prost(string, tag = "1")]
    pub workload: String,
    #[prost(uint64, tag = "2")]
    pub written_unix_ms: u64,
    #[prost(message, repeated, tag = "3")]
    pub entries: Vec<WireEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireEntry {
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    #[prost(string, tag = "2")]
    pub key: String,
    /// When the controller last said it (or confirmed it while connected).
    #[prost(uint64, tag = "3")]
    pub heard_unix_ms: u64,
    #[prost(bytes = "bytes", tag = "4")]
    pub message: Bytes,
}

/// One entry of a snapshot read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub key: String,
    pub heard: SystemTime,
    pub message: Bytes,
}

/// Why a snapshot file was not used; the label of
/// `discovery_snapshot_ignored_total`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the file is cut short ({0} bytes)")]
    Truncated(usize),
    #[error("not a snapshot file, or damaged: {0}")]
    Corrupt(String),
    #[error("format version {0}, this proxy reads {VERSION}")]
    Version(u32),
    #[error("written for {found:?}, this proxy is {ours:?}")]
    Foreign { found: String, ours: String },
    #[error("larger than --snapshot-max-bytes ({0} bytes)")]
    TooLarge(u64),
}

impl Refused {
    pub fn label(&self) -> &'static str {
        match self {
            Refused::Truncated(_) => "truncated",
            Refused::Corrupt(_) => "corrupt",
            Refused::Version(_) => "version",
            Refused::Foreign { .. } => "foreign",
            Refused::TooLarge(_) => "too_large",
        }
    }
}

/// FNV-1a, 64 bits: finds damage and truncation, not forgery (the file lives
/// on the pod's own volume).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The file's bytes for `body`.
pub fn encode(body: &Body) -> Vec<u8> {
    let encoded = body.encode_to_vec();
    let mut out = Vec::with_capacity(HEADER + encoded.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(&encoded).to_le_bytes());
    out.extend_from_slice(&encoded);
    out
}

/// The size of the file `encode` writes for a body of `body_len` bytes.
pub fn file_len(body_len: usize) -> usize {
    HEADER + body_len
}

/// The entries of a snapshot written for `workload`, or why it is refused.
/// Entries of kinds this proxy does not know are skipped.
pub fn decode(bytes: &[u8], workload: &str) -> Result<(SystemTime, Vec<Entry>), Refused> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        if bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes) {
            return Err(Refused::Truncated(bytes.len()));
        }
        return Err(Refused::Corrupt("no snapshot header".into()));
    }
    if bytes.len() < HEADER {
        return Err(Refused::Truncated(bytes.len()));
    }
    let word = |at: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(b)
    };
    let version = word(MAGIC.len(), 4) as u32;
    if version != VERSION {
        return Err(Refused::Version(version));
    }
    let len = word(MAGIC.len() + 4, 8);
    let sum = word(MAGIC.len() + 12, 8);
    let body = &bytes[HEADER..];
    if (body.len() as u64) < len {
        return Err(Refused::Truncated(bytes.len()));
    }
    if body.len() as u64 != len {
        return Err(Refused::Corrupt(format!(
            "{} bytes after the header, {len} announced",
            body.len()
        )));
    }
    if checksum(body) != sum {
        return Err(Refused::Corrupt("checksum mismatch".into()));
    }
    let body = Body::decode(body).map_err(|e| Refused::Corrupt(e.to_string()))?;
    if body.workload != workload {
        return Err(Refused::Foreign {
            found: body.workload.chars().take(128).collect(),
            ours: workload.chars().take(128).collect(),
        });
    }
    let entries = body
        .entries
        .into_iter()
        .filter_map(|e| {
            Some(Entry {
                kind: Kind::from_wire(e.kind)?,
                key: e.key,
                heard: from_unix_ms(e.heard_unix_ms),
                message: e.message,
            })
        })
        .collect();
    Ok((from_unix_ms(body.written_unix_ms), entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> Body {
        Body {
            workload: r#"{"ns":"shop","pod":"web-0"}"#.into(),
            written_unix_ms: 1_700_000_000_000,
            entries: vec![
                WireEntry {
                    kind: Kind::Inbound as u32,
                    key: "8080".into(),
                    heard_unix_ms: 1_700_000_000_000,
                    message: Bytes::from_static(b"\x0a\x01x"),
                },
                WireEntry {
                    kind: 99,
                    key: "from a newer proxy".into(),
                    heard_unix_ms: 1,
                    message: Bytes::new(),
                },
            ],
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written_and_unknown_kinds_are_skipped() {
        let b = body();
        let bytes = encode(&b);
        assert_eq!(bytes.len(), file_len(b.encoded_len()));
        let (written, entries) = decode(&bytes, &b.workload).expect("reads");
        assert_eq!(unix_ms(written), b.written_unix_ms);
        assert_eq!(
            entries,
            vec![Entry {
                kind: Kind::Inbound,
                key: "8080".into(),
                heard: from_unix_ms(1_700_000_000_000),
                message: Bytes::from_static(b"\x0a\x01x"),
            }]
        );
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused() {
        let b = body();
        let bytes = encode(&b);
        for cut in 0..bytes.len() {
            let refused = decode(&bytes[..cut], &b.workload).expect_err("a cut file");
            assert!(
                matches!(refused, Refused::Truncated(_)),
                "cut at {cut}: {refused:?}"
            );
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            assert!(
                decode(&damaged, &b.workload).is_err(),
                "a flipped byte at {at} went unseen"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode(&longer, &b.workload),
            Err(Refused::Corrupt(_))
        ));
        assert!(matches!(
            decode(b"garbage that is long enough to have a header", &b.workload),
            Err(Refused::Corrupt(_))
        ));
    }

    #[test]
    fn another_pods_or_another_versions_snapshot_is_refused() {
        let b = body();
        let bytes = encode(&b);
        let refused = decode(&bytes, r#"{"ns":"shop","pod":"web-1"}"#).expect_err("foreign");
        assert_eq!(refused.label(), "foreign");
        let mut newer = bytes.clone();
        newer[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode(&newer, &b.workload), Err(Refused::Version(2)));
    }
}
