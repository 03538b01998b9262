//! Connections to one endpoint: a pool of idle HTTP/1 connections (bounded,
//! expiring) and one shared, multiplexed HTTP/2 connection.

use hyper::{
    body::Incoming,
    client::conn::{http1, http2},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    net::SocketAddr,
    sync::Mutex,
    time::{Duration, Instant},
};
use tokio::net::TcpStream;

/// Why no connection was had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to {0} timed out")]
    Timeout(SocketAddr),
    #[error("connect to {0} failed: {1}")]
    Io(SocketAddr, std::io::Error),
    #[error("{0} closed a new connection before a request was sent")]
    Closed(SocketAddr),
    #[error("HTTP handshake with {0} failed: {1}")]
    Handshake(SocketAddr, hyper::Error),
}

/// Pool limits and timeouts.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
}

#[derive(Debug, Default)]
pub struct EndpointConns {
    h1_idle: Mutex<Vec<(http1::SendRequest<Incoming>, Instant)>>,
    h2: Mutex<Option<http2::SendRequest<Incoming>>>,
}

/// Opens a TCP connection with the connect timeout.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ConnectError> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(ConnectError::Io(addr, e)),
        Err(_) => Err(ConnectError::Timeout(addr)),
    }
}

impl EndpointConns {
    /// An idle HTTP/1 connection that is still open, if any.
    pub fn take_h1(&self, config: &PoolConfig) -> Option<http1::SendRequest<Incoming>> {
        let mut idle = self.h1_idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < config.idle_timeout {
                return Some(sender);
            }
        }
        None
    }

    /// Returns a connection whose exchange finished.
    pub fn put_h1(&self, sender: http1::SendRequest<Incoming>, config: &PoolConfig) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.h1_idle.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        idle.retain(|(s, since)| {
            !s.is_closed() && now.duration_since(*since) < config.idle_timeout
        });
        if idle.len() < config.max_idle {
            idle.push((sender, now));
        }
    }

    /// Opens a new HTTP/1 connection.
    pub async fn connect_h1(
        &self,
        addr: SocketAddr,
        config: &PoolConfig,
    ) -> Result<http1::SendRequest<Incoming>, ConnectError> {
        let stream = connect(addr, config.connect_timeout).await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ConnectError::Handshake(addr, e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%addr, error = %e, "endpoint HTTP/1 connection ended");
            }
        });
        Ok(sender)
    }

    /// The shared HTTP/2 connection, opened if there is none.
    pub async fn h2(
        &self,
        addr: SocketAddr,
        config: &PoolConfig,
    ) -> Result<http2::SendRequest<Incoming>, ConnectError> {
        if let Some(s) = self
            .h2
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|s| !s.is_closed())
        {
            return Ok(s.clone());
        }
        let stream = connect(addr, config.connect_timeout).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ConnectError::Handshake(addr, e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%addr, error = %e, "endpoint HTTP/2 connection ended");
            }
        });
        *self.h2.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender.clone());
        Ok(sender)
    }
}
