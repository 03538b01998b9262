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
pub struct BalancerLabels {
    pub authority: Arc<str>,
    /// `http` or `tcp`: one authority may have a balancer of each.
    pub protocol: &'static str,
    pub endpoint_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeriesDropLabels {
    /// `retention` or `limit`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: &'static str,
    /// `max_connections` or `memory_limit`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    /// `connection` or `request`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub rpc: &'static str,
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
    /// Endpoints per target and protocol, `ready` or `pending` (in connect
    /// backoff); balancers add and take back their own counts
    /// ([`BalancerGauges`]).
    pub balancer_endpoints: RetainedFamily<BalancerLabels, Gauge>,
    /// Targets currently in failfast.
    pub balancer_failfast: Gauge,
    /// Endpoints taken out of their balancer by failure accrual.
    pub balancer_endpoint_penalties_total: Counter,
    /// Open resolutions (one per target in use or recently used).
    pub resolutions: Gauge,
    /// Endpoints dropped because a target exceeded its bound.
    pub endpoints_dropped_total: Counter,
    /// Age of the oldest endpoint data in use that the controller has not
    /// confirmed (0 while it is connected).
    pub discovery_stale_seconds: Gauge,
    /// 1 while the control-plane connection is up, else 0.
    pub control_connected: Gauge,
    /// TCP connects attempted to the controller.
    pub control_connect_attempts_total: Counter,
    /// Open streams to the controller, by RPC.
    pub control_streams: Family<StreamLabels, Gauge>,
    /// Streams to the controller that ended with an error, by RPC.
    pub control_stream_errors_total: Family<StreamLabels, Counter>,
    /// Messages received from the controller, by RPC.
    pub control_messages_total: Family<StreamLabels, Counter>,
    /// Messages from the controller refused for exceeding
    /// `--control-max-message-bytes`, by RPC.
    pub control_messages_too_large_total: Family<StreamLabels, Counter>,
    /// Connections open on each listener.
    pub listener_connections: Family<ListenerLabels, Gauge>,
    /// Connections closed at accept, by listener and reason.
    pub listener_refused_total: Family<RefusedLabels, Counter>,
    /// Accept errors (EMFILE and the like); each pauses accepting.
    pub listener_accept_errors_total: Family<ListenerLabels, Counter>,
    /// Connections and requests refused because memory was at the limit.
    pub memory_shed_total: Family<ShedLabels, Counter>,
    /// The memory limit (0 when there is none).
    pub memory_limit_bytes: Gauge,
    /// 1 while allocated memory is at or over the limit.
    pub memory_shedding: Gauge,
    /// Client HTTP connections closed for being idle.
    pub http_idle_closed_total: Counter,
    /// Idle HTTP/1 client connections holding only their socket.
    pub http1_parked_connections: Gauge,
    /// Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (too
    /// many streams reset by the proxy or by the client, and h2's other
    /// abuse limits).
    pub http2_calm_closed_total: Counter,
    /// Client HTTP/1 connections closed at a malformed chunked body
    /// (`http::framing`), their request answered 400.
    pub http1_framing_refused_total: Counter,
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
            balancer_endpoints: RetainedFamily::new(l, d.clone(), Gauge::default),
            balancer_failfast: Gauge::default(),
            balancer_endpoint_penalties_total: Counter::default(),
            resolutions: Gauge::default(),
            endpoints_dropped_total: Counter::default(),
            discovery_stale_seconds: Gauge::default(),
            control_connected: Gauge::default(),
            control_connect_attempts_total: Counter::default(),
            control_streams: Family::default(),
            control_stream_errors_total: Family::default(),
            control_messages_total: Family::default(),
            control_messages_too_large_total: Family::default(),
            listener_connections: Family::default(),
            listener_refused_total: Family::default(),
            listener_accept_errors_total: Family::default(),
            memory_shed_total: Family::default(),
            memory_limit_bytes: Gauge::default(),
            memory_shedding: Gauge::default(),
            http_idle_closed_total: Counter::default(),
            http1_parked_connections: Gauge::default(),
            http2_calm_closed_total: Counter::default(),
            http1_framing_refused_total: Counter::default(),
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
        r.register(
            "balancer_endpoints",
            "Endpoints per target and protocol, ready or pending (in connect backoff)",
            m.balancer_endpoints.clone(),
        );
        r.register(
            "balancer_failfast",
            "Targets in failfast: no endpoint became ready within the failfast timeout",
            m.balancer_failfast.clone(),
        );
        r.register(
            "balancer_endpoint_penalties",
            "Endpoints taken out of their balancer for a penalty by failure accrual (the controller's balancer.linkerd.io/failure-accrual)",
            m.balancer_endpoint_penalties_total.clone(),
        );
        r.register(
            "discovery_resolutions",
            "Open resolutions (targets in use or recently used)",
            m.resolutions.clone(),
        );
        r.register(
            "discovery_endpoints_dropped",
            "Endpoints dropped because a target exceeded --max-endpoints-per-target",
            m.endpoints_dropped_total.clone(),
        );
        r.register(
            "discovery_stale_seconds",
            "Age of the oldest endpoint data in use that the destination controller has not confirmed (0 while it is connected); kept at most --stale-endpoints-grace",
            m.discovery_stale_seconds.clone(),
        );
        r.register(
            "control_connected",
            "1 while the connection to the destination controller is up",
            m.control_connected.clone(),
        );
        r.register(
            "control_connect_attempts",
            "TCP connects attempted to the destination controller",
            m.control_connect_attempts_total.clone(),
        );
        r.register(
            "control_streams",
            "Open streams to the destination controller",
            m.control_streams.clone(),
        );
        r.register(
            "control_stream_errors",
            "Streams to the destination controller that failed",
            m.control_stream_errors_total.clone(),
        );
        r.register(
            "control_messages",
            "Messages received from the destination controller",
            m.control_messages_total.clone(),
        );
        r.register(
            "control_messages_too_large",
            "Messages from the destination controller refused for exceeding --control-max-message-bytes",
            m.control_messages_too_large_total.clone(),
        );
        r.register(
            "listener_connections",
            "Connections open per listener",
            m.listener_connections.clone(),
        );
        r.register(
            "listener_refused",
            "Connections closed at accept: the listener was at --max-connections, or memory at --memory-limit",
            m.listener_refused_total.clone(),
        );
        r.register(
            "listener_accept_errors",
            "Accept errors (such as running out of file descriptors); each pauses accepting briefly",
            m.listener_accept_errors_total.clone(),
        );
        r.register(
            "memory_shed",
            "Connections and requests refused because allocated memory was at --memory-limit",
            m.memory_shed_total.clone(),
        );
        r.register(
            "memory_limit_bytes",
            "The --memory-limit (0: none)",
            m.memory_limit_bytes.clone(),
        );
        r.register(
            "memory_shedding",
            "1 while allocated memory is at or over --memory-limit",
            m.memory_shedding.clone(),
        );
        r.register(
            "http_idle_closed",
            "Client HTTP connections closed after --http-idle-timeout without a request",
            m.http_idle_closed_total.clone(),
        );
        r.register(
            "http1_parked_connections",
            "Idle HTTP/1 client connections that gave back their HTTP state after \
             --http1-park-after and hold only their socket",
            m.http1_parked_connections.clone(),
        );
        r.register(
            "http2_calm_closed",
            "Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (e.g. past \
             --http2-max-local-error-resets or --http2-max-pending-accept-resets)",
            m.http2_calm_closed_total.clone(),
        );
        r.register(
            "http1_framing_refused",
            "Client HTTP/1 connections closed at a malformed chunk line or trailer, their \
             request answered 400 malformed_chunk (RFC 9112 section 7.1)",
            m.http1_framing_refused_total.clone(),
        );
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
        self.balancer_endpoints.sweep(now);
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
    /// Shared with [`Metrics::balancer_endpoint_penalties_total`].
    pub penalties: Counter,
}

/// What one balancer has added to the gauges.
#[derive(Debug, Default)]
struct Share {
    ready: i64,
    pending: i64,
}

impl BalancerGauges {
    pub fn new(metrics: &Metrics, authority: Arc<str>, protocol: BalancerProtocol) -> Self {
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

    fn gauge(metrics: &Metrics, protocol: &'static str, endpoint_state: &'static str) -> i64 {
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
        let authority: Arc<str> = Arc::from("web.shop.svc.cluster.local:80");
        let http = BalancerGauges::new(&metrics, authority.clone(), BalancerProtocol::Http);
        let tcp = BalancerGauges::new(&metrics, authority.clone(), BalancerProtocol::Tcp);
        http.update(3, 0);
        tcp.update(2, 1);
        assert_eq!(gauge(&metrics, "http", "ready"), 3);
        assert_eq!(gauge(&metrics, "tcp", "ready"), 2);
        assert_eq!(gauge(&metrics, "tcp", "pending"), 1);

        // A second HTTP balancer of the same target (made while the first is
        // still held) adds to the same series.
        let http2 = BalancerGauges::new(&metrics, authority, BalancerProtocol::Http);
        http2.update(3, 0);
        http2.endpoint_pending();
        assert_eq!(gauge(&metrics, "http", "ready"), 5);
        assert_eq!(gauge(&metrics, "http", "pending"), 1);

        drop(http);
        assert_eq!(gauge(&metrics, "http", "ready"), 2);
        assert_eq!(gauge(&metrics, "http", "pending"), 1);
        assert_eq!(
            gauge(&metrics, "tcp", "ready"),
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
            assert_eq!(gauge(&metrics, protocol, state), 0, "{protocol} {state}");
        }
    }
}
