//! Load balancing across the endpoints of one target: power of two choices
//! over a peak-EWMA latency estimate times outstanding requests, divided by
//! the controller's weight; in front of it, a bounded wait with failfast.
//!
//! The endpoint set is rebuilt by a worker task when discovery changes, off
//! the request path, and published to requests through an atomic pointer:
//! choosing an endpoint takes no lock. The balancer is generic over the
//! connection state each endpoint carries (`C`), so it knows nothing of the
//! protocols above it.
//!
//! When no endpoint is ready (none known yet, or all in connect backoff), a
//! request or connection waits for one, at most the failfast timeout, in a
//! queue of bounded size. A target whose waiters timed out is in failfast:
//! it fails new work at once until an endpoint is ready again, so that
//! clients are answered instead of piling up (seed 002).

mod endpoint;
mod ewma;
pub mod metrics;

pub use endpoint::{EndpointState, InFlight, LATENCY_FLOOR, PROBE_RECHECK};
pub use ewma::{decay_for, PeakEwma};

use self::metrics::{BalancerGauges, BalancerProtocol};
use crate::{
    config::TrafficConfig,
    discovery::{EndpointSet, Resolution, SetState},
    metrics::{Direction, Metrics},
    own_listeners::OwnListeners,
};
use arc_swap::{ArcSwap, ArcSwapOption};
use ballast_backoff::BackoffConfig;
use ewma::{Epoch, Typical};
use rand::Rng;
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};
use tokio::{
    sync::{watch, Notify, Semaphore},
    time::Instant,
};

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
    #[error("the controller says this service does not exist")]
    NotFound,
}

impl BalanceError {
    /// A short name, for `l5d-proxy-error` and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Failfast => "failfast",
            Self::QueueFull => "queue_full",
            Self::Loop => "loop",
            Self::Invalid(_) => "invalid_target",
            Self::NotFound => "service_not_found",
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

impl BalanceConfig {
    /// The settings of a balancer of `protocol` on either side.
    pub fn new(traffic: &TrafficConfig, protocol: BalancerProtocol) -> Self {
        Self {
            failfast_timeout: match protocol {
                BalancerProtocol::Http => traffic.http_failfast_timeout,
                BalancerProtocol::Tcp => traffic.tcp_failfast_timeout,
            },
            queue_capacity: traffic.queue_capacity,
            connect_backoff: traffic.connect_backoff.clone(),
        }
    }
}

/// Failed connects one request (or TCP connection) may drive before it is
/// answered `502 connect` / closed: a target whose endpoints all refuse
/// must not turn each request into a scan of them.
pub const MAX_CONNECT_ATTEMPTS: usize = 3;

/// Linkerd's consecutive-failures failure accrual, as the controller sends
/// it for a Service (`balancer.linkerd.io/failure-accrual: consecutive`):
/// an endpoint whose responses fail `max_failures` times in a row is not
/// chosen for a penalty that grows with each trip (`backoff`); after the
/// penalty, its next response decides: a success restores it, a failure
/// gives it the next, longer penalty.
#[derive(Clone, Debug, PartialEq)]
pub struct FailureAccrual {
    /// At least 1 (the controller's 0 turns accrual off).
    pub max_failures: u32,
    pub backoff: BackoffConfig,
}

/// P2C takes the cheaper of its two draws only when it is cheaper by more
/// than this factor; closer costs are a coin toss. Without it, noise-level
/// differences made P2C send two thirds of a light load to whichever of
/// three equal endpoints had measured fastest (see the tests below).
pub const TIE_RATIO: f64 = 1.25;

/// What every endpoint of one target shares.
#[derive(Debug)]
pub(crate) struct Target {
    authority: Arc<str>,
    direction: Direction,
    config: BalanceConfig,
    epoch: Epoch,
    typical: Typical,
    gauges: BalancerGauges,
    /// Serialises gauge changes (connect failures, recoveries, set changes:
    /// never per request), so that the gauges never drift.
    gauges_lock: Mutex<()>,
    /// Set by the policy of the requests that use this balancer.
    accrual: ArcSwapOption<FailureAccrual>,
}

impl Target {
    fn epoch_ms(&self, at: Instant) -> u64 {
        let base = self.epoch_instant();
        at.saturating_duration_since(base).as_millis() as u64
    }

