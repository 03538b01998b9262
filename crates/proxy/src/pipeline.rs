//! One connection pipeline for both sides of the proxy: route the accepted
//! connection, count it, detect its protocol (unless its port is opaque),
//! then serve it per request (HTTP) or byte for byte (TCP), and count its
//! close. Each side supplies only its router ([`Side`]).

use crate::{
    config::HttpLimits,
    detect::Protocol,
    http::{error_response, server, ResponseBody},
    io::{read_prefix, read_until, Counted, Prefixed},
    memory::MemoryLimit,
    metrics::{DstLabels, Metrics, Peer, TcpMetrics},
    tap::{ConnTap, Taps},
};
use crate::{identity::MeshTls, metrics::TlsLabels};
use ballast_meshtls::{
    header, hello,
    tls::{self, TRANSPORT_HEADER_ALPN},
};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use std::{future::Future, pin::Pin, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
};

/// How a connection is served once detected: boxed, so that its task holds
/// a pointer to it.
type Serving<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Linkerd's header naming a meshed client's identity to the workload.
pub const L5D_CLIENT_ID: &str = "l5d-client-id";

/// What the requests of a connection say of the client's identity: set to
/// the identity its certificate proved, or removed (a client cannot claim
/// one in plaintext); untouched on a side that terminates no mesh TLS.
#[derive(Clone)]
enum ClientIdHeader {
    Untouched,
    Strip,
    Set(HeaderValue),
}

/// Reads Linkerd's transport header from a connection that negotiated it:
/// the port it names, whether the connection is opaque (no protocol named),
/// and the bytes read past the header. `None` for a bad, oversized, or
/// late header.
async fn transport_header<T: AsyncRead + Unpin>(
    io: &mut T,
    timeout: Duration,
) -> Option<(u16, bool, Bytes)> {
    use header::TransportHeader;
    let decide = |b: &[u8]| match TransportHeader::decode(b) {
        Ok(None) => None,
        Ok(Some((h, used))) => Some(Some((h.port, h.protocol.is_none(), used))),
        Err(_) => Some(None),
    };
    let (decided, buf) = read_until(io, timeout, header::MAX_MESSAGE + 64, decide)
        .await
        .ok()?;
    let (port, opaque, used) = decided.flatten()?;
    Some((port, opaque, buf.slice(used..)))
}

/// What a connection's TLS says of its client, for a side that authorizes
/// clients.
#[derive(Clone, Debug)]
pub enum ClientTls {
    /// Plaintext, or TLS passed through to the workload: no mesh
    /// authentication; the connection's `tls` labels.
    Unauthenticated(TlsLabels),
    /// Mesh TLS this proxy terminated, and the identity the client's
    /// certificate proved (`None`: it sent no certificate).
    Mesh(Option<ballast_meshtls::IdentityName>),
}

/// Where an accepted connection goes, decided once.
pub struct Accepted<R> {
    pub route: R,
    /// The `src` side's metric labels.
    pub labels: DstLabels,
    /// Forward as TCP without detecting the protocol.
    pub opaque: bool,
}

