//! The proxy's metrics. Traffic metrics keep Linkerd's names and labels
//! (`request_total`, `response_total`, `response_latency_ms`, `tcp_*`), so
//! that Linkerd's dashboards read them; the rest describe the control plane
//! and the bounds.
//!
//! The traffic families (those labelled by destination) live as a
//! Prometheus server expects: a series is never reset while it is exported,
//! one nobody uses stays for `--metrics-retention`, and each family holds
//! at most `--metrics-max-series` series ([`series`]).

pub mod authz;
pub mod route;
pub mod series;

pub use series::{RetainedFamily, SeriesDrops, SeriesLimits};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelSetEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;

/// Linkerd's `response_latency_ms` buckets.
const LATENCY_BUCKETS_MS: [f64; 25] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
    1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
];

/// Traffic direction, as Linkerd labels it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Direction {
    inbound,
    outbound,
}

/// Which side of the proxy a TCP connection is on, as Linkerd labels it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Peer {
    /// Accepted from a client.
    src,
    /// Opened to an endpoint.
    dst,
}

/// The workload of a destination pod, as Linkerd labels it: the pod's
/// owner by kind, its service account and template hash. Shared, so that a
/// copy of [`DstLabels`] costs one reference count, not seven.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct DstWorkload(pub Arc<WorkloadLabels>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub dst_deployment: Arc<str>,
    pub dst_statefulset: Arc<str>,
    pub dst_daemonset: Arc<str>,
    pub dst_replicaset: Arc<str>,
    pub dst_k8s_job: Arc<str>,
    pub dst_serviceaccount: Arc<str>,
    pub dst_pod_template_hash: Arc<str>,
}

/// A destination's labels under the keys the controller sends them by
/// (`namespace`, `service`, `pod`, `deployment`, ..., `serviceaccount`,
/// `pod_template_hash`), empty ones left out: tap events name them so, and
/// the snapshot writes endpoints back as the controller sent them.
pub fn controller_labels<'a>(
    namespace: &'a Arc<str>,
    service: &'a Arc<str>,
    pod: &'a Arc<str>,
    workload: &'a DstWorkload,
) -> impl Iterator<Item = (&'static str, &'a Arc<str>)> {
    let w = &workload.0;
    [
        ("namespace", namespace),
        ("service", service),
        ("pod", pod),
        ("deployment", &w.dst_deployment),
        ("statefulset", &w.dst_statefulset),
        ("daemonset", &w.dst_daemonset),
        ("replicaset", &w.dst_replicaset),
        ("k8s_job", &w.dst_k8s_job),
        ("serviceaccount", &w.dst_serviceaccount),
        ("pod_template_hash", &w.dst_pod_template_hash),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
}

impl DstWorkload {
    /// No workload known: every label empty, made once.
    pub fn none() -> Self {
        static NONE: std::sync::OnceLock<DstWorkload> = std::sync::OnceLock::new();
        NONE.get_or_init(|| {
            let empty = empty_label();
            DstWorkload(Arc::new(WorkloadLabels {
                dst_deployment: empty.clone(),
                dst_statefulset: empty.clone(),
                dst_daemonset: empty.clone(),
                dst_replicaset: empty.clone(),
                dst_k8s_job: empty.clone(),
                dst_serviceaccount: empty.clone(),
                dst_pod_template_hash: empty,
            }))
        })
        .clone()
    }
}

impl EncodeLabelSet for DstWorkload {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }
}

/// The destination of traffic: Linkerd's `authority` and `dst_*` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DstLabels {
    pub direction: Direction,
    pub authority: Arc<str>,
    pub dst_namespace: Arc<str>,
    pub dst_service: Arc<str>,
    pub dst_pod: Arc<str>,
    #[prometheus(flatten)]
    pub workload: DstWorkload,
}

