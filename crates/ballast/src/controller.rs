//! What every controller command wires the same way: its two listeners, its
//! metrics registry, and the stop signal its tasks wait on.

use anyhow::Context;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

/// Binds the gRPC (`--addr`) and admin (`--admin-addr`) listeners and logs
/// where they listen (`{what} gRPC listening on ...`, which tests and scripts
/// read).
pub async fn listeners(
    what: &str,
    addr: SocketAddr,
    admin_addr: SocketAddr,
) -> anyhow::Result<(TcpListener, TcpListener)> {
    let grpc = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --addr {addr}"))?;
    let admin = TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {admin_addr}"))?;
    tracing::info!("{what} gRPC listening on {}", grpc.local_addr()?);
    tracing::info!("admin listening on {}", admin.local_addr()?);
    Ok((grpc, admin))
}

/// A registry with the process and memory metrics and the controller's own
/// (`register`), and the task sampling memory for it.
pub fn registry(register: impl FnOnce(&mut Registry)) -> (Registry, JoinHandle<()>) {
    let mut registry = Registry::default();
    register(&mut registry);
    ballast_admin::register_memory_metrics(&mut registry);
    ballast_admin::register_process_metrics(&mut registry);
    (registry, ballast_admin::spawn_memory_sampler())
}

/// The stop flag's receiving side, as a future each task can wait on.
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
