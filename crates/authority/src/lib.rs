//! The one grammar of authorities (`HOST[:PORT]`) and of the names a mesh
//! service answers to. The controller reads `GetDestination` paths and
//! policy targets with it, the proxy reads requests' authorities with it;
//! each decides what a refusal means (an error with its reason, or "not
//! for the mesh").
//!
//! - An IPv6 address only in brackets (`[fd00::1]:80`), an IPv4 address only
//!   without; a port, when given, is 1 to 65535.
//! - A service is `NAME.NS`, `NAME.NS.svc` or `NAME.NS.svc.CLUSTER_DOMAIN`,
//!   in any case, with or without a trailing dot.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest authority read: a DNS name (253) and `:65535`.
pub const MAX_LEN: usize = 253 + 6;

/// Port of an authority that names none (HTTP's, as in Linkerd).
pub const DEFAULT_PORT: u16 = 80;

/// The host part of an authority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host<'a> {
    Ip(IpAddr),
    /// Not checked yet: [`service`] does that.
    Name(&'a str),
}

/// Splits `HOST[:PORT]`; the port is `None` when absent.
pub fn split(authority: &str) -> Result<(Host<'_>, Option<u16>), &'static str> {
    if authority.is_empty() {
        return Err("empty");
    }
    if authority.len() > MAX_LEN {
        return Err("longer than a DNS name and port");
    }
    if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address without its closing ']'")?;
        let ip = inside
            .parse::<Ipv6Addr>()
            .map_err(|_| "not an IPv6 address in brackets")?;
        let port = match after {
            "" => None,
            _ => Some(port(
                after
                    .strip_prefix(':')
                    .ok_or("port must be between 1 and 65535")?,
            )?),
        };
        return Ok((Host::Ip(IpAddr::V6(ip)), port));
    }
    let (host, port) = match authority.rsplit_once(':') {
        None => (authority, None),
        Some((host, _)) if host.contains(':') => {
            return Err("IPv6 addresses must be in brackets");
        }
        Some((host, p)) => (host, Some(port(p)?)),
    };
    Ok(match host.parse::<Ipv4Addr>() {
        Ok(v4) => (Host::Ip(IpAddr::V4(v4)), port),
        Err(_) => (Host::Name(host), port),
    })
}

/// A port: 1 to 65535, digits only.
pub fn port(p: &str) -> Result<u16, &'static str> {
    match p.parse::<u16>() {
        Ok(port) if port != 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
        _ => Err("port must be between 1 and 65535"),
    }
}

/// A service's name and namespace, lower case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub name: String,
    pub namespace: String,
}

/// The service a host name names in a cluster with this DNS domain.
pub fn service(host: &str, cluster_domain: &str) -> Result<ServiceName, &'static str> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let domain = cluster_domain.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    if labels.iter().any(|l| !is_dns_label(l)) {
        return Err("not a DNS name");
    }
    let in_domain = |rest: &[&str]| rest.join(".") == domain;
    match labels.as_slice() {
        [name, ns] | [name, ns, "svc"] => Ok(ServiceName {
            name: name.to_string(),
            namespace: ns.to_string(),
        }),
        [name, ns, "svc", rest @ ..] if in_domain(rest) => Ok(ServiceName {
            name: name.to_string(),
            namespace: ns.to_string(),
        }),
        [_, _, _, "svc", rest @ ..] if in_domain(rest) => {
            Err("pod-instance names (ID.NAME.NS.svc...) are not supported")
        }
        _ => Err("not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)"),
    }
}

/// The canonical name of a service: `NAME.NS.svc.CLUSTER_DOMAIN`, the
/// domain in lower case without a trailing dot (as [`service`] compares it).
pub fn service_fqdn(name: &str, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "{name}.{namespace}.svc.{}",
        cluster_domain.trim_end_matches('.').to_ascii_lowercase()
    )
}

/// An RFC 1123 label in lower case.
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

    type Split<'a> = Result<(Host<'a>, Option<u16>), &'static str>;

    fn name(n: &str) -> Split<'_> {
        Ok((Host::Name(n), None))
    }

    #[test]
    fn splits_hosts_and_ports() {
        let ip = |s: &str| Host::Ip(s.parse().expect("ip"));
        let cases: &[(&str, Split<'_>)] = &[
            ("web.shop", name("web.shop")),
            ("web.shop:8080", Ok((Host::Name("web.shop"), Some(8080)))),
            ("10.0.0.1", Ok((ip("10.0.0.1"), None))),
            ("10.0.0.1:80", Ok((ip("10.0.0.1"), Some(80)))),
            ("[fd00::1]", Ok((ip("fd00::1"), None))),
            ("[fd00::1]:8080", Ok((ip("fd00::1"), Some(8080)))),
            ("", Err("empty")),
            ("fd00::1:80", Err("IPv6 addresses must be in brackets")),
            ("[fd00::1", Err("an IPv6 address without its closing ']'")),
            ("[10.0.0.1]:80", Err("not an IPv6 address in brackets")),
            ("[fd00::1]80", Err("port must be between 1 and 65535")),
            ("[fd00::1]:0", Err("port must be between 1 and 65535")),
            ("web:0", Err("port must be between 1 and 65535")),
            ("web:+80", Err("port must be between 1 and 65535")),
            ("web:70000", Err("port must be between 1 and 65535")),
            ("web:http", Err("port must be between 1 and 65535")),
            // Not an IPv4 address: a name, for `service` to refuse.
            ("10.0.0.1]:80", Ok((Host::Name("10.0.0.1]"), Some(80)))),
        ];
        for (authority, want) in cases {
            assert_eq!(&split(authority), want, "{authority:?}");
        }
        assert_eq!(
            split(&"a".repeat(MAX_LEN + 1)),
            Err("longer than a DNS name and port")
        );
    }

    #[test]
    fn names_services_in_every_accepted_form() {
        let svc = |n: &str, ns: &str| {
            Ok(ServiceName {
                name: n.into(),
                namespace: ns.into(),
            })
        };
        let cases = [
            ("web.shop", svc("web", "shop")),
            ("web.shop.svc", svc("web", "shop")),
            ("web.shop.svc.cluster.local", svc("web", "shop")),
            ("WEB.Shop.svc.cluster.local.", svc("web", "shop")),
            (
                "web",
                Err("not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)"),
            ),
            (
                "web.shop.svc.other.domain",
                Err("not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)"),
            ),
            ("we_b.shop", Err("not a DNS name")),
            ("-web.shop", Err("not a DNS name")),
            ("web..shop", Err("not a DNS name")),
            (
                "pod-0.web.shop.svc.cluster.local",
                Err("pod-instance names (ID.NAME.NS.svc...) are not supported"),
            ),
        ];
        for (host, want) in cases {
            assert_eq!(service(host, "cluster.local"), want, "{host:?}");
        }
        assert_eq!(
            service("web.shop.svc.example.org", "example.org."),
            svc("web", "shop")
        );
        assert_eq!(
            service_fqdn("web", "shop", "example.org."),
            "web.shop.svc.example.org"
        );
        // A domain given in capitals names the same names (fuzz parse_host).
        assert_eq!(
            service_fqdn("web", "shop", "Example.ORG."),
            "web.shop.svc.example.org"
        );
    }
}
