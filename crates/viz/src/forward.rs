//! `ballast viz dashboard`: the installed dashboard on a local port. Each
//! request to the local listener is sent on through an upstream the caller
//! gives (the Kubernetes API server's service proxy to the viz Service, in
//! the binary), its path under a prefix, and the answer streamed back (tap's
//! NDJSON included).
//!
//! Bounds: `max_connections` local connections (at the bound the listener
//! stops accepting and the backlog waits), a request head within the header
//! timeout and 16 KiB, GET and HEAD only (no body is read), and an upstream
//! that gives no answer head within `answer_timeout` is a 504.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ballast_serve::accept::{drive_http1, http1_server, serve_bounded, AcceptBounds, AtCapacity};
use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;

pub const DEFAULT_MAX_CONNECTIONS: usize = 32;
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Request headers sent on; the rest (cookies, credentials) stay local.
const FORWARDED_HEADERS: [http::header::HeaderName; 3] = [
    http::header::ACCEPT,
    http::header::IF_NONE_MATCH,
    http::header::USER_AGENT,
];
/// Answer headers that belong to one hop.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// An answer body from upstream.
pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Sends one request upstream: the path and query are already under the
/// prefix. An error is why it could not be sent or answered.
pub type Upstream = Arc<
    dyn Fn(Request<()>) -> Pin<Box<dyn Future<Output = Result<Response<Body>, String>> + Send>>
        + Send
        + Sync,
>;

/// The forwarder's settings.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Put before each local path: e.g.
    /// `/api/v1/namespaces/NS/services/ballast-viz:8084/proxy`.
    pub prefix: String,
    pub max_connections: usize,
    pub answer_timeout: Duration,
    pub shutdown_grace: Duration,
}

/// Serves the forwarder on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    upstream: Upstream,
    config: ForwardConfig,
    shutdown: impl Future<Output = ()>,
) {
    let http = http1_server(HEADER_READ_TIMEOUT, MAX_HEAD_BYTES);
    let bounds = AcceptBounds {
        max_connections: config.max_connections,
        at_capacity: AtCapacity::Wait,
        shutdown_grace: config.shutdown_grace,
        open: Gauge::default(),
    };
    let grace = config.shutdown_grace;
    let config = Arc::new(config);
    serve_bounded(
        "dashboard",
        listener,
        bounds,
        shutdown,
        |stream, peer, stopping| {
            let _ = stream.set_nodelay(true);
            let (upstream, config) = (upstream.clone(), config.clone());
            let connection = http.serve_connection(
                TokioIo::new(stream),
                service_fn(move |request: Request<Incoming>| {
                    let (upstream, config) = (upstream.clone(), config.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            forward(&upstream, &config, request).await,
                        )
                    }
                }),
            );
            drive_http1("dashboard", peer, connection, stopping, None, grace)
        },
    )
    .await;
}

/// The upstream request for a local one, or the local answer refusing it.
pub fn upstream_request<B>(
    prefix: &str,
    request: &Request<B>,
) -> Result<Request<()>, Box<Response<Body>>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are forwarded\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Err(Box::new(r));
    }
    let path_and_query = request.uri().path_and_query().map_or("/", |p| p.as_str());
    // Whatever the request names (an absolute form's authority included),
    // only a path under the prefix is sent: nothing but viz is reachable.
    if !path_and_query.starts_with('/') {
        return Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            "bad request target\n",
        )));
    }
    let mut builder = Request::builder()
        .method(request.method().clone())
        .uri(format!("{prefix}{path_and_query}"));
    for name in FORWARDED_HEADERS {
        if let Some(v) = request.headers().get(&name) {
            builder = builder.header(name, v);
        }
    }
    builder
        .body(())
        .map_err(|_| Box::new(text(StatusCode::BAD_REQUEST, "bad request target\n")))
}

