//! A small HTTP backend that names itself in every answer and can be slowed
//! down or made to fail, in process or over HTTP.
//!
//! It serves HTTP/1.1 (keep-alive) and HTTP/2 with prior knowledge (h2c) on
//! one port. Every request is answered `200` with the body `NAME\n` and the
//! header `x-backend: NAME`, after the configured delay; a configured fraction
//! of them is answered `500` instead. Requests under `/_backend/` steer a
//! running backend (useful when it runs as its own process):
//!
//! | request | effect |
//! |---|---|
//! | `POST /_backend/delay?ms=N` | wait N ms (at most 60000) before each answer |
//! | `POST /_backend/fail?rate=R` | answer the fraction R (0..=1) of requests `500` |
//! | `GET /_backend/stats` | `{"name":"NAME","requests":N}` |
//!
//! Control requests are answered at once and are not counted as requests.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ballast_serve::accept::Acceptor;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

/// The header every answer carries, naming the backend that gave it.
pub const BACKEND_HEADER: &str = "x-backend";

/// Connections served at once; further ones are closed on accept.
const MAX_CONNECTIONS: usize = 1024;
/// Concurrent HTTP/2 streams per connection.
const MAX_CONCURRENT_STREAMS: u32 = 256;
/// How long a client may take to send a request head on HTTP/1.1.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest delay the control path accepts, so a typo cannot park requests for days.
const MAX_DELAY_MS: u64 = 60_000;
/// Longest backend name: it is echoed in a header and in every body.
const MAX_NAME_LEN: usize = 253;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// A running backend. Dropping it stops the server and closes its connections.
pub struct Backend {
    addr: SocketAddr,
    state: Arc<State>,
    server: JoinHandle<()>,
}

impl Backend {
    /// Binds `bind` (port 0 lets the OS pick) and serves until dropped.
    ///
    /// `name` is echoed in the body and the `x-backend` header, so it must be
    /// a valid header value of at most 253 bytes.
    pub async fn start(name: &str, bind: SocketAddr) -> io::Result<Backend> {
        let header = HeaderValue::from_str(name)
            .ok()
            .filter(|_| !name.is_empty() && name.len() <= MAX_NAME_LEN)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "backend name {:?} is not usable: it must be 1 to {MAX_NAME_LEN} visible ASCII characters",
                        name.chars().take(64).collect::<String>()
                    ),
                )
            })?;
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            name: Arc::from(name),
            header,
            body: Bytes::from(format!("{name}\n")),
            arrived: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            delay_nanos: AtomicU64::new(0),
            failure_rate_bits: AtomicU64::new(0f64.to_bits()),
        });
        let server = tokio::spawn(serve(listener, state.clone()));
        Ok(Backend {
            addr,
            state,
            server,
        })
    }

    /// The address the backend listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Requests answered so far, whatever the status (control requests excluded).
    pub fn requests(&self) -> u64 {
        self.state.answered.load(Ordering::Relaxed)
    }

    /// Waits `d` before answering each request from now on (capped at 60 s).
    pub fn set_delay(&self, d: Duration) {
        self.state.set_delay(d);
    }

    /// Answers the fraction `rate` of requests `500` from now on; values
    /// outside `0.0..=1.0` are clamped, NaN counts as 0.
    pub fn set_failure_rate(&self, rate: f64) {
        self.state.set_failure_rate(rate);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // The server task owns the listener and a JoinSet of the connection
        // tasks; aborting it drops both, which aborts every connection.
        self.server.abort();
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.state.name)
            .field("addr", &self.addr)
            .field("requests", &self.requests())
            .finish()
    }
}

struct State {
    name: Arc<str>,
    header: HeaderValue,
    body: Bytes,
    /// Requests received, numbering them for the failure schedule.
    arrived: AtomicU64,
    answered: AtomicU64,
    delay_nanos: AtomicU64,
    failure_rate_bits: AtomicU64,
}

impl State {
    fn set_delay(&self, d: Duration) {
        let capped = d.min(Duration::from_millis(MAX_DELAY_MS));
        // At most 60 s in nanoseconds: fits u64 by far.
        let nanos = u64::try_from(capped.as_nanos()).unwrap_or(u64::MAX);
        self.delay_nanos.store(nanos, Ordering::Relaxed);
    }

    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    fn set_failure_rate(&self, rate: f64) {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        self.failure_rate_bits
            .store(rate.to_bits(), Ordering::Relaxed);
    }

    fn failure_rate(&self) -> f64 {
        f64::from_bits(self.failure_rate_bits.load(Ordering::Relaxed))
    }

    /// Whether the request numbered `seq` (from 1) fails: failures are spread
    /// evenly rather than drawn at random, so a rate of 0.25 fails exactly
    /// every fourth request and tests can count on it.
    fn fails(&self, seq: u64) -> bool {
        let rate = self.failure_rate();
        let n = seq as f64;
        (n * rate).floor() > ((n - 1.0) * rate).floor()
    }