/// What one side of the proxy decides; the pipeline does the rest.
pub trait Side: Send + Sync + 'static {
    /// Where one connection goes.
    type Route: Send + 'static;
    /// What serves a connection's HTTP requests, bound once when HTTP is
    /// detected (a balancer, or per-request routing by authority).
    type Http: Send + Sync + 'static;
    /// Which side this is, for metrics.
    const DIRECTION: crate::metrics::Direction;

    /// Routes a new connection; `None` refuses it (the side counts why).
    fn route(
        self: &Arc<Self>,
        stream: &TcpStream,
    ) -> impl Future<Output = Option<Accepted<Self::Route>>> + Send;

    /// Forwards a connection byte for byte; returns whether it ended cleanly.
    fn forward_tcp<C>(
        self: &Arc<Self>,
        client: C,
        route: Self::Route,
    ) -> impl Future<Output = bool> + Send
    where
        C: AsyncRead + AsyncWrite + Unpin + Send;

    /// Binds a connection found to speak HTTP.
    fn bind_http(self: &Arc<Self>, route: Self::Route) -> Self::Http;

    /// This side's mesh TLS termination (inbound, with identity): TLS for
    /// the proxy's own identity is terminated, other TLS passes through.
    fn mesh(&self) -> Option<&Arc<MeshTls>> {
        None
    }

    /// A plaintext connection's `tls` labels.
    fn plain_tls(&self) -> TlsLabels {
        TlsLabels::Disabled
    }

    /// The route for a connection whose transport header names `port`;
    /// `None` refuses it.
    fn reroute(&self, route: Self::Route, port: u16) -> Option<Self::Route> {
        let _ = port;
        Some(route)
    }

    /// Told what the connection's TLS proved of its client, once known (a
    /// side that terminates mesh TLS; plaintext clients are not told).
    fn client_tls(&self, route: Self::Route, tls: ClientTls) -> Self::Route {
        let _ = tls;
        route
    }

    /// Answers one request.
    fn request(
        self: Arc<Self>,
        http: Arc<Self::Http>,
        req: Request<Incoming>,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + 'static;
}

/// What every connection of both sides shares.
#[derive(Clone, Debug)]
pub struct Pipeline {
    pub detect_timeout: Duration,
    pub limits: HttpLimits,
    pub metrics: Arc<Metrics>,
    pub memory: MemoryLimit,
    /// Turns true at shutdown: HTTP connections finish their requests and close.
    pub shutdown: watch::Receiver<bool>,
    /// The open taps, offered every HTTP request (disabled: no cost).
    pub tap: Taps,
}

impl Pipeline {
    /// Serves one accepted connection.
    pub async fn serve<S: Side>(self: Arc<Self>, side: Arc<S>, stream: TcpStream) {
        // Routing and detection are boxed, and hand back the serving, boxed
        // too: a connection's task is sized for its largest state for its
        // whole life, and most connections are idle HTTP.
        let Some((src, serving)) = Box::pin(self.route_and_detect(side, stream)).await else {
            return;
        };
        src.close(serving.await);
    }

    async fn route_and_detect<S: Side>(
        &self,
        side: Arc<S>,
        stream: TcpStream,
    ) -> Option<(TcpMetrics, Serving<'_>)> {
        let accepted = side.route(&stream).await?;
        if let Some(mesh) = side.mesh().cloned() {
            return self.accept_mesh(side, stream, accepted, mesh).await;
        }
        let (src, detected) = self.start(side, stream, accepted);
        Some((src, detected.await))
    }

