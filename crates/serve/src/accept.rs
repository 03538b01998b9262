//! The one accept step every server uses ([`Acceptor`]), and the bounded
//! accept loop of Ballast's small HTTP/1 servers (the admin server, viz's
//! dashboard and the injector's webhook): at most `max_connections` served
//! at once, accept errors that never end the server, and a shutdown that
//! stops accepting and gives open connections a grace period before
//! closing them.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::rt::{Read, Write};
use hyper::server::conn::http1;
use hyper::service::HttpService;
use hyper_util::rt::TokioTimer;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::GaugeGuard;

/// Pause after an accept error that is not about one connection (running
/// out of file descriptors, say), so the loop does not spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Such errors are logged at most this often (with how many came between).
pub const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// A listener's accept step. Errors that concern only the connection being
/// accepted (reset or aborted before it was taken) are skipped; any other
/// (out of file descriptors, say) is counted, logged at most every
/// [`ACCEPT_ERROR_LOG_EVERY`] with how many came between, and pauses
/// accepting for [`ACCEPT_ERROR_PAUSE`]: the loop never spins and never
/// ends on an error.
pub struct Acceptor {
    listener: TcpListener,
    server: &'static str,
    errors: AcceptErrors,
    counted: Option<Counter>,
}

impl Acceptor {
    /// Accepts from `listener`; `server` names it in logs.
    pub fn new(server: &'static str, listener: TcpListener) -> Self {
        Self {
            listener,
            server,
            errors: AcceptErrors::default(),
            counted: None,
        }
    }

    /// Also counts every accept error in `errors`.
    pub fn counting_errors(mut self, errors: Counter) -> Self {
        self.counted = Some(errors);
        self
    }

    /// The next connection. Cancel-safe: dropped while waiting, no
    /// connection is lost.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok(accepted) => return accepted,
                Err(error) => {
                    if let Some(counted) = &self.counted {
                        counted.inc();
                    }
                    if is_connection_error(&error) {
                        tracing::debug!(server = self.server, %error, "a connection failed before it was accepted");
                        continue;
                    }
                    self.errors.log(self.server, &error);
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }
}

/// What happens to a connection arriving while `max_connections` are open.
#[derive(Clone, Debug)]
pub enum AtCapacity {
    /// It is not accepted until one ends: the listen backlog holds it.
    Wait,
    /// It is accepted and closed at once, unanswered, and counted here (a
    /// probe fails fast instead of timing out).
    Close(Counter),
}

/// The bounds of one server's accept loop.
#[derive(Clone, Debug)]
pub struct AcceptBounds {
    /// Most connections served at once (at least 1).
    pub max_connections: usize,
    /// What a connection past the bound gets.
    pub at_capacity: AtCapacity,
    /// Counts the connections open (kept by the loop).
    pub open: Gauge,
    /// How long open connections may take to finish once shutdown starts
    /// (each is told at once; the loop waits this long and a second more,
    /// then closes what is left).
    pub shutdown_grace: Duration,
}

/// Tells a connection that the server is stopping.
#[derive(Clone, Debug)]
pub struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// Resolves once the server stops (or is gone).
    pub async fn wait(&mut self) {
        // An error means the server is gone: stopping all the same.
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

/// Serves connections from `listener` until `shutdown` resolves: each
/// accepted connection, within `bounds`, is handed to `connection` and the
/// future it returns runs as its own task, holding its slot until it ends.
/// Then stops accepting, tells every connection ([`Stopping`]) and waits
/// for them within the shutdown grace. `server` names it in logs.
pub async fn serve_bounded<F, Fut>(
    server: &'static str,
    listener: TcpListener,
    bounds: AcceptBounds,
    shutdown: impl Future<Output = ()>,
    mut connection: F,
) where
    F: FnMut(TcpStream, SocketAddr, Stopping) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(
        bounds.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut acceptor = Acceptor::new(server, listener);
    loop {
        let waited = match bounds.at_capacity {
            AtCapacity::Wait => tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(ended) = connections.join_next() => {
                    log_task_end(server, ended);
                    continue;
                }
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
            },
            AtCapacity::Close(_) => None,
        };
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(ended) = connections.join_next(), if waited.is_none() => {
                log_task_end(server, ended);
                continue;
            }
            accepted = acceptor.accept() => accepted,
        };
        let (stream, peer) = accepted;
        // A waiting loop holds its permit already; a closing one takes it now.
        let Some(permit) = waited.or_else(|| permits.clone().try_acquire_owned().ok()) else {
            if let AtCapacity::Close(rejected) = &bounds.at_capacity {
                rejected.inc();
            }
            tracing::debug!(server, %peer, "connection limit reached; closing the new connection");
            continue;
        };
        let served = connection(stream, peer, Stopping(stopping.clone()));
        let open = GaugeGuard::new(&bounds.open);
        connections.spawn(async move {
            let _held = (permit, open);
            served.await;
        });
    }
    drop(acceptor);
    stop.send_replace(true);
    tracing::debug!(server, in_flight = connections.len(), "shutting down");
    let drain = async {
        while let Some(ended) = connections.join_next().await {
            log_task_end(server, ended);
        }
    };
    let outer = bounds.shutdown_grace.saturating_add(Duration::from_secs(1));
    if tokio::time::timeout(outer, drain).await.is_err() {
        tracing::warn!(
            server,
            remaining = connections.len(),
            "connections outlived the shutdown grace period; closing them"
        );
        connections.shutdown().await;
    }
}

