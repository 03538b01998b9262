//! One connection pipeline for both sides of the proxy: route the accepted
//! connection, count it, detect its protocol (unless its port is opaque),
//! then serve it per request (HTTP) or byte for byte (TCP), and count its
//! close. Each side supplies only its router ([`Side`]).

use crate::{
    config::HttpLimits,
    detect::Protocol,
    http::{error_response, server, ResponseBody},
    io::{read_prefix, Counted, Prefixed},
    memory::MemoryLimit,
    metrics::{DstLabels, Metrics, Peer, TcpMetrics},
};
use http::{Request, Response, StatusCode};
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
        let (src, detected) = self.start(side, stream, accepted);
        Some((src, detected.await))
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
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels);
        let client = Counted::new(stream, src.read.clone(), src.write.clone());
        (src, self.detect(side, client, route, opaque))
    }

    /// Reads what the client speaks (unless its port is opaque) and
    /// returns how the connection is served.
    async fn detect<S: Side>(
        &self,
        side: Arc<S>,
        mut client: Counted<TcpStream>,
        route: S::Route,
        opaque: bool,
    ) -> Serving<'_> {
        if opaque {
            return Box::pin(async move { side.forward_tcp(client, route).await });
        }
        match read_prefix(&mut client, self.detect_timeout).await {
            Err(_) => Box::pin(std::future::ready(false)),
            Ok((protocol, prefix)) => {
                let io = Prefixed::new(prefix, client);
                match protocol {
                    Protocol::Http1 | Protocol::H2 => self.serve_http(side, io, route, protocol),
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
    ) -> Serving<'a>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let http = Arc::new(side.bind_http(route));
        let memory = self.memory.clone();
        let handler = move |req| {
            let (side, http) = (side.clone(), http.clone());
            let shed = memory.shed("request");
            async move {
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