async fn forward(
    upstream: &Upstream,
    config: &ForwardConfig,
    request: Request<Incoming>,
) -> Response<Body> {
    let up = match upstream_request(&config.prefix, &request) {
        Ok(up) => up,
        Err(refused) => return *refused,
    };
    let path = request.uri().path().to_string();
    match tokio::time::timeout(config.answer_timeout, upstream(up)).await {
        Ok(Ok(answer)) => {
            let (mut parts, body) = answer.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, body)
        }
        Ok(Err(why)) => {
            tracing::warn!(%path, error = %why, "cannot reach the dashboard");
            text(
                StatusCode::BAD_GATEWAY,
                &format!("cannot reach the dashboard: {why}\n"),
            )
        }
        Err(_) => text(
            StatusCode::GATEWAY_TIMEOUT,
            &format!(
                "the dashboard did not answer within {:?}\n",
                config.answer_timeout
            ),
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/api/v1/namespaces/ballast/services/ballast-viz:8084/proxy";

    #[test]
    fn local_paths_go_under_the_prefix_with_their_query_and_safe_headers() {
        let local = Request::get("/api/stat?kind=deployment&namespace=emojivoto")
            .header("accept", "application/json")
            .header("cookie", "secret=1")
            .body(())
            .unwrap();
        let up = upstream_request(PREFIX, &local).unwrap();
        assert_eq!(
            up.uri().to_string(),
            format!("{PREFIX}/api/stat?kind=deployment&namespace=emojivoto")
        );
        assert_eq!(up.headers().get("accept").unwrap(), "application/json");
        assert!(up.headers().get("cookie").is_none());
        let root = upstream_request(PREFIX, &Request::get("/").body(()).unwrap()).unwrap();
        assert_eq!(root.uri().to_string(), format!("{PREFIX}/"));
    }

    #[test]
    fn writes_are_refused_locally_and_other_hosts_never_reached() {
        let post = Request::post("/api/stat").body(()).unwrap();
        assert_eq!(
            upstream_request(PREFIX, &post).unwrap_err().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let absolute = Request::get("http://elsewhere.example/x").body(()).unwrap();
        assert_eq!(
            upstream_request(PREFIX, &absolute)
                .unwrap()
                .uri()
                .to_string(),
            format!("{PREFIX}/x"),
            "an absolute form's authority is not followed"
        );
    }

    #[tokio::test]
    async fn answers_stream_back_and_a_failing_upstream_is_a_502() {
        let upstream: Upstream = Arc::new(|req: Request<()>| {
            Box::pin(async move {
                if req.uri().path().ends_with("/down") {
                    return Err("connection refused".to_string());
                }
                let body = Full::new(Bytes::from(req.uri().to_string()))
                    .map_err(|never| match never {})
                    .boxed_unsync();
                let mut r = Response::new(body);
                r.headers_mut()
                    .insert("connection", HeaderValue::from_static("close"));
                Ok(r)
            })
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            upstream,
            ForwardConfig {
                prefix: PREFIX.into(),
                max_connections: 4,
                answer_timeout: Duration::from_secs(5),
                shutdown_grace: Duration::from_millis(100),
            },
            async {
                let _ = stopped.await;
            },
        ));
        let get = |path: &'static str| async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn);
            let rsp = send
                .send_request(
                    Request::get(path)
                        .header("host", "127.0.0.1")
                        .body(http_body_util::Empty::<Bytes>::new())
                        .unwrap(),
                )
                .await
                .unwrap();
            let status = rsp.status();
            let hop = rsp.headers().get("connection").cloned();
            let body = rsp.into_body().collect().await.unwrap().to_bytes();
            (status, hop, String::from_utf8_lossy(&body).into_owned())
        };
        let (status, hop, body) = get("/api/overview").await;
        assert_eq!(
            (status, hop, body),
            (StatusCode::OK, None, format!("{PREFIX}/api/overview"))
        );
        let (status, _, body) = get("/down").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert!(body.contains("connection refused"), "{body}");
        let _ = stop.send(());
        server.await.unwrap();
    }
}
