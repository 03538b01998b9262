//! Serving a controller's gRPC API over TLS or plaintext on one port: each
//! connection's first byte decides (a TLS handshake record, or anything
//! else), so proxies that dial with TLS and local clients that do not both
//! reach it. Handshakes are bounded in time and number; connections in
//! number.

use crate::io::MaybeTls;
use futures_util::Stream;
use rustls::ServerConfig;
use std::{
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
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

/// Counts of what the acceptor did, for the owner's metrics.
#[derive(Debug, Default)]
pub struct ServeStats {
    pub tls: AtomicU64,
    pub plaintext: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub handshakes_shed: AtomicU64,
}

type Io = MaybeTls<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// An accepted connection, TLS or not, holding its connection permit.
pub struct ServerIo {
    io: Io,
    info: TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
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
    tokio::spawn(async move {
        loop {
            // At the connection bound, stop accepting: the kernel's backlog
            // holds the rest.
            let Ok(permit) = conns.clone().acquire_owned().await else {
                return;
            };
            let (stream, remote) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
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
                stats.handshakes_shed.fetch_add(1, Ordering::Relaxed);
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
                        stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%remote, "handshake timed out");
                        return;
                    }
                };
                match &io {
                    MaybeTls::Tls(_) => stats.tls.fetch_add(1, Ordering::Relaxed),
                    MaybeTls::Plain(_) => stats.plaintext.fetch_add(1, Ordering::Relaxed),
                };
                let _ = tx
                    .send(Ok(ServerIo {
                        io,
                        info,
                        _permit: permit,
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
