//! `/api/tap` queries: what to tap (`target`), which requests (`to`,
//! `method`, `path`, `authority`), how many (`max_rps`, `limit`), and the
//! `ObserveRequest.match` tree sent to each tapped proxy.

use std::net::IpAddr;

use ballast_vizcore::targets::PodTarget;
use linkerd2_proxy_api::http_types::HttpMethod;
use linkerd2_proxy_api::net::IpAddress;
use linkerd2_proxy_api::tap::observe_request::r#match::{self as m, http::string_match};
use linkerd2_proxy_api::tap::observe_request::Match;

use super::TapError;

/// Longest `path` or `authority` filter accepted.
const MAX_FILTER_LEN: usize = 1024;
/// Largest `limit` (events before the stream ends).
pub const MAX_LIMIT: u64 = 1_000_000;
/// Namespace when the query names none (kubectl's and Linkerd's default).
const DEFAULT_NAMESPACE: &str = "default";

/// The kinds a tap names, as `kubectl` spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapKind {
    Namespace,
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
    Pod,
    /// Only as a `to` resource: a Service has no pods of its own to tap.
    Service,
}

impl TapKind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "ns" | "namespace" | "namespaces" => Self::Namespace,
            "deploy" | "deployment" | "deployments" => Self::Deployment,
            "sts" | "statefulset" | "statefulsets" => Self::StatefulSet,
            "ds" | "daemonset" | "daemonsets" => Self::DaemonSet,
            "job" | "jobs" => Self::Job,
            "po" | "pod" | "pods" => Self::Pod,
            "svc" | "service" | "services" => Self::Service,
            _ => return None,
        })
    }

    /// Linkerd's lowercase kind, as the API's `ResourceRef.kind` says it.
    pub fn api_name(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Deployment => "deployment",
            Self::StatefulSet => "statefulset",
            Self::DaemonSet => "daemonset",
            Self::Job => "job",
            Self::Pod => "pod",
            Self::Service => "service",
        }
    }

    /// The destination metric label naming a resource of this kind (the
    /// Destination API's `metric_labels`, `dst_` without its prefix).
    fn dst_label(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Deployment => "deployment",
            Self::StatefulSet => "statefulset",
            Self::DaemonSet => "daemonset",
            Self::Job => "k8s_job",
            Self::Pod => "pod",
            Self::Service => "service",
        }
    }
}

/// A resource by kind, namespace and (optionally) name: `deploy/web` in
/// `demo`, or every deployment of `demo` with no name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub kind: TapKind,
    pub namespace: String,
    pub name: Option<String>,
}

impl Selector {
    /// `KIND[/NAME]` in `namespace`; `ns/NAME` is namespace `NAME` itself.
    fn parse(text: &str, namespace: &str, what: &str) -> Result<Self, TapError> {
        let (kind_text, name) = match text.split_once('/') {
            Some((k, n)) => (k, Some(n)),
            None => (text, None),
        };
        let kind = TapKind::parse(kind_text).ok_or_else(|| {
            TapError::BadQuery(format!(
                "{what}: unknown kind {kind_text:?} (expected deploy, sts, ds, job, pod or ns{})",
                if what == "to" { ", or svc" } else { "" }
            ))
        })?;
        if let Some(n) = name {
            if kind == TapKind::Namespace {
                check_namespace(n, what)?;
            } else {
                check_name(n, what)?;
            }
        }
        if kind == TapKind::Namespace {
            let name = name
                .ok_or_else(|| TapError::BadQuery(format!("{what}: ns needs a name (ns/NAME)")))?;
            return Ok(Self {
                kind,
                namespace: name.to_string(),
                name: Some(name.to_string()),
            });
        }
        Ok(Self {
            kind,
            namespace: namespace.to_string(),
            name: name.map(str::to_string),
        })
    }