    /// A connection to a side that terminates mesh TLS: the ClientHello
    /// decides. TLS for this proxy's identity is terminated (the client's
    /// identity recorded, and Linkerd's transport header read when the
    /// client negotiated it); TLS for another name passes through as
    /// opaque bytes; anything else is served as before.
    async fn accept_mesh<S: Side>(
        &self,
        side: Arc<S>,
        mut stream: TcpStream,
        accepted: Accepted<S::Route>,
        mesh: Arc<MeshTls>,
    ) -> Option<(TcpMetrics, Serving<'_>)> {
        let Accepted {
            route,
            labels,
            opaque,
        } = accepted;
        let direction = labels.direction;
        let peer = self
            .tap
            .enabled()
            .then(|| stream.peer_addr().ok())
            .flatten();
        let decided =
            read_until(
                &mut stream,
                self.detect_timeout,
                hello::MAX_RECORD,
                |b| match hello::peek(b) {
                    hello::Peek::NeedMore => None,
                    other => Some(other),
                },
            )
            .await;
        let (peek, prefix, opaque) = match decided {
            Ok((Some(p), prefix)) => (p, prefix, opaque),
            // Closed, timed out or over the bound before deciding: whatever
            // was read is served as plaintext (detection decides on it). A
            // client that sent nothing waits for its server (a server-first
            // protocol): served as opaque, not made to wait a second time.
            Ok((None, prefix)) => {
                let silent = prefix.is_empty();
                (hello::Peek::NotTls, prefix, opaque || silent)
            }
            Err(_) => return None,
        };
        let name = match peek {
            hello::Peek::ClientHello { server_name } => server_name,
            _ => {
                let tap = self.tap.connection(peer, direction, side.plain_tls());
                let src = TcpMetrics::open(&self.metrics, Peer::src, labels, side.plain_tls());
                let client = Counted::new(
                    Prefixed::new(prefix, stream),
                    src.read.clone(),
                    src.write.clone(),
                );
                let serving = self
                    .detect(side, client, route, opaque, ClientIdHeader::Strip, tap)
                    .await;
                return Some((src, serving));
            }
        };
        if name.as_deref() != Some(mesh.name.as_str()) {
            let sni: Arc<str> = Arc::from(name.unwrap_or_default());
            let route = side.client_tls(
                route,
                ClientTls::Unauthenticated(TlsLabels::Passthru(sni.clone())),
            );
            let src = TcpMetrics::open(&self.metrics, Peer::src, labels, TlsLabels::Passthru(sni));
            let client = Counted::new(
                Prefixed::new(prefix, stream),
                src.read.clone(),
                src.write.clone(),
            );
            let serving: Serving<'_> =
                Box::pin(async move { side.forward_tcp(client, route).await });
            return Some((src, serving));
        }
        let Ok(slot) = mesh.handshakes.clone().try_acquire_owned() else {
            mesh.metrics.error(direction, "shed");
            return None;
        };
        mesh.metrics.handshakes_in_flight.inc();
        let acceptor = tokio_rustls::TlsAcceptor::from(mesh.server.clone());
        let accepted = tokio::time::timeout(
            mesh.handshake_timeout,
            acceptor.accept(Prefixed::new(prefix, stream)),
        )
        .await;
        mesh.metrics.handshakes_in_flight.dec();
        drop(slot);
        let mut tls = match accepted {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                mesh.metrics.error(direction, "handshake");
                tracing::debug!(error = %e, "inbound TLS handshake failed");
                return None;
            }
            Err(_) => {
                mesh.metrics.error(direction, "timeout");
                return None;
            }
        };
        let conn = tls.get_ref().1;
        let client_id = tls::peer_identity(conn.peer_certificates());
        let wants_header = conn.alpn_protocol() == Some(TRANSPORT_HEADER_ALPN);
        let (route, opaque, rest) = if wants_header {
            let Some((port, opaque, rest)) = transport_header(&mut tls, self.detect_timeout).await
            else {
                mesh.metrics.error(direction, "header");
                return None;
            };
            (side.reroute(route, port)?, opaque, rest)
        } else {
            (route, opaque, Bytes::new())
        };
        let route = side.client_tls(route, ClientTls::Mesh(client_id.clone()));
        let id: Arc<str> = Arc::from(client_id.as_ref().map_or("", |n| n.as_str()));
        let header = match &client_id {
            Some(n) => {
                HeaderValue::from_str(n.as_str()).map_or(ClientIdHeader::Strip, ClientIdHeader::Set)
            }
            None => ClientIdHeader::Strip,
        };
        let tap = self
            .tap
            .connection(peer, direction, TlsLabels::ClientId(id.clone()));
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels, TlsLabels::ClientId(id));
        let client = Counted::new(
            Prefixed::new(rest, tls),
            src.read.clone(),
            src.write.clone(),
        );
        let serving = self.detect(side, client, route, opaque, header, tap).await;
        Some((src, serving))
    }

    /// Serves a connection whose route is already known.
    pub async fn serve_routed<S: Side>(
        self: Arc<Self>,
        side: Arc<S>,
        stream: TcpStream,
        accepted: Accepted<S::Route>,
    ) {
        let (src, detected) = self.start(side, stream, accepted);
        // Boxed: detection's state is not kept for the connection's life.
        let ok = Box::pin(detected).await.await;
        src.close(ok);
    }

    /// Counts the connection open and returns its metrics with its
    /// detection, which hands back the serving, boxed: for the connection's
    /// life its task holds the metrics and a pointer.
    fn start<S: Side>(
        &self,
        side: Arc<S>,
        stream: TcpStream,
        accepted: Accepted<S::Route>,
    ) -> (TcpMetrics, impl Future<Output = Serving<'_>> + Send + '_) {
        let Accepted {
            route,
            labels,
            opaque,
        } = accepted;
        let tap = if self.tap.enabled() {
            let peer = stream.peer_addr().ok();
            self.tap
                .connection(peer, labels.direction, side.plain_tls())
        } else {
            None
        };
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels, side.plain_tls());
        let client = Counted::new(stream, src.read.clone(), src.write.clone());
        (
            src,
            self.detect(side, client, route, opaque, ClientIdHeader::Untouched, tap),
        )
    }

    /// Reads what the client speaks (unless its port is opaque) and
    /// returns how the connection is served.
    async fn detect<S: Side, I>(
        &self,
        side: Arc<S>,
        mut client: Counted<I>,
        route: S::Route,
        opaque: bool,
        client_id: ClientIdHeader,
        tap: Option<ConnTap>,
    ) -> Serving<'_>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if opaque {
            return Box::pin(async move { side.forward_tcp(client, route).await });
        }
        match read_prefix(&mut client, self.detect_timeout).await {
            Err(_) => Box::pin(std::future::ready(false)),
            Ok((protocol, prefix)) => {
                let io = Prefixed::new(prefix, client);
                match protocol {
                    Protocol::Http1 | Protocol::H2 => {
                        self.serve_http(side, io, route, protocol, client_id, tap)
                    }
                    Protocol::Opaque => Box::pin(async move { side.forward_tcp(io, route).await }),
                }
            }
        }
    }

    /// Binds the route and returns the connection's HTTP serving, boxed:
    /// the connection's task holds a pointer to it, not its state.
    fn serve_http<'a, S: Side, I>(
        &'a self,
        side: Arc<S>,
        io: Prefixed<I>,
        route: S::Route,
        protocol: Protocol,
        client_id: ClientIdHeader,
        tap: Option<ConnTap>,
    ) -> Serving<'a>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let http = Arc::new(side.bind_http(route));
        let memory = self.memory.clone();
        let metrics = self.metrics.clone();
        let handler = move |mut req: Request<Incoming>| {
            let (side, http) = (side.clone(), http.clone());
            // Two values for one host: whichever a hop downstream reads,
            // routing here must not differ from it (RFC 9112 section 3.2).
            let conflict = crate::http::conflicting_host(&req);
            let http1 = req.version() < http::Version::HTTP_2;
            let shed = memory.shed("request");
            match &client_id {
                ClientIdHeader::Untouched => {}
                ClientIdHeader::Strip => {
                    req.headers_mut().remove(L5D_CLIENT_ID);
                }
                ClientIdHeader::Set(id) => {
                    req.headers_mut().insert(L5D_CLIENT_ID, id.clone());
                }
            }
            // One atomic load while no tap is open.
            if let Some(t) = tap.as_ref().and_then(ConnTap::tapping) {
                req.extensions_mut().insert(t);
            }
            let metrics = metrics.clone();
            async move {
                if let Some(reason) = conflict {
                    metrics.error(S::DIRECTION, reason);
                    let mut rsp = error_response(StatusCode::BAD_REQUEST, reason);
                    if http1 {
                        rsp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    return rsp;
                }
                if shed {
                    return error_response(StatusCode::SERVICE_UNAVAILABLE, "memory_limit");
                }
                side.request(http, req).await
            }
        };
        server::serve(
            io,
            protocol,
            &self.limits,
            &self.metrics,
            self.shutdown.clone(),
            handler,
        )
    }
}
