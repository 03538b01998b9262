//! The inbound side: connections redirected to the workload arrive here and
//! go on to the workload at their original port on 127.0.0.1.
//!
//! The protocol is detected as on the outbound side (unless the port is
//! opaque): HTTP is proxied per request, anything else forwarded byte for
//! byte. A connection that was not redirected goes to `--inbound-forward-port`
//! when set (runs without iptables), else it is refused.
//!
//! Metrics carry `direction="inbound"`, the original destination as
//! `authority`, and this pod (`PodIdentity`) in the `dst_*` labels. Without
//! mTLS the source has no identity, so no identity
//! labels are set.
//!
//! Authorization (Linkerd's `InboundServerPolicies`): each port's policy
//! ([`store`]) decides whether its connections are detected or opaque, and
//! who may connect ([`authorize`]). A connection that is not HTTP is
//! checked when detection gives up on HTTP (opaque ports: at once), closed
//! when denied, and closed later if a policy change denies it; each HTTP
//! request is checked against the route it matches: 403 when denied (gRPC:
//! `PERMISSION_DENIED`), 404 when no route matches.

mod authorize;
mod policy;
mod route;
mod store;

use crate::{
    balance::metrics::BalancerProtocol,
    balance::{BalanceConfig, Balancer, MakeConns, TargetName},
    cache::{spawn_sweeper, sweep_period, IdleCache},
    config::{HttpLimits, InboundConfig, OwnerKind, PodIdentity, TrafficConfig},
    connect::Dialer,
    discovery::{workload_json, Discovery, Endpoint, EndpointSet, Resolution, SetState},
    http::{
        error_response, orig_proto, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig,
        ResponseBody,
    },
    metrics::{
        authz::{AuthzLabels, PolicyMeta},
        empty_label, Direction, DstWorkload, Metrics, TlsLabels, WorkloadLabels,
    },
    orig_dst::original_dst,
    own_listeners::OwnListeners,
    pipeline::{Accepted, ClientTls, Side},
    tcp::{self, TcpBalancer},
};
use authorize::{authorize_http, authorize_tcp, Client, HttpDecision};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use policy::{Authorization, ServerPolicy};
use prometheus_client::metrics::counter::Counter;
use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
};
use store::{PortPolicies, PortPoliciesConfig, PortPolicy};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

const DIRECTION: Direction = Direction::inbound;

pub struct Inbound {
    config: InboundConfig,
    traffic: TrafficConfig,
    /// One balancer per workload port and original destination, over the
    /// one endpoint 127.0.0.1:PORT: it brings connect backoff, failfast and
    /// the HTTP connection pool.
    http_balancers: IdleCache<(SocketAddr, SocketAddr), HttpBalancer>,
    tcp_balancers: IdleCache<(SocketAddr, SocketAddr), TcpBalancer>,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
    forwarder: Forwarder,
    http_conns: MakeConns<EndpointConns>,
    /// This pod as an endpoint (its address aside): what inbound series
    /// name as their destination.
    this_pod: Endpoint,
    mesh: Option<Arc<crate::identity::MeshTls>>,
    policies: PortPolicies,
}

/// Where an inbound connection goes: the workload port, and the original
/// destination that names it in metrics; who the client is, and the
/// policy of the port.
pub struct Route {
    target: SocketAddr,
    orig: SocketAddr,
    /// Addressed to the proxy itself (not redirected): only a meshed
    /// client's transport header can say where it goes.
    direct: bool,
    client: Client,
    /// The client's `tls` labels.
    tls: TlsLabels,
    /// `None` until the port is known (a direct connection's header).
    policy: Option<Arc<PortPolicy>>,
}

/// Everything the inbound side is built from.
pub struct InboundParts {
    pub config: InboundConfig,
    pub traffic: TrafficConfig,
    pub limits: HttpLimits,
    pub metrics: Arc<Metrics>,
    pub own: Arc<OwnListeners>,
    /// This proxy's identity, to terminate mesh TLS; `None` when disabled.
    pub mesh: Option<Arc<crate::identity::MeshTls>>,
    /// The controller, for each port's policy (`WatchPort`).
    pub discovery: Discovery,
}

