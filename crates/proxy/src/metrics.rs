//! The proxy's metrics. Traffic metrics keep Linkerd's names and labels
//! (`request_total`, `response_total`, `response_latency_ms`, `tcp_*`), so
//! that Linkerd's dashboards read them; the rest describe the control plane
//! and the bounds.
//!
//! Cardinality is bounded: label sets name a target and an endpoint, and are
//! removed when the endpoint leaves its target's set or the target is
//! dropped.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::sync::{Arc, Mutex};

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

/// The destination of traffic: Linkerd's `authority` and `dst_*` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DstLabels {
    pub direction: Direction,
    pub authority: Arc<str>,
    pub dst_namespace: Arc<str>,
    pub dst_service: Arc<str>,
    pub dst_pod: Arc<str>,
}

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
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    #[prometheus(flatten)]
    pub dst: DstLabels,
    pub classification: &'static str,
    pub status_code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpLabels {
    pub peer: Peer,
    #[prometheus(flatten)]
    pub dst: DstLabels,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpCloseLabels {
    pub peer: Peer,
    #[prometheus(flatten)]
    pub dst: DstLabels,
    pub classification: &'static str,
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

/// One balancer's share of the `balancer_endpoints` gauges: it adds and
/// takes away its own endpoints, so that balancers sharing a series never
/// overwrite each other.
#[derive(Debug)]
pub struct BalancerGauges {
    ready: Gauge,
    pending: Gauge,
}

impl BalancerGauges {
    pub fn new(metrics: &Metrics, authority: Arc<str>, protocol: &'static str) -> Self {
        let gauge = |endpoint_state| {
            metrics
                .balancer_endpoints
                .get_or_create_owned(&BalancerLabels {
                    authority: authority.clone(),
                    protocol,
                    endpoint_state,
                })
        };
        Self {
            ready: gauge("ready"),
            pending: gauge("pending"),
        }
    }

    fn of(&self, backing_off: bool) -> &Gauge {
        if backing_off {
            &self.pending
        } else {
            &self.ready
        }
    }

    /// An endpoint joined the set.
    pub fn joined(&self, backing_off: bool) {
        self.of(backing_off).inc();
    }

    /// An endpoint left the set.
    pub fn left(&self, backing_off: bool) {
        self.of(backing_off).dec();
    }

    /// An endpoint in the set failed to connect.
    pub fn became_pending(&self) {
        self.ready.dec();
        self.pending.inc();
    }

    /// An endpoint in the set connected again.
    pub fn became_ready(&self) {
        self.pending.dec();
        self.ready.inc();
    }
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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_MS)
}

/// All of the proxy's metric families.
#[derive(Debug)]
pub struct Metrics {
    pub request_total: Family<DstLabels, Counter>,
    pub response_total: Family<ResponseLabels, Counter>,
    pub response_latency_ms: HistogramFamily<DstLabels>,
    pub tcp_open_total: Family<TcpLabels, Counter>,
    pub tcp_open_connections: Family<TcpLabels, Gauge>,
    pub tcp_read_bytes_total: Family<TcpLabels, Counter>,
    pub tcp_write_bytes_total: Family<TcpLabels, Counter>,
    pub tcp_close_total: Family<TcpCloseLabels, Counter>,
    /// Proxy-made failures by reason: `failfast`, `queue_full`, `loop`, ...
    pub errors_total: Family<ErrorLabels, Counter>,
    /// Endpoints per target, `ready` or `pending` (in connect backoff).
    pub balancer_endpoints: Family<BalancerLabels, Gauge>,
    /// Targets currently in failfast.
    pub balancer_failfast: Gauge,
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
    /// Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (too
    /// many streams reset by the proxy or by the client, and h2's other
    /// abuse limits).
    pub http2_calm_closed_total: Counter,
}

impl Metrics {
    /// Creates the families and registers them.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Self {
            request_total: Family::default(),
            response_total: Family::default(),
            response_latency_ms: Family::new_with_constructor(latency_histogram),
            tcp_open_total: Family::default(),
            tcp_open_connections: Family::default(),
            tcp_read_bytes_total: Family::default(),
            tcp_write_bytes_total: Family::default(),
            tcp_close_total: Family::default(),
            errors_total: Family::default(),
            balancer_endpoints: Family::default(),
            balancer_failfast: Gauge::default(),
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
            http2_calm_closed_total: Counter::default(),
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
            "proxy_errors",
            "Requests and connections failed by the proxy itself, by reason",
            m.errors_total.clone(),
        );
        r.register(
            "balancer_endpoints",
            "Endpoints per target, ready or pending (in connect backoff)",
            m.balancer_endpoints.clone(),
        );
        r.register(
            "balancer_failfast",
            "Targets in failfast: no endpoint became ready within the failfast timeout",
            m.balancer_failfast.clone(),
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
            "http2_calm_closed",
            "Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (e.g. past \
             --http2-max-local-error-resets or --http2-max-pending-accept-resets)",
            m.http2_calm_closed_total.clone(),
        );
        Arc::new(m)
    }

    /// Counts a failure made by the proxy.
    pub fn error(&self, direction: Direction, error: &'static str) {
        self.errors_total
            .get_or_create(&ErrorLabels { direction, error })
            .inc();
    }
}

