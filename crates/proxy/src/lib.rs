//! Ballast's sidecar proxy.
//!
//! ```text
//! accept ─> route (original destination / Host / TCP route) ─> detect protocol
//!        ─> balancer (P2C over peak-EWMA, bounded wait with failfast)
//!        ─> endpoint connections (pooled HTTP/1, shared HTTP/2, or TCP)
//! discovery: one Get stream per target in use, over one connection to the
//! controller; last-known endpoints survive the controller's absence.
//! ```
//!
//! The proxy talks to the controller only over Linkerd's Destination API.

#![forbid(unsafe_code)]

pub mod authority;
pub mod balance;
mod cache;
pub mod config;
pub mod connect;
pub mod detect;
pub mod discovery;
pub mod http;
pub mod identity;
mod inbound;
mod io;
pub mod listen;
pub mod memory;
pub mod metrics;
pub mod network;
mod orig_dst;
mod outbound;
mod own_listeners;
mod pipeline;
mod route;
pub mod tap;
mod tcp;

pub use config::Config;
pub use metrics::Metrics;

use discovery::{ControlPlane, Discovery};
use listen::{accept_loop, Connections, Listener};
use memory::MemoryLimit;
use own_listeners::OwnListeners;
use pipeline::Pipeline;
use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};

/// The proxy's bound listeners.
pub struct Listeners {
    pub outbound: TcpListener,
    pub inbound: TcpListener,
    /// `--outbound-tcp` listeners and their authorities.
    pub tcp_routes: Vec<(TcpListener, String)>,
    /// The admin listener's address (served by the caller); traffic to it is
    /// refused like traffic to the others.
    pub admin: SocketAddr,
    /// The Tap API's listener (`--tap-addr`), served with `config.tap`.
    pub tap: Option<tap::TapListener>,
}

/// Runs the proxy until `shutdown` completes, then stops accepting and
/// waits for open connections, at most `config.shutdown_grace`.
pub async fn serve(
    config: Config,
    listeners: Listeners,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let mut own = vec![listeners.admin];
    if let Some(t) = &listeners.tap {
        own.push(
            t.listener
                .local_addr()
                .map_err(|e| format!("tap listener address: {e}"))?,
        );
    }
    for l in std::iter::once(&listeners.outbound)
        .chain(std::iter::once(&listeners.inbound))
        .chain(listeners.tcp_routes.iter().map(|(l, _)| l))
    {
        own.push(
            l.local_addr()
                .map_err(|e| format!("listener address: {e}"))?,
        );
    }
    let own = Arc::new(OwnListeners::new(own));
    let control = ControlPlane::new(config.control.clone(), metrics.clone())?;
    let control = match &config.snapshot {
        Some(book) => control.with_book(book.clone()),
        None => control,
    };
    let snapshot_writer = config.snapshot.as_ref().map(|book| {
        let connected = control.clone();
        book.spawn_writer(move || connected.is_connected())
    });
    let (final_snapshot, connected) = (config.snapshot.clone(), control.clone());
    let discovery = Discovery::new(
        control,
        config.outbound.max_endpoints_per_target,
        config.traffic.max_targets,
        config.outbound.stale_endpoints_grace,
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let memory = MemoryLimit::start(config.memory_limit, metrics.clone());
    // Drops the traffic metric series unused for the retention.
    let sweeper = cache::spawn_sweeper(Arc::downgrade(&metrics), metrics.sweep_period(), |m| {
        m.sweep(tokio::time::Instant::now())
    });
    let outbound = outbound::Outbound::new(outbound::OutboundParts {
        config: config.outbound.clone(),
        traffic: config.traffic.clone(),
        discovery: discovery.clone(),
        metrics: metrics.clone(),
        own: own.clone(),
        limits: config.http,
        mesh: config.mesh.clone(),
        pod: config.inbound.pod.clone(),
    });
    let inbound = inbound::Inbound::new(inbound::InboundParts {
        config: config.inbound.clone(),
        traffic: config.traffic.clone(),
        limits: config.http,
        metrics: metrics.clone(),
        own,
        mesh: config.mesh.clone(),
        discovery,
    });
    let (taps, tap_listener) = match (&config.tap, listeners.tap) {
        (Some(c), Some(l)) => (tap::Taps::new(c, l.metrics), Some(l.listener)),
        _ => (tap::Taps::disabled(), None),
    };
    let pipeline = Arc::new(Pipeline {
        detect_timeout: config.traffic.detect_timeout,
        limits: config.http,
        metrics: metrics.clone(),
        memory: memory.clone(),
        shutdown: stop_rx.clone(),
        tap: taps.clone(),
    });

    let mut tasks = Vec::new();
    let mut all = Vec::new();
    let mut listen = |listener, name, max| {
        let connections = Connections::new(max);
        all.push(connections.clone());
        Listener {
            listener,
            name,
            connections,
        }
    };

    let l = listen(
        listeners.outbound,
        "outbound",
        config.outbound.max_connections,
    );
    let (o, p) = (outbound.clone(), pipeline.clone());
    tasks.push(tokio::spawn(accept_loop(
        l,
        metrics.clone(),
        memory.clone(),
        stop_rx.clone(),
        move |s| p.clone().serve(o.clone(), s),
    )));

    for (listener, authority) in listeners.tcp_routes {
        let l = listen(listener, "outbound_tcp", config.outbound.max_connections);
        let (o, p) = (outbound.clone(), pipeline.clone());
        let authority: Arc<str> = Arc::from(authority);
        tasks.push(tokio::spawn(accept_loop(
            l,
            metrics.clone(),
            memory.clone(),
            stop_rx.clone(),
            move |s| {
                let route = outbound::Outbound::tcp_route(authority.clone());
                p.clone().serve_routed(o.clone(), s, route)
            },
        )));
    }

    #[cfg(feature = "tap")]
    if let (Some(listener), Some(c)) = (tap_listener, &config.tap) {
        let max = c.max_connections;
        if let Some(serving) = tap::TapServing::new(&taps, c.clone(), config.mesh.as_ref()) {
            // Not drained at shutdown: taps never end by themselves.
            let l = Listener {
                listener,
                name: "tap",
                connections: Connections::new(max),
            };
            let stop = stop_rx.clone();
            tasks.push(tokio::spawn(accept_loop(
                l,
                metrics.clone(),
                memory.clone(),
                stop_rx.clone(),
                move |s| serving.clone().serve(s, stop.clone()),
            )));
        }
    }
    #[cfg(not(feature = "tap"))]
    drop(tap_listener);

    let l = listen(listeners.inbound, "inbound", config.inbound.max_connections);
    tasks.push(tokio::spawn(accept_loop(
        l,
        metrics.clone(),
        memory,
        stop_rx,
        move |s| pipeline.clone().serve(inbound.clone(), s),
    )));

    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let drained = async {
        for c in &all {
            c.drained().await;
        }
    };
    if tokio::time::timeout(config.shutdown_grace, drained)
        .await
        .is_err()
    {
        tracing::info!("shutdown grace passed with connections still open; closing them");
    }
    sweeper.abort();
    if let (Some(book), Some(writer)) = (final_snapshot, snapshot_writer) {
        writer.abort();
        // What the controller said last, for the next start.
        let flushed = book.flush(connected.is_connected());
        if tokio::time::timeout(Duration::from_secs(1), flushed)
            .await
            .is_err()
        {
            tracing::warn!("the snapshot was not written within 1s at shutdown");
        }
    }
    Ok(())
}