/// How long a traffic metric series nobody uses stays exported: a
/// Prometheus server scraping every 10-30 s, or one that missed a few
/// scrapes, still sees the last counts of a service called rarely.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// Most series per traffic metric family. A sidecar talks to tens of
/// services of tens of endpoints each; 10,000 covers a client of every pod
/// of a large cluster (1,000 services of 10 pods) while bounding the worst
/// case to tens of MB and a scrape to what one Prometheus target can take.
pub const DEFAULT_MAX_SERIES: usize = 10_000;

/// The empty label value, shared: made once, not per connection.
pub fn empty_label() -> Arc<str> {
    static EMPTY: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Arc::from("")).clone()
}

impl DstLabels {
    /// Labels for a connection whose destination is not known yet.
    pub fn unknown(direction: Direction) -> Self {
        let empty = empty_label();
        Self {
            direction,
            authority: empty.clone(),
            dst_namespace: empty.clone(),
            dst_service: empty.clone(),
            dst_pod: empty,
            workload: DstWorkload::none(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    #[prometheus(flatten)]
    pub dst: DstLabels,
    pub classification: &'static str,
    pub status_code: u16,
    /// gRPC's status (trailer, or header of a trailers-only answer); empty
    /// for other responses.
    pub grpc_status_code: Option<u32>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpLabels {
    pub peer: Peer,
    #[prometheus(flatten)]
    pub dst: DstLabels,
    #[prometheus(flatten)]
    pub tls: TlsLabels,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpCloseLabels {
    pub peer: Peer,
    #[prometheus(flatten)]
    pub dst: DstLabels,
    #[prometheus(flatten)]
    pub tls: TlsLabels,
    pub classification: &'static str,
}

/// A connection's TLS, as Linkerd labels it: `tls="true"` with `server_id`
/// (outbound) or `client_id` (inbound); `tls="no_identity"` with
/// `no_tls_reason`; `tls="opaque"` with `sni` for TLS passed through;
/// `tls="disabled"` when the proxy has no identity.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum TlsLabels {
    Disabled,
    NoIdentity(&'static str),
    ServerId(Arc<str>),
    /// Empty when the client sent no certificate.
    ClientId(Arc<str>),
    Passthru(Arc<str>),
}

impl EncodeLabelSet for TlsLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Self::Disabled => [("tls", "disabled")].encode(encoder),
            Self::NoIdentity(reason) => {
                [("tls", "no_identity"), ("no_tls_reason", reason)].encode(encoder)
            }
            Self::ServerId(id) => [("tls", "true"), ("server_id", id)].encode(encoder),
            Self::ClientId(id) => [("tls", "true"), ("client_id", id)].encode(encoder),
            Self::Passthru(sni) => [("tls", "opaque"), ("sni", sni)].encode(encoder),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub direction: Direction,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeriesDropLabels {
    /// `retention` or `limit`.
    pub reason: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_MS)
}

/// Connection lifetimes, 1 ms to about a day, a bucket per decade.
const DURATION_BUCKETS_MS: [f64; 9] = [
    1.0,
    10.0,
    100.0,
    1_000.0,
    10_000.0,
    100_000.0,
    1_000_000.0,
    10_000_000.0,
    100_000_000.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS_MS)
}

/// All of the proxy's metric families.
#[derive(Debug)]
pub struct Metrics {
    pub request_total: RetainedFamily<DstLabels, Counter>,
    pub response_total: RetainedFamily<ResponseLabels, Counter>,
    pub response_latency_ms: RetainedFamily<DstLabels, Histogram>,
    pub tcp_open_total: RetainedFamily<TcpLabels, Counter>,
    pub tcp_open_connections: RetainedFamily<TcpLabels, Gauge>,
    pub tcp_read_bytes_total: RetainedFamily<TcpLabels, Counter>,
    pub tcp_write_bytes_total: RetainedFamily<TcpLabels, Counter>,
    pub tcp_close_total: RetainedFamily<TcpCloseLabels, Counter>,
    /// Lifetimes of closed TCP connections.
    pub tcp_connection_duration_ms: RetainedFamily<TcpCloseLabels, Histogram>,
    /// Proxy-made failures by reason: `failfast`, `queue_full`, `loop`, ...
    pub errors_total: Family<ErrorLabels, Counter>,
    pub balance: crate::balance::metrics::BalanceMetrics,
    pub discovery: crate::discovery::metrics::DiscoveryMetrics,
    pub listener: crate::listen::ListenerMetrics,
    pub memory: crate::memory::MemoryMetrics,
    pub http: crate::http::metrics::HttpServerMetrics,
    /// Series removed from the traffic families, by reason.
    pub series_dropped_total: Family<SeriesDropLabels, Counter>,
    /// Inbound authorization (Linkerd's `inbound_*_authz_*` families).
    pub authz: authz::AuthzMetrics,
    /// Outbound routes and backends of policies, and open policy watches.
    pub outbound_policy: route::OutboundPolicyMetrics,
    limits: SeriesLimits,
}

impl Metrics {
    /// Creates the families with the default series limits and registers
    /// them.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        Self::register_with(
            registry,
            SeriesLimits {
                retention: DEFAULT_RETENTION,
                max_series: DEFAULT_MAX_SERIES,
            },
        )
    }

    /// Creates the families and registers them; `limits` bound the series of
    /// the traffic families (those labelled by destination).
    pub fn register_with(registry: &mut Registry, limits: SeriesLimits) -> Arc<Self> {
        let series_dropped_total = Family::<SeriesDropLabels, Counter>::default();
        let drops = SeriesDrops {
            retention: series_dropped_total.get_or_create_owned(&SeriesDropLabels {
                reason: "retention",
            }),
            limit: series_dropped_total.get_or_create_owned(&SeriesDropLabels { reason: "limit" }),
        };
        let counters = Counter::default;
        let (l, d) = (limits, &drops);
        let m = Self {
            request_total: RetainedFamily::new(l, d.clone(), counters),
            response_total: RetainedFamily::new(l, d.clone(), counters),
            response_latency_ms: RetainedFamily::new(l, d.clone(), latency_histogram),
            tcp_open_total: RetainedFamily::new(l, d.clone(), counters),
            tcp_open_connections: RetainedFamily::new(l, d.clone(), Gauge::default),
            tcp_read_bytes_total: RetainedFamily::new(l, d.clone(), counters),
            tcp_write_bytes_total: RetainedFamily::new(l, d.clone(), counters),
            tcp_close_total: RetainedFamily::new(l, d.clone(), counters),
            tcp_connection_duration_ms: RetainedFamily::new(l, d.clone(), duration_histogram),
            errors_total: Family::default(),
            balance: crate::balance::metrics::BalanceMetrics::new(l, d),
            discovery: Default::default(),
            listener: Default::default(),
            memory: Default::default(),
            http: Default::default(),
            series_dropped_total,
            authz: authz::AuthzMetrics::new(l, d),
            outbound_policy: route::OutboundPolicyMetrics::new(l, d),
            limits,
        };
        let r = registry;
        r.register("request", "Requests proxied", m.request_total.clone());
        r.register(
            "response",
            "Responses, by classification and status code",
            m.response_total.clone(),
        );
        r.register(
            "response_latency_ms",
            "Time to response headers, in milliseconds",
            m.response_latency_ms.clone(),
        );
        r.register(
            "tcp_open",
            "TCP connections opened",
            m.tcp_open_total.clone(),
        );
        r.register(
            "tcp_open_connections",
            "TCP connections open",
            m.tcp_open_connections.clone(),
        );
        r.register(
            "tcp_read_bytes",
            "Bytes read from TCP peers",
            m.tcp_read_bytes_total.clone(),
        );
        r.register(
            "tcp_write_bytes",
            "Bytes written to TCP peers",
            m.tcp_write_bytes_total.clone(),
        );
        r.register(
            "tcp_close",
            "TCP connections closed",
            m.tcp_close_total.clone(),
        );
        r.register(
            "tcp_connection_duration_ms",
            "Lifetimes of closed TCP connections, in milliseconds",
            m.tcp_connection_duration_ms.clone(),
        );
        r.register(
            "proxy_errors",
            "Requests and connections failed by the proxy itself, by reason",
            m.errors_total.clone(),
        );
        m.balance.register(r);
        m.discovery.register(r);
        m.listener.register(r);
        m.memory.register(r);
        m.http.register(r);
        r.register(
            "metrics_series_dropped",
            "Traffic metric series removed: unused for --metrics-retention, or past --metrics-max-series",
            m.series_dropped_total.clone(),
        );
        m.authz.register(r);
        m.outbound_policy.register(r);
        Arc::new(m)
    }

    /// Removes the traffic series nobody has used for the retention.
    pub fn sweep(&self, now: Instant) {
        self.request_total.sweep(now);
        self.response_total.sweep(now);
        self.response_latency_ms.sweep(now);
        self.tcp_open_total.sweep(now);
        self.tcp_open_connections.sweep(now);
        self.tcp_read_bytes_total.sweep(now);
        self.tcp_write_bytes_total.sweep(now);
        self.tcp_close_total.sweep(now);
        self.tcp_connection_duration_ms.sweep(now);
        self.balance.sweep(now);
        self.authz.sweep(now);
        self.outbound_policy.sweep(now);
    }

    /// How often to [`sweep`](Self::sweep): often enough that a series goes
    /// soon after its retention, rarely enough that walking every series
    /// costs nothing to speak of.
    pub fn sweep_period(&self) -> Duration {
        (self.limits.retention / 60).clamp(Duration::from_secs(1), Duration::from_secs(10))
    }

    /// Counts a failure made by the proxy.
    pub fn error(&self, direction: Direction, error: &'static str) {
        self.errors_total
            .get_or_create(&ErrorLabels { direction, error })
            .inc();
    }
}

/// Distinct responses (status, classification, gRPC status) whose handles
/// one endpoint keeps; rarer ones are looked up per response.
const CACHED_RESPONSES: usize = 16;

/// gRPC's codes end at 16; a larger one from a peer is read as UNKNOWN (2),
/// as gRPC itself reads it, so that a peer cannot make series without bound.
fn grpc_code(code: u32) -> u32 {
    if code <= 16 {
        code
    } else {
        2
    }
}

type ResponseKey = (u16, &'static str, Option<u32>);

/// The per-request metric handles of one endpoint of one target, looked up
/// once so that a request costs a few atomic adds. The series outlive it
/// (see [`series`]): a new balancer for the same endpoint counts on.
#[derive(Debug)]
pub struct HttpEndpointMetrics {
    metrics: Arc<Metrics>,
    labels: DstLabels,
    requests: Arc<Counter>,
    latency: Arc<Histogram>,
    ok: Arc<Counter>,
    responses: Mutex<Vec<(ResponseKey, Arc<Counter>)>>,
}

/// Linkerd's classification of a response: 5xx and a non-zero `grpc-status`
/// are failures.
pub fn classify(status: u16, grpc_status: Option<u32>) -> &'static str {
    match grpc_status {
        Some(0) | None if status < 500 => "success",
        _ => "failure",
    }
}

impl HttpEndpointMetrics {
    pub fn new(metrics: Arc<Metrics>, labels: DstLabels) -> Self {
        let requests = metrics.request_total.get(&labels);
        let latency = metrics.response_latency_ms.get(&labels);
        let ok = metrics.response_total.get(&ResponseLabels {
            dst: labels.clone(),
            classification: "success",
            status_code: 200,
            grpc_status_code: None,
        });
        Self {
            metrics,
            labels,
            requests,
            latency,
            ok,
            responses: Mutex::new(Vec::new()),
        }
    }