impl Inbound {
    pub fn new(p: InboundParts) -> Arc<Self> {
        let forwarder = Forwarder {
            pool: Arc::new(PoolConfig::new(&p.traffic, &p.limits)),
            dialer: Dialer::plain(p.traffic.connect_timeout, DIRECTION),
            metrics: p.metrics.clone(),
            direction: DIRECTION,
        };
        let idle = p.traffic.discovery_idle_timeout;
        let pod = &p.config.pod;
        let label = |v: &str| Arc::<str>::from(v);
        let this_pod = Endpoint {
            namespace: label(&pod.namespace),
            pod: label(&pod.name),
            workload: workload_of(pod),
            ..Endpoint::bare(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0))
        };
        let policies = PortPolicies::new(PortPoliciesConfig {
            workload: Arc::from(workload_json(&pod.namespace, &pod.name)),
            wait: p.discovery.profile_timeout(),
            discovery: p.discovery,
            default: p.config.default_policy,
            cluster_networks: p.config.cluster_networks.clone(),
            opaque_ports: p.config.opaque_ports.clone(),
            max_ports: p.traffic.max_targets,
            idle,
            metrics: p.metrics.clone(),
        });
        let this = Arc::new(Self {
            http_conns: EndpointConns::maker(&p.metrics),
            this_pod,
            http_balancers: IdleCache::new(p.traffic.max_targets, idle),
            tcp_balancers: IdleCache::new(p.traffic.max_targets, idle),
            config: p.config,
            traffic: p.traffic,
            metrics: p.metrics,
            own: p.own,
            forwarder,
            mesh: p.mesh,
            policies,
        });
        // Balancers of workload ports no longer in use are dropped, and idle
        // connections to the workload closed.
        spawn_sweeper(Arc::downgrade(&this), sweep_period(idle), |i| {
            i.http_balancers.sweep();
            i.tcp_balancers.sweep();
            i.policies.sweep();
            for b in i.http_balancers.values() {
                for e in b.endpoints() {
                    e.conns.expire_h1(&i.forwarder.pool);
                }
            }
        });
        this
    }

    fn make_balancer<C: Send + Sync + 'static>(
        &self,
        target: SocketAddr,
        orig: SocketAddr,
        protocol: BalancerProtocol,
        conns: MakeConns<C>,
    ) -> Balancer<C> {
        Balancer::new(
            TargetName {
                authority: Arc::from(orig.to_string()),
                direction: DIRECTION,
                protocol,
            },
            Resolution::fixed(EndpointSet {
                state: SetState::Known,
                endpoints: vec![Endpoint {
                    addr: target,
                    ..self.this_pod.clone()
                }],
            }),
            BalanceConfig::new(&self.traffic, protocol),
            self.metrics.clone(),
            self.own.clone(),
            conns,
        )
    }

    fn refused<T>(&self, made: Result<T, crate::cache::CacheFull>) -> Option<T> {
        match made {
            Ok(b) => Some(b),
            Err(e) => {
                self.metrics.error(DIRECTION, "too_many_targets");
                tracing::warn!(error = %e, "inbound connection refused");
                None
            }
        }
    }

    fn http_balancer(&self, target: SocketAddr, orig: SocketAddr) -> Option<Arc<HttpBalancer>> {
        self.refused(self.http_balancers.get_or_insert_with(&(target, orig), || {
            let conns = self.http_conns.clone();
            self.make_balancer(target, orig, BalancerProtocol::Http, conns)
        }))
    }

    fn tcp_balancer(&self, target: SocketAddr, orig: SocketAddr) -> Option<Arc<TcpBalancer>> {
        self.refused(self.tcp_balancers.get_or_insert_with(&(target, orig), || {
            self.make_balancer(target, orig, BalancerProtocol::Tcp, Arc::new(|| ()))
        }))
    }

    /// A new connection's route, its client plaintext until the pipeline
    /// says otherwise.
    fn new_route(
        &self,
        stream: &TcpStream,
        target: SocketAddr,
        orig: SocketAddr,
        direct: bool,
    ) -> Route {
        let ip = stream
            .peer_addr()
            .map_or(Ipv4Addr::UNSPECIFIED.into(), |a| a.ip().to_canonical());
        let tls = self.plain_tls();
        Route {
            target,
            orig,
            direct,
            client: Client {
                ip,
                tls: ClientTls::Unauthenticated(tls.clone()),
            },
            tls,
            policy: (!direct).then(|| self.policies.get(orig.port())),
        }
    }

    /// The authorization labels of a connection's series.
    fn labels(
        route: &Route,
        server: &ServerPolicy,
        http_route: Option<&Arc<PolicyMeta>>,
        authz: Option<&Authorization>,
    ) -> AuthzLabels {
        AuthzLabels {
            target_addr: Arc::from(route.orig.to_string()),
            server: server.meta.clone(),
            port: route.orig.port(),
            route: http_route.cloned(),
            authz: authz.map(|a| a.meta.clone()),
            tls: route.tls.clone(),
        }
    }

    /// Whether a connection that is not HTTP may go on, counted.
    fn admit_tcp(&self, route: &Route, policy: &ServerPolicy) -> bool {
        let m = &self.metrics.authz;
        match authorize_tcp(policy, &route.client) {
            Some(authz) => {
                if authz.meta.is_audit() {
                    tracing::debug!(client = %route.client.ip, port = route.orig.port(), "connection allowed by audit");
                }
                m.tcp_allow
                    .get(&Self::labels(route, policy, None, Some(authz)))
                    .inc();
                true
            }
            None => {
                tracing::debug!(client = %route.client.ip, port = route.orig.port(), server = %policy.meta.name, "connection denied");
                m.tcp_deny
                    .get(&Self::labels(route, policy, None, None))
                    .inc();
                self.metrics.error(DIRECTION, "unauthorized");
                false
            }
        }
    }
}