/// The per-request metric handles of one endpoint of one target, looked up
/// once so that a request costs a few atomic adds. Dropping it removes its
/// label sets.
#[derive(Debug)]
pub struct HttpEndpointMetrics {
    metrics: Arc<Metrics>,
    labels: DstLabels,
    requests: Counter,
    latency: Histogram,
    ok: Counter,
    statuses: Mutex<Vec<(u16, &'static str)>>,
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
        let requests = metrics.request_total.get_or_create_owned(&labels);
        let latency = metrics.response_latency_ms.get_or_create_owned(&labels);
        let ok = metrics.response_total.get_or_create_owned(&ResponseLabels {
            dst: labels.clone(),
            classification: "success",
            status_code: 200,
        });
        Self {
            metrics,
            labels,
            requests,
            latency,
            ok,
            statuses: Mutex::new(vec![(200, "success")]),
        }
    }

    pub fn labels(&self) -> &DstLabels {
        &self.labels
    }

    pub fn request(&self) {
        self.requests.inc();
    }

    pub fn latency(&self, elapsed: std::time::Duration) {
        self.latency.observe(elapsed.as_secs_f64() * 1000.0);
    }

    pub fn response(&self, status: u16, classification: &'static str) {
        if status == 200 && classification == "success" {
            self.ok.inc();
            return;
        }
        {
            let mut seen = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
            // Status codes are bounded (100..=999), and so is this list.
            if !seen.contains(&(status, classification)) {
                seen.push((status, classification));
            }
        }
        self.metrics
            .response_total
            .get_or_create(&ResponseLabels {
                dst: self.labels.clone(),
                classification,
                status_code: status,
            })
            .inc();
    }
}

impl Drop for HttpEndpointMetrics {
    fn drop(&mut self) {
        self.metrics.request_total.remove(&self.labels);
        self.metrics.response_latency_ms.remove(&self.labels);
        let seen = std::mem::take(self.statuses.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (status_code, classification) in seen {
            self.metrics.response_total.remove(&ResponseLabels {
                dst: self.labels.clone(),
                classification,
                status_code,
            });
        }
    }
}

/// The TCP metric handles of one connection side.
#[derive(Clone, Debug)]
pub struct TcpMetrics {
    metrics: Arc<Metrics>,
    labels: TcpLabels,
    pub read: Counter,
    pub write: Counter,
    open: Gauge,
}

impl TcpMetrics {
    /// Counts a connection opened and returns its handles.
    pub fn open(metrics: &Arc<Metrics>, peer: Peer, dst: DstLabels) -> Self {
        let labels = TcpLabels { peer, dst };
        metrics.tcp_open_total.get_or_create(&labels).inc();
        let open = metrics.tcp_open_connections.get_or_create_owned(&labels);
        open.inc();
        Self {
            read: metrics.tcp_read_bytes_total.get_or_create_owned(&labels),
            write: metrics.tcp_write_bytes_total.get_or_create_owned(&labels),
            metrics: metrics.clone(),
            labels,
            open,
        }
    }

    /// Counts the connection closed.
    pub fn close(self, success: bool) {
        self.open.dec();
        self.metrics
            .tcp_close_total
            .get_or_create(&TcpCloseLabels {
                peer: self.labels.peer,
                dst: self.labels.dst.clone(),
                classification: if success { "success" } else { "failure" },
            })
            .inc();
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

    #[test]
    fn endpoint_label_sets_leave_with_the_endpoint() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let mut labels = DstLabels::unknown(Direction::outbound);
        labels.authority = Arc::from("web.shop.svc.cluster.local:80");
        let ep = HttpEndpointMetrics::new(metrics.clone(), labels.clone());
        ep.request();
        ep.response(503, "failure");
        ep.response(200, "success");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(text.contains("status_code=\"503\""), "{text}");
        drop(ep);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(!text.contains("web.shop"), "{text}");
    }
}
