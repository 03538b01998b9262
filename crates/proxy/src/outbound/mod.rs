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
    cache::{spawn_sweeper, sweep_period, CacheFull, IdleCache},
    config::{HttpLimits, OutboundConfig, TrafficConfig},
    connect::Dialer,
    discovery::{Discovery, Endpoint, EndpointSet, ProfileWatch, Resolution, SetState},
    http::{
        error_response, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig, ResponseBody,
    },
    metrics::{BalancerProtocol, Direction, DstLabels, Metrics},
    orig_dst::original_dst,
    own::OwnListeners,
    pipeline::{Accepted, Side},
    tcp::{self, TcpBalancer},
};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::{net::SocketAddr, sync::Arc};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

const DIRECTION: Direction = Direction::outbound;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum TargetKey {
    Authority(Arc<str>),
    Endpoint(SocketAddr),
}

/// Where a connection (or request) goes.
#[derive(Clone, Debug)]
pub enum Target {
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
        match self {
            Target::Logical(a) => {
                let mut labels = DstLabels::unknown(DIRECTION);
                labels.authority = a.clone();
                labels
            }
            Target::Endpoint(e) => e.dst_labels(DIRECTION, Arc::from(e.addr.to_string())),
        }
    }
}

/// A connection's route: one target, or per-request by authority.
pub enum Route {
    /// With the profile watch that named the target, kept in use while the
    /// connection lives.
    Target(Target, Option<Arc<ProfileWatch>>),
    ByAuthority,
}

/// How a connection's HTTP requests are routed.
pub enum HttpRoute {
    /// To one target's balancer, bound when the connection was found to
    /// speak HTTP (transparent mode, TCP routes).
    Bound {
        balancer: Arc<HttpBalancer>,
        _profile: Option<Arc<ProfileWatch>>,
    },
    /// Request by request, by `Host` / `:authority` (explicit mode).
    ByAuthority(std::sync::Mutex<Option<LastRoute>>),
    /// The target could not be had (`--max-targets`).
    Refused,
}

pub struct Outbound {
    config: OutboundConfig,
    traffic: TrafficConfig,
    discovery: Discovery,
    http_balancers: IdleCache<TargetKey, HttpBalancer>,
    tcp_balancers: IdleCache<TargetKey, TcpBalancer>,
    profiles: IdleCache<SocketAddr, ProfileWatch>,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
    forwarder: Forwarder,
    http_conns: MakeConns<EndpointConns>,
}

impl Outbound {
    pub fn new(
        config: OutboundConfig,
        traffic: TrafficConfig,
        discovery: Discovery,
        metrics: Arc<Metrics>,
        own: Arc<OwnListeners>,
        limits: &HttpLimits,
        mesh: Option<Arc<crate::identity::MeshTls>>,
    ) -> Arc<Self> {
        let idle = traffic.discovery_idle_timeout;
        let forwarder = Forwarder {
            pool: Arc::new(PoolConfig::new(&traffic, limits)),
            dialer: Dialer {
                timeout: traffic.connect_timeout,
                mesh,
                direction: DIRECTION,
            },
            metrics: metrics.clone(),
            direction: DIRECTION,
        };
        let this = Arc::new(Self {
            http_conns: EndpointConns::maker(&metrics),
            http_balancers: IdleCache::new(traffic.max_targets, idle),
            tcp_balancers: IdleCache::new(traffic.max_targets, idle),
            profiles: IdleCache::new(traffic.max_targets, idle),
            config,
            traffic,
            discovery,
            metrics,
            own,
            forwarder,
        });
        // Idle balancers and profiles (and so their streams to the
        // controller) are dropped, and idle endpoint connections closed.
        spawn_sweeper(Arc::downgrade(&this), sweep_period(idle), |o| {
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
        self.http_balancers.get_or_insert_with(&target.key(), || {
            let conns = self.http_conns.clone();
            self.make_balancer(target, BalancerProtocol::Http, conns)
        })
    }

    fn tcp_balancer(&self, target: &Target) -> Result<Arc<TcpBalancer>, CacheFull> {
        self.tcp_balancers.get_or_insert_with(&target.key(), || {
            self.make_balancer(target, BalancerProtocol::Tcp, Arc::new(|| ()))
        })
    }

    fn make_balancer<C: Send + Sync + 'static>(
        &self,
        target: &Target,
        protocol: BalancerProtocol,
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
            BalanceConfig::new(&self.traffic, protocol),
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

    /// The route of a connection accepted on a `--outbound-tcp` listener.
    pub fn tcp_route(authority: Arc<str>) -> Accepted<Route> {
        let target = Target::Logical(authority);
        Accepted {
            labels: target.labels(),
            route: Route::Target(target, None),
            opaque: true,
        }
    }

    fn too_many_targets(&self, e: &CacheFull) {
        self.metrics.error(DIRECTION, "too_many_targets");
        tracing::warn!(error = %e, "connection refused");
    }

    /// The target a request's authority names, or the answer refusing it.
    async fn target_of(
        &self,
        authority: Option<&str>,
    ) -> Result<(Target, Option<Arc<ProfileWatch>>), Response<ResponseBody>> {
        let Some(authority) = authority else {
            self.metrics.error(DIRECTION, "no_authority");
            return Err(error_response(StatusCode::BAD_REQUEST, "no_authority"));
        };
        match parse_host(authority, &self.config.cluster_domain) {
            HostTarget::Service(a) => Ok((Target::Logical(Arc::from(a)), None)),
            HostTarget::Addr(addr) if self.own.is_own(addr) => {
                self.metrics.error(DIRECTION, "loop");
                Err(error_response(StatusCode::BAD_GATEWAY, "loop"))
            }
            HostTarget::Addr(addr) => {
                let (target, _, watch) = self.route_for(addr).await;
                Ok((target, watch))
            }
            HostTarget::Other => {
                self.metrics.error(DIRECTION, "not_a_mesh_authority");
                Err(error_response(
                    StatusCode::BAD_REQUEST,
                    "not_a_mesh_authority",
                ))
            }
        }
    }

    /// The balancer this connection's last request went to, if `req` names
    /// the same authority.
    fn remembered(
        last: &std::sync::Mutex<Option<LastRoute>>,
        req: &Request<Incoming>,
    ) -> Option<(Arc<HttpBalancer>, Naming)> {
        let authority = authority_of(req)?;
        let last = last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|l| &*l.authority == authority)
            .map(|l| (l.balancer.clone(), l.naming))
    }

    /// Routes a request whose authority this connection has not just used.
    async fn by_authority(
        &self,
        last: &std::sync::Mutex<Option<LastRoute>>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let authority = authority_of(&req);
        let remember: Option<Box<str>> = authority.map(Box::from);
        let naming = match authority {
            Some(a) if is_short_name(a) => Naming::Short,
            _ => Naming::Exact,
        };
        // Boxed: resolving a new authority is the rare path of a request.
        let (target, _profile) = match Box::pin(self.target_of(authority)).await {
            Ok(t) => t,
            Err(refused) => return refused,
        };
        match self.http_balancer(&target) {
            Ok(b) => {
                if let Some(a) = remember {
                    *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(LastRoute {
                        authority: a,
                        balancer: b.clone(),
                        naming,
                    });
                }
                self.forwarder.forward(&b, req, naming).await
            }
            Err(e) => {
                self.too_many_targets(&e);
                error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets")
            }
        }
    }
}

impl Side for Outbound {
    type Route = Route;
    type Http = HttpRoute;

