//! An inbound port's policy as Linkerd's proxy reads it: the protocol (which
//! decides detection) and who may connect, per port and per HTTP route.
//! Translated once per controller message; pure.
//!
//! As in Linkerd, every server also admits unauthenticated clients on
//! localhost, and a route's authorizations are its own followed by the
//! server's. A `Server` that cannot be read denies everything (Linkerd's
//! `invalid` policy).

use super::route::{check_regexes, GrpcRoute, HttpRoute, InboundRoute, InvalidRoute};
use crate::{
    config::DefaultInboundPolicy,
    metrics::authz::PolicyMeta,
    network::{IpNetwork, NetworkError},
};
use linkerd2_proxy_api::{inbound as api, meta as api_meta, net as api_net};
use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

/// What the controller said of one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPolicy {
    pub meta: Arc<PolicyMeta>,
    pub protocol: Protocol,
}

/// How connections to the port are served, and the authorizations that
/// apply to each kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Detect HTTP: requests are authorized by route, other connections by
    /// the server's authorizations.
    Detect {
        http: Arc<[HttpRoute]>,
        tcp: Arc<[Authorization]>,
    },
    Http1(Arc<[HttpRoute]>),
    Http2(Arc<[HttpRoute]>),
    Grpc(Arc<[GrpcRoute]>),
    /// Forwarded without detection.
    Opaque(Arc<[Authorization]>),
    /// TLS the proxy does not terminate: forwarded without detection.
    Tls(Arc<[Authorization]>),
}

impl Protocol {
    /// Whether connections skip protocol detection.
    pub fn is_opaque(&self) -> bool {
        matches!(self, Self::Opaque(_) | Self::Tls(_))
    }
}

/// Who an authorization admits: clients in `networks` with `authentication`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    pub networks: Vec<Network>,
    pub authentication: Authentication,
    pub meta: Arc<PolicyMeta>,
}

/// A network of clients, minus exceptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    pub net: IpNetwork,
    pub except: Vec<IpNetwork>,
}

impl Network {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.net.contains(ip) && !self.except.iter().any(|e| e.contains(ip))
    }
}

