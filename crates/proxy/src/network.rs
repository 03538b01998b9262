//! IP networks (CIDR), as authorization policies and `--cluster-networks`
//! name them. Pure.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// An address prefix: `10.0.0.0/8`, `fd00::/8`, or one address (`/32`,
/// `/128`). Host bits are ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNetwork {
    addr: IpAddr,
    prefix_len: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkError {
    #[error("{0:?} is not an IP address")]
    Address(String),
    #[error("prefix length {len} is longer than the address ({max} bits)")]
    PrefixLen { len: u32, max: u8 },
}

impl IpNetwork {
    pub fn new(addr: IpAddr, prefix_len: u32) -> Result<Self, NetworkError> {
        let max = Self::bits(&addr);
        match u8::try_from(prefix_len) {
            Ok(len) if len <= max => Ok(Self {
                addr,
                prefix_len: len,
            }),
            _ => Err(NetworkError::PrefixLen {
                len: prefix_len,
                max,
            }),
        }
    }

    /// Every IPv4 address.
    pub const ALL_V4: Self = Self {
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        prefix_len: 0,
    };
    /// Every IPv6 address.
    pub const ALL_V6: Self = Self {
        addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        prefix_len: 0,
    };

    /// One address.
    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            prefix_len: Self::bits(&addr),
        }
    }

    fn bits(addr: &IpAddr) -> u8 {
        match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 address is read
    /// as the IPv4 address it carries.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                32,
                self.prefix_len,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), 128, self.prefix_len)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, bits: u8, prefix_len: u8) -> bool {
    let shift = u32::from(bits - prefix_len.min(bits));
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

impl FromStr for IpNetwork {
    type Err = NetworkError;

    /// `ADDR/LEN`, or an address alone (one host).
    fn from_str(s: &str) -> Result<Self, NetworkError> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| NetworkError::Address(s.chars().take(64).collect()))?;
        match len {
            None => Ok(Self::host(addr)),
            Some(l) => {
                let len = l
                    .parse::<u32>()
                    .map_err(|_| NetworkError::Address(s.chars().take(64).collect()))?;
                Self::new(addr, len)
            }
        }
    }
}

impl fmt::Display for IpNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Linkerd's default cluster networks.
pub const DEFAULT_CLUSTER_NETWORKS: &str =
    "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8";

/// A comma-separated list of networks; empty is none.
pub fn parse_networks(s: &str) -> Result<Vec<IpNetwork>, NetworkError> {
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_prefix_and_nothing_else() {
        let cases = [
            ("10.0.0.0/8", "10.255.1.2", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("100.64.0.0/10", "100.127.255.255", true),
            ("100.64.0.0/10", "100.128.0.0", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("0.0.0.0/0", "::1", false),
            ("::/0", "::1", true),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "fe80::1", false),
            ("127.0.0.1", "127.0.0.1", true),
            ("127.0.0.1", "127.0.0.2", false),
            // Host bits of the network are ignored.
            ("192.168.1.77/16", "192.168.200.1", true),
            // An IPv4-mapped client address is its IPv4 address.
            ("10.0.0.0/8", "::ffff:10.1.2.3", true),
        ];
        for (net, addr, expect) in cases {
            let n: IpNetwork = net.parse().unwrap();
            assert_eq!(n.contains(&ip(addr)), expect, "{net} contains {addr}");
        }
    }

    #[test]
    fn bad_networks_are_refused_by_name() {
        assert!("10.0.0.0/33".parse::<IpNetwork>().is_err());
        assert!("::/129".parse::<IpNetwork>().is_err());
        assert!("ten/8".parse::<IpNetwork>().is_err());
        assert!("10.0.0.0/x".parse::<IpNetwork>().is_err());
        let default = parse_networks(DEFAULT_CLUSTER_NETWORKS).unwrap();
        assert_eq!(default.len(), 5);
        assert_eq!(default[4].to_string(), "fd00::/8");
        assert_eq!(parse_networks(" ").unwrap(), vec![]);
    }
}
