//! Ballast's cluster index: pure state, no IO.
//!
//! Sources feed it with [`Index::apply`], [`Index::delete`] and
//! [`Index::reset`]; each returns the [`Changes`] it made, so that only the
//! subscriptions that could see a difference are recomputed. Readers ask
//! [`Index::endpoints`] and [`Index::profile`] for the current answer.
//!
//! The rules from seed 000 live in `ip.rs`: pods that are terminating or
//! finished never match an IP; hostNetwork pods match only on a port they
//! own; a remaining tie is settled by [`ip::rank`] and reported once.

#![forbid(unsafe_code)]

pub mod resource;

mod endpoints;
mod ip;
mod opaque;
pub mod policy;
#[cfg(test)]
mod tests;
mod view;

pub use endpoints::owner_label;
pub use ip::{Conflict, ConflictKey};
pub use opaque::{PortSet, DEFAULT_OPAQUE_PORTS};
pub use view::{Endpoint, EndpointSet, MeshIdentity, ProfileView};

use crate::resource::{
    DefaultPolicy, EndpointSlice, IpNet, Kind, ObjectKey, Pod, Resource, Service,
};
use policy::{PolicyObjects, RouteProblem};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

/// What a client asks about: a service port by name, or an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Service { service: ObjectKey, port: u16 },
    Addr(SocketAddr),
}

/// Settings the index's answers depend on.
#[derive(Clone, Debug)]
pub struct IndexConfig {
    /// Ports treated as opaque where no `config.linkerd.io/opaque-ports`
    /// annotation says otherwise.
    pub default_opaque_ports: PortSet,
    /// The inbound policy of pods and namespaces that name none
    /// (`config.linkerd.io/default-inbound-policy`).
    pub default_inbound_policy: DefaultPolicy,
    /// The networks `cluster-*` default policies admit.
    pub cluster_networks: Vec<IpNet>,
    /// Identity names are `SA.NS.serviceaccount.identity.CONTROL_NS.TRUST_DOMAIN`.
    pub control_plane_namespace: String,
    pub trust_domain: String,
    /// ServiceProfiles are named `SERVICE.NS.svc.CLUSTER_DOMAIN`.
    pub cluster_domain: String,
}

/// Linkerd's default cluster networks.
pub const DEFAULT_CLUSTER_NETWORKS: &str =
    "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8";

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            default_opaque_ports: PortSet::parse(DEFAULT_OPAQUE_PORTS)
                .expect("the default opaque ports parse"),
            default_inbound_policy: DefaultPolicy::AllUnauthenticated,
            cluster_networks: DEFAULT_CLUSTER_NETWORKS
                .split(',')
                .map(|n| n.parse().expect("the default cluster networks parse"))
                .collect(),
            control_plane_namespace: "linkerd".to_string(),
            trust_domain: "cluster.local".to_string(),
            cluster_domain: "cluster.local".to_string(),
        }
    }
}