/// An HTTP/1 server with the bounds each small server sets: a request head
/// within `header_read_timeout` (also how long an idle keep-alive
/// connection stays) and `max_head_bytes`.
pub fn http1_server(header_read_timeout: Duration, max_head_bytes: usize) -> http1::Builder {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(max_head_bytes)
        .keep_alive(true);
    http
}

/// Serves one HTTP/1 connection until it ends, the server stops or
/// `max_age` passes; then shuts it down gracefully: the request in flight
/// gets `grace` to finish.
pub async fn drive_http1<I, S, B>(
    server: &'static str,
    peer: SocketAddr,
    connection: http1::Connection<I, S>,
    mut stopping: Stopping,
    max_age: Option<Duration>,
    grace: Duration,
) where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: Read + Write + Unpin + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = pin!(connection);
    let aged = async {
        match max_age {
            Some(age) => tokio::time::sleep(age).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        ended = connection.as_mut() => {
            log_connection_end(server, peer, ended);
            return;
        }
        () = stopping.wait() => {}
        () = aged => {
            tracing::debug!(server, %peer, "connection reached its maximum age; closing it");
        }
    }
    connection.as_mut().graceful_shutdown();
    match tokio::time::timeout(grace, connection).await {
        Ok(ended) => log_connection_end(server, peer, ended),
        Err(_) => {
            tracing::debug!(server, %peer, "connection still busy after the grace period; closing it")
        }
    }
}

fn log_connection_end(server: &'static str, peer: SocketAddr, ended: Result<(), hyper::Error>) {
    if let Err(error) = ended {
        // Garbage, timeouts and hang-ups land here; they are the client's business.
        tracing::debug!(server, %peer, %error, "connection ended with an error");
    }
}

fn log_task_end(server: &'static str, ended: Result<(), tokio::task::JoinError>) {
    if let Err(error) = ended {
        if error.is_panic() {
            tracing::error!(server, %error, "connection task panicked");
        }
    }
}

/// Errors of `accept` that concern only the connection being accepted.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    )
}

/// Logs accept errors at most every [`ACCEPT_ERROR_LOG_EVERY`].
#[derive(Default)]
struct AcceptErrors {
    last: Option<Instant>,
    since: u64,
}

impl AcceptErrors {
    fn log(&mut self, server: &'static str, error: &io::Error) {
        self.since += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < ACCEPT_ERROR_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            server,
            %error,
            errors = self.since,
            "cannot accept connections (out of file descriptors?); pausing accepts, retrying shortly"
        );
        self.last = Some(now);
        self.since = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::task::JoinHandle;

    const SERVED: Duration = Duration::from_secs(10);

    /// A running loop on 127.0.0.1, stopped by [`Server::stop`].
    struct Server {
        addr: SocketAddr,
        stop: tokio::sync::oneshot::Sender<()>,
        task: JoinHandle<()>,
    }

