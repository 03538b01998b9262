//! Which route and rule of a policy a request takes, inbound and outbound
//! alike, with Gateway API precedence as Linkerd's proxy applies it: among
//! the routes whose hosts match, the best host match (exact over wildcard,
//! then longer); within a route, the rule with the best match: the longest
//! path match, then more header matches, then more query parameter
//! matches, then a method match. A tie goes to the earlier route or rule
//! (the controller orders them). One refinement over Linkerd: at equal
//! length an exact path beats a prefix, and a prefix a regex (Linkerd
//! counts length only, so the earlier rule wins), as Gateway API asks.
//!
//! Regular expressions must match the whole value, as in Linkerd.
//!
//! Pure: requests' heads in, an index out; no IO, no runtime. The proxy
//! turns the policies' protobuf into these types (its `route::wire`).

#![forbid(unsafe_code)]

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use regex::Regex;
use std::cmp::Ordering;

/// A compiled regex from a policy, compared by its text (so that policies
/// compare equal when the controller sends the same one again).
#[derive(Clone, Debug)]
pub struct Pattern(Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

impl From<Regex> for Pattern {
    fn from(re: Regex) -> Self {
        Self(re)
    }
}

impl Pattern {
    /// Linkerd's rule: the leftmost match must span the whole value.
    pub fn is_whole(&self, s: &str) -> bool {
        self.0
            .find(s)
            .is_some_and(|m| m.start() == 0 && m.end() == s.len())
    }
}

/// A route: its hostnames (none: any), and its rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route<M, P> {
    pub hosts: Vec<HostMatch>,
    pub rules: Vec<Rule<M, P>>,
}

/// A rule: its matches (none: every request), and what it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule<M, P> {
    pub matches: Vec<M>,
    pub policy: P,
}

/// A match of some kind of request, summarised for ranking.
pub trait Match {
    type Summary: Ord + Default;
    fn summarize<B>(&self, req: &Request<B>) -> Option<Self::Summary>;
}

/// The route `req` takes (its index), how its rule matched, and the rule's
/// policy; `None` when no route matches. `host` is the request's
/// ([`request_host`]), read once by the caller.
pub fn find<'r, M: Match, P, B>(
    routes: &'r [Route<M, P>],
    req: &Request<B>,
    host: Option<&str>,
) -> Option<(usize, M::Summary, &'r P)> {
    best(routes.iter().enumerate().filter_map(|(i, route)| {
        let host_match = if route.hosts.is_empty() {
            None
        } else {
            let host = host?;
            Some(route.hosts.iter().filter_map(|h| h.summarize(host)).max()?)
        };
        let (summary, policy) = best(route.rules.iter().filter_map(|rule| {
            if rule.matches.is_empty() {
                return Some((M::Summary::default(), &rule.policy));
            }
            let s = rule.matches.iter().filter_map(|m| m.summarize(req)).max()?;
            Some((s, &rule.policy))
        }))?;
        Some(((host_match, summary), (i, policy)))
    }))
    .map(|((_, summary), (i, policy))| (i, summary, policy))
}

/// The first of the greatest.
fn best<S: Ord, T>(items: impl Iterator<Item = (S, T)>) -> Option<(S, T)> {
    items.reduce(|a, b| if a.0 >= b.0 { a } else { b })
}

/// The host a request names (`:authority`, else `Host`), without its port;
/// an IPv6 literal keeps its brackets, as in a URI. Both sides' route
/// matching reads it.
pub fn request_host<B>(req: &Request<B>) -> Option<&str> {
    if let Some(a) = req.uri().authority() {
        return Some(a.host());
    }
    let host = req.headers().get(http::header::HOST)?.to_str().ok()?;
    // By bytes: a `char` search costs more than the rest of the request's
    // routing.
    Some(match host.bytes().rposition(|b| b == b':') {
        Some(i) if i > 0 && host.as_bytes()[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    })
}

/// A route hostname: exact, or a wildcard (`*.example.com`) held as its
/// labels reversed (`["com", "example"]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    Suffix(Vec<String>),
}

