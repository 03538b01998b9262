//! The dashboard's and the CLI's JSON: what `GET /api/*` on the viz server
//! answers. One set of types, serialized by the server and read back by
//! `ballast stat` / `edges` / `routes` / `tap` / `top` and the browser.
//!
//! Times are Unix seconds (`u64`) or milliseconds (`f64` latencies). A figure
//! that cannot be known (no requests in the window) is `null`, never 0.

use serde::{Deserialize, Serialize};

/// The golden metrics of one thing over one window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Golden {
    /// Responses counted in the window.
    pub requests: u64,
    /// Of those, classified `success`.
    pub successes: u64,
    /// `requests` / window seconds.
    pub rps: f64,
    /// `successes` / `requests`; `null` with no requests.
    pub success_rate: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// One thing's history, oldest first, one point per scrape interval (the
/// series are the same length; `t` is each point's end).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Spark {
    pub t: Vec<u64>,
    pub rps: Vec<f64>,
    pub success_rate: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
}

/// A workload (or pod, service, namespace) by kind and name. `kind` is
/// Linkerd's lowercase: `namespace`, `deployment`, `statefulset`,
/// `daemonset`, `job`, `replicaset`, `pod`, `service`, `route`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceRef {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// One row of `GET /api/stat`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StatRow {
    pub resource: ResourceRef,
    /// Pods of this resource that have a proxy / that the index knows.
    pub meshed_pods: u32,
    pub total_pods: u32,
    /// Meshed pods whose last scrape failed (shown as such, not as zero traffic).
    pub unreachable_pods: u32,
    /// `inbound`: what the resource's own proxies served; `clients`: what
    /// meshed clients saw when calling it (it has no proxy that answered,
    /// or it is a service); `none`: no figures.
    pub source: String,
    pub golden: Golden,
    /// Open TCP connections into the resource (inbound), when known.
    pub tcp_connections: Option<u64>,
    pub spark: Spark,
}

/// `GET /api/stat?kind=K[&namespace=NS][&name=N][&window=SECS]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StatResponse {
    pub kind: String,
    pub namespace: Option<String>,
    pub window_secs: u64,
    pub interval_secs: u64,
    pub generated_at: u64,
    pub rows: Vec<StatRow>,
}

/// Traffic from one workload to another, as the source's outbound proxies
/// counted it (`dst_*` labels).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Edge {
    pub src: ResourceRef,
    pub dst: ResourceRef,
    /// The server identity the source's proxy verified (outbound `server_id`),
    /// when the connections were mutual TLS.
    pub server_id: Option<String>,
    /// Every connection on this edge in the window was mutual TLS.
    pub mtls: bool,
    /// Why not, when not (`no_identity: not_provided_by_service_discovery`,
    /// `disabled`, `opaque`, `mixed`); empty when `mtls`.
    pub no_tls_reason: String,
    pub golden: Golden,
}

/// `GET /api/edges?kind=K[&namespace=NS]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EdgesResponse {
    pub kind: String,
    pub namespace: Option<String>,
    pub generated_at: u64,
    pub edges: Vec<Edge>,
}

/// One route's golden metrics, from the clients' outbound route metrics
/// (`outbound_{http,grpc}_route_*`), summed over every meshed client.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct RouteRow {
    /// The route resource (`kind` `HTTPRoute`, `GRPCRoute`, or `default`
    /// for the proxy's default route), its namespace and name.
    pub route: ResourceRef,
    /// The parent (a Service): `svc/NAME` with its namespace, and the port.
    pub parent: ResourceRef,
    pub parent_port: Option<u16>,
    pub golden: Golden,
    pub spark: Spark,
}

/// `GET /api/routes[?target=svc/NAME][&namespace=NS]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct RoutesResponse {
    pub target: Option<String>,
    pub namespace: Option<String>,
    pub generated_at: u64,
    pub rows: Vec<RouteRow>,
}

/// One meshed pod as the collector sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodStatus {
    pub pod: ResourceRef,
    pub workload: Option<ResourceRef>,
    /// `IP:admin port` scraped.
    pub addr: String,
    /// `ok`, `unreachable` (last scrape failed), `pending` (not scraped yet).
    pub state: String,
    pub last_error: Option<String>,
    pub last_scrape_at: Option<u64>,
    pub consecutive_failures: u32,
    /// Seconds until the next attempt at a failing pod (its backoff).
    pub next_attempt_in_secs: Option<u64>,
}

/// `GET /api/pods[?namespace=NS]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodsResponse {
    pub generated_at: u64,
    pub pods: Vec<PodStatus>,
}

/// `GET /api/workload?kind=K&namespace=NS&name=N`: one workload's page.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct WorkloadResponse {
    pub generated_at: u64,
    pub stat: StatRow,
    /// Its pods (kind `pod`), each a row.
    pub pods: Vec<StatRow>,
    /// Edges into it (it is `dst`) and out of it (it is `src`).
    pub inbound: Vec<Edge>,
    pub outbound: Vec<Edge>,
    /// Routes of the services it serves (clients' view) and of those it calls.
    pub routes: Vec<RouteRow>,
}

/// How the collector is doing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CollectorStatus {
    /// `scrape` (proxies' /metrics) or `prometheus` (an existing server's
    /// /federate).
    pub source: String,
    pub interval_secs: u64,
    pub history_points: u32,
    pub pods_known: u32,
    pub pods_ok: u32,
    pub pods_unreachable: u32,
    /// How long the last complete scrape cycle took.
    pub last_cycle_ms: Option<f64>,
    pub last_cycle_at: Option<u64>,
}

/// `GET /api/overview`: the front page.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct OverviewResponse {
    pub generated_at: u64,
    pub collector: CollectorStatus,
    pub namespaces: Vec<StatRow>,
}

/// One request seen by a proxy's Tap, as `GET /api/tap` streams them (one
/// JSON object per line): the request's init, response init and end
/// combined, or what was seen of it when the stream ended.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TapEvent {
    /// The tapped pod (`namespace/name`) and that proxy's stream id.
    pub proxy: String,
    pub id: String,
    /// `inbound` or `outbound` at the tapped proxy.
    pub direction: String,
    pub source: String,
    pub source_identity: Option<String>,
    pub source_workload: Option<String>,
    pub destination: String,
    pub destination_identity: Option<String>,
    pub destination_workload: Option<String>,
    /// Whether the connection this request came or went on was mutual TLS.
    pub tls: bool,
    pub method: String,
    pub scheme: String,
    pub authority: String,
    pub path: String,
    pub status: Option<u16>,
    pub grpc_status: Option<u32>,
    /// Request start to response headers.
    pub latency_ms: Option<f64>,
    /// Request start to end of response.
    pub duration_ms: Option<f64>,
    pub response_bytes: Option<u64>,
    /// The proxy's reason when the request failed without a response, or the
    /// stream ended before this request did.
    pub error: Option<String>,
}

/// The first line of a `GET /api/tap` stream when a pod cannot be tapped,
/// and lines in between when events were dropped; a line is either this or
/// a [`TapEvent`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TapNotice {
    pub notice: String,
}
