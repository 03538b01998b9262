//! One endpoint of one target, with what the balancer measures of it: its
//! latency estimate, requests outstanding, connect backoff, and failure
//! accrual (consecutive failed responses, the penalty they earn). Requests
//! touch only atomics here; the backoffs' locks are taken on connect
//! failures, on penalties, and on the first success after either.

use super::{
    ewma::{decay_for, PeakEwma},
    Target,
};
use crate::{discovery::Endpoint, metrics::DstLabels};
use ballast_backoff::Backoff;
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::time::Instant;

/// Latency differences below this are noise, not signal: on a busy host a
/// loopback round trip varies by about this much from scheduling alone.
pub const LATENCY_FLOOR: Duration = Duration::from_millis(1);
/// How often a request waiting for an endpoint looks again while the only
/// candidates are on probation with their probe out.
pub const PROBE_RECHECK: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub struct EndpointState<C> {
    pub endpoint: Endpoint,
    pub labels: DstLabels,
    /// Connection state, owned by the protocol layer.
    pub conns: C,
    ewma: PeakEwma,
    pending: AtomicUsize,
    /// 0 while ready; else 1 + the millisecond (since the target's epoch)
    /// at which the endpoint may be tried again.
    retry_at: AtomicU64,
    backoff: Mutex<Backoff>,
    /// Failed responses in a row (failure accrual).
    failures: AtomicU32,
    /// 0 unless penalised by failure accrual; else 1 + the millisecond at
    /// which the penalty ends.
    shut_until: AtomicU64,
    /// Penalised at least once since its last success: the next failure
    /// earns the next penalty at once.
    probation: AtomicBool,
    /// The penalties' schedule, made at the first one.
    penalty: Mutex<Option<Backoff>>,
    /// Whether the endpoint is in its target's published set (its gauge
    /// contribution is then counted).
    pub(super) in_set: AtomicBool,
    target: Arc<Target>,
}

impl<C> EndpointState<C> {
    pub(super) fn new(endpoint: Endpoint, target: Arc<Target>, conns: C) -> Self {
        let labels = endpoint.dst_labels(target.direction, target.authority.clone());
        Self {
            endpoint,
            labels,
            conns,
            ewma: PeakEwma::default(),
            pending: AtomicUsize::new(0),
            retry_at: AtomicU64::new(0),
            backoff: Mutex::new(Backoff::new(&target.config.connect_backoff)),
            failures: AtomicU32::new(0),
            shut_until: AtomicU64::new(0),
            probation: AtomicBool::new(false),
            penalty: Mutex::new(None),
            in_set: AtomicBool::new(false),
            target,
        }
    }

    pub(super) fn is_ready(&self, now: Instant) -> bool {
        let passed = |at: u64| at == 0 || self.target.epoch_ms(now) + 1 >= at;
        passed(self.retry_at.load(Ordering::Relaxed))
            && passed(self.shut_until.load(Ordering::Relaxed))
            && !self.is_probing()
    }

    /// On probation after a penalty, one request at a time probes the
    /// endpoint (as Linkerd's failure accrual): while one is out, it is not
    /// chosen. Two picks racing on two threads may both send; the bound is
    /// that the burst after a penalty is a probe, not the whole rate.
    fn is_probing(&self) -> bool {
        self.probation.load(Ordering::Relaxed)
            && self.pending.load(Ordering::Relaxed) > 0
            // Accrual turned off since: no probing.
            && self.target.accrual.load().is_some()
    }

    /// Whether the endpoint is in connect backoff (counted as pending).
    pub(super) fn is_backing_off(&self) -> bool {
        self.retry_at.load(Ordering::Relaxed) != 0
    }

    /// When the endpoint may be chosen again, if it is held back (connect
    /// backoff or a failure-accrual penalty, whichever ends later).
    pub(super) fn retry_at(&self) -> Option<Instant> {
        let at = self
            .retry_at
            .load(Ordering::Relaxed)
            .max(self.shut_until.load(Ordering::Relaxed));
        let held = (at != 0).then(|| self.target.instant_of_ms(at - 1));
        if self.is_probing() {
            // Nothing announces a probe's end: look again shortly.
            let soon = Instant::now() + PROBE_RECHECK;
            return Some(held.map_or(soon, |at| at.max(soon)));
        }
        held
    }

    /// Whether a failure-accrual penalty holds the endpoint back now.
    pub fn is_penalised(&self, now: Instant) -> bool {
        match self.shut_until.load(Ordering::Relaxed) {
            0 => false,
            at => self.target.epoch_ms(now) + 1 < at,
        }
    }

