//! A connection that is TLS or not, decided per connection.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub enum MaybeTls<P, T> {
    Plain(P),
    Tls(T),
}

impl<P, T> MaybeTls<P, T> {
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }
}

impl<P: AsyncRead + Unpin, T: AsyncRead + Unpin> AsyncRead for MaybeTls<P, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl<P: AsyncWrite + Unpin, T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<P, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// A client connection to a control-plane or mesh peer.
pub type ClientIo =
    MaybeTls<tokio::net::TcpStream, Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>>;

/// Dials TLS for `name` over `tcp`, or hands it back as is without `tls`.
pub async fn connect(
    tcp: tokio::net::TcpStream,
    tls: Option<(&std::sync::Arc<rustls::ClientConfig>, &crate::IdentityName)>,
) -> io::Result<ClientIo> {
    match tls {
        None => Ok(MaybeTls::Plain(tcp)),
        Some((config, name)) => {
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let stream = connector
                .connect(crate::tls::server_name(name), tcp)
                .await?;
            Ok(MaybeTls::Tls(Box::new(stream)))
        }
    }
}

/// A gRPC channel over `endpoint` whose every connection dials `target`
/// (`HOST:PORT`) within `connect_timeout`, in TLS verifying the name given
/// with its client config, else in plaintext. Lazy: nothing is dialled
/// before the first call, and a failed connect is tried again by the next.
pub fn lazy_channel(
    endpoint: tonic::transport::Endpoint,
    target: String,
    tls: Option<(std::sync::Arc<rustls::ClientConfig>, crate::IdentityName)>,
    connect_timeout: std::time::Duration,
) -> tonic::transport::Channel {
    let connector = tower::service_fn(move |_: http::Uri| {
        let (target, tls) = (target.clone(), tls.clone());
        async move {
            let dial = async {
                let tcp = tokio::net::TcpStream::connect(target.as_str()).await?;
                let _ = tcp.set_nodelay(true);
                connect(tcp, tls.as_ref().map(|(c, n)| (c, n))).await
            };
            match tokio::time::timeout(connect_timeout, dial).await {
                Ok(r) => r.map(hyper_util::rt::TokioIo::new),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {target} timed out after {connect_timeout:?}"),
                )),
            }
        }
    });
    endpoint.connect_with_connector_lazy(connector)
}

/// Whether a control-plane address (`HOST:PORT`) is on this host:
/// `127.0.0.1:8080`, `[::1]:8080`, `localhost:8080`. Linkerd dials those in
/// plaintext.
pub fn is_loopback(addr: &str) -> bool {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => addr
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_addresses() {
        for a in [
            "127.0.0.1:8080",
            "127.9.9.9:1",
            "[::1]:8080",
            "localhost:8080",
            "LOCALHOST:1",
        ] {
            assert!(super::is_loopback(a), "{a}");
        }
        for a in [
            "10.0.0.1:8080",
            "linkerd-identity.linkerd.svc:8080",
            "localhost.example:1",
            "[::2]:1",
        ] {
            assert!(!super::is_loopback(a), "{a}");
        }
    }
}