/// What one change touched: the subscriptions to recompute.
#[derive(Debug, Default)]
pub struct Changes {
    /// Everything may have changed (e.g. after a reset).
    pub all: bool,
    pub services: HashSet<ObjectKey>,
    pub ips: HashSet<IpAddr>,
    /// Conflicts that appeared with this change (each reported once).
    pub new_conflicts: Vec<Conflict>,
    /// Cluster IPs that more than one Service claims, as the claim appeared
    /// (each reported once while it lasts; Kubernetes never does this, a
    /// hand-written manifests directory may).
    pub new_cluster_ip_conflicts: Vec<ClusterIpConflict>,
    /// Services whose routes (not endpoints) may have changed.
    pub outbound_services: HashSet<ObjectKey>,
    /// Namespaces whose inbound policy answers may have changed.
    pub policy_namespaces: HashSet<Arc<str>>,
    /// Pods whose inbound policy answers may have changed.
    pub pods: HashSet<ObjectKey>,
    /// Every inbound policy answer may have changed (an authentication
    /// object, which policies in any namespace may name).
    pub inbound_all: bool,
    /// Routes found invalid with this change (each reported once).
    pub route_problems: Vec<RouteProblem>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        !self.all
            && !self.inbound_all
            && self.services.is_empty()
            && self.ips.is_empty()
            && self.outbound_services.is_empty()
            && self.policy_namespaces.is_empty()
            && self.pods.is_empty()
    }

    pub fn merge(&mut self, other: Changes) {
        self.all |= other.all;
        self.inbound_all |= other.inbound_all;
        self.services.extend(other.services);
        self.ips.extend(other.ips);
        self.new_conflicts.extend(other.new_conflicts);
        self.new_cluster_ip_conflicts
            .extend(other.new_cluster_ip_conflicts);
        self.outbound_services.extend(other.outbound_services);
        self.policy_namespaces.extend(other.policy_namespaces);
        self.pods.extend(other.pods);
        self.route_problems.extend(other.route_problems);
    }

    /// Could the outbound policy for `target` differ after this change?
    pub fn affects_outbound(&self, target: &Target, index: &Index) -> bool {
        if self.affects(target, index) {
            return true;
        }
        match target {
            Target::Service { service, .. } => self.outbound_services.contains(service),
            Target::Addr(addr) => index
                .service_for_ip(addr.ip())
                .is_some_and(|s| self.outbound_services.contains(s)),
        }
    }

    /// Could the inbound policy for `pod` differ after this change?
    pub fn affects_inbound(&self, pod: &ObjectKey) -> bool {
        self.all
            || self.inbound_all
            || self.pods.contains(pod)
            || self.policy_namespaces.contains(&pod.namespace)
    }

    /// Could the answer for `target` differ after this change?
    pub fn affects(&self, target: &Target, index: &Index) -> bool {
        if self.all {
            return true;
        }
        match target {
            Target::Service { service, .. } => self.services.contains(service),
            Target::Addr(addr) => {
                self.ips.contains(&addr.ip())
                    || index
                        .service_for_ip(addr.ip())
                        .is_some_and(|s| self.services.contains(s))
            }
        }
    }
}

/// Sizes of what the index holds, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexSizes {
    pub pods: usize,
    pub services: usize,
    pub endpoint_slices: usize,
    /// Addresses listed across all EndpointSlices.
    pub slice_endpoints: usize,
    /// IP:port keys currently claimed by more than one live pod.
    pub conflicts: usize,
}

/// A cluster IP claimed by more than one Service: the index answers for it
/// with `chosen`, the first by namespace, then name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterIpConflict {
    pub ip: IpAddr,
    /// The claimants, sorted, at most `MAX_REPORTED_CLAIMANTS` (8).
    pub services: Vec<ObjectKey>,
    pub chosen: ObjectKey,
}

#[derive(Default)]
pub struct Index {
    config: IndexConfig,
    pods: HashMap<ObjectKey, Arc<Pod>>,
    /// The same pods by namespace, held here too so that a selector's scan
    /// of a namespace (a pod's Services, a Service's pods) reads them in
    /// place rather than looking each up by key.
    pods_by_namespace: HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<Pod>>>,
    services: HashMap<ObjectKey, Arc<Service>>,
    services_by_namespace: HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<Service>>>,
    services_by_ip: HashMap<IpAddr, BTreeSet<ObjectKey>>,
    /// Cluster IPs claimed by more than one Service, reported once each.
    cluster_ip_conflicts: HashSet<IpAddr>,
    slices: HashMap<ObjectKey, Arc<EndpointSlice>>,
    slices_by_service: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// Services whose slices name a pod, with how many endpoints do.
    services_by_slice_pod: HashMap<ObjectKey, HashMap<ObjectKey, u32>>,
    slice_endpoints: usize,
    ips: ip::IpIndex,
    policy: PolicyObjects,
}

