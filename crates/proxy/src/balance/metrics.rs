//! The balancers' metrics, owned here and registered by [`crate::metrics::Metrics`].

use crate::metrics::{RetainedFamily, SeriesDrops, SeriesLimits};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BalancerLabels {
    pub authority: Arc<str>,
    /// `http` or `tcp`: one authority may have a balancer of each.
    pub protocol: &'static str,
    pub endpoint_state: &'static str,
}

/// The balancers' metrics: endpoints per target by state, targets in failfast, endpoints penalised by failure accrual.
#[derive(Debug)]
pub struct BalanceMetrics {
    /// Endpoints per target and protocol, `ready` or `pending` (in connect
    /// backoff); balancers add and take back their own counts
    /// ([`BalancerGauges`]).
    pub balancer_endpoints: RetainedFamily<BalancerLabels, Gauge>,
    /// Targets currently in failfast.
    pub balancer_failfast: Gauge,
    /// Endpoints taken out of their balancer by failure accrual.
    pub balancer_endpoint_penalties_total: Counter,
}

impl BalanceMetrics {
    /// The families, `balancer_endpoints` bounded and retained as the
    /// traffic families are.
    pub fn new(limits: SeriesLimits, drops: &SeriesDrops) -> Self {
        Self {
            balancer_endpoints: RetainedFamily::new(limits, drops.clone(), Gauge::default),
            balancer_failfast: Gauge::default(),
            balancer_endpoint_penalties_total: Counter::default(),
        }
    }

    pub fn sweep(&self, now: tokio::time::Instant) {
        self.balancer_endpoints.sweep(now);
    }

    /// Registers the families under the proxy's registry (Linkerd's names).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "balancer_endpoints",
            "Endpoints per target and protocol, ready or pending (in connect backoff)",
            self.balancer_endpoints.clone(),
        );
        r.register(
            "balancer_failfast",
            "Targets in failfast: no endpoint became ready within the failfast timeout",
            self.balancer_failfast.clone(),
        );
        r.register(
            "balancer_endpoint_penalties",
            "Endpoints taken out of their balancer for a penalty by failure accrual (the controller's balancer.linkerd.io/failure-accrual)",
            self.balancer_endpoint_penalties_total.clone(),
        );
    }
}

/// What a balancer carries: Linkerd keeps HTTP and opaque balancers apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BalancerProtocol {
    Http,
    Tcp,
}

impl BalancerProtocol {
    fn label(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Tcp => "tcp",
        }
    }
}

/// One balancer's share of `balancer_endpoints`. Balancers of one target
/// may live side by side (a new one made while connections still hold the
/// old), so each adds and takes back only its own counts, and the gauge is
/// their sum; dropping it takes its share back.
#[derive(Debug)]
pub struct BalancerGauges {
    ready: Arc<Gauge>,
    pending: Arc<Gauge>,
    share: Mutex<Share>,
    /// Shared with [`BalanceMetrics::balancer_endpoint_penalties_total`].
    pub penalties: Counter,
}

/// What one balancer has added to the gauges.
#[derive(Debug, Default)]
struct Share {
    ready: i64,
    pending: i64,
}

impl BalancerGauges {
    pub fn new(metrics: &BalanceMetrics, authority: Arc<str>, protocol: BalancerProtocol) -> Self {
        let gauge = |endpoint_state| {
            metrics.balancer_endpoints.get(&BalancerLabels {
                authority: authority.clone(),
                protocol: protocol.label(),
                endpoint_state,
            })
        };
        Self {
            ready: gauge("ready"),
            pending: gauge("pending"),
            share: Mutex::new(Share::default()),
            penalties: metrics.balancer_endpoint_penalties_total.clone(),
        }
    }

    /// The balancer's endpoints now.
    pub fn update(&self, ready: usize, pending: usize) {
        let (ready, pending) = (ready as i64, pending as i64);
        let mut share = self.lock();
        self.add(ready - share.ready, pending - share.pending);
        share.ready = ready;
        share.pending = pending;
    }

    /// A ready endpoint went into connect backoff.
    pub fn endpoint_pending(&self) {
        let mut share = self.lock();
        share.ready -= 1;
        share.pending += 1;
        self.add(-1, 1);
    }

    /// An endpoint in connect backoff connected.
    pub fn endpoint_ready(&self) {
        let mut share = self.lock();
        share.ready += 1;
        share.pending -= 1;
        self.add(1, -1);
    }

    /// Called with the share locked, so that the gauges move in the order
    /// the share does.
    fn add(&self, ready: i64, pending: i64) {
        self.ready.inc_by(ready);
        self.pending.inc_by(pending);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Share> {
        self.share.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for BalancerGauges {
    fn drop(&mut self) {
        let share = std::mem::take(self.share.get_mut().unwrap_or_else(|e| e.into_inner()));
        self.add(-share.ready, -share.pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn gauge(
        metrics: &BalanceMetrics,
        protocol: &'static str,
        endpoint_state: &'static str,
    ) -> i64 {
        metrics
            .balancer_endpoints
            .get(&BalancerLabels {
                authority: Arc::from("web.shop.svc.cluster.local:80"),
                protocol,
                endpoint_state,
            })
            .get()
    }

    #[test]
    fn balancers_of_one_authority_add_up_and_take_back_only_their_own() {
        let metrics = Metrics::register(&mut Registry::default());
        let metrics = &metrics.balance;
        let authority: Arc<str> = Arc::from("web.shop.svc.cluster.local:80");
        let http = BalancerGauges::new(metrics, authority.clone(), BalancerProtocol::Http);
        let tcp = BalancerGauges::new(metrics, authority.clone(), BalancerProtocol::Tcp);
        http.update(3, 0);
        tcp.update(2, 1);
        assert_eq!(gauge(metrics, "http", "ready"), 3);
        assert_eq!(gauge(metrics, "tcp", "ready"), 2);
        assert_eq!(gauge(metrics, "tcp", "pending"), 1);

        // A second HTTP balancer of the same target (made while the first is
        // still held) adds to the same series.
        let http2 = BalancerGauges::new(metrics, authority, BalancerProtocol::Http);
        http2.update(3, 0);
        http2.endpoint_pending();
        assert_eq!(gauge(metrics, "http", "ready"), 5);
        assert_eq!(gauge(metrics, "http", "pending"), 1);

        drop(http);
        assert_eq!(gauge(metrics, "http", "ready"), 2);
        assert_eq!(gauge(metrics, "http", "pending"), 1);
        assert_eq!(
            gauge(metrics, "tcp", "ready"),
            2,
            "the TCP balancer's share stays"
        );
        http2.endpoint_ready();
        drop(http2);
        drop(tcp);
        for (protocol, state) in [
            ("http", "ready"),
            ("http", "pending"),
            ("tcp", "ready"),
            ("tcp", "pending"),
        ] {
            assert_eq!(gauge(metrics, protocol, state), 0, "{protocol} {state}");
        }
    }
}
