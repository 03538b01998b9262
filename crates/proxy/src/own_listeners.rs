//! The proxy's own listeners: traffic aimed at them would loop through the
//! proxy forever (seed 004), so it is refused.

use std::net::{IpAddr, SocketAddr, UdpSocket};

#[derive(Debug, Default)]
pub struct OwnListeners {
    addrs: Vec<SocketAddr>,
}

impl OwnListeners {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        Self { addrs }
    }

    /// Whether `target` reaches one of the proxy's listeners, as the kernel
    /// routes a connect: a listener bound to one address is reached only
    /// through that address (127.0.0.5 does not reach a listener on
    /// 127.0.0.1), one bound to the unspecified address through any address
    /// of this host, and a connect to the unspecified address goes to loopback.
    pub fn is_own(&self, target: SocketAddr) -> bool {
        let ip = reached(target.ip());
        self.addrs.iter().any(|own| {
            own.port() == target.port()
                && (reached(own.ip()) == ip
                    // 0.0.0.0 takes IPv4 only; [::] both (Linux's default).
                    || (own.ip().is_unspecified()
                        && (own.is_ipv6() || ip.is_ipv4())
                        && is_local(ip)))
        })
    }
}

/// The address a connect to `ip` reaches: an IPv4-mapped IPv6 address
/// reaches its IPv4 address, and Linux sends a connect to the unspecified
/// address to loopback.
fn reached(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        other => other,
    }
}

/// Whether `ip` is an address of this host: binding to it succeeds only then.
fn is_local(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_listeners_are_recognised() {
        let own = OwnListeners::new(vec![
            "127.0.0.1:4140".parse().expect("addr"),
            "0.0.0.0:4143".parse().expect("addr"),
            "[::]:4191".parse().expect("addr"),
        ]);
        let cases = [
            ("127.0.0.1:4140", true),
            // Another loopback address does not reach a listener bound to
            // 127.0.0.1: a backend may hold the same port there.
            ("127.0.0.5:4140", false),
            ("0.0.0.0:4140", true),
            ("127.0.0.1:4143", true),
            ("127.0.0.5:4143", true),
            ("0.0.0.0:4143", true),
            ("[::ffff:127.0.0.1]:4140", true),
            ("[::ffff:127.0.0.5]:4140", false),
            ("[::1]:4140", false),
            // An IPv4 listener is not reached over IPv6.
            ("[::1]:4143", false),
            // A dual-stack one is reached over IPv4 too.
            ("127.0.0.1:4191", true),
            ("127.0.0.5:4191", true),
            ("127.0.0.1:8080", false),
            // Not an address of this host.
            ("192.0.2.7:4143", false),
            ("192.0.2.7:4140", false),
        ];
        for (addr, want) in cases {
            assert_eq!(own.is_own(addr.parse().expect("addr")), want, "{addr}");
        }
    }
}
