//! Policy answers to Linkerd's protobuf, filled the way Linkerd's policy
//! controller fills them (every field linkerd2-proxy requires is set).

use crate::{
    authority::service_fqdn,
    index::policy::{
        Authn, Authz, AuthzRef, InboundProtocol, InboundRoute, InboundView, OutboundView,
        ServerRef, ServiceOutbound,
    },
    resource::{
        BackendRef, HeaderMatch, HeaderModifier, HostMatch, Network, ObjectKey, PathMatch,
        PathModifier, Redirect, Route, RouteFilter, RouteMatch, RouteRetry, RouteRule,
        RouteTimeouts, ValueMatch,
    },
    server::{weighted_addr, MeshConfig},
};
use linkerd2_proxy_api::{
    destination::WeightedAddr, grpc_route, http_route as api, http_types, inbound, meta, net,
    outbound,
};
use std::{collections::HashMap, net::SocketAddr, time::Duration};

/// What shapes policy answers beyond the index: Linkerd's defaults.
#[derive(Clone, Debug)]
pub struct PolicyConfig {
    pub mesh: MeshConfig,
    /// How long a proxy waits for a client's first bytes to detect HTTP.
    pub detect_timeout: Duration,
    /// Each backend's request queue (Linkerd: 100).
    pub queue_capacity: u32,
    /// How long a backend with no ready endpoint holds requests before
    /// failing them (Linkerd: 3 s).
    pub failfast_timeout: Duration,
    /// Peak-EWMA's latency before the first response (Linkerd: 30 ms).
    pub ewma_default_rtt: Duration,
    /// Peak-EWMA's decay (Linkerd: 10 s).
    pub ewma_decay: Duration,
}

pub const DEFAULT_DETECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_QUEUE_CAPACITY: u32 = 100;
pub const DEFAULT_FAILFAST_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_EWMA_RTT: Duration = Duration::from_millis(30);
pub const DEFAULT_EWMA_DECAY: Duration = Duration::from_secs(10);
/// Request bodies a proxy may buffer to retry (Linkerd: 64 KiB).
pub const RETRY_MAX_REQUEST_BYTES: u32 = 64 * 1024;

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            mesh: MeshConfig::default(),
            detect_timeout: DEFAULT_DETECT_TIMEOUT,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            failfast_timeout: DEFAULT_FAILFAST_TIMEOUT,
            ewma_default_rtt: DEFAULT_EWMA_RTT,
            ewma_decay: DEFAULT_EWMA_DECAY,
        }
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    // Policy durations are bounded to a day by the index; this cannot fail.
    prost_types::Duration::try_from(d).unwrap_or_default()
}

fn default_meta(name: &str) -> meta::Metadata {
    meta::Metadata {
        kind: Some(meta::metadata::Kind::Default(name.to_string())),
    }
}

fn resource_meta(group: &str, kind: &str, key: &ObjectKey, port: Option<u16>) -> meta::Metadata {
    meta::Metadata {
        kind: Some(meta::metadata::Kind::Resource(meta::Resource {
            group: group.to_string(),
            kind: kind.to_string(),
            name: key.name.to_string(),
            namespace: key.namespace.to_string(),
            section: String::new(),
            port: port.map(u32::from).unwrap_or_default(),
        })),
    }
}

fn route_meta(route: &Route) -> meta::Metadata {
    resource_meta(route.api.group(), route.api.kind(), &route.key, None)
}

// === outbound ===

impl PolicyConfig {
    fn queue(&self) -> outbound::Queue {
        outbound::Queue {
            capacity: self.queue_capacity,
            failfast_timeout: Some(duration(self.failfast_timeout)),
        }
    }

