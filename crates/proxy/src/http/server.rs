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

use crate::{
    config::HttpLimits,
    detect::Protocol,
    http::framing::{Guarded, OnRefused},
    http::ResponseBody,
    io::Prefixed,
    metrics::Metrics,
};
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{io::AsyncRead, sync::watch, time::Instant};

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
        .max_local_error_reset_streams(Some(ballast_meshtls::server::h2_local_reset_budget(
            limits.h2_max_local_error_resets,
            limits.h2_max_concurrent_streams,
        )))
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

    /// `None` when no request has been in flight for `timeout` by `now`;
    /// else when to look again.
    fn idle_check(&self, now: Instant, timeout: Duration) -> Option<Instant> {
        let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        let deadline = last + timeout;
        if now < deadline {
            return Some(deadline);
        }
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(now + timeout)
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
pub fn serve<'a, I, H, Fut>(
    io: Prefixed<I>,
    protocol: Protocol,
    limits: &'a HttpLimits,
    metrics: &'a Metrics,
    shutdown: watch::Receiver<bool>,
    handler: H,
) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // One box per connection, at its protocol's size: the caller's state
    // holds a pointer, and an HTTP/1 connection carries no room for
    // HTTP/2's (per-connection memory is what idle connections cost).
    if protocol == Protocol::H2 {
        Box::pin(async move {
            let io = TokioIo::new(io);
            ended(serve_h2(io, limits, metrics, shutdown, handler).await)
        })
    } else {
        let handler = Arc::new(handler);
        Box::pin(serve_h1(io, limits, metrics, shutdown, handler))
    }
}

/// Whether a connection ended without an error; logs the error.
fn ended<E: std::fmt::Display>(result: Result<(), E>) -> bool {
    if let Err(e) = &result {
        tracing::debug!(error = %e, "client HTTP connection ended with an error");
    }
    result.is_ok()
}

/// Resolves once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How many requests an HTTP/1 connection has started and answered. hyper
/// calls the service of one HTTP/1 connection one request at a time, from
/// the connection's own task, so plain loads and stores suffice.
#[derive(Default)]
struct H1Requests {
    started: AtomicU64,
    answered: AtomicU64,
    /// The client's request framing was refused (`framing`): the request
    /// in progress is answered 400 and the connection closed.
    refused: AtomicBool,
}

impl OnRefused for H1Requests {
    fn refused(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }
}

fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// Counts a connection whose framing was refused, when it ends.
struct CountRefused<'a>(Arc<H1Requests>, &'a Metrics);

impl Drop for CountRefused<'_> {
    fn drop(&mut self) {
        if self.0.refused.load(Ordering::Relaxed) {
            self.1.http.http1_framing_refused_total.inc();
        }
    }
}

/// The service of one HTTP/1 connection. It is `Unpin` with its futures,
/// so that hyper can hand the connection back when it parks.
struct H1Service<H> {
    handler: Arc<H>,
    requests: Arc<H1Requests>,
}

impl<H, Fut> hyper::service::Service<Request<Incoming>> for H1Service<H>
where
    H: Fn(Request<Incoming>) -> Fut,
    Fut: Future<Output = Response<ResponseBody>>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Answer<Fut>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        bump(&self.requests.started);
        // hyper keeps room for one request's future for the connection's
        // whole life; boxed, an idle connection holds a pointer instead of
        // the forwarding state machine (kilobytes).
        Answer {
            rsp: Box::pin((self.handler)(req)),
            requests: self.requests.clone(),
        }
    }
}

struct Answer<F> {
    rsp: Pin<Box<F>>,
    requests: Arc<H1Requests>,
}

impl<F: Future<Output = Response<ResponseBody>>> Future for Answer<F> {
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut rsp = std::task::ready!(self.rsp.as_mut().poll(cx));
        bump(&self.requests.answered);
        if self.requests.refused.load(Ordering::Relaxed) {
            rsp = crate::http::framing::refused_response();
        }
        Poll::Ready(Ok(rsp))
    }
}

type H1Parts<I, H> =
    hyper::server::conn::http1::Parts<TokioIo<Guarded<Prefixed<I>, Arc<H1Requests>>>, H1Service<H>>;

