//! HTTP/2 connections served each in one task, with its streams, on the
//! `h2` crate directly.
//!
//! A controller's streams are long-lived and carry a small update per
//! change, so the work per stream per change is what a fan-out costs. Here
//! a connection's streams run inside the connection's task (no task per
//! stream): each poll runs the streams that were woken first, then the
//! connection, which queues their frames; and the connection's writes wait
//! for the end of that poll ([`Coalesced`]), so a change that reaches
//! several streams of a connection leaves in one write. A stream is one
//! small state machine ([`Respond`]): the service's answer, then its body
//! piped into the stream as the client's window allows, a reset asked of
//! h2 only while the body has nothing to send. (hyper's server, used
//! before, added a stream task's layers, a keep-alive timer check and IO
//! adapters to every poll.)
//!
//! Nothing is queued that h2 would not hold anyway: a connection holds at
//! most its `SETTINGS_MAX_CONCURRENT_STREAMS` streams, a stream at most two
//! body frames past the client's window (one h2 took, one it holds itself,
//! as hyper's pipe did), and a connection's waiting writes are bounded by
//! [`MAX_COALESCED_BYTES`].

use bytes::Bytes;
use futures_util::{
    stream::{FuturesUnordered, StreamExt},
    task::AtomicWaker,
};
use h2::{
    server::{Connection, SendResponse},
    PingPong, Reason, RecvStream, SendStream,
};
use http_body::{Body, Frame};
use hyper::service::Service;
use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::{pin, Pin},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    task::{ready, Context, Poll, Wake, Waker},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::watch,
    task::JoinSet,
    time::{Instant, Sleep},
};

/// The HTTP/2 settings and bounds of a gRPC server's connections.
#[derive(Clone, Debug)]
pub struct H2Limits {
    /// PING every this long; a connection that does not answer within
    /// twice it is closed. `None`: no PINGs.
    pub keepalive: Option<Duration>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// Streams the server may reset for the client's errors (and refuse)
    /// before it closes the connection with ENHANCE_YOUR_CALM.
    pub max_local_error_resets: usize,
    /// Streams the client opened and reset before the server accepted them
    /// (the "rapid reset" bound).
    pub max_pending_accept_resets: usize,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request's headers, decoded.
    pub max_header_list_bytes: u32,
}

/// A stream's and the connection's receive windows: a request is one small
/// message, and this is what hyper's server advertised before.
const WINDOW_BYTES: u32 = 1024 * 1024;
/// SETTINGS_MAX_FRAME_SIZE, the protocol's smallest.
const MAX_FRAME_BYTES: u32 = 16 * 1024;
/// What h2 buffers per stream beyond the client's window.
const MAX_SEND_BUFFER_BYTES: usize = 400 * 1024;

impl H2Limits {
    fn builder(&self) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(WINDOW_BYTES)
            .initial_connection_window_size(WINDOW_BYTES)
            .max_frame_size(MAX_FRAME_BYTES)
            .max_send_buffer_size(MAX_SEND_BUFFER_BYTES)
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_local_error_reset_streams(Some(self.max_local_error_resets))
            .max_pending_accept_reset_streams(self.max_pending_accept_resets)
            .max_header_list_size(self.max_header_list_bytes);
        b
    }
}

/// Most bytes a connection's writes wait in [`Coalesced`] before a write
/// is made at once (and the connection waits for the socket).
pub const MAX_COALESCED_BYTES: usize = 32 * 1024;

/// A connection's transport whose writes wait for the end of the
/// connection's poll (`Driven::poll`), so that every frame written in one
/// poll leaves in one write. h2 flushes after each DATA frame of 256 bytes
/// or more (it hands those over as a separate slice): flushing then would
/// make one write per update again. Bounded by [`MAX_COALESCED_BYTES`].
struct Coalesced<I>(Arc<Mutex<Pending<I>>>);

struct Pending<I> {
    io: I,
    buf: Vec<u8>,
    /// How much of `buf` was written already.
    written: usize,
}

