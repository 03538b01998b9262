//! Which target an HTTP authority (`Host` / `:authority`) names.

use ballast_authority::Host;
use std::net::SocketAddr;

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

pub use ballast_route::request_host;

/// Reads `host[:port]` (port 80 when absent) by the mesh's one authority
/// grammar (`ballast_authority`); what it refuses is not for the mesh.
pub fn parse_host(authority: &str, cluster_domain: &str) -> HostTarget {
    let Ok((host, port)) = ballast_authority::split(authority) else {
        return HostTarget::Other;
    };
    let port = port.unwrap_or(ballast_authority::DEFAULT_PORT);
    match host {
        Host::Ip(ip) => HostTarget::Addr(SocketAddr::new(ip, port)),
        Host::Name(name) => match ballast_authority::service(name, cluster_domain) {
            Ok(s) => HostTarget::Service(format!(
                "{}:{port}",
                ballast_authority::service_fqdn(&s.name, &s.namespace, cluster_domain)
            )),
            Err(_) => HostTarget::Other,
        },
    }
}

/// Whether `authority` names its host by two labels only (`NAME.NS`), a
/// form that a name outside the mesh (`example.com`) shares.
pub fn is_short_name(authority: &str) -> bool {
    matches!(
        ballast_authority::split(authority),
        Ok((Host::Name(host), _)) if host.trim_end_matches('.').split('.').count() == 2
    )
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
