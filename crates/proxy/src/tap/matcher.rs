//! A tap's match tree (Linkerd's `ObserveRequest.Match`): read and bounded
//! once when the tap opens, evaluated for each request while it is open.
//!
//! As Linkerd: `all` of nothing matches everything, `any` of nothing
//! matches nothing; a port range with one end unset is that one port; a
//! network needs an address and a prefix length of at least 1; a route
//! label never matches (the proxy sends no route labels); a request with no
//! match at all is refused (`all` of nothing is how to tap everything).
//! Unlike Linkerd, trees deeper than [`MAX_DEPTH`] or larger than
//! [`MAX_NODES`] are refused.

use crate::network::IpNetwork;
use linkerd2_proxy_api::{
    http_types::{scheme, HttpMethod, Scheme},
    net::IpAddress,
    tap::observe_request::{r#match as pb, Match as Root},
};
use std::net::{IpAddr, SocketAddr};

/// One node of a match tree, as the API sends it.
type Oneof = pb::Match;

/// Deepest match tree accepted (the root is depth 1).
pub const MAX_DEPTH: usize = 16;
/// Most nodes in one match tree.
pub const MAX_NODES: usize = 256;

/// Why a match was refused (`INVALID_ARGUMENT`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidMatch {
    #[error("a match is missing a required field")]
    Empty,
    #[error("invalid port range")]
    Port,
    #[error("invalid network")]
    Network,
    #[error("invalid HTTP method")]
    Method,
    #[error("invalid scheme")]
    Scheme,
    #[error("the match is deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the match has more than {MAX_NODES} nodes")]
    TooLarge,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    All(Vec<Match>),
    Any(Vec<Match>),
    Not(Box<Match>),
    Source(TcpMatch),
    Destination(TcpMatch),
    DestinationLabel {
        key: String,
        value: String,
    },
    /// The proxy sends no route labels: never matches.
    RouteLabel,
    Http(HttpMatch),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpMatch {
    /// Inclusive.
    Ports(u16, u16),
    Net(IpNetwork),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpMatch {
    Scheme(String),
    Method(http::Method),
    Authority(StringMatch),
    Path(StringMatch),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
}

/// What a request is matched against.
pub struct Inspect<'a> {
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    /// Destination labels (`namespace`, `service`, `pod`, `deployment`, ...).
    pub dst_labels: &'a [(&'static str, std::sync::Arc<str>)],
    pub method: &'a http::Method,
    pub scheme: Option<&'a str>,
    pub authority: Option<&'a str>,
    pub path: &'a str,
}

