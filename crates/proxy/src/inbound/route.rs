//! Inbound HTTP and gRPC routes: the matcher both directions share
//! (`crate::route`, Linkerd's precedence), with each rule's policy the
//! route's name and who may use it (its own authorizations, then the
//! server's). A route that cannot be read makes the server unreadable
//! (denied). Pure.

use super::policy::{meta_from_wire, Authorization, InvalidServer};
use crate::{
    metrics::authz::PolicyMeta,
    route::{self, wire, GrpcMatch, HttpMatch, Match, Route, Rule},
};
use http::Request;
use linkerd2_proxy_api::inbound as inbound_api;
use std::sync::Arc;

/// What a matched route carries: its name and who may use it (its own
/// authorizations, then the server's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePolicy {
    pub meta: Arc<PolicyMeta>,
    pub authorizations: Arc<[Authorization]>,
}

pub type HttpRoute = Route<HttpMatch, RoutePolicy>;
pub type GrpcRoute = Route<GrpcMatch, RoutePolicy>;

#[derive(Debug, thiserror::Error)]
pub enum InvalidRoute {
    #[error("a route has no metadata")]
    MissingMeta,
    #[error("more than {} regexes", wire::MAX_REGEXES_PER_POLICY)]
    TooManyRegexes,
    #[error(transparent)]
    Match(#[from] wire::InvalidMatch),
}

impl From<wire::InvalidMatch> for InvalidServer {
    fn from(e: wire::InvalidMatch) -> Self {
        Self::Route(e.into())
    }
}

/// The policy of the route that best matches `req`; `None`: no route.
pub fn find<'r, M: Match, B>(
    routes: &'r [Route<M, RoutePolicy>],
    req: &Request<B>,
) -> Option<&'r RoutePolicy> {
    // The host is read only when a route names hosts.
    let host = if routes.iter().any(|r| !r.hosts.is_empty()) {
        route::request_host(req)
    } else {
        None
    };
    route::find(routes, req, host).map(|(_, _, policy)| policy)
}

/// Regexes a server's routes ask for, counted before any is compiled: at
/// most `MAX_REGEXES_PER_POLICY` a server, as for an outbound policy.
pub fn check_regexes(
    http: &[inbound_api::HttpRoute],
    grpc: &[inbound_api::GrpcRoute],
) -> Result<(), InvalidRoute> {
    let http: usize = http
        .iter()
        .flat_map(|r| &r.rules)
        .flat_map(|r| &r.matches)
        .map(wire::regexes_in_http)
        .sum();
    let grpc: usize = grpc
        .iter()
        .flat_map(|r| &r.rules)
        .flat_map(|r| &r.matches)
        .map(|m| wire::regexes_in_headers(&m.headers))
        .sum();
    if http + grpc > wire::MAX_REGEXES_PER_POLICY {
        return Err(InvalidRoute::TooManyRegexes);
    }
    Ok(())
}

/// A route's authorizations: its own, then the server's.
fn route_authorizations(
    own: Vec<inbound_api::Authz>,
    server: &[Authorization],
) -> Result<Arc<[Authorization]>, InvalidServer> {
    let mut all = own
        .into_iter()
        .map(Authorization::from_wire)
        .collect::<Result<Vec<_>, _>>()?;
    all.extend(server.iter().cloned());
    Ok(all.into())
}

/// How an inbound route is made: the default one, or read from the wire.
pub trait InboundRoute: Sized {
    /// Its protobuf form.
    type Wire;
    /// The route of a server that names none: every request, the server's
    /// authorizations.
    fn default_route(authorizations: Arc<[Authorization]>) -> Self {
        Self::default_named(PolicyMeta::default_named("default"), authorizations)
    }
    /// Every request, under `meta`'s name.
    fn default_named(meta: Arc<PolicyMeta>, authorizations: Arc<[Authorization]>) -> Self;
    fn from_wire(route: Self::Wire, server: &[Authorization]) -> Result<Self, InvalidServer>;
}

