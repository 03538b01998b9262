//! Reading `Update`s as plain values.

use linkerd2_proxy_api::{
    destination::{update, Update, WeightedAddr},
    net::TcpAddress,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

#[derive(Debug, PartialEq)]
pub enum Seen {
    Add(BTreeMap<SocketAddr, BTreeMap<String, String>>),
    Remove(BTreeSet<SocketAddr>),
    NoEndpoints { exists: bool },
}

impl Seen {
    /// Applies the update to `endpoints` as a client keeps them: an add
    /// joins, a remove leaves, no endpoints empties.
    pub fn apply_to(self, endpoints: &mut BTreeSet<SocketAddr>) {
        match self {
            Seen::Add(eps) => endpoints.extend(eps.into_keys()),
            Seen::Remove(gone) => endpoints.retain(|a| !gone.contains(a)),
            Seen::NoEndpoints { .. } => endpoints.clear(),
        }
    }
}

pub fn sock(a: &TcpAddress) -> SocketAddr {
    let ip = IpAddr::try_from(a.ip.expect("ip")).expect("valid ip");
    SocketAddr::new(ip, a.port as u16)
}

pub fn labels(
    set: &std::collections::HashMap<String, String>,
    a: &WeightedAddr,
) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = set.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    l.extend(a.metric_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l
}

pub fn seen(u: Update) -> Seen {
    match u.update.expect("update set") {
        update::Update::Add(set) => Seen::Add(
            set.addrs
                .iter()
                .map(|a| {
                    (
                        sock(a.addr.as_ref().unwrap()),
                        labels(&set.metric_labels, a),
                    )
                })
                .collect(),
        ),
        update::Update::Remove(r) => Seen::Remove(r.addrs.iter().map(sock).collect()),
        update::Update::NoEndpoints(n) => Seen::NoEndpoints { exists: n.exists },
    }
}

pub fn addrs(list: &[&str]) -> BTreeSet<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// The addresses of an `Add`, or a panic naming what came instead.
pub fn added(s: Seen) -> BTreeSet<SocketAddr> {
    match s {
        Seen::Add(m) => m.keys().copied().collect(),
        other => panic!("expected an add, got {other:?}"),
    }
}
