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
//!
//! Where the controller serves `OutboundPolicies.Watch`, the target's
//! policy decides instead ([`policy`]): detection or not, and for each HTTP
//! request its route, filters, backend, timeouts and retries
//! ([`request`]), read from the newest policy at every request. Without an
//! answer in time (the profile timeout), or from a controller without the
//! API, a target is routed as above.

mod backend;
mod bound;
mod filters;
mod overrides;
mod policy;
mod request;

use crate::{
    authority::{is_short_name, parse_host, HostTarget},
    balance::metrics::BalancerProtocol,
    balance::{BalanceConfig, Balancer, MakeConns, TargetName},
    cache::{spawn_sweeper, sweep_period, CacheFull, IdleCache},
    config::{HttpLimits, OutboundConfig, TrafficConfig},
    connect::Dialer,
    discovery::{
        Discovery, Endpoint, EndpointSet, PolicyState, PolicyWatch, ProfileWatch, Resolution,
        SetState,
    },
    http::{
        error_response, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig, ResponseBody,
    },
    metrics::{Direction, DstLabels, Metrics},
    orig_dst::original_dst,
    own_listeners::OwnListeners,
    pipeline::{Accepted, Side},
    tcp::{self, TcpBalancer},
};
use arc_swap::ArcSwapOption;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use linkerd2_proxy_api::outbound::{traffic_spec, TrafficSpec};
use policy::ClientPolicy;
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

/// A target's policy watch.
type Policy = PolicyWatch<ClientPolicy>;

/// What a policy watch is keyed by: the target the controller is asked of.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum PolicyKey {
    Addr(SocketAddr),
    Authority(Arc<str>),
}

/// A connection's route: one target, or per-request by authority.
pub enum Route {
    /// With the profile watch that named the target, kept in use while the
    /// connection lives.
    Target(Target, Option<Arc<ProfileWatch>>),
    /// By the target's policy; `target` is where connections that are not
    /// HTTP go when the policy names no opaque backend.
    Policy {
        watch: Arc<Policy>,
        policy: Arc<ClientPolicy>,
        target: Target,
    },
    /// A `--outbound-tcp` listener's authority: its policy's opaque
    /// backends when it has a policy, else the authority's endpoints.
    TcpAuthority(Arc<str>),
    ByAuthority,
}

/// How a target is routed: by its policy, or as without one.
enum Routed {
    Policy(Arc<Policy>, Arc<ClientPolicy>),
    /// As without policy: the target, whether its port is opaque, and the
    /// profile watch that named it.
    Legacy {
        target: Target,
        opaque: bool,
        profile: Option<Arc<ProfileWatch>>,
    },
}

/// How a connection's HTTP requests are routed.
pub enum HttpRoute {
    /// To one target's balancer, bound when the connection was found to
    /// speak HTTP (transparent mode, TCP routes).
    Bound {
        balancer: Arc<HttpBalancer>,
        _profile: Option<Arc<ProfileWatch>>,
    },
    /// By the target's policy, the newest at each request (`last` when the
    /// watch has none now).
    Policy {
        watch: Arc<Policy>,
        last: Arc<ClientPolicy>,
    },
    /// Request by request, by `Host` / `:authority` (explicit mode); the
    /// last route read without a lock (HTTP/2 requests share it).
    ByAuthority(ArcSwapOption<LastRoute>),
    /// The target could not be had (`--max-targets`).
    Refused,
}

pub struct Outbound {
    /// Itself, for the tasks that keep a policy's backends resolved.
    me: std::sync::Weak<Outbound>,
    config: OutboundConfig,
    traffic: TrafficConfig,
    discovery: Discovery,
    http_balancers: IdleCache<TargetKey, HttpBalancer>,
    tcp_balancers: IdleCache<TargetKey, TcpBalancer>,
    profiles: IdleCache<SocketAddr, ProfileWatch>,
    policies: IdleCache<PolicyKey, Policy>,
    /// `TrafficSpec.source_workload`: this pod, as JSON.
    source_workload: String,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
    forwarder: Forwarder,
    http_conns: MakeConns<EndpointConns>,
}