/// What serves a connection's HTTP requests: the workload port's balancer
/// (`None` past `--max-targets`) and the connection's authorization.
pub struct InboundHttp {
    balancer: Option<Arc<HttpBalancer>>,
    authz: Option<ConnAuthz>,
}

/// A connection's client and port policy, for its requests.
struct ConnAuthz {
    route: Route,
    policy: Arc<PortPolicy>,
    /// The allow series of the route and authorization the last allowed
    /// request used: most connections use one.
    last_allow: Mutex<Option<LastAllow>>,
}

struct LastAllow {
    server: Arc<PolicyMeta>,
    route: Arc<PolicyMeta>,
    authz: Arc<PolicyMeta>,
    counter: Arc<Counter>,
}

impl ConnAuthz {
    fn count_allow(
        &self,
        metrics: &Metrics,
        server: &ServerPolicy,
        route: &Arc<PolicyMeta>,
        authz: &Authorization,
    ) {
        let mut last = self.last_allow.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = &*last {
            if Arc::ptr_eq(&l.server, &server.meta)
                && Arc::ptr_eq(&l.route, route)
                && Arc::ptr_eq(&l.authz, &authz.meta)
            {
                l.counter.inc();
                return;
            }
        }
        let counter = metrics.authz.http_allow.get(&Inbound::labels(
            &self.route,
            server,
            Some(route),
            Some(authz),
        ));
        counter.inc();
        *last = Some(LastAllow {
            server: server.meta.clone(),
            route: route.clone(),
            authz: authz.meta.clone(),
            counter,
        });
    }
}

/// A proxy-made answer to a request the policy refused: gRPC requests get
/// their status in headers (trailers-only), others an HTTP status; both
/// carry `l5d-proxy-error`.
fn refusal<B>(
    req: &Request<B>,
    status: StatusCode,
    grpc: u16,
    reason: &str,
) -> Response<ResponseBody> {
    let is_grpc = req.version() == http::Version::HTTP_2
        && req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
    if !is_grpc {
        return error_response(status, reason);
    }
    let mut rsp = Response::new(ResponseBody::full(bytes::Bytes::new()));
    let h = rsp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(grpc));
    if let Ok(v) = HeaderValue::from_str(reason) {
        h.insert("grpc-message", v.clone());
        h.insert(crate::http::PROXY_ERROR_HEADER, v);
    }
    rsp
}

/// gRPC's PERMISSION_DENIED and NOT_FOUND.
const GRPC_PERMISSION_DENIED: u16 = 7;
const GRPC_NOT_FOUND: u16 = 5;

impl Side for Inbound {
    type Route = Route;
    type Http = InboundHttp;
    const DIRECTION: Direction = DIRECTION;

