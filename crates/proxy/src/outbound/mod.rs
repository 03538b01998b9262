//! The outbound side: connections from the workload to the mesh.
//!
//! Each connection is routed once, by where it was going:
//! - redirected by iptables (transparent mode): its original destination,
//!   looked up with `GetProfile` — a service's cluster IP goes to the
//!   service's endpoints, a pod's IP to that pod, anything else to itself;
//! - sent to the listener directly (explicit mode): HTTP requests are
//!   routed one by one by their `Host` / `:authority`;
//! - on a `--outbound-tcp` listener: to that listener's authority, as TCP.
//!
//! Then the protocol is detected (unless the port is opaque) and the
//! connection is proxied per request (HTTP) or byte for byte (TCP).

use crate::{
    authority::{is_short_name, parse_host, HostTarget},
    balance::{BalanceConfig, Balancer, MakeConns, TargetName},
    cache::{spawn_sweeper, CacheFull, IdleCache},
    config::HttpLimits,
    config::OutboundConfig,
    detect::Protocol,
    discovery::{Discovery, Endpoint, EndpointSet, ProfileWatch, Resolution, SetState},
    http::{
        error_response, server, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig,
        ResponseBody,
    },
    io::{read_prefix, Counted, Prefixed},
    memory::MemoryLimit,
    metrics::{BalancerProtocol, Direction, DstLabels, Metrics, Peer, TcpMetrics},
    orig_dst::original_dst,
    own::OwnListeners,
    tcp::{self, TcpBalancer},
};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::{net::SocketAddr, sync::Arc};
use tokio::{net::TcpStream, sync::watch};

const DIRECTION: Direction = Direction::outbound;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum TargetKey {
    Authority(Arc<str>),
    Endpoint(SocketAddr),
}

/// Where a connection (or request) goes.
#[derive(Clone, Debug)]
enum Target {
    /// A service, by its canonical authority.
    Logical(Arc<str>),
    /// One address (a pod, or anything outside the mesh).
    Endpoint(Endpoint),
}

impl Target {
    fn key(&self) -> TargetKey {
        match self {
            Target::Logical(a) => TargetKey::Authority(a.clone()),
            Target::Endpoint(e) => TargetKey::Endpoint(e.addr),
        }
    }

    fn labels(&self) -> DstLabels {
        let mut labels = DstLabels::unknown(DIRECTION);
        match self {
            Target::Logical(a) => labels.authority = a.clone(),
            Target::Endpoint(e) => {
                labels.authority = Arc::from(e.addr.to_string());
                labels.dst_namespace = e.namespace.clone();
                labels.dst_service = e.service.clone();
                labels.dst_pod = e.pod.clone();
            }
        }
        labels
    }
}

/// A connection's route: one target, or per-request by authority.
#[derive(Clone, Debug)]
enum Route {
    Target(Target),
    ByAuthority,
}

pub struct Outbound {
    config: OutboundConfig,
    discovery: Discovery,
    http_balancers: IdleCache<TargetKey, HttpBalancer>,
    tcp_balancers: IdleCache<TargetKey, TcpBalancer>,
    profiles: IdleCache<SocketAddr, ProfileWatch>,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
    forwarder: Forwarder,
    limits: HttpLimits,
    memory: MemoryLimit,
    /// Turns true at shutdown: HTTP connections finish their requests and close.
    shutdown: watch::Receiver<bool>,
}

impl Outbound {
    pub fn new(
        config: OutboundConfig,
        discovery: Discovery,
        metrics: Arc<Metrics>,
        own: Arc<OwnListeners>,
        limits: HttpLimits,
        memory: MemoryLimit,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let idle = config.discovery_idle_timeout;
        let forwarder = Forwarder {
            pool: Arc::new(PoolConfig::new(&config, &limits)),
            metrics: metrics.clone(),
            direction: DIRECTION,
        };
        let this = Arc::new(Self {
            http_balancers: IdleCache::new(config.max_targets, idle),
            tcp_balancers: IdleCache::new(config.max_targets, idle),
            profiles: IdleCache::new(config.max_targets, idle),
            config,
            discovery,
            metrics,
            own,
            forwarder,
            limits,
            memory,
            shutdown,
        });
        // Idle balancers and profiles (and so their streams to the
        // controller) are dropped, and idle endpoint connections closed.
        spawn_sweeper(Arc::downgrade(&this), idle, |o| {
            o.http_balancers.sweep();
            o.tcp_balancers.sweep();
            o.profiles.sweep();
            for b in o.http_balancers.values() {
                for e in b.endpoints() {
                    e.conns.expire_h1(&o.forwarder.pool);
                }
            }
        });
        this
    }

