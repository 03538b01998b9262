//! What the demo crate's tests share: an OS-picked loopback port and a
//! condition wait with a deadline.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(10);

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