    fn balancer(&self, service: &ObjectKey, port: u16) -> outbound::Backend {
        use outbound::backend::{self, balance_p2c, endpoint_discovery};
        outbound::Backend {
            metadata: Some(resource_meta("core", "Service", service, Some(port))),
            queue: Some(self.queue()),
            kind: Some(backend::Kind::Balancer(backend::BalanceP2c {
                discovery: Some(backend::EndpointDiscovery {
                    kind: Some(endpoint_discovery::Kind::Dst(
                        endpoint_discovery::DestinationGet {
                            path: format!(
                                "{}:{port}",
                                service_fqdn(service, &self.mesh.cluster_domain)
                            ),
                        },
                    )),
                }),
                load: Some(balance_p2c::Load::PeakEwma(balance_p2c::PeakEwma {
                    default_rtt: Some(duration(self.ewma_default_rtt)),
                    decay: Some(duration(self.ewma_decay)),
                })),
            })),
        }
    }

    fn forward(&self, addr: WeightedAddr) -> outbound::Backend {
        outbound::Backend {
            metadata: Some(default_meta("forward")),
            queue: Some(self.queue()),
            kind: Some(outbound::backend::Kind::Forward(addr)),
        }
    }
}

/// The answer for a target: `None` for a Service the index does not know.
pub fn outbound_policy(
    view: &OutboundView,
    config: &PolicyConfig,
) -> Option<outbound::OutboundPolicy> {
    match view {
        OutboundView::Service(svc) => Some(service_policy(svc, config)),
        OutboundView::Forward {
            addr,
            endpoint,
            opaque,
        } => Some(forward_policy(*addr, endpoint.as_ref(), *opaque, config)),
        OutboundView::UnknownService => None,
    }
}

fn opaque_route(backend: outbound::Backend, name: &str) -> outbound::OpaqueRoute {
    use outbound::opaque_route::{distribution, Distribution, RouteBackend, Rule};
    outbound::OpaqueRoute {
        metadata: Some(default_meta(name)),
        rules: vec![Rule {
            backends: Some(Distribution {
                kind: Some(distribution::Kind::FirstAvailable(
                    distribution::FirstAvailable {
                        backends: vec![RouteBackend {
                            backend: Some(backend),
                            filters: vec![],
                        }],
                    },
                )),
            }),
            filters: vec![],
        }],
    }
}

fn default_http_route(backend: outbound::Backend, name: &str) -> outbound::HttpRoute {
    use outbound::http_route::{distribution, Distribution, RouteBackend, Rule};
    #[allow(deprecated)]
    outbound::HttpRoute {
        metadata: Some(default_meta(name)),
        hosts: vec![],
        rules: vec![Rule {
            matches: vec![api::HttpRouteMatch {
                path: Some(api::PathMatch {
                    kind: Some(api::path_match::Kind::Prefix("/".into())),
                }),
                ..Default::default()
            }],
            filters: vec![],
            backends: Some(Distribution {
                kind: Some(distribution::Kind::FirstAvailable(
                    distribution::FirstAvailable {
                        backends: vec![RouteBackend {
                            backend: Some(backend),
                            filters: vec![],
                            request_timeout: None,
                        }],
                    },
                )),
            }),
            request_timeout: None,
            timeouts: Some(api::Timeouts::default()),
            retry: None,
            allow_l5d_request_headers: false,
        }],
    }
}

fn detect(
    config: &PolicyConfig,
    opaque: outbound::OpaqueRoute,
    routes: Vec<outbound::HttpRoute>,
    failure_accrual: Option<outbound::FailureAccrual>,
) -> outbound::proxy_protocol::Kind {
    use outbound::proxy_protocol::{Detect, Http1, Http2, Kind, Opaque};
    Kind::Detect(Detect {
        timeout: Some(duration(config.detect_timeout)),
        opaque: Some(Opaque {
            routes: vec![opaque],
        }),
        http1: Some(Http1 {
            routes: routes.clone(),
            failure_accrual,
        }),
        http2: Some(Http2 {
            routes,
            failure_accrual,
        }),
    })
}

