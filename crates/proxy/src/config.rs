//! Every setting of the proxy, with its default. Where Linkerd's proxy has the
//! same setting, the default is Linkerd's.

use ballast_backoff::BackoffConfig;
use std::{net::SocketAddr, time::Duration};

/// Linkerd's outbound listener.
pub const DEFAULT_OUTBOUND_ADDR: &str = "127.0.0.1:4140";
/// Linkerd's inbound listener.
pub const DEFAULT_INBOUND_ADDR: &str = "0.0.0.0:4143";
/// Linkerd's admin listener: every interface, so that kubelet's probes (to
/// the pod's IP) reach `/live` and `/ready`; off the host only those and
/// `/metrics` answer (`/shutdown` is loopback-only).
pub const DEFAULT_ADMIN_ADDR: &str = "0.0.0.0:4191";
/// Linkerd: 10 s to see enough bytes to tell HTTP from opaque TCP.
pub const DEFAULT_DETECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Linkerd: 1 s to connect to an outbound endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Linkerd: 100 ms .. 500 ms between connects to a failing endpoint.
pub const DEFAULT_CONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// See [`DEFAULT_CONNECT_BACKOFF_MIN`].
pub const DEFAULT_CONNECT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Linkerd: 3 s for an endpoint to become ready before a request fails.
pub const DEFAULT_HTTP_FAILFAST_TIMEOUT: Duration = Duration::from_secs(3);
/// Linkerd: 3 s for an endpoint to become ready before a connection fails.
pub const DEFAULT_TCP_FAILFAST_TIMEOUT: Duration = Duration::from_secs(3);
/// Linkerd: 10,000 requests (or connections) may wait for an endpoint per target.
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;
/// Linkerd: a target unused for 5 s loses its resolution (Kubernetes' DNS TTL).
pub const DEFAULT_DISCOVERY_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the last-known endpoints of a target stay usable while the
/// controller cannot confirm them.
pub const DEFAULT_STALE_ENDPOINTS_GRACE: Duration = Duration::from_secs(3600);
/// Linkerd: idle HTTP/1 connections to endpoints close after 3 s.
pub const DEFAULT_HTTP1_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Idle HTTP/1 connections kept per endpoint (Linkerd keeps any number).
pub const DEFAULT_HTTP1_POOL_MAX_IDLE: usize = 64;
/// First delay between attempts to reach the controller.
pub const DEFAULT_CONTROL_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest delay between attempts to reach the controller: at 10 s, 10,000
/// proxies of a cluster whose controller is gone make at most ~1,000
/// attempts a second between them (seed 002), and a returning controller
/// is found again within 10 s.
pub const DEFAULT_CONTROL_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Half of each control-plane delay is random, so that proxies that lost the
/// controller together do not come back together.
pub const DEFAULT_CONTROL_BACKOFF_JITTER: f64 = 0.5;
/// Largest message accepted from the controller (tonic's default, 4 MiB).
pub const DEFAULT_CONTROL_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Most endpoints kept for one target; further adds are dropped and counted.
pub const DEFAULT_MAX_ENDPOINTS_PER_TARGET: usize = 10_000;
/// Most targets resolved at once (services, pods and addresses together).
pub const DEFAULT_MAX_TARGETS: usize = 10_000;
/// Linkerd: how long a new connection waits for its first profile before it
/// is routed without one.
pub const DEFAULT_PROFILE_TIMEOUT: Duration = Duration::from_millis(500);
/// Most connections open at once on each listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Grace for in-flight work after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Largest HTTP/1 request or response head (request line and headers); a
/// larger one gets 431 (Envoy's default is 60 KiB).
pub const DEFAULT_HTTP1_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most headers in one HTTP/1 head (hyper's default).
pub const DEFAULT_HTTP1_MAX_HEADERS: usize = 100;
/// A request head must arrive whole within this time of the connection
/// being ready for it (slowloris); idle keep-alive connections close then
/// too (hyper's default).
pub const DEFAULT_HTTP1_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// An HTTP/1 client connection with no request for about this long (up to
/// twice it) gives back its HTTP state and waits for its next byte holding
/// only the socket: idle keep-alive connections cost about 1 KB, not 10.
pub const DEFAULT_HTTP1_PARK_AFTER: Duration = Duration::from_secs(1);
/// Concurrent streams a client may open on one HTTP/2 connection.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Largest decoded HTTP/2 header list.
pub const DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// Largest HTTP/2 frame accepted (the protocol's minimum and default).
pub const DEFAULT_HTTP2_MAX_FRAME_BYTES: u32 = 16 * 1024;
/// Linkerd: the protocol's default per-stream window.
pub const DEFAULT_HTTP2_INITIAL_STREAM_WINDOW_BYTES: u32 = 65_535;
/// Linkerd: 1 MiB per connection, about 16 streams at full window.
pub const DEFAULT_HTTP2_INITIAL_CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;
/// Bytes buffered for sending per HTTP/2 stream before the sender waits.
pub const DEFAULT_HTTP2_MAX_SEND_BUFFER_BYTES: usize = 64 * 1024;
/// Streams one HTTP/2 client connection may make the proxy reset for
/// protocol errors on a stream before it gets GOAWAY `ENHANCE_YOUR_CALM` and
/// is closed; refusals of up to one window of streams past
/// SETTINGS_MAX_CONCURRENT_STREAMS come on top (h2 counts both in one
/// budget: `ballast_meshtls::server::h2_local_reset_budget`). A well-behaved client causes none;
/// MadeYouReset (CVE-2025-8671) causes one per stream it opens, each costing
/// the proxy a stream's state and a request dispatch. hyper's default is
/// 1,024; 100 cuts an attacking connection ten times sooner and still
/// forgives a client with a few buggy streams.
pub const DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS: usize = 100;
/// Streams the client opened and then reset itself (Rapid Reset,
/// CVE-2023-44487) that may wait, at once, for the proxy to accept them
/// before the connection gets GOAWAY `ENHANCE_YOUR_CALM` (h2's default).
pub const DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// A client HTTP connection with no request for this long is closed.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// HTTP/1 connections open at once to one endpoint.
pub const DEFAULT_MAX_CONNECTIONS_PER_ENDPOINT: usize = 1_000;
/// Linkerd's default opaque ports: server-speaks-first protocols (SMTP,
/// MySQL, Galera, PostgreSQL, Redis, Elasticsearch, Memcached).
pub const DEFAULT_INBOUND_OPAQUE_PORTS: &str = "25,587,3306,4444,5432,6379,9300,11211";

/// Linkerd's tap port (its proxy's control listener), where `ballast inject`
/// puts the tap server.
pub const DEFAULT_TAP_PORT: u16 = 4190;
/// Taps open at once on one proxy; the next is refused with
/// `RESOURCE_EXHAUSTED`. A dashboard and a few `ballast tap` sessions.
pub const DEFAULT_TAP_MAX_TAPS: usize = 8;
/// Most requests one tap may ask for (its `limit`; a larger one is lowered
/// to this). Linkerd's viz asks for about 10 s of its `--max-rps`.
pub const DEFAULT_TAP_MAX_REQUESTS_PER_TAP: u32 = 10_000;
/// Events one tap may receive per second (a token bucket with a second's
/// burst); a request's three events are admitted or dropped together, so
/// about a third as many requests a second are shown.
pub const DEFAULT_TAP_MAX_EVENTS_PER_SECOND: u32 = 1_000;
/// Events waiting for one tap's client; past it events are dropped and
/// counted, never waited for.
pub const DEFAULT_TAP_QUEUE_CAPACITY: usize = 1_024;
/// The size bound of one event's variable parts: authority and path get a
/// quarter of it each, extracted headers the rest (values cut, headers past
/// it left out).
pub const DEFAULT_TAP_MAX_EVENT_BYTES: usize = 2_048;
/// Connections open at once on the tap listener; more are closed at accept.
pub const DEFAULT_TAP_MAX_CONNECTIONS: usize = 16;
/// The tap listener's HTTP/2 limits: streams per connection (a tap is one),
/// decoded header list, client-reset streams awaiting accept.
pub const DEFAULT_TAP_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 16;
pub const DEFAULT_TAP_HTTP2_MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
pub const DEFAULT_TAP_HTTP2_MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Linkerd's TLS handshake bound, on the tap listener too.
pub const DEFAULT_TAP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `ObserveRequest` read (a match tree is small).
pub const DEFAULT_TAP_MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The Tap API (`io.linkerd.proxy.tap.Tap/Observe`): who may use it and
/// what bounds each tap.
#[derive(Clone, Debug)]
pub struct TapConfig {
    /// With the proxy's identity on, the only client identity served;
    /// others get `UNAUTHENTICATED` (as from Linkerd's proxy). `None` with identity off (plaintext,
    /// everyone served).
    pub client_identity: Option<ballast_meshtls::IdentityName>,
    pub max_taps: usize,
    pub max_requests_per_tap: u32,
    pub max_events_per_second: u32,
    pub queue_capacity: usize,
    pub max_event_bytes: usize,
    pub max_connections: usize,
    /// A TLS handshake (and, in plaintext, the first byte) must come within this.
    pub handshake_timeout: Duration,
    pub h2_max_concurrent_streams: u32,
    pub h2_max_header_list_bytes: u32,
    pub h2_max_pending_accept_resets: usize,
    pub max_request_bytes: usize,
}

impl Default for TapConfig {
    fn default() -> Self {
        Self {
            client_identity: None,
            max_taps: DEFAULT_TAP_MAX_TAPS,
            max_requests_per_tap: DEFAULT_TAP_MAX_REQUESTS_PER_TAP,
            max_events_per_second: DEFAULT_TAP_MAX_EVENTS_PER_SECOND,
            queue_capacity: DEFAULT_TAP_QUEUE_CAPACITY,
            max_event_bytes: DEFAULT_TAP_MAX_EVENT_BYTES,
            max_connections: DEFAULT_TAP_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_TAP_HANDSHAKE_TIMEOUT,
            h2_max_concurrent_streams: DEFAULT_TAP_HTTP2_MAX_CONCURRENT_STREAMS,
            h2_max_header_list_bytes: DEFAULT_TAP_HTTP2_MAX_HEADER_LIST_BYTES,
            h2_max_pending_accept_resets: DEFAULT_TAP_HTTP2_MAX_PENDING_ACCEPT_RESETS,
            max_request_bytes: DEFAULT_TAP_MAX_REQUEST_BYTES,
        }
    }
}

/// How the proxy reaches the destination controller.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// `host:port` of the controller's gRPC server.
    pub addr: String,
    /// Connect timeout for one attempt.
    pub connect_timeout: Duration,
    /// Schedule of attempts while the controller is unreachable; reset by the
    /// first message received.
    pub backoff: BackoffConfig,
    /// Largest decoded message from the controller.
    pub max_message_bytes: usize,
    /// Wait for a first profile before routing without one.
    pub profile_timeout: Duration,
    /// Context token sent with every request (Linkerd's
    /// `LINKERD2_PROXY_DESTINATION_CONTEXT`): JSON naming this pod's namespace.
    pub context_token: String,
    /// TLS to the controller, verifying it as this identity; `None` dials
    /// plaintext (identity disabled, or a loopback controller).
    pub tls: Option<ControlTls>,
}