    pub fn labels(&self) -> &DstLabels {
        &self.labels
    }

    pub fn request(&self) {
        self.requests.inc();
    }

    pub fn latency(&self, elapsed: Duration) {
        self.latency.observe(elapsed.as_secs_f64() * 1000.0);
    }

    /// Counts a response that ended; `grpc_status` is `None` for one that
    /// is not gRPC (or ended before its status came).
    pub fn response(&self, status: u16, grpc_status: Option<u32>, classification: &'static str) {
        let key = (status, classification, grpc_status.map(grpc_code));
        if key == (200, "success", None) {
            self.ok.inc();
            return;
        }
        let cached = |responses: &[(ResponseKey, Arc<Counter>)]| {
            responses
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, c)| c.clone())
        };
        if let Some(c) = cached(&self.lock_responses()) {
            c.inc();
            return;
        }
        let counter = self.metrics.response_total.get(&ResponseLabels {
            dst: self.labels.clone(),
            classification,
            status_code: status,
            grpc_status_code: key.2,
        });
        counter.inc();
        let mut responses = self.lock_responses();
        if responses.len() < CACHED_RESPONSES && cached(&responses).is_none() {
            responses.push((key, counter));
        }
    }

    fn lock_responses(&self) -> std::sync::MutexGuard<'_, Vec<(ResponseKey, Arc<Counter>)>> {
        self.responses.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The TCP metric handles of one connection side.