/// A Service's failure accrual as Linkerd's controller sends it (with
/// each protocol's routes); unreadable annotations turn it off, as in
/// Linkerd, with a warning (once per answer: answers are shared by every
/// watch of the target and made again only when it changes).
fn failure_accrual(svc: &ServiceOutbound) -> Option<outbound::FailureAccrual> {
    use outbound::failure_accrual::{ConsecutiveFailures, Kind};
    let accrual = match &svc.failure_accrual {
        Ok(a) => (*a)?,
        Err(error) => {
            tracing::warn!(service = %svc.service, %error, "failure accrual is off: its annotations cannot be read");
            return None;
        }
    };
    Some(outbound::FailureAccrual {
        ejection: None,
        kind: Some(Kind::ConsecutiveFailures(ConsecutiveFailures {
            max_failures: accrual.max_failures,
            backoff: Some(outbound::ExponentialBackoff {
                min_backoff: Some(duration(accrual.min_penalty)),
                max_backoff: Some(duration(accrual.max_penalty)),
                jitter_ratio: accrual.jitter_ratio,
                respect_retry_after_hint: false,
            }),
        })),
    })
}

fn service_policy(svc: &ServiceOutbound, config: &PolicyConfig) -> outbound::OutboundPolicy {
    use outbound::proxy_protocol::{Grpc, Kind, Opaque};
    let default_backend = config.balancer(&svc.service, svc.port);
    let opaque = opaque_route(default_backend.clone(), "opaq");
    let kind = if svc.opaque {
        Kind::Opaque(Opaque {
            routes: vec![opaque],
        })
    } else if !svc.grpc_routes.is_empty() {
        Kind::Grpc(Grpc {
            routes: svc
                .grpc_routes
                .iter()
                .map(|r| grpc_route(r, svc, config))
                .collect(),
            failure_accrual: failure_accrual(svc),
        })
    } else {
        let routes = if svc.http_routes.is_empty() {
            vec![default_http_route(default_backend, "http")]
        } else {
            svc.http_routes
                .iter()
                .map(|r| http_route(r, svc, config))
                .collect()
        };
        detect(config, opaque, routes, failure_accrual(svc))
    };
    outbound::OutboundPolicy {
        metadata: Some(resource_meta(
            "core",
            "Service",
            &svc.service,
            Some(svc.port),
        )),
        protocol: Some(outbound::ProxyProtocol { kind: Some(kind) }),
    }
}

fn forward_policy(
    addr: SocketAddr,
    endpoint: Option<&crate::index::Endpoint>,
    opaque: bool,
    config: &PolicyConfig,
) -> outbound::OutboundPolicy {
    let weighted = match endpoint {
        Some(e) => weighted_addr(e, &config.mesh),
        None => WeightedAddr {
            addr: Some(net::TcpAddress::from(addr)),
            weight: crate::server::DEFAULT_WEIGHT,
            ..Default::default()
        },
    };
    let backend = config.forward(weighted);
    let opaque_route = opaque_route(backend.clone(), "forward");
    let kind = if opaque {
        outbound::proxy_protocol::Kind::Opaque(outbound::proxy_protocol::Opaque {
            routes: vec![opaque_route],
        })
    } else {
        detect(
            config,
            opaque_route,
            vec![default_http_route(backend, "forward")],
            None,
        )
    };
    outbound::OutboundPolicy {
        metadata: Some(default_meta("forward")),
        protocol: Some(outbound::ProxyProtocol { kind: Some(kind) }),
    }
}

fn hosts(route: &Route) -> Vec<api::HostMatch> {
    route
        .hostnames
        .iter()
        .map(|h| api::HostMatch {
            r#match: Some(match h {
                HostMatch::Exact(h) => api::host_match::Match::Exact(h.clone()),
                HostMatch::Suffix(s) => api::host_match::Match::Suffix(api::host_match::Suffix {
                    reverse_labels: s.split('.').rev().map(str::to_string).collect(),
                }),
            }),
        })
        .collect()
}