/// What the outbound side is made of.
pub struct OutboundParts {
    pub config: OutboundConfig,
    pub traffic: TrafficConfig,
    pub discovery: Discovery,
    pub metrics: Arc<Metrics>,
    pub own: Arc<OwnListeners>,
    pub limits: HttpLimits,
    /// This proxy's identity, for mutual TLS to meshed endpoints.
    pub mesh: Option<Arc<crate::identity::MeshTls>>,
    /// This pod: the `source_workload` of policy requests.
    pub pod: crate::config::PodIdentity,
}

impl Outbound {
    pub fn new(parts: OutboundParts) -> Arc<Self> {
        let OutboundParts {
            config,
            traffic,
            discovery,
            metrics,
            own,
            limits,
            mesh,
            pod,
        } = parts;
        let idle = traffic.discovery_idle_timeout;
        let forwarder = Forwarder {
            pool: Arc::new(PoolConfig::new(&traffic, &limits)),
            dialer: Dialer {
                timeout: traffic.connect_timeout,
                mesh,
                direction: DIRECTION,
            },
            metrics: metrics.clone(),
            direction: DIRECTION,
        };
        let this = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            http_conns: EndpointConns::maker(&metrics),
            http_balancers: IdleCache::new(traffic.max_targets, idle),
            tcp_balancers: IdleCache::new(traffic.max_targets, idle),
            profiles: IdleCache::new(traffic.max_targets, idle),
            policies: IdleCache::new(traffic.max_targets, idle),
            source_workload: crate::discovery::workload_json(&pod.namespace, &pod.name),
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
            o.policies.sweep();
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

    /// The policy of `key`, waiting at most the profile timeout for the
    /// first answer; `None` routes as without policy.
    async fn policy_of(&self, key: PolicyKey) -> Option<(Arc<Policy>, Arc<ClientPolicy>)> {
        let watch = self
            .policies
            .get_or_insert_with(&key, || {
                let target = match &key {
                    PolicyKey::Addr(a) => traffic_spec::Target::Addr((*a).into()),
                    PolicyKey::Authority(a) => traffic_spec::Target::Authority(a.to_string()),
                };
                let spec = TrafficSpec {
                    source_workload: self.source_workload.clone(),
                    target: Some(target),
                };
                let watch = self.discovery.outbound_policy(spec, policy::from_wire);
                tokio::spawn(hold_backends(self.me.clone(), watch.changes()));
                watch
            })
            .ok()?;
        match watch.get(self.discovery.profile_timeout()).await {
            PolicyState::Known(p) => Some((watch, p)),
            PolicyState::Pending | PolicyState::Fallback => None,
        }
    }

    /// How a connection to `dst` is routed: by its policy, else by what
    /// `GetProfile` says it is.
    async fn routed(&self, dst: SocketAddr) -> Routed {
        if let Some((watch, p)) = Box::pin(self.policy_of(PolicyKey::Addr(dst))).await {
            return Routed::Policy(watch, p);
        }
        self.profile_route(dst).await
    }

    /// Where a policy's connections go when they are not HTTP and it names
    /// no opaque backend: its Service, else the address itself.
    fn policy_target(&self, p: &ClientPolicy, dst: SocketAddr) -> Target {
        match p.service_authority(&self.config.cluster_domain) {
            Some(a) => Target::Logical(a),
            None => Target::Endpoint(Endpoint::bare(dst)),
        }
    }

    /// What the controller's `GetProfile` says `dst` is. The route's
    /// profile watch keeps the profile in use while the connection holds it.
    async fn profile_route(&self, dst: SocketAddr) -> Routed {
        let bare = || Target::Endpoint(Endpoint::bare(dst));
        let Ok(watch) = self
            .profiles
            .get_or_insert_with(&dst, || self.discovery.profile(dst))
        else {
            return Routed::Legacy {
                target: bare(),
                opaque: false,
                profile: None,
            };
        };
        let Some(profile) = watch.get(self.discovery.profile_timeout()).await else {
            return Routed::Legacy {
                target: bare(),
                opaque: false,
                profile: Some(watch),
            };
        };
        let target = if let Some(service) = &profile.service {
            Target::Logical(Arc::from(format!("{service}:{}", dst.port())))
        } else if let Some(endpoint) = &profile.endpoint {
            Target::Endpoint(Endpoint {
                addr: dst,
                ..endpoint.clone()
            })
        } else {
            bare()
        };
        Routed::Legacy {
            target,
            opaque: profile.opaque,
            profile: Some(watch),
        }
    }

    /// The route of a connection accepted on a `--outbound-tcp` listener.
    pub fn tcp_route(authority: Arc<str>) -> Accepted<Route> {
        Accepted {
            labels: Target::Logical(authority.clone()).labels(),
            route: Route::TcpAuthority(authority),
            opaque: true,
        }
    }

    /// Where an opaque connection under `policy` goes: a backend of its
    /// opaque route, else `otherwise`.
    fn opaque_target(policy: &ClientPolicy, otherwise: Target) -> Target {
        match backend::choose(&policy.opaque_backends, &mut rand::rng()) {
            Some(b) => match &b.backend.target {
                policy::BackendTarget::Balancer(path) => Target::Logical(path.clone()),
                policy::BackendTarget::Forward(e) => Target::Endpoint(e.clone()),
            },
            None => otherwise,
        }
    }

    fn too_many_targets(&self, e: &CacheFull) {
        self.metrics.error(DIRECTION, "too_many_targets");
        tracing::warn!(error = %e, "connection refused");
    }

    /// How a request's authority is routed, or the answer refusing it.
    async fn target_of(&self, authority: Option<&str>) -> Result<Routed, Response<ResponseBody>> {
        let Some(authority) = authority else {
            self.metrics.error(DIRECTION, "no_authority");
            return Err(error_response(StatusCode::BAD_REQUEST, "no_authority"));
        };
        match parse_host(authority, &self.config.cluster_domain) {
            HostTarget::Service(a) => {
                let a: Arc<str> = Arc::from(a);
                match self.policy_of(PolicyKey::Authority(a.clone())).await {
                    Some((watch, p)) => Ok(Routed::Policy(watch, p)),
                    None => Ok(Routed::Legacy {
                        target: Target::Logical(a),
                        opaque: false,
                        profile: None,
                    }),
                }
            }
            HostTarget::Addr(addr) if self.own.is_own(addr) => {
                self.metrics.error(DIRECTION, "loop");
                Err(error_response(StatusCode::BAD_GATEWAY, "loop"))
            }
            HostTarget::Addr(addr) => Ok(self.routed(addr).await),
            HostTarget::Other => {
                self.metrics.error(DIRECTION, "not_a_mesh_authority");
                Err(error_response(
                    StatusCode::BAD_REQUEST,
                    "not_a_mesh_authority",
                ))
            }
        }
    }

    /// Where this connection's last request went, if `req` names the same
    /// authority.
    fn remembered(last: &ArcSwapOption<LastRoute>, req: &Request<Incoming>) -> Option<RouteTo> {
        let authority = authority_of(req)?;
        let last = last.load();
        last.as_ref()
            .filter(|l| &*l.authority == authority)
            .map(|l| l.to.clone())
    }

    /// Sends a request where its authority's route goes.
    async fn send_to(&self, to: RouteTo, req: Request<Incoming>) -> Response<ResponseBody> {
        match to {
            RouteTo::Balancer(b, naming) => self.forwarder.forward(&b, req, naming).await,
            RouteTo::Policy(watch, last) => {
                let policy = match watch.current() {
                    PolicyState::Known(p) => p,
                    PolicyState::Pending | PolicyState::Fallback => last,
                };
                Box::pin(request::serve(self, policy, req)).await
            }
        }
    }

    /// Routes a request whose authority this connection has not just used.
    async fn by_authority(
        &self,
        last: &ArcSwapOption<LastRoute>,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let authority = authority_of(&req);
        let remember: Option<Box<str>> = authority.map(Box::from);
        let naming = match authority {
            Some(a) if is_short_name(a) => Naming::Short,
            _ => Naming::Exact,
        };
        // Boxed: resolving a new authority is the rare path of a request.
        let routed = match Box::pin(self.target_of(authority)).await {
            Ok(t) => t,
            Err(refused) => return refused,
        };
        let to = match routed {
            Routed::Policy(watch, p) => RouteTo::Policy(watch, p),
            Routed::Legacy { target, .. } => match self.http_balancer(&target) {
                Ok(b) => RouteTo::Balancer(b, naming),
                Err(e) => {
                    self.too_many_targets(&e);
                    return error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets");
                }
            },
        };
        if let Some(a) = remember {
            last.store(Some(Arc::new(LastRoute {
                authority: a,
                to: to.clone(),
            })));
        }
        self.send_to(to, req).await
    }
}

impl Side for Outbound {
    type Route = Route;
    type Http = HttpRoute;
    const DIRECTION: Direction = DIRECTION;

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
        Some(match self.routed(dst).await {
            Routed::Legacy {
                target,
                opaque,
                profile: watch,
            } => Accepted {
                labels: target.labels(),
                route: Route::Target(target, watch),
                opaque,
            },
            Routed::Policy(watch, policy) => {
                let target = self.policy_target(&policy, dst);
                Accepted {
                    labels: target.labels(),
                    opaque: policy.opaque,
                    route: Route::Policy {
                        watch,
                        policy,
                        target,
                    },
                }
            }
        })
    }

