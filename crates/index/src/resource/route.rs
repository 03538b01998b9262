//! HTTP and gRPC routes: Gateway API `HTTPRoute` and `GRPCRoute`
//! (`gateway.networking.k8s.io/v1`) and Linkerd's `policy.linkerd.io`
//! `HTTPRoute`, decoded slim and checked whole.
//!
//! Everything that can be judged from the object alone is judged here (bad
//! regex, weights summing to zero, unknown filter, oversized route), so an
//! invalid route never reaches the index; what needs other objects (does the
//! parent or the backend Service exist) is judged by the index.

use super::{
    duration::{parse_annotation_duration, parse_gateway_duration},
    meta::null_as_default,
    InvalidObject, ObjectKey, ObjectMetaWire,
};
use serde::Deserialize;
use std::{sync::Arc, time::Duration};

pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
pub const POLICY_GROUP: &str = "policy.linkerd.io";

/// Bounds on one route object, so a single object cannot make every answer
/// that carries it large. Linkerd's CRDs cap rules at 16 and matches at 8;
/// the other limits are Ballast's.
pub const MAX_RULES: usize = 16;
pub const MAX_MATCHES: usize = 8;
pub const MAX_BACKENDS: usize = 16;
pub const MAX_FILTERS: usize = 16;
pub const MAX_HOSTNAMES: usize = 16;
pub const MAX_PARENTS: usize = 32;
/// Header and query matches per match, and header changes per filter.
pub const MAX_HEADERS: usize = 16;
/// Longest string (path, header value, regex, hostname) a route may carry.
pub const MAX_VALUE_LEN: usize = 1024;
/// Regexes are compiled by the proxy; bound the pattern's size here.
pub const MAX_REGEX_LEN: usize = 256;

/// Which API a route came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteApi {
    /// `gateway.networking.k8s.io` `HTTPRoute`.
    GatewayHttp,
    /// `gateway.networking.k8s.io` `GRPCRoute`.
    GatewayGrpc,
    /// `policy.linkerd.io` `HTTPRoute`.
    LinkerdHttp,
}

impl RouteApi {
    pub fn group(self) -> &'static str {
        match self {
            RouteApi::GatewayHttp | RouteApi::GatewayGrpc => GATEWAY_GROUP,
            RouteApi::LinkerdHttp => POLICY_GROUP,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            RouteApi::GatewayHttp | RouteApi::LinkerdHttp => "HTTPRoute",
            RouteApi::GatewayGrpc => "GRPCRoute",
        }
    }

    pub fn is_grpc(self) -> bool {
        self == RouteApi::GatewayGrpc
    }
}

