//! Which target an HTTP authority (`Host` / `:authority`) names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostTarget {
    /// A mesh service, as the controller's canonical authority
    /// `name.ns.svc.CLUSTER_DOMAIN:port`.
    Service(String),
    /// An IP address and port.
    Addr(SocketAddr),
    /// Anything else: not for the mesh.
    Other,
}

/// The host a request names (`:authority`, else `Host`), without its port;
/// an IPv6 literal keeps its brackets, as in a URI. Both sides' route
/// matching reads it.
pub fn request_host<B>(req: &http::Request<B>) -> Option<&str> {
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

/// Reads `host[:port]` (port 80 when absent). A service may be named
/// `name.ns`, `name.ns.svc` or `name.ns.svc.CLUSTER_DOMAIN`, with or without
/// a trailing dot, in any case.
pub fn parse_host(authority: &str, cluster_domain: &str) -> HostTarget {
    let (host, port) = match split_port(authority) {
        Some(hp) => hp,
        None => return HostTarget::Other,
    };
    // An IPv6 address only in brackets, an IPv4 address only without.
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    if let Some(ip) = ip {
        return HostTarget::Addr(SocketAddr::new(ip, port));
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let domain = cluster_domain.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    if labels.len() < 2 || !labels[..2].iter().all(|l| is_dns_label(l)) {
        return HostTarget::Other;
    }
    let rest = labels[2..].join(".");
    let in_mesh = rest.is_empty() || rest == "svc" || rest == format!("svc.{domain}");
    if !in_mesh {
        return HostTarget::Other;
    }
    HostTarget::Service(format!("{}.{}.svc.{domain}:{port}", labels[0], labels[1]))
}

/// Whether `authority` names its host by two labels only (`NAME.NS`), a
/// form that a name outside the mesh (`example.com`) shares.
pub fn is_short_name(authority: &str) -> bool {
    split_port(authority).is_some_and(|(host, _)| {
        let host = host.trim_end_matches('.');
        host.split('.').count() == 2 && host.parse::<Ipv4Addr>().is_err()
    })
}

fn split_port(authority: &str) -> Option<(&str, u16)> {
    if authority.is_empty() || authority.len() > 253 + 6 {
        return None;
    }
    // `[v6]:port`, `[v6]`, `host:port`, `host`.
    if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = &authority[..end + 2];
        return match &rest[end + 1..] {
            "" => Some((host, 80)),
            p => Some((host, parse_port(p.strip_prefix(':')?)?)),
        };
    }
    match authority.split_once(':') {
        // More than one colon without brackets: an IPv6 address whose port
        // cannot be told from its last group.
        Some((_, port)) if port.contains(':') => None,
        Some((host, port)) => Some((host, parse_port(port)?)),
        None => Some((authority, 80)),
    }
}

fn parse_port(p: &str) -> Option<u16> {
    p.parse().ok().filter(|&port| port != 0)
}

fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ambiguous_or_impossible_authorities_name_nothing() {
        for a in [
            "web.shop:0",
            "fd00::1:8080",
            "10.0.0.1]:80",
            "[10.0.0.1]:80",
            "[fd00::1]:0",
            "[fd00::1",
        ] {
            assert_eq!(parse_host(a, "cluster.local"), HostTarget::Other, "{a}");
        }
        assert_eq!(
            parse_host("[fd00::1]:8080", "cluster.local"),
            HostTarget::Addr("[fd00::1]:8080".parse().expect("addr"))
        );
    }

    #[test]
    fn hosts_by_table() {
        let svc = |s: &str| HostTarget::Service(s.to_string());
        let addr = |s: &str| HostTarget::Addr(s.parse().expect("addr"));
        let cases = [
            ("web.shop", svc("web.shop.svc.cluster.local:80")),
            ("web.shop:8080", svc("web.shop.svc.cluster.local:8080")),
            ("web.shop.svc", svc("web.shop.svc.cluster.local:80")),
            (
                "web.shop.svc.cluster.local:81",
                svc("web.shop.svc.cluster.local:81"),
            ),
            (
                "WEB.Shop.svc.cluster.local.:81",
                svc("web.shop.svc.cluster.local:81"),
            ),
            ("web.shop.svc.other.domain", HostTarget::Other),
            ("web", HostTarget::Other),
            ("web.shop:notaport", HostTarget::Other),
            ("web.shop:70000", HostTarget::Other),
            ("we_b.shop", HostTarget::Other),
            ("-web.shop", HostTarget::Other),
            ("", HostTarget::Other),
            ("10.0.0.1:8080", addr("10.0.0.1:8080")),
            ("10.0.0.1", addr("10.0.0.1:80")),
            ("[::1]:8080", addr("[::1]:8080")),
            ("[::1]", addr("[::1]:80")),
            ("[::1", HostTarget::Other),
        ];
        for (host, want) in cases {
            assert_eq!(parse_host(host, "cluster.local"), want, "{host}");
        }
    }
}
