//! The target path a proxy sends in `Get` / `GetProfile`.
//!
//! Input: `DOMAIN_CHOICE PATH`, the first byte picking a cluster domain.
//! Properties: an accepted path names only what it holds (an address is the
//! path itself; a service's name and namespace are its first two labels,
//! lowercased, its port the path's or 80), every answer is a fixed point of
//! its canonical form, and a refusal quotes the path only boundedly.
#![no_main]

use ballast_destination::authority::{parse, service_fqdn, DEFAULT_PORT, MAX_PATH_LEN};
use ballast_store::index::Target;
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;

const DOMAINS: [&str; 3] = ["cluster.local", "Example.ORG.", "c"];

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(rest) else {
        return;
    };
    let domain = DOMAINS[usize::from(choice) % DOMAINS.len()];
    match parse(path, domain) {
        Ok(Target::Addr(addr)) => {
            assert_ne!(addr.port(), 0);
            assert_eq!(path.parse::<SocketAddr>().ok(), Some(addr));
        }
        Ok(Target::Service { service, port }) => {
            assert!(path.len() <= MAX_PATH_LEN);
            assert_ne!(port, 0);
            let stated = path.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
            match stated {
                Some(p) => assert_eq!(p.ok(), Some(port), "{path:?}"),
                None => assert_eq!(port, DEFAULT_PORT),
            }
            let name_ns = format!("{}.{}", service.name, service.namespace);
            assert!(
                path.to_ascii_lowercase()
                    .starts_with(&format!("{name_ns}."))
                    || path
                        .to_ascii_lowercase()
                        .starts_with(&format!("{name_ns}:"))
                    || path.eq_ignore_ascii_case(&name_ns),
                "{path:?} -> {name_ns}"
            );
            for label in [&service.name, &service.namespace] {
                assert!(!label.is_empty() && label.len() <= 63);
                assert!(label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            }
            let canonical = format!("{}:{port}", service_fqdn(&service, domain));
            assert_eq!(
                parse(&canonical, domain),
                Ok(Target::Service { service, port }),
                "{path:?} -> {canonical:?}"
            );
        }
        Err(e) => {
            assert!(path.is_empty() || !e.shown.is_empty());
            assert!(e.shown.chars().count() <= 65, "{e}");
            assert!(path.starts_with(e.shown.trim_end_matches('…')));
            // 64 quoted characters, each escaped to at most 10 bytes, and a
            // short reason.
            assert!(e.to_string().len() < 64 * 10 + 200, "{e}");
        }
    }
});
