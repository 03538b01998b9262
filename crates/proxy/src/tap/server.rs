//! The tap listener's connections: `io.linkerd.proxy.tap.Tap/Observe` over
//! HTTP/2 with explicit limits.
//!
//! With the proxy's identity, a connection is mutual TLS with the proxy's
//! own certificate and is served only if the client's verified identity is
//! `--tap-client-identity`; any other client (another identity, no
//! certificate, plaintext) gets `PERMISSION_DENIED` for every tap and no
//! event. Without identity, connections are plaintext and served.

use super::{
    matcher::Match,
    registry::{Refused, Registration, Registry, Taps},
};
use crate::{config::TapConfig, identity::MeshTls};
use ballast_meshtls::{io::MaybeTls, tls, IdentityName};
use futures_util::Stream;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use linkerd2_proxy_api::tap::{
    observe_request::extract,
    tap_server::{Tap, TapServer},
    ObserveRequest, TapEvent,
};
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::{net::TcpStream, sync::mpsc, sync::watch};
use tonic::{Code, Status};

/// A TLS record starts with this byte (a handshake); anything else is
/// plaintext.
const TLS_HANDSHAKE: u8 = 0x16;
/// Idle tap connections are pinged this often; one that does not answer
/// within [`KEEPALIVE_TIMEOUT`] is closed, freeing its taps.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams one tap connection may make the server reset for protocol
/// errors before GOAWAY (refusals of one window past the limit on top).
const MAX_LOCAL_ERROR_RESETS: usize = 100;
/// Bytes buffered for sending per tap stream.
const MAX_SEND_BUFFER_BYTES: usize = 64 * 1024;

/// What serves the tap listener's connections.
#[derive(Clone, Debug)]
pub struct TapServing {
    registry: Arc<Registry>,
    config: Arc<TapConfig>,
    /// The proxy's certificate, offering `h2`; `None` without identity.
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl TapServing {
    /// `None` when `taps` is disabled.
    pub fn new(taps: &Taps, config: TapConfig, mesh: Option<&Arc<MeshTls>>) -> Option<Self> {
        let registry = taps.registry()?.clone();
        let tls = mesh.map(|m| {
            let mut c = (*m.server).clone();
            c.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(c)
        });
        Some(Self {
            registry,
            config: Arc::new(config),
            tls,
        })
    }

    /// Serves one accepted connection until it closes or `shutdown`.
    pub async fn serve(self, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let peer = stream.peer_addr().ok();
        let started = tokio::time::timeout(self.config.handshake_timeout, self.accept(stream));
        let (io, client) = match started.await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                tracing::debug!(?peer, error = %e, "tap connection: TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(?peer, "tap connection: no handshake in time");
                return;
            }
        };
        let observer = Observer {
            registry: self.registry.clone(),
            client,
        };
        let grpc =
            TapServer::new(observer).max_decoding_message_size(self.config.max_request_bytes);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let mut grpc = grpc.clone();
            async move { tower::Service::call(&mut grpc, req).await }
        });
        let c = &self.config;
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(c.h2_max_concurrent_streams)
            .max_header_list_size(c.h2_max_header_list_bytes)
            .max_pending_accept_reset_streams(Some(c.h2_max_pending_accept_resets))
            .max_local_error_reset_streams(Some(ballast_meshtls::server::h2_local_reset_budget(
                MAX_LOCAL_ERROR_RESETS,
                c.h2_max_concurrent_streams,
            )))
            .max_send_buf_size(MAX_SEND_BUFFER_BYTES)
            .keep_alive_interval(Some(KEEPALIVE_INTERVAL))
            .keep_alive_timeout(KEEPALIVE_TIMEOUT);
        let conn = b.serve_connection(TokioIo::new(io), service);
        tokio::select! {
            r = conn => {
                if let Err(e) = r {
                    tracing::debug!(?peer, error = %e, "tap connection ended");
                }
            }
            // Taps never end by themselves: at shutdown the connection is
            // dropped, not drained.
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }

    /// The connection's TLS (if the proxy has an identity) and whether its
    /// client may tap.
    async fn accept(&self, stream: TcpStream) -> std::io::Result<(TapIo, Result<(), String>)> {
        let Some(config) = &self.tls else {
            return Ok((MaybeTls::Plain(stream), Ok(())));
        };
        let mut first = [0u8; 1];
        let n = stream.peek(&mut first).await?;
        if n == 0 || first[0] != TLS_HANDSHAKE {
            return Ok((
                MaybeTls::Plain(stream),
                Err("the tap API takes mutual TLS only".into()),
            ));
        }
        let tls = tokio_rustls::TlsAcceptor::from(config.clone())
            .accept(stream)
            .await?;
        let id = tls::peer_identity(tls.get_ref().1.peer_certificates());
        let client = authorize(id.as_ref(), self.config.client_identity.as_ref());
        Ok((MaybeTls::Tls(Box::new(tls)), client))
    }
}