impl From<IpNetwork> for Network {
    fn from(net: IpNetwork) -> Self {
        Self {
            net,
            except: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authentication {
    /// Any client, TLS or not.
    Unauthenticated,
    /// Mesh TLS terminated by this proxy, with or without a client identity.
    TlsUnauthenticated,
    /// Mesh TLS with a client identity among `identities` or ending with
    /// one of `suffixes`.
    TlsAuthenticated {
        identities: BTreeSet<String>,
        suffixes: Vec<Suffix>,
    },
}

/// An identity suffix: `["ns", "serviceaccount"]` matches names ending in
/// `.ns.serviceaccount`; no parts matches every name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suffix {
    ends_with: String,
}

impl Suffix {
    pub fn from_parts(parts: &[String]) -> Self {
        let ends_with = if parts.is_empty() {
            String::new()
        } else {
            format!(".{}", parts.join("."))
        };
        Self { ends_with }
    }

    pub fn contains(&self, name: &str) -> bool {
        name.ends_with(&self.ends_with)
    }
}

/// Why a `Server` could not be read (its port then denies everything).
#[derive(Debug, thiserror::Error)]
pub enum InvalidServer {
    #[error("no protocol")]
    MissingProtocol,
    #[error("protocol detection without a timeout")]
    MissingDetectTimeout,
    #[error("an authorization has no networks")]
    MissingNetworks,
    #[error("a network has no address")]
    MissingNetwork,
    #[error("an authorization has no authentication")]
    MissingAuthentication,
    #[error("invalid network: {0}")]
    Network(#[from] NetworkError),
    #[error("invalid network address")]
    Address,
    #[error("no name in the labels or metadata")]
    MissingName,
    #[error("invalid route: {0}")]
    Route(#[from] InvalidRoute),
}

impl ServerPolicy {
    /// The policy of a controller answer; an unreadable one denies
    /// everything, as Linkerd's `invalid` policy does.
    pub fn from_wire(server: api::Server) -> Self {
        Self::try_from_wire(server).unwrap_or_else(|error| {
            tracing::warn!(%error, "the controller sent an inbound policy that cannot be read; denying the port");
            Self::invalid()
        })
    }

    pub fn try_from_wire(server: api::Server) -> Result<Self, InvalidServer> {
        let api::Server {
            protocol,
            authorizations,
            labels,
            server_ips: _,
        } = server;
        let mut authzs = authorizations
            .into_iter()
            .map(Authorization::from_wire)
            .collect::<Result<Vec<_>, _>>()?;
        authzs.push(localhost());
        let authzs: Arc<[Authorization]> = authzs.into();
        let routes = |http: Vec<api::HttpRoute>| -> Result<Arc<[HttpRoute]>, InvalidServer> {
            if http.is_empty() {
                return Ok(Arc::new([HttpRoute::default_route(authzs.clone())]));
            }
            http.into_iter()
                .map(|r| HttpRoute::from_wire(r, &authzs))
                .collect()
        };
        use api::proxy_protocol::Kind;
        let kind = protocol
            .and_then(|p| p.kind)
            .ok_or(InvalidServer::MissingProtocol)?;
        match &kind {
            Kind::Detect(d) => check_regexes(&d.http_routes, &[])?,
            Kind::Http1(h) => check_regexes(&h.routes, &[])?,
            Kind::Http2(h) => check_regexes(&h.routes, &[])?,
            Kind::Grpc(g) => check_regexes(&[], &g.routes)?,
            Kind::Opaque(_) | Kind::Tls(_) => {}
        }
        let protocol = match kind {
            Kind::Detect(d) if d.timeout.is_none() => {
                return Err(InvalidServer::MissingDetectTimeout)
            }
            Kind::Detect(d) => Protocol::Detect {
                http: routes(d.http_routes)?,
                tcp: authzs.clone(),
            },
            Kind::Http1(h) => Protocol::Http1(routes(h.routes)?),
            Kind::Http2(h) => Protocol::Http2(routes(h.routes)?),
            Kind::Grpc(g) => Protocol::Grpc(if g.routes.is_empty() {
                Arc::new([GrpcRoute::default_route(authzs.clone())])
            } else {
                g.routes
                    .into_iter()
                    .map(|r| GrpcRoute::from_wire(r, &authzs))
                    .collect::<Result<_, _>>()?
            }),
            Kind::Opaque(_) => Protocol::Opaque(authzs),
            Kind::Tls(_) => Protocol::Tls(authzs),
        };
        Ok(Self {
            meta: meta_from_labels(labels, "policy.linkerd.io", "server")?,
            protocol,
        })
    }

    /// Linkerd's policy for a `Server` it cannot read: nothing is allowed.
    pub fn invalid() -> Self {
        let meta = PolicyMeta::default_named("invalid");
        Self {
            protocol: Protocol::Detect {
                http: Arc::new([HttpRoute::default_named(meta.clone(), Arc::new([]))]),
                tcp: Arc::new([]),
            },
            meta,
        }
    }

    /// A default policy (`--default-inbound-policy`), detecting or opaque
    /// (the port is in `--inbound-opaque-ports`). `deny` is opaque with no
    /// authorization: connections are closed before anything is read.
    pub fn default_for(policy: DefaultInboundPolicy, cluster: &[IpNetwork], opaque: bool) -> Self {
        let meta = PolicyMeta::default_named(policy.name());
        let all = || vec![IpNetwork::ALL_V4.into(), IpNetwork::ALL_V6.into()];
        let cluster = || cluster.iter().copied().map(Network::from).collect();
        let authenticated = || Authentication::TlsAuthenticated {
            identities: BTreeSet::new(),
            suffixes: vec![Suffix::from_parts(&[])],
        };
        let (networks, authentication) = match policy {
            DefaultInboundPolicy::Deny => {
                return Self {
                    meta,
                    protocol: Protocol::Opaque(Arc::new([])),
                }
            }
            DefaultInboundPolicy::AllUnauthenticated | DefaultInboundPolicy::Audit => {
                (all(), Authentication::Unauthenticated)
            }
            DefaultInboundPolicy::AllAuthenticated => (all(), authenticated()),
            DefaultInboundPolicy::ClusterUnauthenticated => {
                (cluster(), Authentication::Unauthenticated)
            }
            DefaultInboundPolicy::ClusterAuthenticated => (cluster(), authenticated()),
        };
        let authzs: Arc<[Authorization]> = Arc::new([Authorization {
            networks,
            authentication,
            meta: meta.clone(),
        }]);
        let protocol = if opaque {
            Protocol::Opaque(authzs)
        } else {
            Protocol::Detect {
                http: Arc::new([HttpRoute::default_route(authzs.clone())]),
                tcp: authzs,
            }
        };
        Self { meta, protocol }
    }
}

/// Linkerd adds this to every server: local clients need no authorization.
fn localhost() -> Authorization {
    Authorization {
        networks: vec![
            IpNetwork::host(Ipv4Addr::LOCALHOST.into()).into(),
            IpNetwork::host(Ipv6Addr::LOCALHOST.into()).into(),
        ],
        authentication: Authentication::Unauthenticated,
        meta: PolicyMeta::default_named("localhost"),
    }
}

impl Authorization {
    pub(super) fn from_wire(authz: api::Authz) -> Result<Self, InvalidServer> {
        let api::Authz {
            networks,
            authentication,
            labels,
            metadata,
        } = authz;
        if networks.is_empty() {
            return Err(InvalidServer::MissingNetworks);
        }
        let networks = networks
            .into_iter()
            .map(|n| {
                let net = network(n.net.ok_or(InvalidServer::MissingNetwork)?)?;
                let except = n
                    .except
                    .into_iter()
                    .map(network)
                    .collect::<Result<_, _>>()?;
                Ok(Network { net, except })
            })
            .collect::<Result<Vec<_>, InvalidServer>>()?;
        use api::authn::{permit_mesh_tls::Clients, Permit};
        let authentication = match authentication
            .and_then(|a| a.permit)
            .ok_or(InvalidServer::MissingAuthentication)?
        {
            Permit::Unauthenticated(_) => Authentication::Unauthenticated,
            Permit::MeshTls(m) => match m.clients.ok_or(InvalidServer::MissingAuthentication)? {
                Clients::Unauthenticated(_) => Authentication::TlsUnauthenticated,
                Clients::Identities(ids) => Authentication::TlsAuthenticated {
                    identities: ids.identities.into_iter().map(|i| i.name).collect(),
                    suffixes: ids
                        .suffixes
                        .iter()
                        .map(|s| Suffix::from_parts(&s.parts))
                        .collect(),
                },
            },
        };
        let meta = match metadata {
            Some(m) => meta_from_wire(m)?,
            None => meta_from_labels(labels, "policy.linkerd.io", "serverauthorization")?,
        };
        Ok(Self {
            networks,
            authentication,
            meta,
        })
    }
}

fn network(n: api_net::IpNetwork) -> Result<IpNetwork, InvalidServer> {
    let ip = IpAddr::try_from(n.ip.ok_or(InvalidServer::MissingNetwork)?)
        .map_err(|_| InvalidServer::Address)?;
    Ok(IpNetwork::new(ip, n.prefix_len)?)
}

/// A `Metadata` message: a default's name or a resource.
pub(super) fn meta_from_wire(m: api_meta::Metadata) -> Result<Arc<PolicyMeta>, InvalidServer> {
    use api_meta::metadata::Kind;
    Ok(match m.kind.ok_or(InvalidServer::MissingName)? {
        Kind::Default(name) => PolicyMeta::default_named(&name),
        Kind::Resource(r) => Arc::new(PolicyMeta {
            group: Arc::from(r.group),
            kind: Arc::from(r.kind),
            name: Arc::from(r.name),
        }),
    })
}

/// Linkerd's reading of the older `labels` map: `name` (possibly
/// `KIND:NAME`, or `default:NAME`), `group` and `kind`.
fn meta_from_labels(
    mut labels: HashMap<String, String>,
    default_group: &str,
    default_kind: &str,
) -> Result<Arc<PolicyMeta>, InvalidServer> {
    let name = labels.remove("name").ok_or(InvalidServer::MissingName)?;
    let group = labels
        .remove("group")
        .unwrap_or_else(|| default_group.to_string());
    let resource = |group: &str, kind: &str, name: &str| {
        Arc::new(PolicyMeta {
            group: Arc::from(group),
            kind: Arc::from(kind),
            name: Arc::from(name),
        })
    };
    if let Some(kind) = labels.remove("kind") {
        if group.is_empty() && kind == "default" {
            return Ok(PolicyMeta::default_named(&name));
        }
        return Ok(resource(&group, &kind, &name));
    }
    Ok(match name.split_once(':') {
        Some(("default", name)) => PolicyMeta::default_named(name),
        Some((kind, name)) => resource(&group, kind, name),
        None => resource(&group, default_kind, &name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_name_servers_as_linkerd_reads_them() {
        let m = meta_from_labels(
            labels(&[("name", "web-http")]),
            "policy.linkerd.io",
            "server",
        )
        .unwrap();
        assert_eq!(
            (&*m.group, &*m.kind, &*m.name),
            ("policy.linkerd.io", "server", "web-http")
        );
        let m = meta_from_labels(labels(&[("name", "default:deny")]), "g", "k").unwrap();
        assert_eq!((&*m.group, &*m.kind, &*m.name), ("", "default", "deny"));
        let m = meta_from_labels(
            labels(&[("name", "x"), ("group", ""), ("kind", "default")]),
            "g",
            "k",
        )
        .unwrap();
        assert_eq!(m, PolicyMeta::default_named("x"));
        assert!(meta_from_labels(labels(&[]), "g", "k").is_err());
    }

    #[test]
    fn a_server_without_protocol_or_with_an_empty_authorization_denies_everything() {
        let server = api::Server {
            protocol: None,
            labels: labels(&[("name", "web")]),
            ..Default::default()
        };
        assert_eq!(ServerPolicy::from_wire(server), ServerPolicy::invalid());
        let server = api::Server {
            protocol: Some(api::ProxyProtocol {
                kind: Some(api::proxy_protocol::Kind::Opaque(Default::default())),
            }),
            authorizations: vec![api::Authz::default()],
            labels: labels(&[("name", "web")]),
            ..Default::default()
        };
        assert!(matches!(
            ServerPolicy::try_from_wire(server),
            Err(InvalidServer::MissingNetworks)
        ));
    }
}