    async fn route(self: &Arc<Self>, stream: &TcpStream) -> Option<Accepted<Route>> {
        let orig = match (original_dst(stream), self.config.forward_port) {
            (Some(orig), _) => orig,
            (None, Some(port)) => {
                let local = stream
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
                SocketAddr::new(local.ip(), port)
            }
            (None, None) if self.mesh.is_some() => {
                // Addressed to the proxy: a meshed client's opaque transport.
                let local = stream.local_addr().ok()?;
                let labels = self
                    .this_pod
                    .dst_labels(DIRECTION, Arc::from(local.to_string()));
                return Some(Accepted {
                    route: self.new_route(stream, local, local, true),
                    labels,
                    opaque: true,
                });
            }
            (None, None) => {
                // Not redirected: there is no workload port to go to.
                self.metrics.error(DIRECTION, "no_original_dst");
                return None;
            }
        };
        let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), orig.port());
        if self.own.is_own(target) {
            self.metrics.error(DIRECTION, "loop");
            tracing::debug!(%orig, "refused an inbound connection to the proxy's own listener");
            return None;
        }
        let labels = self
            .this_pod
            .dst_labels(DIRECTION, Arc::from(orig.to_string()));
        let route = self.new_route(stream, target, orig, false);
        // The port's policy says whether to detect (waiting, for a port's
        // first connection, a bounded time for the controller).
        let opaque = match &route.policy {
            Some(p) => p.current().await.protocol.is_opaque(),
            None => self.config.opaque_ports.contains(&orig.port()),
        };
        Some(Accepted {
            route,
            labels,
            opaque,
        })
    }

    async fn forward_tcp<C>(self: &Arc<Self>, client: C, route: Route) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(port) = route.policy.clone().filter(|_| !route.direct) else {
            self.metrics.error(DIRECTION, "no_original_dst");
            return false;
        };
        let mut follow = port.follow();
        let policy = follow.current().await;
        if !self.admit_tcp(&route, &policy) {
            return false;
        }
        let Some(b) = self.tcp_balancer(route.target, route.orig) else {
            return false;
        };
        let forward = tcp::forward(client, &b, &self.forwarder.dialer, &self.metrics);
        // A policy change that no longer admits the client ends the
        // connection (Linkerd's terminate).
        let revoked = async {
            loop {
                let policy = follow.changed().await;
                if authorize_tcp(&policy, &route.client).is_none() {
                    return policy;
                }
            }
        };
        tokio::select! {
            ok = forward => ok,
            policy = revoked => {
                tracing::debug!(client = %route.client.ip, port = route.orig.port(), "connection closed: the policy no longer admits it");
                self.metrics
                    .authz
                    .tcp_terminate
                    .get(&Self::labels(&route, &policy, None, None))
                    .inc();
                false
            }
        }
    }

    fn bind_http(self: &Arc<Self>, route: Route) -> Self::Http {
        if route.direct {
            self.metrics.error(DIRECTION, "no_original_dst");
            return InboundHttp {
                balancer: None,
                authz: None,
            };
        }
        let balancer = self.http_balancer(route.target, route.orig);
        let authz = route.policy.clone().map(|policy| ConnAuthz {
            route,
            policy,
            last_allow: Mutex::new(None),
        });
        InboundHttp { balancer, authz }
    }

    fn mesh(&self) -> Option<&Arc<crate::identity::MeshTls>> {
        self.mesh.as_ref()
    }

    fn plain_tls(&self) -> TlsLabels {
        match self.mesh {
            Some(_) => TlsLabels::NoIdentity("no_tls_from_remote"),
            None => TlsLabels::Disabled,
        }
    }

    fn reroute(&self, route: Route, port: u16) -> Option<Route> {
        // The header's port is never 0: decoding refuses it.
        let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        if self.own.is_own(target) {
            self.metrics.error(DIRECTION, "loop");
            return None;
        }
        Some(Route {
            target,
            orig: SocketAddr::new(route.orig.ip(), port),
            direct: false,
            policy: Some(self.policies.get(port)),
            ..route
        })
    }

    fn client_tls(&self, route: Route, tls: ClientTls) -> Route {
        let labels = match &tls {
            ClientTls::Unauthenticated(labels) => labels.clone(),
            ClientTls::Mesh(id) => {
                TlsLabels::ClientId(Arc::from(id.as_ref().map_or("", |n| n.as_str())))
            }
        };
        Route {
            client: Client {
                ip: route.client.ip,
                tls,
            },
            tls: labels,
            ..route
        }
    }

    async fn request(
        self: Arc<Self>,
        http: Arc<Self::Http>,
        mut req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let downgraded = orig_proto::downgrade(&mut req);
        let refused = match &http.authz {
            Some(conn) => self.authorize_request(conn, &req).await,
            None => None,
        };
        let mut rsp = match (refused, &http.balancer) {
            (Some(rsp), _) => rsp,
            (None, Some(b)) => self.forwarder.forward(b, req, Naming::Exact).await,
            (None, None) => error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets"),
        };
        if let Some(orig) = downgraded {
            orig_proto::mark(&mut rsp, orig);
        }
        rsp
    }
}