    /// A response from the endpoint ended (its status and body read):
    /// counted for failure accrual when the target's policy has it.
    pub fn response_ended(&self, success: bool) {
        if success {
            if self.failures.load(Ordering::Relaxed) != 0 {
                self.failures.store(0, Ordering::Relaxed);
            }
            if self.probation.load(Ordering::Relaxed)
                && self.probation.swap(false, Ordering::Relaxed)
            {
                if let Some(p) = self
                    .penalty
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                {
                    p.reset();
                }
            }
            return;
        }
        let t = &self.target;
        let Some(accrual) = t.accrual.load_full() else {
            return;
        };
        let now = Instant::now();
        // Responses to requests sent before the penalty began say nothing
        // new; they must not lengthen it.
        if self.is_penalised(now) {
            return;
        }
        let failed = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failed < accrual.max_failures.max(1) && !self.probation.load(Ordering::Relaxed) {
            return;
        }
        let delay = {
            let mut penalty = self.penalty.lock().unwrap_or_else(|e| e.into_inner());
            let schedule = penalty.get_or_insert_with(|| Backoff::new(&accrual.backoff));
            if *schedule.config() != accrual.backoff.sanitized() {
                *schedule = Backoff::new(&accrual.backoff);
            }
            schedule.next_delay()
        };
        self.failures.store(0, Ordering::Relaxed);
        self.probation.store(true, Ordering::Relaxed);
        self.shut_until
            .store(t.epoch_ms(now + delay) + 1, Ordering::Relaxed);
        t.gauges.penalties.inc();
        tracing::debug!(
            addr = %self.endpoint.addr,
            failed,
            penalty_ms = delay.as_millis() as u64,
            "failure accrual: endpoint held back"
        );
    }

    /// The cost P2C compares: latency (with the noise floor) times requests
    /// outstanding, divided by the controller's weight.
    pub(super) fn cost(&self, now: Instant) -> f64 {
        let t = &self.target;
        let typical = t.typical.get();
        let rtt = self
            .ewma
            .estimate(now, t.epoch, decay_for(typical))
            .unwrap_or(typical);
        let pending = self.pending.load(Ordering::Relaxed) as f64;
        (rtt + LATENCY_FLOOR.as_nanos() as f64) * (pending + 1.0)
            / f64::from(self.endpoint.weight.max(1))
    }

    /// A connect failed: the endpoint is not chosen again until its backoff
    /// passes.
    pub fn connect_failed(&self) {
        let t = &self.target;
        let _gauges = t.gauges_lock();
        let delay = self
            .backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_delay();
        let at = t.epoch_ms(Instant::now() + delay) + 1;
        let was = self.retry_at.swap(at, Ordering::Relaxed);
        if was == 0 && self.in_set.load(Ordering::Relaxed) {
            t.gauges.endpoint_pending();
        }
    }

    /// A connect succeeded: the endpoint is ready.
    pub fn connect_succeeded(&self) {
        if self.retry_at.load(Ordering::Relaxed) == 0 {
            return;
        }
        let t = &self.target;
        let _gauges = t.gauges_lock();
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reset();
        if self.retry_at.swap(0, Ordering::Relaxed) != 0 && self.in_set.load(Ordering::Relaxed) {
            t.gauges.endpoint_ready();
        }
    }

    /// Marks one request (or connection) outstanding until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight<C> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        InFlight {
            endpoint: self.clone(),
            started: Instant::now(),
        }
    }
}

/// One outstanding request on an endpoint.
#[derive(Debug)]
pub struct InFlight<C> {
    endpoint: Arc<EndpointState<C>>,
    started: Instant,
}

impl<C> InFlight<C> {
    /// Records the latency seen (time to response headers, or to connect).
    pub fn observe(&self) -> Duration {
        let now = Instant::now();
        let rtt = now.saturating_duration_since(self.started);
        let t = &self.endpoint.target;
        let decay = decay_for(t.typical.get());
        self.endpoint.ewma.observe(rtt, now, t.epoch, decay);
        t.typical.observe(rtt);
        rtt
    }

    /// Time since the request started, without feeding the estimate.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn endpoint(&self) -> &Arc<EndpointState<C>> {
        &self.endpoint
    }
}

impl<C> Drop for InFlight<C> {
    fn drop(&mut self) {
        self.endpoint.pending.fetch_sub(1, Ordering::Relaxed);
    }
}