    fn http_balancer(&self, target: &Target) -> Result<Arc<HttpBalancer>, CacheFull> {
        let metrics = self.metrics.clone();
        let conns: MakeConns<EndpointConns> = Arc::new(move || EndpointConns::new(metrics.clone()));
        self.http_balancers.get_or_insert_with(&target.key(), || {
            self.make_balancer(
                target,
                BalancerProtocol::Http,
                self.config.http_failfast_timeout,
                conns,
            )
        })
    }

    fn tcp_balancer(&self, target: &Target) -> Result<Arc<TcpBalancer>, CacheFull> {
        self.tcp_balancers.get_or_insert_with(&target.key(), || {
            self.make_balancer(
                target,
                BalancerProtocol::Tcp,
                self.config.tcp_failfast_timeout,
                Arc::new(|| ()),
            )
        })
    }

    fn make_balancer<C: Send + Sync + 'static>(
        &self,
        target: &Target,
        protocol: BalancerProtocol,
        failfast_timeout: std::time::Duration,
        conns: MakeConns<C>,
    ) -> Balancer<C> {
        let (authority, resolution) = match target {
            Target::Logical(a) => (a.clone(), self.discovery.resolve(a)),
            Target::Endpoint(e) => (
                Arc::from(e.addr.to_string()),
                Resolution::fixed(EndpointSet {
                    state: SetState::Known,
                    endpoints: vec![e.clone()],
                }),
            ),
        };
        Balancer::new(
            TargetName {
                authority,
                direction: DIRECTION,
                protocol,
            },
            resolution,
            BalanceConfig {
                failfast_timeout,
                queue_capacity: self.config.queue_capacity,
                connect_backoff: self.config.connect_backoff.clone(),
            },
            self.metrics.clone(),
            self.own.clone(),
            conns,
        )
    }

    /// What the controller says `dst` is. The returned watch keeps the
    /// profile in use while the caller holds it.
    async fn route_for(&self, dst: SocketAddr) -> (Target, bool, Option<Arc<ProfileWatch>>) {
        let bare = Target::Endpoint(Endpoint::bare(dst));
        let Ok(watch) = self
            .profiles
            .get_or_insert_with(&dst, || self.discovery.profile(dst))
        else {
            return (bare, false, None);
        };
        let Some(profile) = watch.get(self.discovery.profile_timeout()).await else {
            return (bare, false, Some(watch));
        };
        let target = if let Some(service) = &profile.service {
            Target::Logical(Arc::from(format!("{service}:{}", dst.port())))
        } else if let Some(endpoint) = &profile.endpoint {
            Target::Endpoint(Endpoint {
                addr: dst,
                ..endpoint.clone()
            })
        } else {
            bare
        };
        (target, profile.opaque, Some(watch))
    }

    /// Serves one connection accepted on the outbound listener.
    pub async fn serve(self: Arc<Self>, stream: TcpStream) {
        let (route, opaque, _profile) = match original_dst(&stream) {
            None => (Route::ByAuthority, false, None),
            Some(dst) if self.own.is_own(dst) => {
                self.metrics.error(DIRECTION, "loop");
                tracing::debug!(%dst, "refused a connection to the proxy's own listener");
                return;
            }
            Some(dst) => {
                let (target, opaque, watch) = Box::pin(self.route_for(dst)).await;
                (Route::Target(target), opaque, watch)
            }
        };
        self.serve_route(stream, route, opaque).await;
    }

    /// Serves one connection accepted on a `--outbound-tcp` listener.
    pub async fn serve_tcp_route(self: Arc<Self>, stream: TcpStream, authority: Arc<str>) {
        self.serve_route(stream, Route::Target(Target::Logical(authority)), true)
            .await;
    }

    // The rarely long-lived paths (routing lookups, TCP forwarding) are
    // boxed where they are awaited: a connection's task is sized for its
    // largest state for its whole life, and most connections are idle HTTP.
    async fn serve_route(self: Arc<Self>, stream: TcpStream, route: Route, opaque: bool) {
        let labels = match &route {
            Route::Target(t) => t.labels(),
            Route::ByAuthority => DstLabels::unknown(DIRECTION),
        };
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels);
        let mut client = Counted::new(stream, src.read.clone(), src.write.clone());
        let ok = if opaque {
            Box::pin(self.forward_tcp(client, &route)).await
        } else {
            match read_prefix(&mut client, self.config.detect_timeout).await {
                Err(_) => false,
                Ok((protocol, prefix)) => {
                    let io = Prefixed::new(prefix, client);
                    match protocol {
                        Protocol::Http1 | Protocol::H2 => {
                            self.clone().serve_http(io, route, protocol).await
                        }
                        Protocol::Opaque => Box::pin(self.forward_tcp(io, &route)).await,
                    }
                }
            }
        };
        src.close(ok);
    }

    async fn forward_tcp<C>(&self, client: C, route: &Route) -> bool
    where
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let Route::Target(target) = route else {
            // Not HTTP, and no destination to send it to.
            self.metrics.error(DIRECTION, "no_route");
            return false;
        };
        match self.tcp_balancer(target) {
            Ok(b) => tcp::forward(client, &b, self.config.connect_timeout, &self.metrics).await,
            Err(e) => {
                self.metrics.error(DIRECTION, "too_many_targets");
                tracing::warn!(error = %e, "connection refused");
                false
            }
        }
    }

    async fn serve_http<I>(self: Arc<Self>, io: I, route: Route, protocol: Protocol) -> bool
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let shutdown = self.shutdown.clone();
        let metrics = self.metrics.clone();
        let limits = self.limits;
        let router = Arc::new(Router {
            outbound: self,
            route,
            last: std::sync::Mutex::new(None),
        });
        server::serve(io, protocol, &limits, &metrics, shutdown, move |req| {
            let router = router.clone();
            async move { router.route(req).await }
        })
        .await
    }
}

