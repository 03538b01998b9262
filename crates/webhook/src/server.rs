//! The HTTPS server: TLS handshakes bounded in time, connections in number,
//! request heads in size and time, bodies in size, and reviews decided at
//! once in number (the rest wait, briefly, before any body is read).

use crate::decide::{Answer, Decider};
use ballast_serve::accept::{drive_http1, http1_server, serve_bounded, AcceptBounds, AtCapacity};
use ballast_serve::GaugeGuard;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::ServerConfig;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::Semaphore};

/// The path the webhook configuration names.
pub const WEBHOOK_PATH: &str = "/inject";

/// Defaults, written in `--help` too.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
pub const DEFAULT_MAX_CONCURRENT_REVIEWS: usize = 8;
pub const DEFAULT_REVIEW_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head (line and headers) larger than this is refused by hyper.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest AdmissionReview read. The API server refuses requests over
    /// 3 MiB and etcd stores objects up to 1.5 MiB, so a pod's review (the
    /// object once, on CREATE) fits.
    pub max_body_bytes: usize,
    pub max_connections: usize,
    pub max_concurrent_reviews: usize,
    /// How long a review waits for one of those slots before a 503.
    pub review_queue_timeout: Duration,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    /// After shutdown starts, how long open requests may finish.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_reviews: DEFAULT_MAX_CONCURRENT_REVIEWS,
            review_queue_timeout: DEFAULT_REVIEW_QUEUE_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `too_large`, `busy`, `slow_body`, `not_found`, `method`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsErrorLabels {
    /// `handshake`, `timeout`.
    pub error: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct ServerMetrics {
    pub connections: Counter,
    pub connections_open: Gauge,
    pub tls_errors: Family<TlsErrorLabels, Counter>,
    pub refused: Family<RefusedLabels, Counter>,
    pub reviews_in_flight: Gauge,
}

impl ServerMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "injector_connections",
            "Connections accepted",
            self.connections.clone(),
        );
        r.register(
            "injector_connections_open",
            "Connections open (bounded by --max-connections, 256 by default)",
            self.connections_open.clone(),
        );
        r.register(
            "injector_tls_errors",
            "Connections closed in the TLS handshake: failed, or not done within --handshake-timeout",
            self.tls_errors.clone(),
        );
        r.register(
            "injector_requests_refused",
            "Requests refused before a review: too_large (413), busy (503), slow_body (408), not_found (404), method (405)",
            self.refused.clone(),
        );
        r.register(
            "injector_reviews_in_flight",
            "Reviews being decided (bounded by --max-concurrent-reviews, 8 by default)",
            self.reviews_in_flight.clone(),
        );
    }
}

struct Shared {
    decider: Arc<Decider>,
    limits: Limits,
    reviews: Semaphore,
    metrics: ServerMetrics,
}

type Body = Full<Bytes>;

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text + "\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let refuse = |reason: &'static str, status: StatusCode, text: String| {
        shared
            .metrics
            .refused
            .get_or_create(&RefusedLabels { reason })
            .inc();
        plain(status, text)
    };
    if req.uri().path() != WEBHOOK_PATH {
        return refuse(
            "not_found",
            StatusCode::NOT_FOUND,
            format!("AdmissionReviews are served on POST {WEBHOOK_PATH}"),
        );
    }
    if req.method() != Method::POST {
        return refuse(
            "method",
            StatusCode::METHOD_NOT_ALLOWED,
            format!("POST an AdmissionReview to {WEBHOOK_PATH}"),
        );
    }
    let max = shared.limits.max_body_bytes;
    let too_large = || format!("the review is larger than {max} bytes (--max-body-bytes)");
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return refuse("too_large", StatusCode::PAYLOAD_TOO_LARGE, too_large());
    }
    // A slot before the body is read: waiting reviews hold no body.
    let Ok(Ok(_permit)) =
        tokio::time::timeout(shared.limits.review_queue_timeout, shared.reviews.acquire()).await
    else {
        return refuse(
            "busy",
            StatusCode::SERVICE_UNAVAILABLE,
            "too many reviews at once (--max-concurrent-reviews)".into(),
        );
    };
    let _in_flight = GaugeGuard::new(&shared.metrics.reviews_in_flight);
    let body = match tokio::time::timeout(
        shared.limits.body_read_timeout,
        Limited::new(req.into_body(), max).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return refuse("too_large", StatusCode::PAYLOAD_TOO_LARGE, too_large())
        }
        Ok(Err(e)) => {
            return refuse(
                "slow_body",
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        }
        Err(_) => {
            return refuse(
                "slow_body",
                StatusCode::REQUEST_TIMEOUT,
                "the body was not sent within --body-read-timeout".into(),
            )
        }
    };
    match shared.decider.answer(&body).await {
        Answer::Review(review) => {
            let mut r = Response::new(Full::new(Bytes::from(review.to_string())));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Answer::BadRequest(message) => plain(StatusCode::BAD_REQUEST, message),
    }
}

/// Serves AdmissionReviews on `listener` until `shutdown`, then lets open
/// requests finish within the grace period.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    decider: Arc<Decider>,
    limits: Limits,
    metrics: ServerMetrics,
    shutdown: impl Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        decider,
        reviews: Semaphore::new(limits.max_concurrent_reviews.max(1)),
        limits: limits.clone(),
        metrics: metrics.clone(),
    });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let http = http1_server(limits.header_read_timeout, MAX_HEAD_BYTES);
    let bounds = AcceptBounds {
        max_connections: limits.max_connections,
        // At the connection bound, stop accepting: the backlog holds the rest.
        at_capacity: AtCapacity::Wait,
        shutdown_grace: limits.shutdown_grace,
        open: metrics.connections_open.clone(),
    };
    serve_bounded(
        "injector",
        listener,
        bounds,
        shutdown,
        |stream, peer, stopping| {
            metrics.connections.inc();
            let acceptor = acceptor.clone();
            let shared = shared.clone();
            let http = http.clone();
            async move {
                let tls = match tokio::time::timeout(
                    shared.limits.handshake_timeout,
                    acceptor.accept(stream),
                )
                .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        shared
                            .metrics
                            .tls_errors
                            .get_or_create(&TlsErrorLabels { error: "handshake" })
                            .inc();
                        return;
                    }
                    Err(_) => {
                        shared
                            .metrics
                            .tls_errors
                            .get_or_create(&TlsErrorLabels { error: "timeout" })
                            .inc();
                        return;
                    }
                };
                let grace = shared.limits.shutdown_grace;
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(shared, req).await) }
                });
                let connection = http.serve_connection(TokioIo::new(tls), service);
                drive_http1("injector", peer, connection, stopping, None, grace).await;
            }
        },
    )
    .await;
}
