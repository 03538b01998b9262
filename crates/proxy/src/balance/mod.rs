//! Load balancing across the endpoints of one target: power of two choices
//! over a peak-EWMA latency estimate times outstanding requests, divided by
//! the controller's weight; in front of it, a bounded wait with failfast.
//!
//! When no endpoint is ready (none known yet, or all in connect backoff), a
//! request or connection waits for one, at most the failfast timeout, in a
//! queue of bounded size. A target whose waiters timed out is in failfast:
//! it fails new work at once until an endpoint is ready again, so that
//! clients are answered instead of piling up (seed 002).

mod ewma;

pub use ewma::PeakEwma;

use crate::{
    discovery::{Endpoint, EndpointSet, Resolution, SetState},
    metrics::{
        BalancerGauges, BalancerProtocol, Direction, DstLabels, HttpEndpointMetrics, Metrics,
    },
    own::OwnListeners,
};
use ballast_backoff::{Backoff, BackoffConfig};
use rand::Rng;
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};
use tokio::sync::Semaphore;

/// Why no endpoint was chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BalanceError {
    #[error("no endpoint became ready within the failfast timeout")]
    Failfast,
    #[error("too many requests are waiting for an endpoint of this target")]
    QueueFull,
    #[error("every endpoint of this target is one of the proxy's own listeners")]
    Loop,
    #[error("the controller refused this target: {0}")]
    Invalid(Arc<str>),
}

impl BalanceError {
    /// A short name, for `l5d-proxy-error` and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Failfast => "failfast",
            Self::QueueFull => "queue_full",
            Self::Loop => "loop",
            Self::Invalid(_) => "invalid_target",
        }
    }
}

/// Settings of every balancer.
#[derive(Clone, Debug)]
pub struct BalanceConfig {
    pub failfast_timeout: Duration,
    pub queue_capacity: usize,
    pub connect_backoff: BackoffConfig,
}

/// Failed connects one request (or TCP connection) may drive before it is
/// answered `502 connect` / closed: a target whose endpoints all refuse
/// must not turn each request into a scan of them.
pub const MAX_CONNECT_ATTEMPTS: usize = 3;

/// One endpoint of one target, with what the balancer measures of it.
#[derive(Debug)]
pub struct EndpointState {
    pub endpoint: Endpoint,
    pub labels: DstLabels,
    ewma: Mutex<PeakEwma>,
    pending: AtomicUsize,
    failing: Mutex<Failing>,
    http_metrics: OnceLock<HttpEndpointMetrics>,
    /// The latency last observed on any endpoint of the target (f64 bits).
    last_rtt_ns: Arc<AtomicU64>,
    /// Per-endpoint connection state, owned by the protocol layer.
    pub conns: crate::http::EndpointConns,
    metrics: Arc<Metrics>,
    /// The balancer's gauges; they go with the balancer, not with the
    /// endpoints that requests still hold.
    gauges: std::sync::Weak<BalancerGauges>,
}

#[derive(Debug)]
struct Failing {
    backoff: Backoff,
    retry_at: Option<Instant>,
}

impl EndpointState {
    fn new(endpoint: Endpoint, authority: Arc<str>, direction: Direction, b: &Shared) -> Self {
        let labels = endpoint.dst_labels(direction, authority);
        Self {
            endpoint,
            labels,
            ewma: Mutex::new(PeakEwma::new(Instant::now())),
            pending: AtomicUsize::new(0),
            failing: Mutex::new(Failing {
                backoff: Backoff::new(&b.config.connect_backoff),
                retry_at: None,
            }),
            http_metrics: OnceLock::new(),
            last_rtt_ns: b.last_rtt_ns.clone(),
            conns: crate::http::EndpointConns::default(),
            metrics: b.metrics.clone(),
            gauges: Arc::downgrade(&b.gauges),
        }
    }

    /// Per-request metric handles, made on first use.
    pub fn http_metrics(&self) -> &HttpEndpointMetrics {
        self.http_metrics
            .get_or_init(|| HttpEndpointMetrics::new(self.metrics.clone(), self.labels.clone()))
    }

    fn is_ready(&self, now: Instant) -> bool {
        let f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        f.retry_at.is_none_or(|t| t <= now)
    }