    async fn route(self: &Arc<Self>, stream: &TcpStream) -> Option<Accepted<Route>> {
        let Some(dst) = original_dst(stream) else {
            return Some(Accepted {
                route: Route::ByAuthority,
                labels: DstLabels::unknown(DIRECTION),
                opaque: false,
            });
        };
        if self.own.is_own(dst) {
            self.metrics.error(DIRECTION, "loop");
            tracing::debug!(%dst, "refused a connection to the proxy's own listener");
            return None;
        }
        let (target, opaque, watch) = self.route_for(dst).await;
        Some(Accepted {
            labels: target.labels(),
            route: Route::Target(target, watch),
            opaque,
        })
    }

    async fn forward_tcp<C>(self: &Arc<Self>, client: C, route: Route) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Route::Target(target, _profile) = route else {
            // Not HTTP, and no destination to send it to.
            self.metrics.error(DIRECTION, "no_route");
            return false;
        };
        match self.tcp_balancer(&target) {
            Ok(b) => tcp::forward(client, &b, &self.forwarder.dialer, &self.metrics).await,
            Err(e) => {
                self.too_many_targets(&e);
                false
            }
        }
    }

    fn plain_tls(&self) -> crate::metrics::TlsLabels {
        // The workload's own connections to its proxy (Linkerd's label).
        match self.forwarder.dialer.mesh {
            Some(_) => crate::metrics::TlsLabels::NoIdentity("loopback"),
            None => crate::metrics::TlsLabels::Disabled,
        }
    }

    fn bind_http(self: &Arc<Self>, route: Route) -> HttpRoute {
        match route {
            Route::ByAuthority => HttpRoute::ByAuthority(std::sync::Mutex::new(None)),
            Route::Target(target, profile) => match self.http_balancer(&target) {
                Ok(balancer) => HttpRoute::Bound {
                    balancer,
                    _profile: profile,
                },
                Err(e) => {
                    self.too_many_targets(&e);
                    HttpRoute::Refused
                }
            },
        }
    }

    async fn request(
        self: Arc<Self>,
        http: Arc<HttpRoute>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        match &*http {
            HttpRoute::Bound { balancer, .. } => {
                self.forwarder.forward(balancer, req, Naming::Exact).await
            }
            HttpRoute::ByAuthority(last) => match Self::remembered(last, &req) {
                Some((b, naming)) => self.forwarder.forward(&b, req, naming).await,
                // Boxed: the request future is moved whole, and is sized for
                // its largest state; a new authority is the rare one.
                None => Box::pin(self.by_authority(last, req)).await,
            },
            HttpRoute::Refused => {
                self.metrics.error(DIRECTION, "too_many_targets");
                error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets")
            }
        }
    }
}

/// The authority a request names: its `:authority` or `Host`.
fn authority_of(req: &Request<Incoming>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

/// The authority a connection's last request named, and where it went:
/// clients send the same one again and again.
pub struct LastRoute {
    authority: Box<str>,
    balancer: Arc<HttpBalancer>,
    naming: Naming,
}
