//! Who may connect, and which requests they may make: Linkerd's reading of
//! an authorization. A client is admitted by the first authorization whose
//! networks hold its address (minus the exceptions) and whose
//! authentication its TLS satisfies. Pure.

use super::{
    policy::{Authentication, Authorization, Protocol, ServerPolicy},
    route::{find, RoutePolicy},
};
use crate::pipeline::ClientTls;
use http::Request;
use std::net::IpAddr;

/// A connection's client as authorization sees it.
#[derive(Clone, Debug)]
pub struct Client {
    /// IPv4-mapped addresses read as IPv4.
    pub ip: IpAddr,
    pub tls: ClientTls,
}

fn is_tls_authorized(authn: &Authentication, tls: &ClientTls) -> bool {
    match (authn, tls) {
        (Authentication::Unauthenticated, _) => true,
        (Authentication::TlsUnauthenticated, ClientTls::Mesh(_)) => true,
        (
            Authentication::TlsAuthenticated {
                identities,
                suffixes,
            },
            ClientTls::Mesh(Some(id)),
        ) => identities.contains(id.as_str()) || suffixes.iter().any(|s| s.contains(id.as_str())),
        _ => false,
    }
}

/// Whether `authz` admits `client`.
pub fn is_authorized(authz: &Authorization, client: &Client) -> bool {
    let ip = client.ip.to_canonical();
    authz.networks.iter().any(|n| n.contains(&ip))
        && is_tls_authorized(&authz.authentication, &client.tls)
}

fn first<'a>(authzs: &'a [Authorization], client: &Client) -> Option<&'a Authorization> {
    authzs.iter().find(|a| is_authorized(a, client))
}

/// The authorization admitting a connection that is not HTTP; `None`
/// denies it. A server that speaks only HTTP admits no other connection.
pub fn authorize_tcp<'p>(policy: &'p ServerPolicy, client: &Client) -> Option<&'p Authorization> {
    match &policy.protocol {
        Protocol::Detect { tcp: authzs, .. } | Protocol::Opaque(authzs) | Protocol::Tls(authzs) => {
            first(authzs, client)
        }
        Protocol::Http1(_) | Protocol::Http2(_) | Protocol::Grpc(_) => None,
    }
}

/// What becomes of one request.
#[derive(Debug, PartialEq, Eq)]
pub enum HttpDecision<'p> {
    Allow {
        route: &'p RoutePolicy,
        authz: &'p crate::inbound::policy::Authorization,
    },
    /// The route admits no authorization the client meets: 403.
    Deny { route: &'p RoutePolicy },
    /// No route matches (or the server is not HTTP): 404.
    NotFound,
}