type TapIo = MaybeTls<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// Whether a client proved the one identity that may tap.
fn authorize(client: Option<&IdentityName>, allowed: Option<&IdentityName>) -> Result<(), String> {
    match (client, allowed) {
        (Some(c), Some(a)) if c == a => Ok(()),
        (Some(c), _) => Err(format!("{c} may not tap this proxy")),
        (None, _) => Err("a client certificate is required to tap this proxy".into()),
    }
}

/// The Tap service of one connection.
struct Observer {
    registry: Arc<Registry>,
    /// `Err` names why this connection's client may not tap.
    client: Result<(), String>,
}

#[tonic::async_trait]
impl Tap for Observer {
    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: tonic::Request<ObserveRequest>,
    ) -> Result<tonic::Response<ObserveStream>, Status> {
        let metrics = &self.registry.metrics;
        if let Err(why) = &self.client {
            metrics.refused("unauthorized");
            // Linkerd's tap answers an unauthorized client so.
            return Err(Status::new(Code::Unauthenticated, why.clone()));
        }
        let req = req.into_inner();
        let invalid = |msg: String| {
            metrics.refused("invalid");
            Status::new(Code::InvalidArgument, msg)
        };
        if req.limit == 0 {
            return Err(invalid("limit must be positive".into()));
        }
        let matcher = Match::try_new(req.r#match).map_err(|e| invalid(e.to_string()))?;
        let headers = matches!(
            req.extract.and_then(|e| e.extract),
            Some(extract::Extract::Http(extract::Http {
                extract: Some(extract::http::Extract::Headers(_)),
            }))
        );
        match self.registry.open(matcher, req.limit, headers) {
            Ok((registration, rx)) => Ok(tonic::Response::new(ObserveStream {
                rx,
                _registration: registration,
            })),
            Err(e @ Refused::TooMany(_)) => {
                metrics.refused("limit");
                Err(Status::new(Code::ResourceExhausted, e.to_string()))
            }
        }
    }
}

/// One tap's events; dropping it (the client went away) closes the tap.
pub struct ObserveStream {
    rx: mpsc::Receiver<TapEvent>,
    _registration: Registration,
}

impl Stream for ObserveStream {
    type Item = Result<TapEvent, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx).map(|e| e.map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_configured_identity_may_tap() {
        let viz = IdentityName::parse(
            "ballast-viz.ballast.serviceaccount.identity.linkerd.cluster.local",
        )
        .unwrap();
        let web =
            IdentityName::parse("web.shop.serviceaccount.identity.linkerd.cluster.local").unwrap();
        assert!(authorize(Some(&viz), Some(&viz)).is_ok());
        assert!(authorize(Some(&web), Some(&viz))
            .unwrap_err()
            .contains("web.shop"));
        assert!(authorize(None, Some(&viz)).is_err());
        assert!(
            authorize(Some(&viz), None).is_err(),
            "no identity configured: no one"
        );
    }
}