    async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let (parts, body) = request.into_parts();
        drain(body).await;
        if let Some(control) = parts.uri.path().strip_prefix("/_backend/") {
            return Ok(self.control(&parts.method, control, parts.uri.query()));
        }
        let seq = self.arrived.fetch_add(1, Ordering::Relaxed) + 1;
        let delay = self.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let response = if self.fails(seq) {
            self.text(
                StatusCode::INTERNAL_SERVER_ERROR,
                Bytes::from(format!("{}: injected failure\n", self.name)),
            )
        } else {
            self.text(StatusCode::OK, self.body.clone())
        };
        // Counted before the answer leaves, so a client that has read the
        // answer always sees it counted.
        self.answered.fetch_add(1, Ordering::Relaxed);
        Ok(response)
    }

    fn control(&self, method: &Method, what: &str, query: Option<&str>) -> Response<Full<Bytes>> {
        let (expected, allow) = match what {
            "delay" | "fail" => (Method::POST, "POST"),
            "stats" => (Method::GET, "GET"),
            _ => {
                return self.text(
                    StatusCode::NOT_FOUND,
                    Bytes::from_static(
                        b"unknown control path; use POST /_backend/delay?ms=N, POST /_backend/fail?rate=R or GET /_backend/stats\n",
                    ),
                )
            }
        };
        if *method != expected {
            let mut response = self.text(
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from(format!("use {expected} for /_backend/{what}\n")),
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(allow));
            return response;
        }
        match what {
            "delay" => match query_param(query, "ms").and_then(|v| v.parse::<u64>().ok()) {
                Some(ms) if ms <= MAX_DELAY_MS => {
                    self.set_delay(Duration::from_millis(ms));
                    self.text(StatusCode::OK, Bytes::from(format!("delay {ms} ms\n")))
                }
                _ => self.text(
                    StatusCode::BAD_REQUEST,
                    Bytes::from(format!(
                        "expected ?ms=N with N a whole number from 0 to {MAX_DELAY_MS}\n"
                    )),
                ),
            },
            "fail" => match query_param(query, "rate").and_then(|v| v.parse::<f64>().ok()) {
                Some(rate) if (0.0..=1.0).contains(&rate) => {
                    self.set_failure_rate(rate);
                    self.text(
                        StatusCode::OK,
                        Bytes::from(format!("failure rate {rate}\n")),
                    )
                }
                _ => self.text(
                    StatusCode::BAD_REQUEST,
                    Bytes::from_static(b"expected ?rate=R with R from 0 to 1\n"),
                ),
            },
            _ => {
                let stats = serde_json::json!({
                    "name": &*self.name,
                    "requests": self.answered.load(Ordering::Relaxed),
                });
                let mut response = self.text(StatusCode::OK, Bytes::from(stats.to_string()));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
        }
    }

    fn text(&self, status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
        headers.insert(BACKEND_HEADER, self.header.clone());
        response
    }
}

/// The value of `key` in a query string (`a=1&b=2`); no percent-decoding,
/// the values read here are plain numbers.
fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Reads the request body frame by frame and throws it away: the backend
/// never holds more than one frame of it.
async fn drain(mut body: Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            // The client went away or broke framing; the connection ends anyway.
            return;
        }
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    let mut accepting = Acceptor::new("demo backend", listener);
    loop {
        tokio::select! {
            Some(_) = connections.join_next() => {}
            (stream, peer) = accepting.accept() => {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, name = %state.name, "backend connection limit reached; closing the new connection");
                    continue;
                };
                let http = http.clone();
                let state = state.clone();
                connections.spawn(async move {
                    serve_connection(&http, stream, peer, state).await;
                    drop(permit);
                });
            }
        }
    }
}

async fn serve_connection(
    http: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<State>,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "cannot set TCP_NODELAY on a backend connection");
    }
    let service = service_fn(move |request| state.clone().handle(request));
    if let Err(error) = http.serve_connection(TokioIo::new(stream), service).await {
        // Hang-ups and garbage from a client are its own business.
        tracing::debug!(%peer, %error, "backend connection ended with an error");
    }
}

/// Errors of `accept` that concern only the connection being accepted.
#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            name: Arc::from("t"),
            header: HeaderValue::from_static("t"),
            body: Bytes::from_static(b"t\n"),
            arrived: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            delay_nanos: AtomicU64::new(0),
            failure_rate_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn failures(state: &State, n: u64) -> u64 {
        (1..=n).filter(|&seq| state.fails(seq)).count() as u64
    }

    #[test]
    fn failures_are_spread_at_the_configured_rate() {
        let s = state();
        for (rate, expected) in [(0.0, 0), (1.0, 100), (0.5, 50), (0.25, 25), (0.1, 10)] {
            s.set_failure_rate(rate);
            assert_eq!(failures(&s, 100), expected, "rate {rate}");
        }
        s.set_failure_rate(0.25);
        let pattern: Vec<bool> = (1..=8).map(|seq| s.fails(seq)).collect();
        assert_eq!(
            pattern,
            [false, false, false, true, false, false, false, true]
        );
    }

    #[test]
    fn failure_rate_is_clamped() {
        let s = state();
        s.set_failure_rate(7.0);
        assert_eq!(s.failure_rate(), 1.0);
        s.set_failure_rate(-1.0);
        assert_eq!(s.failure_rate(), 0.0);
        s.set_failure_rate(f64::NAN);
        assert_eq!(s.failure_rate(), 0.0);
    }

    #[test]
    fn delay_is_capped() {
        let s = state();
        s.set_delay(Duration::from_secs(3600));
        assert_eq!(s.delay(), Duration::from_millis(MAX_DELAY_MS));
        s.set_delay(Duration::from_millis(5));
        assert_eq!(s.delay(), Duration::from_millis(5));
    }

    #[test]
    fn query_params() {
        assert_eq!(query_param(Some("ms=5"), "ms"), Some("5"));
        assert_eq!(query_param(Some("a=1&rate=0.5"), "rate"), Some("0.5"));
        assert_eq!(query_param(Some("rate"), "rate"), None);
        assert_eq!(query_param(None, "rate"), None);
    }
}