    fn retry_at(&self) -> Option<Instant> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retry_at
    }

    fn cost(&self, now: Instant) -> f64 {
        let rtt = self
            .ewma
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .estimate(now)
            .unwrap_or_else(|| f64::from_bits(self.last_rtt_ns.load(Ordering::Relaxed)));
        let pending = self.pending.load(Ordering::Relaxed) as f64;
        (rtt + 1.0) * (pending + 1.0) / f64::from(self.endpoint.weight.max(1))
    }

    /// A connect failed: the endpoint is not chosen again until its backoff
    /// passes.
    pub fn connect_failed(&self) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let first = f.retry_at.is_none();
        let delay = f.backoff.next_delay();
        f.retry_at = Some(Instant::now() + delay);
        drop(f);
        if let Some(g) = self.gauges.upgrade().filter(|_| first) {
            g.endpoint_pending();
        }
    }

    /// A connect succeeded: the endpoint is ready.
    pub fn connect_succeeded(&self) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if f.retry_at.take().is_some() {
            f.backoff.reset();
            drop(f);
            if let Some(g) = self.gauges.upgrade() {
                g.endpoint_ready();
            }
        }
    }

    /// Marks one request (or connection) outstanding until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.pending.fetch_add(1, Ordering::Relaxed);
        InFlight {
            endpoint: self.clone(),
            started: Instant::now(),
        }
    }
}

/// One outstanding request on an endpoint.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<EndpointState>,
    started: Instant,
}

impl InFlight {
    /// Records the latency seen (time to response headers, or to connect).
    pub fn observe(&self) -> Duration {
        let now = Instant::now();
        let rtt = now.saturating_duration_since(self.started);
        self.endpoint
            .ewma
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(rtt, now);
        self.endpoint
            .last_rtt_ns
            .store((rtt.as_nanos() as f64).to_bits(), Ordering::Relaxed);
        rtt
    }

    /// Time since the request started, without feeding the estimate.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn endpoint(&self) -> &Arc<EndpointState> {
        &self.endpoint
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Shared {
    config: BalanceConfig,
    metrics: Arc<Metrics>,
    last_rtt_ns: Arc<AtomicU64>,
    gauges: Arc<BalancerGauges>,
}

#[derive(Debug)]
struct Current {
    set: Arc<EndpointSet>,
    endpoints: Arc<[Arc<EndpointState>]>,
    loops: usize,
}

/// The balancer of one target.
#[derive(Debug)]
pub struct Balancer {
    authority: Arc<str>,
    direction: Direction,
    resolution: Resolution,
    shared: Shared,
    own: Arc<OwnListeners>,
    current: Mutex<Current>,
    waiting: Semaphore,
    failfast: AtomicBool,
}

impl Balancer {
    pub fn new(
        authority: Arc<str>,
        direction: Direction,
        resolution: Resolution,
        config: BalanceConfig,
        metrics: Arc<Metrics>,
        own: Arc<OwnListeners>,
    ) -> Self {
        let waiting = Semaphore::new(config.queue_capacity.min(Semaphore::MAX_PERMITS));
        let gauges = Arc::new(BalancerGauges::new(metrics.clone(), authority.clone()));
        Self {
            authority,
            direction,
            resolution,
            shared: Shared {
                config,
                gauges,
                metrics,
                last_rtt_ns: Arc::new(AtomicU64::new(0f64.to_bits())),
            },
            own,
            current: Mutex::new(Current {
                set: Arc::new(EndpointSet::pending()),
                endpoints: Arc::from(Vec::new()),
                loops: 0,
            }),
            waiting,
            failfast: AtomicBool::new(false),
        }
    }

    pub fn authority(&self) -> &Arc<str> {
        &self.authority
    }

    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// Closes pooled HTTP/1 connections of every endpoint that have idled
    /// past the pool's timeout (they are otherwise only found stale when the
    /// pool is next used).
    pub fn close_idle_connections(&self, pool: &crate::http::PoolConfig) {
        let endpoints = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .endpoints
            .clone();
        for e in endpoints.iter() {
            e.conns.expire_h1(pool);
        }
    }

    /// The endpoints now, rebuilt when the resolution changed; endpoint state
    /// (latency, backoff, connections) carries over for addresses that stay.
    fn endpoints(&self) -> (Arc<[Arc<EndpointState>]>, usize, SetState) {
        let set = self.resolution.current();
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&set, &current.set) {
            let mut previous: std::collections::HashMap<_, _> = current
                .endpoints
                .iter()
                .map(|s| (s.endpoint.addr, s.clone()))
                .collect();
            let mut next = Vec::with_capacity(set.endpoints.len());
            let mut loops = 0;
            for e in &set.endpoints {
                if self.own.is_own(e.addr) {
                    loops += 1;
                    continue;
                }
                let kept = previous.remove(&e.addr).filter(|s| s.endpoint == *e);
                next.push(kept.unwrap_or_else(|| {
                    Arc::new(EndpointState::new(
                        e.clone(),
                        self.authority.clone(),
                        self.direction,
                        &self.shared,
                    ))
                }));
            }
            if loops > current.loops {
                // Counted per refused request or connection (try_select).
                tracing::warn!(authority = %self.authority, "endpoints that are this proxy's own listeners are refused");
            }
            let now = Instant::now();
            let ready = next.iter().filter(|e| e.is_ready(now)).count();
            self.shared.gauges.update(ready, next.len() - ready);
            current.endpoints = Arc::from(next);
            current.loops = loops;
            current.set = set;
        }
        (
            current.endpoints.clone(),
            current.loops,
            current.set.state.clone(),
        )
    }

