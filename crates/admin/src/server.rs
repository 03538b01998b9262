//! The admin HTTP/1.1 server: `/live`, `/ready`, `/metrics`, and where the
//! owner enables it, `POST /shutdown`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use crate::Readiness;
use ballast_serve::accept::{drive_http1, http1_server, serve_bounded, AcceptBounds, AtCapacity};

/// `Content-Type` of `/metrics`: the OpenMetrics text format that
/// [`prometheus_client::encoding::text::encode`] writes (Prometheus scrapes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Default for [`AdminServer::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default for [`AdminServer::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`AdminServer::max_connection_age`].
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// Default for [`AdminServer::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Largest request head (request line and headers) read from a client.
const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// What the admin server serves: the metrics registry behind `/metrics`,
/// the readiness check behind `/ready` and, if enabled, the shutdown request
/// behind `/shutdown`. Cloning is cheap.
#[derive(Clone, Debug)]
pub struct AdminState {
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: Option<ShutdownRequest>,
}

impl AdminState {
    /// Serves `registry` on `/metrics` and asks `readiness` on `/ready`;
    /// `/shutdown` is not served (404).
    pub fn new(registry: Arc<Registry>, readiness: Readiness) -> Self {
        Self {
            registry,
            readiness,
            shutdown: None,
        }
    }

    /// Also serves `POST /shutdown`, which fires `request` (for a process
    /// that should stop when its workload is done, as a Job's sidecar).
    pub fn with_shutdown(mut self, request: ShutdownRequest) -> Self {
        self.shutdown = Some(request);
        self
    }
}

/// A request to shut the process down, made by `POST /shutdown`; the owner
/// waits on [`ShutdownRequest::requested`] beside its signal handlers.
/// Clones share one request.
#[derive(Clone, Debug, Default)]
pub struct ShutdownRequest(Arc<Notify>);

impl ShutdownRequest {
    /// A request not made yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves once the request is made (at once if it was made before).
    pub async fn requested(&self) {
        self.0.notified().await;
    }

    fn make(&self) {
        // A stored permit: a waiter that starts waiting later still wakes.
        self.0.notify_one();
    }
}

/// The admin HTTP/1.1 server, with its bounds.
///
/// | path | `GET` answer |
/// |---|---|
/// | `/live` | `200 live` while the server runs |
/// | `/ready` | `200 ready` when the [`Readiness`] says so, else `503 not ready` |
/// | `/metrics` | `200`, the registry in OpenMetrics text ([`METRICS_CONTENT_TYPE`]) |
///
/// With [`AdminState::with_shutdown`], `POST /shutdown` from a loopback peer
/// answers `200 shutting down` and fires the [`ShutdownRequest`]; from any
/// other peer it gets `403`, and other methods `405` (with `Allow: POST`).
/// Without it, `/shutdown` is `404`.
///
/// Other methods on the GET paths get `405` (with `Allow: GET`), other paths
/// `404`. Request bodies are never read. These four paths are all the server
/// has, so a peer off the host (kubelet probing the pod's IP: the proxy's
/// admin listens on every interface, as Linkerd's does) reaches only `/live`,
/// `/ready` and `/metrics`; see [`route`].
///
/// Besides the caller's registry, `/metrics` reports the server's own
/// `admin_connections_open` (gauge) and `admin_connections_rejected_total`
/// (counter: connections closed at once because [`max_connections`] were open).
///
/// [`max_connections`]: AdminServer::max_connections
#[derive(Debug)]
pub struct AdminServer {
    state: AdminState,
    max_connections: usize,
    header_read_timeout: Duration,
    max_connection_age: Duration,
    shutdown_grace: Duration,
}

impl AdminServer {
    /// A server for `state` with the default bounds.
    pub fn new(state: AdminState) -> Self {
        Self {
            state,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connection_age: DEFAULT_MAX_CONNECTION_AGE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }

    /// Most connections served at once (default [`DEFAULT_MAX_CONNECTIONS`],
    /// 64; at least 1). A connection accepted beyond it is closed at once,
    /// unanswered, and counted in `admin_connections_rejected_total`.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.clamp(1, Semaphore::MAX_PERMITS);
        self
    }

    /// How long a client may take to send a request head, counted from the
    /// moment the server starts waiting for one; this is also how long an
    /// idle keep-alive connection stays open (default
    /// [`DEFAULT_HEADER_READ_TIMEOUT`], 10s). The connection is closed when it
    /// runs out.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// How long one connection is served (default
    /// [`DEFAULT_MAX_CONNECTION_AGE`], 60s). When it runs out the connection
    /// is shut down gracefully like at server shutdown: the request in flight
    /// gets [`shutdown_grace`](AdminServer::shutdown_grace) to finish. This
    /// bounds clients that never read their response.
    pub fn max_connection_age(mut self, age: Duration) -> Self {
        self.max_connection_age = age;
        self
    }