/// How the controller connection is secured.
#[derive(Clone, Debug)]
pub struct ControlTls {
    pub config: std::sync::Arc<rustls::ClientConfig>,
    pub server_name: ballast_meshtls::IdentityName,
}

/// Settings of the outbound side.
#[derive(Clone, Debug)]
pub struct OutboundConfig {
    pub addr: SocketAddr,
    /// Explicit opaque TCP routes: a listener address and the authority its
    /// connections go to.
    pub tcp_routes: Vec<(SocketAddr, String)>,
    pub cluster_domain: String,
    pub max_endpoints_per_target: usize,
    /// Last-known endpoints of targets not in use are kept this long.
    pub stale_endpoints_grace: Duration,
    pub max_connections: usize,
}

/// How both sides detect protocols and reach endpoints: connects, failfast,
/// queues, pools and the bound on targets.
#[derive(Clone, Debug)]
pub struct TrafficConfig {
    pub detect_timeout: Duration,
    pub connect_timeout: Duration,
    pub connect_backoff: BackoffConfig,
    pub http_failfast_timeout: Duration,
    pub tcp_failfast_timeout: Duration,
    pub queue_capacity: usize,
    pub discovery_idle_timeout: Duration,
    pub http1_pool_idle_timeout: Duration,
    pub http1_pool_max_idle: usize,
    pub max_targets: usize,
}