fn header_match(h: &HeaderMatch) -> api::HeaderMatch {
    api::HeaderMatch {
        name: h.name.clone(),
        value: Some(match &h.value {
            ValueMatch::Exact(v) => api::header_match::Value::Exact(v.clone().into_bytes()),
            ValueMatch::Regex(r) => api::header_match::Value::Regex(r.clone()),
        }),
    }
}

fn http_match(m: &RouteMatch) -> Option<api::HttpRouteMatch> {
    let RouteMatch::Http(m) = m else { return None };
    Some(api::HttpRouteMatch {
        path: m.path.as_ref().map(|p| api::PathMatch {
            kind: Some(match p {
                PathMatch::Exact(v) => api::path_match::Kind::Exact(v.clone()),
                PathMatch::Prefix(v) => api::path_match::Kind::Prefix(v.clone()),
                PathMatch::Regex(v) => api::path_match::Kind::Regex(v.clone()),
            }),
        }),
        headers: m.headers.iter().map(header_match).collect(),
        query_params: m
            .query_params
            .iter()
            .map(|q| api::QueryParamMatch {
                name: q.name.clone(),
                value: Some(match &q.value {
                    ValueMatch::Exact(v) => api::query_param_match::Value::Exact(v.clone()),
                    ValueMatch::Regex(r) => api::query_param_match::Value::Regex(r.clone()),
                }),
            })
            .collect(),
        method: m
            .method
            .as_deref()
            .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok())
            .map(http_types::HttpMethod::from),
    })
}

fn grpc_match(m: &RouteMatch) -> Option<grpc_route::GrpcRouteMatch> {
    let RouteMatch::Grpc(m) = m else { return None };
    Some(grpc_route::GrpcRouteMatch {
        rpc: (m.service.is_some() || m.method.is_some()).then(|| grpc_route::GrpcRpcMatch {
            service: m.service.clone().unwrap_or_default(),
            method: m.method.clone().unwrap_or_default(),
        }),
        headers: m.headers.iter().map(header_match).collect(),
    })
}

fn headers(pairs: &[(String, String)]) -> Option<http_types::Headers> {
    Some(http_types::Headers {
        headers: pairs
            .iter()
            .map(|(n, v)| http_types::headers::Header {
                name: n.clone(),
                value: v.clone().into_bytes(),
            })
            .collect(),
    })
}

fn request_headers(m: &HeaderModifier) -> api::RequestHeaderModifier {
    api::RequestHeaderModifier {
        add: headers(&m.add),
        set: headers(&m.set),
        remove: m.remove.clone(),
    }
}

fn redirect(r: &Redirect) -> api::RequestRedirect {
    api::RequestRedirect {
        scheme: r.scheme.as_deref().map(|s| http_types::Scheme {
            r#type: Some(http_types::scheme::Type::Registered(if s == "https" {
                http_types::scheme::Registered::Https.into()
            } else {
                http_types::scheme::Registered::Http.into()
            })),
        }),
        host: r.hostname.clone().unwrap_or_default(),
        path: r.path.as_ref().map(|p| api::PathModifier {
            replace: Some(match p {
                PathModifier::Full(v) => api::path_modifier::Replace::Full(v.clone()),
                PathModifier::Prefix(v) => api::path_modifier::Replace::Prefix(v.clone()),
            }),
        }),
        port: r.port.map(u32::from).unwrap_or_default(),
        status: u32::from(r.status),
    }
}

fn http_filter(f: &RouteFilter) -> outbound::http_route::Filter {
    use outbound::http_route::filter::Kind;
    outbound::http_route::Filter {
        kind: Some(match f {
            RouteFilter::RequestHeaders(m) => Kind::RequestHeaderModifier(request_headers(m)),
            RouteFilter::ResponseHeaders(m) => {
                Kind::ResponseHeaderModifier(api::ResponseHeaderModifier {
                    add: headers(&m.add),
                    set: headers(&m.set),
                    remove: m.remove.clone(),
                })
            }
            RouteFilter::Redirect(r) => Kind::Redirect(redirect(r)),
        }),
    }
}

