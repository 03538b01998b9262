//! The viz HTTP/1.1 server: the dashboard (`/`, `/assets/*`, embedded), the
//! JSON API the dashboard and the CLI read (`/api/*`, shapes in
//! `ballast_vizcore::api`), `/api/tap` as an NDJSON stream, `/live` and
//! `/ready`.
//!
//! Bounds: `--max-connections` connections (128; at the bound the server
//! stops accepting and the backlog waits), a request head within 10 s and
//! 16 KiB, GET only (no body is ever read), and a client that stops reading
//! its answer for [`DEFAULT_WRITE_STALL_TIMEOUT`] (30 s) is cut, so a
//! stalled reader holds its connection slot and its one buffered answer for
//! that long at most.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ballast_serve::accept::{drive_http1, http1_server, serve_bounded, AcceptBounds, AtCapacity};
use ballast_vizcore::api::ResourceRef;
use ballast_vizcore::mesh::{canonical_kind, Mesh, QueryError, StatQuery};
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;

use crate::collector::{lock, Clock};
use crate::metrics::{PathLabels, VizMetrics};
use crate::tap::{TapError, Tapper};

pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head read (request line and headers).
const MAX_HEAD_BYTES: usize = 16 * 1024;

const JSON: &str = "application/json";
const NDJSON: &str = "application/x-ndjson";
const TEXT: &str = "text/plain; charset=utf-8";
/// The dashboard loads only its own files and talks only to its own API.
const CSP: &str = "default-src 'self'";

/// The server's bounds.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// A connection whose writes make no progress this long is closed.
    pub write_stall_timeout: Duration,
    /// On shutdown, how long open answers (taps) get to finish.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// What the server answers from.
pub struct Viz {
    pub mesh: Arc<Mutex<Mesh>>,
    pub tapper: Arc<Tapper>,
    /// Set after the collector's first cycle.
    pub ready: Arc<AtomicBool>,
    pub clock: Clock,
    pub metrics: VizMetrics,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Serves `viz` on `listener` until `shutdown`, then lets open answers
/// finish within the grace period.
pub async fn serve(
    listener: TcpListener,
    viz: Arc<Viz>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let http = http1_server(config.header_read_timeout, MAX_HEAD_BYTES);
    let bounds = AcceptBounds {
        max_connections: config.max_connections,
        // At the bound, stop accepting: the listen backlog holds the rest.
        at_capacity: AtCapacity::Wait,
        shutdown_grace: config.shutdown_grace,
        open: viz.metrics.http_connections.clone(),
    };
    let (grace, stall) = (config.shutdown_grace, config.write_stall_timeout);
    serve_bounded(
        "viz",
        listener,
        bounds,
        shutdown,
        |stream, peer, stopping| {
            let _ = stream.set_nodelay(true);
            let viz = viz.clone();
            let connection = http.serve_connection(
                TokioIo::new(StallGuard::new(stream, stall)),
                service_fn(move |request: Request<Incoming>| {
                    let viz = viz.clone();
                    async move { Ok::<_, Infallible>(respond(&viz, &request)) }
                }),
            );
            drive_http1("viz", peer, connection, stopping, None, grace)
        },
    )
    .await;
}

/// What a request path is, for routing and the `path` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Asset,
    Live,
    Ready,
    Overview,
    Stat,
    Edges,
    Routes,
    Workload,
    Pods,
    Tap,
    /// Under `/api/` but none of the above: a JSON 404.
    UnknownApi,
    NotFound,
}

impl Route {
    pub fn of(path: &str) -> Route {
        match path {
            "/live" => Route::Live,
            "/ready" => Route::Ready,
            "/api/overview" => Route::Overview,
            "/api/stat" => Route::Stat,
            "/api/edges" => Route::Edges,
            "/api/routes" => Route::Routes,
            "/api/workload" => Route::Workload,
            "/api/pods" => Route::Pods,
            "/api/tap" => Route::Tap,
            p if p == "/api" || p.starts_with("/api/") => Route::UnknownApi,
            p if crate::assets::asset(p).is_some() => Route::Asset,
            _ => Route::NotFound,
        }
    }

