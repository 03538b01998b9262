//! The `Update`s that move a client from one endpoint set to the next, and
//! the encoders that turn a subscription's answers into shared gRPC frames.

use super::translate::{self, tcp_address, weighted_addr, MeshConfig};
use crate::{
    feed::Encode,
    index::{EndpointSet, ProfileView, Target},
};
use bytes::{BufMut, Bytes, BytesMut};
use linkerd2_proxy_api::destination::{update, AddrSet, NoEndpoints, Update, WeightedAddrSet};
use prost::Message;

/// `msg` as one gRPC message frame (uncompressed flag, length, protobuf),
/// ready to be sent on any stream.
pub fn frame(msg: &impl Message) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    // Messages are bounded (MAX_ADDRS_PER_UPDATE), far below 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    msg.encode_raw(&mut buf);
    buf.freeze()
}

/// Endpoint sets as `Update`s, by Linkerd's rules: a new stream gets the
/// whole set; then differences.
pub struct EndpointsEncoder {
    pub mesh: MeshConfig,
}

impl Encode<EndpointSet> for EndpointsEncoder {
    fn full(&self, cur: &EndpointSet) -> Vec<Bytes> {
        diff(None, cur, &self.mesh).iter().map(frame).collect()
    }

    fn diff(&self, prev: &EndpointSet, cur: &EndpointSet) -> Vec<Bytes> {
        diff(Some(prev), cur, &self.mesh)
            .iter()
            .map(frame)
            .collect()
    }

    fn reset(&self, cur: &EndpointSet) -> Option<Bytes> {
        // An empty answer is sent as `no_endpoints`, itself a reset; a set
        // is preceded by one so that nothing the client held survives.
        (!cur.endpoints.is_empty()).then(|| {
            frame(&Update {
                update: Some(update::Update::NoEndpoints(NoEndpoints { exists: true })),
            })
        })
    }
}

/// Profiles: each answer is one whole `DestinationProfile`, sent when it
/// differs from the last one.
pub struct ProfileEncoder {
    pub mesh: MeshConfig,
    pub target: Target,
}

impl Encode<ProfileView> for ProfileEncoder {
    fn full(&self, cur: &ProfileView) -> Vec<Bytes> {
        vec![frame(&translate::profile(cur, &self.target, &self.mesh))]
    }

    fn diff(&self, prev: &ProfileView, cur: &ProfileView) -> Vec<Bytes> {
        let new = translate::profile(cur, &self.target, &self.mesh);
        if translate::profile(prev, &self.target, &self.mesh) == new {
            return vec![];
        }
        vec![frame(&new)]
    }

    fn reset(&self, _: &ProfileView) -> Option<Bytes> {
        None
    }
}

/// Endpoints per message, so that one message stays small (a few hundred
/// KB at most) whatever the size of a service.
pub use ballast_controlplane::destination_api::MAX_ADDRS_PER_UPDATE;

/// What to send a client that last saw `prev` (nothing, for a new stream) so
/// that it holds `cur`. The first answer is the whole set (`add`), or
/// `no_endpoints` when there is none; later answers are differences.
pub fn diff(prev: Option<&EndpointSet>, cur: &EndpointSet, config: &MeshConfig) -> Vec<Update> {
    let no_endpoints = |exists| Update {
        update: Some(update::Update::NoEndpoints(NoEndpoints { exists })),
    };
    let Some(prev) = prev else {
        if cur.endpoints.is_empty() {
            return vec![no_endpoints(cur.exists)];
        }
        return adds(cur, cur.endpoints.values(), config);
    };
    if cur.endpoints.is_empty() {
        if prev.exists != cur.exists {
            // Existence changed: `no_endpoints` resets the client to empty.
            return vec![no_endpoints(cur.exists)];
        }
        return removes(prev.endpoints.keys());
    }
    let mut out = removes(
        prev.endpoints
            .keys()
            .filter(|addr| !cur.endpoints.contains_key(addr)),
    );
    let labels_changed = prev.labels != cur.labels;
    let changed = cur
        .endpoints
        .values()
        .filter(|e| labels_changed || prev.endpoints.get(&e.addr) != Some(e));
    out.extend(adds(cur, changed, config));
    out
}