/// What owns the pod, as Linkerd's `dst_*` workload labels name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
}

impl std::str::FromStr for OwnerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "deployment" => Self::Deployment,
            "statefulset" => Self::StatefulSet,
            "daemonset" => Self::DaemonSet,
            "replicaset" => Self::ReplicaSet,
            "job" => Self::Job,
            _ => {
                return Err(format!(
                    "{s:?} is not a workload kind (deployment, statefulset, daemonset, replicaset or job)"
                ))
            }
        })
    }
}

/// The pod this proxy runs in. Inbound traffic is traffic to this pod, so
/// its series carry the pod's own namespace, name and workload in the
/// `dst_*` labels (empty when not given).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    pub owner: Option<(OwnerKind, String)>,
    pub pod_template_hash: String,
}

/// Settings of the inbound side. Detection, connect, failfast, queue and
/// pool settings are the outbound side's.
#[derive(Clone, Debug)]
pub struct InboundConfig {
    pub addr: SocketAddr,
    /// Workload port for connections that were not redirected (no original
    /// destination); `None` refuses them.
    pub forward_port: Option<u16>,
    /// Ports forwarded as TCP without protocol detection.
    pub opaque_ports: Vec<u16>,
    pub max_connections: usize,
    /// Names this pod in inbound metrics.
    pub pod: PodIdentity,
    /// The policy of a port the controller has not answered for (within
    /// the profile timeout) or refused.
    pub default_policy: DefaultInboundPolicy,
    /// What `cluster-*` default policies admit.
    pub cluster_networks: Vec<crate::network::IpNetwork>,
}

