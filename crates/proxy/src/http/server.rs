//! Serving one client connection as HTTP/1 or HTTP/2 within the limits of
//! `HttpLimits`, for both sides of the proxy.
//!
//! - HTTP/1: the head (request line and headers) is bounded in bytes and
//!   count (431 and close), and must arrive within the header read timeout
//!   of the connection being ready for it, which also bounds keep-alive idle
//!   time. The read buffer is bounded by the same byte limit.
//! - HTTP/2: concurrent streams, header list, frame size, flow-control
//!   windows and the per-stream send buffer are bounded; so are the streams
//!   a client may make the proxy reset (MadeYouReset) and the streams it
//!   resets itself before they are accepted (Rapid Reset): past either, the
//!   connection gets GOAWAY `ENHANCE_YOUR_CALM`, counted. A connection with
//!   no request for the idle timeout gets GOAWAY.
//! - At shutdown, a connection finishes the requests it has and closes.

use crate::{config::HttpLimits, detect::Protocol, http::ResponseBody, metrics::Metrics};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::{
    convert::Infallible,
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::{sync::watch, time::Instant};

/// hyper refuses a smaller HTTP/1 buffer.
const MIN_H1_BUFFER: usize = 8 * 1024;

/// The h1 builder for client connections, within `limits`.
pub fn h1_builder(limits: &HttpLimits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.h1_header_read_timeout)
        .max_header_size(limits.h1_max_header_bytes)
        .max_buf_size(limits.h1_max_header_bytes.max(MIN_H1_BUFFER));
    // hyper keeps up to 100 headers on the stack; only another count costs
    // a heap allocation per request.
    if limits.h1_max_headers != crate::config::DEFAULT_HTTP1_MAX_HEADERS {
        b.max_headers(limits.h1_max_headers);
    }
    b
}

/// The h2 builder for client connections, within `limits`.
pub fn h2_builder(limits: &HttpLimits) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_header_list_size(limits.h2_max_header_list_bytes)
        .max_frame_size(limits.h2_max_frame_bytes)
        .initial_stream_window_size(limits.h2_initial_stream_window_bytes)
        .initial_connection_window_size(limits.h2_initial_connection_window_bytes)
        .max_send_buf_size(limits.h2_max_send_buffer_bytes)
        .max_local_error_reset_streams(Some(limits.h2_max_local_error_resets))
        .max_pending_accept_reset_streams(Some(limits.h2_max_pending_accept_resets));
    b
}

/// Whether a connection ended with GOAWAY `ENHANCE_YOUR_CALM`: h2 cut a
/// client past one of its abuse limits.
fn calmed(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        source = err.source();
    }
    false
}

/// When the connection last started or finished a request, and how many
/// are being answered.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no request has been in flight for `timeout`.
    async fn idle(&self, timeout: Duration) {
        loop {
            let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + timeout;
            if self.in_flight.load(Ordering::Relaxed) == 0 && Instant::now() >= deadline {
                return;
            }
            let next = if Instant::now() >= deadline {
                Instant::now() + timeout
            } else {
                deadline
            };
            tokio::time::sleep_until(next).await;
        }
    }
}

struct InFlight<'a>(&'a Activity);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Serves `io` until the client is done, the connection idles out, or
/// `shutdown` turns true (then in-flight requests finish first). Returns
/// whether the connection ended without an error.
pub async fn serve<I, H, Fut>(
    io: I,
    protocol: Protocol,
    limits: &HttpLimits,
    metrics: &Metrics,
    shutdown: watch::Receiver<bool>,
    handler: H,
) -> bool
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // Each protocol's connection state is boxed at its own size, so that an
    // HTTP/1 connection does not carry room for HTTP/2's (per-connection
    // memory is what a flood of idle connections costs).
    let io = TokioIo::new(io);
    let result = if protocol == Protocol::H2 {
        Box::pin(serve_h2(io, limits, metrics, shutdown, handler)).await
    } else {
        Box::pin(serve_h1(io, limits, shutdown, handler)).await
    };
    if let Err(e) = &result {
        tracing::debug!(error = %e, "client HTTP connection ended with an error");
    }
    result.is_ok()
}

/// Resolves once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn serve_h1<I, H, Fut>(
    io: TokioIo<I>,
    limits: &HttpLimits,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) -> hyper::Result<()>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // hyper keeps room for one request's future for the connection's whole
    // life; boxed, an idle connection holds a pointer instead of the
    // forwarding state machine (kilobytes).
    let service = hyper::service::service_fn(move |req| {
        let rsp = Box::pin(handler(req));
        async move { Ok::<_, Infallible>(rsp.await) }
    });
    let conn = h1_builder(limits).serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

async fn serve_h2<I, H, Fut>(
    io: TokioIo<I>,
    limits: &HttpLimits,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) -> hyper::Result<()>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let activity = Arc::new(Activity {
        base: Instant::now(),
        last_ms: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
    });
    let a = activity.clone();
    let handler = Arc::new(handler);
    let service = hyper::service::service_fn(move |req| {
        let a = a.clone();
        let handler = handler.clone();
        async move {
            a.in_flight.fetch_add(1, Ordering::Relaxed);
            let _done = InFlight(&a);
            Ok::<_, Infallible>(handler(req).await)
        }
    });
    let conn = h2_builder(limits).serve_connection(io, service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        _ = activity.idle(limits.idle_timeout) => {
            metrics.http_idle_closed_total.inc();
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = &result {
        if calmed(e) {
            metrics.http2_calm_closed_total.inc();
        }
    }
    result
}