    fn instant_of_ms(&self, ms: u64) -> Instant {
        self.epoch_instant() + Duration::from_millis(ms)
    }

    fn epoch_instant(&self) -> Instant {
        self.epoch.instant()
    }

    fn gauges_lock(&self) -> MutexGuard<'_, ()> {
        self.gauges_lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The endpoints requests choose from, as last published.
#[derive(Debug)]
struct Snapshot<C> {
    endpoints: Vec<Arc<EndpointState<C>>>,
    /// Endpoints left out for being the proxy's own listeners.
    loops: usize,
    state: SetState,
}

/// Which target a balancer serves, as its metrics name it.
#[derive(Clone, Debug)]
pub struct TargetName {
    pub authority: Arc<str>,
    pub direction: Direction,
    pub protocol: BalancerProtocol,
}

/// Makes the connection state of a new endpoint.
pub type MakeConns<C> = Arc<dyn Fn() -> C + Send + Sync>;

struct Published<C> {
    current: ArcSwap<Snapshot<C>>,
    /// Woken when a new snapshot is published.
    changed: Notify,
    make_conns: MakeConns<C>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Published<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

/// The balancer of one target.
#[derive(Debug)]
pub struct Balancer<C> {
    target: Arc<Target>,
    published: Arc<Published<C>>,
    waiting: Semaphore,
    failfast: AtomicBool,
    metrics: Arc<Metrics>,
    /// Keeps the target resolved while the balancer lives; the worker ends
    /// with it.
    _resolution: Resolution,
}

impl<C: Send + Sync + 'static> Balancer<C> {
    pub fn new(
        name: TargetName,
        resolution: Resolution,
        config: BalanceConfig,
        metrics: Arc<Metrics>,
        own: Arc<OwnListeners>,
        make_conns: MakeConns<C>,
    ) -> Self {
        let waiting = Semaphore::new(config.queue_capacity.min(Semaphore::MAX_PERMITS));
        let target = Arc::new(Target {
            gauges: BalancerGauges::new(&metrics.balance, name.authority.clone(), name.protocol),
            authority: name.authority,
            direction: name.direction,
            config,
            epoch: Epoch::now(),
            typical: Typical::default(),
            gauges_lock: Mutex::new(()),
            accrual: ArcSwapOption::empty(),
        });
        let mut changes = resolution.watch();
        let first = rebuild(
            &target,
            &own,
            &make_conns,
            None,
            &changes.borrow_and_update(),
        );
        let published = Arc::new(Published {
            current: ArcSwap::from_pointee(first),
            changed: Notify::new(),
            make_conns,
        });
        tokio::spawn(publish_changes(
            changes,
            target.clone(),
            published.clone(),
            own,
        ));
        Self {
            target,
            published,
            waiting,
            failfast: AtomicBool::new(false),
            metrics,
            _resolution: resolution,
        }
    }
}

/// Rebuilds the published set on every discovery change until the
/// resolution ends (its balancer was dropped).
async fn publish_changes<C>(
    mut changes: watch::Receiver<Arc<EndpointSet>>,
    target: Arc<Target>,
    published: Arc<Published<C>>,
    own: Arc<OwnListeners>,
) {
    while changes.changed().await.is_ok() {
        let set = changes.borrow_and_update().clone();
        let previous = published.current.load_full();
        let next = rebuild(&target, &own, &published.make_conns, Some(&previous), &set);
        published.current.store(Arc::new(next));
        published.changed.notify_waiters();
    }
    // The balancer is gone: take its endpoints out of the gauges.
    let last = published.current.load_full();
    let _gauges = target.gauges_lock();
    for e in &last.endpoints {
        e.in_set.store(false, Ordering::Relaxed);
    }
    target.gauges.update(0, 0);
}

/// The next snapshot: endpoint state (latency, backoff, connections) carries
/// over for addresses that stay.
fn rebuild<C>(
    target: &Arc<Target>,
    own: &OwnListeners,
    make_conns: &MakeConns<C>,
    previous: Option<&Snapshot<C>>,
    set: &EndpointSet,
) -> Snapshot<C> {
    let mut kept: HashMap<_, _> = previous
        .map(|p| {
            p.endpoints
                .iter()
                .map(|s| (s.endpoint.addr, s.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut endpoints = Vec::with_capacity(set.endpoints.len());
    let mut loops = 0;
    for e in &set.endpoints {
        if own.is_own(e.addr) {
            loops += 1;
            continue;
        }
        let state = kept
            .remove(&e.addr)
            .filter(|s| s.endpoint == *e)
            .unwrap_or_else(|| {
                Arc::new(EndpointState::new(e.clone(), target.clone(), make_conns()))
            });
        endpoints.push(state);
    }
    if loops > previous.map_or(0, |p| p.loops) {
        // Counted per refused request or connection (try_select).
        tracing::warn!(authority = %target.authority, "endpoints that are this proxy's own listeners are refused");
    }
    let _gauges = target.gauges_lock();
    for gone in kept.values() {
        gone.in_set.store(false, Ordering::Relaxed);
    }
    let mut pending = 0;
    for e in &endpoints {
        e.in_set.store(true, Ordering::Relaxed);
        pending += usize::from(e.is_backing_off());
    }
    target.gauges.update(endpoints.len() - pending, pending);
    Snapshot {
        endpoints,
        loops,
        state: set.state.clone(),
    }
}

/// Picks a ready endpoint by P2C, or `None` when none is ready.
fn pick<C>(endpoints: &[Arc<EndpointState<C>>], now: Instant) -> Option<&Arc<EndpointState<C>>> {
    let mut rng = rand::rng();
    match endpoints.len() {
        0 => return None,
        1 => return endpoints[0].is_ready(now).then(|| &endpoints[0]),
        _ => {}
    }
    let (i, j) = two_of(&mut rng, endpoints.len());
    let (a, b) = (&endpoints[i], &endpoints[j]);
    match (a.is_ready(now), b.is_ready(now)) {
        (true, true) => return Some(cheaper(&mut rng, a, b, now)),
        (true, false) => return Some(a),
        (false, true) => return Some(b),
        (false, false) => {}
    }
    // Both draws were in backoff: choose among the ready ones, if any.
    let ready: Vec<&Arc<EndpointState<C>>> = endpoints.iter().filter(|e| e.is_ready(now)).collect();
    match ready.len() {
        0 => None,
        1 => Some(ready[0]),
        m => {
            let (i, j) = two_of(&mut rng, m);
            Some(cheaper(&mut rng, ready[i], ready[j], now))
        }
    }
}

/// Two distinct indexes below `n` (at least 2).
fn two_of(rng: &mut impl Rng, n: usize) -> (usize, usize) {
    let i = rng.random_range(0..n);
    let mut j = rng.random_range(0..n - 1);
    if j >= i {
        j += 1;
    }
    (i, j)
}

fn cheaper<'a, C>(
    rng: &mut impl Rng,
    a: &'a Arc<EndpointState<C>>,
    b: &'a Arc<EndpointState<C>>,
    now: Instant,
) -> &'a Arc<EndpointState<C>> {
    let (ca, cb) = (a.cost(now), b.cost(now));
    if ca * TIE_RATIO < cb {
        a
    } else if cb * TIE_RATIO < ca || rng.random_bool(0.5) {
        b
    } else {
        a
    }
}

impl<C> Balancer<C> {
    pub fn authority(&self) -> &Arc<str> {
        &self.target.authority
    }

    pub fn direction(&self) -> Direction {
        self.target.direction
    }

    /// The failfast timeout of this balancer.
    pub fn failfast_timeout(&self) -> Duration {
        self.target.config.failfast_timeout
    }

    /// The failure accrual of the policy in force (`None`: off). Endpoint
    /// state carries over; a changed setting applies from the next failure.
    pub fn set_failure_accrual(&self, accrual: Option<&Arc<FailureAccrual>>) {
        // Called per request: the policy's own `Arc` is usually the one in
        // force already, which a pointer comparison says.
        let current = self.target.accrual.load();
        let same = match (current.as_ref(), accrual) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        };
        if !same {
            self.target.accrual.store(accrual.cloned());
        }
    }

    /// The endpoints now.
    pub fn endpoints(&self) -> Vec<Arc<EndpointState<C>>> {
        self.published.current.load().endpoints.clone()
    }

    /// Chooses an endpoint, waiting at most until `deadline` (or failing at
    /// once in failfast).
    pub async fn select(&self, deadline: Instant) -> Result<Arc<EndpointState<C>>, BalanceError> {
        if let Some(e) = self.try_select()? {
            return Ok(e);
        }
        // Boxed: a request's future is sized for its largest state, and
        // waiting (a sleep, a notification) is the rare one.
        Box::pin(self.wait_for_endpoint(deadline)).await
    }

    async fn wait_for_endpoint(
        &self,
        deadline: Instant,
    ) -> Result<Arc<EndpointState<C>>, BalanceError> {
        if self.failfast.load(Ordering::Relaxed) {
            self.metrics.error(self.target.direction, "failfast");
            return Err(BalanceError::Failfast);
        }
        let _permit = self.waiting.try_acquire().map_err(|_| {
            self.metrics.error(self.target.direction, "queue_full");
            BalanceError::QueueFull
        })?;
        loop {
            // Registered before looking, so a publish in between wakes us.
            let changed = self.published.changed.notified();
            if let Some(e) = self.try_select()? {
                return Ok(e);
            }
            let next_retry = self
                .published
                .current
                .load()
                .endpoints
                .iter()
                .filter_map(|e| e.retry_at())
                .min();
            let wake = next_retry.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= deadline {
                if let Some(e) = self.try_select()? {
                    return Ok(e);
                }
                if !self.failfast.swap(true, Ordering::Relaxed) {
                    self.metrics.balance.balancer_failfast.inc();
                    tracing::info!(authority = %self.target.authority, "no endpoint ready: failing fast");
                }
                self.metrics.error(self.target.direction, "failfast");
                return Err(BalanceError::Failfast);
            }
        }
    }

    fn try_select(&self) -> Result<Option<Arc<EndpointState<C>>>, BalanceError> {
        let snapshot = self.published.current.load();
        let direction = self.target.direction;
        match &snapshot.state {
            SetState::Invalid(reason) => {
                self.metrics.error(direction, "invalid_target");
                return Err(BalanceError::Invalid(reason.clone()));
            }
            // Counted by the caller, which knows how the name was given.
            SetState::DoesNotExist => return Err(BalanceError::NotFound),
            SetState::Pending | SetState::Known => {}
        }
        if snapshot.endpoints.is_empty() && snapshot.loops > 0 {
            self.metrics.error(direction, "loop");
            return Err(BalanceError::Loop);
        }
        let picked = pick(&snapshot.endpoints, Instant::now()).cloned();
        if picked.is_some() && self.failfast.swap(false, Ordering::Relaxed) {
            self.metrics.balance.balancer_failfast.dec();
            tracing::info!(authority = %self.target.authority, "an endpoint is ready: failfast over");
        }
        Ok(picked)
    }
}

impl<C> Drop for Balancer<C> {
    fn drop(&mut self) {
        if *self.failfast.get_mut() {
            self.metrics.balance.balancer_failfast.dec();
        }
    }
}

#[cfg(test)]
mod tests;