impl<I: AsyncWrite + Unpin> Pending<I> {
    /// Writes what waits, then flushes the transport.
    fn write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        // Nothing is kept between writes: an idle connection holds no buffer.
        self.buf = Vec::new();
        self.written = 0;
        Pin::new(&mut self.io).poll_flush(cx)
    }
}

impl<I> Coalesced<I> {
    fn new(io: I) -> (Self, Self) {
        let shared = Arc::new(Mutex::new(Pending {
            io,
            buf: Vec::new(),
            written: 0,
        }));
        (Coalesced(shared.clone()), Coalesced(shared))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending<I>> {
        // Both handles are used by one task: never contended. A panic while
        // holding it would have ended that task already.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<I: AsyncWrite + Unpin> Coalesced<I> {
    fn write_out(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.lock().write_out(cx)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Coalesced<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.lock().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Coalesced<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut p = self.lock();
        if p.buf.len() >= MAX_COALESCED_BYTES {
            ready!(p.write_out(cx))?;
        }
        let room = MAX_COALESCED_BYTES - p.buf.len();
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room - taken);
            p.buf.extend_from_slice(&b[..n]);
            taken += n;
            if taken == room {
                break;
            }
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written at the end of the connection's poll (`Driven::poll`).
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut p = self.lock();
        ready!(p.write_out(cx))?;
        Pin::new(&mut p.io).poll_shutdown(cx)
    }
}

/// A request's body as a service reads it: the stream's DATA frames (their
/// window given back as they are read), then its trailers.
pub struct RequestBody {
    recv: RecvStream,
    data_done: bool,
    done: bool,
}

impl RequestBody {
    fn new(recv: RecvStream) -> Self {
        Self {
            recv,
            data_done: false,
            done: false,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.data_done = true,
            }
        }
        let trailers = ready!(this.recv.poll_trailers(cx));
        this.done = true;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// One stream: the service's answer, then its body. Held in its
/// connection's set of streams itself, its body inline: a stream's poll
/// follows no pointer to a box of its own (a fan-out polls many streams
/// once each, and each pointer followed is a likely cache miss).
enum Respond<F, B> {
    Answering {
        answer: Pin<Box<F>>,
        reply: SendResponse<Bytes>,
    },
    Piping {
        body: B,
        tx: SendStream<Bytes>,
        /// A DATA frame that waits for the client's window: the body is not
        /// polled again until it has left.
        waiting: Option<Bytes>,
    },
    Done,
}

impl<F, B> Future for Respond<F, B>
where
    F: Future<Output = Result<http::Response<B>, Infallible>>,
    B: Body<Data = Bytes> + Unpin,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Every field is boxed or `Unpin`.
        let this = self.get_mut();
        loop {
            match this {
                Respond::Answering { answer, reply } => {
                    let Poll::Ready(Ok(response)) = answer.as_mut().poll(cx) else {
                        // A client that gives up before the answer resets
                        // the stream: the answer is dropped.
                        if reply.poll_reset(cx).is_ready() {
                            *this = Respond::Done;
                            return Poll::Ready(());
                        }
                        return Poll::Pending;
                    };
                    let (head, body) = response.into_parts();
                    let end = body.is_end_stream();
                    let next = match reply.send_response(http::Response::from_parts(head, ()), end)
                    {
                        Ok(tx) if !end => Respond::Piping {
                            body,
                            tx,
                            waiting: None,
                        },
                        Ok(_) => Respond::Done,
                        Err(e) => {
                            tracing::debug!(error = %e, "response not sent");
                            reply.send_reset(Reason::INTERNAL_ERROR);
                            Respond::Done
                        }
                    };
                    *this = next;
                }
                Respond::Piping { body, tx, waiting } => {
                    return match pipe(Pin::new(body), tx, waiting, cx) {
                        Poll::Ready(()) => {
                            *this = Respond::Done;
                            Poll::Ready(())
                        }
                        Poll::Pending => Poll::Pending,
                    };
                }
                Respond::Done => return Poll::Ready(()),
            }
        }
    }
}

