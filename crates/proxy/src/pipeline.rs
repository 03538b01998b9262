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
use std::{future::Future, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
};

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
        // Routing is boxed: a connection's task is sized for its largest
        // state for its whole life, and most connections are idle HTTP.
        let Some(accepted) = Box::pin(side.route(&stream)).await else {
            return;
        };
        self.serve_routed(side, stream, accepted).await;
    }

    /// Serves a connection whose route is already known.
    pub async fn serve_routed<S: Side>(
        self: Arc<Self>,
        side: Arc<S>,
        stream: TcpStream,
        accepted: Accepted<S::Route>,
    ) {
        let Accepted {
            route,
            labels,
            opaque,
        } = accepted;
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels);
        let mut client = Counted::new(stream, src.read.clone(), src.write.clone());
        let ok = if opaque {
            Box::pin(side.forward_tcp(client, route)).await
        } else {
            match read_prefix(&mut client, self.detect_timeout).await {
                Err(_) => false,
                Ok((protocol, prefix)) => {
                    let io = Prefixed::new(prefix, client);
                    match protocol {
                        Protocol::Http1 | Protocol::H2 => {
                            self.serve_http(side, io, route, protocol).await
                        }
                        Protocol::Opaque => Box::pin(side.forward_tcp(io, route)).await,
                    }
                }
            }
        };
        src.close(ok);
    }

    async fn serve_http<S: Side, I>(
        &self,
        side: Arc<S>,
        io: I,
        route: S::Route,
        protocol: Protocol,
    ) -> bool
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
        .await
    }
}