    impl Server {
        async fn start<F, Fut>(bounds: AcceptBounds, connection: F) -> Self
        where
            F: FnMut(TcpStream, SocketAddr, Stopping) -> Fut + Send + 'static,
            Fut: Future<Output = ()> + Send + 'static,
        {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let shutdown = async {
                let _ = stopped.await;
            };
            let task = tokio::spawn(serve_bounded(
                "test", listener, bounds, shutdown, connection,
            ));
            Self { addr, stop, task }
        }

        /// Stops it; returns how long it took to end.
        async fn stop(self) -> Duration {
            let _ = self.stop.send(());
            let started = Instant::now();
            tokio::time::timeout(Duration::from_secs(30), self.task)
                .await
                .expect("the loop ends")
                .unwrap();
            started.elapsed()
        }

        /// A new connection's first read within `wait`: `Some(1)` when
        /// served, `Some(0)` when closed, `None` when nothing came.
        async fn connect(&self, wait: Duration) -> (TcpStream, Option<usize>) {
            let mut s = TcpStream::connect(self.addr).await.unwrap();
            let mut b = [0u8; 1];
            let read = match tokio::time::timeout(wait, s.read(&mut b)).await {
                Ok(Ok(n)) => Some(n),
                Ok(Err(_)) => Some(0),
                Err(_) => None,
            };
            (s, read)
        }
    }

    fn bounds(max_connections: usize, at_capacity: AtCapacity, open: &Gauge) -> AcceptBounds {
        AcceptBounds {
            max_connections,
            at_capacity,
            shutdown_grace: Duration::from_millis(200),
            open: open.clone(),
        }
    }

    /// A connection that answers one byte, then holds until the client
    /// hangs up or the server stops.
    async fn held(mut stream: TcpStream, _peer: SocketAddr, mut stopping: Stopping) {
        let _ = stream.write_all(b"+").await;
        let mut rest = Vec::new();
        tokio::select! {
            _ = stream.read_to_end(&mut rest) => {}
            () = stopping.wait() => {}
        }
    }

    #[tokio::test]
    async fn past_the_bound_a_waiting_loop_leaves_connections_in_the_backlog() {
        let open = Gauge::default();
        let server = Server::start(bounds(2, AtCapacity::Wait, &open), held).await;
        let (a, first) = server.connect(SERVED).await;
        let (_b, second) = server.connect(SERVED).await;
        assert_eq!((first, second), (Some(1), Some(1)), "two served");
        assert_eq!(open.get(), 2);
        // Never served while the two are open, so any wait shows it.
        let (_, third) = server.connect(Duration::from_millis(300)).await;
        assert_eq!(third, None, "the third waits");
        // One ends: the next is taken from the backlog.
        drop(a);
        let (_c, next) = server.connect(SERVED).await;
        assert_eq!(next, Some(1), "a freed slot serves the next");
        server.stop().await;
        assert_eq!(open.get(), 0, "every connection counted out");
    }

    #[tokio::test]
    async fn past_the_bound_a_closing_loop_closes_and_counts() {
        let (open, rejected) = (Gauge::default(), Counter::default());
        let at_capacity = AtCapacity::Close(rejected.clone());
        let server = Server::start(bounds(1, at_capacity, &open), held).await;
        let (_a, first) = server.connect(SERVED).await;
        assert_eq!(first, Some(1));
        let (_b, second) = server.connect(SERVED).await;
        assert_eq!(second, Some(0), "closed unanswered");
        assert_eq!(rejected.get(), 1);
        assert_eq!(open.get(), 1);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_connection_that_ignores_the_stop_is_closed_after_the_grace() {
        let open = Gauge::default();
        let (ended_tx, mut ended_rx) = tokio::sync::mpsc::channel::<()>(1);
        let stubborn = move |mut stream: TcpStream, _, _| {
            let ended = ended_tx.clone();
            async move {
                // Dropped (the task aborted) rather than finished.
                let _ended = ended;
                let _ = stream.write_all(b"+").await;
                std::future::pending::<()>().await;
            }
        };
        let server = Server::start(bounds(4, AtCapacity::Wait, &open), stubborn).await;
        let (_a, first) = server.connect(SERVED).await;
        assert_eq!(first, Some(1));
        let took = server.stop().await;
        assert!(
            took >= Duration::from_millis(1200),
            "it waited the grace and a second more: {took:?}"
        );
        assert!(
            ended_rx.recv().await.is_none(),
            "the connection was dropped"
        );
        assert_eq!(open.get(), 0, "and counted out");
    }
}
