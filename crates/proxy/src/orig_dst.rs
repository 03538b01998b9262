//! The destination a connection had before iptables redirected it to the
//! proxy (`SO_ORIGINAL_DST`).

use std::net::SocketAddr;
use tokio::net::TcpStream;

/// The original destination, or `None` when the connection was not
/// redirected (it reached the proxy's listener directly).
pub fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    let sock = socket2::SockRef::from(stream);
    let orig = if local.is_ipv4() {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    orig.ok()?.as_socket().filter(|dst| *dst != local)
}