    /// Whether `pod` is one of this selection's pods.
    pub fn selects(&self, pod: &PodTarget) -> bool {
        if pod.pod.namespace != self.namespace {
            return false;
        }
        match self.kind {
            TapKind::Namespace => true,
            TapKind::Pod => self.name.as_ref().is_none_or(|n| *n == pod.pod.name),
            // A Service's pods are not known here; only labels match it.
            TapKind::Service => false,
            kind => pod.workload.as_ref().is_some_and(|w| {
                w.kind == kind.api_name() && self.name.as_ref().is_none_or(|n| *n == w.name)
            }),
        }
    }

    /// `deploy/web`-style, for messages.
    pub fn describe(&self) -> String {
        match (&self.kind, &self.name) {
            (TapKind::Namespace, _) => format!("namespace {}", self.namespace),
            (kind, Some(name)) => format!("{} {}/{name}", kind.api_name(), self.namespace),
            (kind, None) => format!("every {} in {}", kind.api_name(), self.namespace),
        }
    }
}

fn check_name(name: &str, what: &str) -> Result<(), TapError> {
    crate::names::check_name(name, what).map_err(TapError::BadQuery)
}

fn check_namespace(namespace: &str, what: &str) -> Result<(), TapError> {
    crate::names::check_namespace(namespace, what).map_err(TapError::BadQuery)
}

/// A parsed `/api/tap` query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapQuery {
    pub target: Selector,
    pub to: Option<Selector>,
    pub method: Option<http::Method>,
    /// A path prefix.
    pub path: Option<String>,
    /// An exact `:authority`.
    pub authority: Option<String>,
    pub max_rps: Option<u32>,
    /// End the stream after this many requests.
    pub limit: Option<u64>,
}

/// Parses `target=deploy/web&namespace=demo&to=...&method=GET&path=/x
/// &authority=a&max_rps=10&limit=100` (`to_namespace` names `to`'s
/// namespace when it differs). Unknown parameters are refused, so a typo is
/// not a silently wider tap.
pub fn parse(query: &str) -> Result<TapQuery, TapError> {
    let mut target = None;
    let mut namespace = None;
    let mut to = None;
    let mut to_namespace = None;
    let mut method = None;
    let mut path = None;
    let mut authority = None;
    let mut max_rps = None;
    let mut limit = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match key.as_ref() {
            "target" | "resource" => &mut target,
            "namespace" => &mut namespace,
            "to" => &mut to,
            "to_namespace" => &mut to_namespace,
            "method" => &mut method,
            "path" => &mut path,
            "authority" => &mut authority,
            "max_rps" => &mut max_rps,
            "limit" => &mut limit,
            other => {
                return Err(TapError::BadQuery(format!(
                    "unknown parameter {:?} (expected target, namespace, to, to_namespace, method, path, authority, max_rps, limit)",
                    truncate(other)
                )))
            }
        };
        if slot.is_some() {
            return Err(TapError::BadQuery(format!("{key} given twice")));
        }
        *slot = Some(value.into_owned());
    }
    let namespace = namespace
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    check_namespace(&namespace, "namespace")?;
    let target = target
        .filter(|t| !t.is_empty())
        .ok_or_else(|| TapError::BadQuery("target is required (e.g. deploy/web)".into()))?;
    let target = Selector::parse(&target, &namespace, "target")?;
    if target.kind == TapKind::Service {
        return Err(TapError::BadQuery(
            "target: a service cannot be tapped, only its clients or servers (use it as `to`)"
                .into(),
        ));
    }
    let to = match to.filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => {
            let ns = to_namespace
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| namespace.clone());
            check_namespace(&ns, "to_namespace")?;
            let sel = Selector::parse(&t, &ns, "to")?;
            if sel.name.is_none() {
                return Err(TapError::BadQuery(format!(
                    "to: name the resource ({t}/NAME)"
                )));
            }
            Some(sel)
        }
    };
    let method = match method.filter(|m| !m.is_empty()) {
        None => None,
        Some(m) => Some(
            http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| {
                TapError::BadQuery(format!("method: {:?} is not an HTTP method", truncate(&m)))
            })?,
        ),
    };
    let path = match path.filter(|p| !p.is_empty()) {
        None => None,
        Some(p) if !p.starts_with('/') => {
            return Err(TapError::BadQuery(format!(
                "path: {:?} must start with '/'",
                truncate(&p)
            )))
        }
        Some(p) => Some(bounded(p, "path")?),
    };
    let authority = authority
        .filter(|a| !a.is_empty())
        .map(|a| bounded(a, "authority"))
        .transpose()?;
    let max_rps = max_rps
        .map(|v| number(&v, "max_rps", 1, u64::from(u32::MAX)))
        .transpose()?
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    let limit = limit
        .map(|v| number(&v, "limit", 1, MAX_LIMIT))
        .transpose()?;
    Ok(TapQuery {
        target,
        to,
        method,
        path,
        authority,
        max_rps,
        limit,
    })
}

