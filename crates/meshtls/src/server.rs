//! Serving a controller's gRPC API over TLS or plaintext on one port: each
//! connection's first byte decides (a TLS handshake record, or anything
//! else), so proxies that dial with TLS and local clients that do not both
//! reach it. Handshakes are bounded in time and number; connections in
//! number: one past the bound is accepted and closed at once, counted, so
//! that its client backs off and may reach another replica instead of
//! waiting unanswered in the listen backlog.

use crate::io::MaybeTls;
use ballast_serve::{accept::Acceptor, GaugeGuard};
use futures_util::Stream;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::ServerConfig;
use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{mpsc, OwnedSemaphorePermit, Semaphore},
};
use tonic::transport::server::{Connected, TcpConnectInfo};

pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_HANDSHAKES: usize = 256;
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// The budget to give h2's `max_local_error_reset_streams` so that a client
/// past SETTINGS_MAX_CONCURRENT_STREAMS is refused, not cut.
///
/// h2 counts every stream it refuses with REFUSED_STREAM toward the same
/// budget as the streams it resets for protocol errors, and a refused
/// stream's DATA frames cost one more reset (STREAM_CLOSED). With a budget
/// of only `error_resets`, a client that opens twice the limit at once
/// (legal before it has read the SETTINGS) is cut with GOAWAY
/// ENHANCE_YOUR_CALM after a few dozen refusals, and the streams it was
/// granted die with the connection. The budget therefore forgives one whole
/// window of overshoot, each stream with a body, on top of `error_resets`;
/// a client that overshoots by more is cut. Refusals hold no stream state
/// (h2 writes each RST_STREAM before it reads another frame).
pub const fn h2_local_reset_budget(error_resets: usize, max_concurrent_streams: u32) -> usize {
    // A u32 always fits a usize on the targets Ballast builds for.
    error_resets.saturating_add((max_concurrent_streams as usize).saturating_mul(2))
}

#[derive(Debug, Clone)]
pub struct ServeLimits {
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
    pub max_connections: usize,
    pub keepalive: Option<Duration>,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            keepalive: None,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptLabels {
    /// `true` or `false`.
    pub tls: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `handshake`, `timeout` (of the handshake) or `shed` (past the
    /// handshake bound).
    pub error: &'static str,
}

/// What the acceptor did, as metrics its owner registers.
#[derive(Clone, Debug, Default)]
pub struct ServeStats {
    pub accepted: Family<AcceptLabels, Counter>,
    pub open: Gauge,
    pub errors: Family<ErrorLabels, Counter>,
    /// Connections closed at once because the connection bound was reached.
    pub refused: Counter,
}

impl ServeStats {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "grpc_server_connections",
            "Connections handed to the gRPC server, by whether they are TLS",
            self.accepted.clone(),
        );
        r.register(
            "grpc_server_connections_open",
            "Connections open (bounded by the connection limit, 10,000 by default)",
            self.open.clone(),
        );
        r.register(
            "grpc_server_connections_refused",
            "Connections closed at once, unanswered, because the connection limit was reached",
            self.refused.clone(),
        );
        r.register(
            "grpc_server_tls_errors",
            "Connections closed before serving: TLS handshake errors and timeouts, handshakes shed past the handshake limit (256 by default)",
            self.errors.clone(),
        );
    }

    fn error(&self, error: &'static str) {
        self.errors.get_or_create(&ErrorLabels { error }).inc();
    }
}

type Io = MaybeTls<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// An accepted connection, TLS or not, holding its connection permit.
pub struct ServerIo {
    io: Io,
    info: TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
    _open: GaugeGuard,
}

impl ServerIo {
    pub fn is_tls(&self) -> bool {
        self.io.is_tls()
    }
}

impl Connected for ServerIo {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accepts on `listener` and yields connections ready for gRPC. With `tls`
/// `None`, every connection is plaintext.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    limits: ServeLimits,
    stats: Arc<ServeStats>,
) -> impl Stream<Item = io::Result<ServerIo>> {
    let (tx, rx) = mpsc::channel::<io::Result<ServerIo>>(64);
    let conns = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes.max(1)));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut accepting = Acceptor::new("grpc", listener);
    tokio::spawn(async move {
        loop {
            let (stream, remote) = tokio::select! {
                accepted = accepting.accept() => accepted,
                _ = tx.closed() => return,
            };
            // Past the connection bound, close at once: a client left in the
            // backlog would wait for its handshake's timeout, while one that
            // is closed retries with back-off, maybe on another replica.
            let Ok(permit) = conns.clone().try_acquire_owned() else {
                stats.refused.inc();
                tracing::debug!(%remote, "connection limit reached; closed");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            if let Some(k) = limits.keepalive {
                let _ = socket_keepalive(&stream, k);
            }
            let info = TcpConnectInfo {
                local_addr: stream.local_addr().ok(),
                remote_addr: Some(remote),
            };
            let Ok(slot) = handshakes.clone().try_acquire_owned() else {
                stats.error("shed");
                continue;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let stats = stats.clone();
            let timeout = limits.handshake_timeout;
            tokio::spawn(async move {
                let started = tokio::time::timeout(timeout, start(stream, acceptor)).await;
                drop(slot);
                let io = match started {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        stats.error("handshake");
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        stats.error("timeout");
                        tracing::debug!(%remote, "handshake timed out");
                        return;
                    }
                };
                let tls = if io.is_tls() { "true" } else { "false" };
                stats.accepted.get_or_create(&AcceptLabels { tls }).inc();
                let open = GaugeGuard::new(&stats.open);
                let _ = tx
                    .send(Ok(ServerIo {
                        io,
                        info,
                        _permit: permit,
                        _open: open,
                    }))
                    .await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn socket_keepalive(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(idle))
}

async fn start(stream: TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) -> io::Result<Io> {
    let Some(acceptor) = acceptor else {
        return Ok(MaybeTls::Plain(stream));
    };
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 0 || first[0] != 0x16 {
        return Ok(MaybeTls::Plain(stream));
    }
    Ok(MaybeTls::Tls(Box::new(acceptor.accept(stream).await?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;

    /// Reads until the server closes; `true` if it did within the deadline.
    async fn closed_by_server(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), client.read(&mut byte)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn a_connection_past_the_bound_is_closed_at_once_and_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let stats = Arc::new(ServeStats::default());
        let limits = ServeLimits {
            max_connections: 1,
            ..Default::default()
        };
        let mut incoming = Box::pin(incoming(listener, None, limits, stats.clone()));

        let _first = TcpStream::connect(addr).await.expect("connect");
        let served = incoming
            .next()
            .await
            .expect("a connection")
            .expect("served");
        assert_eq!(stats.open.get(), 1);

        let mut second = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_by_server(&mut second).await,
            "the connection past the bound was not closed"
        );
        assert_eq!(stats.refused.get(), 1);

        // Once the first ends, the next is served again.
        drop(served);
        let _third = TcpStream::connect(addr).await.expect("connect");
        let again = tokio::time::timeout(Duration::from_secs(10), incoming.next())
            .await
            .expect("served within the deadline")
            .expect("a connection");
        assert!(again.is_ok());
        assert_eq!(stats.refused.get(), 1);
    }
}