    /// The `path` label of `viz_http_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            Route::Asset => "asset",
            Route::Live => "/live",
            Route::Ready => "/ready",
            Route::Overview => "/api/overview",
            Route::Stat => "/api/stat",
            Route::Edges => "/api/edges",
            Route::Routes => "/api/routes",
            Route::Workload => "/api/workload",
            Route::Pods => "/api/pods",
            Route::Tap => "/api/tap",
            Route::UnknownApi | Route::NotFound => "unknown",
        }
    }
}

fn respond<B>(viz: &Viz, request: &Request<B>) -> Response<Body> {
    let path = request.uri().path();
    let route = Route::of(path);
    viz.metrics
        .http_requests
        .get_or_create(&PathLabels {
            path: route.label(),
        })
        .inc();
    if request.method() != Method::GET {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let query = request.uri().query().unwrap_or("");
    match route {
        Route::Asset => match crate::assets::asset(path) {
            Some(a) => asset(a.content_type, a.body),
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        },
        Route::Live => text(StatusCode::OK, "live\n"),
        Route::Ready if viz.ready.load(Ordering::Acquire) => text(StatusCode::OK, "ready\n"),
        Route::Ready => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        Route::Tap => tap(viz, query),
        Route::UnknownApi => error(StatusCode::NOT_FOUND, format!("no API at {path}")),
        Route::NotFound => text(StatusCode::NOT_FOUND, "not found\n"),
        Route::Overview
        | Route::Stat
        | Route::Edges
        | Route::Routes
        | Route::Workload
        | Route::Pods => match api(viz, route, query) {
            Ok(body) => json(StatusCode::OK, body),
            Err(e) => error(e.status(), e.to_string()),
        },
    }
}

/// Why an API request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadQuery(String),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("cannot encode the answer: {0}")]
    Encode(#[from] serde_json::Error),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::Query(QueryError::NotFound(_)) => StatusCode::NOT_FOUND,
            ApiError::Query(_) => StatusCode::BAD_REQUEST,
            ApiError::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A query string's parameters, each at most once, only those `allowed`.
pub struct Params(HashMap<String, String>);

impl Params {
    pub fn parse(query: &str, allowed: &[&str]) -> Result<Params, ApiError> {
        let mut params = HashMap::new();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            if !allowed.contains(&key.as_ref()) {
                let allowed = if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                };
                return Err(ApiError::BadQuery(format!(
                    "unknown parameter {key:?} (allowed: {allowed})"
                )));
            }
            if params.insert(key.to_string(), value.into_owned()).is_some() {
                return Err(ApiError::BadQuery(format!("parameter {key:?} given twice")));
            }
        }
        Ok(Params(params))
    }

    /// The value, `None` when absent or empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn required(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key)
            .ok_or_else(|| ApiError::BadQuery(format!("parameter {key:?} is required")))
    }

    /// A namespace parameter: absent, or a DNS-1123 label.
    pub fn namespace(&self, key: &str) -> Result<Option<&str>, ApiError> {
        self.get(key)
            .map(|v| crate::names::check_namespace(v, key).map(|()| v))
            .transpose()
            .map_err(ApiError::BadQuery)
    }

    /// An object name parameter: absent, or a DNS-1123 subdomain.
    pub fn name(&self, key: &str) -> Result<Option<&str>, ApiError> {
        self.get(key)
            .map(|v| crate::names::check_name(v, key).map(|()| v))
            .transpose()
            .map_err(ApiError::BadQuery)
    }

    /// A `KIND/NAME` parameter: absent, or with a valid name.
    pub fn kind_name(&self, key: &str) -> Result<Option<&str>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some((_, name)) = v.split_once('/') {
            crate::names::check_name(name, key).map_err(ApiError::BadQuery)?;
        }
        Ok(Some(v))
    }

    pub fn seconds(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    ApiError::BadQuery(format!("{key}: {v:?} is not a number of seconds"))
                })
            })
            .transpose()
    }
}

