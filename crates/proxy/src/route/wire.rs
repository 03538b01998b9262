//! Route matches read from the controller's messages. The inbound and
//! outbound APIs share these match types, so both sides read them here, with
//! the same checks and the same bounds on every regex.

use super::{GrpcMatch, HeaderMatch, HostMatch, HttpMatch, PathMatch, Pattern, QueryMatch};
use http::{HeaderName, HeaderValue, Method};
use linkerd2_proxy_api::{grpc_route as grpc_api, http_route as api};

/// Longest regex the proxy compiles (bounds the compiled size).
pub const MAX_REGEX_BYTES: usize = 1024;
/// Most regexes one policy (an outbound target's, or an inbound port's) may
/// hold, and the memory each may use compiled and while matching: together
/// at most about 6 MiB a policy, whatever a controller sends.
pub const MAX_REGEXES_PER_POLICY: usize = 64;
const REGEX_COMPILED_BYTES: usize = 32 * 1024;
const REGEX_MATCH_CACHE_BYTES: usize = 64 * 1024;

/// Why a route match cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMatch {
    #[error("invalid regex: {0}")]
    Regex(String),
    #[error("invalid header name or value in a header match")]
    Header,
    #[error("invalid method")]
    Method,
    #[error("a route match lacks its {0}")]
    Missing(&'static str),
}

/// Compiles a regex from a policy within the bounds above.
pub fn regex(s: &str) -> Result<Pattern, InvalidMatch> {
    if s.len() > MAX_REGEX_BYTES {
        return Err(InvalidMatch::Regex(format!("over {MAX_REGEX_BYTES} bytes")));
    }
    regex::RegexBuilder::new(s)
        .size_limit(REGEX_COMPILED_BYTES)
        .dfa_size_limit(REGEX_MATCH_CACHE_BYTES)
        .build()
        .map(Pattern::from)
        .map_err(|e| InvalidMatch::Regex(e.to_string().chars().take(128).collect()))
}

pub fn host_match(h: api::HostMatch) -> Result<HostMatch, InvalidMatch> {
    match h.r#match.ok_or(InvalidMatch::Missing("host"))? {
        api::host_match::Match::Exact(e) => Ok(HostMatch::Exact(e)),
        api::host_match::Match::Suffix(s) => Ok(HostMatch::Suffix(s.reverse_labels)),
    }
}

pub fn header_match(h: api::HeaderMatch) -> Result<HeaderMatch, InvalidMatch> {
    let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| InvalidMatch::Header)?;
    match h.value.ok_or(InvalidMatch::Missing("header value"))? {
        api::header_match::Value::Exact(v) => Ok(HeaderMatch::Exact(
            name,
            HeaderValue::from_bytes(&v).map_err(|_| InvalidMatch::Header)?,
        )),
        api::header_match::Value::Regex(re) => Ok(HeaderMatch::Regex(name, regex(&re)?)),
    }
}

pub fn http_match(m: api::HttpRouteMatch) -> Result<HttpMatch, InvalidMatch> {
    let path = m
        .path
        .map(|p| match p.kind.ok_or(InvalidMatch::Missing("path"))? {
            api::path_match::Kind::Exact(e) => Ok(PathMatch::Exact(e)),
            api::path_match::Kind::Prefix(p) => Ok(PathMatch::Prefix(p)),
            api::path_match::Kind::Regex(r) => Ok(PathMatch::Regex(regex(&r)?)),
        })
        .transpose()?;
    let headers = m
        .headers
        .into_iter()
        .map(header_match)
        .collect::<Result<_, _>>()?;
    let query = m
        .query_params
        .into_iter()
        .map(|q| {
            if q.name.is_empty() {
                return Err(InvalidMatch::Missing("query parameter name"));
            }
            match q
                .value
                .ok_or(InvalidMatch::Missing("query parameter value"))?
            {
                api::query_param_match::Value::Exact(v) => Ok(QueryMatch::Exact(q.name, v)),
                api::query_param_match::Value::Regex(r) => {
                    Ok(QueryMatch::Regex(q.name, regex(&r)?))
                }
            }
        })
        .collect::<Result<_, _>>()?;
    let method = m
        .method
        .map(Method::try_from)
        .transpose()
        .map_err(|_| InvalidMatch::Method)?;
    Ok(HttpMatch {
        path,
        headers,
        query,
        method,
    })
}

