//! What `InboundServerPolicies` answers for one pod's port.

use super::route_order;
use crate::{
    resource::{
        AuthnRef, AuthorizationPolicy, AuthzTarget, DefaultPolicy, IdentityMatch, IpNet, Network,
        ObjectKey, ParentKind, Pod, Route, Server, ServerPort, ServerProtocol,
        DEFAULT_INBOUND_POLICY_ANNOTATION, OPAQUE_PORTS_ANNOTATION,
    },
    Index, PortSet,
};
use std::sync::Arc;

use super::MAX_ROUTES_PER_PARENT;

#[derive(Clone, Debug, PartialEq)]
pub struct InboundView {
    pub server: ServerRef,
    pub protocol: InboundProtocol,
    /// Server-wide authorizations (TCP, and HTTP routes of their own none).
    pub authorizations: Vec<Authz>,
    /// Routes attached to the Server, each with its own authorizations;
    /// empty means Linkerd's default route (everything, server-wide authz).
    pub routes: Vec<InboundRoute>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerRef {
    Default(DefaultPolicy),
    Server(ObjectKey),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InboundProtocol {
    Detect,
    Http1,
    Http2,
    Grpc,
    Opaque,
    Tls,
}

#[derive(Clone, Debug, PartialEq)]
pub struct InboundRoute {
    pub route: Arc<Route>,
    pub authorizations: Vec<Authz>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authz {
    pub meta: AuthzRef,
    pub networks: Vec<Network>,
    pub authn: Authn,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthzRef {
    /// A default policy's name (`all-unauthenticated`, `audit`, ...).
    Default(&'static str),
    Policy(ObjectKey),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authn {
    /// Any client, with or without TLS.
    Unauthenticated,
    /// Mesh TLS clients with one of these identities, or any identity
    /// ending in one of these suffixes (an empty suffix: any identity).
    MeshTls {
        identities: Vec<String>,
        suffixes: Vec<String>,
    },
}

impl Index {
    /// What `InboundServerPolicies.WatchPort` answers for `pod`'s `port`;
    /// `None` when the pod is not known.
    pub fn inbound_policy(&self, pod: &ObjectKey, port: u16) -> Option<InboundView> {
        let pod = self.pod(pod)?;
        let view = match self.server_for(pod, port) {
            Some(server) => self.server_view(server),
            None => self.default_view(pod, port),
        };
        Some(view)
    }

    fn default_policy_of(&self, pod: &Pod) -> DefaultPolicy {
        pod.annotations
            .get(DEFAULT_INBOUND_POLICY_ANNOTATION)
            .and_then(|p| p.parse().ok())
            .or_else(|| {
                self.policy
                    .namespaces
                    .get(&pod.key.namespace)
                    .and_then(|ns| ns.default_policy)
            })
            .unwrap_or(self.config.default_inbound_policy)
    }

    fn default_view(&self, pod: &Pod, port: u16) -> InboundView {
        let policy = self.default_policy_of(pod);
        let opaque = match pod.annotations.get(OPAQUE_PORTS_ANNOTATION) {
            Some(v) => PortSet::parse(v)
                .map(|set| set.contains(port, |name| named_port(pod, name)))
                .unwrap_or(false),
            None => self.config.default_opaque_ports.contains(port, |_| None),
        };
        InboundView {
            server: ServerRef::Default(policy),
            protocol: if opaque {
                InboundProtocol::Opaque
            } else {
                InboundProtocol::Detect
            },
            authorizations: self.default_authz(policy).into_iter().collect(),
            routes: Vec::new(),
        }
    }

    /// The authorization a default policy grants, if any.
    fn default_authz(&self, policy: DefaultPolicy) -> Option<Authz> {
        let all = || {
            vec![
                Network {
                    net: IpNet::all_v4(),
                    except: vec![],
                },
                Network {
                    net: IpNet::all_v6(),
                    except: vec![],
                },
            ]
        };
        let cluster = || {
            self.config
                .cluster_networks
                .iter()
                .map(|net| Network {
                    net: *net,
                    except: vec![],
                })
                .collect()
        };
        let any_identity = || Authn::MeshTls {
            identities: vec![],
            suffixes: vec![String::new()],
        };
        let (networks, authn) = match policy {
            DefaultPolicy::AllUnauthenticated | DefaultPolicy::Audit => {
                (all(), Authn::Unauthenticated)
            }
            DefaultPolicy::AllAuthenticated => (all(), any_identity()),
            DefaultPolicy::ClusterUnauthenticated => (cluster(), Authn::Unauthenticated),
            DefaultPolicy::ClusterAuthenticated => (cluster(), any_identity()),
            DefaultPolicy::Deny => return None,
        };
        Some(Authz {
            meta: AuthzRef::Default(policy.as_str()),
            networks,
            authn,
        })
    }

    /// The Server selecting this pod's port; of several, the oldest.
    fn server_for(&self, pod: &Pod, port: u16) -> Option<&Server> {
        let names = self.policy.servers_by_namespace.get(&pod.key.namespace)?;
        names
            .iter()
            .filter_map(|name| {
                self.policy
                    .servers
                    .get(&ObjectKey::new(pod.key.namespace.clone(), name.clone()))
            })
            .filter(|s| {
                s.selector.matches(&pod.labels)
                    && match &s.port {
                        ServerPort::Number(n) => *n == port,
                        ServerPort::Name(name) => named_port(pod, name) == Some(port),
                    }
            })
            .min_by(|a, b| {
                a.creation_timestamp
                    .cmp(&b.creation_timestamp)
                    .then_with(|| a.key.cmp(&b.key))
            })
            .map(|s| &**s)
    }

    fn server_view(&self, server: &Server) -> InboundView {
        let ns = &server.key.namespace;
        let policies: Vec<&AuthorizationPolicy> = self
            .policy
            .authz_by_namespace
            .get(ns)
            .into_iter()
            .flatten()
            .filter_map(|name| {
                self.policy
                    .authorizations
                    .get(&ObjectKey::new(ns.clone(), name.clone()))
            })
            .map(|a| &**a)
            .collect();
        let mut authorizations: Vec<Authz> = policies
            .iter()
            .filter(|p| match &p.target {
                AuthzTarget::Server(name) => *name == server.key.name,
                AuthzTarget::Namespace => true,
                AuthzTarget::Route(_) => false,
            })
            .filter_map(|p| self.resolve_authz(p))
            .collect();
        if let Some(a) = server.access_policy.and_then(|p| self.default_authz(p)) {
            authorizations.push(a);
        }
        let mut routes: Vec<Arc<Route>> = self
            .policy
            .routes_by_parent
            .get(&(ParentKind::Server, server.key.clone()))
            .into_iter()
            .flatten()
            .filter(|id| id.key.namespace == *ns)
            .filter_map(|id| self.policy.route(id).cloned())
            .collect();
        routes.sort_by(|a, b| route_order(a, b));
        routes.truncate(MAX_ROUTES_PER_PARENT);
        let routes = routes
            .into_iter()
            .map(|route| InboundRoute {
                authorizations: policies
                    .iter()
                    .filter(|p| matches!(&p.target, AuthzTarget::Route(name) if *name == route.key.name))
                    .filter_map(|p| self.resolve_authz(p))
                    .collect(),
                route,
            })
            .collect();
        InboundView {
            server: ServerRef::Server(server.key.clone()),
            protocol: match server.protocol {
                ServerProtocol::Unknown => InboundProtocol::Detect,
                ServerProtocol::Http1 => InboundProtocol::Http1,
                ServerProtocol::Http2 => InboundProtocol::Http2,
                ServerProtocol::Grpc => InboundProtocol::Grpc,
                ServerProtocol::Opaque => InboundProtocol::Opaque,
                ServerProtocol::Tls => InboundProtocol::Tls,
            },
            authorizations,
            routes,
        }
    }

    /// An AuthorizationPolicy with its authentications looked up; `None`
    /// (the policy grants nothing) when one it requires does not exist, as
    /// Linkerd does: a half-resolved policy must not grant more than meant.
    fn resolve_authz(&self, p: &AuthorizationPolicy) -> Option<Authz> {
        let mut networks = Vec::new();
        let mut identities = Vec::new();
        let mut suffixes = Vec::new();
        let mut mesh = false;
        for r in &p.required {
            match r {
                AuthnRef::Network(key) => {
                    networks.extend(self.policy.networks.get(key)?.networks.iter().cloned())
                }
                AuthnRef::MeshTls(key) => {
                    mesh = true;
                    for id in &self.policy.mesh_tls.get(key)?.identities {
                        match id {
                            IdentityMatch::Any => suffixes.push(String::new()),
                            IdentityMatch::Exact(name) => identities.push(name.clone()),
                            IdentityMatch::Suffix(s) => suffixes.push(s.clone()),
                            IdentityMatch::ServiceAccount(sa) => {
                                identities.push(self.service_account_identity(sa))
                            }
                            IdentityMatch::Namespace(ns) => {
                                suffixes.push(self.namespace_identity_suffix(ns))
                            }
                        }
                    }
                }
                AuthnRef::ServiceAccount(sa) => {
                    mesh = true;
                    identities.push(self.service_account_identity(sa));
                }
            }
        }
        if networks.is_empty() {
            networks = vec![
                Network {
                    net: IpNet::all_v4(),
                    except: vec![],
                },
                Network {
                    net: IpNet::all_v6(),
                    except: vec![],
                },
            ];
        }
        Some(Authz {
            meta: AuthzRef::Policy(p.key.clone()),
            networks,
            authn: if mesh {
                Authn::MeshTls {
                    identities,
                    suffixes,
                }
            } else {
                Authn::Unauthenticated
            },
        })
    }

    /// Linkerd's identity of a service account.
    pub fn service_account_identity(&self, sa: &ObjectKey) -> String {
        format!(
            "{}.{}",
            sa.name,
            self.namespace_identity_suffix(&sa.namespace)
        )
    }

    fn namespace_identity_suffix(&self, ns: &str) -> String {
        format!(
            "{ns}.serviceaccount.identity.{}.{}",
            self.config.control_plane_namespace, self.config.trust_domain
        )
    }
}

fn named_port(pod: &Pod, name: &str) -> Option<u16> {
    pod.ports
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}
