//! The viz process' own metrics, on its admin server's `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `result` of a scrape: `ok`, `timeout`, `too_large`, `http_error`,
/// `connect_error`, `parse_error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// `state` of a meshed pod: `ok`, `unreachable`, `pending`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// `path` of a viz server request: one of a fixed set of route names (the
/// raw path would make a series per URL anyone cares to send).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    pub path: &'static str,
}

/// Seconds; scrapes are bounded by `--scrape-timeout` (5 s by default).
const SCRAPE_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Cheap to clone: every field shares its value.
#[derive(Clone, Debug)]
pub struct VizMetrics {
    pub scrapes: Family<ResultLabels, Counter>,
    pub scrape_duration: Histogram,
    pub scrape_bytes: Counter,
    pub cycle_duration: Gauge<f64, AtomicU64>,
    pub cycles: Counter,
    pub cycles_overrun: Counter,
    pub pods: Family<StateLabels, Gauge>,
    pub pods_over_limit: Gauge,
    pub scrapes_in_flight: Gauge,
    pub mesh_heap_bytes: Gauge,
    pub http_connections: Gauge,
    pub http_requests: Family<PathLabels, Counter>,
}

impl Default for VizMetrics {
    fn default() -> Self {
        Self {
            scrapes: Family::default(),
            scrape_duration: Histogram::new(SCRAPE_BUCKETS),
            scrape_bytes: Counter::default(),
            cycle_duration: Gauge::default(),
            cycles: Counter::default(),
            cycles_overrun: Counter::default(),
            pods: Family::default(),
            pods_over_limit: Gauge::default(),
            scrapes_in_flight: Gauge::default(),
            mesh_heap_bytes: Gauge::default(),
            http_connections: Gauge::default(),
            http_requests: Family::default(),
        }
    }
}

impl VizMetrics {
    /// The collector's and server's metrics (the tap's, `viz_tap*`, are
    /// registered by `Tapper::register`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "viz_scrapes",
            "Scrapes of proxies' /metrics (or of Prometheus' /federate with --prometheus-url) by result: ok, timeout, too_large, http_error, connect_error, parse_error",
            self.scrapes.clone(),
        );
        r.register(
            "viz_scrape_duration_seconds",
            "Time of one scrape, connect to last byte (bounded by --scrape-timeout)",
            self.scrape_duration.clone(),
        );
        r.register(
            "viz_scrape_bytes",
            "Bytes of page read by scrapes, including pages cut at --max-page-bytes",
            self.scrape_bytes.clone(),
        );
        r.register(
            "viz_scrape_cycle_duration_seconds",
            "How long the last complete scrape cycle took",
            self.cycle_duration.clone(),
        );
        r.register(
            "viz_scrape_cycles",
            "Scrape cycles completed",
            self.cycles.clone(),
        );
        r.register(
            "viz_scrape_cycles_overrun",
            "Scrape cycles that took longer than --scrape-interval (the ticks they overlapped were skipped)",
            self.cycles_overrun.clone(),
        );
        r.register(
            "viz_pods",
            "Meshed pods by state: ok (last scrape answered), unreachable (last scrape failed; retried after its backoff), pending (not scraped yet)",
            self.pods.clone(),
        );
        r.register(
            "viz_pods_over_limit",
            "Meshed pods not scraped because --max-pods were",
            self.pods_over_limit.clone(),
        );
        r.register(
            "viz_scrapes_in_flight",
            "Scrapes running (bounded by --scrape-concurrency)",
            self.scrapes_in_flight.clone(),
        );
        r.register(
            "viz_mesh_heap_bytes",
            "Estimated bytes held by the collected state (per-pod counters and history)",
            self.mesh_heap_bytes.clone(),
        );
        r.register(
            "viz_http_connections",
            "Dashboard and API connections open (bounded by --max-connections)",
            self.http_connections.clone(),
        );
        r.register(
            "viz_http_requests",
            "Dashboard and API requests by route",
            self.http_requests.clone(),
        );
    }

    pub(crate) fn scrape_result(&self, result: &'static str) {
        self.scrapes.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn set_pods(&self, state: &'static str, n: usize) {
        self.pods
            .get_or_create(&StateLabels { state })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
