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

    /// Whether `target` reaches one of the proxy's listeners.
    pub fn is_own(&self, target: SocketAddr) -> bool {
        self.addrs.iter().any(|own| {
            own.port() == target.port()
                && (own.ip() == target.ip()
                    || target.ip().is_loopback()
                    || target.ip().is_unspecified()
                    || (own.ip().is_unspecified() && is_local(target.ip())))
        })
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
        ]);
        let cases = [
            ("127.0.0.1:4140", true),
            ("127.0.0.5:4140", true),
            ("0.0.0.0:4140", true),
            ("127.0.0.1:4143", true),
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