/// How well a host matched: exact beats any wildcard; longer beats shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRank {
    Suffix(usize),
    Exact(usize),
}

impl PartialOrd for HostRank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HostRank {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Exact(a), Self::Exact(b)) | (Self::Suffix(a), Self::Suffix(b)) => a.cmp(b),
            (Self::Exact(_), Self::Suffix(_)) => Ordering::Greater,
            (Self::Suffix(_), Self::Exact(_)) => Ordering::Less,
        }
    }
}

impl HostMatch {
    pub fn summarize(&self, host: &str) -> Option<HostRank> {
        match self {
            Self::Exact(h) => {
                let host = if h.ends_with('.') {
                    host
                } else {
                    host.strip_suffix('.').unwrap_or(host)
                };
                h.eq_ignore_ascii_case(host)
                    .then_some(HostRank::Exact(h.len()))
            }
            Self::Suffix(labels) => {
                let mut host = if labels.first().map(String::as_str) == Some("") {
                    host
                } else {
                    host.strip_suffix('.').unwrap_or(host)
                };
                let mut length = 0;
                for label in labels {
                    let cut = host.len().checked_sub(label.len())?;
                    let (head, tail) = host.split_at_checked(cut)?;
                    if !tail.eq_ignore_ascii_case(label) {
                        return None;
                    }
                    host = head.strip_suffix('.')?;
                    length += label.len() + 1;
                }
                Some(HostRank::Suffix(length))
            }
        }
    }
}

/// A path match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    /// Matches the whole path.
    Regex(Pattern),
}

/// How well a path matched: by length, then exact over prefix over regex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PathRank {
    len: usize,
    kind: PathKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PathKind {
    Regex,
    Prefix,
    Exact,
}

impl Default for PathRank {
    /// What no path match counts as: the prefix `/`.
    fn default() -> Self {
        Self {
            len: 1,
            kind: PathKind::Prefix,
        }
    }
}

impl PathMatch {
    pub fn summarize(&self, path: &str) -> Option<PathRank> {
        match self {
            Self::Exact(p) => (p == path).then_some(PathRank {
                len: p.len(),
                kind: PathKind::Exact,
            }),
            Self::Regex(re) => re.is_whole(path).then_some(PathRank {
                len: path.len(),
                kind: PathKind::Regex,
            }),
            Self::Prefix(prefix) => {
                if prefix == "/" {
                    return Some(PathRank::default());
                }
                // Whole segments only: `/foo` matches `/foo/bar`, not `/foobar`.
                let prefix = prefix.trim_end_matches('/');
                let rest = path.trim_end_matches('/').strip_prefix(prefix)?;
                (rest.is_empty() || rest.starts_with('/')).then_some(PathRank {
                    len: prefix.len(),
                    kind: PathKind::Prefix,
                })
            }
        }
    }
}

/// A header match: any value of the header matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderMatch {
    Exact(HeaderName, HeaderValue),
    Regex(HeaderName, Pattern),
}

impl HeaderMatch {
    pub fn is_match(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Exact(n, v) => headers.get_all(n).iter().any(|h| h == v),
            Self::Regex(n, re) => headers
                .get_all(n)
                .iter()
                .filter_map(|h| h.to_str().ok())
                .any(|h| re.is_whole(h)),
        }
    }
}

/// A query parameter match: any occurrence of the parameter matches,
/// compared decoded (as Linkerd does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryMatch {
    Exact(String, String),
    Regex(String, Pattern),
}

impl QueryMatch {
    pub fn is_match(&self, query: Option<&str>) -> bool {
        let Some(query) = query else { return false };
        form_urlencoded::parse(query.as_bytes()).any(|(name, value)| match self {
            Self::Exact(n, v) => *n == *name && *v == *value,
            Self::Regex(n, re) => *n == *name && re.is_whole(&value),
        })
    }
}

/// An HTTP route's match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<HeaderMatch>,
    pub query: Vec<QueryMatch>,
    pub method: Option<Method>,
}