fn api(viz: &Viz, route: Route, query: &str) -> Result<Vec<u8>, ApiError> {
    let now = viz.clock.now_unix();
    // Each answer is built under the lock and encoded after it.
    match route {
        Route::Overview => {
            Params::parse(query, &[])?;
            let answer = lock(&viz.mesh).overview(now);
            encode(&answer)
        }
        Route::Stat => {
            let p = Params::parse(query, &["kind", "namespace", "name", "window"])?;
            let q = StatQuery {
                kind: canonical_kind(p.required("kind")?)?.to_string(),
                namespace: p.namespace("namespace")?.map(str::to_string),
                name: p.name("name")?.map(str::to_string),
                window_secs: p.seconds("window")?,
            };
            let answer = lock(&viz.mesh).stat(&q, now)?;
            encode(&answer)
        }
        Route::Edges => {
            let p = Params::parse(query, &["kind", "namespace"])?;
            let kind = canonical_kind(p.required("kind")?)?;
            let answer = lock(&viz.mesh).edges(kind, p.namespace("namespace")?, now)?;
            encode(&answer)
        }
        Route::Routes => {
            let p = Params::parse(query, &["target", "namespace"])?;
            let (target, namespace) = (p.kind_name("target")?, p.namespace("namespace")?);
            let answer = lock(&viz.mesh).routes(target, namespace, now)?;
            encode(&answer)
        }
        Route::Workload => {
            let p = Params::parse(query, &["kind", "namespace", "name"])?;
            p.required("namespace")?;
            p.required("name")?;
            let r = ResourceRef {
                kind: canonical_kind(p.required("kind")?)?.to_string(),
                namespace: p.namespace("namespace")?.unwrap_or_default().to_string(),
                name: p.name("name")?.unwrap_or_default().to_string(),
            };
            let answer = lock(&viz.mesh).workload(&r, now)?;
            encode(&answer)
        }
        Route::Pods => {
            let p = Params::parse(query, &["namespace"])?;
            let answer = lock(&viz.mesh).pods(p.namespace("namespace")?, now);
            encode(&answer)
        }
        _ => Err(ApiError::BadQuery("not an API path".into())),
    }
}

fn encode(answer: &impl Serialize) -> Result<Vec<u8>, ApiError> {
    let mut body = serde_json::to_vec(answer)?;
    body.push(b'\n');
    Ok(body)
}