fn bounded(value: String, what: &str) -> Result<String, TapError> {
    if value.len() > MAX_FILTER_LEN || value.chars().any(char::is_control) {
        return Err(TapError::BadQuery(format!(
            "{what}: at most {MAX_FILTER_LEN} bytes, no control characters"
        )));
    }
    Ok(value)
}

fn number(value: &str, what: &str, min: u64, max: u64) -> Result<u64, TapError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            TapError::BadQuery(format!(
                "{what}: {:?} is not a whole number from {min} to {max}",
                truncate(value)
            ))
        })
}

/// A peer's value cut for an error message.
fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The match tree for a query: every filter must hold (`all`; an empty
/// `all` matches every request, as Linkerd's tap server sends it).
/// `to_ips` are the `to` resource's meshed pods, matched by destination
/// address as well as by the destination's labels.
pub fn observe_match(query: &TapQuery, to_ips: &[IpAddr]) -> Match {
    let mut all = Vec::new();
    if let Some(to) = &query.to {
        let mut labels = vec![label("namespace", &to.namespace)];
        if to.kind != TapKind::Namespace {
            if let Some(name) = &to.name {
                labels.push(label(to.kind.dst_label(), name));
            }
        }
        let mut any = vec![m::Match::All(m::Seq {
            matches: labels.into_iter().map(wrap).collect(),
        })];
        any.extend(to_ips.iter().map(|ip| {
            m::Match::Destination(m::Tcp {
                r#match: Some(m::tcp::Match::Netmask(m::tcp::Netmask {
                    ip: Some(IpAddress::from(*ip)),
                    mask: if ip.is_ipv4() { 32 } else { 128 },
                })),
            })
        }));
        all.push(m::Match::Any(m::Seq {
            matches: any.into_iter().map(wrap).collect(),
        }));
    }
    if let Some(method) = &query.method {
        all.push(http(m::http::Match::Method(HttpMethod::from(
            method.clone(),
        ))));
    }
    if let Some(path) = &query.path {
        all.push(http(m::http::Match::Path(m::http::StringMatch {
            r#match: Some(string_match::Match::Prefix(path.clone())),
        })));
    }
    if let Some(authority) = &query.authority {
        all.push(http(m::http::Match::Authority(m::http::StringMatch {
            r#match: Some(string_match::Match::Exact(authority.clone())),
        })));
    }
    wrap(m::Match::All(m::Seq {
        matches: all.into_iter().map(wrap).collect(),
    }))
}

fn wrap(inner: m::Match) -> Match {
    Match {
        r#match: Some(inner),
    }
}

fn label(key: &str, value: &str) -> m::Match {
    m::Match::DestinationLabel(m::Label {
        key: key.to_string(),
        value: value.to_string(),
    })
}