/// How well an HTTP match matched, in precedence order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct HttpRank {
    path: PathRank,
    headers: usize,
    query: usize,
    method: bool,
}

impl HttpRank {
    /// The length of the path prefix the rule matched, when it matched by
    /// prefix (a redirect may replace it).
    pub fn prefix_len(&self) -> Option<usize> {
        (self.path.kind == PathKind::Prefix).then_some(self.path.len)
    }
}

impl Match for HttpMatch {
    type Summary = HttpRank;

    fn summarize<B>(&self, req: &Request<B>) -> Option<HttpRank> {
        let mut rank = HttpRank::default();
        if let Some(method) = &self.method {
            if req.method() != method {
                return None;
            }
            rank.method = true;
        }
        if let Some(path) = &self.path {
            rank.path = path.summarize(req.uri().path())?;
        }
        if !self.headers.iter().all(|h| h.is_match(req.headers())) {
            return None;
        }
        rank.headers = self.headers.len();
        let query = req.uri().query();
        if !self.query.iter().all(|q| q.is_match(query)) {
            return None;
        }
        rank.query = self.query.len();
        Some(rank)
    }
}

/// A gRPC route's match: `/SERVICE/METHOD`, either part optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcMatch {
    pub service: Option<String>,
    pub method: Option<String>,
    pub headers: Vec<HeaderMatch>,
}

/// How well a gRPC match matched: service, then method, then headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GrpcRank {
    service: usize,
    method: usize,
    headers: usize,
}

impl Match for GrpcMatch {
    type Summary = GrpcRank;

    fn summarize<B>(&self, req: &Request<B>) -> Option<GrpcRank> {
        if req.method() != Method::POST {
            return None;
        }
        let mut parts = req.uri().path().split('/');
        if !parts.next()?.is_empty() {
            return None;
        }
        let (service, method) = (parts.next()?, parts.next()?);
        let mut rank = GrpcRank::default();
        if let Some(s) = &self.service {
            if s != service {
                return None;
            }
            rank.service = s.len();
        }
        if let Some(m) = &self.method {
            if m != method {
                return None;
            }
            rank.method = m.len();
        }
        if !self.headers.iter().all(|h| h.is_match(req.headers())) {
            return None;
        }
        rank.headers = self.headers.len();
        Some(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str, headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut r = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            r = r.header(*n, *v);
        }
        r.body(()).expect("request")
    }