/// The authority a connection's last request named, and where it went.
struct LastRoute {
    authority: Box<str>,
    balancer: Arc<HttpBalancer>,
    naming: Naming,
}

struct Router {
    outbound: Arc<Outbound>,
    route: Route,
    /// The authority this connection's last request named, and its
    /// balancer: clients send the same one again and again.
    last: std::sync::Mutex<Option<LastRoute>>,
}

impl Router {
    fn remembered(&self, authority: &str) -> Option<(Arc<HttpBalancer>, Naming)> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|l| &*l.authority == authority)
            .map(|l| (l.balancer.clone(), l.naming))
    }

    async fn route(&self, req: Request<Incoming>) -> Response<ResponseBody> {
        let o = &self.outbound;
        if o.memory.shed("request") {
            return error_response(StatusCode::SERVICE_UNAVAILABLE, "memory_limit");
        }
        let authority = match &self.route {
            Route::ByAuthority => req.uri().authority().map(|a| a.as_str()).or_else(|| {
                req.headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
            }),
            Route::Target(_) => None,
        };
        if let Some((b, naming)) = authority.and_then(|a| self.remembered(a)) {
            return o.forwarder.forward(&b, req, naming).await;
        }
        let remember: Option<Box<str>> = authority.map(Box::from);
        let naming = match authority {
            Some(a) if is_short_name(a) => Naming::Short,
            _ => Naming::Exact,
        };
        let (target, _profile) = match &self.route {
            Route::Target(t) => (t.clone(), None),
            Route::ByAuthority => {
                let authority = req.uri().authority().map(|a| a.as_str()).or_else(|| {
                    req.headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                });
                let Some(authority) = authority else {
                    o.metrics.error(DIRECTION, "no_authority");
                    return error_response(StatusCode::BAD_REQUEST, "no_authority");
                };
                match parse_host(authority, &o.config.cluster_domain) {
                    HostTarget::Service(a) => (Target::Logical(Arc::from(a)), None),
                    HostTarget::Addr(addr) if o.own.is_own(addr) => {
                        o.metrics.error(DIRECTION, "loop");
                        return error_response(StatusCode::BAD_GATEWAY, "loop");
                    }
                    HostTarget::Addr(addr) => {
                        let (target, _, watch) = o.route_for(addr).await;
                        (target, watch)
                    }
                    HostTarget::Other => {
                        o.metrics.error(DIRECTION, "not_a_mesh_authority");
                        return error_response(StatusCode::BAD_REQUEST, "not_a_mesh_authority");
                    }
                }
            }
        };
        match o.http_balancer(&target) {
            Ok(b) => {
                if let Some(a) = remember {
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(LastRoute {
                        authority: a,
                        balancer: b.clone(),
                        naming,
                    });
                }
                o.forwarder.forward(&b, req, naming).await
            }
            Err(_) => {
                o.metrics.error(DIRECTION, "too_many_targets");
                error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets")
            }
        }
    }
}