#[derive(Debug)]
pub struct TcpMetrics {
    metrics: Arc<Metrics>,
    labels: TcpLabels,
    pub read: Arc<Counter>,
    pub write: Arc<Counter>,
    open: Arc<Gauge>,
    opened: Instant,
}

impl TcpMetrics {
    /// Counts a connection opened and returns its handles.
    pub fn open(metrics: &Arc<Metrics>, peer: Peer, dst: DstLabels, tls: TlsLabels) -> Self {
        let labels = TcpLabels { peer, dst, tls };
        metrics.tcp_open_total.get(&labels).inc();
        let open = metrics.tcp_open_connections.get(&labels);
        open.inc();
        Self {
            read: metrics.tcp_read_bytes_total.get(&labels),
            write: metrics.tcp_write_bytes_total.get(&labels),
            metrics: metrics.clone(),
            labels,
            open,
            opened: Instant::now(),
        }
    }

    /// Counts the connection closed, and how long it lived.
    pub fn close(self, success: bool) {
        self.open.dec();
        let labels = TcpCloseLabels {
            peer: self.labels.peer,
            dst: self.labels.dst,
            tls: self.labels.tls,
            classification: if success { "success" } else { "failure" },
        };
        self.metrics.tcp_close_total.get(&labels).inc();
        let lived = self.opened.elapsed();
        self.metrics
            .tcp_connection_duration_ms
            .get(&labels)
            .observe(lived.as_secs_f64() * 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_linkerd() {
        assert_eq!(classify(200, None), "success");
        assert_eq!(classify(404, None), "success");
        assert_eq!(classify(503, None), "failure");
        assert_eq!(classify(200, Some(0)), "success");
        assert_eq!(classify(200, Some(14)), "failure");
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text
    }

    fn web_labels() -> DstLabels {
        let mut labels = DstLabels::unknown(Direction::outbound);
        labels.authority = Arc::from("web.shop.svc.cluster.local:80");
        labels
    }

    fn sample<'a>(text: &'a str, prefix: &str, containing: &[&str]) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(prefix) && containing.iter().all(|c| l.contains(c)))
    }

    /// Issue 9, defect 1: a balancer dropped after the idle timeout took its
    /// endpoints' series with it, and the next one counted from zero.
    #[tokio::test(start_paused = true)]
    async fn an_endpoints_series_outlive_it_and_the_next_one_counts_on() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let ep = HttpEndpointMetrics::new(metrics.clone(), web_labels());
        ep.request();
        ep.response(503, None, "failure");
        drop(ep);
        metrics.sweep(Instant::now());
        let text = scrape(&registry);
        assert!(
            sample(&text, "request_total", &["web.shop"]).is_some_and(|l| l.ends_with(" 1")),
            "{text}"
        );
        assert!(text.contains("status_code=\"503\""), "{text}");

        let ep = HttpEndpointMetrics::new(metrics.clone(), web_labels());
        ep.request();
        let text = scrape(&registry);
        assert!(
            sample(&text, "request_total", &["web.shop"]).is_some_and(|l| l.ends_with(" 2")),
            "{text}"
        );
        drop(ep);

        // Unused for the whole retention, the series go, and say so.
        let retention = DEFAULT_RETENTION;
        metrics.sweep(Instant::now());
        tokio::time::advance(retention).await;
        metrics.sweep(Instant::now());
        let text = scrape(&registry);
        assert!(!text.contains("web.shop"), "{text}");
        assert!(
            sample(&text, "metrics_series_dropped_total", &["retention"])
                .is_some_and(|l| !l.ends_with(" 0")),
            "{text}"
        );
    }

    #[test]
    fn grpc_responses_carry_their_status_code_and_others_none() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let ep = HttpEndpointMetrics::new(metrics.clone(), web_labels());
        ep.response(200, Some(0), classify(200, Some(0)));
        ep.response(200, Some(14), classify(200, Some(14)));
        // A code gRPC does not define is read as UNKNOWN.
        ep.response(200, Some(99_999), classify(200, Some(99_999)));
        ep.response(200, None, classify(200, None));
        let text = scrape(&registry);
        let grpc = |code: &str| {
            sample(
                &text,
                "response_total",
                &[&format!("grpc_status_code=\"{code}\"")],
            )
            .unwrap_or_else(|| panic!("no response_total with grpc_status_code {code}:\n{text}"))
        };
        assert!(grpc("0").contains("classification=\"success\""));
        assert!(grpc("14").contains("classification=\"failure\""));
        assert!(grpc("2").ends_with(" 1"));
        assert!(grpc("").contains("classification=\"success\""), "{text}");
        assert!(!text.contains("99999"), "{text}");
    }

    #[test]
    fn workload_labels_are_exported_as_linkerd_names_them() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let mut labels = web_labels();
        let mut w = (*DstWorkload::none().0).clone();
        w.dst_deployment = Arc::from("web");
        w.dst_serviceaccount = Arc::from("web-sa");
        w.dst_pod_template_hash = Arc::from("5d8f9");
        labels.workload = DstWorkload(Arc::new(w));
        TcpMetrics::open(&metrics, Peer::dst, labels.clone(), TlsLabels::Disabled).close(true);
        HttpEndpointMetrics::new(metrics, labels).request();
        let text = scrape(&registry);
        for family in ["request_total", "tcp_open_total", "tcp_close_total"] {
            let line = sample(&text, family, &["web.shop"])
                .unwrap_or_else(|| panic!("no {family}:\n{text}"));
            for label in [
                "dst_deployment=\"web\"",
                "dst_serviceaccount=\"web-sa\"",
                "dst_pod_template_hash=\"5d8f9\"",
                "dst_statefulset=\"\"",
                "dst_daemonset=\"\"",
                "dst_replicaset=\"\"",
                "dst_k8s_job=\"\"",
            ] {
                assert!(line.contains(label), "{family} lacks {label}: {line}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_records_how_long_it_lived() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let tcp = TcpMetrics::open(&metrics, Peer::dst, web_labels(), TlsLabels::Disabled);
        tokio::time::advance(Duration::from_millis(1500)).await;
        tcp.close(false);
        let text = scrape(&registry);
        let count = sample(
            &text,
            "tcp_connection_duration_ms_count",
            &["peer=\"dst\"", "classification=\"failure\""],
        );
        assert!(count.is_some_and(|l| l.ends_with(" 1")), "{text}");
        let sum = sample(&text, "tcp_connection_duration_ms_sum", &["web.shop"]);
        assert!(sum.is_some_and(|l| l.ends_with(" 1500.0")), "{text}");
        let open = sample(&text, "tcp_open_connections", &["web.shop"]);
        assert!(open.is_some_and(|l| l.ends_with(" 0")), "{text}");
    }
}