/// Pipes `body` into `tx` until it ends, fails or the client resets the
/// stream. One frame at most waits for window (`waiting`).
fn pipe<B: Body<Data = Bytes>>(
    mut body: Pin<&mut B>,
    tx: &mut SendStream<Bytes>,
    waiting: &mut Option<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    loop {
        if let Some(data) = waiting.take() {
            if tx.capacity() == 0 {
                match tx.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(_))) => {}
                    // Reset by the client, or the connection gone.
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    Poll::Pending => {
                        *waiting = Some(data);
                        return reset_or_pending(tx, cx);
                    }
                }
                if tx.capacity() == 0 {
                    *waiting = Some(data);
                    continue;
                }
            }
            if tx.send_data(data, false).is_err() {
                return Poll::Ready(());
            }
            continue;
        }
        let frame = match body.as_mut().poll_frame(cx) {
            Poll::Pending => return reset_or_pending(tx, cx),
            Poll::Ready(None) => {
                let _ = tx.send_data(Bytes::new(), true);
                return Poll::Ready(());
            }
            Poll::Ready(Some(Err(_))) => {
                tx.send_reset(Reason::INTERNAL_ERROR);
                return Poll::Ready(());
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let frame = match frame.into_data() {
            Ok(data) if data.is_empty() => {
                let end = body.is_end_stream();
                if tx.send_data(data, end).is_err() || end {
                    return Poll::Ready(());
                }
                continue;
            }
            Ok(data) => {
                // h2 wakes the task a stream last waited with when it
                // assigns the stream capacity: here that is this stream,
                // being polled, and the wake would poll it once more for
                // nothing. A no-op waker takes that place first (checking
                // for a reset as it does); the stream registers its own
                // again before it waits.
                let mut quiet = Context::from_waker(Waker::noop());
                if tx.poll_reset(&mut quiet).is_ready() {
                    return Poll::Ready(());
                }
                // A claim of one byte: h2 raises it to what is buffered.
                tx.reserve_capacity(1);
                *waiting = Some(data);
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(trailers) = frame.into_trailers() {
            let _ = tx.send_trailers(trailers);
            return Poll::Ready(());
        }
    }
}

/// While the stream waits (for its body or for window), a reset by the
/// client ends it.
fn reset_or_pending(tx: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<()> {
    match tx.poll_reset(cx) {
        Poll::Ready(_) => Poll::Ready(()),
        Poll::Pending => Poll::Pending,
    }
}

/// PINGs a connection every `interval`; one unanswered for `timeout` closes it.
struct KeepAlive {
    pings: PingPong,
    interval: Duration,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    /// A PING waits for its answer.
    waiting: bool,
}

impl KeepAlive {
    fn new(pings: PingPong, interval: Duration) -> Self {
        Self {
            pings,
            interval,
            timeout: interval.saturating_mul(2),
            timer: Box::pin(tokio::time::sleep(interval)),
            waiting: false,
        }
    }

    /// `Ready` when the peer did not answer in time.
    fn poll_timed_out(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.waiting {
                match self.pings.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.waiting = false;
                        let at = Instant::now() + self.interval;
                        self.timer.as_mut().reset(at);
                    }
                    // The connection is closing: its own poll ends it.
                    Poll::Ready(Err(_)) => return Poll::Pending,
                    Poll::Pending => {}
                }
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.waiting {
                return Poll::Ready(());
            }
            if self.pings.send_ping(h2::Ping::opaque()).is_err() {
                return Poll::Pending;
            }
            self.waiting = true;
            let at = Instant::now() + self.timeout;
            self.timer.as_mut().reset(at);
        }
    }
}

/// One connection and its streams, polled streams first.
struct Driven<I, S, B>
where
    S: Service<http::Request<RequestBody>>,
{
    conn: Connection<Coalesced<I>, Bytes>,
    /// The connection's transport, to write what each poll queued.
    io: Coalesced<I>,
    service: S,
    streams: FuturesUnordered<Respond<S::Future, B>>,
    set_waker: Arc<SetWaker>,
    keepalive: Option<KeepAlive>,
}

// The service is only ever called through `&self`, never pinned; the
// streams' set never moves its streams.
impl<I, S: Service<http::Request<RequestBody>>, B> Unpin for Driven<I, S, B> {}

/// Passes over the woken streams in one poll of a connection, at most.
/// `FuturesUnordered` gives up its turn (`Pending`, its waker woken) after
/// two of its futures wake themselves, which a stream does when it takes
/// flow-control capacity; stopping there would write a connection's
/// updates two at a time.
const STREAM_PASSES: usize = 64;

/// The waker the streams' set is polled with: it tells whether the set was
/// woken during the poll (given up its turn, or a stream woken meanwhile),
/// and wakes the connection's task.
#[derive(Default)]
struct SetWaker {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for SetWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Runs the woken streams of `streams` until none is left woken (or the
/// bound).
fn run_streams<T: Future<Output = ()>>(
    streams: &mut FuturesUnordered<T>,
    set_waker: &Arc<SetWaker>,
    cx: &mut Context<'_>,
) {
    set_waker.task.register(cx.waker());
    let waker = Waker::from(set_waker.clone());
    let mut set_cx = Context::from_waker(&waker);
    let mut passes = 0;
    loop {
        set_waker.woken.store(false, Ordering::Release);
        match streams.poll_next_unpin(&mut set_cx) {
            Poll::Ready(Some(())) => {}
            Poll::Ready(None) => return,
            Poll::Pending => {
                passes += 1;
                // Past the runtime's budget for this turn, the streams
                // would only wake themselves again: the task is woken
                // and goes on at its next turn.
                if !set_waker.woken.load(Ordering::Acquire)
                    || passes == STREAM_PASSES
                    || !tokio::task::coop::has_budget_remaining()
                {
                    return;
                }
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<I, S, B> Future for Driven<I, S, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: Service<http::Request<RequestBody>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
{
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            // The streams first: the frames they queue leave with the
            // connection's write below.
            run_streams(&mut this.streams, &this.set_waker, cx);
            if let Some(k) = &mut this.keepalive {
                if k.poll_timed_out(cx).is_ready() {
                    tracing::debug!("keep-alive PING unanswered: connection closed");
                    this.conn.abrupt_shutdown(Reason::NO_ERROR);
                    this.keepalive = None;
                }
            }
            match this.conn.poll_accept(cx) {
                Poll::Ready(Some(Ok((req, reply)))) => {
                    let answer = this.service.call(req.map(RequestBody::new));
                    this.streams.push(Respond::Answering {
                        answer: Box::pin(answer),
                        reply,
                    });
                }
                done @ Poll::Ready(_) => {
                    // What the connection wrote last (its GOAWAY, or its
                    // SETTINGS before a bad preface) is sent if the socket
                    // takes it now; a peer that does not read is not waited
                    // for. Its streams are dropped with it.
                    let _ = this.io.write_out(cx);
                    return match done {
                        Poll::Ready(Some(Err(e))) => Poll::Ready(Err(e.into())),
                        _ => Poll::Ready(Ok(())),
                    };
                }
                Poll::Pending => break,
            }
        }
        // One write for everything this poll queued; a full socket wakes
        // this task when it has room.
        match this.io.write_out(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            _ => Poll::Pending,
        }
    }
}

/// Serves gRPC over HTTP/2 (no HTTP/1) on the connections `incoming`
/// yields, with `limits`, each connection and its streams in one task,
/// until `shutdown` resolves. Then stops accepting, tells every connection
/// to finish (GOAWAY; the streams in flight end as the service ends them)
/// and waits for them.
pub async fn serve<I, S, B>(
    incoming: impl futures_util::Stream<Item = io::Result<I>>,
    limits: H2Limits,
    service: S,
    shutdown: impl Future<Output = ()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<http::Request<RequestBody>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
{
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut incoming = pin!(incoming);
    let mut shutdown = pin!(shutdown);
    loop {
        let io = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = connections.join_next() => continue,
            next = incoming.next() => match next {
                Some(Ok(io)) => io,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "connection not accepted");
                    continue;
                }
                None => break,
            },
        };
        let (io, writes) = Coalesced::new(io);
        let builder = limits.builder();
        let keepalive = limits.keepalive;
        let service = service.clone();
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            // The server's SETTINGS wait in `Coalesced` like every write:
            // each poll of the handshake writes out what it queued.
            let mut handshake = builder.handshake::<_, Bytes>(io);
            let handshake = futures_util::future::poll_fn(|cx| {
                let r = Pin::new(&mut handshake).poll(cx);
                let _ = writes.write_out(cx);
                r
            });
            // One wait for the stop, through the handshake and the serving.
            // The guard `wait_for` returns must not live across an await.
            let stopped = async move {
                let _ = stopping.wait_for(|s| *s).await;
            };
            let mut stopped = pin!(stopped);
            let mut conn = tokio::select! {
                r = handshake => match r {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::debug!(error = %e, "HTTP/2 handshake failed");
                        return;
                    }
                },
                () = &mut stopped => return,
            };
            let keepalive = keepalive
                .zip(conn.ping_pong())
                .map(|(every, pings)| KeepAlive::new(pings, every));
            let mut driven = Driven {
                conn,
                io: writes,
                service,
                streams: FuturesUnordered::new(),
                set_waker: Arc::default(),
                keepalive,
            };
            let result = tokio::select! {
                r = &mut driven => r,
                () = stopped => {
                    driven.conn.graceful_shutdown();
                    driven.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP/2 connection ended with an error");
            }
        });
    }
    stop.send_replace(true);
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::Stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use std::{convert::Infallible, net::SocketAddr, sync::atomic::AtomicUsize};
    use tokio::{
        io::ReadBuf,
        net::{TcpListener, TcpStream},
        sync::oneshot,
    };
    use tokio_stream::wrappers::WatchStream;

    const DEADLINE: Duration = Duration::from_secs(10);
    /// Above the 256 bytes from which h2 hands a DATA frame's payload over
    /// as a slice of its own, and flushes after it.
    const FRAME_BYTES: usize = 300;

    /// An accepted connection that counts the writes it made.
    struct Counted {
        io: TcpStream,
        writes: Arc<AtomicUsize>,
    }

    impl Counted {
        fn count(&self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
            if let Poll::Ready(Ok(n)) = &r {
                if *n > 0 {
                    self.writes.fetch_add(1, Ordering::SeqCst);
                }
            }
            r
        }
    }

    impl AsyncRead for Counted {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let r = Pin::new(&mut this.io).poll_write(cx, buf);
            this.count(r)
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
            this.count(r)
        }
        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_flush(cx)
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
        }
    }

    /// Counts the response bodies dropped.
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    type Frames = Pin<Box<dyn Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>;

    struct Server {
        addr: SocketAddr,
        writes: Arc<AtomicUsize>,
        /// Responses made, and dropped.
        called: Arc<AtomicUsize>,
        dropped: Arc<AtomicUsize>,
        /// Polls of the response bodies.
        polls: Arc<AtomicUsize>,
        stop: Option<oneshot::Sender<()>>,
        served: tokio::task::JoinHandle<()>,
    }

    /// A server whose every response streams `updates`: its current value
    /// first, then each change, as one DATA frame of [`FRAME_BYTES`] each.
    async fn server(updates: watch::Receiver<u8>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let writes = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let incoming = futures_util::stream::unfold(
            (listener, writes.clone()),
            |(listener, writes)| async move {
                let accepted = listener.accept().await.map(|(io, _)| Counted {
                    io,
                    writes: writes.clone(),
                });
                Some((accepted, (listener, writes)))
            },
        );
        let called = Arc::new(AtomicUsize::new(0));
        let polls = Arc::new(AtomicUsize::new(0));
        let (counted, calls, polled) = (dropped.clone(), called.clone(), polls.clone());
        let service = hyper::service::service_fn(move |_req| {
            calls.fetch_add(1, Ordering::SeqCst);
            let guard = Dropped(counted.clone());
            let mut values = WatchStream::new(updates.clone());
            let polled = polled.clone();
            let frames: Frames = Box::pin(futures_util::stream::poll_fn(move |cx| {
                let _ = &guard;
                polled.fetch_add(1, Ordering::SeqCst);
                values
                    .poll_next_unpin(cx)
                    .map(|v| v.map(|v| Ok(Frame::data(Bytes::from(vec![v; FRAME_BYTES])))))
            }));
            async move { Ok::<_, Infallible>(http::Response::new(StreamBody::new(frames))) }
        });
        let limits = H2Limits {
            keepalive: None,
            max_concurrent_streams: 100,
            max_local_error_resets: 1024,
            max_pending_accept_resets: 20,
            max_header_list_bytes: 16 * 1024,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve(incoming, limits, service, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            writes,
            called,
            dropped,
            polls,
            stop: Some(stop),
            served,
        }
    }

    /// Opens `n` streams on one connection and reads each one's first
    /// frame. The client is returned to keep the connection open.
    async fn open(
        addr: SocketAddr,
        n: usize,
    ) -> (h2::client::SendRequest<Bytes>, Vec<h2::RecvStream>) {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
        tokio::spawn(conn);
        let mut pending = Vec::new();
        for _ in 0..n {
            client = client.ready().await.expect("ready");
            let req = http::Request::post(format!("http://{addr}/updates"))
                .body(())
                .expect("request");
            let (response, _) = client.send_request(req, true).expect("sent");
            pending.push(response);
        }
        let mut streams = Vec::new();
        for response in pending {
            let mut body = response.await.expect("response").into_body();
            assert_eq!(
                next(&mut body).await,
                0,
                "the first frame is the current value"
            );
            streams.push(body);
        }
        (client, streams)
    }

    /// The next frame's first byte (the value it carries), within the deadline.
    async fn next(body: &mut h2::RecvStream) -> u8 {
        let frame = tokio::time::timeout(DEADLINE, body.data())
            .await
            .expect("a frame within the deadline")
            .expect("a frame")
            .expect("data");
        let _ = body.flow_control().release_capacity(frame.len());
        assert_eq!(frame.len(), FRAME_BYTES);
        frame[0]
    }

    /// Waits until `check` holds, or fails at the deadline.
    async fn eventually(what: &str, check: impl Fn() -> bool) {
        let start = tokio::time::Instant::now();
        while !check() {
            assert!(
                start.elapsed() < DEADLINE,
                "{what}: not within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_change_reaching_every_stream_of_a_connection_leaves_in_one_write() {
        let (tx, rx) = watch::channel(0u8);
        let s = server(rx).await;
        let (_client, mut streams) = open(s.addr, 16).await;
        // hyper spawned no task per stream: they run in their connection's.
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert!(
            tasks < 8,
            "{tasks} tasks alive for one connection of 16 streams"
        );

        let before = s.writes.load(Ordering::SeqCst);
        tx.send_replace(1);
        for body in &mut streams {
            assert_eq!(next(body).await, 1);
        }
        let writes = s.writes.load(Ordering::SeqCst) - before;
        assert!(
            (1..=2).contains(&writes),
            "16 streams' updates took {writes} writes"
        );
    }

    #[tokio::test]
    async fn an_update_polls_its_stream_once_and_h2_does_not_wake_it_again() {
        let (tx, rx) = watch::channel(0u8);
        let s = server(rx).await;
        let (_client, mut streams) = open(s.addr, 1).await;
        let body = &mut streams[0];
        const UPDATES: usize = 20;
        let before = s.polls.load(Ordering::SeqCst);
        for v in 1..=UPDATES as u8 {
            tx.send_replace(v);
            assert_eq!(next(body).await, v);
        }
        // Per update: the poll that takes it and the one that finds nothing
        // more. A wake by h2's capacity for the stream being polled would
        // add a third.
        let polls = s.polls.load(Ordering::SeqCst) - before;
        assert!(
            polls <= 2 * UPDATES + 2,
            "{UPDATES} updates polled the body {polls} times"
        );
    }

    #[tokio::test]
    async fn a_stream_the_client_resets_is_dropped_and_the_others_go_on() {
        let (tx, rx) = watch::channel(0u8);
        let s = server(rx).await;
        let (_client, mut streams) = open(s.addr, 3).await;
        assert_eq!(s.called.load(Ordering::SeqCst), 3);
        assert_eq!(s.dropped.load(Ordering::SeqCst), 0);
        // Dropping every handle to a stream that is still open resets it.
        drop(streams.remove(0));
        eventually("the reset stream's body dropped", || {
            s.dropped.load(Ordering::SeqCst) == 1
        })
        .await;
        tx.send_replace(7);
        for body in &mut streams {
            assert_eq!(next(body).await, 7);
        }
        assert_eq!(s.dropped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn at_shutdown_it_stops_accepting_and_returns_once_the_streams_end() {
        let (tx, rx) = watch::channel(0u8);
        let mut s = server(rx).await;
        let (_client, mut streams) = open(s.addr, 2).await;
        s.stop.take().expect("once").send(()).expect("serving");
        // The open streams go on until they end.
        tx.send_replace(3);
        for body in &mut streams {
            assert_eq!(next(body).await, 3);
        }
        assert!(!s.served.is_finished());
        // Their bodies end when the updates do; then the server returns.
        drop(tx);
        tokio::time::timeout(DEADLINE, &mut s.served)
            .await
            .expect("the server returned within the deadline")
            .expect("the server did not panic");
        assert_eq!(s.dropped.load(Ordering::SeqCst), 2);
        assert!(
            TcpStream::connect(s.addr).await.is_err(),
            "the listener is closed once the server returns"
        );
    }

    /// Serves one in-memory connection with keep-alive PINGs every
    /// `every`; the far end is returned.
    fn serve_duplex(every: Duration) -> (tokio::io::DuplexStream, tokio::task::JoinHandle<()>) {
        let (near, far) = tokio::io::duplex(64 * 1024);
        // One connection, and then no end: an ended `incoming` stops serving.
        let incoming = futures_util::stream::iter([Ok::<_, io::Error>(near)])
            .chain(futures_util::stream::pending());
        let service = hyper::service::service_fn(|_req| async {
            Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(Bytes::from(
                vec![0u8; FRAME_BYTES],
            ))))
        });
        let limits = H2Limits {
            keepalive: Some(every),
            max_concurrent_streams: 100,
            max_local_error_resets: 1024,
            max_pending_accept_resets: 20,
            max_header_list_bytes: 16 * 1024,
        };
        let served = tokio::spawn(serve(incoming, limits, service, std::future::pending()));
        (far, served)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_answer_pings_is_closed_after_twice_the_interval() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let every = Duration::from_secs(10);
        let (mut client, served) = serve_duplex(every);
        let start = tokio::time::Instant::now();
        // The preface and empty SETTINGS, then nothing: no PING answered.
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .expect("written");
        let mut got = Vec::new();
        tokio::time::timeout(every * 10, client.read_to_end(&mut got))
            .await
            .expect("closed")
            .expect("read to the end");
        let closed = start.elapsed();
        let mut pings = 0;
        let mut at = 0;
        while at + 9 <= got.len() {
            let len = usize::from(got[at]) << 16
                | usize::from(got[at + 1]) << 8
                | usize::from(got[at + 2]);
            if got[at + 3] == 0x6 && got[at + 4] & 0x1 == 0 {
                pings += 1;
            }
            at += 9 + len;
        }
        assert_eq!(pings, 1, "one PING, then the close: {got:?}");
        assert!(
            closed >= every * 3 && closed < every * 4,
            "closed after {closed:?}: a PING at {every:?}, unanswered for twice that"
        );
        served.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_answers_pings_keeps_its_connection() {
        let every = Duration::from_secs(10);
        let (far, served) = serve_duplex(every);
        let (mut client, conn) = h2::client::handshake(far).await.expect("handshake");
        let conn = tokio::spawn(conn);
        // h2's client answers every PING.
        tokio::time::sleep(every * 10).await;
        assert!(!conn.is_finished(), "the connection was closed");
        client = client.ready().await.expect("ready");
        let req = http::Request::post("http://ballast/unary")
            .body(())
            .expect("request");
        let (response, _) = client.send_request(req, true).expect("sent");
        let mut body = response.await.expect("response").into_body();
        let data = body.data().await.expect("a frame").expect("data");
        assert_eq!(data.len(), FRAME_BYTES);
        served.abort();
    }

    #[tokio::test]
    async fn a_client_that_is_not_http2_still_gets_what_the_server_wrote() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (_tx, rx) = watch::channel(0u8);
        let s = server(rx).await;
        // A TLS ClientHello's first bytes where the HTTP/2 preface belongs:
        // the server's SETTINGS, written before it read them, still leave.
        let mut client = TcpStream::connect(s.addr).await.expect("connect");
        client
            .write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not a preface at all")
            .await
            .expect("written");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, client.read_to_end(&mut got))
            .await
            .expect("closed within the deadline");
        assert!(got.len() >= 9, "nothing came back: {got:?}");
        assert_eq!(got[3], 0x4, "the first frame is SETTINGS: {got:?}");
    }

    #[tokio::test]
    async fn writes_wait_for_the_end_of_the_poll_and_leave_together() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (near, mut far) = tokio::io::duplex(MAX_COALESCED_BYTES);
        let (mut io, writes) = Coalesced::new(near);
        io.write_all(b"one ").await.expect("taken");
        io.write_all(b"two").await.expect("taken");
        io.flush().await.expect("flush is deferred");
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(50), far.read(&mut byte)).await;
        assert!(early.is_err(), "nothing is written before write_out");

        futures_util::future::poll_fn(|cx| writes.write_out(cx))
            .await
            .expect("written");
        let mut got = [0u8; 7];
        far.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"one two");
        assert_eq!(
            writes.lock().buf.capacity(),
            0,
            "no buffer kept once written"
        );
    }

    #[tokio::test]
    async fn past_the_bound_a_write_waits_for_the_socket() {
        use tokio::io::AsyncReadExt;
        // A socket with room for 1 KiB only.
        let (near, mut far) = tokio::io::duplex(1024);
        let (mut io, _writes) = Coalesced::new(near);
        let chunk = vec![7u8; MAX_COALESCED_BYTES + 10];
        let write = |io: &mut Coalesced<tokio::io::DuplexStream>, cx: &mut Context<'_>| {
            Pin::new(io).poll_write(cx, &chunk)
        };
        let taken = futures_util::future::poll_fn(|cx| write(&mut io, cx))
            .await
            .expect("taken");
        assert_eq!(
            taken, MAX_COALESCED_BYTES,
            "it takes no more than its bound"
        );
        // Full: the next write writes out first, and the socket has no room.
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(write(&mut io, &mut cx).is_pending());
        assert!(io.lock().buf.len() <= MAX_COALESCED_BYTES);
        // Once the far end reads, it goes on.
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            let mut buf = vec![0u8; 8192];
            while all.len() < MAX_COALESCED_BYTES {
                let n = far.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed early");
                all.extend_from_slice(&buf[..n]);
            }
            all.len()
        });
        let more = tokio::time::timeout(
            DEADLINE,
            futures_util::future::poll_fn(|cx| write(&mut io, cx)),
        )
        .await
        .expect("room within the deadline")
        .expect("taken");
        assert!(more > 0);
        assert!(reader.await.expect("reader") >= MAX_COALESCED_BYTES);
    }

    #[tokio::test]
    async fn shutdown_writes_what_waits_first() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (near, mut far) = tokio::io::duplex(4096);
        let (mut io, _writes) = Coalesced::new(near);
        io.write_all(b"goaway").await.expect("taken");
        io.shutdown().await.expect("shut down");
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.expect("read to the end");
        assert_eq!(got, b"goaway");
    }
}
