//! Inbound HTTP and gRPC routes, matched as Linkerd's `linkerd-http-route`
//! matches them: a route applies when one of its hosts matches (or it names
//! none); among its rules, and then among routes, the most specific match
//! wins (longer host, then longer path, more headers, more query
//! parameters, a method), the first on a tie. Pure.
//!
//! Regular expressions (path, header and query parameter) must match the
//! whole value, as in Linkerd; each is compiled once, within a size bound,
//! and one that does not compile makes the server unreadable (denied).

use super::policy::{meta_from_wire, Authorization, InvalidServer};
use crate::metrics::authz::PolicyMeta;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use linkerd2_proxy_api::{grpc_route as grpc_api, http_route as api, inbound as inbound_api};
use regex::{Regex, RegexBuilder};
use std::sync::Arc;

/// Largest compiled regex from the controller (regex's default is 10 MiB).
const MAX_REGEX_BYTES: usize = 1 << 20;

/// A regex from a route, compared by its text.
#[derive(Clone, Debug)]
pub struct Pattern(Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

impl Pattern {
    pub fn new(s: &str) -> Result<Self, InvalidRoute> {
        RegexBuilder::new(s)
            .size_limit(MAX_REGEX_BYTES)
            .build()
            .map(Self)
            .map_err(|_| InvalidRoute::Regex)
    }

    /// Linkerd's rule: the leftmost match must span the whole value.
    fn is_whole(&self, s: &str) -> bool {
        self.0
            .find(s)
            .is_some_and(|m| m.start() == 0 && m.end() == s.len())
    }
}

/// What a matched route carries: its name and who may use it (its own
/// authorizations, then the server's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePolicy {
    pub meta: Arc<PolicyMeta>,
    pub authorizations: Arc<[Authorization]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchHost {
    Exact(String),
    /// Reversed labels: `["com", "example"]` is `*.example.com`.
    Suffix(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchPath {
    Exact(String),
    Prefix(String),
    Regex(Pattern),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchHeader {
    Exact(HeaderName, HeaderValue),
    Regex(HeaderName, Pattern),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchQueryParam {
    Exact(String, String),
    Regex(String, Pattern),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MatchRequest {
    pub path: Option<MatchPath>,
    pub headers: Vec<MatchHeader>,
    pub query_params: Vec<MatchQueryParam>,
    pub method: Option<Method>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRule {
    /// None: the rule matches every request.
    pub matches: Vec<MatchRequest>,
    pub policy: RoutePolicy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRoute {
    pub hosts: Vec<MatchHost>,
    pub rules: Vec<HttpRule>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MatchRpc {
    pub service: Option<String>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcRule {
    pub matches: Vec<(MatchRpc, Vec<MatchHeader>)>,
    pub policy: RoutePolicy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcRoute {
    pub hosts: Vec<MatchHost>,
    pub rules: Vec<GrpcRule>,
}

#[derive(Debug, thiserror::Error)]
pub enum InvalidRoute {
    #[error("a route has no metadata")]
    MissingMeta,
    #[error("a host match is empty")]
    Host,
    #[error("a path match is empty")]
    Path,
    #[error("a header match is empty or invalid")]
    Header,
    #[error("a query parameter match is empty")]
    QueryParam,
    #[error("invalid method")]
    Method,
    #[error("a gRPC match has no RPC")]
    Rpc,
    #[error("a regular expression does not compile (or is too large)")]
    Regex,
}

/// How specifically a request matched: compared field by field, as Linkerd
/// orders matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct HostScore {
    exact: bool,
    len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RequestScore {
    path: usize,
    headers: usize,
    query_params: usize,
    method: bool,
}

impl Default for RequestScore {
    /// A rule without matches scores as a `/` prefix.
    fn default() -> Self {
        Self {
            path: 1,
            headers: 0,
            query_params: 0,
            method: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct RpcScore {
    service: usize,
    method: usize,
    headers: usize,
}

use crate::authority::request_host;

fn strip_suffix_ignore_case<'a>(host: &'a str, suffix: &str) -> Option<&'a str> {
    let at = host.len().checked_sub(suffix.len())?;
    let (head, tail) = host.split_at_checked(at)?;
    tail.eq_ignore_ascii_case(suffix).then_some(head)
}

impl MatchHost {
    fn score(&self, host: &str) -> Option<HostScore> {
        match self {
            Self::Exact(h) => {
                let host = if h.ends_with('.') {
                    host
                } else {
                    host.strip_suffix('.').unwrap_or(host)
                };
                h.eq_ignore_ascii_case(host).then_some(HostScore {
                    exact: true,
                    len: h.len(),
                })
            }
            Self::Suffix(labels) => {
                let mut host = if labels.first().map(String::as_str) == Some("") {
                    host
                } else {
                    host.strip_suffix('.').unwrap_or(host)
                };
                let mut len = 0;
                for label in labels {
                    host = strip_suffix_ignore_case(host, label)?;
                    host = host.strip_suffix('.')?;
                    len += label.len() + 1;
                }
                Some(HostScore { exact: false, len })
            }
        }
    }

    fn from_wire(m: api::HostMatch) -> Result<Self, InvalidRoute> {
        match m.r#match.ok_or(InvalidRoute::Host)? {
            api::host_match::Match::Exact(h) => Ok(Self::Exact(h)),
            api::host_match::Match::Suffix(s) => Ok(Self::Suffix(s.reverse_labels)),
        }
    }
}

/// The best score of `hosts` for the request; `Some(None)` when the route
/// names no host (it applies to all), `None` when none matches.
fn host_score<B>(hosts: &[MatchHost], req: &Request<B>) -> Option<Option<HostScore>> {
    if hosts.is_empty() {
        return Some(None);
    }
    let host = request_host(req)?;
    hosts.iter().filter_map(|h| h.score(host)).max().map(Some)
}

impl MatchPath {
    fn score(&self, path: &str) -> Option<usize> {
        match self {
            Self::Exact(p) => (p == path).then_some(p.len()),
            Self::Prefix(p) if p == "/" => Some(1),
            Self::Prefix(p) => {
                let p = p.trim_end_matches('/');
                let rest = path.trim_end_matches('/').strip_prefix(p)?;
                (rest.is_empty() || rest.starts_with('/')).then_some(p.len())
            }
            Self::Regex(re) => re.is_whole(path).then_some(path.len()),
        }
    }
}

impl MatchHeader {
    fn is_match(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Exact(n, v) => headers.get_all(n).iter().any(|h| h == v),
            Self::Regex(n, re) => headers
                .get_all(n)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| re.is_whole(v)),
        }
    }

    fn from_wire(h: api::HeaderMatch) -> Result<Self, InvalidRoute> {
        let name = HeaderName::try_from(h.name).map_err(|_| InvalidRoute::Header)?;
        match h.value.ok_or(InvalidRoute::Header)? {
            api::header_match::Value::Exact(v) => Ok(Self::Exact(
                name,
                HeaderValue::from_bytes(&v).map_err(|_| InvalidRoute::Header)?,
            )),
            api::header_match::Value::Regex(r) => Ok(Self::Regex(name, Pattern::new(&r)?)),
        }
    }
}

impl MatchQueryParam {
    /// Whether a parameter of the query has the name and value (values
    /// compared as sent, not decoded).
    fn is_match(&self, query: Option<&str>) -> bool {
        let (name, value_ok): (&str, &dyn Fn(&str) -> bool) = match self {
            Self::Exact(n, v) => (n, &move |x: &str| x == v),
            Self::Regex(n, re) => (n, &move |x: &str| re.is_whole(x)),
        };
        query.is_some_and(|q| {
            q.split('&').any(|pair| {
                let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                n == name && value_ok(v)
            })
        })
    }
}

impl MatchRequest {
    fn score<B>(&self, req: &Request<B>) -> Option<RequestScore> {
        let mut score = RequestScore::default();
        if let Some(m) = &self.method {
            if req.method() != m {
                return None;
            }
            score.method = true;
        }
        if let Some(p) = &self.path {
            score.path = p.score(req.uri().path())?;
        }
        if !self.headers.iter().all(|h| h.is_match(req.headers())) {
            return None;
        }
        score.headers = self.headers.len();
        let query = req.uri().query();
        if !self.query_params.iter().all(|q| q.is_match(query)) {
            return None;
        }
        score.query_params = self.query_params.len();
        Some(score)
    }

    fn from_wire(m: api::HttpRouteMatch) -> Result<Self, InvalidRoute> {
        let path = match m.path {
            None => None,
            Some(p) => Some(match p.kind.ok_or(InvalidRoute::Path)? {
                api::path_match::Kind::Exact(p) => MatchPath::Exact(p),
                api::path_match::Kind::Prefix(p) => MatchPath::Prefix(p),
                api::path_match::Kind::Regex(r) => MatchPath::Regex(Pattern::new(&r)?),
            }),
        };
        let headers = m
            .headers
            .into_iter()
            .map(MatchHeader::from_wire)
            .collect::<Result<_, _>>()?;
        let query_params = m
            .query_params
            .into_iter()
            .map(|q| {
                Ok(match q.value.ok_or(InvalidRoute::QueryParam)? {
                    api::query_param_match::Value::Exact(v) => MatchQueryParam::Exact(q.name, v),
                    api::query_param_match::Value::Regex(r) => {
                        MatchQueryParam::Regex(q.name, Pattern::new(&r)?)
                    }
                })
            })
            .collect::<Result<_, InvalidRoute>>()?;
        let method = m
            .method
            .map(Method::try_from)
            .transpose()
            .map_err(|_| InvalidRoute::Method)?;
        Ok(Self {
            path,
            headers,
            query_params,
            method,
        })
    }
}

impl MatchRpc {
    fn score(&self, path: &str) -> Option<RpcScore> {
        let mut parts = path.split('/');
        if !parts.next()?.is_empty() {
            return None;
        }
        let mut score = RpcScore::default();
        let service = parts.next()?;
        if let Some(s) = &self.service {
            if s != service {
                return None;
            }
            score.service = s.len();
        }
        let method = parts.next()?;
        if let Some(m) = &self.method {
            if m != method {
                return None;
            }
            score.method = m.len();
        }
        Some(score)
    }
}

/// The best of `scored`, the first on a tie.
fn best<S: Ord, P>(scored: impl Iterator<Item = (S, P)>) -> Option<(S, P)> {
    scored.reduce(|a, b| if a.0 >= b.0 { a } else { b })
}

/// The policy of the route that best matches `req`; `None`: no route.
pub fn find_http<'r, B>(routes: &'r [HttpRoute], req: &Request<B>) -> Option<&'r RoutePolicy> {
    best(routes.iter().filter_map(|route| {
        let host = host_score(&route.hosts, req)?;
        let (score, policy) = best(route.rules.iter().filter_map(|rule| {
            if rule.matches.is_empty() {
                return Some((RequestScore::default(), &rule.policy));
            }
            let score = rule.matches.iter().filter_map(|m| m.score(req)).max()?;
            Some((score, &rule.policy))
        }))?;
        Some(((host, score), policy))
    }))
    .map(|(_, p)| p)
}

/// The policy of the gRPC route that best matches `req` (a POST to
/// `/SERVICE/METHOD`); `None`: no route.
pub fn find_grpc<'r, B>(routes: &'r [GrpcRoute], req: &Request<B>) -> Option<&'r RoutePolicy> {
    best(routes.iter().filter_map(|route| {
        let host = host_score(&route.hosts, req)?;
        let (score, policy) = best(route.rules.iter().filter_map(|rule| {
            if rule.matches.is_empty() {
                return Some((RpcScore::default(), &rule.policy));
            }
            if req.method() != Method::POST {
                return None;
            }
            let score = rule
                .matches
                .iter()
                .filter_map(|(rpc, headers)| {
                    let mut s = rpc.score(req.uri().path())?;
                    if !headers.iter().all(|h| h.is_match(req.headers())) {
                        return None;
                    }
                    s.headers = headers.len();
                    Some(s)
                })
                .max()?;
            Some((score, &rule.policy))
        }))?;
        Some(((host, score), policy))
    }))
    .map(|(_, p)| p)
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

impl HttpRoute {
    /// The route of a server that names none: every request, the server's
    /// authorizations.
    pub fn default_route(authorizations: Arc<[Authorization]>) -> Self {
        Self::default_named(PolicyMeta::default_named("default"), authorizations)
    }

    pub fn default_named(meta: Arc<PolicyMeta>, authorizations: Arc<[Authorization]>) -> Self {
        Self {
            hosts: Vec::new(),
            rules: vec![HttpRule {
                matches: Vec::new(),
                policy: RoutePolicy {
                    meta,
                    authorizations,
                },
            }],
        }
    }

    pub fn from_wire(
        route: inbound_api::HttpRoute,
        server: &[Authorization],
    ) -> Result<Self, InvalidServer> {
        let meta = meta_from_wire(route.metadata.ok_or(InvalidRoute::MissingMeta)?)?;
        let authorizations = route_authorizations(route.authorizations, server)?;
        let hosts = route
            .hosts
            .into_iter()
            .map(MatchHost::from_wire)
            .collect::<Result<_, _>>()?;
        let rules = route
            .rules
            .into_iter()
            .map(|r| {
                Ok(HttpRule {
                    matches: r
                        .matches
                        .into_iter()
                        .map(MatchRequest::from_wire)
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

impl GrpcRoute {
    pub fn default_route(authorizations: Arc<[Authorization]>) -> Self {
        Self {
            hosts: Vec::new(),
            rules: vec![GrpcRule {
                matches: Vec::new(),
                policy: RoutePolicy {
                    meta: PolicyMeta::default_named("default"),
                    authorizations,
                },
            }],
        }
    }

    pub fn from_wire(
        route: inbound_api::GrpcRoute,
        server: &[Authorization],
    ) -> Result<Self, InvalidServer> {
        let meta = meta_from_wire(route.metadata.ok_or(InvalidRoute::MissingMeta)?)?;
        let authorizations = route_authorizations(route.authorizations, server)?;
        let hosts = route
            .hosts
            .into_iter()
            .map(MatchHost::from_wire)
            .collect::<Result<_, _>>()?;
        let rules = route
            .rules
            .into_iter()
            .map(|r| {
                let matches = r
                    .matches
                    .into_iter()
                    .map(|m: grpc_api::GrpcRouteMatch| {
                        let rpc = m.rpc.ok_or(InvalidRoute::Rpc)?;
                        let headers = m
                            .headers
                            .into_iter()
                            .map(MatchHeader::from_wire)
                            .collect::<Result<_, _>>()?;
                        let some = |s: String| (!s.is_empty()).then_some(s);
                        Ok((
                            MatchRpc {
                                service: some(rpc.service),
                                method: some(rpc.method),
                            },
                            headers,
                        ))
                    })
                    .collect::<Result<_, InvalidRoute>>()?;
                Ok(GrpcRule {
                    matches,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str) -> RoutePolicy {
        RoutePolicy {
            meta: PolicyMeta::default_named(name),
            authorizations: Arc::new([]),
        }
    }

    fn route(hosts: Vec<MatchHost>, matches: Vec<MatchRequest>, name: &str) -> HttpRoute {
        HttpRoute {
            hosts,
            rules: vec![HttpRule {
                matches,
                policy: policy(name),
            }],
        }
    }

    fn path(p: MatchPath) -> MatchRequest {
        MatchRequest {
            path: Some(p),
            ..Default::default()
        }
    }

    fn req(method: Method, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap()
    }

    fn found(routes: &[HttpRoute], r: &Request<()>) -> Option<String> {
        find_http(routes, r).map(|p| p.meta.name.to_string())
    }

    #[test]
    fn the_most_specific_route_wins_as_in_linkerd() {
        let routes = vec![
            route(vec![], vec![path(MatchPath::Prefix("/".into()))], "root"),
            route(vec![], vec![path(MatchPath::Prefix("/api/".into()))], "api"),
            route(
                vec![],
                vec![path(MatchPath::Exact("/api/admin".into()))],
                "admin",
            ),
            route(
                vec![],
                vec![MatchRequest {
                    path: Some(MatchPath::Prefix("/api".into())),
                    method: Some(Method::DELETE),
                    ..Default::default()
                }],
                "api-delete",
            ),
            route(
                vec![],
                vec![MatchRequest {
                    path: Some(MatchPath::Prefix("/api".into())),
                    headers: vec![MatchHeader::Exact(
                        HeaderName::from_static("x-canary"),
                        HeaderValue::from_static("1"),
                    )],
                    ..Default::default()
                }],
                "api-canary",
            ),
            route(
                vec![],
                vec![path(MatchPath::Regex(Pattern::new("/r[0-9]+").unwrap()))],
                "regex",
            ),
        ];
        let cases = [
            (req(Method::GET, "/", &[]), Some("root")),
            (req(Method::GET, "/apix", &[]), Some("root")),
            (req(Method::GET, "/api", &[]), Some("api")),
            (req(Method::GET, "/api/users/", &[]), Some("api")),
            (req(Method::GET, "/api/admin", &[]), Some("admin")),
            (req(Method::DELETE, "/api/x", &[]), Some("api-delete")),
            // Headers rank before the method.
            (
                req(Method::DELETE, "/api/x", &[("x-canary", "1")]),
                Some("api-canary"),
            ),
            (
                req(Method::GET, "/api/x", &[("x-canary", "2")]),
                Some("api"),
            ),
            // A regex must match the whole path.
            (req(Method::GET, "/r42", &[]), Some("regex")),
            (req(Method::GET, "/r42x", &[]), Some("root")),
        ];
        for (r, want) in cases {
            assert_eq!(
                found(&routes, &r).as_deref(),
                want,
                "{} {}",
                r.method(),
                r.uri()
            );
        }
        assert_eq!(found(&routes[1..3], &req(Method::GET, "/other", &[])), None);
    }

    #[test]
    fn hosts_select_routes_exact_before_suffix() {
        let routes = vec![
            route(
                vec![MatchHost::Suffix(vec!["com".into(), "example".into()])],
                vec![],
                "suffix",
            ),
            route(
                vec![MatchHost::Exact("api.example.com".into())],
                vec![],
                "exact",
            ),
            route(vec![], vec![], "any"),
        ];
        let host = |h: &str| req(Method::GET, "/", &[("host", h)]);
        assert_eq!(
            found(&routes, &host("api.example.com:8080")).as_deref(),
            Some("exact")
        );
        assert_eq!(
            found(&routes, &host("WWW.example.com")).as_deref(),
            Some("suffix")
        );
        assert_eq!(found(&routes, &host("example.org")).as_deref(), Some("any"));
        assert_eq!(
            found(&routes, &req(Method::GET, "http://api.example.com/", &[])).as_deref(),
            Some("exact")
        );
    }

    #[test]
    fn query_parameters_match_exactly() {
        let routes = vec![
            route(vec![], vec![], "any"),
            route(
                vec![],
                vec![MatchRequest {
                    query_params: vec![MatchQueryParam::Exact("v".into(), "2".into())],
                    ..Default::default()
                }],
                "v2",
            ),
            route(
                vec![],
                vec![MatchRequest {
                    query_params: vec![MatchQueryParam::Regex(
                        "id".into(),
                        Pattern::new("[0-9]+").unwrap(),
                    )],
                    ..Default::default()
                }],
                "numeric-id",
            ),
        ];
        assert_eq!(
            found(&routes, &req(Method::GET, "/?id=17", &[])).as_deref(),
            Some("numeric-id")
        );
        assert_eq!(
            found(&routes, &req(Method::GET, "/?id=17a", &[])).as_deref(),
            Some("any")
        );
        assert!(Pattern::new("(").is_err());
        assert_eq!(
            found(&routes, &req(Method::GET, "/?a=1&v=2", &[])).as_deref(),
            Some("v2")
        );
        assert_eq!(
            found(&routes, &req(Method::GET, "/?v=3", &[])).as_deref(),
            Some("any")
        );
    }

    #[test]
    fn grpc_routes_match_service_and_method_of_posts() {
        let rule = |service: Option<&str>, method: Option<&str>, name: &str| GrpcRoute {
            hosts: vec![],
            rules: vec![GrpcRule {
                matches: vec![(
                    MatchRpc {
                        service: service.map(Into::into),
                        method: method.map(Into::into),
                    },
                    vec![],
                )],
                policy: policy(name),
            }],
        };
        let routes = vec![
            rule(Some("shop.Cart"), None, "cart"),
            rule(Some("shop.Cart"), Some("Checkout"), "checkout"),
        ];
        let find = |m: Method, p: &str| {
            find_grpc(&routes, &req(m, p, &[])).map(|p| p.meta.name.to_string())
        };
        assert_eq!(
            find(Method::POST, "/shop.Cart/Checkout").as_deref(),
            Some("checkout")
        );
        assert_eq!(
            find(Method::POST, "/shop.Cart/Add").as_deref(),
            Some("cart")
        );
        assert_eq!(find(Method::GET, "/shop.Cart/Add"), None);
        assert_eq!(find(Method::POST, "/other.Svc/Add"), None);
    }
}