/// Linkerd's default inbound policies: who may connect to a port the
/// controller has said nothing of. `audit` allows everyone and counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DefaultInboundPolicy {
    #[default]
    AllUnauthenticated,
    AllAuthenticated,
    ClusterUnauthenticated,
    ClusterAuthenticated,
    Deny,
    Audit,
}

impl DefaultInboundPolicy {
    /// Linkerd's name of the policy (also its `srv_name` and `authz_name`).
    pub fn name(self) -> &'static str {
        match self {
            Self::AllUnauthenticated => "all-unauthenticated",
            Self::AllAuthenticated => "all-authenticated",
            Self::ClusterUnauthenticated => "cluster-unauthenticated",
            Self::ClusterAuthenticated => "cluster-authenticated",
            Self::Deny => "deny",
            Self::Audit => "audit",
        }
    }
}

impl std::str::FromStr for DefaultInboundPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "all-unauthenticated" => Self::AllUnauthenticated,
            "all-authenticated" => Self::AllAuthenticated,
            "cluster-unauthenticated" => Self::ClusterUnauthenticated,
            "cluster-authenticated" => Self::ClusterAuthenticated,
            "deny" => Self::Deny,
            "audit" => Self::Audit,
            _ => {
                return Err(format!(
                    "{s:?} is not a default policy (all-unauthenticated, all-authenticated, \
                     cluster-unauthenticated, cluster-authenticated, deny or audit)"
                ))
            }
        })
    }
}