    async fn forward_tcp<C>(self: &Arc<Self>, client: C, route: Route) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let target = match route {
            Route::Target(target, _profile) => target,
            Route::Policy {
                watch,
                policy,
                target,
            } => {
                let policy = match watch.current() {
                    PolicyState::Known(p) => p,
                    PolicyState::Pending | PolicyState::Fallback => policy,
                };
                Self::opaque_target(&policy, target)
            }
            Route::TcpAuthority(authority) => {
                let key = PolicyKey::Authority(authority.clone());
                match Box::pin(self.policy_of(key)).await {
                    Some((_watch, p)) => Self::opaque_target(&p, Target::Logical(authority)),
                    None => Target::Logical(authority),
                }
            }
            Route::ByAuthority => {
                // Not HTTP, and no destination to send it to.
                self.metrics.error(DIRECTION, "no_route");
                return false;
            }
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
            Route::ByAuthority => HttpRoute::ByAuthority(ArcSwapOption::empty()),
            Route::Policy { watch, policy, .. } => HttpRoute::Policy {
                watch,
                last: policy,
            },
            // Opaque: never detected as HTTP; bound as the authority if it were.
            Route::TcpAuthority(authority) => {
                self.bind_http(Route::Target(Target::Logical(authority), None))
            }
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
            HttpRoute::Policy { watch, last } => {
                self.send_to(RouteTo::Policy(watch.clone(), last.clone()), req)
                    .await
            }
            HttpRoute::ByAuthority(last) => match Self::remembered(last, &req) {
                Some(to) => self.send_to(to, req).await,
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
/// Keeps a balancer (so a resolution, and the last-known endpoints that
/// outlive it) for every backend of the newest version of a policy while
/// the policy is watched: a weighted split's backend first drawn while the
/// controller is away starts from its last-known endpoints instead of
/// failing. Ends when the watch goes.
async fn hold_backends(
    outbound: std::sync::Weak<Outbound>,
    mut changes: tokio::sync::watch::Receiver<PolicyState<ClientPolicy>>,
) {
    let mut _held: (Vec<Arc<HttpBalancer>>, Vec<Arc<TcpBalancer>>) = Default::default();
    loop {
        let state = changes.borrow_and_update().clone();
        if let PolicyState::Known(policy) = state {
            let Some(o) = outbound.upgrade() else { return };
            let targets = policy.balancer_paths().into_iter().map(Target::Logical);
            // Too many targets: the request that draws it says so.
            _held = if policy.opaque {
                (
                    Vec::new(),
                    targets.filter_map(|t| o.tcp_balancer(&t).ok()).collect(),
                )
            } else {
                (
                    targets.filter_map(|t| o.http_balancer(&t).ok()).collect(),
                    Vec::new(),
                )
            };
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

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
    to: RouteTo,
}

/// Where an authority's requests go: a balancer, or the target's policy.
#[derive(Clone)]
enum RouteTo {
    Balancer(Arc<HttpBalancer>, Naming),
    Policy(Arc<Policy>, Arc<ClientPolicy>),
}