impl Inbound {
    /// Checks one request against its port's policy now; the refusal to
    /// send, if it is refused.
    async fn authorize_request<B>(
        &self,
        conn: &ConnAuthz,
        req: &Request<B>,
    ) -> Option<Response<ResponseBody>> {
        let policy = conn.policy.current().await;
        let m = &self.metrics.authz;
        match authorize_http(&policy, req, &conn.route.client) {
            HttpDecision::Allow { route, authz } => {
                if authz.meta.is_audit() {
                    tracing::debug!(client = %conn.route.client.ip, path = req.uri().path(), "request allowed by audit");
                }
                conn.count_allow(&self.metrics, &policy, &route.meta, authz);
                None
            }
            HttpDecision::Deny { route } => {
                tracing::debug!(client = %conn.route.client.ip, route = %route.meta.name, server = %policy.meta.name, "request denied");
                m.http_deny
                    .get(&Self::labels(&conn.route, &policy, Some(&route.meta), None))
                    .inc();
                self.metrics.error(DIRECTION, "unauthorized");
                Some(refusal(
                    req,
                    StatusCode::FORBIDDEN,
                    GRPC_PERMISSION_DENIED,
                    "unauthorized",
                ))
            }
            HttpDecision::NotFound => {
                m.http_route_not_found
                    .get(&Self::labels(&conn.route, &policy, None, None))
                    .inc();
                self.metrics.error(DIRECTION, "route_not_found");
                Some(refusal(
                    req,
                    StatusCode::NOT_FOUND,
                    GRPC_NOT_FOUND,
                    "route_not_found",
                ))
            }
        }
    }
}

/// The workload labels of this pod.
fn workload_of(pod: &PodIdentity) -> DstWorkload {
    let label = |v: &str| {
        if v.is_empty() {
            empty_label()
        } else {
            Arc::from(v)
        }
    };
    let owner = |kind| match &pod.owner {
        Some((k, name)) if *k == kind => label(name),
        _ => empty_label(),
    };
    DstWorkload(Arc::new(WorkloadLabels {
        dst_deployment: owner(OwnerKind::Deployment),
        dst_statefulset: owner(OwnerKind::StatefulSet),
        dst_daemonset: owner(OwnerKind::DaemonSet),
        dst_replicaset: owner(OwnerKind::ReplicaSet),
        dst_k8s_job: owner(OwnerKind::Job),
        dst_serviceaccount: label(&pod.service_account),
        dst_pod_template_hash: label(&pod.pod_template_hash),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_own_identity_becomes_its_workload_labels() {
        let pod = PodIdentity {
            namespace: "shop".into(),
            name: "db-0".into(),
            service_account: "db".into(),
            owner: Some((OwnerKind::StatefulSet, "db".into())),
            pod_template_hash: String::new(),
        };
        let w = workload_of(&pod);
        assert_eq!(&*w.0.dst_statefulset, "db");
        assert_eq!(&*w.0.dst_deployment, "");
        assert_eq!(&*w.0.dst_serviceaccount, "db");
        assert_eq!(w, workload_of(&pod), "labels compare by value");
        assert_eq!(workload_of(&PodIdentity::default()), DstWorkload::none());
    }

    #[test]
    fn refusals_are_403_or_permission_denied_for_grpc_with_l5d_proxy_error() {
        let plain = Request::get("/").body(()).unwrap();
        let rsp = refusal(
            &plain,
            StatusCode::FORBIDDEN,
            GRPC_PERMISSION_DENIED,
            "unauthorized",
        );
        assert_eq!(rsp.status(), StatusCode::FORBIDDEN);
        assert_eq!(rsp.headers()["l5d-proxy-error"], "unauthorized");
        assert!(rsp.headers().get("grpc-status").is_none());

        let grpc = Request::post("/shop.Cart/Add")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap();
        let rsp = refusal(
            &grpc,
            StatusCode::FORBIDDEN,
            GRPC_PERMISSION_DENIED,
            "unauthorized",
        );
        assert_eq!(rsp.status(), StatusCode::OK);
        assert_eq!(rsp.headers()["grpc-status"], "7");
        assert_eq!(rsp.headers()["l5d-proxy-error"], "unauthorized");
        assert_eq!(rsp.headers()["content-type"], "application/grpc");
    }
}