/// Limits on every HTTP connection the proxy serves or opens.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub h1_max_header_bytes: usize,
    pub h1_max_headers: usize,
    pub h1_header_read_timeout: Duration,
    /// An idle HTTP/1 client connection is parked after about this long.
    pub h1_park_after: Duration,
    pub h2_max_concurrent_streams: u32,
    pub h2_max_header_list_bytes: u32,
    pub h2_max_frame_bytes: u32,
    pub h2_initial_stream_window_bytes: u32,
    pub h2_initial_connection_window_bytes: u32,
    pub h2_max_send_buffer_bytes: usize,
    /// Streams a client connection may make the proxy reset for protocol
    /// errors, then GOAWAY (refusals of one window past the limit on top).
    pub h2_max_local_error_resets: usize,
    /// Client-reset streams waiting to be accepted, then GOAWAY.
    pub h2_max_pending_accept_resets: usize,
    /// Client connections with no request for this long are closed.
    pub idle_timeout: Duration,
    /// HTTP/1 connections open at once to one endpoint.
    pub max_connections_per_endpoint: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            h1_max_header_bytes: DEFAULT_HTTP1_MAX_HEADER_BYTES,
            h1_max_headers: DEFAULT_HTTP1_MAX_HEADERS,
            h1_header_read_timeout: DEFAULT_HTTP1_HEADER_READ_TIMEOUT,
            h1_park_after: DEFAULT_HTTP1_PARK_AFTER,
            h2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            h2_max_header_list_bytes: DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES,
            h2_max_frame_bytes: DEFAULT_HTTP2_MAX_FRAME_BYTES,
            h2_initial_stream_window_bytes: DEFAULT_HTTP2_INITIAL_STREAM_WINDOW_BYTES,
            h2_initial_connection_window_bytes: DEFAULT_HTTP2_INITIAL_CONNECTION_WINDOW_BYTES,
            h2_max_send_buffer_bytes: DEFAULT_HTTP2_MAX_SEND_BUFFER_BYTES,
            h2_max_local_error_resets: DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS,
            h2_max_pending_accept_resets: DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS,
            idle_timeout: DEFAULT_HTTP_IDLE_TIMEOUT,
            max_connections_per_endpoint: DEFAULT_MAX_CONNECTIONS_PER_ENDPOINT,
        }
    }
}

/// Everything the proxy needs to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub control: ControlConfig,
    pub traffic: TrafficConfig,
    pub outbound: OutboundConfig,
    pub inbound: InboundConfig,
    pub http: HttpLimits,
    /// Allocated bytes at which new connections and requests are shed.
    pub memory_limit: Option<u64>,
    pub admin_addr: SocketAddr,
    pub shutdown_grace: Duration,
    /// This proxy's mesh identity and TLS; `None` runs without identity
    /// (plaintext everywhere, `tls="disabled"`).
    pub mesh: Option<std::sync::Arc<crate::identity::MeshTls>>,
    /// The Tap API's settings; `None` without a tap listener.
    pub tap: Option<TapConfig>,
    /// The snapshot's book, read at start (`--snapshot-path`); `None`
    /// keeps no snapshot.
    pub snapshot: Option<std::sync::Arc<crate::discovery::snapshot::Book>>,
}

/// Parses a comma-separated port list (`25,587,6379`); empty is none.
pub fn parse_ports(s: &str) -> Result<Vec<u16>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
        })
        .collect()
}

/// The backoff of endpoint connects: Linkerd's 100 ms .. 500 ms, 10% jitter.
pub fn default_connect_backoff() -> BackoffConfig {
    BackoffConfig {
        initial: DEFAULT_CONNECT_BACKOFF_MIN,
        max: DEFAULT_CONNECT_BACKOFF_MAX,
        factor: 2.0,
        jitter: 0.1,
        reset_after: Duration::from_secs(60),
    }
}

/// The backoff of control-plane connects.
pub fn default_control_backoff() -> BackoffConfig {
    BackoffConfig {
        initial: DEFAULT_CONTROL_BACKOFF_MIN,
        max: DEFAULT_CONTROL_BACKOFF_MAX,
        factor: 2.0,
        jitter: DEFAULT_CONTROL_BACKOFF_JITTER,
        reset_after: Duration::from_secs(120),
    }
}

/// Traffic metric defaults: a series nobody uses stays exported for 10
/// minutes; each family holds at most 10,000 series (see `metrics`).
pub use crate::metrics::{
    DEFAULT_MAX_SERIES as DEFAULT_METRICS_MAX_SERIES,
    DEFAULT_RETENTION as DEFAULT_METRICS_RETENTION,
};
