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
use ballast_authority::Host;
use std::net::SocketAddr;

/// The longest path considered: a DNS name (253) plus `:65535`.
pub const MAX_PATH_LEN: usize = ballast_authority::MAX_LEN;
/// Port assumed when the path names none.
pub const DEFAULT_PORT: u16 = ballast_authority::DEFAULT_PORT;

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
    match ballast_authority::split(path).map_err(fail)? {
        (Host::Ip(ip), Some(port)) => Ok(Target::Addr(SocketAddr::new(ip, port))),
        (Host::Ip(_), None) => Err(fail("an IP address needs a port (IP:PORT, [IPv6]:PORT)")),
        (Host::Name(host), port) => {
            let service = ballast_authority::service(host, cluster_domain).map_err(fail)?;
            Ok(Target::Service {
                service: ObjectKey::new(service.namespace, service.name),
                port: port.unwrap_or(DEFAULT_PORT),
            })
        }
    }
}

/// The canonical name of a service: `NAME.NS.svc.CLUSTER_DOMAIN`.
pub fn service_fqdn(service: &ObjectKey, cluster_domain: &str) -> String {
    ballast_authority::service_fqdn(&service.name, &service.namespace, cluster_domain)
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