/// HTTP and gRPC routes have one shape in different wire types: one body
/// for both, each with its own match reader.
macro_rules! inbound_routes {
    ($match:ty, $wire:ty, $read_match:path) => {
        impl InboundRoute for Route<$match, RoutePolicy> {
            type Wire = $wire;

            fn default_named(meta: Arc<PolicyMeta>, authorizations: Arc<[Authorization]>) -> Self {
                Self {
                    hosts: Vec::new(),
                    rules: vec![Rule {
                        matches: Vec::new(),
                        policy: RoutePolicy {
                            meta,
                            authorizations,
                        },
                    }],
                }
            }

            fn from_wire(route: $wire, server: &[Authorization]) -> Result<Self, InvalidServer> {
                let meta = meta_from_wire(route.metadata.ok_or(InvalidRoute::MissingMeta)?)?;
                let authorizations = route_authorizations(route.authorizations, server)?;
                let hosts = route
                    .hosts
                    .into_iter()
                    .map(wire::host_match)
                    .collect::<Result<_, _>>()?;
                let rules = route
                    .rules
                    .into_iter()
                    .map(|r| {
                        Ok(Rule {
                            matches: r
                                .matches
                                .into_iter()
                                .map($read_match)
                                .collect::<Result<_, _>>()?,
                            policy: RoutePolicy {
                                meta: meta.clone(),
                                authorizations: authorizations.clone(),
                            },
                        })
                    })
                    .collect::<Result<_, InvalidRoute>>()?;
                Ok(Self { hosts, rules })
            }
        }
    };
}

