//! Ports, port lists, DNS names and HOST:PORT authorities, parsed the same
//! way by every command: a value that could not mean what the flag says is
//! refused at start (clap's exit code 2), never kept to fail later or,
//! worse, to quietly mean something else.

use crate::ValueError;
use std::ops::RangeInclusive;

/// Longest DNS name (RFC 1035: 253 characters in text form).
pub const MAX_DNS_NAME: usize = 253;
/// Longest DNS label.
pub const MAX_DNS_LABEL: usize = 63;

/// A port: 1 to 65535.
pub fn port(s: &str) -> Result<u16, ValueError> {
    let s = s.trim();
    match s.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ValueError::NotAPort(s.to_string())),
    }
}

/// A port list: comma-separated ports (1 to 65535) and ranges `LO-HI`;
/// blank entries are skipped, so the empty value is the empty list.
pub fn port_list(s: &str) -> Result<Vec<RangeInclusive<u16>>, ValueError> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let range = match entry.split_once('-') {
                Some((lo, hi)) => port(lo)
                    .and_then(|lo| Ok(lo..=port(hi)?))
                    .ok()
                    .filter(|r| !r.is_empty()),
                None => port(entry).ok().map(|p| p..=p),
            };
            range.ok_or_else(|| ValueError::NotAPortRange(entry.to_string()))
        })
        .collect()
}

/// A DNS name as Kubernetes writes them (RFC 1123, lower case): dot-separated
/// labels of `a-z`, `0-9` and `-`, each 1 to 63 characters and neither
/// starting nor ending with `-`, 253 characters in all. A cluster domain, a
/// trust domain, a service account, an identity.
pub fn dns_name(s: &str) -> Result<String, ValueError> {
    let bad = |reason: &'static str| ValueError::NotADnsName {
        value: s.to_string(),
        reason,
    };
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    if s.len() > MAX_DNS_NAME {
        return Err(bad("longer than 253 characters"));
    }
    for label in s.split('.') {
        check_label(label).map_err(bad)?;
    }
    Ok(s.to_string())
}

/// [`dns_name`], or the empty value where a flag gives it a meaning (an
/// empty server name dials in plaintext, an empty trust domain disables
/// identities).
pub fn dns_name_or_empty(s: &str) -> Result<String, ValueError> {
    if s.is_empty() {
        return Ok(String::new());
    }
    dns_name(s)
}

/// A single DNS label (RFC 1123, lower case, 1 to 63 characters): a
/// Kubernetes namespace.
pub fn dns_label(s: &str) -> Result<String, ValueError> {
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    check_label(s).map_err(|reason| ValueError::NotADnsName {
        value: s.to_string(),
        reason,
    })?;
    Ok(s.to_string())
}

fn check_label(label: &str) -> Result<(), &'static str> {
    if label.is_empty() {
        return Err("an empty label");
    }
    if label.len() > MAX_DNS_LABEL {
        return Err("a label longer than 63 characters");
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("only a-z, 0-9, '-' and '.' are allowed");
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err("a label starts or ends with '-'");
    }
    Ok(())
}

/// `HOST:PORT`: HOST a DNS name or an IP address (an IPv6 address in
/// brackets), PORT 1 to 65535 (digits only). Split by the mesh's one
/// authority grammar (`ballast-authority`), so a flag takes what the
/// controller and the proxy read. Not resolved here.
pub fn host_port(s: &str) -> Result<String, ValueError> {
    let bad = |reason: String| ValueError::NotAnAuthority {
        value: s.to_string(),
        reason,
    };
    if s.contains("://") {
        return Err(bad("a URL; give HOST:PORT, without a scheme".to_string()));
    }
    match ballast_authority::split(s).map_err(|e| bad(e.to_string()))? {
        (_, None) => Err(bad("no :PORT".to_string())),
        (ballast_authority::Host::Ip(_), Some(_)) => Ok(s.to_string()),
        (ballast_authority::Host::Name(""), Some(_)) => Err(bad("no HOST".to_string())),
        (ballast_authority::Host::Name(host), Some(_)) => dns_name(host)
            .map(|_| s.to_string())
            .map_err(|e| bad(e.to_string())),
    }
}

/// Any text but the empty (or blank) one.
pub fn non_empty(s: &str) -> Result<String, ValueError> {
    if s.trim().is_empty() {
        return Err(ValueError::Empty);
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_lists_take_ports_and_ranges_and_refuse_the_rest() {
        assert_eq!(port_list(""), Ok(vec![]));
        assert_eq!(
            port_list("25, 587,4000-4100"),
            Ok(vec![25..=25, 587..=587, 4000..=4100])
        );
        for bad in [
            "70000", "abc", "0", "-1", "10-5", "1-70000", "http-alt", "25,abc",
        ] {
            assert!(port_list(bad).is_err(), "{bad}");
        }
        let e = port_list("25,70000").unwrap_err().to_string();
        assert!(e.contains("\"70000\""), "{e}");
    }

    #[test]
    fn dns_names_are_lower_case_rfc_1123() {
        for good in ["cluster.local", "a", "web-1.shop", "x1.y2"] {
            assert_eq!(dns_name(good).as_deref(), Ok(good));
        }
        let long_label = "a".repeat(64);
        let long_name = ["a".repeat(63).as_str(); 5].join(".");
        for bad in [
            "",
            ".",
            "cluster..local",
            "cluster.local.",
            "-a.b",
            "a-.b",
            "Cluster.local",
            "http://x",
            "a_b",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(dns_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(dns_name_or_empty("").as_deref(), Ok(""));
        assert!(dns_name_or_empty(" ").is_err());
        for ok in ["shop", "a", "linkerd-2"] {
            assert!(dns_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "shop.web", "-a", "a-", "A", "a/b", &"x".repeat(64)] {
            assert!(dns_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn authorities_are_host_and_port() {
        for good in [
            "db.shop.svc.cluster.local:5432",
            "127.0.0.1:8086",
            "[::1]:8086",
            "localhost:1",
        ] {
            assert_eq!(host_port(good).as_deref(), Ok(good));
        }
        for bad in [
            "http://x",
            "x",
            "x:0",
            "x:70000",
            ":80",
            "[::1:80",
            "[127.0.0.1]:80",
            "::1:80",
            "web shop:80",
            "x:+80",
        ] {
            assert!(host_port(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blank_text_is_refused() {
        assert_eq!(non_empty("a").as_deref(), Ok("a"));
        assert_eq!(non_empty(" "), Err(ValueError::Empty));
    }
}