    /// How long in-flight requests may take to finish once shutdown starts
    /// (default [`DEFAULT_SHUTDOWN_GRACE`], 5s); connections still busy then
    /// are closed.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Serves connections from `listener` until `shutdown` resolves, then
    /// stops accepting, lets in-flight requests finish within the shutdown
    /// grace period and returns `Ok(())`.
    ///
    /// Accept errors (a connection reset before it was accepted, running out
    /// of file descriptors) are logged and the loop goes on after a short
    /// pause: they never end the server. The only error returned is failing
    /// to read the listener's local address at start.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let local = listener.local_addr()?;
        // Each binary says "admin listening on ADDR" when it binds.
        tracing::debug!(%local, "admin server serving");

        let service = Arc::new(AdminService::new(self.state));
        let http = http1_server(self.header_read_timeout, MAX_REQUEST_HEAD_BYTES);
        let bounds = AcceptBounds {
            max_connections: self.max_connections,
            at_capacity: AtCapacity::Close(service.rejected.clone()),
            shutdown_grace: self.shutdown_grace,
            open: service.open.clone(),
        };
        let (max_age, grace) = (self.max_connection_age, self.shutdown_grace);
        serve_bounded("admin", listener, bounds, shutdown, |stream, peer, stopping| {
            let service = service.clone();
            let http = http.clone();
            async move {
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, %error, "cannot set TCP_NODELAY on an admin connection");
                }
                let connection = http.serve_connection(
                    TokioIo::new(stream),
                    service_fn(move |request: Request<Incoming>| {
                        std::future::ready(Ok::<_, Infallible>(service.respond(&request, peer)))
                    }),
                );
                drive_http1("admin", peer, connection, stopping, Some(max_age), grace).await;
            }
        })
        .await;
        tracing::info!(%local, "admin server stopped");
        Ok(())
    }
}

/// Serves `state` on `listener` with the default bounds of [`AdminServer`]
/// until `shutdown` resolves; see [`AdminServer::serve`].
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    AdminServer::new(state).serve(listener, shutdown).await
}

/// What a request gets, decided from its method, path and peer alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /live`.
    Live,
    /// `GET /ready`.
    Ready,
    /// `GET /metrics`.
    Metrics,
    /// `POST /shutdown` from a loopback peer, where enabled.
    Shutdown,
    /// `POST /shutdown` from any other peer: `403`.
    LoopbackOnly,
    /// A known path with another method: `405`, with this `Allow`.
    MethodNotAllowed(&'static str),
    /// Any other path (and `/shutdown` where not enabled): `404`.
    NotFound,
}

/// The admin server's access rule. The server may listen on every
/// interface (kubelet probes a pod's IP), so what a peer off the host or
/// pod may reach is only `GET /live`, `/ready` and `/metrics`; `/shutdown`
/// (the only other path, served where enabled) answers loopback peers
/// alone (IPv4-mapped IPv6 loopback counts as loopback). Every other path
/// is `404` whoever asks.
pub fn route(method: &Method, path: &str, peer: std::net::IpAddr, shutdown_enabled: bool) -> Route {
    match path {
        "/live" | "/ready" | "/metrics" if method != Method::GET => Route::MethodNotAllowed("GET"),
        "/live" => Route::Live,
        "/ready" => Route::Ready,
        "/metrics" => Route::Metrics,
        "/shutdown" if !shutdown_enabled => Route::NotFound,
        "/shutdown" if method != Method::POST => Route::MethodNotAllowed("POST"),
        "/shutdown" if !peer.to_canonical().is_loopback() => Route::LoopbackOnly,
        "/shutdown" => Route::Shutdown,
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod route_tests {
    use super::{route, Route};
    use http::Method;
    use std::net::IpAddr;

    #[test]
    fn off_host_peers_reach_only_the_probe_and_metrics_paths() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let loopback6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let pod: IpAddr = "10.42.0.7".parse().unwrap();
        let pod6: IpAddr = "fd00::7".parse().unwrap();
        let get = Method::GET;
        let post = Method::POST;
        let cases: &[(&Method, &str, IpAddr, bool, Route)] = &[
            (&get, "/live", pod, true, Route::Live),
            (&get, "/ready", pod, true, Route::Ready),
            (&get, "/metrics", pod6, true, Route::Metrics),
            (&get, "/metrics", loopback, true, Route::Metrics),
            (&post, "/live", pod, true, Route::MethodNotAllowed("GET")),
            (&post, "/shutdown", loopback, true, Route::Shutdown),
            (&post, "/shutdown", loopback6, true, Route::Shutdown),
            (&post, "/shutdown", mapped, true, Route::Shutdown),
            (&post, "/shutdown", pod, true, Route::LoopbackOnly),
            (&post, "/shutdown", pod6, true, Route::LoopbackOnly),
            (
                &get,
                "/shutdown",
                pod,
                true,
                Route::MethodNotAllowed("POST"),
            ),
            (&post, "/shutdown", loopback, false, Route::NotFound),
            (&post, "/shutdown", pod, false, Route::NotFound),
            (&get, "/", pod, true, Route::NotFound),
            (&get, "/live/", pod, true, Route::NotFound),
            (&get, "/debug/pprof", pod, true, Route::NotFound),
            (&get, "/debug/pprof", loopback, true, Route::NotFound),
            (&get, "/metrics/x", pod, true, Route::NotFound),
        ];
        for &(method, path, peer, enabled, want) in cases {
            assert_eq!(
                route(method, path, peer, enabled),
                want,
                "{method} {path} from {peer} (shutdown enabled: {enabled})"
            );
        }
    }
}

/// Answers requests; shared by all connections of one server.
struct AdminService {
    state: AdminState,
    /// The server's own metrics, appended to the caller's on `/metrics`.
    own_metrics: Registry,
    rejected: Counter,
    open: Gauge,
}

impl AdminService {
    fn new(state: AdminState) -> Self {
        let rejected = Counter::default();
        let open = Gauge::default();
        let mut own_metrics = Registry::default();
        own_metrics.register(
            "admin_connections_rejected",
            "Admin connections closed unanswered because the connection limit was reached",
            rejected.clone(),
        );
        own_metrics.register(
            "admin_connections_open",
            "Admin connections being served",
            open.clone(),
        );
        Self {
            state,
            own_metrics,
            rejected,
            open,
        }
    }

    fn respond<B>(&self, request: &Request<B>, peer: SocketAddr) -> Response<Full<Bytes>> {
        let shutdown = self.state.shutdown.as_ref();
        match route(
            request.method(),
            request.uri().path(),
            peer.ip(),
            shutdown.is_some(),
        ) {
            Route::Live => text(StatusCode::OK, "live\n"),
            Route::Ready => {
                let readiness = &self.state.readiness;
                let (status, answer) = if readiness.is_ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                };
                match readiness.detail() {
                    Some(detail) => text_owned(status, format!("{answer}{detail}\n")),
                    None => text(status, answer),
                }
            }
            Route::Metrics => self.metrics(),
            Route::Shutdown => {
                tracing::info!(%peer, "POST /shutdown received; shutting down");
                if let Some(request) = shutdown {
                    request.make();
                }
                text(StatusCode::OK, "shutting down\n")
            }
            Route::LoopbackOnly => {
                tracing::info!(%peer, "POST /shutdown refused: not from a loopback address");
                text(
                    StatusCode::FORBIDDEN,
                    "shutdown is only accepted from localhost\n",
                )
            }
            Route::MethodNotAllowed(allow) => {
                let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static(allow));
                response
            }
            Route::NotFound => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    fn metrics(&self) -> Response<Full<Bytes>> {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};

        let mut body = String::new();
        let encoded = encode_registry(&mut body, &self.state.registry)
            .and_then(|()| encode_registry(&mut body, &self.own_metrics))
            .and_then(|()| encode_eof(&mut body));
        if encoded.is_err() {
            tracing::warn!("cannot encode metrics; a registered metric or collector failed");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics encoding failed; see the process log\n",
            );
        }
        let mut response = Response::new(Full::new(Bytes::from(body)));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
        response
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    text_owned(status, Bytes::from_static(body.as_bytes()))
}

