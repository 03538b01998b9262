//! Backends for proxy tests besides the demo HTTP backend: TCP servers that
//! echo or hold connections, and gRPC health servers. Each stops when
//! dropped.

use std::{
    future::Future,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};
use tonic::transport::server::TcpIncoming;
use tonic_health::server::HealthReporter;

/// A TCP server: accepts connections, counts them, and serves each on its
/// own task; when dropped it stops, and closes every connection.
pub struct Acceptor {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Acceptor {
    /// Listens on `bind` (port 0 lets the OS pick) and hands each accepted
    /// connection to `serve`.
    pub async fn start<F, Fut>(bind: SocketAddr, serve: F) -> std::io::Result<Acceptor>
    where
        F: Fn(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            // Owned here so that aborting the accept loop aborts every connection.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    Some(_) = connections.join_next() => {}
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        count.fetch_add(1, Ordering::Relaxed);
                        connections.spawn(serve(stream));
                    }
                }
            }
        });
        Ok(Acceptor {
            addr,
            accepted,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Echoes every byte it reads back on the same connection, then closes its
/// side when the client closes its.
pub async fn echo(bind: SocketAddr) -> std::io::Result<Acceptor> {
    Acceptor::start(bind, |mut stream| async move {
        let (mut read, mut write) = stream.split();
        if tokio::io::copy(&mut read, &mut write).await.is_ok() {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut write).await;
        }
    })
    .await
}

/// Accepts connections and never reads from them; they stay open until
/// it is dropped.
pub async fn black_hole(bind: SocketAddr) -> std::io::Result<Acceptor> {
    Acceptor::start(bind, |stream| async move {
        let _held = stream;
        std::future::pending::<()>().await
    })
    .await
}

/// gRPC servers of `grpc.health.v1.Health` sharing one reporter: setting a
/// status on it changes every server's answers and pushes a message on every
/// open `Watch` stream.
pub struct GrpcHealth {
    pub reporter: HealthReporter,
    pub addrs: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl GrpcHealth {
    /// One server per `bind` address (port 0 lets the OS pick). The empty
    /// service name "" is SERVING; any other unknown name is answered
    /// NOT_FOUND by `Check`.
    pub async fn start(binds: &[SocketAddr]) -> std::io::Result<GrpcHealth> {
        let (reporter, service) = tonic_health::server::health_reporter();
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for bind in binds {
            let listener = TcpListener::bind(bind).await?;
            addrs.push(listener.local_addr()?);
            let router = tonic::transport::Server::builder().add_service(service.clone());
            tasks.push(tokio::spawn(async move {
                let _ = router
                    .serve_with_incoming(TcpIncoming::from(listener))
                    .await;
            }));
        }
        Ok(GrpcHealth {
            reporter,
            addrs,
            tasks,
        })
    }
}

impl Drop for GrpcHealth {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
