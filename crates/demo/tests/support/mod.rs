//! What the demo crate's tests share: an OS-picked loopback port and the
//! deadline of their waits (`ballast_testkit::eventually`).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

pub const DEADLINE: Duration = Duration::from_secs(10);

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}