/// What a route attaches to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParentKind {
    /// A Service (outbound routes).
    Service,
    /// A `policy.linkerd.io` Server (inbound routes).
    Server,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParentRef {
    pub kind: ParentKind,
    pub key: ObjectKey,
    /// `port` of the reference: the route applies to this port only.
    pub port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub key: ObjectKey,
    pub api: RouteApi,
    /// RFC 3339; older routes win ties, as Gateway API orders them.
    pub creation_timestamp: Option<String>,
    pub parents: Vec<ParentRef>,
    pub hostnames: Vec<HostMatch>,
    pub rules: Vec<RouteRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.com`: the suffix without the star, e.g. `example.com`.
    Suffix(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RouteRule {
    pub matches: Vec<RouteMatch>,
    pub filters: Vec<RouteFilter>,
    pub backends: Vec<BackendRef>,
    pub timeouts: RouteTimeouts,
    pub retry: Option<RouteRetry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteMatch {
    Http(HttpMatch),
    Grpc(GrpcMatch),
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HttpMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<HeaderMatch>,
    pub query_params: Vec<QueryParamMatch>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GrpcMatch {
    pub service: Option<String>,
    pub method: Option<String>,
    pub headers: Vec<HeaderMatch>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueMatch {
    Exact(String),
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderMatch {
    pub name: String,
    pub value: ValueMatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryParamMatch {
    pub name: String,
    pub value: ValueMatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteFilter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HeaderModifier {
    pub add: Vec<(String, String)>,
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    /// 301 or 302 (Gateway API's choices); 302 when unset.
    pub status: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModifier {
    Full(String),
    Prefix(String),
}

/// A weighted reference to a Service port (the only backend kind served).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendRef {
    pub service: ObjectKey,
    pub port: Option<u16>,
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RouteTimeouts {
    /// The whole request, retries included.
    pub request: Option<Duration>,
    /// Each try, until the response headers.
    pub response: Option<Duration>,
    pub idle: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteRetry {
    pub limit: u32,
    pub timeout: Option<Duration>,
    /// Inclusive HTTP status ranges (HTTP routes).
    pub http_statuses: Vec<(u16, u16)>,
    /// gRPC codes (gRPC routes).
    pub grpc_codes: Vec<GrpcRetryCode>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GrpcRetryCode {
    Cancelled,
    DeadlineExceeded,
    ResourceExhausted,
    Internal,
    Unavailable,
}

pub const RETRY_HTTP_ANNOTATION: &str = "retry.linkerd.io/http";
pub const RETRY_GRPC_ANNOTATION: &str = "retry.linkerd.io/grpc";
pub const RETRY_LIMIT_ANNOTATION: &str = "retry.linkerd.io/limit";
pub const RETRY_TIMEOUT_ANNOTATION: &str = "retry.linkerd.io/timeout";
pub const TIMEOUT_REQUEST_ANNOTATION: &str = "timeout.linkerd.io/request";
pub const TIMEOUT_RESPONSE_ANNOTATION: &str = "timeout.linkerd.io/response";
pub const TIMEOUT_IDLE_ANNOTATION: &str = "timeout.linkerd.io/idle";
/// Most retries one request may make, whatever an annotation asks.
pub const MAX_RETRY_LIMIT: u32 = 10;

// === wire ===

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct RouteWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    spec: RouteSpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RouteSpecWire {
    #[serde(default, deserialize_with = "null_as_default")]
    parent_refs: Vec<ParentRefWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    hostnames: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    rules: Vec<RuleWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ParentRefWire {
    group: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    #[serde(default)]
    name: String,
    port: Option<i64>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RuleWire {
    #[serde(default, deserialize_with = "null_as_default")]
    matches: Vec<MatchWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    filters: Vec<FilterWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    backend_refs: Vec<BackendRefWire>,
    timeouts: Option<TimeoutsWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct MatchWire {
    path: Option<PathMatchWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    headers: Vec<ValueMatchWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    query_params: Vec<ValueMatchWire>,
    method: Option<MethodWire>,
}

/// `method` is a string for HTTPRoute and an object for GRPCRoute.
#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
enum MethodWire {
    Http(String),
    Grpc(GrpcMethodWire),
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct GrpcMethodWire {
    #[serde(rename = "type")]
    type_: Option<String>,
    service: Option<String>,
    method: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct PathMatchWire {
    #[serde(rename = "type")]
    type_: Option<String>,
    value: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ValueMatchWire {
    #[serde(rename = "type")]
    type_: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct FilterWire {
    #[serde(rename = "type", default)]
    type_: String,
    request_header_modifier: Option<HeaderModifierWire>,
    response_header_modifier: Option<HeaderModifierWire>,
    request_redirect: Option<RedirectWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct HeaderModifierWire {
    #[serde(default, deserialize_with = "null_as_default")]
    add: Vec<HeaderValueWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    set: Vec<HeaderValueWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    remove: Vec<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct HeaderValueWire {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RedirectWire {
    scheme: Option<String>,
    hostname: Option<String>,
    path: Option<PathModifierWire>,
    port: Option<i64>,
    status_code: Option<i64>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct PathModifierWire {
    #[serde(rename = "type", default)]
    type_: String,
    replace_full_path: Option<String>,
    replace_prefix_match: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct BackendRefWire {
    group: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    name: String,
    namespace: Option<String>,
    port: Option<i64>,
    weight: Option<i64>,
    #[serde(default, deserialize_with = "null_as_default")]
    filters: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct TimeoutsWire {
    request: Option<String>,
    backend_request: Option<String>,
}

// === checks ===

fn bad(field: String, reason: impl Into<String>) -> InvalidObject {
    InvalidObject::invalid(field, reason)
}

fn check_len(field: &str, s: &str, max: usize) -> Result<(), InvalidObject> {
    if s.len() > max {
        return Err(bad(field.into(), format!("longer than {max} bytes")));
    }
    Ok(())
}

fn check_count(field: &str, n: usize, max: usize) -> Result<(), InvalidObject> {
    if n > max {
        return Err(bad(field.into(), format!("{n} entries, at most {max}")));
    }
    Ok(())
}

/// A regex the proxy will compile: bounded, and of the syntax Gateway API's
/// RE2 dialect and Rust's `regex` share.
pub fn check_regex(field: &str, pattern: &str) -> Result<(), InvalidObject> {
    check_len(field, pattern, MAX_REGEX_LEN)?;
    regex_syntax::Parser::new()
        .parse(pattern)
        .map(|_| ())
        .map_err(|e| {
            let kind = match &e {
                regex_syntax::Error::Parse(e) => e.kind().to_string(),
                regex_syntax::Error::Translate(e) => e.kind().to_string(),
                _ => "unsupported".to_string(),
            };
            let mut reason = format!("invalid regex: {kind}");
            super::truncate(&mut reason, 160);
            bad(field.into(), reason)
        })
}

fn port(field: &str, n: i64) -> Result<u16, InvalidObject> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad(field.into(), format!("{n} is not a port")))
}

fn header_name(field: &str, name: &str) -> Result<String, InvalidObject> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid {
        return Err(bad(field.into(), format!("{name:?} is not a header name")));
    }
    Ok(name.to_ascii_lowercase())
}

fn header_value(field: &str, value: &str) -> Result<String, InvalidObject> {
    check_len(field, value, MAX_VALUE_LEN)?;
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(bad(field.into(), "header value holds a line break"));
    }
    Ok(value.to_string())
}

impl RouteWire {
    pub fn api(&self) -> Option<RouteApi> {
        let group = self.api_version.split('/').next().unwrap_or_default();
        match (group, self.kind.as_str()) {
            (GATEWAY_GROUP, "HTTPRoute") => Some(RouteApi::GatewayHttp),
            (GATEWAY_GROUP, "GRPCRoute") => Some(RouteApi::GatewayGrpc),
            (POLICY_GROUP, "HTTPRoute") => Some(RouteApi::LinkerdHttp),
            _ => None,
        }
    }

    /// The wire type of each route kind is the same; the source that watches
    /// one kind sets what the list items omit.
    pub fn set_type(&mut self, api_version: &str, kind: &str) {
        if self.api_version.is_empty() {
            self.api_version = api_version.to_string();
        }
        if self.kind.is_empty() {
            self.kind = kind.to_string();
        }
    }
}

impl TryFrom<RouteWire> for Route {
    type Error = InvalidObject;

    fn try_from(mut w: RouteWire) -> Result<Route, InvalidObject> {
        let api = w
            .api()
            .ok_or_else(|| bad("kind".into(), "not a route kind"))?;
        let key = w.metadata.key()?;
        let annotations = w.metadata.take_used_annotations();
        let spec = w.spec;

        check_count("spec.parentRefs", spec.parent_refs.len(), MAX_PARENTS)?;
        let mut parents = Vec::with_capacity(spec.parent_refs.len());
        for (i, p) in spec.parent_refs.into_iter().enumerate() {
            let field = format!("spec.parentRefs[{i}]");
            let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
            let kind = p.kind.as_deref().unwrap_or("Gateway");
            let kind = match (group, kind) {
                ("" | "core", "Service") => ParentKind::Service,
                (POLICY_GROUP, "Server") => ParentKind::Server,
                // A Gateway parent belongs to an ingress, not to the mesh.
                _ => continue,
            };
            if p.name.is_empty() {
                return Err(InvalidObject::missing(format!("{field}.name")));
            }
            let namespace: Arc<str> = match p.namespace {
                Some(ns) if !ns.is_empty() => ns.into(),
                _ => key.namespace.clone(),
            };
            let port = p
                .port
                .map(|n| port(&format!("{field}.port"), n))
                .transpose()?;
            parents.push(ParentRef {
                kind,
                key: ObjectKey::new(namespace, p.name),
                port,
            });
        }

        check_count("spec.hostnames", spec.hostnames.len(), MAX_HOSTNAMES)?;
        let hostnames = spec
            .hostnames
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let field = format!("spec.hostnames[{i}]");
                check_len(&field, &h, 253)?;
                let h = h.to_ascii_lowercase();
                match h.strip_prefix("*.") {
                    Some(suffix) if !suffix.is_empty() => Ok(HostMatch::Suffix(suffix.to_string())),
                    _ if h.is_empty() || h.contains('*') => {
                        Err(bad(field, format!("{h:?} is not a hostname")))
                    }
                    _ => Ok(HostMatch::Exact(h)),
                }
            })
            .collect::<Result<_, _>>()?;

        let annotated = RouteRule {
            timeouts: annotation_timeouts(&annotations)?,
            retry: annotation_retry(&annotations, api)?,
            ..Default::default()
        };

        check_count("spec.rules", spec.rules.len(), MAX_RULES)?;
        let mut rules = Vec::with_capacity(spec.rules.len().max(1));
        for (i, r) in spec.rules.into_iter().enumerate() {
            rules.push(rule(&format!("spec.rules[{i}]"), r, api, &key, &annotated)?);
        }
        if rules.is_empty() {
            // A route without rules matches everything (Gateway API default).
            rules.push(RouteRule {
                matches: vec![],
                ..annotated
            });
        }

        Ok(Route {
            key,
            api,
            creation_timestamp: w.metadata.creation_timestamp,
            parents,
            hostnames,
            rules,
        })
    }
}

fn rule(
    field: &str,
    r: RuleWire,
    api: RouteApi,
    route: &ObjectKey,
    annotated: &RouteRule,
) -> Result<RouteRule, InvalidObject> {
    check_count(&format!("{field}.matches"), r.matches.len(), MAX_MATCHES)?;
    let matches = r
        .matches
        .into_iter()
        .enumerate()
        .map(|(i, m)| route_match(&format!("{field}.matches[{i}]"), m, api))
        .collect::<Result<_, _>>()?;

    check_count(&format!("{field}.filters"), r.filters.len(), MAX_FILTERS)?;
    let filters = r
        .filters
        .into_iter()
        .enumerate()
        .map(|(i, f)| filter(&format!("{field}.filters[{i}]"), f, api))
        .collect::<Result<_, _>>()?;

    check_count(
        &format!("{field}.backendRefs"),
        r.backend_refs.len(),
        MAX_BACKENDS,
    )?;
    let mut backends = Vec::with_capacity(r.backend_refs.len());
    for (i, b) in r.backend_refs.into_iter().enumerate() {
        let f = format!("{field}.backendRefs[{i}]");
        match (
            b.group.as_deref().unwrap_or(""),
            b.kind.as_deref().unwrap_or("Service"),
        ) {
            ("" | "core", "Service") => {}
            (g, k) => return Err(bad(f, format!("backend kind {g}/{k} is not a Service"))),
        }
        if b.name.is_empty() {
            return Err(InvalidObject::missing(format!("{f}.name")));
        }
        if !b.filters.is_empty() {
            return Err(bad(
                format!("{f}.filters"),
                "backend filters are not supported",
            ));
        }
        let weight = b.weight.unwrap_or(1);
        let weight = u32::try_from(weight)
            .ok()
            .filter(|w| *w <= 1_000_000)
            .ok_or_else(|| {
                bad(
                    format!("{f}.weight"),
                    format!("{weight} is not in 0..=1000000"),
                )
            })?;
        let namespace: Arc<str> = match b.namespace {
            Some(ns) if !ns.is_empty() => ns.into(),
            _ => route.namespace.clone(),
        };
        backends.push(BackendRef {
            service: ObjectKey::new(namespace, b.name),
            port: b.port.map(|n| port(&format!("{f}.port"), n)).transpose()?,
            weight,
        });
    }
    if !backends.is_empty() && backends.iter().all(|b| b.weight == 0) {
        return Err(bad(
            format!("{field}.backendRefs"),
            "weights sum to zero: no backend could be chosen",
        ));
    }

    let mut timeouts = annotated.timeouts.clone();
    if let Some(t) = r.timeouts {
        // Annotations win, as in Linkerd; zero means no timeout (GEP-1742).
        if timeouts.request.is_none() {
            timeouts.request = t
                .request
                .map(|s| parse_gateway_duration(&format!("{field}.timeouts.request"), &s))
                .transpose()?
                .filter(|d| !d.is_zero());
        }
        if timeouts.response.is_none() {
            timeouts.response = t
                .backend_request
                .map(|s| parse_gateway_duration(&format!("{field}.timeouts.backendRequest"), &s))
                .transpose()?
                .filter(|d| !d.is_zero());
        }
    }

    Ok(RouteRule {
        matches,
        filters,
        backends,
        timeouts,
        retry: annotated.retry.clone(),
    })
}

fn value_match(
    field: &str,
    m: ValueMatchWire,
    header: bool,
) -> Result<(String, ValueMatch), InvalidObject> {
    let name = if header {
        header_name(&format!("{field}.name"), &m.name)?
    } else {
        check_len(&format!("{field}.name"), &m.name, MAX_VALUE_LEN)?;
        if m.name.is_empty() {
            return Err(InvalidObject::missing(format!("{field}.name")));
        }
        m.name
    };
    let value = match m.type_.as_deref().unwrap_or("Exact") {
        "Exact" => ValueMatch::Exact(header_value(&format!("{field}.value"), &m.value)?),
        "RegularExpression" => {
            check_regex(&format!("{field}.value"), &m.value)?;
            ValueMatch::Regex(m.value)
        }
        other => {
            return Err(bad(
                format!("{field}.type"),
                format!("unknown match type {other:?}"),
            ))
        }
    };
    Ok((name, value))
}

fn route_match(field: &str, m: MatchWire, api: RouteApi) -> Result<RouteMatch, InvalidObject> {
    check_count(&format!("{field}.headers"), m.headers.len(), MAX_HEADERS)?;
    check_count(
        &format!("{field}.queryParams"),
        m.query_params.len(),
        MAX_HEADERS,
    )?;
    let headers = m
        .headers
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            value_match(&format!("{field}.headers[{i}]"), h, true)
                .map(|(name, value)| HeaderMatch { name, value })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if api.is_grpc() {
        if m.path.is_some() || !m.query_params.is_empty() {
            return Err(bad(
                field.into(),
                "a GRPCRoute matches by method and headers only",
            ));
        }
        let (service, method) = match m.method {
            None => (None, None),
            Some(MethodWire::Grpc(g)) => {
                if !matches!(g.type_.as_deref(), None | Some("Exact")) {
                    return Err(bad(
                        format!("{field}.method.type"),
                        "only Exact is supported",
                    ));
                }
                for (f, v) in [("service", &g.service), ("method", &g.method)] {
                    if let Some(v) = v {
                        check_len(&format!("{field}.method.{f}"), v, MAX_VALUE_LEN)?;
                    }
                }
                (g.service, g.method)
            }
            Some(MethodWire::Http(_)) => {
                return Err(bad(
                    format!("{field}.method"),
                    "expected service and method",
                ))
            }
        };
        return Ok(RouteMatch::Grpc(GrpcMatch {
            service,
            method,
            headers,
        }));
    }

    let path = match m.path {
        None => None,
        Some(p) => {
            let f = format!("{field}.path");
            let value = p.value.unwrap_or_else(|| "/".to_string());
            check_len(&f, &value, MAX_VALUE_LEN)?;
            Some(match p.type_.as_deref().unwrap_or("PathPrefix") {
                "Exact" | "PathPrefix" if !value.starts_with('/') => {
                    return Err(bad(f, format!("{value:?} does not start with /")))
                }
                "Exact" => PathMatch::Exact(value),
                "PathPrefix" => PathMatch::Prefix(value),
                "RegularExpression" => {
                    check_regex(&format!("{f}.value"), &value)?;
                    PathMatch::Regex(value)
                }
                other => {
                    return Err(bad(
                        format!("{f}.type"),
                        format!("unknown path match {other:?}"),
                    ))
                }
            })
        }
    };
    let query_params = m
        .query_params
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            value_match(&format!("{field}.queryParams[{i}]"), q, false)
                .map(|(name, value)| QueryParamMatch { name, value })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let method = match m.method {
        None => None,
        Some(MethodWire::Http(m)) => {
            const METHODS: &[&str] = &[
                "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
            ];
            if !METHODS.contains(&m.as_str()) {
                return Err(bad(
                    format!("{field}.method"),
                    format!("{m:?} is not an HTTP method"),
                ));
            }
            Some(m)
        }
        Some(MethodWire::Grpc(_)) => {
            return Err(bad(format!("{field}.method"), "expected an HTTP method"))
        }
    };
    Ok(RouteMatch::Http(HttpMatch {
        path,
        headers,
        query_params,
        method,
    }))
}

fn header_modifier(field: &str, m: HeaderModifierWire) -> Result<HeaderModifier, InvalidObject> {
    let pairs =
        |name: &str, list: Vec<HeaderValueWire>| -> Result<Vec<(String, String)>, InvalidObject> {
            check_count(&format!("{field}.{name}"), list.len(), MAX_HEADERS)?;
            list.into_iter()
                .enumerate()
                .map(|(i, h)| {
                    let f = format!("{field}.{name}[{i}]");
                    Ok((
                        header_name(&format!("{f}.name"), &h.name)?,
                        header_value(&format!("{f}.value"), &h.value)?,
                    ))
                })
                .collect()
        };
    check_count(&format!("{field}.remove"), m.remove.len(), MAX_HEADERS)?;
    Ok(HeaderModifier {
        add: pairs("add", m.add)?,
        set: pairs("set", m.set)?,
        remove: m
            .remove
            .iter()
            .enumerate()
            .map(|(i, n)| header_name(&format!("{field}.remove[{i}]"), n))
            .collect::<Result<_, _>>()?,
    })
}

fn filter(field: &str, f: FilterWire, api: RouteApi) -> Result<RouteFilter, InvalidObject> {
    let missing = |name: &str| InvalidObject::missing(format!("{field}.{name}"));
    match f.type_.as_str() {
        "RequestHeaderModifier" => Ok(RouteFilter::RequestHeaders(header_modifier(
            &format!("{field}.requestHeaderModifier"),
            f.request_header_modifier
                .ok_or_else(|| missing("requestHeaderModifier"))?,
        )?)),
        "ResponseHeaderModifier" if !api.is_grpc() => {
            Ok(RouteFilter::ResponseHeaders(header_modifier(
                &format!("{field}.responseHeaderModifier"),
                f.response_header_modifier
                    .ok_or_else(|| missing("responseHeaderModifier"))?,
            )?))
        }
        "RequestRedirect" if !api.is_grpc() => {
            let r = f
                .request_redirect
                .ok_or_else(|| missing("requestRedirect"))?;
            let rf = format!("{field}.requestRedirect");
            let scheme = match r.scheme.as_deref() {
                None => None,
                Some(s @ ("http" | "https")) => Some(s.to_string()),
                Some(s) => {
                    return Err(bad(
                        format!("{rf}.scheme"),
                        format!("{s:?} is not http or https"),
                    ))
                }
            };
            let path = match r.path {
                None => None,
                Some(p) => Some(match p.type_.as_str() {
                    "ReplaceFullPath" => {
                        PathModifier::Full(p.replace_full_path.ok_or_else(|| {
                            InvalidObject::missing(format!("{rf}.path.replaceFullPath"))
                        })?)
                    }
                    "ReplacePrefixMatch" => {
                        PathModifier::Prefix(p.replace_prefix_match.ok_or_else(|| {
                            InvalidObject::missing(format!("{rf}.path.replacePrefixMatch"))
                        })?)
                    }
                    other => {
                        return Err(bad(format!("{rf}.path.type"), format!("unknown {other:?}")))
                    }
                }),
            };
            if let Some(PathModifier::Full(p) | PathModifier::Prefix(p)) = &path {
                check_len(&format!("{rf}.path"), p, MAX_VALUE_LEN)?;
            }
            let status = match r.status_code.unwrap_or(302) {
                s @ (301 | 302) => s as u16,
                s => {
                    return Err(bad(
                        format!("{rf}.statusCode"),
                        format!("{s} is not 301 or 302"),
                    ))
                }
            };
            if let Some(h) = &r.hostname {
                check_len(&format!("{rf}.hostname"), h, 253)?;
            }
            Ok(RouteFilter::Redirect(Redirect {
                scheme,
                hostname: r.hostname,
                path,
                port: r.port.map(|n| port(&format!("{rf}.port"), n)).transpose()?,
                status,
            }))
        }
        other => Err(bad(
            format!("{field}.type"),
            format!("filter {other:?} is not supported on a {}", api.kind()),
        )),
    }
}

fn annotation_timeouts(annotations: &super::Labels) -> Result<RouteTimeouts, InvalidObject> {
    let get = |name: &str| {
        annotations
            .get(name)
            .map(|v| parse_annotation_duration(&format!("metadata.annotations[{name}]"), v))
            .transpose()
            .map(|d| d.filter(|d| !d.is_zero()))
    };
    Ok(RouteTimeouts {
        request: get(TIMEOUT_REQUEST_ANNOTATION)?,
        response: get(TIMEOUT_RESPONSE_ANNOTATION)?,
        idle: get(TIMEOUT_IDLE_ANNOTATION)?,
    })
}

/// Linkerd's retry annotations: `retry.linkerd.io/http` (`5xx`,
/// `gateway-error`, a code, or a range `500-504`, comma-separated) or
/// `retry.linkerd.io/grpc` (code names), `retry.linkerd.io/limit` (default
/// 1) and `retry.linkerd.io/timeout` (per try).
fn annotation_retry(
    annotations: &super::Labels,
    api: RouteApi,
) -> Result<Option<RouteRetry>, InvalidObject> {
    let field = |name: &str| format!("metadata.annotations[{name}]");
    let limit = annotations
        .get(RETRY_LIMIT_ANNOTATION)
        .map(|v| {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= MAX_RETRY_LIMIT)
                .ok_or_else(|| {
                    bad(
                        field(RETRY_LIMIT_ANNOTATION),
                        format!("{v:?} is not a number in 0..={MAX_RETRY_LIMIT}"),
                    )
                })
        })
        .transpose()?;
    let timeout = annotations
        .get(RETRY_TIMEOUT_ANNOTATION)
        .map(|v| parse_annotation_duration(&field(RETRY_TIMEOUT_ANNOTATION), v))
        .transpose()?
        .filter(|d| !d.is_zero());
    let mut http_statuses = Vec::new();
    let mut grpc_codes = Vec::new();
    let conditions = if api.is_grpc() {
        annotations.get(RETRY_GRPC_ANNOTATION).map(|v| {
            for c in v.split(',').map(str::trim) {
                grpc_codes.push(match c.to_ascii_lowercase().as_str() {
                    "cancelled" => GrpcRetryCode::Cancelled,
                    "deadline-exceeded" => GrpcRetryCode::DeadlineExceeded,
                    "resource-exhausted" => GrpcRetryCode::ResourceExhausted,
                    "internal" => GrpcRetryCode::Internal,
                    "unavailable" => GrpcRetryCode::Unavailable,
                    _ => {
                        return Err(bad(
                            field(RETRY_GRPC_ANNOTATION),
                            format!("{c:?} is not a retryable gRPC code"),
                        ))
                    }
                });
            }
            Ok(())
        })
    } else {
        annotations.get(RETRY_HTTP_ANNOTATION).map(|v| {
            for c in v.split(',').map(str::trim) {
                http_statuses.push(http_condition(c).ok_or_else(|| {
                    bad(
                        field(RETRY_HTTP_ANNOTATION),
                        format!("{c:?} is not 5xx, gateway-error, a status or a range"),
                    )
                })?);
            }
            Ok(())
        })
    };
    let conditions = conditions.transpose()?.is_some();
    if limit.is_none() && timeout.is_none() && !conditions {
        return Ok(None);
    }
    if !conditions {
        // Linkerd's default conditions: 5xx for HTTP, none for gRPC.
        if !api.is_grpc() {
            http_statuses.push((500, 599));
        }
    }
    Ok(Some(RouteRetry {
        limit: limit.unwrap_or(1),
        timeout,
        http_statuses,
        grpc_codes,
    }))
}

fn http_condition(c: &str) -> Option<(u16, u16)> {
    let code = |s: &str| {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|c| (100..600).contains(c))
    };
    if c.eq_ignore_ascii_case("5xx") {
        return Some((500, 599));
    }
    if c.eq_ignore_ascii_case("gateway-error") {
        return Some((502, 504));
    }
    if let Some(c) = code(c) {
        return Some((c, c));
    }
    let (start, end) = c.split_once('-')?;
    let (start, end) = (code(start)?, code(end)?);
    (start <= end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: serde_json::Value) -> Result<Route, InvalidObject> {
        let w: RouteWire = serde_json::from_value(v).expect("wire");
        Route::try_from(w)
    }

    fn route(rules: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": rules}
        })
    }

    #[test]
    fn a_split_route_decodes_with_its_parent_backends_and_timeouts() {
        let r = decode(route(json!([{
            "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                         "headers": [{"name": "X-Canary", "value": "1"}], "method": "GET"}],
            "backendRefs": [{"name": "web-v1", "port": 80, "weight": 90},
                            {"name": "web-v2", "port": 80, "weight": 10}],
            "timeouts": {"request": "1s", "backendRequest": "500ms"}
        }])))
        .unwrap();
        assert_eq!(r.api, RouteApi::GatewayHttp);
        assert_eq!(r.parents[0].kind, ParentKind::Service);
        assert_eq!(r.parents[0].key, ObjectKey::new("ns", "web"));
        assert_eq!(r.parents[0].port, Some(80));
        let rule = &r.rules[0];
        assert_eq!(
            rule.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
            [90, 10]
        );
        assert_eq!(rule.timeouts.request, Some(Duration::from_secs(1)));
        assert_eq!(rule.timeouts.response, Some(Duration::from_millis(500)));
        let RouteMatch::Http(m) = &rule.matches[0] else {
            panic!("http match")
        };
        assert_eq!(m.path, Some(PathMatch::Prefix("/api".into())));
        assert_eq!(m.headers[0].name, "x-canary");
        assert_eq!(m.method.as_deref(), Some("GET"));
    }

    #[test]
    fn invalid_routes_name_the_field() {
        let cases = [
            (
                json!([{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}]),
                "spec.rules[0].matches[0].path.value",
            ),
            (
                json!([{"backendRefs": [{"name": "a", "weight": 0}, {"name": "b", "weight": 0}]}]),
                "spec.rules[0].backendRefs",
            ),
            (
                json!([{"filters": [{"type": "URLRewrite"}]}]),
                "spec.rules[0].filters[0].type",
            ),
            (
                json!([{"matches": [{"headers": [{"name": "bad header", "value": "x"}]}]}]),
                "spec.rules[0].matches[0].headers[0].name",
            ),
            (
                json!([{"backendRefs": [{"name": "a", "weight": -1}]}]),
                "spec.rules[0].backendRefs[0].weight",
            ),
            (
                json!([{"timeouts": {"request": "soon"}}]),
                "spec.rules[0].timeouts.request",
            ),
        ];
        for (rules, field) in cases {
            let err = decode(route(rules.clone())).expect_err(&rules.to_string());
            assert_eq!(err.field, field, "{rules}: {err}");
        }
        let many: Vec<_> = (0..MAX_RULES + 1).map(|_| json!({})).collect();
        assert_eq!(decode(route(json!(many))).unwrap_err().field, "spec.rules");
    }

    #[test]
    fn retry_and_timeout_annotations_apply_to_every_rule() {
        let mut v = route(json!([{}, {"timeouts": {"request": "5s"}}]));
        v["metadata"]["annotations"] = json!({
            "retry.linkerd.io/http": "5xx,429",
            "retry.linkerd.io/limit": "3",
            "timeout.linkerd.io/request": "2s"
        });
        let r = decode(v).unwrap();
        for rule in &r.rules {
            let retry = rule.retry.as_ref().expect("retry");
            assert_eq!(retry.limit, 3);
            assert_eq!(retry.http_statuses, [(500, 599), (429, 429)]);
            // The annotation wins over the rule's own timeout, as in Linkerd.
            assert_eq!(rule.timeouts.request, Some(Duration::from_secs(2)));
        }
        let mut v = route(json!([{}]));
        v["metadata"]["annotations"] = json!({"retry.linkerd.io/limit": "99"});
        assert!(decode(v).is_err());
    }

    #[test]
    fn grpc_routes_match_by_service_and_method() {
        let r = decode(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"parentRefs": [{"kind": "Service", "group": "", "name": "api"}],
                     "rules": [{"matches": [{"method": {"service": "pkg.Svc", "method": "Get"}}],
                                "backendRefs": [{"name": "api", "port": 8080}]}]}
        }))
        .unwrap();
        assert_eq!(r.api, RouteApi::GatewayGrpc);
        let RouteMatch::Grpc(m) = &r.rules[0].matches[0] else {
            panic!("grpc match")
        };
        assert_eq!(m.service.as_deref(), Some("pkg.Svc"));
        assert_eq!(m.method.as_deref(), Some("Get"));
    }

    #[test]
    fn gateway_parents_are_not_the_meshs() {
        let mut v = route(json!([{}]));
        v["spec"]["parentRefs"] = json!([{"name": "ingress"}, {"group": "policy.linkerd.io", "kind": "Server", "name": "srv"}]);
        let r = decode(v).unwrap();
        assert_eq!(r.parents.len(), 1);
        assert_eq!(r.parents[0].kind, ParentKind::Server);
    }
}