fn http(inner: m::http::Match) -> m::Match {
    m::Match::Http(m::Http {
        r#match: Some(inner),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_vizcore::api::ResourceRef;

    fn sel(kind: TapKind, ns: &str, name: Option<&str>) -> Selector {
        Selector {
            kind,
            namespace: ns.into(),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn targets_and_filters_are_parsed() {
        let q = parse(
            "target=deploy%2Fweb&namespace=demo&to=svc/api&method=get&path=%2Fv1&authority=api.demo&max_rps=20&limit=5",
        )
        .expect("parses");
        assert_eq!(q.target, sel(TapKind::Deployment, "demo", Some("web")));
        assert_eq!(q.to, Some(sel(TapKind::Service, "demo", Some("api"))));
        assert_eq!(q.method, Some(http::Method::GET));
        assert_eq!(q.path.as_deref(), Some("/v1"));
        assert_eq!(q.authority.as_deref(), Some("api.demo"));
        assert_eq!(q.max_rps, Some(20));
        assert_eq!(q.limit, Some(5));

        let q = parse("target=ns/demo").expect("parses");
        assert_eq!(q.target, sel(TapKind::Namespace, "demo", Some("demo")));
        let q = parse("target=deployment").expect("parses");
        assert_eq!(q.target, sel(TapKind::Deployment, "default", None));
        let q = parse("target=sts/db&namespace=x&to=deploy/web&to_namespace=y").expect("parses");
        assert_eq!(q.target, sel(TapKind::StatefulSet, "x", Some("db")));
        assert_eq!(q.to, Some(sel(TapKind::Deployment, "y", Some("web"))));
        for (kind, expect) in [
            ("pod/a", TapKind::Pod),
            ("ds/a", TapKind::DaemonSet),
            ("job/a", TapKind::Job),
        ] {
            assert_eq!(
                parse(&format!("target={kind}")).expect(kind).target.kind,
                expect
            );
        }
    }

    #[test]
    fn bad_queries_are_refused_with_a_reason() {
        for (query, needle) in [
            ("", "target is required"),
            ("target=", "target is required"),
            ("target=foo/bar", "unknown kind"),
            ("target=svc/web", "cannot be tapped"),
            ("target=ns", "ns needs a name"),
            ("target=deploy/Web", "not a Kubernetes name"),
            ("target=deploy/web&namespace=a_b", "not a namespace"),
            ("target=deploy/web&namespace=a.b", "not a namespace"),
            ("target=ns/-x", "not a namespace"),
            ("target=deploy/web&to=deploy", "name the resource"),
            ("target=deploy/web&path=x", "must start with '/'"),
            ("target=deploy/web&method=G%20T", "not an HTTP method"),
            ("target=deploy/web&max_rps=0", "max_rps"),
            ("target=deploy/web&max_rps=ten", "max_rps"),
            ("target=deploy/web&limit=0", "limit"),
            ("target=deploy/web&limit=99999999999", "limit"),
            ("target=deploy/web&colour=red", "unknown parameter"),
            ("target=deploy/web&target=deploy/x", "twice"),
            ("target=deploy/web&authority=a%0Ab", "control characters"),
        ] {
            match parse(query) {
                Err(TapError::BadQuery(msg)) => {
                    assert!(msg.contains(needle), "{query}: {msg}");
                    assert!(!msg.contains('\n'), "{query}: one line: {msg}");
                }
                other => panic!("{query}: expected BadQuery, got {other:?}"),
            }
        }
        let long = format!("target=deploy/web&path=/{}", "a".repeat(MAX_FILTER_LEN));
        assert!(matches!(parse(&long), Err(TapError::BadQuery(_))));
    }

    fn pod(ns: &str, name: &str, workload: Option<(&str, &str)>) -> PodTarget {
        PodTarget {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: ns.into(),
                name: name.into(),
            },
            workload: workload.map(|(k, n)| ResourceRef {
                kind: k.into(),
                namespace: ns.into(),
                name: n.into(),
            }),
            ip: "10.0.0.1".parse().expect("ip"),
            admin_port: 4191,
            tap_port: 4190,
            service_account: "default".into(),
        }
    }

    #[test]
    fn selectors_pick_their_pods() {
        let web = pod("demo", "web-1", Some(("deployment", "web")));
        let db = pod("demo", "db-0", Some(("statefulset", "db")));
        let other = pod("prod", "web-2", Some(("deployment", "web")));
        let bare = pod("demo", "bare", None);
        let s = sel(TapKind::Deployment, "demo", Some("web"));
        assert!(s.selects(&web) && !s.selects(&db) && !s.selects(&other) && !s.selects(&bare));
        let s = sel(TapKind::Deployment, "demo", None);
        assert!(s.selects(&web) && !s.selects(&db));
        let s = sel(TapKind::Namespace, "demo", Some("demo"));
        assert!(s.selects(&web) && s.selects(&db) && s.selects(&bare) && !s.selects(&other));
        let s = sel(TapKind::Pod, "demo", Some("bare"));
        assert!(s.selects(&bare) && !s.selects(&web));
        let s = sel(TapKind::StatefulSet, "demo", Some("db"));
        assert!(s.selects(&db) && !s.selects(&web));
    }

    /// The tree as text, to compare whole shapes.
    fn show(m: &Match) -> String {
        match m.r#match.as_ref() {
            None => "EMPTY".into(),
            Some(m::Match::All(s)) => {
                format!(
                    "all({})",
                    s.matches.iter().map(show).collect::<Vec<_>>().join(",")
                )
            }
            Some(m::Match::Any(s)) => {
                format!(
                    "any({})",
                    s.matches.iter().map(show).collect::<Vec<_>>().join(",")
                )
            }
            Some(m::Match::DestinationLabel(l)) => format!("{}={}", l.key, l.value),
            Some(m::Match::Destination(t)) => match &t.r#match {
                Some(m::tcp::Match::Netmask(n)) => {
                    let ip =
                        n.ip.and_then(|ip| IpAddr::try_from(ip).ok())
                            .map_or("?".to_string(), |ip| ip.to_string());
                    format!("dst={ip}/{}", n.mask)
                }
                _ => "dst?".into(),
            },
            Some(m::Match::Http(h)) => match &h.r#match {
                Some(m::http::Match::Method(meth)) => {
                    let method = meth
                        .clone()
                        .r#type
                        .and_then(|t| http::Method::try_from(t).ok())
                        .map_or("?".to_string(), |m| m.to_string());
                    format!("method={method}")
                }
                Some(m::http::Match::Path(s)) => format!("path={:?}", s.r#match),
                Some(m::http::Match::Authority(s)) => format!("authority={:?}", s.r#match),
                _ => "http?".into(),
            },
            Some(_) => "other".into(),
        }
    }

    #[test]
    fn match_trees() {
        let q = parse("target=deploy/load&namespace=demo").expect("q");
        assert_eq!(show(&observe_match(&q, &[])), "all()");

        let q = parse("target=deploy/load&namespace=demo&to=deploy/web&method=POST&path=/a&authority=web.demo")
            .expect("q");
        let ips = [
            "10.0.0.7".parse().expect("ip"),
            "fd00::1".parse().expect("ip"),
        ];
        assert_eq!(
            show(&observe_match(&q, &ips)),
            "all(any(all(namespace=demo,deployment=web),dst=10.0.0.7/32,dst=fd00::1/128),\
             method=POST,path=Some(Prefix(\"/a\")),authority=Some(Exact(\"web.demo\")))"
        );

        let q = parse("target=deploy/load&namespace=demo&to=ns/prod").expect("q");
        assert_eq!(
            show(&observe_match(&q, &[])),
            "all(any(all(namespace=prod)))"
        );
        let q = parse("target=deploy/load&to=job/migrate").expect("q");
        assert_eq!(
            show(&observe_match(&q, &[])),
            "all(any(all(namespace=default,k8s_job=migrate)))"
        );
        let q = parse("target=deploy/load&to=svc/web&method=PURGE").expect("q");
        assert_eq!(
            show(&observe_match(&q, &[])),
            "all(any(all(namespace=default,service=web)),method=PURGE)"
        );
    }
}
