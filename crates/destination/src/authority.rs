//! Parsing the `path` of a `GetDestination` into a [`Target`].
//!
//! Accepted, case-insensitively, with an optional trailing dot and an optional
//! `:PORT` (default 80, as in Linkerd):
//! - `NAME.NS.svc.CLUSTER_DOMAIN`, the canonical form;
//! - `NAME.NS.svc` and `NAME.NS`, short forms (Linkerd's controller rejects
//!   these; Ballast accepts them so that hand-typed queries work);
//! - `IP:PORT` (IPv6 in brackets), resolved by cluster IP or pod IP.
//!
//! Anything else is refused with a short reason; the path is never echoed
//! beyond a bounded length.

use crate::{index::Target, resource::ObjectKey};
use std::net::{IpAddr, SocketAddr};

/// The longest path considered: a DNS name (253) plus `:65535`.
pub const MAX_PATH_LEN: usize = 253 + 6;
/// Port assumed when the path names none.
pub const DEFAULT_PORT: u16 = 80;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid authority {shown:?}: {reason}")]
pub struct InvalidAuthority {
    /// The path, cut to a bounded length.
    pub shown: String,
    pub reason: &'static str,
}

pub fn parse(path: &str, cluster_domain: &str) -> Result<Target, InvalidAuthority> {
    let fail = |reason| {
        let mut shown: String = path.chars().take(64).collect();
        if shown.len() < path.len() {
            shown.push('…');
        }
        InvalidAuthority { shown, reason }
    };
    if path.is_empty() {
        return Err(fail("empty path"));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(fail("longer than a DNS name and port"));
    }
    if let Ok(addr) = path.parse::<SocketAddr>() {
        if addr.port() == 0 {
            return Err(fail("port must be between 1 and 65535"));
        }
        return Ok(Target::Addr(addr));
    }
    let (host, port) = split_port(path).map_err(fail)?;
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        // An IP with no port, or a malformed bracketed one.
        return Err(fail("an IP address needs a port (IP:PORT, [IPv6]:PORT)"));
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let domain = cluster_domain.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    if labels.iter().any(|l| !is_dns_label(l)) {
        return Err(fail("not a DNS name"));
    }
    let service = match labels.as_slice() {
        [name, ns] | [name, ns, "svc"] => ObjectKey::new(*ns, *name),
        [name, ns, "svc", rest @ ..] if rest.join(".") == domain => ObjectKey::new(*ns, *name),
        [_, _, _, "svc", rest @ ..] if rest.join(".") == domain => {
            return Err(fail(
                "pod-instance names (ID.NAME.NS.svc...) are not supported",
            ))
        }
        _ => {
            return Err(fail(
                "not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)",
            ))
        }
    };
    Ok(Target::Service { service, port })
}

fn split_port(path: &str) -> Result<(&str, u16), &'static str> {
    match path.rsplit_once(':') {
        None => Ok((path, DEFAULT_PORT)),
        Some((host, port)) => {
            if host.contains(':') && !host.starts_with('[') {
                return Err("IPv6 addresses must be in brackets");
            }
            match port.parse::<u16>() {
                Ok(p) if p != 0 => Ok((host, p)),
                _ => Err("port must be between 1 and 65535"),
            }
        }
    }
}

fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// The canonical name of a service: `NAME.NS.svc.CLUSTER_DOMAIN`.
pub fn service_fqdn(service: &ObjectKey, cluster_domain: &str) -> String {
    format!(
        "{}.{}.svc.{}",
        service.name,
        service.namespace,
        cluster_domain.trim_end_matches('.')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, port: u16) -> Result<Target, &'static str> {
        Ok(Target::Service {
            service: ObjectKey::new(ns, name),
            port,
        })
    }

    #[test]
    fn parses_every_accepted_form_and_refuses_the_rest() {
        let cases: &[(&str, Result<Target, &'static str>)] = &[
            ("web.shop.svc.cluster.local:8080", svc("shop", "web", 8080)),
            ("web.shop.svc.cluster.local.:8080", svc("shop", "web", 8080)),
            ("WEB.Shop.svc.cluster.local:8080", svc("shop", "web", 8080)),
            ("web.shop.svc.cluster.local", svc("shop", "web", 80)),
            ("web.shop.svc:81", svc("shop", "web", 81)),
            ("web.shop:82", svc("shop", "web", 82)),
            (
                "10.0.0.1:8080",
                Ok(Target::Addr("10.0.0.1:8080".parse().unwrap())),
            ),
            (
                "[fd00::1]:8080",
                Ok(Target::Addr("[fd00::1]:8080".parse().unwrap())),
            ),
            ("", Err("empty path")),
            (
                "10.0.0.1",
                Err("an IP address needs a port (IP:PORT, [IPv6]:PORT)"),
            ),
            ("10.0.0.1:0", Err("port must be between 1 and 65535")),
            (
                "web.shop.svc.cluster.local:99999",
                Err("port must be between 1 and 65535"),
            ),
            (
                "web.shop.svc.cluster.local:http",
                Err("port must be between 1 and 65535"),
            ),
            ("fd00::1:80", Err("IPv6 addresses must be in brackets")),
            (
                "web.shop.svc.other.domain:80",
                Err("not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)"),
            ),
            (
                "web:80",
                Err("not a service name (NAME.NAMESPACE.svc.CLUSTER_DOMAIN)"),
            ),
            ("we_b.shop:80", Err("not a DNS name")),
            ("web..shop:80", Err("not a DNS name")),
            (
                "pod-0.web.shop.svc.cluster.local:80",
                Err("pod-instance names (ID.NAME.NS.svc...) are not supported"),
            ),
        ];
        for (path, want) in cases {
            let got = parse(path, "cluster.local").map_err(|e| e.reason);
            assert_eq!(&got, want, "path {path:?}");
        }
    }

    #[test]
    fn error_text_is_bounded() {
        let long = "a".repeat(10_000);
        let err = parse(&long, "cluster.local").unwrap_err();
        assert!(err.to_string().len() < 200, "{}", err);
    }

    #[test]
    fn other_cluster_domains() {
        assert_eq!(
            parse("web.shop.svc.example.org:80", "example.org."),
            Ok(Target::Service {
                service: ObjectKey::new("shop", "web"),
                port: 80
            })
        );
    }
}