fn tap(viz: &Viz, query: &str) -> Response<Body> {
    let stream = match viz.tapper.open(query) {
        Ok(stream) => stream,
        Err(e) => {
            let status = match &e {
                TapError::BadQuery(_) => StatusCode::BAD_REQUEST,
                TapError::NotFound(_) => StatusCode::NOT_FOUND,
                TapError::TooManyTaps(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            return error(status, e.to_string());
        }
    };
    // Dropping the body (the client went, or the connection closed) drops
    // the stream, which ends every proxy stream of the tap.
    let frames = stream.map(|line| Ok::<_, Infallible>(Frame::data(line)));
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    set(&mut r, CONTENT_TYPE, NDJSON);
    set(&mut r, CACHE_CONTROL, "no-store");
    set(&mut r, "x-content-type-options", "nosniff");
    r
}

fn full(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = status;
    set(&mut r, CONTENT_TYPE, content_type);
    set(&mut r, "x-content-type-options", "nosniff");
    r
}

fn set(r: &mut Response<Body>, name: impl http::header::IntoHeaderName, value: &'static str) {
    r.headers_mut()
        .insert(name, HeaderValue::from_static(value));
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    full(status, Bytes::from_static(body.as_bytes()), TEXT)
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = full(status, body, JSON);
    set(&mut r, CACHE_CONTROL, "no-store");
    r
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

fn error(status: StatusCode, message: String) -> Response<Body> {
    let mut body = serde_json::to_vec(&ErrorBody { error: &message })
        .unwrap_or_else(|_| b"{\"error\":\"error\"}".to_vec());
    body.push(b'\n');
    json(status, body)
}

fn asset(content_type: &'static str, bytes: &'static [u8]) -> Response<Body> {
    let mut r = full(StatusCode::OK, Bytes::from_static(bytes), content_type);
    if content_type.starts_with("text/html") {
        set(&mut r, "content-security-policy", CSP);
    }
    // The files change only with the binary; a reload after an upgrade
    // must not mix versions.
    set(&mut r, CACHE_CONTROL, "no-cache");
    r
}

/// Fails writes that make no progress for `limit`: a client that stops
/// reading is cut instead of holding its slot and answer forever.
struct StallGuard<T> {
    io: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> StallGuard<T> {
    fn new(io: T, limit: Duration) -> Self {
        Self {
            io,
            limit,
            stalled: None,
        }
    }

    /// Passes `poll` through, timing how long it stays pending.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the write stall timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_fails_the_write_after_the_stall_limit() {
        use tokio::io::AsyncWriteExt;
        let (near, mut far) = tokio::io::duplex(1024);
        let mut guarded = StallGuard::new(near, Duration::from_secs(30));
        // Fills the pipe: the write waits, then fails at the limit, not before.
        let started = tokio::time::Instant::now();
        let error = guarded.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));

        // A reader that keeps up is never cut, however long it takes.
        let (near, far2) = tokio::io::duplex(1024);
        let mut guarded = StallGuard::new(near, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut far2 = far2;
            let mut buf = [0u8; 512];
            let mut total = 0;
            while total < 8192 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                total += tokio::io::AsyncReadExt::read(&mut far2, &mut buf)
                    .await
                    .unwrap();
            }
        });
        guarded.write_all(&[0u8; 8192]).await.unwrap();
        reader.await.unwrap();
        let _ = far.shutdown().await;
    }

    #[test]
    fn routes_and_labels() {
        assert_eq!(Route::of("/api/stat"), Route::Stat);
        assert_eq!(Route::of("/api/nope"), Route::UnknownApi);
        assert_eq!(Route::of("/api"), Route::UnknownApi);
        assert_eq!(Route::of("/"), Route::Asset);
        assert_eq!(Route::of("/etc/passwd"), Route::NotFound);
        assert_eq!(Route::of("/assets/../x"), Route::NotFound);
        assert_eq!(Route::of("/api/nope").label(), "unknown");
    }

    #[test]
    fn params_are_decoded_single_and_known() {
        let p = Params::parse(
            "kind=deploy&namespace=a%20b&name=w+x",
            &["kind", "namespace", "name"],
        )
        .unwrap();
        assert_eq!(p.get("namespace"), Some("a b"));
        assert_eq!(p.get("name"), Some("w x"));
        assert_eq!(p.required("kind").unwrap(), "deploy");
        let e = Params::parse("kind=a&kind=b", &["kind"]).err().unwrap();
        assert_eq!(e.to_string(), "parameter \"kind\" given twice");
        let e = Params::parse("namepsace=x", &["kind", "namespace"])
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "unknown parameter \"namepsace\" (allowed: kind, namespace)"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let p = Params::parse("window=abc", &["window"]).unwrap();
        assert!(p.seconds("window").is_err());
        let p = Params::parse("window=0", &["window"]).unwrap();
        assert!(p.seconds("window").is_err());
        let p = Params::parse("window=60", &["window"]).unwrap();
        assert_eq!(p.seconds("window").unwrap(), Some(60));
        let p = Params::parse("", &[]).unwrap();
        assert!(p.required("kind").is_err());
    }
}