inbound_routes!(HttpMatch, inbound_api::HttpRoute, wire::http_match);
inbound_routes!(GrpcMatch, inbound_api::GrpcRoute, wire::grpc_match);

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::{grpc_route as grpc_api, http_route as api, meta};

    fn named(name: &str) -> Option<meta::Metadata> {
        Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Default(name.into())),
        })
    }

    fn prefix(p: &str) -> api::HttpRouteMatch {
        api::HttpRouteMatch {
            path: Some(api::PathMatch {
                kind: Some(api::path_match::Kind::Prefix(p.into())),
            }),
            ..Default::default()
        }
    }

    fn http_route(name: &str, hosts: &[&str], matches: Vec<api::HttpRouteMatch>) -> HttpRoute {
        let route = inbound_api::HttpRoute {
            metadata: named(name),
            hosts: hosts
                .iter()
                .map(|h| api::HostMatch {
                    r#match: Some(api::host_match::Match::Exact((*h).into())),
                })
                .collect(),
            rules: vec![inbound_api::http_route::Rule {
                matches,
                ..Default::default()
            }],
            ..Default::default()
        };
        HttpRoute::from_wire(route, &[]).expect("a readable route")
    }

    fn req(method: &str, uri: &str, host: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        b.body(()).expect("request")
    }

    fn found<M: Match>(routes: &[Route<M, RoutePolicy>], r: &Request<()>) -> Option<String> {
        find(routes, r).map(|p| p.meta.name.to_string())
    }

    #[test]
    fn routes_read_from_the_controller_take_requests_as_linkerd_ranks_them() {
        let routes = [
            http_route("root", &[], vec![prefix("/")]),
            http_route("api", &[], vec![prefix("/api")]),
            http_route("api-host", &["api.example.com"], vec![prefix("/")]),
            http_route(
                "debug",
                &[],
                vec![api::HttpRouteMatch {
                    query_params: vec![api::QueryParamMatch {
                        name: "debug".into(),
                        value: Some(api::query_param_match::Value::Exact("a b".into())),
                    }],
                    ..prefix("/api")
                }],
            ),
        ];
        let cases = [
            (req("GET", "/", None), Some("root")),
            (req("GET", "/apix", None), Some("root")),
            (req("GET", "/api/x", None), Some("api")),
            // A matching host outranks a longer path.
            (
                req("GET", "/api/x", Some("api.example.com")),
                Some("api-host"),
            ),
            // Query parameters compare decoded, as Linkerd's do.
            (req("GET", "/api?debug=a%20b", None), Some("debug")),
            (req("GET", "/api?debug=a+b", None), Some("debug")),
        ];
        for (r, want) in cases {
            assert_eq!(
                found(&routes, &r).as_deref(),
                want,
                "{} {:?}",
                r.uri(),
                r.headers()
            );
        }
        assert_eq!(found(&routes[1..2], &req("GET", "/other", None)), None);
    }

    #[test]
    fn a_route_authorizes_with_its_own_then_the_servers_and_errors_are_named() {
        let server = Authorization {
            networks: vec![],
            authentication: super::super::policy::Authentication::Unauthenticated,
            meta: PolicyMeta::default_named("server"),
        };
        let route = HttpRoute::from_wire(
            inbound_api::HttpRoute {
                metadata: named("r"),
                rules: vec![Default::default()],
                ..Default::default()
            },
            std::slice::from_ref(&server),
        )
        .expect("readable");
        assert_eq!(&*route.rules[0].policy.authorizations, &[server][..]);
        assert!(matches!(
            HttpRoute::from_wire(inbound_api::HttpRoute::default(), &[]),
            Err(InvalidServer::Route(InvalidRoute::MissingMeta))
        ));
        let bad_regex = inbound_api::HttpRoute {
            metadata: named("r"),
            rules: vec![inbound_api::http_route::Rule {
                matches: vec![api::HttpRouteMatch {
                    path: Some(api::PathMatch {
                        kind: Some(api::path_match::Kind::Regex("(".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            HttpRoute::from_wire(bad_regex, &[]),
            Err(InvalidServer::Route(InvalidRoute::Match(
                wire::InvalidMatch::Regex(_)
            )))
        ));
    }

    #[test]
    fn a_server_holds_at_most_the_policy_bound_of_regexes() {
        let regex_match = || api::HttpRouteMatch {
            headers: vec![api::HeaderMatch {
                name: "x-a".into(),
                value: Some(api::header_match::Value::Regex("a+".into())),
            }],
            ..Default::default()
        };
        let route = |n: usize| inbound_api::HttpRoute {
            metadata: named("r"),
            rules: vec![inbound_api::http_route::Rule {
                matches: (0..n).map(|_| regex_match()).collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(check_regexes(&[route(wire::MAX_REGEXES_PER_POLICY)], &[]).is_ok());
        assert!(matches!(
            check_regexes(&[route(wire::MAX_REGEXES_PER_POLICY), route(1)], &[]),
            Err(InvalidRoute::TooManyRegexes)
        ));
    }

    #[test]
    fn grpc_routes_match_posts_and_a_headers_only_match_takes_every_rpc() {
        let grpc = |name: &str, rpc: Option<(&str, &str)>, header: Option<&str>| {
            let route = inbound_api::GrpcRoute {
                metadata: named(name),
                rules: vec![inbound_api::grpc_route::Rule {
                    matches: vec![grpc_api::GrpcRouteMatch {
                        rpc: rpc.map(|(service, method)| grpc_api::GrpcRpcMatch {
                            service: service.into(),
                            method: method.into(),
                        }),
                        headers: header
                            .map(|h| api::HeaderMatch {
                                name: h.into(),
                                value: Some(api::header_match::Value::Exact(b"1".to_vec())),
                            })
                            .into_iter()
                            .collect(),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            };
            GrpcRoute::from_wire(route, &[]).expect("a readable route")
        };
        let routes = [
            grpc("cart", Some(("shop.Cart", "")), None),
            grpc("checkout", Some(("shop.Cart", "Checkout")), None),
            // What Linkerd's controller sends for a match naming headers only.
            grpc("canary", None, Some("x-canary")),
        ];
        let call = |m: &str, p: &str, canary: bool| {
            let mut b = Request::builder().method(m).uri(p);
            if canary {
                b = b.header("x-canary", "1");
            }
            found(&routes, &b.body(()).expect("request"))
        };
        assert_eq!(
            call("POST", "/shop.Cart/Checkout", false).as_deref(),
            Some("checkout")
        );
        assert_eq!(
            call("POST", "/shop.Cart/Add", false).as_deref(),
            Some("cart")
        );
        assert_eq!(
            call("POST", "/other.Svc/Add", true).as_deref(),
            Some("canary")
        );
        assert_eq!(call("POST", "/other.Svc/Add", false), None);
        assert_eq!(call("GET", "/shop.Cart/Add", false), None);
    }
}
