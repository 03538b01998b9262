//! Accept loops: a bounded number of connections per listener, each served
//! on its own task; accept errors (EMFILE) pause accepting instead of
//! spinning or failing (`ballast_serve::accept::Acceptor`, the step every
//! server accepts with).

use crate::{memory::MemoryLimit, metrics::Metrics};
use ballast_serve::accept::Acceptor;
use futures_util::FutureExt;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{watch, Semaphore},
};

/// Refusals are logged at most this often per listener (they are counted
/// always): a flood must not become a flood of log lines.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Open connections of one listener; drained at shutdown.
#[derive(Clone, Debug)]
pub struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Connections {
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Waits until every connection has ended.
    pub async fn drained(&self) {
        let _ = self.permits.acquire_many(self.max as u32).await;
    }
}

/// Where an accept loop's connections go and what bounds them.
pub struct Listener {
    pub listener: TcpListener,
    pub name: &'static str,
    pub connections: Connections,
}

/// Accepts until `shutdown` turns true; each connection is handed to
/// `serve` on a new task. Over `--max-connections`, or while memory is at
/// its limit, an accepted connection is closed at once and counted.
pub async fn accept_loop<F, Fut>(
    l: Listener,
    metrics: Arc<Metrics>,
    memory: MemoryLimit,
    mut shutdown: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = l.name;
    let labels = ListenerLabels { listener: name };
    let open = metrics
        .listener
        .listener_connections
        .get_or_create_owned(&labels);
    let accept_errors = metrics
        .listener
        .listener_accept_errors_total
        .get_or_create_owned(&labels);
    let connections = l.connections;
    let mut accepting = Acceptor::new(name, l.listener).counting_errors(accept_errors);
    let refused = |reason| {
        metrics
            .listener
            .listener_refused_total
            .get_or_create_owned(&RefusedLabels {
                listener: name,
                reason,
            })
    };
    let (over_max, over_memory) = (refused("max_connections"), refused("memory_limit"));
    let mut last_refusal_log: Option<Instant> = None;
    let mut unlogged = 0u64;
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = accepting.accept() => accepted,
        };
        let reason = if memory.shed("connection") {
            over_memory.inc();
            Some("memory is at --memory-limit")
        } else {
            match connections.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let _ = stream.set_nodelay(true);
                    open.inc();
                    let open = open.clone();
                    // `map`, not an async block awaiting `fut`: that would
                    // keep room for the connection's future twice in its
                    // task, for the connection's whole life.
                    tokio::spawn(serve(stream).map(move |()| {
                        open.dec();
                        drop(permit);
                    }));
                    None
                }
                Err(_) => {
                    over_max.inc();
                    Some("the listener is at --max-connections")
                }
            }
        };
        if let Some(reason) = reason {
            // Dropping the stream closes it: the peer sees the refusal at once.
            unlogged += 1;
            if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                tracing::warn!(
                    listener = name,
                    refused = unlogged,
                    max_connections = connections.max,
                    "refusing connections: {reason}"
                );
                last_refusal_log = Some(Instant::now());
                unlogged = 0;
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: &'static str,
    /// `max_connections` or `memory_limit`.
    pub reason: &'static str,
}

/// The listeners' metrics: connections open, refused at accept, accept errors.
#[derive(Debug, Default)]
pub struct ListenerMetrics {
    /// Connections open on each listener.
    pub listener_connections: Family<ListenerLabels, Gauge>,
    /// Connections closed at accept, by listener and reason.
    pub listener_refused_total: Family<RefusedLabels, Counter>,
    /// Accept errors (EMFILE and the like); each pauses accepting.
    pub listener_accept_errors_total: Family<ListenerLabels, Counter>,
}

impl ListenerMetrics {
    /// Registers the families under the proxy's registry (Linkerd's names).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "listener_connections",
            "Connections open per listener",
            self.listener_connections.clone(),
        );
        r.register(
            "listener_refused",
            "Connections closed at accept: the listener was at --max-connections, or memory at --memory-limit",
            self.listener_refused_total.clone(),
        );
        r.register(
            "listener_accept_errors",
            "Accept errors (such as running out of file descriptors); each pauses accepting briefly",
            self.listener_accept_errors_total.clone(),
        );
    }
}
