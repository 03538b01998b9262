//! How a service port becomes a set of endpoints, and a pod one endpoint.

use super::{Endpoint, EndpointSet, Index, MeshIdentity, PortSet};
use crate::resource::{
    ObjectKey, Pod, Service, ServiceType, TargetPort, CONTROL_PLANE_NS_LABEL,
    OPAQUE_PORTS_ANNOTATION, SKIP_INBOUND_PORTS_ANNOTATION,
};
use std::{collections::BTreeMap, net::SocketAddr};

impl Endpoint {
    /// An address with nothing known about it.
    pub fn bare(addr: SocketAddr) -> Self {
        Endpoint {
            addr,
            labels: BTreeMap::new(),
            mesh: None,
            opaque: false,
            zone: None,
            hints_for_zones: Vec::new(),
            pod: None,
        }
    }
}

impl Index {
    pub(super) fn service_endpoints(&self, key: &ObjectKey, port: u16) -> EndpointSet {
        let Some(svc) = self.services.get(key) else {
            return EndpointSet::default();
        };
        let mut set = EndpointSet {
            exists: true,
            labels: BTreeMap::from([
                ("namespace".to_string(), key.namespace.to_string()),
                ("service".to_string(), key.name.to_string()),
            ]),
            endpoints: BTreeMap::new(),
        };
        if svc.type_ == ServiceType::ExternalName {
            return set;
        }
        let svc_port = svc.port(port);
        if let Some(slices) = self.slices_by_service.get(key) {
            // A slice lists its ports by the service port's name; a port the
            // service does not declare is looked up by number, as Linkerd does.
            let port_name = svc_port.map(|p| p.name.as_deref());
            for slice in slices.iter().filter_map(|k| self.slices.get(k)) {
                let slice_port = slice.ports.iter().find(|p| match port_name {
                    Some(name) => p.name.as_deref() == name,
                    None => p.port == Some(port),
                });
                let Some(target) = slice_port.and_then(|p| p.port) else {
                    continue;
                };
                for e in slice.endpoints.iter().filter(|e| e.ready) {
                    // Addresses of one endpoint are fungible; the API says to
                    // use the first.
                    let Some(ip) = e.addresses.first() else {
                        continue;
                    };
                    let addr = SocketAddr::new(*ip, target);
                    let pod = e.target_pod.as_ref().and_then(|k| self.pods.get(k));
                    let mut endpoint = match pod {
                        Some(pod) => self.pod_endpoint(pod, addr),
                        None => Endpoint::bare(addr),
                    };
                    endpoint.zone = e.zone.clone();
                    endpoint
                        .labels
                        .insert("zone".to_string(), e.zone.clone().unwrap_or_default());
                    endpoint.hints_for_zones = e.hints_for_zones.clone();
                    set.endpoints.insert(addr, endpoint);
                }
            }
            return set;
        }
        if svc.selector.as_ref().is_some_and(|s| !s.is_empty()) {
            self.derive_endpoints(svc, port, &mut set);
        }
        set
    }

    /// Endpoints from the pods a selector matches, as Kubernetes' EndpointSlice
    /// controller would list them: live, ready pods with an IP, whose named
    /// target port resolves on that pod.
    fn derive_endpoints(&self, svc: &Service, port: u16, set: &mut EndpointSet) {
        let Some(pods) = self.pods_by_namespace.get(&svc.key.namespace) else {
            return;
        };
        let target = svc.port(port).map(|p| &p.target_port);
        for pod in pods.values() {
            if !pod.is_live() || !pod.ready || !svc.selects(&pod.labels) {
                continue;
            }
            let Some(ip) = pod.ips.first() else { continue };
            let target_port = match target {
                None => port,
                Some(TargetPort::Number(n)) => *n,
                Some(TargetPort::Name(name)) => match pod.container_port_named(name) {
                    Some(n) => n,
                    None => continue,
                },
            };
            let addr = SocketAddr::new(*ip, target_port);
            let mut endpoint = self.pod_endpoint(pod, addr);
            endpoint.labels.insert("zone".to_string(), String::new());
            set.endpoints.insert(addr, endpoint);
        }
    }

    /// One pod's endpoint at `addr`, with Linkerd's metric labels and hints.
    pub(super) fn pod_endpoint(&self, pod: &Pod, addr: SocketAddr) -> Endpoint {
        let mut labels = BTreeMap::new();
        labels.insert("pod".to_string(), pod.key.name.to_string());
        labels.insert("serviceaccount".to_string(), pod.service_account.clone());
        if let Some(hash) = pod.labels.get("pod-template-hash") {
            labels.insert("pod_template_hash".to_string(), hash.to_string());
        }
        if let Some((kind, name)) = owner_label(pod) {
            labels.insert(kind, name);
        }
        let port = addr.port();
        let skipped = pod
            .annotations
            .get(SKIP_INBOUND_PORTS_ANNOTATION)
            .and_then(|v| PortSet::parse(v).ok())
            .is_some_and(|set| set.contains(port, |n| pod.container_port_named(n)));
        let control_plane_ns = pod
            .labels
            .get(CONTROL_PLANE_NS_LABEL)
            .filter(|ns| !ns.is_empty());
        if let Some(ns) = control_plane_ns {
            labels.insert("control_plane_ns".to_string(), ns.to_string());
        }
        let mesh = control_plane_ns
            .filter(|_| !skipped)
            .map(|ns| MeshIdentity {
                service_account: pod.service_account.clone(),
                namespace: pod.key.namespace.to_string(),
                control_plane_ns: ns.to_string(),
                inbound_port: pod.proxy_inbound_port,
            });
        Endpoint {
            addr,
            labels,
            mesh,
            opaque: self.pod_port_is_opaque(pod, port),
            zone: None,
            hints_for_zones: Vec::new(),
            pod: Some(pod.key.clone()),
        }
    }

    fn pod_port_is_opaque(&self, pod: &Pod, port: u16) -> bool {
        match pod.annotations.get(OPAQUE_PORTS_ANNOTATION) {
            Some(v) => PortSet::parse(v)
                .map(|set| set.contains(port, |n| pod.container_port_named(n)))
                .unwrap_or(false),
            None => self.config.default_opaque_ports.contains(port, |_| None),
        }
    }

    pub(super) fn service_port_is_opaque(&self, svc: &Service, port: u16) -> bool {
        let name_of = |n: &str| {
            svc.ports
                .iter()
                .find(|p| p.name.as_deref() == Some(n))
                .map(|p| p.port)
        };
        match svc.annotations.get(OPAQUE_PORTS_ANNOTATION) {
            Some(v) => PortSet::parse(v)
                .map(|set| set.contains(port, name_of))
                .unwrap_or(false),
            None => self.config.default_opaque_ports.contains(port, |_| None),
        }
    }
}

/// Linkerd's owner label: the top owner's kind, lowercased (`deployment`,
/// `statefulset`, `daemonset`, `k8s_job`, ...). A ReplicaSet named after its
/// pods' `pod-template-hash` belongs to a Deployment of the name before it.
pub fn owner_label(pod: &Pod) -> Option<(String, String)> {
    let owner = pod.owner.as_ref()?;
    if owner.kind == "ReplicaSet" {
        if let Some(hash) = pod.labels.get("pod-template-hash") {
            if let Some(deploy) = owner.name.strip_suffix(&format!("-{hash}")) {
                return Some(("deployment".to_string(), deploy.to_string()));
            }
        }
    }
    let kind = match owner.kind.as_str() {
        "Job" => "k8s_job".to_string(),
        other => other.to_ascii_lowercase(),
    };
    Some((kind, owner.name.clone()))
}
