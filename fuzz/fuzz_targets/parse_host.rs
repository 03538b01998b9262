//! `Host` / `:authority` to a mesh target.
//!
//! Input: `DOMAIN_CHOICE AUTHORITY`, the first byte picking a cluster domain.
//! Properties: a result names only what the authority holds (the service's
//! name and namespace are its first labels, the port is its port or 80, an
//! address's text is in it), and every result is a fixed point: parsing the
//! canonical form gives it back.
#![no_main]

use ballast_proxy::authority::{parse_host, HostTarget};
use libfuzzer_sys::fuzz_target;

const DOMAINS: [&str; 3] = ["cluster.local", "Example.ORG.", "c"];

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Ok(authority) = std::str::from_utf8(rest) else {
        return;
    };
    let domain = DOMAINS[usize::from(choice) % DOMAINS.len()];
    let canonical_domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let port = explicit_port(authority);
    match parse_host(authority, domain) {
        HostTarget::Other => {}
        HostTarget::Service(s) => {
            let (host, p) = s.rsplit_once(':').expect("service has a port");
            assert_eq!(p.parse::<u16>().ok(), Some(port.unwrap_or(80)), "{s}");
            let suffix = format!(".svc.{canonical_domain}");
            let name_ns = host.strip_suffix(&suffix).expect("canonical suffix");
            let (name, ns) = name_ns.split_once('.').expect("name.ns");
            assert!(!name.is_empty() && !ns.is_empty() && !ns.contains('.'));
            assert!(
                authority.to_ascii_lowercase().starts_with(name_ns),
                "{authority:?} -> {s:?}"
            );
            assert_eq!(parse_host(&s, domain), HostTarget::Service(s.clone()));
        }
        HostTarget::Addr(addr) => {
            assert_eq!(addr.port(), port.unwrap_or(80), "{authority:?}");
            let ip = addr.ip();
            let found = authority
                .split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
                .flat_map(|w| {
                    // The address, or the address then `:port`.
                    let cut = w.rsplit_once(':').map(|(h, _)| h);
                    [Some(w), cut].into_iter().flatten()
                })
                .any(|w| w.parse::<std::net::IpAddr>().ok() == Some(ip));
            assert!(found, "{authority:?} -> {addr}");
            assert_eq!(
                parse_host(&addr.to_string(), domain),
                HostTarget::Addr(addr)
            );
        }
    }
});

/// The port an authority states, when its last `:` is followed by one.
fn explicit_port(authority: &str) -> Option<u16> {
    if authority.starts_with('[') && authority.ends_with(']') {
        return None;
    }
    authority.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}
