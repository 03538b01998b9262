//! Accept loops: a bounded number of connections per listener, each served
//! on its own task; accept errors (EMFILE) pause accepting instead of
//! spinning or failing.

use crate::metrics::{ListenerLabels, Metrics};
use std::{future::Future, sync::Arc, time::Duration};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{watch, Semaphore},
};

/// Pause after an accept error, so that a process out of file descriptors
/// does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

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

/// Accepts until `shutdown` turns true; each connection is handed to
/// `serve` on a new task.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    connections: Connections,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let labels = ListenerLabels { listener: name };
    let open = metrics.listener_connections.get_or_create_owned(&labels);
    let refused = metrics.listener_refused_total.get_or_create_owned(&labels);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(listener = name, error = %e, "accept failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = connections.permits.clone().try_acquire_owned() else {
            refused.inc();
            continue;
        };
        let _ = stream.set_nodelay(true);
        open.inc();
        let open = open.clone();
        let fut = serve(stream);
        tokio::spawn(async move {
            fut.await;
            open.dec();
            drop(permit);
        });
    }
}