/// Serves `io` with hyper until the client is done or shutdown finishes it
/// (`false`), or it idles for `park_after` between requests and hyper hands
/// it back (`true`). Returns its parts either way.
async fn serve_until_idle<I, H, Fut>(
    io: Prefixed<I>,
    service: H1Service<H>,
    limits: &HttpLimits,
    shutdown: &mut watch::Receiver<bool>,
    probe: &watch::Receiver<bool>,
    may_park: &mut bool,
) -> Result<(bool, Box<H1Parts<I, H>>), BoxError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let requests = service.requests.clone();
    // Built per cycle: a parked connection keeps no builder.
    // The client's request framing is read as hyper reads it (chunk lines
    // hyper does not check: `framing`). A cycle starts between requests.
    let io = Guarded::with_notify(io, limits.h1_max_header_bytes, requests.clone());
    let mut conn = h1_builder(limits).serve_connection(TokioIo::new(io), service);
    let park_after = limits.h1_park_after;
    let mut seen = requests.started.load(Ordering::Relaxed);
    let stop = stopped(shutdown);
    let check = tokio::time::sleep(park_after);
    tokio::pin!(stop, check);
    let mut armed = Armed::default();
    let parked = loop {
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.poll_without_shutdown(cx) {
                return Poll::Ready(Event::Done(r));
            }
            poll_waits(cx, probe, stop.as_mut(), check.as_mut(), &mut armed)
        })
        .await;
        match event {
            Event::Done(r) => {
                r?;
                break false;
            }
            Event::Stop => {
                Pin::new(&mut conn).graceful_shutdown();
                std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)).await?;
                break false;
            }
            Event::Check => {
                let started = requests.started.load(Ordering::Relaxed);
                let answered = requests.answered.load(Ordering::Relaxed);
                if started != seen {
                    *may_park = true;
                } else if *may_park && answered == started {
                    // hyper is between requests: it closes its side at
                    // once, finishing a response still being written.
                    Pin::new(&mut conn).graceful_shutdown();
                    std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)).await?;
                    break true;
                }
                seen = started;
                check.as_mut().reset(Instant::now() + park_after);
                armed.check = false;
            }
        }
    };
    Ok((parked, Box::new(conn.into_parts())))
}

/// What ended a wait of a serving connection: the connection, the
/// shutdown, or its periodic check's timer.
enum Event<T> {
    Done(T),
    Stop,
    Check,
}

/// Which of a serving connection's waits registered their wake-ups.
#[derive(Default)]
struct Armed {
    stop: bool,
    check: bool,
}

/// Polls a serving connection's waits besides the connection: `stop` (the
/// shutdown, which `probe` watches too) and `check`. Each is polled once to
/// register its wake-up, and again only when it may be over: a connection's
/// futures are polled by its one task, whose waker does not change, and
/// that task wakes several times per request.
fn poll_waits<T>(
    cx: &mut Context<'_>,
    probe: &watch::Receiver<bool>,
    stop: Pin<&mut impl Future<Output = ()>>,
    mut check: Pin<&mut tokio::time::Sleep>,
    armed: &mut Armed,
) -> Poll<Event<T>> {
    if !armed.stop || probe.has_changed().unwrap_or(true) {
        if stop.poll(cx).is_ready() {
            return Poll::Ready(Event::Stop);
        }
        armed.stop = true;
    }
    if !armed.check || check.is_elapsed() {
        if check.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Check);
        }
        armed.check = true;
    }
    Poll::Pending
}

/// Counts a parked connection for as long as it stays parked.
struct ParkedGauge<'a>(&'a Metrics);

impl<'a> ParkedGauge<'a> {
    fn enter(metrics: &'a Metrics) -> Self {
        metrics.http.http1_parked_connections.inc();
        Self(metrics)
    }
}

impl Drop for ParkedGauge<'_> {
    fn drop(&mut self) {
        self.0.http.http1_parked_connections.dec();
    }
}