fn text_owned(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(shutdown: Option<ShutdownRequest>) -> AdminService {
        let mut state = AdminState::new(Arc::new(Registry::default()), Readiness::always());
        if let Some(request) = shutdown {
            state = state.with_shutdown(request);
        }
        AdminService::new(state)
    }

    fn request(method: Method) -> Request<()> {
        let mut request = Request::new(());
        *request.method_mut() = method;
        *request.uri_mut() = http::Uri::from_static("/shutdown");
        request
    }

    fn peer(addr: &str) -> SocketAddr {
        addr.parse().expect("a socket address")
    }

    /// Whether `request` has been made, without waiting.
    fn made(request: &ShutdownRequest) -> bool {
        let waiting = request.requested();
        let mut waiting = std::pin::pin!(waiting);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        waiting.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn shutdown_from_a_non_loopback_peer_is_forbidden_and_not_made() {
        let request = ShutdownRequest::new();
        let svc = service(Some(request.clone()));
        for from in ["10.1.2.3:5555", "[2001:db8::1]:5555", "[::ffff:10.0.0.1]:1"] {
            let answer = svc.respond(&request_post(), peer(from));
            assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{from}");
        }
        assert!(!made(&request));
    }

    fn request_post() -> Request<()> {
        request(Method::POST)
    }

    #[test]
    fn shutdown_from_loopback_is_made_and_other_methods_are_405() {
        let request = ShutdownRequest::new();
        let svc = service(Some(request.clone()));
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let answer = svc.respond(&self::request(method.clone()), peer("127.0.0.1:1"));
            assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED, "{method}");
            assert_eq!(answer.headers()[ALLOW], "POST");
        }
        assert!(!made(&request));
        for from in ["127.0.0.1:40000", "[::1]:40000", "[::ffff:127.0.0.1]:40000"] {
            let request = ShutdownRequest::new();
            let svc = service(Some(request.clone()));
            let answer = svc.respond(&request_post(), peer(from));
            assert_eq!(answer.status(), StatusCode::OK, "{from}");
            assert!(made(&request), "{from}");
        }
    }

    #[test]
    fn without_a_shutdown_request_the_path_does_not_exist() {
        let answer = service(None).respond(&request_post(), peer("127.0.0.1:1"));
        assert_eq!(answer.status(), StatusCode::NOT_FOUND);
    }
}