impl Match {
    /// Reads a request's match; none at all is refused, as Linkerd does.
    pub fn try_new(m: Option<Root>) -> Result<Self, InvalidMatch> {
        let inner = m.and_then(|m| m.r#match).ok_or(InvalidMatch::Empty)?;
        let mut nodes = 0;
        Self::read(inner, 1, &mut nodes)
    }

    fn read(m: Oneof, depth: usize, nodes: &mut usize) -> Result<Self, InvalidMatch> {
        if depth > MAX_DEPTH {
            return Err(InvalidMatch::TooDeep);
        }
        *nodes += 1;
        if *nodes > MAX_NODES {
            return Err(InvalidMatch::TooLarge);
        }
        let seq = |s: pb::Seq, nodes: &mut usize| -> Result<Vec<Match>, InvalidMatch> {
            // Counted before they are read: a wide sequence of empty
            // entries is refused without walking it.
            if s.matches.len() > MAX_NODES {
                return Err(InvalidMatch::TooLarge);
            }
            s.matches
                .into_iter()
                .filter_map(|m| m.r#match)
                .map(|m| Self::read(m, depth + 1, nodes))
                .collect()
        };
        Ok(match m {
            Oneof::All(s) => Match::All(seq(s, nodes)?),
            Oneof::Any(s) => Match::Any(seq(s, nodes)?),
            Oneof::Not(m) => {
                let inner = m.r#match.ok_or(InvalidMatch::Empty)?;
                Match::Not(Box::new(Self::read(inner, depth + 1, nodes)?))
            }
            Oneof::Source(t) => Match::Source(TcpMatch::try_from(t)?),
            Oneof::Destination(t) => Match::Destination(TcpMatch::try_from(t)?),
            Oneof::DestinationLabel(l) => {
                if l.key.is_empty() || l.value.is_empty() {
                    return Err(InvalidMatch::Empty);
                }
                Match::DestinationLabel {
                    key: l.key,
                    value: l.value,
                }
            }
            Oneof::RouteLabel(l) => {
                if l.key.is_empty() || l.value.is_empty() {
                    return Err(InvalidMatch::Empty);
                }
                Match::RouteLabel
            }
            Oneof::Http(h) => Match::Http(HttpMatch::try_from(h)?),
        })
    }

    pub fn matches(&self, r: &Inspect<'_>) -> bool {
        match self {
            Match::All(ms) => ms.iter().all(|m| m.matches(r)),
            Match::Any(ms) => ms.iter().any(|m| m.matches(r)),
            Match::Not(m) => !m.matches(r),
            Match::Source(t) => r.src.is_some_and(|a| t.matches(a)),
            Match::Destination(t) => r.dst.is_some_and(|a| t.matches(a)),
            Match::DestinationLabel { key, value } => {
                r.dst_labels.iter().any(|(k, v)| k == key && **v == **value)
            }
            Match::RouteLabel => false,
            Match::Http(h) => h.matches(r),
        }
    }
}

impl TcpMatch {
    fn matches(&self, addr: SocketAddr) -> bool {
        match self {
            TcpMatch::Ports(min, max) => (*min..=*max).contains(&addr.port()),
            TcpMatch::Net(net) => net.contains(&addr.ip()),
        }
    }
}

impl TryFrom<pb::Tcp> for TcpMatch {
    type Error = InvalidMatch;

    fn try_from(t: pb::Tcp) -> Result<Self, InvalidMatch> {
        use pb::tcp::Match as T;
        match t.r#match.ok_or(InvalidMatch::Empty)? {
            T::Ports(range) => {
                let min = if range.min == 0 { range.max } else { range.min };
                let max = if range.max == 0 { range.min } else { range.max };
                if min == 0 {
                    return Err(InvalidMatch::Empty);
                }
                let port = |p: u32| u16::try_from(p).map_err(|_| InvalidMatch::Port);
                let (min, max) = (port(min)?, port(max)?);
                if min > max {
                    return Err(InvalidMatch::Port);
                }
                Ok(TcpMatch::Ports(min, max))
            }
            T::Netmask(n) => {
                if n.mask == 0 {
                    return Err(InvalidMatch::Empty);
                }
                let ip = n.ip.ok_or(InvalidMatch::Empty)?;
                let ip = ip_of(ip)?;
                IpNetwork::new(ip, n.mask)
                    .map(TcpMatch::Net)
                    .map_err(|_| InvalidMatch::Network)
            }
        }
    }
}

fn ip_of(ip: IpAddress) -> Result<IpAddr, InvalidMatch> {
    IpAddr::try_from(ip).map_err(|_| InvalidMatch::Empty)
}

impl HttpMatch {
    fn matches(&self, r: &Inspect<'_>) -> bool {
        match self {
            // A request without a scheme in its target is plain HTTP.
            HttpMatch::Scheme(s) => r.scheme.unwrap_or("http").eq_ignore_ascii_case(s),
            HttpMatch::Method(m) => r.method == m,
            HttpMatch::Authority(m) => r.authority.is_some_and(|a| m.matches(a)),
            HttpMatch::Path(m) => m.matches(r.path),
        }
    }
}

impl StringMatch {
    fn matches(&self, s: &str) -> bool {
        match self {
            StringMatch::Exact(e) => s == e,
            StringMatch::Prefix(p) => s.starts_with(p.as_str()),
        }
    }

    fn try_from(m: pb::http::StringMatch) -> Result<Self, InvalidMatch> {
        use pb::http::string_match::Match as S;
        Ok(match m.r#match.ok_or(InvalidMatch::Empty)? {
            S::Exact(e) => StringMatch::Exact(e),
            S::Prefix(p) => StringMatch::Prefix(p),
        })
    }
}

impl TryFrom<pb::Http> for HttpMatch {
    type Error = InvalidMatch;

    fn try_from(h: pb::Http) -> Result<Self, InvalidMatch> {
        use pb::http::Match as H;
        Ok(match h.r#match.ok_or(InvalidMatch::Empty)? {
            H::Scheme(s) => HttpMatch::Scheme(scheme_name(s)?),
            H::Method(m) => HttpMatch::Method(method_of(m)?),
            H::Authority(m) => HttpMatch::Authority(StringMatch::try_from(m)?),
            H::Path(m) => HttpMatch::Path(StringMatch::try_from(m)?),
        })
    }
}

