//! Opaque-port sets, as written in `config.linkerd.io/opaque-ports`.

use std::ops::RangeInclusive;

/// A set of ports: numbers and ranges, plus port names resolved by the caller.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PortSet {
    ranges: Vec<RangeInclusive<u16>>,
    names: Vec<String>,
}

/// Linkerd's default opaque ports (SMTP, MySQL, Galera, PostgreSQL, Redis,
/// Elasticsearch, memcached): protocols that speak first from the server.
pub const DEFAULT_OPAQUE_PORTS: &str = "25,587,3306,4444,5432,6379,9300,11211";

impl PortSet {
    /// Parses `"25,587,4000-4100,http-alt"`. Entries that are not numbers or
    /// ranges are kept as port names; malformed ranges are an error.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut set = PortSet::default();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Some((lo, hi)) = entry.split_once('-') {
                match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
                    (Ok(lo), Ok(hi)) if lo <= hi => set.ranges.push(lo..=hi),
                    (Ok(_), Ok(_)) | (Ok(_), Err(_)) | (Err(_), Ok(_)) => {
                        return Err(format!("bad port range {entry:?}"))
                    }
                    // "http-alt": a port name with a dash.
                    (Err(_), Err(_)) => set.names.push(entry.to_string()),
                }
            } else if let Ok(p) = entry.parse::<u16>() {
                set.ranges.push(p..=p);
            } else if entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                set.names.push(entry.to_string());
            } else {
                return Err(format!("bad port {entry:?}"));
            }
        }
        Ok(set)
    }

    /// Is `port` in the set? `name_of` maps a port name to its number.
    pub fn contains(&self, port: u16, name_of: impl Fn(&str) -> Option<u16>) -> bool {
        self.ranges.iter().any(|r| r.contains(&port))
            || self.names.iter().any(|n| name_of(n) == Some(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numbers_ranges_and_names() {
        let set = PortSet::parse("25, 4000-4002,admin-http").unwrap();
        assert!(set.contains(25, |_| None));
        assert!(set.contains(4001, |_| None));
        assert!(!set.contains(4003, |_| None));
        assert!(set.contains(9000, |n| (n == "admin-http").then_some(9000)));
        assert!(PortSet::parse("10-5").is_err());
        assert!(PortSet::parse("a b").is_err());
        assert!(PortSet::parse(DEFAULT_OPAQUE_PORTS)
            .unwrap()
            .contains(3306, |_| None));
    }
}