fn adds<'a>(
    set: &EndpointSet,
    endpoints: impl Iterator<Item = &'a crate::index::Endpoint>,
    config: &MeshConfig,
) -> Vec<Update> {
    let addrs: Vec<_> = endpoints.map(|e| weighted_addr(e, config)).collect();
    let labels: std::collections::HashMap<String, String> = set
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    chunks(addrs)
        .map(|addrs| Update {
            update: Some(update::Update::Add(WeightedAddrSet {
                addrs,
                metric_labels: labels.clone(),
            })),
        })
        .collect()
}

fn removes<'a>(addrs: impl Iterator<Item = &'a std::net::SocketAddr>) -> Vec<Update> {
    let addrs: Vec<_> = addrs.map(|a| tcp_address(*a)).collect();
    chunks(addrs)
        .map(|addrs| Update {
            update: Some(update::Update::Remove(AddrSet { addrs })),
        })
        .collect()
}

fn chunks<T>(mut items: Vec<T>) -> impl Iterator<Item = Vec<T>> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let rest = items.split_off(items.len().min(MAX_ADDRS_PER_UPDATE));
        Some(std::mem::replace(&mut items, rest))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Endpoint;
    use std::net::SocketAddr;

    fn set(addrs: &[&str]) -> EndpointSet {
        let mut s = EndpointSet {
            exists: true,
            ..Default::default()
        };
        for a in addrs {
            let addr: SocketAddr = a.parse().unwrap();
            s.endpoints.insert(addr, Endpoint::bare(addr));
        }
        s
    }

    fn shape(updates: &[Update]) -> Vec<(String, usize)> {
        updates
            .iter()
            .map(|u| match u.update.as_ref().unwrap() {
                update::Update::Add(a) => ("add".into(), a.addrs.len()),
                update::Update::Remove(r) => ("remove".into(), r.addrs.len()),
                update::Update::NoEndpoints(n) => (format!("none(exists={})", n.exists), 0),
            })
            .collect()
    }

    #[test]
    fn diffs_by_table() {
        let cfg = MeshConfig::default();
        let unknown = EndpointSet::default();
        let empty = set(&[]);
        let ab = set(&["10.0.0.1:80", "10.0.0.2:80"]);
        let bc = set(&["10.0.0.2:80", "10.0.0.3:80"]);
        type Case<'a> = (
            &'a str,
            Option<&'a EndpointSet>,
            &'a EndpointSet,
            Vec<(&'a str, usize)>,
        );
        let cases: Vec<Case> = vec![
            (
                "first, unknown",
                None,
                &unknown,
                vec![("none(exists=false)", 0)],
            ),
            ("first, empty", None, &empty, vec![("none(exists=true)", 0)]),
            ("first, two", None, &ab, vec![("add", 2)]),
            ("unchanged", Some(&ab), &ab, vec![]),
            (
                "one out one in",
                Some(&ab),
                &bc,
                vec![("remove", 1), ("add", 1)],
            ),
            ("all gone", Some(&ab), &empty, vec![("remove", 2)]),
            (
                "service deleted",
                Some(&ab),
                &unknown,
                vec![("none(exists=false)", 0)],
            ),
            (
                "service created",
                Some(&unknown),
                &empty,
                vec![("none(exists=true)", 0)],
            ),
            ("endpoints appear", Some(&empty), &ab, vec![("add", 2)]),
        ];
        for (name, prev, cur, want) in cases {
            let got = shape(&diff(prev, cur, &cfg));
            let want: Vec<(String, usize)> =
                want.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn large_sets_are_split_into_bounded_messages() {
        let addrs: Vec<String> = (0..2_500)
            .map(|i| format!("10.1.{}.{}:80", i / 250, i % 250))
            .collect();
        let refs: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
        let big = set(&refs);
        let got = shape(&diff(None, &big, &MeshConfig::default()));
        assert_eq!(
            got,
            vec![
                ("add".into(), 1000),
                ("add".into(), 1000),
                ("add".into(), 500)
            ]
        );
    }
}
