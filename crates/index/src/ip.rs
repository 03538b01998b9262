//! Which pod owns an address: the rules that keep seed 000 from recurring.
//!
//! - Pods that are terminating (deletionTimestamp set), Succeeded or Failed
//!   never match: a dying pod may still report an IP that a new pod now owns.
//! - hostNetwork pods share their node's IP, so they are indexed only by
//!   `hostIP:port` for the ports they declare; a node IP on a port no pod
//!   declares matches no pod (and is never a conflict). A pod's `hostPort`s
//!   are indexed the same way.
//! - When several live pods still claim one key, [`rank`] picks one, the
//!   same one every time, and the conflict is reported once, when it appears.

use crate::resource::{ObjectKey, Phase, Pod};
use std::{
    cmp::Reverse,
    collections::{BTreeSet, HashMap},
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::Changes;

/// An address claimed by more than one live pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConflictKey {
    PodIp(IpAddr),
    HostPort(SocketAddr),
}

impl fmt::Display for ConflictKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictKey::PodIp(ip) => write!(f, "pod IP {ip}"),
            ConflictKey::HostPort(addr) => write!(f, "host port {addr}"),
        }
    }
}

/// A conflict as it appeared: who claims the key and who was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub key: ConflictKey,
    /// The live claimants, at most [`MAX_REPORTED_CLAIMANTS`] of them.
    pub pods: Vec<ObjectKey>,
    pub chosen: ObjectKey,
}

/// Bounds the size of a conflict report whatever the cluster holds.
pub const MAX_REPORTED_CLAIMANTS: usize = 8;

/// Preference among live pods claiming one address; the greatest wins.
///
/// Running beats not running, ready beats not ready, then the most recently
/// created pod wins (the older one's status is the likelier to be stale), and
/// last the lexically first namespace/name, so that the choice never depends
/// on the order objects arrived in.
pub fn rank(pod: &Pod) -> impl Ord + '_ {
    (
        pod.phase == Phase::Running,
        pod.ready,
        pod.creation_timestamp.as_deref(),
        Reverse(&pod.key),
    )
}

#[derive(Default)]
pub(super) struct IpIndex {
    by_pod_ip: HashMap<IpAddr, Vec<ObjectKey>>,
    by_host_port: HashMap<SocketAddr, Vec<ObjectKey>>,
    conflicts: BTreeSet<ConflictKey>,
}

type Pods = HashMap<ObjectKey, Arc<Pod>>;

impl IpIndex {
    pub fn conflicts(&self) -> usize {
        self.conflicts.len()
    }

    pub fn insert(&mut self, pod: &Pod) {
        for key in keys(pod) {
            let list = match key {
                ConflictKey::PodIp(ip) => self.by_pod_ip.entry(ip).or_default(),
                ConflictKey::HostPort(addr) => self.by_host_port.entry(addr).or_default(),
            };
            if !list.contains(&pod.key) {
                list.push(pod.key.clone());
            }
        }
    }

    pub fn remove(&mut self, pod: &Pod) {
        for key in keys(pod) {
            match key {
                ConflictKey::PodIp(ip) => remove_from(&mut self.by_pod_ip, ip, &pod.key),
                ConflictKey::HostPort(addr) => remove_from(&mut self.by_host_port, addr, &pod.key),
            }
        }
    }

    /// Re-evaluates the keys `pod` claims (or claimed): records conflicts that
    /// appeared and forgets those that are gone.
    pub fn recheck(&mut self, pod: &Pod, pods: &Pods, ch: &mut Changes) {
        for key in keys(pod) {
            let claimants = self.live_claimants(&key, pods);
            if claimants.len() > 1 {
                if self.conflicts.insert(key.clone()) {
                    let chosen = claimants
                        .iter()
                        .max_by(|a, b| rank(a).cmp(&rank(b)))
                        .map(|p| p.key.clone())
                        .expect("more than one claimant");
                    let mut names: Vec<ObjectKey> =
                        claimants.iter().map(|p| p.key.clone()).collect();
                    names.sort();
                    names.truncate(MAX_REPORTED_CLAIMANTS);
                    ch.new_conflicts.push(Conflict {
                        key,
                        pods: names,
                        chosen,
                    });
                }
            } else {
                self.conflicts.remove(&key);
            }
        }
    }

    fn live_claimants<'p>(&self, key: &ConflictKey, pods: &'p Pods) -> Vec<&'p Pod> {
        let list = match key {
            ConflictKey::PodIp(ip) => self.by_pod_ip.get(ip),
            ConflictKey::HostPort(addr) => self.by_host_port.get(addr),
        };
        list.into_iter()
            .flatten()
            .filter_map(|k| pods.get(k))
            .map(|p| &**p)
            .filter(|p| p.is_live())
            .collect()
    }

    /// The pod that owns `addr`: a host port first, then a pod IP.
    pub fn lookup<'p>(&self, addr: SocketAddr, pods: &'p Pods) -> Option<&'p Pod> {
        let best = |key: ConflictKey| {
            self.live_claimants(&key, pods)
                .into_iter()
                .max_by(|a, b| rank(a).cmp(&rank(b)))
        };
        best(ConflictKey::HostPort(addr)).or_else(|| best(ConflictKey::PodIp(addr.ip())))
    }
}

/// Every key a pod claims.
fn keys(pod: &Pod) -> Vec<ConflictKey> {
    let mut keys = Vec::new();
    if pod.host_network {
        if let Some(host) = pod.host_ip.or_else(|| pod.ips.first().copied()) {
            for p in &pod.ports {
                let port = p.host_port.unwrap_or(p.container_port);
                keys.push(ConflictKey::HostPort(SocketAddr::new(host, port)));
            }
        }
    } else {
        keys.extend(pod.ips.iter().map(|ip| ConflictKey::PodIp(*ip)));
        if let Some(host) = pod.host_ip {
            for port in pod.ports.iter().filter_map(|p| p.host_port) {
                keys.push(ConflictKey::HostPort(SocketAddr::new(host, port)));
            }
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

fn remove_from<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Vec<ObjectKey>>,
    k: K,
    pod: &ObjectKey,
) {
    if let Some(list) = map.get_mut(&k) {
        list.retain(|p| p != pod);
        if list.is_empty() {
            map.remove(&k);
        }
    }
}
