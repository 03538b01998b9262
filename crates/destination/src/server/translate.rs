//! From the index's views to Linkerd's protobuf messages.

use crate::{
    authority,
    index::{Endpoint, ProfileView, Target},
    resource::ObjectKey,
};
use linkerd2_proxy_api::{
    destination::{
        protocol_hint, tls_identity, DestinationProfile, ProtocolHint, RetryBudget, TlsIdentity,
        WeightedAddr,
    },
    meta,
    net::{IpAddress, TcpAddress},
};
use std::net::SocketAddr;

/// Linkerd's default endpoint weight.
pub const DEFAULT_WEIGHT: u32 = 10_000;
/// Linkerd's proxy inbound port, used when a meshed pod does not say.
pub const DEFAULT_PROXY_INBOUND_PORT: u16 = 4143;

/// The settings that shape what endpoints and profiles say.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    pub cluster_domain: String,
    /// Namespace of the control plane; only pods injected by it get a TLS
    /// identity.
    pub controller_namespace: String,
    /// `None` disables identities.
    pub identity_trust_domain: Option<String>,
    /// Hint HTTP/2 to meshed endpoints on non-opaque ports.
    pub enable_h2_upgrade: bool,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".into(),
            controller_namespace: "linkerd".into(),
            identity_trust_domain: Some("cluster.local".into()),
            enable_h2_upgrade: true,
        }
    }
}

pub fn tcp_address(addr: SocketAddr) -> TcpAddress {
    TcpAddress {
        ip: Some(IpAddress::from(addr.ip())),
        port: u32::from(addr.port()),
    }
}

pub fn weighted_addr(e: &Endpoint, config: &MeshConfig) -> WeightedAddr {
    let mut addr = WeightedAddr {
        addr: Some(tcp_address(e.addr)),
        weight: DEFAULT_WEIGHT,
        metric_labels: e
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    };
    let Some(mesh) = &e.mesh else { return addr };
    let protocol = if e.opaque {
        Some(protocol_hint::Protocol::Opaque(protocol_hint::Opaque {}))
    } else if config.enable_h2_upgrade {
        Some(protocol_hint::Protocol::H2(protocol_hint::H2 {}))
    } else {
        None
    };
    let opaque_transport = e.opaque.then(|| protocol_hint::OpaqueTransport {
        inbound_port: u32::from(mesh.inbound_port.unwrap_or(DEFAULT_PROXY_INBOUND_PORT)),
    });
    addr.protocol_hint = Some(ProtocolHint {
        protocol,
        opaque_transport,
    });
    if let Some(trust) = &config.identity_trust_domain {
        if mesh.control_plane_ns == config.controller_namespace {
            let name = format!(
                "{}.{}.serviceaccount.identity.{}.{}",
                mesh.service_account, mesh.namespace, mesh.control_plane_ns, trust
            );
            addr.tls_identity = Some(TlsIdentity {
                server_name: Some(tls_identity::DnsLikeIdentity { name: name.clone() }),
                strategy: Some(tls_identity::Strategy::DnsLikeIdentity(
                    tls_identity::DnsLikeIdentity { name },
                )),
            });
        }
    }
    addr
}

/// Linkerd's default retry budget (`ballast_controlplane::destination_api`).
pub fn default_retry_budget() -> RetryBudget {
    use ballast_controlplane::destination_api as api;
    RetryBudget {
        retry_ratio: api::DEFAULT_RETRY_RATIO,
        min_retries_per_second: api::DEFAULT_MIN_RETRIES_PER_SECOND,
        ttl: prost_types::Duration::try_from(api::DEFAULT_RETRY_TTL).ok(),
    }
}

fn service_ref(service: &ObjectKey, port: u16) -> meta::Metadata {
    meta::Metadata {
        kind: Some(meta::metadata::Kind::Resource(meta::Resource {
            group: "core".into(),
            kind: "Service".into(),
            name: service.name.to_string(),
            namespace: service.namespace.to_string(),
            section: String::new(),
            port: u32::from(port),
        })),
    }
}

pub fn profile(view: &ProfileView, target: &Target, config: &MeshConfig) -> DestinationProfile {
    let mut p = DestinationProfile {
        retry_budget: Some(default_retry_budget()),
        ..Default::default()
    };
    match view {
        ProfileView::Service {
            service,
            port,
            opaque,
            profile,
        } => {
            p.fully_qualified_name = authority::service_fqdn(service, &config.cluster_domain);
            p.opaque_protocol = *opaque;
            p.parent_ref = Some(service_ref(service, *port));
            if let Some(profile) = profile {
                p.routes = super::service_profile::routes(profile);
                p.dst_overrides = super::service_profile::dst_overrides(profile);
                if let Some(b) = &profile.retry_budget {
                    p.retry_budget = Some(super::service_profile::retry_budget(b));
                }
            }
        }
        ProfileView::UnknownService => {
            // A service that may yet appear: the default profile, named.
            if let Target::Service { service, port } = target {
                p.fully_qualified_name = authority::service_fqdn(service, &config.cluster_domain);
                p.parent_ref = Some(service_ref(service, *port));
            }
        }
        ProfileView::Pod { endpoint, opaque } => {
            p.opaque_protocol = *opaque;
            p.endpoint = Some(weighted_addr(endpoint, config));
        }
        ProfileView::Address { addr, opaque } => {
            p.opaque_protocol = *opaque;
            p.endpoint = Some(WeightedAddr {
                addr: Some(tcp_address(*addr)),
                weight: DEFAULT_WEIGHT,
                ..Default::default()
            });
        }
    }
    p
}