/// A gRPC match. No `rpc` matches every RPC: Linkerd's controller sends
/// none for a GRPCRoute match that names only headers (Linkerd's proxy
/// refuses such a match; Ballast's takes it as the route means).
pub fn grpc_match(m: grpc_api::GrpcRouteMatch) -> Result<GrpcMatch, InvalidMatch> {
    let rpc = m.rpc.unwrap_or_default();
    Ok(GrpcMatch {
        service: (!rpc.service.is_empty()).then_some(rpc.service),
        method: (!rpc.method.is_empty()).then_some(rpc.method),
        headers: m
            .headers
            .into_iter()
            .map(header_match)
            .collect::<Result<_, _>>()?,
    })
}

/// Regexes among header matches (counted before any is compiled).
pub fn regexes_in_headers(headers: &[api::HeaderMatch]) -> usize {
    headers
        .iter()
        .filter(|h| matches!(h.value, Some(api::header_match::Value::Regex(_))))
        .count()
}

/// Regexes an HTTP match asks for (counted before any is compiled).
pub fn regexes_in_http(m: &api::HttpRouteMatch) -> usize {
    usize::from(matches!(
        m.path.as_ref().and_then(|p| p.kind.as_ref()),
        Some(api::path_match::Kind::Regex(_))
    )) + regexes_in_headers(&m.headers)
        + m.query_params
            .iter()
            .filter(|q| matches!(q.value, Some(api::query_param_match::Value::Regex(_))))
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexes_are_bounded_and_errors_name_what_is_wrong() {
        assert!(regex("[0-9]+").is_ok());
        assert!(matches!(regex("("), Err(InvalidMatch::Regex(_))));
        let long = "a".repeat(MAX_REGEX_BYTES + 1);
        assert!(matches!(regex(&long), Err(InvalidMatch::Regex(e)) if e.contains("over")));
        // Small text, huge automaton: refused by the compiled-size bound.
        assert!(matches!(regex(r"\w{1000}"), Err(InvalidMatch::Regex(_))));
        assert_eq!(
            host_match(api::HostMatch { r#match: None }),
            Err(InvalidMatch::Missing("host"))
        );
        let header = |name: &str, value| api::HeaderMatch {
            name: name.into(),
            value,
        };
        assert_eq!(
            header_match(header(
                "bad name",
                Some(api::header_match::Value::Exact(b"1".to_vec()))
            )),
            Err(InvalidMatch::Header)
        );
        assert_eq!(
            header_match(header("x-a", None)),
            Err(InvalidMatch::Missing("header value"))
        );
        let m = api::HttpRouteMatch {
            method: Some(linkerd2_proxy_api::http_types::HttpMethod {
                r#type: Some(
                    linkerd2_proxy_api::http_types::http_method::Type::Unregistered(
                        "BAD METHOD".into(),
                    ),
                ),
            }),
            ..Default::default()
        };
        assert_eq!(http_match(m), Err(InvalidMatch::Method));
    }

    #[test]
    fn regexes_are_counted_before_compiling() {
        let re = |s: &str| api::HeaderMatch {
            name: "x-a".into(),
            value: Some(api::header_match::Value::Regex(s.into())),
        };
        let m = api::HttpRouteMatch {
            path: Some(api::PathMatch {
                kind: Some(api::path_match::Kind::Regex("(".into())),
            }),
            headers: vec![
                re("a"),
                api::HeaderMatch {
                    name: "x-b".into(),
                    value: Some(api::header_match::Value::Exact(b"1".to_vec())),
                },
            ],
            query_params: vec![api::QueryParamMatch {
                name: "q".into(),
                value: Some(api::query_param_match::Value::Regex("b".into())),
            }],
            method: None,
        };
        assert_eq!(regexes_in_http(&m), 3);
        assert_eq!(regexes_in_headers(&[re("a"), re("b")]), 2);
    }

    #[test]
    fn a_grpc_match_without_an_rpc_matches_every_rpc() {
        let m = grpc_match(grpc_api::GrpcRouteMatch {
            rpc: None,
            headers: vec![],
        })
        .expect("readable");
        assert_eq!(m, GrpcMatch::default());
        let m = grpc_match(grpc_api::GrpcRouteMatch {
            rpc: Some(grpc_api::GrpcRpcMatch {
                service: "pkg.Svc".into(),
                method: String::new(),
            }),
            headers: vec![],
        })
        .expect("readable");
        assert_eq!(m.service.as_deref(), Some("pkg.Svc"));
        assert_eq!(m.method, None);
    }
}