impl Index {
    pub fn new(config: IndexConfig) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    pub fn sizes(&self) -> IndexSizes {
        IndexSizes {
            pods: self.pods.len(),
            services: self.services.len(),
            endpoint_slices: self.slices.len(),
            slice_endpoints: self.slice_endpoints,
            conflicts: self.ips.conflicts(),
        }
    }

    pub fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Pod => self.pods.len(),
            Kind::Service => self.services.len(),
            Kind::EndpointSlice => self.slices.len(),
            _ => self.policy.len(kind),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
            && self.services.is_empty()
            && self.slices.is_empty()
            && Kind::ALL.iter().all(|k| self.policy.len(*k) == 0)
    }

    /// The policy objects (routes, servers, authorizations) and the routes
    /// currently left out of answers.
    pub fn policy(&self) -> &PolicyObjects {
        &self.policy
    }

    /// Re-judges the routes this change touched (parents and backends that
    /// appeared or went) and records the problems that are new.
    fn finish(&mut self, mut ch: Changes) -> Changes {
        let services = &self.services;
        let new = self.policy.recheck(&ch, |k| services.contains_key(k));
        ch.route_problems.extend(new);
        ch
    }

    /// Adds or replaces one object. Applying an identical object changes nothing.
    pub fn apply(&mut self, resource: Resource) -> Changes {
        let mut ch = Changes::default();
        match resource {
            Resource::Pod(p) => self.apply_pod(p, &mut ch),
            Resource::Service(s) => self.apply_service(s, &mut ch),
            Resource::EndpointSlice(e) => self.apply_slice(e, &mut ch),
            Resource::ServiceProfile(p) => {
                if self.policy.profiles.get(&p.key) != Some(&p) {
                    ch.services.extend(self.profile_service(&p.key));
                    self.policy.apply(Resource::ServiceProfile(p), &mut ch);
                }
            }
            other => self.policy.apply(other, &mut ch),
        }
        self.finish(ch)
    }

    /// The Service a ServiceProfile describes, by its name.
    fn profile_service(&self, key: &ObjectKey) -> Option<ObjectKey> {
        let (service, rest) = key.name.split_once('.')?;
        let rest = rest.strip_prefix(&*key.namespace)?.strip_prefix(".svc.")?;
        (rest == self.config.cluster_domain.trim_end_matches('.'))
            .then(|| ObjectKey::new(key.namespace.clone(), service))
    }

    /// The ServiceProfile describing a Service, if one exists.
    fn service_profile(&self, service: &ObjectKey) -> Option<&Arc<resource::ServiceProfile>> {
        let name = format!(
            "{}.{}.svc.{}",
            service.name,
            service.namespace,
            self.config.cluster_domain.trim_end_matches('.')
        );
        self.policy
            .profiles
            .get(&ObjectKey::new(service.namespace.clone(), name))
    }

    /// Removes one object; deleting an unknown object changes nothing.
    pub fn delete(&mut self, kind: Kind, key: &ObjectKey) -> Changes {
        let mut ch = Changes::default();
        match kind {
            Kind::Pod => self.delete_pod(key, &mut ch),
            Kind::Service => self.delete_service(key, &mut ch),
            Kind::EndpointSlice => self.delete_slice(key, &mut ch),
            Kind::ServiceProfile => {
                if self.policy.profiles.contains_key(key) {
                    ch.services.extend(self.profile_service(key));
                }
                self.policy.delete(kind, key, &mut ch);
            }
            _ => self.policy.delete(kind, key, &mut ch),
        }
        self.finish(ch)
    }

    /// Replaces every object of `kind` with `objects` (a full relist): what is
    /// missing is deleted, what is unchanged touches nothing. Objects of other
    /// kinds in `objects` are ignored.
    pub fn reset(&mut self, kind: Kind, objects: Vec<Resource>) -> Changes {
        let mut ch = Changes::default();
        let keep: HashSet<ObjectKey> = objects
            .iter()
            .filter(|r| r.kind() == kind)
            .map(|r| r.key().clone())
            .collect();
        let gone: Vec<ObjectKey> = match kind {
            Kind::Pod => self
                .pods
                .keys()
                .filter(|k| !keep.contains(k))
                .cloned()
                .collect(),
            Kind::Service => self
                .services
                .keys()
                .filter(|k| !keep.contains(k))
                .cloned()
                .collect(),
            Kind::EndpointSlice => self
                .slices
                .keys()
                .filter(|k| !keep.contains(k))
                .cloned()
                .collect(),
            _ => self
                .policy
                .keys(kind)
                .into_iter()
                .filter(|k| !keep.contains(k))
                .collect(),
        };
        for key in gone {
            ch.merge(self.delete(kind, &key));
        }
        for r in objects.into_iter().filter(|r| r.kind() == kind) {
            ch.merge(self.apply(r));
        }
        ch
    }

    // === Pods ===

    fn apply_pod(&mut self, pod: Arc<Pod>, ch: &mut Changes) {
        let old = match self.pods.get(&pod.key) {
            Some(old) if *old == pod => return,
            Some(old) => Some(old.clone()),
            None => None,
        };
        // The old version's keys are rechecked only once the new one is in:
        // a conflict the update keeps must not seem to vanish and reappear
        // (and be reported again) within one change.
        if let Some(old) = &old {
            self.touch_pod(old, ch);
            self.ips.remove(old);
        }
        self.pods_by_namespace
            .entry(pod.key.namespace.clone())
            .or_default()
            .insert(pod.key.name.clone(), pod.clone());
        self.pods.insert(pod.key.clone(), pod.clone());
        self.touch_pod(&pod, ch);
        self.ips.insert(&pod);
        if let Some(old) = &old {
            self.ips.recheck(old, &self.pods, ch);
        }
        self.ips.recheck(&pod, &self.pods, ch);
    }

    fn delete_pod(&mut self, key: &ObjectKey, ch: &mut Changes) {
        let Some(old) = self.pods.get(key).cloned() else {
            return;
        };
        self.unindex_pod(&old, ch);
        self.pods.remove(key);
        if let Some(names) = self.pods_by_namespace.get_mut(&key.namespace) {
            names.remove(&key.name);
            if names.is_empty() {
                self.pods_by_namespace.remove(&key.namespace);
            }
        }
    }

    fn unindex_pod(&mut self, old: &Pod, ch: &mut Changes) {
        self.touch_pod(old, ch);
        self.ips.remove(old);
        self.ips.recheck(old, &self.pods, ch);
    }

    fn touch_pod(&self, pod: &Pod, ch: &mut Changes) {
        ch.pods.insert(pod.key.clone());
        ch.ips.extend(pod.ips.iter().copied());
        if let Some(host) = pod.host_ip {
            if pod.host_network || pod.ports.iter().any(|p| p.host_port.is_some()) {
                ch.ips.insert(host);
            }
        }
        if let Some(services) = self.services_by_namespace.get(&pod.key.namespace) {
            for svc in services.values() {
                if svc.selects(&pod.labels) {
                    ch.services.insert(svc.key.clone());
                }
            }
        }
        if let Some(svcs) = self.services_by_slice_pod.get(&pod.key) {
            ch.services.extend(svcs.keys().cloned());
        }
    }

    // === Services ===

    fn apply_service(&mut self, svc: Arc<Service>, ch: &mut Changes) {
        if let Some(old) = self.services.get(&svc.key) {
            if *old == svc {
                return;
            }
            let old = old.clone();
            self.unindex_service(&old);
            ch.ips.extend(old.cluster_ips.iter().copied());
            self.recheck_cluster_ips(&old.cluster_ips, ch);
        }
        for ip in &svc.cluster_ips {
            self.services_by_ip
                .entry(*ip)
                .or_default()
                .insert(svc.key.clone());
            ch.ips.insert(*ip);
        }
        self.recheck_cluster_ips(&svc.cluster_ips, ch);
        self.services_by_namespace
            .entry(svc.key.namespace.clone())
            .or_default()
            .insert(svc.key.name.clone(), svc.clone());
        ch.services.insert(svc.key.clone());
        self.policy.service_changed(&svc.key, ch);
        self.services.insert(svc.key.clone(), svc);
    }

    fn delete_service(&mut self, key: &ObjectKey, ch: &mut Changes) {
        let Some(old) = self.services.remove(key) else {
            return;
        };
        self.unindex_service(&old);
        ch.ips.extend(old.cluster_ips.iter().copied());
        self.recheck_cluster_ips(&old.cluster_ips, ch);
        ch.services.insert(key.clone());
        self.policy.service_changed(key, ch);
        if let Some(names) = self.services_by_namespace.get_mut(&key.namespace) {
            names.remove(&key.name);
            if names.is_empty() {
                self.services_by_namespace.remove(&key.namespace);
            }
        }
    }

    fn unindex_service(&mut self, old: &Service) {
        for ip in &old.cluster_ips {
            if let Some(keys) = self.services_by_ip.get_mut(ip) {
                keys.remove(&old.key);
                if keys.is_empty() {
                    self.services_by_ip.remove(ip);
                }
            }
        }
    }

    /// Records the cluster-IP conflicts among `ips` that appeared, and
    /// forgets those that are gone.
    fn recheck_cluster_ips(&mut self, ips: &[IpAddr], ch: &mut Changes) {
        for ip in ips {
            match self.services_by_ip.get(ip) {
                Some(keys) if keys.len() > 1 => {
                    if self.cluster_ip_conflicts.insert(*ip) {
                        let services: Vec<ObjectKey> = keys
                            .iter()
                            .take(ip::MAX_REPORTED_CLAIMANTS)
                            .cloned()
                            .collect();
                        let Some(chosen) = services.first().cloned() else {
                            continue;
                        };
                        ch.new_cluster_ip_conflicts.push(ClusterIpConflict {
                            ip: *ip,
                            services,
                            chosen,
                        });
                    }
                }
                _ => {
                    self.cluster_ip_conflicts.remove(ip);
                }
            }
        }
    }

    /// The service that owns a cluster IP. Two services cannot share one in
    /// Kubernetes; in hand-written manifests the first by namespace/name wins.
    pub fn service_for_ip(&self, ip: IpAddr) -> Option<&ObjectKey> {
        self.services_by_ip.get(&ip).and_then(|keys| keys.first())
    }

    // === EndpointSlices ===

    fn apply_slice(&mut self, slice: Arc<EndpointSlice>, ch: &mut Changes) {
        if let Some(old) = self.slices.get(&slice.key) {
            if *old == slice {
                return;
            }
            let old = old.clone();
            self.unindex_slice(&old, ch);
        }
        if let Some(svc) = &slice.service {
            self.slices_by_service
                .entry(svc.clone())
                .or_default()
                .insert(slice.key.clone());
            ch.services.insert(svc.clone());
            for e in &slice.endpoints {
                if let Some(pod) = &e.target_pod {
                    *self
                        .services_by_slice_pod
                        .entry(pod.clone())
                        .or_default()
                        .entry(svc.clone())
                        .or_default() += 1;
                }
            }
        }
        self.slice_endpoints += slice.endpoints.len();
        self.slices.insert(slice.key.clone(), slice);
    }

    fn delete_slice(&mut self, key: &ObjectKey, ch: &mut Changes) {
        if let Some(old) = self.slices.remove(key) {
            self.unindex_slice(&old, ch);
        }
    }

    fn unindex_slice(&mut self, old: &EndpointSlice, ch: &mut Changes) {
        self.slice_endpoints -= old.endpoints.len();
        let Some(svc) = &old.service else { return };
        ch.services.insert(svc.clone());
        if let Some(keys) = self.slices_by_service.get_mut(svc) {
            keys.remove(&old.key);
            if keys.is_empty() {
                self.slices_by_service.remove(svc);
            }
        }
        for e in &old.endpoints {
            let Some(pod) = &e.target_pod else { continue };
            if let Some(svcs) = self.services_by_slice_pod.get_mut(pod) {
                if let Some(n) = svcs.get_mut(svc) {
                    *n -= 1;
                    if *n == 0 {
                        svcs.remove(svc);
                    }
                }
                if svcs.is_empty() {
                    self.services_by_slice_pod.remove(pod);
                }
            }
        }
    }

    // === Reads ===

    /// Every pod, in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> + '_ {
        self.pods.values().map(|p| &**p)
    }

    pub fn pod(&self, key: &ObjectKey) -> Option<&Pod> {
        self.pods.get(key).map(|p| &**p)
    }

    pub fn service(&self, key: &ObjectKey) -> Option<&Service> {
        self.services.get(key).map(|s| &**s)
    }

    /// The pod that owns `addr`, by the seed 000 rules (see `ip.rs`).
    pub fn pod_for_addr(&self, addr: SocketAddr) -> Option<&Pod> {
        self.ips.lookup(addr, &self.pods)
    }

    /// The pod at `addr` once it is Running and Ready; until then the address
    /// is answered bare, as Linkerd's controller does, and updated when the
    /// pod becomes ready.
    fn serving_pod_for_addr(&self, addr: SocketAddr) -> Option<&Pod> {
        self.pod_for_addr(addr)
            .filter(|p| p.phase == crate::resource::Phase::Running && p.ready)
    }

    /// What `Get` answers for `target`.
    pub fn endpoints(&self, target: &Target) -> EndpointSet {
        match target {
            Target::Service { service, port } => self.service_endpoints(service, *port),
            Target::Addr(addr) => {
                if let Some(svc) = self.service_for_ip(addr.ip()) {
                    return self.service_endpoints(svc, addr.port());
                }
                let endpoint = match self.serving_pod_for_addr(*addr) {
                    Some(pod) => self.pod_endpoint(pod, *addr),
                    None => Endpoint::bare(*addr),
                };
                let mut set = EndpointSet {
                    exists: true,
                    ..Default::default()
                };
                if let Some(pod) = &endpoint.pod {
                    set.labels
                        .insert("namespace".to_string(), pod.namespace.to_string());
                }
                set.endpoints.insert(*addr, endpoint);
                set
            }
        }
    }

    /// What `GetProfile` answers for `target`.
    pub fn profile(&self, target: &Target) -> ProfileView {
        let service_view = |key: &ObjectKey, port: u16| match self.services.get(key) {
            Some(svc) => ProfileView::Service {
                service: key.clone(),
                port,
                opaque: self.service_port_is_opaque(svc, port),
                profile: self.service_profile(key).cloned(),
            },
            None => ProfileView::UnknownService,
        };
        match target {
            Target::Service { service, port } => service_view(service, *port),
            Target::Addr(addr) => {
                if let Some(svc) = self.service_for_ip(addr.ip()) {
                    return service_view(svc, addr.port());
                }
                match self.serving_pod_for_addr(*addr) {
                    Some(pod) => {
                        let mut endpoint = self.pod_endpoint(pod, *addr);
                        endpoint
                            .labels
                            .insert("namespace".to_string(), pod.key.namespace.to_string());
                        ProfileView::Pod {
                            opaque: endpoint.opaque,
                            endpoint,
                        }
                    }
                    None => ProfileView::Address {
                        addr: *addr,
                        opaque: self
                            .config
                            .default_opaque_ports
                            .contains(addr.port(), |_| None),
                    },
                }
            }
        }
    }
}