/// Authorizes one request by the route it matches.
pub fn authorize_http<'p, B>(
    policy: &'p ServerPolicy,
    req: &Request<B>,
    client: &Client,
) -> HttpDecision<'p> {
    let route = match &policy.protocol {
        Protocol::Detect { http, .. } | Protocol::Http1(http) | Protocol::Http2(http) => {
            find(http, req)
        }
        Protocol::Grpc(grpc) => find(grpc, req),
        Protocol::Opaque(_) | Protocol::Tls(_) => None,
    };
    let Some(route) = route else {
        return HttpDecision::NotFound;
    };
    match first(&route.authorizations, client) {
        Some(authz) => HttpDecision::Allow { route, authz },
        None => HttpDecision::Deny { route },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::DefaultInboundPolicy,
        inbound::{
            policy::{Network, Suffix},
            route::HttpRoute,
        },
        metrics::{authz::PolicyMeta, TlsLabels},
        network::{parse_networks, IpNetwork},
        route::{HttpMatch, PathMatch, Rule},
    };
    use ballast_meshtls::IdentityName;
    use std::{collections::BTreeSet, sync::Arc};

    const WEB: &str = "web.shop.serviceaccount.identity.linkerd.cluster.local";
    const API: &str = "api.shop.serviceaccount.identity.linkerd.cluster.local";
    const OTHER_NS: &str = "web.lab.serviceaccount.identity.linkerd.cluster.local";

    fn plain(ip: &str) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            tls: ClientTls::Unauthenticated(TlsLabels::NoIdentity("no_tls_from_remote")),
        }
    }

    fn passthru(ip: &str) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            tls: ClientTls::Unauthenticated(TlsLabels::Passthru(Arc::from("db.example"))),
        }
    }

    fn mesh(ip: &str, id: Option<&str>) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            tls: ClientTls::Mesh(id.map(|i| IdentityName::parse(i).unwrap())),
        }
    }

    fn nets(s: &str) -> Vec<Network> {
        parse_networks(s)
            .unwrap()
            .into_iter()
            .map(Network::from)
            .collect()
    }

    fn authz(networks: Vec<Network>, authentication: Authentication) -> Authorization {
        Authorization {
            networks,
            authentication,
            meta: PolicyMeta::default_named("test"),
        }
    }

    fn ids(exact: &[&str], suffixes: &[&[&str]]) -> Authentication {
        Authentication::TlsAuthenticated {
            identities: exact.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            suffixes: suffixes
                .iter()
                .map(|p| Suffix::from_parts(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()))
                .collect(),
        }
    }

    #[test]
    fn authorizations_admit_by_network_and_identity() {
        let everywhere = || nets("0.0.0.0/0,::/0");
        let except = vec![Network {
            net: "10.0.0.0/8".parse::<IpNetwork>().unwrap(),
            except: parse_networks("10.1.0.0/16,10.2.3.4").unwrap(),
        }];
        let cases: Vec<(&str, Authorization, Client, bool)> = vec![
            (
                "unauthenticated admits plaintext",
                authz(everywhere(), Authentication::Unauthenticated),
                plain("10.0.0.1"),
                true,
            ),
            (
                "unauthenticated admits mesh TLS",
                authz(everywhere(), Authentication::Unauthenticated),
                mesh("10.0.0.1", Some(WEB)),
                true,
            ),
            (
                "unauthenticated admits passed-through TLS",
                authz(everywhere(), Authentication::Unauthenticated),
                passthru("10.0.0.1"),
                true,
            ),
            (
                "mesh TLS without identity admits a client with none",
                authz(everywhere(), Authentication::TlsUnauthenticated),
                mesh("10.0.0.1", None),
                true,
            ),
            (
                "mesh TLS without identity admits any identity",
                authz(everywhere(), Authentication::TlsUnauthenticated),
                mesh("10.0.0.1", Some(API)),
                true,
            ),
            (
                "mesh TLS refuses plaintext",
                authz(everywhere(), Authentication::TlsUnauthenticated),
                plain("10.0.0.1"),
                false,
            ),
            (
                "mesh TLS refuses passed-through TLS",
                authz(everywhere(), Authentication::TlsUnauthenticated),
                passthru("10.0.0.1"),
                false,
            ),
            (
                "an exact identity admits it",
                authz(everywhere(), ids(&[WEB], &[])),
                mesh("10.0.0.1", Some(WEB)),
                true,
            ),
            (
                "an exact identity refuses another",
                authz(everywhere(), ids(&[WEB], &[])),
                mesh("10.0.0.1", Some(API)),
                false,
            ),
            (
                "identities refuse a client without one",
                authz(everywhere(), ids(&[WEB], &[])),
                mesh("10.0.0.1", None),
                false,
            ),
            (
                "identities refuse plaintext",
                authz(everywhere(), ids(&[WEB], &[])),
                plain("10.0.0.1"),
                false,
            ),
            (
                "a suffix admits its namespace",
                authz(
                    everywhere(),
                    ids(
                        &[],
                        &[&[
                            "shop",
                            "serviceaccount",
                            "identity",
                            "linkerd",
                            "cluster",
                            "local",
                        ]],
                    ),
                ),
                mesh("10.0.0.1", Some(API)),
                true,
            ),
            (
                "a suffix refuses another namespace",
                authz(
                    everywhere(),
                    ids(
                        &[],
                        &[&[
                            "shop",
                            "serviceaccount",
                            "identity",
                            "linkerd",
                            "cluster",
                            "local",
                        ]],
                    ),
                ),
                mesh("10.0.0.1", Some(OTHER_NS)),
                false,
            ),
            (
                "an empty suffix admits any identity",
                authz(everywhere(), ids(&[], &[&[]])),
                mesh("10.0.0.1", Some(OTHER_NS)),
                true,
            ),
            (
                "an empty suffix refuses no identity",
                authz(everywhere(), ids(&[], &[&[]])),
                mesh("10.0.0.1", None),
                false,
            ),
            (
                "a network admits its clients",
                authz(nets("10.0.0.0/8"), Authentication::Unauthenticated),
                plain("10.9.9.9"),
                true,
            ),
            (
                "a network refuses others",
                authz(nets("10.0.0.0/8"), Authentication::Unauthenticated),
                plain("192.168.0.1"),
                false,
            ),
            (
                "an IPv4-mapped client is its IPv4 address",
                authz(nets("10.0.0.0/8"), Authentication::Unauthenticated),
                plain("::ffff:10.0.0.1"),
                true,
            ),
            (
                "except takes out a network",
                authz(except.clone(), Authentication::Unauthenticated),
                plain("10.1.2.3"),
                false,
            ),
            (
                "except takes out one address",
                authz(except.clone(), Authentication::Unauthenticated),
                plain("10.2.3.4"),
                false,
            ),
            (
                "except leaves the rest",
                authz(except, Authentication::Unauthenticated),
                plain("10.2.3.5"),
                true,
            ),
            (
                "the right identity from the wrong network is refused",
                authz(nets("10.0.0.0/8"), ids(&[WEB], &[])),
                mesh("172.16.0.1", Some(WEB)),
                false,
            ),
            (
                "no networks admit no one",
                authz(vec![], Authentication::Unauthenticated),
                plain("10.0.0.1"),
                false,
            ),
        ];
        for (what, a, client, expect) in cases {
            assert_eq!(is_authorized(&a, &client), expect, "{what}");
        }
    }

    #[test]
    fn default_policies_admit_as_linkerds() {
        let cluster = parse_networks(crate::network::DEFAULT_CLUSTER_NETWORKS).unwrap();
        use DefaultInboundPolicy::*;
        let cases = [
            (AllUnauthenticated, plain("203.0.113.1"), true),
            (AllAuthenticated, plain("10.0.0.1"), false),
            (AllAuthenticated, mesh("203.0.113.1", Some(WEB)), true),
            (AllAuthenticated, mesh("10.0.0.1", None), false),
            (ClusterUnauthenticated, plain("10.0.0.1"), true),
            (ClusterUnauthenticated, plain("203.0.113.1"), false),
            (ClusterAuthenticated, mesh("192.168.1.1", Some(WEB)), true),
            (ClusterAuthenticated, mesh("203.0.113.1", Some(WEB)), false),
            (ClusterAuthenticated, plain("10.0.0.1"), false),
            (Deny, mesh("10.0.0.1", Some(WEB)), false),
            (Deny, plain("127.0.0.1"), false),
            (Audit, plain("203.0.113.1"), true),
        ];
        for (default, client, expect) in cases {
            for opaque in [false, true] {
                let p = ServerPolicy::default_for(default, &cluster, opaque);
                let tcp = authorize_tcp(&p, &client);
                assert_eq!(tcp.is_some(), expect, "{default:?} tcp {client:?}");
                if !opaque && default != Deny {
                    let req = Request::get("/").body(()).unwrap();
                    let allowed = matches!(
                        authorize_http(&p, &req, &client),
                        HttpDecision::Allow { .. }
                    );
                    assert_eq!(allowed, expect, "{default:?} http {client:?}");
                }
            }
        }
        // `audit` allows under its own name, which metrics and logs count
        // as an audit.
        let p = ServerPolicy::default_for(Audit, &cluster, false);
        let a = authorize_tcp(&p, &plain("203.0.113.1")).unwrap();
        assert!(a.meta.is_audit());
        let p = ServerPolicy::default_for(AllUnauthenticated, &cluster, false);
        assert!(!authorize_tcp(&p, &plain("10.0.0.1"))
            .unwrap()
            .meta
            .is_audit());
        // `deny` is opaque: nothing is read from a denied client.
        assert!(ServerPolicy::default_for(Deny, &cluster, false)
            .protocol
            .is_opaque());
    }

    #[test]
    fn routes_add_their_authorizations_to_the_servers() {
        let server_authz = authz(nets("0.0.0.0/0"), ids(&[WEB], &[]));
        let route_authz = Authorization {
            meta: PolicyMeta::default_named("admin-only"),
            ..authz(nets("0.0.0.0/0"), ids(&[API], &[]))
        };
        let admin = HttpRoute {
            hosts: vec![],
            rules: vec![Rule {
                matches: vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/admin".into())),
                    ..Default::default()
                }],
                policy: RoutePolicy {
                    meta: PolicyMeta::default_named("admin"),
                    authorizations: Arc::new([route_authz, server_authz.clone()]),
                },
            }],
        };
        let policy = ServerPolicy {
            meta: PolicyMeta::default_named("srv"),
            protocol: Protocol::Http1(Arc::new([admin])),
        };
        let get = |p: &str| Request::get(p).body(()).unwrap();
        let api = mesh("10.0.0.1", Some(API));
        let web = mesh("10.0.0.1", Some(WEB));
        let other = mesh("10.0.0.1", Some(OTHER_NS));
        match authorize_http(&policy, &get("/admin/x"), &api) {
            HttpDecision::Allow { route, authz } => {
                assert_eq!(&*route.meta.name, "admin");
                assert_eq!(&*authz.meta.name, "admin-only");
            }
            d => panic!("{d:?}"),
        }
        assert!(matches!(
            authorize_http(&policy, &get("/admin"), &web),
            HttpDecision::Allow { .. }
        ));
        assert!(matches!(
            authorize_http(&policy, &get("/admin"), &other),
            HttpDecision::Deny { .. }
        ));
        assert_eq!(
            authorize_http(&policy, &get("/public"), &api),
            HttpDecision::NotFound
        );
        // A server that speaks only HTTP admits no other connection.
        assert!(authorize_tcp(&policy, &web).is_none());
    }
}
