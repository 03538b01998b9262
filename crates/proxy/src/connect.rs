//! Opening connections to endpoints: a TCP connect within the connect
//! timeout, and the errors every protocol's connect shares.

use std::{net::SocketAddr, time::Duration};
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
    #[error("{0} has --max-connections-per-endpoint connections open, none free in time")]
    Exhausted(SocketAddr),
    #[error("the connect to {0} that this request waited for failed")]
    SharedAttemptFailed(SocketAddr),
    #[error("no connection to {0} within the failfast timeout")]
    Deadline(SocketAddr),
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