    /// Names what this balancer carries, for its gauges; the protocol
    /// layer calls it before selecting (the first call decides).
    pub fn bind_protocol(&self, protocol: BalancerProtocol) {
        self.shared.gauges.bind(protocol);
    }

    /// Picks a ready endpoint by P2C, or `None` when none is ready.
    fn pick(endpoints: &[Arc<EndpointState>], now: Instant) -> Option<Arc<EndpointState>> {
        let n = endpoints.len();
        let mut rng = rand::rng();
        let choose = |a: &Arc<EndpointState>, b: &Arc<EndpointState>| {
            if a.cost(now) <= b.cost(now) {
                a.clone()
            } else {
                b.clone()
            }
        };
        match n {
            0 => return None,
            1 => return endpoints[0].is_ready(now).then(|| endpoints[0].clone()),
            _ => {}
        }
        let i = rng.random_range(0..n);
        let mut j = rng.random_range(0..n - 1);
        if j >= i {
            j += 1;
        }
        let (a, b) = (&endpoints[i], &endpoints[j]);
        match (a.is_ready(now), b.is_ready(now)) {
            (true, true) => return Some(choose(a, b)),
            (true, false) => return Some(a.clone()),
            (false, true) => return Some(b.clone()),
            (false, false) => {}
        }
        // Both draws were in backoff: choose among the ready ones, if any.
        let ready: Vec<&Arc<EndpointState>> =
            endpoints.iter().filter(|e| e.is_ready(now)).collect();
        match ready.len() {
            0 => None,
            1 => Some(ready[0].clone()),
            m => {
                let i = rng.random_range(0..m);
                let mut j = rng.random_range(0..m - 1);
                if j >= i {
                    j += 1;
                }
                Some(choose(ready[i], ready[j]))
            }
        }
    }

    /// Chooses an endpoint, waiting at most until `deadline` (or failing at
    /// once in failfast).
    pub async fn select(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<EndpointState>, BalanceError> {
        if let Some(e) = self.try_select()? {
            return Ok(e);
        }
        if self.failfast.load(Ordering::Relaxed) {
            self.shared.metrics.error(self.direction, "failfast");
            return Err(BalanceError::Failfast);
        }
        let _permit = self.waiting.try_acquire().map_err(|_| {
            self.shared.metrics.error(self.direction, "queue_full");
            BalanceError::QueueFull
        })?;
        let mut changes = self.resolution.watch();
        loop {
            if let Some(e) = self.try_select()? {
                return Ok(e);
            }
            let (endpoints, _, _) = self.endpoints();
            let next_retry = endpoints
                .iter()
                .filter_map(|e| e.retry_at())
                .min()
                .map(tokio::time::Instant::from_std);
            let wake = next_retry.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The resolution ended: nothing more will come.
                        tokio::time::sleep_until(deadline).await;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                if let Some(e) = self.try_select()? {
                    return Ok(e);
                }
                if !self.failfast.swap(true, Ordering::Relaxed) {
                    self.shared.metrics.balancer_failfast.inc();
                    tracing::info!(authority = %self.authority, "no endpoint ready: failing fast");
                }
                self.shared.metrics.error(self.direction, "failfast");
                return Err(BalanceError::Failfast);
            }
        }
    }

    /// The failfast timeout of this balancer.
    pub fn failfast_timeout(&self) -> Duration {
        self.shared.config.failfast_timeout
    }

    fn try_select(&self) -> Result<Option<Arc<EndpointState>>, BalanceError> {
        let (endpoints, loops, state) = self.endpoints();
        if let SetState::Invalid(reason) = state {
            self.shared.metrics.error(self.direction, "invalid_target");
            return Err(BalanceError::Invalid(reason));
        }
        if endpoints.is_empty() && loops > 0 {
            self.shared.metrics.error(self.direction, "loop");
            return Err(BalanceError::Loop);
        }
        let picked = Self::pick(&endpoints, Instant::now());
        if picked.is_some() && self.failfast.swap(false, Ordering::Relaxed) {
            self.shared.metrics.balancer_failfast.dec();
            tracing::info!(authority = %self.authority, "an endpoint is ready: failfast over");
        }
        Ok(picked)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        if *self.failfast.get_mut() {
            self.shared.metrics.balancer_failfast.dec();
        }
    }
}
