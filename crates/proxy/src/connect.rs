//! Opening connections to endpoints: a TCP connect within the connect
//! timeout; to an endpoint with a mesh identity, mutual TLS for exactly that
//! identity (and Linkerd's opaque transport header, for opaque traffic to a
//! proxy that hints its inbound port); and the errors every protocol's
//! connect shares.

use crate::{
    discovery::Endpoint,
    identity::MeshTls,
    metrics::{Direction, TlsLabels},
};
use ballast_meshtls::{
    header::TransportHeader,
    io::{ClientIo, MaybeTls},
    tls::{server_name, TRANSPORT_HEADER_ALPN},
};
use std::{net::SocketAddr, sync::Arc, time::Duration};
use tokio::{io::AsyncWriteExt, net::TcpStream};

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
    #[error("mutual TLS with {0} as {1} failed: {2}")]
    Tls(SocketAddr, String, String),
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

/// How one side opens connections to its endpoints.
#[derive(Clone, Debug)]
pub struct Dialer {
    pub timeout: Duration,
    /// The proxy's identity; `None` when identity is disabled (or on the
    /// inbound side, whose endpoint is the local workload).
    pub mesh: Option<Arc<MeshTls>>,
    pub direction: Direction,
}

impl Dialer {
    pub fn plain(timeout: Duration, direction: Direction) -> Self {
        Self {
            timeout,
            mesh: None,
            direction,
        }
    }

    /// Connects to `ep`; `opaque` traffic to a proxy that hints its inbound
    /// port goes there, with the transport header naming `ep`'s port.
    pub async fn dial(
        &self,
        ep: &Endpoint,
        opaque: bool,
    ) -> Result<(ClientIo, TlsLabels), ConnectError> {
        let (mesh, id) = match (&self.mesh, &ep.identity) {
            (Some(mesh), Some(id)) => (mesh, id),
            (None, _) => {
                let tcp = connect(ep.addr, self.timeout).await?;
                // The inbound side's endpoint is the workload, on loopback.
                let labels = match self.direction {
                    Direction::inbound => TlsLabels::NoIdentity("loopback"),
                    Direction::outbound => TlsLabels::Disabled,
                };
                return Ok((MaybeTls::Plain(tcp), labels));
            }
            (Some(_), None) => {
                let tcp = connect(ep.addr, self.timeout).await?;
                return Ok((
                    MaybeTls::Plain(tcp),
                    TlsLabels::NoIdentity("not_provided_by_service_discovery"),
                ));
            }
        };
        let header_port = if opaque { ep.opaque_port } else { None };
        let addr = header_port.map_or(ep.addr, |p| SocketAddr::new(ep.addr.ip(), p));
        let tcp = connect(addr, self.timeout).await?;
        let config = if header_port.is_some() {
            &mesh.client_opaque
        } else {
            &mesh.client
        };
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let fail = |error: &'static str, why: String| {
            mesh.metrics.error(self.direction, error);
            ConnectError::Tls(addr, id.to_string(), why)
        };
        let mut tls = match tokio::time::timeout(
            mesh.handshake_timeout,
            connector.connect(server_name(id), tcp),
        )
        .await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                // A peer whose certificate does not prove the identity
                // dialled (wrong name, another CA, expired) is an identity
                // failure; anything else a handshake failure.
                let rejected = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|r| matches!(r, rustls::Error::InvalidCertificate(_)));
                let kind = if rejected { "identity" } else { "handshake" };
                return Err(fail(kind, e.to_string()));
            }
            Err(_) => return Err(fail("timeout", "handshake timed out".into())),
        };
        if header_port.is_some() && tls.get_ref().1.alpn_protocol() == Some(TRANSPORT_HEADER_ALPN) {
            let header = TransportHeader {
                port: ep.addr.port(),
                name: None,
                protocol: None,
            };
            if let Err(e) = tls.write_all(&header.encode()).await {
                return Err(fail("header", e.to_string()));
            }
        }
        Ok((
            MaybeTls::Tls(Box::new(tls)),
            TlsLabels::ServerId(Arc::from(id.as_str())),
        ))
    }
}