    fn rule(matches: Vec<HttpMatch>, name: &'static str) -> Rule<HttpMatch, &'static str> {
        Rule {
            matches,
            policy: name,
        }
    }

    fn route(rules: Vec<Rule<HttpMatch, &'static str>>) -> Route<HttpMatch, &'static str> {
        Route {
            hosts: vec![],
            rules,
        }
    }

    fn path(p: PathMatch) -> HttpMatch {
        HttpMatch {
            path: Some(p),
            ..HttpMatch::default()
        }
    }

    fn taken(routes: &[Route<HttpMatch, &'static str>], r: &Request<()>) -> Option<&'static str> {
        find(routes, r, request_host(r)).map(|(_, _, p)| *p)
    }

    fn exact(h: &'static str, v: &'static str) -> HeaderMatch {
        HeaderMatch::Exact(HeaderName::from_static(h), HeaderValue::from_static(v))
    }

    #[test]
    fn precedence_follows_the_gateway_api_as_linkerd_applies_it() {
        let re = |s: &str| PathMatch::Regex(Regex::new(s).expect("regex").into());
        let routes = [route(vec![
            rule(vec![path(PathMatch::Prefix("/".into()))], "root"),
            rule(vec![path(PathMatch::Prefix("/api".into()))], "api"),
            rule(vec![path(PathMatch::Prefix("/api/v1".into()))], "v1"),
            rule(
                vec![path(PathMatch::Exact("/api/v1/users".into()))],
                "users-exact",
            ),
            rule(
                vec![path(PathMatch::Prefix("/api/v1/users".into()))],
                "users-prefix",
            ),
            rule(vec![path(re(r"/api/v1/users/\d+"))], "user-id"),
            rule(vec![path(re(r"/api/v[0-9]+"))], "api-version"),
            rule(
                vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/api".into())),
                    headers: vec![exact("x-canary", "1")],
                    ..HttpMatch::default()
                }],
                "api-canary",
            ),
            rule(
                vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/api".into())),
                    headers: vec![exact("x-canary", "1"), exact("x-team", "a")],
                    ..HttpMatch::default()
                }],
                "api-canary-team",
            ),
            rule(
                vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/api".into())),
                    query: vec![QueryMatch::Exact("debug".into(), "1".into())],
                    ..HttpMatch::default()
                }],
                "api-debug",
            ),
            rule(
                vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/api".into())),
                    method: Some(Method::DELETE),
                    ..HttpMatch::default()
                }],
                "api-delete",
            ),
        ])];
        type Case<'a> = (
            &'a str,
            &'a str,
            &'a [(&'static str, &'static str)],
            &'a str,
        );
        let table: &[Case] = &[
            ("GET", "/", &[], "root"),
            ("GET", "/apis", &[], "root"),
            ("GET", "/api", &[], "api"),
            ("GET", "/api/", &[], "api"),
            // A regex matching a longer path beats a shorter prefix; at
            // equal length the prefix wins.
            ("GET", "/api/v2", &[], "api-version"),
            ("GET", "/api/v1", &[], "v1"),
            ("GET", "/api/v1/", &[], "v1"),
            // Exact, prefix and regex of the same length: exact first.
            ("GET", "/api/v1/users", &[], "users-exact"),
            ("GET", "/api/v1/users/", &[], "users-prefix"),
            // The regex matched the whole, longer path.
            ("GET", "/api/v1/users/42", &[], "user-id"),
            ("GET", "/api/v1/users/4x", &[], "users-prefix"),
            // Path length first, then headers, query, method.
            ("GET", "/apix", &[("x-canary", "1")], "root"),
            ("GET", "/api/x", &[("x-canary", "1")], "api-canary"),
            ("GET", "/api", &[("x-canary", "1")], "api-canary"),
            (
                "GET",
                "/api",
                &[("x-canary", "1"), ("x-team", "a")],
                "api-canary-team",
            ),
            ("GET", "/api", &[("x-canary", "2")], "api"),
            ("GET", "/api?debug=1", &[("x-canary", "1")], "api-canary"),
            ("GET", "/api?debug=1", &[], "api-debug"),
            ("DELETE", "/api?debug=1", &[], "api-debug"),
            ("DELETE", "/api", &[], "api-delete"),
        ];
        for (method, uri, headers, want) in table {
            assert_eq!(
                taken(&routes, &req(method, uri, headers)),
                Some(*want),
                "{method} {uri} {headers:?}"
            );
        }
    }

    #[test]
    fn a_tie_goes_to_the_first_and_no_match_finds_nothing() {
        let routes = [
            route(vec![rule(
                vec![path(PathMatch::Prefix("/a".into()))],
                "first",
            )]),
            route(vec![rule(
                vec![path(PathMatch::Prefix("/a".into()))],
                "second",
            )]),
        ];
        assert_eq!(taken(&routes, &req("GET", "/a/b", &[])), Some("first"));
        assert_eq!(taken(&routes, &req("GET", "/b", &[])), None);
        // A rule without matches takes everything, ranked as the prefix `/`.
        let routes = [route(vec![
            rule(vec![], "any"),
            rule(vec![path(PathMatch::Prefix("/b".into()))], "b"),
        ])];
        assert_eq!(taken(&routes, &req("GET", "/x", &[])), Some("any"));
        assert_eq!(taken(&routes, &req("GET", "/b", &[])), Some("b"));
    }

    #[test]
    fn hosts_rank_exact_over_wildcard_and_longer_over_shorter() {
        let host_route = |hosts: Vec<HostMatch>, name| Route {
            hosts,
            rules: vec![rule(vec![], name)],
        };
        let suffix = |s: &str| HostMatch::Suffix(s.split('.').rev().map(String::from).collect());
        let routes = [
            host_route(vec![suffix("example.com")], "wild"),
            host_route(vec![suffix("api.example.com")], "wild-api"),
            host_route(vec![HostMatch::Exact("api.example.com".into())], "exact"),
            host_route(vec![], "any"),
        ];
        let with_host = |h: &'static str| req("GET", "/", &[("host", h)]);
        assert_eq!(taken(&routes, &with_host("api.example.com")), Some("exact"));
        assert_eq!(
            taken(&routes, &with_host("API.example.com.:8080")),
            Some("exact")
        );
        assert_eq!(
            taken(&routes, &with_host("v1.api.example.com")),
            Some("wild-api")
        );
        assert_eq!(taken(&routes, &with_host("www.example.com")), Some("wild"));
        // `*.example.com` is not `example.com`.
        assert_eq!(taken(&routes, &with_host("example.com")), Some("any"));
        assert_eq!(
            taken(&routes, &req("GET", "http://other.org/", &[])),
            Some("any")
        );
        let only_hosts = [host_route(vec![HostMatch::Exact("a.b".into())], "a")];
        assert_eq!(
            taken(&only_hosts, &req("GET", "/", &[])),
            None,
            "no host, no match"
        );
    }

    #[test]
    fn header_and_query_matches_take_any_value_and_regexes_the_whole() {
        let re = HeaderMatch::Regex(
            HeaderName::from_static("x-v"),
            Regex::new("v[0-9]").expect("regex").into(),
        );
        let mut h = HeaderMap::new();
        h.append("x-v", HeaderValue::from_static("beta"));
        h.append("x-v", HeaderValue::from_static("v2"));
        assert!(re.is_match(&h));
        let mut h = HeaderMap::new();
        h.append("x-v", HeaderValue::from_static("v22"));
        assert!(!re.is_match(&h), "a regex matches whole values");

        let q = QueryMatch::Exact("a".into(), "b c".into());
        assert!(q.is_match(Some("x=1&a=b%20c")));
        assert!(q.is_match(Some("a=b+c")));
        assert!(!q.is_match(Some("a=b")));
        assert!(!q.is_match(None));
        let q = QueryMatch::Regex("a".into(), Regex::new("[0-9]+").expect("regex").into());
        assert!(q.is_match(Some("a=x&a=12")));
        assert!(!q.is_match(Some("a=12x")));
    }

    #[test]
    fn grpc_matches_rank_service_then_method_then_headers() {
        let grpc = |service: Option<&str>, method: Option<&str>, headers| GrpcMatch {
            service: service.map(String::from),
            method: method.map(String::from),
            headers,
        };
        let r = |m, name| Rule {
            matches: vec![m],
            policy: name,
        };
        let routes = [Route {
            hosts: vec![],
            rules: vec![
                r(grpc(None, None, vec![]), "any"),
                r(grpc(Some("pkg.Svc"), None, vec![]), "svc"),
                r(grpc(Some("pkg.Svc"), Some("Get"), vec![]), "get"),
                r(
                    grpc(Some("pkg.Svc"), None, vec![exact("x-a", "1")]),
                    "svc-a",
                ),
            ],
        }];
        let call = |path: &str, headers| req("POST", path, headers);
        let taken = |r: &Request<()>| find(&routes, r, request_host(r)).map(|(_, _, p)| *p);
        assert_eq!(taken(&call("/pkg.Svc/Get", &[])), Some("get"));
        assert_eq!(taken(&call("/pkg.Svc/Put", &[])), Some("svc"));
        assert_eq!(taken(&call("/pkg.Svc/Put", &[("x-a", "1")])), Some("svc-a"));
        assert_eq!(taken(&call("/pkg.Svc/Get", &[("x-a", "1")])), Some("get"));
        assert_eq!(taken(&call("/other.Svc/Get", &[])), Some("any"));
        assert_eq!(
            taken(&req("GET", "/pkg.Svc/Get", &[])),
            None,
            "gRPC is POST"
        );
    }
}
