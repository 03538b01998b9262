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

use crate::{
    balance::{BalanceConfig, Balancer, MakeConns, TargetName},
    cache::{spawn_sweeper, sweep_period, IdleCache},
    config::{HttpLimits, InboundConfig, OwnerKind, PodIdentity, TrafficConfig},
    connect::Dialer,
    discovery::{Endpoint, EndpointSet, Resolution, SetState},
    http::{
        error_response, orig_proto, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig,
        ResponseBody,
    },
    metrics::{
        empty_label, BalancerProtocol, Direction, DstWorkload, Metrics, TlsLabels, WorkloadLabels,
    },
    orig_dst::original_dst,
    own::OwnListeners,
    pipeline::{Accepted, Side},
    tcp::{self, TcpBalancer},
};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
};
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
}

/// Where an inbound connection goes: the workload port, and the original
/// destination that names it in metrics.
pub struct Route {
    target: SocketAddr,
    orig: SocketAddr,
    /// Addressed to the proxy itself (not redirected): only a meshed
    /// client's transport header can say where it goes.
    direct: bool,
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
        });
        // Balancers of workload ports no longer in use are dropped, and idle
        // connections to the workload closed.
        spawn_sweeper(Arc::downgrade(&this), sweep_period(idle), |i| {
            i.http_balancers.sweep();
            i.tcp_balancers.sweep();
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
}

impl Side for Inbound {
    type Route = Route;
    /// The workload port's balancer, or `None` past `--max-targets`.
    type Http = Option<Arc<HttpBalancer>>;

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
                    route: Route {
                        target: local,
                        orig: local,
                        direct: true,
                    },
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
        Some(Accepted {
            route: Route {
                target,
                orig,
                direct: false,
            },
            labels,
            opaque: self.config.opaque_ports.contains(&orig.port()),
        })
    }

    async fn forward_tcp<C>(self: &Arc<Self>, client: C, route: Route) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin + Send,
    {
        if route.direct {
            self.metrics.error(DIRECTION, "no_original_dst");
            return false;
        }
        match self.tcp_balancer(route.target, route.orig) {
            Some(b) => tcp::forward(client, &b, &self.forwarder.dialer, &self.metrics).await,
            None => false,
        }
    }

    fn bind_http(self: &Arc<Self>, route: Route) -> Self::Http {
        if route.direct {
            self.metrics.error(DIRECTION, "no_original_dst");
            return None;
        }
        self.http_balancer(route.target, route.orig)
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
        })
    }

    async fn request(
        self: Arc<Self>,
        http: Arc<Self::Http>,
        mut req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let downgraded = orig_proto::downgrade(&mut req);
        let mut rsp = match &*http {
            Some(b) => self.forwarder.forward(b, req, Naming::Exact).await,
            None => error_response(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets"),
        };
        if let Some(orig) = downgraded {
            orig_proto::mark(&mut rsp, orig);
        }
        rsp
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
}