fn scheme_name(s: Scheme) -> Result<String, InvalidMatch> {
    use scheme::{Registered, Type};
    match s.r#type.ok_or(InvalidMatch::Empty)? {
        Type::Registered(r) if r == Registered::Http as i32 => Ok("http".into()),
        Type::Registered(r) if r == Registered::Https as i32 => Ok("https".into()),
        Type::Registered(_) => Err(InvalidMatch::Scheme),
        Type::Unregistered(s) if !s.is_empty() => Ok(s),
        Type::Unregistered(_) => Err(InvalidMatch::Scheme),
    }
}

fn method_of(m: HttpMethod) -> Result<http::Method, InvalidMatch> {
    if m.r#type.is_none() {
        return Err(InvalidMatch::Empty);
    }
    http::Method::try_from(m).map_err(|_| InvalidMatch::Method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::http_types::http_method;
    use std::sync::Arc;

    fn wrap(m: Oneof) -> Root {
        Root { r#match: Some(m) }
    }

    fn all(ms: Vec<Oneof>) -> Oneof {
        Oneof::All(pb::Seq {
            matches: ms.into_iter().map(wrap).collect(),
        })
    }

    fn any(ms: Vec<Oneof>) -> Oneof {
        Oneof::Any(pb::Seq {
            matches: ms.into_iter().map(wrap).collect(),
        })
    }

    fn not(m: Oneof) -> Oneof {
        Oneof::Not(Box::new(wrap(m)))
    }

    fn path_prefix(p: &str) -> Oneof {
        Oneof::Http(pb::Http {
            r#match: Some(pb::http::Match::Path(pb::http::StringMatch {
                r#match: Some(pb::http::string_match::Match::Prefix(p.into())),
            })),
        })
    }

    fn method(m: http::Method) -> Oneof {
        Oneof::Http(pb::Http {
            r#match: Some(pb::http::Match::Method(m.into())),
        })
    }

    fn authority_exact(a: &str) -> Oneof {
        Oneof::Http(pb::Http {
            r#match: Some(pb::http::Match::Authority(pb::http::StringMatch {
                r#match: Some(pb::http::string_match::Match::Exact(a.into())),
            })),
        })
    }

    fn src_net(ip: &str, mask: u32) -> Oneof {
        let ip: IpAddr = ip.parse().unwrap();
        Oneof::Source(pb::Tcp {
            r#match: Some(pb::tcp::Match::Netmask(pb::tcp::Netmask {
                ip: Some(ip.into()),
                mask,
            })),
        })
    }

    fn dst_ports(min: u32, max: u32) -> Oneof {
        Oneof::Destination(pb::Tcp {
            r#match: Some(pb::tcp::Match::Ports(pb::tcp::PortRange { min, max })),
        })
    }

    fn label(key: &str, value: &str) -> Oneof {
        Oneof::DestinationLabel(pb::Label {
            key: key.into(),
            value: value.into(),
        })
    }

    fn compile(m: Oneof) -> Match {
        Match::try_new(Some(wrap(m))).expect("a valid match")
    }

    struct Req {
        src: SocketAddr,
        dst: SocketAddr,
        labels: Vec<(&'static str, Arc<str>)>,
        method: http::Method,
        authority: &'static str,
        path: &'static str,
    }

    impl Req {
        fn get(path: &'static str) -> Req {
            Req {
                src: "10.1.2.3:40000".parse().unwrap(),
                dst: "10.9.0.7:8080".parse().unwrap(),
                labels: vec![
                    ("namespace", Arc::from("shop")),
                    ("deployment", Arc::from("web")),
                ],
                method: http::Method::GET,
                authority: "web.shop.svc.cluster.local:80",
                path,
            }
        }

        fn inspect(&self) -> Inspect<'_> {
            Inspect {
                src: Some(self.src),
                dst: Some(self.dst),
                dst_labels: &self.labels,
                method: &self.method,
                scheme: None,
                authority: Some(self.authority),
                path: self.path,
            }
        }
    }

    #[test]
    fn trees_combine_source_destination_path_and_method() {
        let m = compile(all(vec![
            path_prefix("/api/"),
            any(vec![method(http::Method::GET), method(http::Method::HEAD)]),
            not(src_net("10.1.0.0", 16)),
        ]));
        let mut r = Req::get("/api/cart");
        assert!(!m.matches(&r.inspect()), "the source is in 10.1/16");
        r.src = "10.2.0.1:1".parse().unwrap();
        assert!(m.matches(&r.inspect()));
        r.path = "/health";
        assert!(!m.matches(&r.inspect()));
        r.path = "/api/x";
        r.method = http::Method::POST;
        assert!(!m.matches(&r.inspect()));

        let ports = compile(dst_ports(8000, 8100));
        assert!(ports.matches(&Req::get("/").inspect()));
        let one = compile(dst_ports(0, 8080));
        assert!(
            one.matches(&Req::get("/").inspect()),
            "an unset end is the other"
        );
        assert!(!compile(dst_ports(81, 0)).matches(&Req::get("/").inspect()));

        let l = compile(label("deployment", "web"));
        assert!(l.matches(&Req::get("/").inspect()));
        assert!(!compile(label("deployment", "api")).matches(&Req::get("/").inspect()));
        assert!(compile(authority_exact("web.shop.svc.cluster.local:80"))
            .matches(&Req::get("/").inspect()));
    }

    #[test]
    fn empty_sequences_and_a_missing_match_behave_as_linkerd_and_documented() {
        let r = Req::get("/");
        assert!(compile(all(vec![])).matches(&r.inspect()));
        assert!(!compile(any(vec![])).matches(&r.inspect()));
        assert_eq!(Match::try_new(None).err(), Some(InvalidMatch::Empty));
        assert_eq!(
            Match::try_new(Some(Root { r#match: None })).err(),
            Some(InvalidMatch::Empty)
        );
        let route = Oneof::RouteLabel(pb::Label {
            key: "route".into(),
            value: "x".into(),
        });
        assert!(!compile(route).matches(&r.inspect()));
    }

    #[test]
    fn bad_fields_are_refused_with_their_reason() {
        let bad = |m: Oneof| Match::try_new(Some(wrap(m))).unwrap_err();
        assert_eq!(bad(dst_ports(0, 0)), InvalidMatch::Empty);
        assert_eq!(bad(dst_ports(70_000, 70_001)), InvalidMatch::Port);
        assert_eq!(bad(dst_ports(90, 80)), InvalidMatch::Port);
        assert_eq!(bad(src_net("10.0.0.0", 0)), InvalidMatch::Empty);
        assert_eq!(bad(src_net("10.0.0.0", 33)), InvalidMatch::Network);
        assert_eq!(bad(label("", "x")), InvalidMatch::Empty);
        assert_eq!(
            bad(Oneof::Not(Box::new(Root { r#match: None }))),
            InvalidMatch::Empty
        );
        assert_eq!(
            bad(Oneof::Http(pb::Http { r#match: None })),
            InvalidMatch::Empty
        );
        let unregistered = Oneof::Http(pb::Http {
            r#match: Some(pb::http::Match::Method(HttpMethod {
                r#type: Some(http_method::Type::Unregistered("BAD METHOD".into())),
            })),
        });
        assert_eq!(bad(unregistered), InvalidMatch::Method);
    }

    #[test]
    fn deep_or_large_trees_are_refused() {
        let mut deep = path_prefix("/");
        for _ in 0..MAX_DEPTH - 1 {
            deep = not(deep);
        }
        assert!(Match::try_new(Some(wrap(deep.clone()))).is_ok(), "depth 16");
        assert_eq!(
            Match::try_new(Some(wrap(not(deep)))).unwrap_err(),
            InvalidMatch::TooDeep
        );

        let wide = |n: usize| all((0..n).map(|_| path_prefix("/")).collect());
        assert!(Match::try_new(Some(wrap(wide(MAX_NODES - 1)))).is_ok());
        assert_eq!(
            Match::try_new(Some(wrap(wide(MAX_NODES)))).unwrap_err(),
            InvalidMatch::TooLarge
        );
        // Many small sequences together count too.
        let nested = all((0..20)
            .map(|_| all((0..15).map(|_| path_prefix("/")).collect()))
            .collect());
        assert_eq!(
            Match::try_new(Some(wrap(nested))).unwrap_err(),
            InvalidMatch::TooLarge
        );
    }

    #[test]
    fn ipv4_mapped_sources_match_ipv4_networks() {
        let m = compile(src_net("10.1.0.0", 16));
        let mut r = Req::get("/");
        r.src = "[::ffff:10.1.2.3]:5".parse().unwrap();
        assert!(m.matches(&r.inspect()));
    }
}