fn timeouts(t: &RouteTimeouts) -> api::Timeouts {
    api::Timeouts {
        response: t.response.map(duration),
        request: t.request.map(duration),
        idle: t.idle.map(duration),
    }
}

fn backoff() -> outbound::ExponentialBackoff {
    // Linkerd's retry backoff.
    outbound::ExponentialBackoff {
        min_backoff: Some(duration(Duration::from_millis(25))),
        max_backoff: Some(duration(Duration::from_millis(250))),
        jitter_ratio: 1.0,
        respect_retry_after_hint: false,
    }
}

fn http_retry(r: &RouteRetry) -> outbound::http_route::Retry {
    use outbound::http_route::retry::{conditions::StatusRange, Conditions};
    outbound::http_route::Retry {
        max_retries: r.limit,
        max_request_bytes: RETRY_MAX_REQUEST_BYTES,
        conditions: Some(Conditions {
            status_ranges: r
                .http_statuses
                .iter()
                .map(|(start, end)| StatusRange {
                    start: u32::from(*start),
                    end: u32::from(*end),
                })
                .collect(),
        }),
        timeout: r.timeout.map(duration),
        backoff: Some(backoff()),
    }
}

fn grpc_retry(r: &RouteRetry) -> outbound::grpc_route::Retry {
    use crate::resource::GrpcRetryCode as C;
    let has = |c| r.grpc_codes.contains(&c);
    outbound::grpc_route::Retry {
        max_retries: r.limit,
        max_request_bytes: RETRY_MAX_REQUEST_BYTES,
        conditions: Some(outbound::grpc_route::retry::Conditions {
            cancelled: has(C::Cancelled),
            deadine_exceeded: has(C::DeadlineExceeded),
            resource_exhausted: has(C::ResourceExhausted),
            internal: has(C::Internal),
            unavailable: has(C::Unavailable),
        }),
        timeout: r.timeout.map(duration),
        backoff: Some(backoff()),
    }
}

/// A rule's backends: the parent itself when it names none.
fn backends(
    rule: &RouteRule,
    svc: &ServiceOutbound,
    config: &PolicyConfig,
) -> Vec<(outbound::Backend, u32)> {
    if rule.backends.is_empty() {
        return vec![(config.balancer(&svc.service, svc.port), 1)];
    }
    rule.backends
        .iter()
        .map(
            |BackendRef {
                 service,
                 port,
                 weight,
             }| { (config.balancer(service, port.unwrap_or(svc.port)), *weight) },
        )
        .collect()
}

/// HTTP and gRPC routes have one shape in different wire modules: one body
/// for both, each with its own match, filter and retry writers.
macro_rules! route_to_wire {
    ($name:ident, $module:ident, $wire:ident, $write_match:path, $write_filters:path, $write_retry:path) => {
        fn $name(route: &Route, svc: &ServiceOutbound, config: &PolicyConfig) -> outbound::$wire {
            use outbound::$module::{
                distribution, Distribution, RouteBackend, Rule, WeightedRouteBackend,
            };
            let rules = route
                .rules
                .iter()
                .map(|rule| {
                    let backends = backends(rule, svc, config)
                        .into_iter()
                        .map(|(backend, weight)| WeightedRouteBackend {
                            backend: Some(RouteBackend {
                                backend: Some(backend),
                                filters: vec![],
                                #[allow(deprecated)]
                                request_timeout: None,
                            }),
                            weight,
                        })
                        .collect();
                    #[allow(deprecated)]
                    Rule {
                        matches: rule.matches.iter().filter_map($write_match).collect(),
                        filters: $write_filters(&rule.filters),
                        backends: Some(Distribution {
                            kind: Some(distribution::Kind::RandomAvailable(
                                distribution::RandomAvailable { backends },
                            )),
                        }),
                        request_timeout: rule.timeouts.request.map(duration),
                        timeouts: Some(timeouts(&rule.timeouts)),
                        retry: rule.retry.as_ref().map($write_retry),
                        allow_l5d_request_headers: false,
                    }
                })
                .collect();
            outbound::$wire {
                metadata: Some(route_meta(route)),
                hosts: hosts(route),
                rules,
            }
        }
    };
}

