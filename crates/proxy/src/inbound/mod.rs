//! The inbound side: connections redirected to the workload arrive here and
//! go on to the workload at their original port on 127.0.0.1.
//!
//! The protocol is detected as on the outbound side (unless the port is
//! opaque): HTTP is proxied per request, anything else forwarded byte for
//! byte. A connection that was not redirected goes to `--inbound-forward-port`
//! when set (runs without iptables), else it is refused.
//!
//! Metrics carry `direction="inbound"` and the original destination as
//! `authority`. Without mTLS the source has no identity, so no identity
//! labels are set.

use crate::{
    balance::{BalanceConfig, Balancer, MakeConns, TargetName},
    cache::{spawn_sweeper, IdleCache},
    config::{HttpLimits, InboundConfig, OutboundConfig},
    detect::Protocol,
    discovery::{Endpoint, EndpointSet, Resolution, SetState},
    http::{error_response, server, EndpointConns, Forwarder, HttpBalancer, Naming, PoolConfig},
    io::{read_prefix, Counted, Prefixed},
    memory::MemoryLimit,
    metrics::{BalancerProtocol, Direction, DstLabels, Metrics, Peer, TcpMetrics},
    orig_dst::original_dst,
    own::OwnListeners,
    tcp::{self, TcpBalancer},
};
use http::StatusCode;
use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
};
use tokio::{net::TcpStream, sync::watch};

const DIRECTION: Direction = Direction::inbound;

pub struct Inbound {
    config: InboundConfig,
    /// Detection, connect, failfast and queue settings (shared by both sides).
    shared: OutboundConfig,
    /// One balancer per workload port and original destination, over the
    /// one endpoint 127.0.0.1:PORT: it brings connect backoff, failfast and
    /// the HTTP connection pool.
    http_balancers: IdleCache<(SocketAddr, SocketAddr), HttpBalancer>,
    tcp_balancers: IdleCache<(SocketAddr, SocketAddr), TcpBalancer>,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
    forwarder: Forwarder,
    limits: HttpLimits,
    memory: MemoryLimit,
    shutdown: watch::Receiver<bool>,
}

/// Everything the inbound side is built from.
pub struct InboundParts {
    pub config: InboundConfig,
    pub shared: OutboundConfig,
    pub limits: HttpLimits,
    pub memory: MemoryLimit,
    pub metrics: Arc<Metrics>,
    pub own: Arc<OwnListeners>,
    pub shutdown: watch::Receiver<bool>,
}

impl Inbound {
    pub fn new(p: InboundParts) -> Arc<Self> {
        let forwarder = Forwarder {
            pool: Arc::new(PoolConfig::new(&p.shared, &p.limits)),
            metrics: p.metrics.clone(),
            direction: DIRECTION,
        };
        let idle = p.shared.discovery_idle_timeout;
        let this = Arc::new(Self {
            http_balancers: IdleCache::new(p.shared.max_targets, idle),
            tcp_balancers: IdleCache::new(p.shared.max_targets, idle),
            config: p.config,
            shared: p.shared,
            metrics: p.metrics,
            own: p.own,
            forwarder,
            limits: p.limits,
            memory: p.memory,
            shutdown: p.shutdown,
        });
        // Balancers of workload ports no longer in use are dropped, and idle
        // connections to the workload closed.
        spawn_sweeper(Arc::downgrade(&this), idle, |i| {
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
        failfast_timeout: std::time::Duration,
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
                endpoints: vec![Endpoint::bare(target)],
            }),
            BalanceConfig {
                failfast_timeout,
                queue_capacity: self.shared.queue_capacity,
                connect_backoff: self.shared.connect_backoff.clone(),
            },
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
        let metrics = self.metrics.clone();
        let conns: MakeConns<EndpointConns> = Arc::new(move || EndpointConns::new(metrics.clone()));
        let timeout = self.shared.http_failfast_timeout;
        self.refused(self.http_balancers.get_or_insert_with(&(target, orig), || {
            self.make_balancer(target, orig, BalancerProtocol::Http, timeout, conns)
        }))
    }

    fn tcp_balancer(&self, target: SocketAddr, orig: SocketAddr) -> Option<Arc<TcpBalancer>> {
        let timeout = self.shared.tcp_failfast_timeout;
        self.refused(self.tcp_balancers.get_or_insert_with(&(target, orig), || {
            self.make_balancer(
                target,
                orig,
                BalancerProtocol::Tcp,
                timeout,
                Arc::new(|| ()),
            )
        }))
    }

    /// Serves one connection accepted on the inbound listener.
    pub async fn serve(self: Arc<Self>, stream: TcpStream) {
        let orig = match (original_dst(&stream), self.config.forward_port) {
            (Some(orig), _) => orig,
            (None, Some(port)) => {
                let local = stream
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
                SocketAddr::new(local.ip(), port)
            }
            (None, None) => {
                // Not redirected: there is no workload port to go to.
                self.metrics.error(DIRECTION, "no_original_dst");
                return;
            }
        };
        let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), orig.port());
        if self.own.is_own(target) {
            self.metrics.error(DIRECTION, "loop");
            tracing::debug!(%orig, "refused an inbound connection to the proxy's own listener");
            return;
        }
        let mut labels = DstLabels::unknown(DIRECTION);
        labels.authority = Arc::from(orig.to_string());
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels);
        let mut client = Counted::new(stream, src.read.clone(), src.write.clone());
        let ok = if self.config.opaque_ports.contains(&orig.port()) {
            Box::pin(self.forward_tcp(client, target, orig)).await
        } else {
            match read_prefix(&mut client, self.shared.detect_timeout).await {
                Err(_) => false,
                Ok((protocol, prefix)) => {
                    let io = Prefixed::new(prefix, client);
                    match protocol {
                        Protocol::Http1 | Protocol::H2 => {
                            self.clone().serve_http(io, protocol, target, orig).await
                        }
                        Protocol::Opaque => Box::pin(self.forward_tcp(io, target, orig)).await,
                    }
                }
            }
        };
        src.close(ok);
    }

    async fn forward_tcp<C>(&self, client: C, target: SocketAddr, orig: SocketAddr) -> bool
    where
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        match self.tcp_balancer(target, orig) {
            Some(b) => tcp::forward(client, &b, self.shared.connect_timeout, &self.metrics).await,
            None => false,
        }
    }

    async fn serve_http<I>(
        self: Arc<Self>,
        io: I,
        protocol: Protocol,
        target: SocketAddr,
        orig: SocketAddr,
    ) -> bool
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Some(balancer) = self.http_balancer(target, orig) else {
            return false;
        };
        let shutdown = self.shutdown.clone();
        let metrics = self.metrics.clone();
        let limits = self.limits;
        server::serve(io, protocol, &limits, &metrics, shutdown, move |req| {
            let inbound = self.clone();
            let balancer = balancer.clone();
            async move {
                if inbound.memory.shed("request") {
                    return error_response(StatusCode::SERVICE_UNAVAILABLE, "memory_limit");
                }
                inbound
                    .forwarder
                    .forward(&balancer, req, Naming::Exact)
                    .await
            }
        })
        .await
    }
}
