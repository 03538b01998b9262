//! An outbound policy as the proxy acts on it, made from the controller's
//! `OutboundPolicy`: the parent (a Service port, or an address), whether
//! to detect the protocol, and the HTTP or gRPC routes for each protocol,
//! each rule with its filters, backends, timeouts and retries.
//!
//! Everything is checked once, when the message arrives (regexes compiled,
//! header names and values parsed, durations bounded); a message that
//! cannot be acted on is refused whole, naming what was wrong, and the last
//! policy stays.

use super::bound::{BackendSlot, RouteSlot};
use crate::{
    balance::FailureAccrual,
    discovery::Endpoint,
    metrics::route::ResourceMeta,
    route::{
        wire::{self, InvalidMatch, MAX_REGEXES_PER_POLICY},
        GrpcMatch, HttpMatch, Route, Rule,
    },
};
use ballast_backoff::BackoffConfig;
use http::{HeaderName, HeaderValue, StatusCode};
use linkerd2_proxy_api::{
    destination::WeightedAddr,
    http_route as api, meta,
    outbound::{self as out, proxy_protocol},
};
use std::{sync::Arc, time::Duration};

/// Longest duration taken from the controller: bounds every deadline the
/// proxy computes from a policy (`Instant + Duration` never overflows).
pub const MAX_POLICY_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Shortest failure-accrual penalty, whatever a policy says.
const MIN_PENALTY: Duration = Duration::from_millis(10);
/// Most retries a policy may ask for per request.
pub const MAX_RETRIES: u32 = 10;
/// Most request bytes kept for retries, whatever a policy asks.
pub const MAX_RETRY_BODY_BYTES: u32 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum InvalidPolicy {
    #[error("the policy names no protocol")]
    NoProtocol,
    #[error(transparent)]
    Match(#[from] InvalidMatch),
    #[error("more than {MAX_REGEXES_PER_POLICY} regexes")]
    TooManyRegexes,
    #[error("invalid header name or value in {0}")]
    Header(&'static str),
    #[error("invalid duration in {0}")]
    Duration(&'static str),
    #[error("invalid redirect: {0}")]
    Redirect(&'static str),
    #[error("invalid status in {0}")]
    Status(&'static str),
    #[error("a backend lacks its {0}")]
    Backend(&'static str),
}

/// What the controller decided for one target.
#[derive(Debug)]
pub struct ClientPolicy {
    pub parent: Arc<ResourceMeta>,
    /// Forward as TCP without detecting the protocol.
    pub opaque: bool,
    /// Routes of HTTP/1 requests and of HTTP/2 requests.
    pub http1: HttpRoutes,
    pub http2: HttpRoutes,
    /// The backends of opaque connections (the first rule of the first
    /// route), and of connections that turned out not to be HTTP.
    pub opaque_backends: Distribution,
    /// Failure accrual for the balancers of this parent's backends.
    pub failure_accrual: Option<Arc<FailureAccrual>>,
}

/// A protocol's routes: HTTP routes, or gRPC routes (when GRPCRoutes
/// attach to the parent).
#[derive(Debug)]
pub enum HttpRoutes {
    Http(Routes<HttpMatch>),
    Grpc(Routes<GrpcMatch>),
}

/// Routes, their metadata and their metric series, side by side.
#[derive(Debug)]
pub struct Routes<M> {
    pub metas: Vec<Arc<ResourceMeta>>,
    pub routes: Vec<Route<M, RulePolicy>>,
    pub slots: Vec<RouteSlot>,
}

impl<M> Default for Routes<M> {
    fn default() -> Self {
        Self {
            metas: Vec::new(),
            routes: Vec::new(),
            slots: Vec::new(),
        }
    }
}

/// What a rule does with the requests it takes.
#[derive(Debug)]
pub struct RulePolicy {
    pub filters: Vec<Filter>,
    pub backends: Distribution,
    pub timeouts: Timeouts,
    pub retry: Option<RetryPolicy>,
    /// Requests may change retries and timeouts by `l5d-*` headers.
    pub allow_l5d_request_headers: bool,
}

/// Gateway API timeouts (`http_route.Timeouts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, all tries and backoffs included, to the end of
    /// the response body.
    pub request: Option<Duration>,
    /// Each try, until response headers.
    pub response: Option<Duration>,
    /// Each wait for the response body's next frame.
    pub idle: Option<Duration>,
}

/// When and how often a request is tried again.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub max_request_bytes: usize,
    /// HTTP statuses (inclusive ranges) that are retried.
    pub statuses: Vec<(u16, u16)>,
    /// gRPC status codes that are retried.
    pub grpc_codes: Vec<u32>,
    /// Each try's limit (until response headers), overriding the rule's
    /// response timeout.
    pub timeout: Option<Duration>,
    pub backoff: Option<RetryBackoff>,
}

/// Exponential backoff between tries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBackoff {
    pub min: Duration,
    pub max: Duration,
    /// Fraction of each delay that is random, 0..=1.
    pub jitter: f64,
}

/// A filter on requests of a rule (or of one backend).
#[derive(Debug)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
    HttpFailure {
        status: StatusCode,
        message: Arc<str>,
        ratio: Ratio,
    },
    GrpcFailure {
        code: u32,
        message: Arc<str>,
        ratio: Ratio,
    },
}

/// Headers to add (append), set (replace) and remove.
#[derive(Debug, Default)]
pub struct HeaderModifier {
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

/// A redirect: each part replaces the request's own when given.
#[derive(Debug)]
pub struct Redirect {
    pub scheme: Option<http::uri::Scheme>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<PathModifier>,
    pub status: StatusCode,
}

#[derive(Debug)]
pub enum PathModifier {
    Full(String),
    /// Replaces the path prefix the rule matched.
    Prefix(String),
}

/// `numerator` of every `denominator` requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ratio {
    pub numerator: u32,
    pub denominator: u32,
}

/// How a rule chooses among its backends.
#[derive(Debug, Default)]
pub enum Distribution {
    /// No backend: requests fail.
    #[default]
    Empty,
    /// The first backend.
    FirstAvailable(Vec<RouteBackend>),
    /// A backend drawn at random in proportion to its weight.
    RandomAvailable(Vec<(RouteBackend, u32)>),
}

#[derive(Debug)]
pub struct RouteBackend {
    pub backend: Arc<Backend>,
    pub filters: Vec<Filter>,
    /// Its series and balancer, once a request was sent to it.
    pub bound: BackendSlot,
}

/// Where a backend's requests go.
#[derive(Debug)]
pub struct Backend {
    pub meta: Arc<ResourceMeta>,
    pub target: BackendTarget,
}

#[derive(Debug)]
pub enum BackendTarget {
    /// A balancer over the endpoints `Get` resolves for this path
    /// (`name.ns.svc.cluster.local:port`).
    Balancer(Arc<str>),
    /// One address.
    Forward(Endpoint),
}

impl Distribution {
    /// Its backends, whatever their weights.
    pub fn backends(&self) -> impl Iterator<Item = &RouteBackend> {
        let (first, random): (&[RouteBackend], &[(RouteBackend, u32)]) = match self {
            Distribution::Empty => (&[], &[]),
            Distribution::FirstAvailable(b) => (b, &[]),
            Distribution::RandomAvailable(b) => (&[], b),
        };
        first.iter().chain(random.iter().map(|(b, _)| b))
    }
}

impl HttpRoutes {
    /// The distributions of every rule of every route.
    fn distributions(&self) -> Vec<&Distribution> {
        match self {
            HttpRoutes::Http(r) => r
                .routes
                .iter()
                .flat_map(|route| route.rules.iter().map(|rule| &rule.policy.backends))
                .collect(),
            HttpRoutes::Grpc(r) => r
                .routes
                .iter()
                .flat_map(|route| route.rules.iter().map(|rule| &rule.policy.backends))
                .collect(),
        }
    }
}

impl ClientPolicy {
    /// The Destination paths of every backend any request or connection
    /// of this policy may be sent to, each once: resolved as soon as the
    /// policy is seen, so that a backend first drawn while the controller
    /// is away still has last-known endpoints.
    pub fn balancer_paths(&self) -> Vec<Arc<str>> {
        let mut paths: Vec<Arc<str>> = Vec::new();
        let distributions = self
            .http1
            .distributions()
            .into_iter()
            .chain(self.http2.distributions())
            .chain(std::iter::once(&self.opaque_backends));
        for d in distributions {
            for b in d.backends() {
                if let BackendTarget::Balancer(path) = &b.backend.target {
                    if !paths.contains(path) {
                        paths.push(path.clone());
                    }
                }
            }
        }
        paths
    }

    /// The routes of requests of `version`.
    pub fn routes(&self, version: http::Version) -> &HttpRoutes {
        if version == http::Version::HTTP_2 {
            &self.http2
        } else {
            &self.http1
        }
    }

    /// The service authority the parent names (`name.ns.svc.DOMAIN:port`),
    /// when the parent is a Service port.
    pub fn service_authority(&self, cluster_domain: &str) -> Option<Arc<str>> {
        let p = &self.parent;
        let port = p.port?;
        (&*p.kind == "Service" && !p.name.is_empty() && !p.namespace.is_empty()).then(|| {
            Arc::from(format!(
                "{}.{}.svc.{}:{port}",
                p.name,
                p.namespace,
                cluster_domain.trim_end_matches('.')
            ))
        })
    }
}

/// Reads the controller's answer.
pub fn from_wire(policy: out::OutboundPolicy) -> Result<ClientPolicy, InvalidPolicy> {
    if regexes_in(&policy) > MAX_REGEXES_PER_POLICY {
        return Err(InvalidPolicy::TooManyRegexes);
    }
    let parent = meta_of(policy.metadata, "parent");
    let kind = policy
        .protocol
        .and_then(|p| p.kind)
        .ok_or(InvalidPolicy::NoProtocol)?;
    let empty = || HttpRoutes::Http(Routes::default());
    Ok(match kind {
        proxy_protocol::Kind::Detect(d) => ClientPolicy {
            parent,
            opaque: false,
            failure_accrual: failure_accrual(
                d.http1
                    .as_ref()
                    .and_then(|h| h.failure_accrual)
                    .or_else(|| d.http2.as_ref().and_then(|h| h.failure_accrual)),
            )?,
            http1: HttpRoutes::Http(http_routes(d.http1.map(|h| h.routes))?),
            http2: HttpRoutes::Http(http_routes(d.http2.map(|h| h.routes))?),
            opaque_backends: opaque_backends(d.opaque.map(|o| o.routes))?,
        },
        proxy_protocol::Kind::Http1(h) => {
            let routes = || http_routes(Some(h.routes.clone()));
            ClientPolicy {
                parent,
                opaque: false,
                http1: HttpRoutes::Http(routes()?),
                http2: HttpRoutes::Http(routes()?),
                opaque_backends: Distribution::Empty,
                failure_accrual: failure_accrual(h.failure_accrual)?,
            }
        }
        proxy_protocol::Kind::Http2(h) => {
            let routes = || http_routes(Some(h.routes.clone()));
            ClientPolicy {
                parent,
                opaque: false,
                http1: HttpRoutes::Http(routes()?),
                http2: HttpRoutes::Http(routes()?),
                opaque_backends: Distribution::Empty,
                failure_accrual: failure_accrual(h.failure_accrual)?,
            }
        }
        proxy_protocol::Kind::Grpc(g) => ClientPolicy {
            parent,
            opaque: false,
            http1: empty(),
            failure_accrual: failure_accrual(g.failure_accrual)?,
            http2: HttpRoutes::Grpc(grpc_routes(g.routes)?),
            opaque_backends: Distribution::Empty,
        },
        proxy_protocol::Kind::Opaque(o) => ClientPolicy {
            parent,
            opaque: true,
            http1: empty(),
            http2: empty(),
            opaque_backends: opaque_backends(Some(o.routes))?,
            failure_accrual: None,
        },
        proxy_protocol::Kind::Tls(t) => {
            // Routes by SNI are not taken: the connection goes to the first
            // route's backends as opaque TCP.
            let routes = t
                .routes
                .into_iter()
                .map(|r| out::OpaqueRoute {
                    metadata: r.metadata,
                    rules: r
                        .rules
                        .into_iter()
                        .map(|rule| out::opaque_route::Rule {
                            backends: rule.backends.map(|b| out::opaque_route::Distribution {
                                kind: b.kind.map(tls_to_opaque_distribution),
                            }),
                            filters: vec![],
                        })
                        .collect(),
                })
                .collect();
            ClientPolicy {
                parent,
                opaque: true,
                http1: empty(),
                http2: empty(),
                opaque_backends: opaque_backends(Some(routes))?,
                failure_accrual: None,
            }
        }
    })
}

/// How many regexes a policy asks the proxy to compile (counted before
/// any is).
fn regexes_in(policy: &out::OutboundPolicy) -> usize {
    fn http(routes: &[out::HttpRoute]) -> usize {
        routes
            .iter()
            .flat_map(|r| &r.rules)
            .flat_map(|r| &r.matches)
            .map(wire::regexes_in_http)
            .sum()
    }
    let Some(kind) = policy.protocol.as_ref().and_then(|p| p.kind.as_ref()) else {
        return 0;
    };
    match kind {
        proxy_protocol::Kind::Detect(d) => {
            d.http1.as_ref().map_or(0, |h| http(&h.routes))
                + d.http2.as_ref().map_or(0, |h| http(&h.routes))
        }
        proxy_protocol::Kind::Http1(h) => http(&h.routes),
        proxy_protocol::Kind::Http2(h) => http(&h.routes),
        proxy_protocol::Kind::Grpc(g) => g
            .routes
            .iter()
            .flat_map(|r| &r.rules)
            .flat_map(|r| &r.matches)
            .map(|m| wire::regexes_in_headers(&m.headers))
            .sum(),
        proxy_protocol::Kind::Opaque(_) | proxy_protocol::Kind::Tls(_) => 0,
    }
}

fn tls_to_opaque_distribution(
    kind: out::tls_route::distribution::Kind,
) -> out::opaque_route::distribution::Kind {
    use out::{opaque_route as o, tls_route::distribution::Kind as T};
    let backend = |b: out::tls_route::RouteBackend| o::RouteBackend {
        backend: b.backend,
        filters: vec![],
    };
    match kind {
        T::Empty(_) => o::distribution::Kind::Empty(o::distribution::Empty {}),
        T::FirstAvailable(f) => {
            o::distribution::Kind::FirstAvailable(o::distribution::FirstAvailable {
                backends: f.backends.into_iter().map(backend).collect(),
            })
        }
        T::RandomAvailable(r) => {
            o::distribution::Kind::RandomAvailable(o::distribution::RandomAvailable {
                backends: r
                    .backends
                    .into_iter()
                    .map(|w| o::WeightedRouteBackend {
                        backend: w.backend.map(backend),
                        weight: w.weight,
                    })
                    .collect(),
            })
        }
    }
}

/// A resource's metadata; a missing one is the default `name`.
fn meta_of(m: Option<meta::Metadata>, name: &str) -> Arc<ResourceMeta> {
    let bounded = |s: String| -> Arc<str> { Arc::from(s.chars().take(253).collect::<String>()) };
    Arc::new(match m.and_then(|m| m.kind) {
        Some(meta::metadata::Kind::Resource(r)) => ResourceMeta::new(
            bounded(r.group),
            bounded(r.kind),
            bounded(r.namespace),
            bounded(r.name),
            u16::try_from(r.port).ok().filter(|p| *p != 0),
            bounded(r.section),
        ),
        Some(meta::metadata::Kind::Default(d)) => ResourceMeta::default_named(&bounded(d)),
        None => ResourceMeta::default_named(name),
    })
}

fn duration(
    d: Option<prost_types::Duration>,
    what: &'static str,
) -> Result<Option<Duration>, InvalidPolicy> {
    let Some(d) = d else { return Ok(None) };
    let (Ok(secs), Ok(nanos)) = (u64::try_from(d.seconds), u32::try_from(d.nanos)) else {
        return Err(InvalidPolicy::Duration(what));
    };
    if nanos >= 1_000_000_000 {
        return Err(InvalidPolicy::Duration(what));
    }
    let d = Duration::new(secs.min(MAX_POLICY_DURATION.as_secs()), nanos).min(MAX_POLICY_DURATION);
    // Zero is "no timeout", as Gateway API says.
    Ok((!d.is_zero()).then_some(d))
}

fn header_name(name: &str, what: &'static str) -> Result<HeaderName, InvalidPolicy> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| InvalidPolicy::Header(what))
}

fn headers_of(
    h: Option<linkerd2_proxy_api::http_types::Headers>,
) -> Result<Vec<(HeaderName, HeaderValue)>, InvalidPolicy> {
    h.map(|h| h.headers)
        .unwrap_or_default()
        .into_iter()
        .map(|h| {
            Ok((
                header_name(&h.name, "a header modifier")?,
                HeaderValue::from_bytes(&h.value)
                    .map_err(|_| InvalidPolicy::Header("a header modifier"))?,
            ))
        })
        .collect()
}

fn modifier(
    add: Option<linkerd2_proxy_api::http_types::Headers>,
    set: Option<linkerd2_proxy_api::http_types::Headers>,
    remove: Vec<String>,
) -> Result<HeaderModifier, InvalidPolicy> {
    Ok(HeaderModifier {
        add: headers_of(add)?,
        set: headers_of(set)?,
        remove: remove
            .iter()
            .map(|n| header_name(n, "a header modifier"))
            .collect::<Result<_, _>>()?,
    })
}

fn ratio(r: Option<api::Ratio>) -> Ratio {
    match r {
        // Linkerd: no ratio is every request; 0/0 is none.
        None => Ratio {
            numerator: 1,
            denominator: 1,
        },
        Some(r) => Ratio {
            numerator: r.numerator.min(r.denominator),
            denominator: r.denominator,
        },
    }
}

fn redirect(r: api::RequestRedirect) -> Result<Redirect, InvalidPolicy> {
    let scheme = r
        .scheme
        .map(http::uri::Scheme::try_from)
        .transpose()
        .map_err(|_| InvalidPolicy::Redirect("scheme"))?;
    let port = u16::try_from(r.port).map_err(|_| InvalidPolicy::Redirect("port"))?;
    let host = (!r.host.is_empty()).then_some(r.host);
    if let Some(h) = &host {
        http::uri::Authority::try_from(h.as_str()).map_err(|_| InvalidPolicy::Redirect("host"))?;
    }
    let path = match r.path.and_then(|p| p.replace) {
        None => None,
        Some(api::path_modifier::Replace::Full(p)) if p.starts_with('/') => {
            Some(PathModifier::Full(p))
        }
        Some(api::path_modifier::Replace::Prefix(p)) if p.starts_with('/') => {
            Some(PathModifier::Prefix(p))
        }
        Some(_) => return Err(InvalidPolicy::Redirect("relative path")),
    };
    let status = match r.status {
        0 => StatusCode::MOVED_PERMANENTLY,
        s => u16::try_from(s)
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .filter(|s| s.is_redirection())
            .ok_or(InvalidPolicy::Status("a redirect"))?,
    };
    Ok(Redirect {
        scheme,
        host,
        port: (port != 0).then_some(port),
        path,
        status,
    })
}

fn http_filter(f: out::http_route::Filter) -> Result<Option<Filter>, InvalidPolicy> {
    use out::http_route::filter::Kind;
    Ok(Some(match f.kind {
        None => return Ok(None),
        Some(Kind::RequestHeaderModifier(m)) => {
            Filter::RequestHeaders(modifier(m.add, m.set, m.remove)?)
        }
        Some(Kind::ResponseHeaderModifier(m)) => {
            Filter::ResponseHeaders(modifier(m.add, m.set, m.remove)?)
        }
        Some(Kind::Redirect(r)) => Filter::Redirect(redirect(r)?),
        Some(Kind::FailureInjector(f)) => Filter::HttpFailure {
            status: u16::try_from(f.status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or(InvalidPolicy::Status("a failure injector"))?,
            message: Arc::from(f.message.chars().take(256).collect::<String>()),
            ratio: ratio(f.ratio),
        },
    }))
}

fn grpc_filter(f: out::grpc_route::Filter) -> Result<Option<Filter>, InvalidPolicy> {
    use out::grpc_route::filter::Kind;
    Ok(Some(match f.kind {
        None => return Ok(None),
        Some(Kind::RequestHeaderModifier(m)) => {
            Filter::RequestHeaders(modifier(m.add, m.set, m.remove)?)
        }
        Some(Kind::FailureInjector(f)) => Filter::GrpcFailure {
            code: f.code,
            message: Arc::from(f.message.chars().take(256).collect::<String>()),
            ratio: ratio(f.ratio),
        },
    }))
}

fn backend(b: Option<out::Backend>) -> Result<Arc<Backend>, InvalidPolicy> {
    let b = b.ok_or(InvalidPolicy::Backend("description"))?;
    let meta = meta_of(b.metadata, "backend");
    let target = match b.kind.ok_or(InvalidPolicy::Backend("kind"))? {
        out::backend::Kind::Forward(addr) => BackendTarget::Forward(forward(addr)?),
        out::backend::Kind::Balancer(p2c) => {
            let path = p2c
                .discovery
                .and_then(|d| d.kind)
                .map(|out::backend::endpoint_discovery::Kind::Dst(d)| d.path)
                .filter(|p| !p.is_empty() && p.len() <= 253 + 6)
                .ok_or(InvalidPolicy::Backend("discovery path"))?;
            BackendTarget::Balancer(Arc::from(path))
        }
    };
    Ok(Arc::new(Backend { meta, target }))
}

fn forward(addr: WeightedAddr) -> Result<Endpoint, InvalidPolicy> {
    crate::discovery::forward_endpoint(addr).ok_or(InvalidPolicy::Backend("address"))
}

/// A backend of any route kind as the wire has it: the backend, its
/// filters, and its weight (for `RandomAvailable`).
type WireBackend<F> = (Option<out::Backend>, Vec<F>, u32);

/// A distribution of any route kind, once its backends are read.
fn distribution<F>(
    first: Option<Vec<(Option<out::Backend>, Vec<F>)>>,
    random: Option<Vec<WireBackend<F>>>,
    filter: fn(F) -> Result<Option<Filter>, InvalidPolicy>,
) -> Result<Distribution, InvalidPolicy> {
    let filters = |fs: Vec<F>| -> Result<Vec<Filter>, InvalidPolicy> {
        Ok(fs
            .into_iter()
            .map(filter)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect())
    };
    if let Some(first) = first {
        return Ok(Distribution::FirstAvailable(
            first
                .into_iter()
                .map(|(b, fs)| {
                    Ok(RouteBackend {
                        backend: backend(b)?,
                        filters: filters(fs)?,
                        bound: BackendSlot::default(),
                    })
                })
                .collect::<Result<_, InvalidPolicy>>()?,
        ));
    }
    if let Some(random) = random {
        return Ok(Distribution::RandomAvailable(
            random
                .into_iter()
                .map(|(b, fs, w)| {
                    Ok((
                        RouteBackend {
                            backend: backend(b)?,
                            filters: filters(fs)?,
                            bound: BackendSlot::default(),
                        },
                        w,
                    ))
                })
                .collect::<Result<_, InvalidPolicy>>()?,
        ));
    }
    Ok(Distribution::Empty)
}

fn http_distribution(
    d: Option<out::http_route::Distribution>,
) -> Result<Distribution, InvalidPolicy> {
    use out::http_route::distribution::Kind;
    let none = || Ok(Distribution::Empty);
    match d.and_then(|d| d.kind) {
        None | Some(Kind::Empty(_)) => none(),
        Some(Kind::FirstAvailable(f)) => distribution(
            Some(
                f.backends
                    .into_iter()
                    .map(|b| (b.backend, b.filters))
                    .collect(),
            ),
            None,
            http_filter,
        ),
        Some(Kind::RandomAvailable(r)) => distribution(
            None,
            Some(
                r.backends
                    .into_iter()
                    .map(|w| {
                        let (b, fs) = w
                            .backend
                            .map(|b| (b.backend, b.filters))
                            .unwrap_or_default();
                        (b, fs, w.weight)
                    })
                    .collect(),
            ),
            http_filter,
        ),
    }
}

fn grpc_distribution(
    d: Option<out::grpc_route::Distribution>,
) -> Result<Distribution, InvalidPolicy> {
    use out::grpc_route::distribution::Kind;
    match d.and_then(|d| d.kind) {
        None | Some(Kind::Empty(_)) => Ok(Distribution::Empty),
        Some(Kind::FirstAvailable(f)) => distribution(
            Some(
                f.backends
                    .into_iter()
                    .map(|b| (b.backend, b.filters))
                    .collect(),
            ),
            None,
            grpc_filter,
        ),
        Some(Kind::RandomAvailable(r)) => distribution(
            None,
            Some(
                r.backends
                    .into_iter()
                    .map(|w| {
                        let (b, fs) = w
                            .backend
                            .map(|b| (b.backend, b.filters))
                            .unwrap_or_default();
                        (b, fs, w.weight)
                    })
                    .collect(),
            ),
            grpc_filter,
        ),
    }
}

fn opaque_backends(routes: Option<Vec<out::OpaqueRoute>>) -> Result<Distribution, InvalidPolicy> {
    use out::opaque_route::distribution::Kind;
    let no_filters = |_: out::opaque_route::Filter| Ok(None);
    let first_rule = routes
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|r| r.rules.into_iter().next());
    match first_rule.and_then(|r| r.backends).and_then(|d| d.kind) {
        None | Some(Kind::Empty(_)) => Ok(Distribution::Empty),
        Some(Kind::FirstAvailable(f)) => distribution(
            Some(
                f.backends
                    .into_iter()
                    .map(|b| (b.backend, b.filters))
                    .collect(),
            ),
            None,
            no_filters,
        ),
        Some(Kind::RandomAvailable(r)) => distribution(
            None,
            Some(
                r.backends
                    .into_iter()
                    .map(|w| {
                        let (b, fs) = w
                            .backend
                            .map(|b| (b.backend, b.filters))
                            .unwrap_or_default();
                        (b, fs, w.weight)
                    })
                    .collect(),
            ),
            no_filters,
        ),
    }
}

fn timeouts(
    t: Option<api::Timeouts>,
    deprecated_request: Option<prost_types::Duration>,
) -> Result<Timeouts, InvalidPolicy> {
    let t = t.unwrap_or_default();
    Ok(Timeouts {
        request: duration(t.request.or(deprecated_request), "the request timeout")?,
        response: duration(t.response, "the response timeout")?,
        idle: duration(t.idle, "the idle timeout")?,
    })
}

/// Linkerd's failure accrual: consecutive failures (also the consecutive
/// part of `Unified`; its success-rate part is not acted on). A
/// `max_failures` of 0, or no backoff, turns it off.
fn failure_accrual(
    f: Option<out::FailureAccrual>,
) -> Result<Option<Arc<FailureAccrual>>, InvalidPolicy> {
    use out::failure_accrual::Kind;
    let (max_failures, b) = match f.and_then(|f| f.kind) {
        Some(Kind::ConsecutiveFailures(c)) => (c.max_failures, c.backoff),
        Some(Kind::Unified(u)) => (u.max_consecutive_failures, u.backoff),
        None => return Ok(None),
    };
    if max_failures == 0 {
        return Ok(None);
    }
    let Some(b) = backoff(b)? else {
        return Ok(None);
    };
    Ok(Some(Arc::new(FailureAccrual {
        max_failures,
        backoff: BackoffConfig {
            initial: b.min.max(MIN_PENALTY),
            max: b.max.max(MIN_PENALTY),
            factor: 2.0,
            jitter: b.jitter,
            reset_after: MAX_POLICY_DURATION,
        },
    })))
}

fn backoff(b: Option<out::ExponentialBackoff>) -> Result<Option<RetryBackoff>, InvalidPolicy> {
    let Some(b) = b else { return Ok(None) };
    let min = duration(b.min_backoff, "the retry backoff")?.unwrap_or_default();
    let max = duration(b.max_backoff, "the retry backoff")?
        .unwrap_or(min)
        .max(min);
    let jitter = if b.jitter_ratio.is_finite() {
        f64::from(b.jitter_ratio).clamp(0.0, 1.0)
    } else {
        0.0
    };
    Ok(Some(RetryBackoff { min, max, jitter }))
}

fn http_retry(r: Option<out::http_route::Retry>) -> Result<Option<RetryPolicy>, InvalidPolicy> {
    let Some(r) = r else { return Ok(None) };
    let statuses = r
        .conditions
        .map(|c| c.status_ranges)
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let start = u16::try_from(s.start)
                .ok()
                .filter(|s| (100..=599).contains(s));
            // An end of 0 is the start alone.
            let end = if s.end == 0 {
                start
            } else {
                u16::try_from(s.end)
                    .ok()
                    .filter(|e| (100..=599).contains(e))
            };
            match (start, end) {
                (Some(a), Some(b)) if a <= b => Ok((a, b)),
                _ => Err(InvalidPolicy::Status("a retry condition")),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(RetryPolicy {
        max_retries: r.max_retries.min(MAX_RETRIES),
        max_request_bytes: r.max_request_bytes.min(MAX_RETRY_BODY_BYTES) as usize,
        statuses,
        grpc_codes: Vec::new(),
        timeout: duration(r.timeout, "the retry timeout")?,
        backoff: backoff(r.backoff)?,
    }))
}

fn grpc_retry(r: Option<out::grpc_route::Retry>) -> Result<Option<RetryPolicy>, InvalidPolicy> {
    let Some(r) = r else { return Ok(None) };
    let c = r.conditions.unwrap_or_default();
    let grpc_codes = [
        (c.cancelled, 1),
        (c.deadine_exceeded, 4),
        (c.resource_exhausted, 8),
        (c.internal, 13),
        (c.unavailable, 14),
    ]
    .into_iter()
    .filter_map(|(on, code)| on.then_some(code))
    .collect();
    Ok(Some(RetryPolicy {
        max_retries: r.max_retries.min(MAX_RETRIES),
        max_request_bytes: r.max_request_bytes.min(MAX_RETRY_BODY_BYTES) as usize,
        statuses: Vec::new(),
        grpc_codes,
        timeout: duration(r.timeout, "the retry timeout")?,
        backoff: backoff(r.backoff)?,
    }))
}

/// HTTP and gRPC routes have one shape in different wire types: one body
/// for both, each with its own match, filter, backend and retry readers.
macro_rules! routes_from_wire {
    ($name:ident, $wire:ty, $match:ty, $kind:literal,
     $read_match:path, $read_filter:path, $read_backends:path, $read_retry:path) => {
        fn $name(routes: Vec<$wire>) -> Result<Routes<$match>, InvalidPolicy> {
            let mut out = Routes::default();
            for r in routes {
                out.metas.push(meta_of(r.metadata, $kind));
                out.slots.push(RouteSlot::default());
                let hosts = r
                    .hosts
                    .into_iter()
                    .map(wire::host_match)
                    .collect::<Result<_, _>>()?;
                let rules = r
                    .rules
                    .into_iter()
                    .map(|rule| {
                        Ok(Rule {
                            matches: rule
                                .matches
                                .into_iter()
                                .map($read_match)
                                .collect::<Result<_, _>>()?,
                            policy: RulePolicy {
                                filters: rule
                                    .filters
                                    .into_iter()
                                    .map($read_filter)
                                    .collect::<Result<Vec<_>, _>>()?
                                    .into_iter()
                                    .flatten()
                                    .collect(),
                                backends: $read_backends(rule.backends)?,
                                #[allow(deprecated)]
                                timeouts: timeouts(rule.timeouts, rule.request_timeout)?,
                                retry: $read_retry(rule.retry)?,
                                allow_l5d_request_headers: rule.allow_l5d_request_headers,
                            },
                        })
                    })
                    .collect::<Result<_, InvalidPolicy>>()?;
                out.routes.push(Route { hosts, rules });
            }
            Ok(out)
        }
    };
}

routes_from_wire!(
    http_route_list,
    out::HttpRoute,
    HttpMatch,
    "http",
    wire::http_match,
    http_filter,
    http_distribution,
    http_retry
);
routes_from_wire!(
    grpc_routes,
    out::GrpcRoute,
    GrpcMatch,
    "grpc",
    wire::grpc_match,
    grpc_filter,
    grpc_distribution,
    grpc_retry
);

fn http_routes(routes: Option<Vec<out::HttpRoute>>) -> Result<Routes<HttpMatch>, InvalidPolicy> {
    http_route_list(routes.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::{meta::Metadata, outbound::backend as wire_backend};

    fn resource(group: &str, kind: &str, name: &str, port: u32) -> Option<Metadata> {
        Some(Metadata {
            kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                group: group.into(),
                kind: kind.into(),
                name: name.into(),
                namespace: "shop".into(),
                section: String::new(),
                port,
            })),
        })
    }

    fn dur(ms: u64) -> Option<prost_types::Duration> {
        Some(Duration::from_millis(ms).try_into().expect("duration"))
    }

    fn balancer(name: &str) -> out::Backend {
        out::Backend {
            metadata: resource("core", "Service", name, 80),
            queue: Some(out::Queue {
                capacity: 100,
                failfast_timeout: dur(3000),
            }),
            kind: Some(wire_backend::Kind::Balancer(wire_backend::BalanceP2c {
                discovery: Some(wire_backend::EndpointDiscovery {
                    kind: Some(wire_backend::endpoint_discovery::Kind::Dst(
                        wire_backend::endpoint_discovery::DestinationGet {
                            path: format!("{name}.shop.svc.cluster.local:80"),
                        },
                    )),
                }),
                load: None,
            })),
        }
    }

    /// The answer for a Service port with no route attached, as Linkerd's
    /// controller sends it: one default route, one rule for `/`.
    fn default_policy(rule: out::http_route::Rule) -> out::OutboundPolicy {
        let route = out::HttpRoute {
            metadata: Some(Metadata {
                kind: Some(meta::metadata::Kind::Default("http".into())),
            }),
            hosts: vec![],
            rules: vec![rule],
        };
        out::OutboundPolicy {
            metadata: resource("core", "Service", "web", 80),
            protocol: Some(out::ProxyProtocol {
                kind: Some(proxy_protocol::Kind::Detect(proxy_protocol::Detect {
                    timeout: dur(10_000),
                    opaque: Some(proxy_protocol::Opaque { routes: vec![] }),
                    http1: Some(proxy_protocol::Http1 {
                        routes: vec![route.clone()],
                        failure_accrual: None,
                    }),
                    http2: Some(proxy_protocol::Http2 {
                        routes: vec![route],
                        failure_accrual: None,
                    }),
                })),
            }),
        }
    }

    fn prefix_rule(backends: out::http_route::Distribution) -> out::http_route::Rule {
        out::http_route::Rule {
            matches: vec![api::HttpRouteMatch {
                path: Some(api::PathMatch {
                    kind: Some(api::path_match::Kind::Prefix("/".into())),
                }),
                ..Default::default()
            }],
            backends: Some(backends),
            ..Default::default()
        }
    }

    fn first(name: &str) -> out::http_route::Distribution {
        out::http_route::Distribution {
            kind: Some(out::http_route::distribution::Kind::FirstAvailable(
                out::http_route::distribution::FirstAvailable {
                    backends: vec![out::http_route::RouteBackend {
                        backend: Some(balancer(name)),
                        ..Default::default()
                    }],
                },
            )),
        }
    }

    fn only_rule(p: &ClientPolicy) -> &RulePolicy {
        match &p.http1 {
            HttpRoutes::Http(r) => &r.routes[0].rules[0].policy,
            HttpRoutes::Grpc(_) => panic!("HTTP routes expected"),
        }
    }

    #[test]
    fn failure_accrual_is_read_from_the_protocol() {
        let consecutive = |max_failures, min, max| out::FailureAccrual {
            ejection: None,
            kind: Some(out::failure_accrual::Kind::ConsecutiveFailures(
                out::failure_accrual::ConsecutiveFailures {
                    max_failures,
                    backoff: Some(out::ExponentialBackoff {
                        min_backoff: dur(min),
                        max_backoff: dur(max),
                        jitter_ratio: 0.5,
                        respect_retry_after_hint: false,
                    }),
                },
            )),
        };
        let with = |accrual: Option<out::FailureAccrual>| {
            let mut policy = default_policy(prefix_rule(first("web")));
            if let Some(out::ProxyProtocol {
                kind: Some(proxy_protocol::Kind::Detect(d)),
            }) = &mut policy.protocol
            {
                if let Some(h) = d.http1.as_mut() {
                    h.failure_accrual = accrual;
                }
            }
            from_wire(policy)
        };
        let p = with(Some(consecutive(7, 1_000, 60_000))).expect("valid");
        let a = p.failure_accrual.expect("failure accrual");
        assert_eq!(a.max_failures, 7);
        assert_eq!(a.backoff.initial, Duration::from_secs(1));
        assert_eq!(a.backoff.max, Duration::from_secs(60));
        assert_eq!(a.backoff.jitter, 0.5);
        // Off: none, 0 failures, or no backoff.
        assert!(with(None).expect("valid").failure_accrual.is_none());
        assert!(with(Some(consecutive(0, 1_000, 60_000)))
            .expect("valid")
            .failure_accrual
            .is_none());
        let mut no_backoff = consecutive(3, 1, 1);
        if let Some(out::failure_accrual::Kind::ConsecutiveFailures(c)) = &mut no_backoff.kind {
            c.backoff = None;
        }
        assert!(with(Some(no_backoff))
            .expect("valid")
            .failure_accrual
            .is_none());
        // A penalty of 0 is raised to the floor; a negative one is refused.
        let floor = with(Some(consecutive(3, 0, 0))).expect("valid");
        assert_eq!(
            floor.failure_accrual.expect("on").backoff.initial,
            MIN_PENALTY
        );
        let mut negative = consecutive(3, 1, 1);
        if let Some(out::failure_accrual::Kind::ConsecutiveFailures(c)) = &mut negative.kind {
            if let Some(b) = c.backoff.as_mut() {
                b.min_backoff = Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                });
            }
        }
        assert!(matches!(
            with(Some(negative)),
            Err(InvalidPolicy::Duration(_))
        ));
    }

    #[test]
    fn the_default_answer_for_a_service_reads_as_one_route_to_its_balancer() {
        let p = from_wire(default_policy(prefix_rule(first("web")))).expect("valid");
        assert!(!p.opaque);
        assert_eq!(
            p.service_authority("cluster.local").as_deref(),
            Some("web.shop.svc.cluster.local:80")
        );
        let HttpRoutes::Http(routes) = &p.http2 else {
            panic!("HTTP routes expected")
        };
        assert_eq!(&*routes.metas[0].kind, "default");
        assert_eq!(&*routes.metas[0].name, "http");
        let rule = only_rule(&p);
        let Distribution::FirstAvailable(b) = &rule.backends else {
            panic!("{:?}", rule.backends)
        };
        assert!(
            matches!(&b[0].backend.target, BackendTarget::Balancer(path) if &**path == "web.shop.svc.cluster.local:80")
        );
        assert_eq!(b[0].backend.meta.port, Some(80));
        assert_eq!(rule.timeouts, Timeouts::default());
        assert!(rule.retry.is_none());
    }

    #[test]
    fn timeouts_and_retries_are_read_and_bounded() {
        let mut rule = prefix_rule(first("web"));
        rule.timeouts = Some(api::Timeouts {
            request: dur(2_000),
            response: dur(500),
            idle: None,
        });
        rule.retry = Some(out::http_route::Retry {
            max_retries: 1_000,
            max_request_bytes: u32::MAX,
            conditions: Some(out::http_route::retry::Conditions {
                status_ranges: vec![
                    out::http_route::retry::conditions::StatusRange {
                        start: 500,
                        end: 504,
                    },
                    out::http_route::retry::conditions::StatusRange { start: 429, end: 0 },
                ],
            }),
            timeout: dur(100),
            backoff: None,
        });
        let p = from_wire(default_policy(rule)).expect("valid");
        let rule = only_rule(&p);
        assert_eq!(rule.timeouts.request, Some(Duration::from_secs(2)));
        assert_eq!(rule.timeouts.response, Some(Duration::from_millis(500)));
        let retry = rule.retry.as_ref().expect("retry");
        assert_eq!(retry.max_retries, MAX_RETRIES);
        assert_eq!(retry.max_request_bytes, MAX_RETRY_BODY_BYTES as usize);
        assert_eq!(retry.statuses, [(500, 504), (429, 429)]);
        assert_eq!(retry.timeout, Some(Duration::from_millis(100)));

        let mut huge = prefix_rule(first("web"));
        huge.timeouts = Some(api::Timeouts {
            request: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: 0,
            }),
            ..Default::default()
        });
        let p = from_wire(default_policy(huge)).expect("valid");
        assert_eq!(only_rule(&p).timeouts.request, Some(MAX_POLICY_DURATION));
        let mut negative = prefix_rule(first("web"));
        negative.timeouts = Some(api::Timeouts {
            request: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert!(matches!(
            from_wire(default_policy(negative)),
            Err(InvalidPolicy::Duration(_))
        ));
    }

    #[test]
    fn what_cannot_be_acted_on_is_refused_whole() {
        let mut bad = prefix_rule(first("web"));
        bad.matches[0].path = Some(api::PathMatch {
            kind: Some(api::path_match::Kind::Regex("(unclosed".into())),
        });
        assert!(matches!(
            from_wire(default_policy(bad)),
            Err(InvalidPolicy::Match(InvalidMatch::Regex(_)))
        ));
        let mut no_path = prefix_rule(first("web"));
        if let Some(out::http_route::distribution::Kind::FirstAvailable(f)) =
            no_path.backends.as_mut().and_then(|b| b.kind.as_mut())
        {
            f.backends[0].backend = None;
        }
        assert!(from_wire(default_policy(no_path)).is_err());
        let mut many = prefix_rule(first("web"));
        many.matches = (0..=MAX_REGEXES_PER_POLICY)
            .map(|i| api::HttpRouteMatch {
                path: Some(api::PathMatch {
                    kind: Some(api::path_match::Kind::Regex(format!("/{i}/.*"))),
                }),
                ..Default::default()
            })
            .collect();
        assert!(matches!(
            from_wire(default_policy(many)),
            Err(InvalidPolicy::TooManyRegexes)
        ));
        let mut huge = prefix_rule(first("web"));
        huge.matches[0].path = Some(api::PathMatch {
            kind: Some(api::path_match::Kind::Regex(
                "(a|b|c){1000}[0-9]{1000}".into(),
            )),
        });
        assert!(
            matches!(
                from_wire(default_policy(huge)),
                Err(InvalidPolicy::Match(InvalidMatch::Regex(_)))
            ),
            "a regex past the compiled-size bound is refused"
        );
        let no_protocol = out::OutboundPolicy {
            protocol: None,
            metadata: None,
        };
        assert!(matches!(
            from_wire(no_protocol),
            Err(InvalidPolicy::NoProtocol)
        ));
    }

    #[test]
    fn an_address_that_is_no_service_is_forwarded_and_opaque_ports_skip_detection() {
        let forward = out::Backend {
            metadata: Some(Metadata {
                kind: Some(meta::metadata::Kind::Default("forward".into())),
            }),
            queue: None,
            kind: Some(wire_backend::Kind::Forward(WeightedAddr {
                addr: Some(
                    "10.1.2.3:8080"
                        .parse::<std::net::SocketAddr>()
                        .expect("addr")
                        .into(),
                ),
                weight: 1,
                ..Default::default()
            })),
        };
        let opaque = out::OutboundPolicy {
            metadata: Some(Metadata {
                kind: Some(meta::metadata::Kind::Default("10.1.2.3:8080".into())),
            }),
            protocol: Some(out::ProxyProtocol {
                kind: Some(proxy_protocol::Kind::Opaque(proxy_protocol::Opaque {
                    routes: vec![out::OpaqueRoute {
                        metadata: None,
                        rules: vec![out::opaque_route::Rule {
                            backends: Some(out::opaque_route::Distribution {
                                kind: Some(out::opaque_route::distribution::Kind::FirstAvailable(
                                    out::opaque_route::distribution::FirstAvailable {
                                        backends: vec![out::opaque_route::RouteBackend {
                                            backend: Some(forward),
                                            filters: vec![],
                                        }],
                                    },
                                )),
                            }),
                            filters: vec![],
                        }],
                    }],
                })),
            }),
        };
        let p = from_wire(opaque).expect("valid");
        assert!(p.opaque);
        assert_eq!(p.service_authority("cluster.local"), None);
        let Distribution::FirstAvailable(b) = &p.opaque_backends else {
            panic!("{:?}", p.opaque_backends)
        };
        assert!(matches!(&b[0].backend.target, BackendTarget::Forward(e) if e.addr.port() == 8080));
    }
}
