//! A steady HTTP/1.1 load client: a fixed request rate spread over a few
//! keep-alive connections, each answer attributed to the backend named in
//! its `x-backend` header.

mod histogram;
mod stats;

pub use histogram::Histogram;
pub use stats::{
    Counts, Failures, LoadStats, Outcome, Snapshot, MAX_BACKENDS, NO_BACKEND, OTHER_BACKENDS, SLOTS,
};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::header::{HeaderValue, HOST};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::backend::BACKEND_HEADER;

/// The header a Linkerd-style proxy puts on answers it made itself.
pub const PROXY_ERROR_HEADER: &str = "l5d-proxy-error";

/// Highest rate accepted, so a typo cannot turn the demo into a flood.
pub const MAX_RPS: u32 = 100_000;
/// Most connections one client opens.
pub const MAX_CONNECTIONS: usize = 256;

/// What to send, where, and how fast.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Where to connect (the proxy's outbound listener).
    pub target: SocketAddr,
    /// The `Host` header, naming the service (`web.demo.svc.cluster.local`).
    pub authority: String,
    /// The request path.
    pub path: String,
    /// Requests per second, over all connections.
    pub rps: u32,
    /// Keep-alive connections the rate is spread over.
    pub connections: usize,
    /// Longest wait for a whole answer (connect included); the connection
    /// is dropped after it.
    pub timeout: Duration,
}

impl LoadConfig {
    pub fn new(target: SocketAddr, authority: impl Into<String>) -> Self {
        Self {
            target,
            authority: authority.into(),
            path: "/".to_string(),
            rps: 200,
            connections: 4,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A running load client. Dropping it stops sending and closes its connections.
pub struct LoadClient {
    stats: Arc<Mutex<LoadStats>>,
    config: LoadConfig,
    started: Instant,
    _workers: JoinSet<()>,
}

impl LoadClient {
    /// Starts sending at once; needs a Tokio runtime.
    pub fn start(config: LoadConfig) -> anyhow::Result<LoadClient> {
        anyhow::ensure!(
            (1..=MAX_RPS).contains(&config.rps),
            "the request rate must be 1 to {MAX_RPS} per second, not {}",
            config.rps
        );
        let connections = config.connections.clamp(1, MAX_CONNECTIONS);
        let connections = connections.min(config.rps as usize);
        let host = HeaderValue::from_str(&config.authority).map_err(|_| {
            anyhow::anyhow!("{:?} is not usable as a Host header", config.authority)
        })?;
        let uri: http::Uri = config
            .path
            .parse()
            .map_err(|_| anyhow::anyhow!("{:?} is not a request path", config.path))?;
        let started = Instant::now();
        let stats = Arc::new(Mutex::new(LoadStats::new(started)));
        // Each connection sends at rps/connections, offset from the others so
        // the requests are spread over the period rather than bunched.
        let period = Duration::from_secs_f64(connections as f64 / f64::from(config.rps));
        let mut workers = JoinSet::new();
        for i in 0..connections {
            let offset = period.mul_f64(i as f64 / connections as f64);
            let worker = Worker {
                target: config.target,
                host: host.clone(),
                uri: uri.clone(),
                timeout: config.timeout,
                stats: stats.clone(),
            };
            workers.spawn(worker.run(tokio::time::Instant::now() + offset, period));
        }
        Ok(LoadClient {
            stats,
            config: LoadConfig {
                connections,
                ..config
            },
            started,
            _workers: workers,
        })
    }

    /// The configuration in force (connections adjusted to the rate).
    pub fn config(&self) -> &LoadConfig {
        &self.config
    }

    /// When sending started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Everything counted since the start.
    pub fn snapshot(&self) -> Snapshot {
        self.with_stats(|s| s.snapshot())
    }

    /// What was counted in the last `span` (whole seconds, at most 10).
    pub fn window(&self, span: Duration) -> Snapshot {
        let now = Instant::now();
        self.with_stats(|s| s.window(now, span))
    }

    /// The latest error the client met, if any.
    pub fn last_error(&self) -> Option<String> {
        self.with_stats(|s| s.last_error().map(str::to_string))
    }

    fn with_stats<T>(&self, f: impl FnOnce(&LoadStats) -> T) -> T {
        // The lock is only held for counter updates; a panic while holding
        // it cannot leave the counters half-written in a way that matters.
        f(&self.stats.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

struct Worker {
    target: SocketAddr,
    host: HeaderValue,
    uri: http::Uri,
    timeout: Duration,
    stats: Arc<Mutex<LoadStats>>,
}

/// An answer as the client classifies it.
struct Answer {
    backend: Option<String>,
    outcome: Outcome,
}

impl Worker {
    async fn run(self, first: tokio::time::Instant, period: Duration) {
        let mut ticks = tokio::time::interval_at(first, period);
        // A slow answer delays this connection's next requests rather than
        // firing a burst afterwards: one request in flight per connection.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut connection: Option<http1::SendRequest<Empty<Bytes>>> = None;
        loop {
            ticks.tick().await;
            let start = Instant::now();
            let result = tokio::time::timeout(self.timeout, self.send(&mut connection)).await;
            let end = Instant::now();
            let (backend, outcome, latency) = match result {
                Ok(Ok(answer)) => (answer.backend, answer.outcome, Some(end - start)),
                Ok(Err(error)) => {
                    connection = None;
                    self.note_error(&error);
                    (None, Outcome::Transport, None)
                }
                Err(_) => {
                    connection = None;
                    self.note_error(&format!(
                        "no answer within {:?} from {}",
                        self.timeout, self.target
                    ));
                    (None, Outcome::Timeout, None)
                }
            };
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.record(end, backend.as_deref(), outcome, latency);
        }
    }

    async fn send(
        &self,
        connection: &mut Option<http1::SendRequest<Empty<Bytes>>>,
    ) -> Result<Answer, String> {
        let sender = match connection {
            Some(sender) if !sender.is_closed() => sender,
            _ => connection.insert(self.connect().await?),
        };
        sender
            .ready()
            .await
            .map_err(|e| format!("connection to {} lost: {e}", self.target))?;
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = self.uri.clone();
        request.headers_mut().insert(HOST, self.host.clone());
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request to {} failed: {e}", self.target))?;
        classify(response).await
    }

    async fn connect(&self) -> Result<http1::SendRequest<Empty<Bytes>>, String> {
        let stream = TcpStream::connect(self.target)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.target))?;
        // Small requests at a steady pace: no reason to wait for Nagle.
        let _ = stream.set_nodelay(true);
        let (sender, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {} failed: {e}", self.target))?;
        // The driver ends when the connection closes (the sender then
        // reports closed) or when the sender is dropped.
        tokio::spawn(async move {
            if let Err(error) = driver.await {
                tracing::debug!(%error, "load connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn note_error(&self, error: &str) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .note_error(error);
    }
}

/// Reads the answer's body to its end (frame by frame, nothing kept) and
/// classifies it.
async fn classify(response: Response<Incoming>) -> Result<Answer, String> {
    let (parts, mut body) = response.into_parts();
    while let Some(frame) = body.frame().await {
        frame.map_err(|e| format!("reading an answer failed: {e}"))?;
    }
    let backend = parts
        .headers
        .get(BACKEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = parts.status.as_u16();
    let outcome = if parts.headers.contains_key(PROXY_ERROR_HEADER) {
        Outcome::ProxyError(status)
    } else if parts.status.is_success() {
        Outcome::Success
    } else {
        Outcome::Status(status)
    };
    Ok(Answer { backend, outcome })
}