route_to_wire!(
    http_route,
    http_route,
    HttpRoute,
    http_match,
    http_filters,
    http_retry
);
route_to_wire!(
    grpc_route,
    grpc_route,
    GrpcRoute,
    grpc_match,
    grpc_filters,
    grpc_retry
);

fn http_filters(filters: &[RouteFilter]) -> Vec<outbound::http_route::Filter> {
    filters.iter().map(http_filter).collect()
}

fn grpc_filters(filters: &[RouteFilter]) -> Vec<outbound::grpc_route::Filter> {
    filters
        .iter()
        .filter_map(|f| match f {
            RouteFilter::RequestHeaders(m) => Some(outbound::grpc_route::Filter {
                kind: Some(outbound::grpc_route::filter::Kind::RequestHeaderModifier(
                    request_headers(m),
                )),
            }),
            // The index admits no other filter on a gRPC route.
            _ => None,
        })
        .collect()
}

// === inbound ===

fn ip_network(n: &crate::resource::IpNet) -> net::IpNetwork {
    net::IpNetwork {
        ip: Some(net::IpAddress::from(n.addr)),
        prefix_len: u32::from(n.prefix_len),
    }
}

fn labels(group: &str, kind: &str, name: &str) -> HashMap<String, String> {
    [("group", group), ("kind", kind), ("name", name)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn authz(a: &Authz) -> inbound::Authz {
    use inbound::authn::{permit_mesh_tls, Permit, PermitMeshTls, PermitUnauthenticated};
    let (metadata, labels) = match &a.meta {
        AuthzRef::Default(name) => (default_meta(name), labels("", "default", name)),
        AuthzRef::Policy(key) => (
            resource_meta("policy.linkerd.io", "authorizationpolicy", key, None),
            labels("policy.linkerd.io", "authorizationpolicy", &key.name),
        ),
    };
    inbound::Authz {
        networks: a
            .networks
            .iter()
            .map(|Network { net, except }| inbound::Network {
                net: Some(ip_network(net)),
                except: except.iter().map(ip_network).collect(),
            })
            .collect(),
        authentication: Some(inbound::Authn {
            permit: Some(match &a.authn {
                Authn::Unauthenticated => Permit::Unauthenticated(PermitUnauthenticated {}),
                Authn::MeshTls {
                    identities,
                    suffixes,
                } => Permit::MeshTls(PermitMeshTls {
                    clients: Some(permit_mesh_tls::Clients::Identities(
                        permit_mesh_tls::PermitClientIdentities {
                            identities: identities
                                .iter()
                                .map(|name| inbound::Identity { name: name.clone() })
                                .collect(),
                            suffixes: suffixes
                                .iter()
                                .map(|s| inbound::IdentitySuffix {
                                    parts: s
                                        .split('.')
                                        .filter(|p| !p.is_empty())
                                        .map(str::to_string)
                                        .collect(),
                                })
                                .collect(),
                        },
                    )),
                }),
            }),
        }),
        labels,
        metadata: Some(metadata),
    }
}

fn inbound_http_route(r: &InboundRoute) -> inbound::HttpRoute {
    use inbound::http_route::{filter::Kind, Filter, Rule};
    inbound::HttpRoute {
        metadata: Some(route_meta(&r.route)),
        hosts: hosts(&r.route),
        authorizations: r.authorizations.iter().map(authz).collect(),
        rules: r
            .route
            .rules
            .iter()
            .map(|rule| Rule {
                matches: rule.matches.iter().filter_map(http_match).collect(),
                filters: rule
                    .filters
                    .iter()
                    .filter_map(|f| match f {
                        RouteFilter::RequestHeaders(m) => Some(Filter {
                            kind: Some(Kind::RequestHeaderModifier(request_headers(m))),
                        }),
                        RouteFilter::Redirect(r) => Some(Filter {
                            kind: Some(Kind::Redirect(redirect(r))),
                        }),
                        // Inbound routes carry no response filter in the API.
                        RouteFilter::ResponseHeaders(_) => None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn inbound_grpc_route(r: &InboundRoute) -> inbound::GrpcRoute {
    use inbound::grpc_route::{filter::Kind, Filter, Rule};
    inbound::GrpcRoute {
        metadata: Some(route_meta(&r.route)),
        hosts: hosts(&r.route),
        authorizations: r.authorizations.iter().map(authz).collect(),
        rules: r
            .route
            .rules
            .iter()
            .map(|rule| Rule {
                matches: rule.matches.iter().filter_map(grpc_match).collect(),
                filters: rule
                    .filters
                    .iter()
                    .filter_map(|f| match f {
                        RouteFilter::RequestHeaders(m) => Some(Filter {
                            kind: Some(Kind::RequestHeaderModifier(request_headers(m))),
                        }),
                        _ => None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Linkerd's default inbound route: every request, under the server's
/// authorizations (the proxy adds them to every route's own).
fn default_inbound_http_routes() -> Vec<inbound::HttpRoute> {
    vec![inbound::HttpRoute {
        metadata: Some(default_meta("default")),
        hosts: vec![],
        authorizations: vec![],
        rules: vec![inbound::http_route::Rule {
            matches: vec![api::HttpRouteMatch {
                path: Some(api::PathMatch {
                    kind: Some(api::path_match::Kind::Prefix("/".into())),
                }),
                ..Default::default()
            }],
            filters: vec![],
        }],
    }]
}

pub fn inbound_server(view: &InboundView, config: &PolicyConfig) -> inbound::Server {
    use inbound::proxy_protocol::{Detect, Grpc, Http1, Http2, Kind, Opaque, Tls};
    let http: Vec<_> = view
        .routes
        .iter()
        .filter(|r| !r.route.api.is_grpc())
        .map(inbound_http_route)
        .collect();
    let http = if http.is_empty() {
        default_inbound_http_routes()
    } else {
        http
    };
    let kind = match view.protocol {
        InboundProtocol::Detect => Kind::Detect(Detect {
            timeout: Some(duration(config.detect_timeout)),
            http_routes: http,
            http_local_rate_limit: None,
        }),
        InboundProtocol::Http1 => Kind::Http1(Http1 {
            routes: http,
            local_rate_limit: None,
        }),
        InboundProtocol::Http2 => Kind::Http2(Http2 {
            routes: http,
            local_rate_limit: None,
        }),
        InboundProtocol::Grpc => {
            let grpc: Vec<_> = view
                .routes
                .iter()
                .filter(|r| r.route.api.is_grpc())
                .map(inbound_grpc_route)
                .collect();
            let grpc = if grpc.is_empty() {
                vec![inbound::GrpcRoute {
                    metadata: Some(default_meta("default")),
                    hosts: vec![],
                    authorizations: vec![],
                    rules: vec![inbound::grpc_route::Rule {
                        matches: vec![grpc_route::GrpcRouteMatch::default()],
                        filters: vec![],
                    }],
                }]
            } else {
                grpc
            };
            Kind::Grpc(Grpc { routes: grpc })
        }
        InboundProtocol::Opaque => Kind::Opaque(Opaque {}),
        InboundProtocol::Tls => Kind::Tls(Tls {}),
    };
    let labels = match &view.server {
        ServerRef::Default(p) => labels("", "default", p.as_str()),
        ServerRef::Server(key) => labels("policy.linkerd.io", "server", &key.name),
    };
    inbound::Server {
        protocol: Some(inbound::ProxyProtocol { kind: Some(kind) }),
        server_ips: vec![],
        authorizations: view.authorizations.iter().map(authz).collect(),
        labels,
    }
}