/// Serves HTTP/1 with hyper while requests come; a connection with no
/// request for `h1_park_after` (checked once per that period, so parked
/// within twice it) gets its hyper state back from hyper and drops it
/// (16 KiB of buffers and the dispatcher), then waits for the client's
/// next byte holding only the socket. Keep-alive stays within
/// `h1_header_read_timeout` in both states.
// Not an async fn: see the body.
#[allow(clippy::manual_async_fn)]
fn serve_h1<'a, I, H, Fut>(
    mut io: Prefixed<I>,
    limits: &'a HttpLimits,
    metrics: &'a Metrics,
    mut shutdown: watch::Receiver<bool>,
    handler: Arc<H>,
) -> impl Future<Output = bool> + Send + 'a
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // An async block rather than an async fn, which would keep each
    // argument twice for the connection's whole life.
    async move {
        let requests: Arc<H1Requests> = Arc::default();
        // However the connection ends, a refusal is counted.
        let _count = CountRefused(requests.clone(), metrics);
        let mut service = H1Service { handler, requests };
        // Whether the connection may park once it idles: not while a client
        // is partway through a head (that would restart its header read
        // timeout).
        let mut may_park = true;
        // Whether shutdown began is read from the watch's version before
        // its wait is polled again: that wait re-registers under a lock on
        // every poll, and a busy connection is polled several times a
        // request.
        let probe = shutdown.clone();
        loop {
            // Boxed: a parked connection holds a pointer's worth of hyper.
            let (parked, conn) = match Box::pin(serve_until_idle(
                io,
                service,
                limits,
                &mut shutdown,
                &probe,
                &mut may_park,
            ))
            .await
            {
                Ok(served) => served,
                Err(e) => return ended(Err(e)),
            };
            let read_buf = {
                let parts = *conn;
                io = parts.io.into_inner().into_inner();
                service = parts.service;
                parts.read_buf
            };
            if !parked {
                return true;
            }
            if !read_buf.is_empty() {
                // A head is arriving: serve it without parking.
                io.rewind(read_buf);
                may_park = false;
                continue;
            }
            drop(read_buf);
            let keep_alive = limits
                .h1_header_read_timeout
                .saturating_sub(limits.h1_park_after);
            let woke = {
                let _gauge = ParkedGauge::enter(metrics);
                // Boxed: a connection that is not parked keeps no room for it.
                Box::pin(park(&mut io, &mut shutdown, keep_alive)).await
            };
            match woke {
                Woke::Data(first) => io.rewind(Bytes::copy_from_slice(&[first])),
                Woke::Stop | Woke::Eof => return true,
                Woke::Idle => {
                    metrics.http.http_idle_closed_total.inc();
                    return true;
                }
                Woke::Failed(e) => return ended(Err(e)),
            }
        }
    }
}

/// Waits, holding no buffer, for a parked connection's next byte, its
/// close, `keep_alive`, or shutdown.
async fn park<I: AsyncRead + Unpin>(
    io: &mut Prefixed<I>,
    shutdown: &mut watch::Receiver<bool>,
    keep_alive: Duration,
) -> Woke {
    let idle = tokio::time::sleep(keep_alive);
    // Only shutdown changes the watch (`changed` is smaller than a wait).
    let stop = shutdown.changed();
    tokio::pin!(idle, stop);
    std::future::poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Stop);
        }
        let mut first = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut first);
        match Pin::new(&mut *io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Woke::Eof),
            Poll::Ready(Ok(())) => return Poll::Ready(Woke::Data(first[0])),
            Poll::Ready(Err(e)) => return Poll::Ready(Woke::Failed(e)),
            Poll::Pending => {}
        }
        if idle.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Idle);
        }
        Poll::Pending
    })
    .await
}

/// What ended a parked connection's wait.
enum Woke {
    Data(u8),
    Eof,
    Idle,
    Stop,
    Failed(std::io::Error),
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
    let probe = shutdown.clone();
    let stop = stopped(&mut shutdown);
    let check = tokio::time::sleep(limits.idle_timeout);
    tokio::pin!(conn, stop, check);
    let mut armed = Armed::default();
    let result = loop {
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Event::Done(r));
            }
            poll_waits(cx, &probe, stop.as_mut(), check.as_mut(), &mut armed)
        })
        .await;
        match event {
            Event::Done(r) => break r,
            Event::Stop => {
                conn.as_mut().graceful_shutdown();
                break conn.await;
            }
            Event::Check => match activity.idle_check(Instant::now(), limits.idle_timeout) {
                None => {
                    metrics.http.http_idle_closed_total.inc();
                    conn.as_mut().graceful_shutdown();
                    break conn.await;
                }
                Some(next) => {
                    check.as_mut().reset(next);
                    armed.check = false;
                }
            },
        }
    };
    if let Err(e) = &result {
        if calmed(e) {
            metrics.http.http2_calm_closed_total.inc();
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_idles_out_only_with_nothing_in_flight_for_the_timeout() {
        let timeout = Duration::from_secs(10);
        let activity = Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        };
        // Before the timeout: look again when it ends.
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            activity.idle_check(Instant::now(), timeout),
            Some(activity.base + timeout)
        );
        // A request finished at 6 s: the timeout counts from it.
        tokio::time::advance(Duration::from_secs(2)).await;
        activity.touch();
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            activity.idle_check(Instant::now(), timeout),
            Some(activity.base + Duration::from_secs(16))
        );
        // A request in flight for longer than the timeout keeps it open.
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::time::advance(Duration::from_secs(30)).await;
        let now = Instant::now();
        assert_eq!(activity.idle_check(now, timeout), Some(now + timeout));
        // Answered: idle once the timeout passed since.
        drop(InFlight(&activity));
        assert!(activity.idle_check(Instant::now(), timeout).is_some());
        tokio::time::advance(timeout).await;
        assert_eq!(activity.idle_check(Instant::now(), timeout), None);
    }
}
