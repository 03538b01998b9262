//! Which subscriptions a change can reach, found through what the change
//! names (its services, IPs, pods and namespaces) rather than by visiting
//! every subscription: a change's work follows what changed, not how many
//! subscriptions there are. Used by the Destination API's subscriptions
//! (`store`) and the policy APIs' (`ballast-destination`'s `policy`).

use crate::{
    index::{Index, Target},
    resource::ObjectKey,
    shared::Reach,
};
use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

/// Targets by what names them: service targets by service, address
/// targets by IP.
#[derive(Debug, Default)]
pub struct Targets {
    by_service: HashMap<ObjectKey, HashSet<Target>>,
    by_ip: HashMap<IpAddr, HashSet<Target>>,
}

impl Reach<Target> for Targets {
    fn insert(&mut self, target: &Target) {
        match target {
            Target::Service { service, .. } => self
                .by_service
                .entry(service.clone())
                .or_default()
                .insert(target.clone()),
            Target::Addr(addr) => self
                .by_ip
                .entry(addr.ip())
                .or_default()
                .insert(target.clone()),
        };
    }

    fn remove(&mut self, target: &Target) {
        match target {
            Target::Service { service, .. } => remove(&mut self.by_service, service, target),
            Target::Addr(addr) => remove(&mut self.by_ip, &addr.ip(), target),
        }
    }
}

impl Targets {
    pub fn is_empty(&self) -> bool {
        self.by_service.is_empty() && self.by_ip.is_empty()
    }

    /// The targets a change to `services` and `ips` can reach: each
    /// service's own targets and the address targets of its cluster IPs
    /// (an address target follows the service whose cluster IP it is),
    /// and the address targets of each IP. A superset: callers check each
    /// with the change's own test.
    pub fn reached<'a, 'c>(
        &'a self,
        services: impl IntoIterator<Item = &'c ObjectKey>,
        ips: impl IntoIterator<Item = &'c IpAddr>,
        index: &Index,
    ) -> HashSet<&'a Target> {
        let mut found: HashSet<&'a Target> = HashSet::new();
        for service in services {
            found.extend(self.by_service.get(service).into_iter().flatten());
            for ip in index.service(service).iter().flat_map(|s| &s.cluster_ips) {
                found.extend(self.by_ip.get(ip).into_iter().flatten());
            }
        }
        for ip in ips {
            found.extend(self.by_ip.get(ip).into_iter().flatten());
        }
        found
    }
}

/// A pod's ports by pod, and pods by namespace: the keys of inbound
/// subscriptions.
#[derive(Debug, Default)]
pub struct PodPorts {
    by_pod: HashMap<ObjectKey, Vec<u16>>,
    by_namespace: HashMap<Arc<str>, HashSet<ObjectKey>>,
}

impl Reach<(ObjectKey, u16)> for PodPorts {
    fn insert(&mut self, (pod, port): &(ObjectKey, u16)) {
        let (pod, port) = (pod, *port);
        let ports = self.by_pod.entry(pod.clone()).or_default();
        if !ports.contains(&port) {
            ports.push(port);
        }
        self.by_namespace
            .entry(pod.namespace.clone())
            .or_default()
            .insert(pod.clone());
    }

    fn remove(&mut self, (pod, port): &(ObjectKey, u16)) {
        let (pod, port) = (pod, *port);
        let Some(ports) = self.by_pod.get_mut(pod) else {
            return;
        };
        ports.retain(|p| *p != port);
        if !ports.is_empty() {
            return;
        }
        self.by_pod.remove(pod);
        if let Some(pods) = self.by_namespace.get_mut(&pod.namespace) {
            pods.remove(pod);
            if pods.is_empty() {
                self.by_namespace.remove(&pod.namespace);
            }
        }
    }
}

impl PodPorts {
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }

    /// The (pod, port) keys of `pods` and of every pod in `namespaces`.
    pub fn reached<'c>(
        &self,
        pods: impl IntoIterator<Item = &'c ObjectKey>,
        namespaces: impl IntoIterator<Item = &'c Arc<str>>,
    ) -> HashSet<(ObjectKey, u16)> {
        let mut found = HashSet::new();
        let mut add = |pod: &ObjectKey| {
            for port in self.by_pod.get(pod).into_iter().flatten() {
                found.insert((pod.clone(), *port));
            }
        };
        for pod in pods {
            add(pod);
        }
        for ns in namespaces {
            for pod in self.by_namespace.get(ns).into_iter().flatten() {
                add(pod);
            }
        }
        found
    }
}

fn remove<K: Eq + std::hash::Hash>(
    map: &mut HashMap<K, HashSet<Target>>,
    key: &K,
    target: &Target,
) {
    if let Some(targets) = map.get_mut(key) {
        targets.remove(target);
        if targets.is_empty() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    #[test]
    fn pod_ports_reach_a_pod_s_ports_and_a_namespace_s_pods() {
        let mut p = PodPorts::default();
        p.insert(&(pod("a", "web-0"), 8080));
        p.insert(&(pod("a", "web-0"), 9090));
        p.insert(&(pod("a", "web-0"), 8080));
        p.insert(&(pod("a", "web-1"), 8080));
        p.insert(&(pod("b", "db-0"), 5432));

        let one = p.reached([&pod("a", "web-0")], []);
        assert_eq!(
            one,
            HashSet::from([(pod("a", "web-0"), 8080), (pod("a", "web-0"), 9090)])
        );
        let ns: Arc<str> = "a".into();
        assert_eq!(p.reached([], [&ns]).len(), 3, "every port of namespace a");
        assert!(p.reached([&pod("c", "x")], []).is_empty());

        p.remove(&(pod("a", "web-0"), 8080));
        assert_eq!(
            p.reached([&pod("a", "web-0")], []),
            HashSet::from([(pod("a", "web-0"), 9090)])
        );
        p.remove(&(pod("a", "web-0"), 9090));
        p.remove(&(pod("a", "web-1"), 8080));
        assert_eq!(p.reached([], [&ns]).len(), 0);
        p.remove(&(pod("b", "db-0"), 5432));
        assert!(
            p.is_empty() && p.by_namespace.is_empty(),
            "nothing left behind"
        );
    }
}
