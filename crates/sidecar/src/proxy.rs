//! `ballast proxy` (and `ballast-proxy`): flags, then wiring of listeners,
//! admin and the proxy.

use anyhow::Context;
use ballast_admin::{AdminServer, AdminState, Readiness, ShutdownRequest};
use ballast_backoff::BackoffConfig;
use ballast_certify as certify;
use ballast_flags::{
    bytes, count, dns_label, dns_name, dns_name_or_empty, fraction, host_port, BACKOFF, GIB, GRACE,
    KIB, MANY, MIB, TIMEOUT,
};
use ballast_meshtls::tls;
use ballast_proxy::config::{
    self as defaults, ControlConfig, HttpLimits, InboundConfig, OutboundConfig, OwnerKind,
    PodIdentity, TapConfig, TrafficConfig,
};
use clap::Args as ClapArgs;
use std::{net::SocketAddr, path::PathBuf, sync::atomic::AtomicBool, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "Routing: a connection redirected to the outbound listener by iptables goes \
where it was going (a service's cluster IP to the service's endpoints, a pod's IP to the pod, \
anything else unchanged); a connection made to the outbound listener directly is HTTP routed by \
each request's Host / :authority (NAME.NS[.svc[.CLUSTER_DOMAIN]][:PORT]). --outbound-tcp adds \
listeners that forward opaque TCP to a fixed authority.\n\
Inbound: a connection redirected to the inbound listener goes to 127.0.0.1 at its original \
port (--inbound-forward-port when it was not redirected), HTTP per request, else TCP.\n\
Bounds: every connection count, HTTP head, HTTP/2 window and buffer below has a limit; what \
is refused is counted on /metrics (listener_refused_total, proxy_errors_total, memory_shed_total).\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Address of the destination controller's gRPC server (HOST:PORT).
    #[arg(
        long,
        env = "BALLAST_PROXY_DESTINATION_ADDR",
        default_value = "ballast-dst-headless.ballast.svc.cluster.local:8086",
        value_parser = host_port
    )]
    destination_addr: String,

    /// Outbound listener: the workload's traffic to the mesh.
    #[arg(long, env = "BALLAST_PROXY_OUTBOUND_ADDR", default_value = defaults::DEFAULT_OUTBOUND_ADDR)]
    outbound_addr: SocketAddr,

    /// Inbound listener: traffic to the workload (forwarded to 127.0.0.1 at its original port).
    #[arg(long, env = "BALLAST_PROXY_INBOUND_ADDR", default_value = defaults::DEFAULT_INBOUND_ADDR)]
    inbound_addr: SocketAddr,

    /// Admin listener: /live, /ready, /metrics (and POST /shutdown). It listens on every
    /// interface, as Linkerd's, so kubelet's probes reach it; a client not on loopback gets
    /// only /live, /ready and /metrics (/shutdown answers 403, any other path 404).
    #[arg(long, env = "BALLAST_PROXY_ADMIN_ADDR", default_value = defaults::DEFAULT_ADMIN_ADDR)]
    admin_addr: SocketAddr,

    /// An extra listener forwarding opaque TCP to a service, as LISTEN=AUTHORITY
    /// (e.g. 127.0.0.1:5432=db.shop.svc.cluster.local:5432); repeatable, or
    /// comma-separated in the environment.
    #[arg(long, env = "BALLAST_PROXY_OUTBOUND_TCP", value_delimiter = ',', value_parser = parse_tcp_route)]
    outbound_tcp: Vec<(SocketAddr, String)>,

    /// Kubernetes cluster domain of service names.
    #[arg(
        long,
        env = "BALLAST_PROXY_CLUSTER_DOMAIN",
        default_value = "cluster.local",
        value_parser = dns_name
    )]
    cluster_domain: String,

    /// Namespace of this workload, sent to the controller as context and
    /// set as `dst_namespace` on inbound metrics.
    #[arg(long, env = "BALLAST_PROXY_POD_NAMESPACE", default_value = "default", value_parser = dns_label)]
    pod_namespace: String,

    /// This pod's name (downward API `metadata.name`): `dst_pod` on inbound
    /// metrics.
    #[arg(long, env = "BALLAST_PROXY_POD_NAME", default_value = "", value_parser = dns_name_or_empty)]
    pod_name: String,

    /// This pod's service account (downward API `spec.serviceAccountName`):
    /// `dst_serviceaccount` on inbound metrics.
    #[arg(long, env = "BALLAST_PROXY_POD_SERVICE_ACCOUNT", default_value = "", value_parser = dns_name_or_empty)]
    pod_service_account: String,

    /// What owns this pod, as KIND/NAME (deployment, statefulset, daemonset,
    /// replicaset or job; e.g. `deployment/web`): `dst_deployment` and the
    /// like on inbound metrics.
    #[arg(long, env = "BALLAST_PROXY_POD_OWNER", value_parser = parse_owner)]
    pod_owner: Option<(OwnerKind, String)>,

    /// This pod's `pod-template-hash` label (downward API
    /// `metadata.labels['pod-template-hash']`): `dst_pod_template_hash` on
    /// inbound metrics.
    #[arg(long, env = "BALLAST_PROXY_POD_TEMPLATE_HASH", default_value = "")]
    pod_template_hash: String,

    /// How long to wait for a client's first bytes to tell HTTP from opaque TCP.
    #[arg(long, env = "BALLAST_PROXY_DETECT_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    detect_timeout: Duration,

    /// Timeout of one connect to an endpoint.
    #[arg(long, env = "BALLAST_PROXY_CONNECT_TIMEOUT", default_value = "1s", value_parser = TIMEOUT)]
    connect_timeout: Duration,

    /// First delay before an endpoint whose connect failed is tried again.
    #[arg(long, env = "BALLAST_PROXY_CONNECT_BACKOFF_MIN", default_value = "100ms", value_parser = BACKOFF)]
    connect_backoff_min: Duration,

    /// Longest delay before an endpoint whose connects fail is tried again.
    #[arg(long, env = "BALLAST_PROXY_CONNECT_BACKOFF_MAX", default_value = "500ms", value_parser = BACKOFF)]
    connect_backoff_max: Duration,

    /// How long an HTTP request waits for a ready endpoint before a 503.
    #[arg(long, env = "BALLAST_PROXY_HTTP_FAILFAST_TIMEOUT", default_value = "3s", value_parser = TIMEOUT)]
    http_failfast_timeout: Duration,

    /// How long a TCP connection waits for a ready endpoint before it is closed.
    #[arg(long, env = "BALLAST_PROXY_TCP_FAILFAST_TIMEOUT", default_value = "3s", value_parser = TIMEOUT)]
    tcp_failfast_timeout: Duration,

    /// Requests (or connections) that may wait for an endpoint, per target;
    /// more get a 503 (or are closed) at once.
    #[arg(long, env = "BALLAST_PROXY_QUEUE_CAPACITY", default_value_t = defaults::DEFAULT_QUEUE_CAPACITY,
          value_parser = count(1, MANY))]
    queue_capacity: usize,

    /// A target unused this long loses its resolution and connections.
    #[arg(long, env = "BALLAST_PROXY_DISCOVERY_IDLE_TIMEOUT", default_value = "5s", value_parser = TIMEOUT)]
    discovery_idle_timeout: Duration,

    /// A traffic metric series (labelled by destination) unused this long is
    /// no longer exported; scrapers must come more often than this.
    #[arg(long, env = "BALLAST_PROXY_METRICS_RETENTION", default_value = "10m", value_parser = TIMEOUT)]
    metrics_retention: Duration,

    /// Most series per traffic metric family; past it, the longest-unused
    /// series is dropped (or a new one is not exported), and counted.
    #[arg(long, env = "BALLAST_PROXY_METRICS_MAX_SERIES", default_value_t = defaults::DEFAULT_METRICS_MAX_SERIES,
          value_parser = count(1, MANY))]
    metrics_max_series: usize,

    /// Idle HTTP/1 connections to an endpoint close after this long.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_POOL_IDLE_TIMEOUT", default_value = "3s", value_parser = TIMEOUT)]
    http1_pool_idle_timeout: Duration,

    /// Idle HTTP/1 connections kept per endpoint.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_POOL_MAX_IDLE", default_value_t = defaults::DEFAULT_HTTP1_POOL_MAX_IDLE,
          value_parser = count(0, 100_000))]
    http1_pool_max_idle: usize,

    /// Endpoints kept per target; the controller's further adds are dropped and counted.
    #[arg(long, env = "BALLAST_PROXY_MAX_ENDPOINTS_PER_TARGET", default_value_t = defaults::DEFAULT_MAX_ENDPOINTS_PER_TARGET,
          value_parser = count(1, MANY))]
    max_endpoints_per_target: usize,

    /// Targets (services, pods, addresses) resolved at once; also the most
    /// inbound ports whose policy is watched (inbound_policy_ports).
    #[arg(long, env = "BALLAST_PROXY_MAX_TARGETS", default_value_t = defaults::DEFAULT_MAX_TARGETS,
          value_parser = count(1, MANY))]
    max_targets: usize,

    /// How long the last-known endpoints of a target stay usable while the
    /// controller cannot confirm them: a target used again while the
    /// controller is away starts from them (see discovery_stale_seconds).
    #[arg(long, env = "BALLAST_PROXY_STALE_ENDPOINTS_GRACE", default_value = "60m", value_parser = TIMEOUT)]
    stale_endpoints_grace: Duration,

    /// Keep what the controller last said (endpoints with their identities,
    /// profiles, outbound and inbound policies) in this file, so a proxy
    /// restarted while the controller is away starts from it: each watch the
    /// file knows waits --snapshot-wait for the controller, then serves the
    /// file's answer until the controller's replaces it (see
    /// discovery_snapshot_serving and /ready). Entries older than
    /// --stale-endpoints-grace are neither written nor used; another pod's,
    /// damaged or cut-short files are ignored with one warning. Its directory
    /// must exist (injection mounts an emptyDir there). Off unless given.
    #[arg(long, env = "BALLAST_PROXY_SNAPSHOT_PATH")]
    snapshot_path: Option<PathBuf>,

    /// Changes are written to --snapshot-path at most this often (inbound
    /// policy changes are written before they take effect, at most every 100ms).
    #[arg(long, env = "BALLAST_PROXY_SNAPSHOT_INTERVAL", default_value = "5s", value_parser = BACKOFF)]
    snapshot_interval: Duration,

    /// How long a watch the snapshot knows waits for the controller's first
    /// answer before serving the snapshot's; at most --profile-timeout.
    #[arg(long, env = "BALLAST_PROXY_SNAPSHOT_WAIT", default_value = "250ms", value_parser = TIMEOUT)]
    snapshot_wait: Duration,

    /// The snapshot file's bound in bytes; entries past it are left out
    /// (inbound policies first kept, then outbound policies, profiles,
    /// endpoints, the newest first), counted in discovery_snapshot_left_out.
    #[arg(long, env = "BALLAST_PROXY_SNAPSHOT_MAX_BYTES", default_value = "8MiB",
          value_parser = bytes::<usize>(64 * KIB, 256 * MIB))]
    snapshot_max_bytes: usize,

    /// Connections open at once per listener; more are closed at accept.
    #[arg(long, env = "BALLAST_PROXY_MAX_CONNECTIONS", default_value_t = defaults::DEFAULT_MAX_CONNECTIONS,
          value_parser = count(1, MANY))]
    max_connections: usize,

    /// First delay between attempts to reach the controller.
    #[arg(long, env = "BALLAST_PROXY_CONTROL_BACKOFF_MIN", default_value = "100ms", value_parser = BACKOFF)]
    control_backoff_min: Duration,

    /// Longest delay between attempts to reach the controller.
    #[arg(long, env = "BALLAST_PROXY_CONTROL_BACKOFF_MAX", default_value = "10s", value_parser = BACKOFF)]
    control_backoff_max: Duration,

    /// Fraction of each control-plane delay that is random (0 to 1).
    #[arg(long, env = "BALLAST_PROXY_CONTROL_BACKOFF_JITTER", default_value_t = defaults::DEFAULT_CONTROL_BACKOFF_JITTER,
          value_parser = fraction)]
    control_backoff_jitter: f64,

    /// Largest message accepted from the controller, in bytes.
    #[arg(long, env = "BALLAST_PROXY_CONTROL_MAX_MESSAGE_BYTES", default_value_t = defaults::DEFAULT_CONTROL_MAX_MESSAGE_BYTES,
          value_parser = bytes::<usize>(16 * KIB, GIB))]
    control_max_message_bytes: usize,

    /// How long a new transparent connection waits for its profile before it
    /// is routed to its original destination without one; also how long an
    /// inbound port's first connections wait for its policy before
    /// --default-inbound-policy applies.
    #[arg(long, env = "BALLAST_PROXY_PROFILE_TIMEOUT", default_value = "500ms", value_parser = TIMEOUT)]
    profile_timeout: Duration,

    /// Worker threads (1: a single-threaded runtime, as a sidecar with one core).
    #[arg(long, env = "BALLAST_PROXY_WORKERS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,

    /// On SIGTERM, how long open connections get to finish before exit.
    #[arg(long, env = "BALLAST_PROXY_SHUTDOWN_GRACE", default_value = "30s", value_parser = GRACE)]
    shutdown_grace: Duration,

    /// Run without a mesh identity: no certificate, no mutual TLS, plaintext
    /// everywhere (local runs without `ballast identity`).
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_DISABLED")]
    identity_disabled: bool,

    /// The identity service (`ballast identity`), HOST:PORT; dialled in TLS
    /// as --identity-server-name unless it is a loopback address.
    #[arg(
        long,
        env = "BALLAST_PROXY_IDENTITY_ADDR",
        default_value = "ballast-identity-headless.ballast.svc.cluster.local:8080",
        value_parser = host_port
    )]
    identity_addr: String,

    /// The identity service's own identity (default: the `linkerd-identity`
    /// service account's, under --identity-controller-namespace and --identity-trust-domain).
    /// The service is dialled in TLS verifying this name, except at a loopback
    /// address when no name is given (as Linkerd does); an empty value dials it
    /// in plaintext.
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_SERVER_NAME", value_parser = dns_name_or_empty)]
    identity_server_name: Option<String>,

    /// The destination controller's identity (default: the `linkerd-destination`
    /// service account's). With identity enabled, the controller is dialled in
    /// TLS verifying this name, except at a loopback address when no name is given;
    /// an empty value dials it in plaintext.
    #[arg(long, env = "BALLAST_PROXY_DESTINATION_SERVER_NAME", value_parser = dns_name_or_empty)]
    destination_server_name: Option<String>,

    /// The trust anchors (PEM bundle) every mesh certificate must chain to.
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS")]
    identity_trust_anchors: Option<PathBuf>,

    /// The trust anchors given inline, as PEM text (what `ballast injector`
    /// sets, as Linkerd's LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS); instead of
    /// --identity-trust-anchors.
    #[arg(
        long,
        env = "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS_PEM",
        conflicts_with = "identity_trust_anchors",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    identity_trust_anchors_pem: Option<String>,

    /// This proxy's identity (default: --pod-service-account in --pod-namespace,
    /// SA.NS.serviceaccount.identity.CONTROLLER_NS.TRUST_DOMAIN).
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_LOCAL_NAME", value_parser = dns_name)]
    identity_local_name: Option<String>,

    /// The service-account token sent with each certificate request; re-read at each renewal.
    #[arg(
        long,
        env = "BALLAST_PROXY_IDENTITY_TOKEN_FILE",
        default_value = "/var/run/secrets/tokens/linkerd-identity-token"
    )]
    identity_token_file: PathBuf,

    /// The control plane's namespace, part of identity names.
    #[arg(
        long,
        env = "BALLAST_PROXY_IDENTITY_CONTROLLER_NAMESPACE",
        default_value = "linkerd",
        value_parser = dns_label
    )]
    identity_controller_namespace: String,

    /// The trust domain, the last part of identity names.
    #[arg(
        long,
        env = "BALLAST_PROXY_IDENTITY_TRUST_DOMAIN",
        default_value = "cluster.local",
        value_parser = dns_name
    )]
    identity_trust_domain: String,

    /// Renewals wait at least this long (Linkerd's default), even for a certificate about to expire.
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_MIN_REFRESH", default_value = "10s", value_parser = TIMEOUT)]
    identity_min_refresh: Duration,

    /// Renewals wait at most this long (Linkerd's default).
    #[arg(long, env = "BALLAST_PROXY_IDENTITY_MAX_REFRESH", default_value = "24h",
          value_parser = ballast_flags::duration(Duration::from_secs(1), Duration::from_secs(366 * 86_400)))]
    identity_max_refresh: Duration,

    /// A mesh TLS handshake must complete within this, or the connection is cut.
    #[arg(long, env = "BALLAST_PROXY_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    tls_handshake_timeout: Duration,

    /// Inbound TLS handshakes in progress at once; more connections are closed (tls_errors_total{error="shed"}).
    #[arg(long, env = "BALLAST_PROXY_MAX_TLS_HANDSHAKES", default_value_t = ballast_proxy::identity::DEFAULT_MAX_TLS_HANDSHAKES,
          value_parser = count(1, MANY))]
    max_tls_handshakes: usize,

    /// Workload port for inbound connections that were not redirected by
    /// iptables (runs without iptables: local runs, tests). Unset: such
    /// connections are refused.
    #[arg(long, env = "BALLAST_PROXY_INBOUND_FORWARD_PORT", value_parser = clap::value_parser!(u16).range(1..))]
    inbound_forward_port: Option<u16>,

    /// Inbound ports forwarded as TCP without protocol detection
    /// (server-speaks-first protocols), comma-separated; empty for none.
    #[arg(long, env = "BALLAST_PROXY_INBOUND_OPAQUE_PORTS", default_value = defaults::DEFAULT_INBOUND_OPAQUE_PORTS,
          value_parser = defaults::parse_ports)]
    inbound_opaque_ports: std::vec::Vec<u16>,

    /// Who may connect to an inbound port the controller has not given a
    /// policy for (within --profile-timeout of the port's first connection,
    /// or at all): all-unauthenticated, all-authenticated,
    /// cluster-unauthenticated, cluster-authenticated, deny, or audit (all
    /// allowed, counted as audit). A controller without the inbound policy
    /// API leaves every port open.
    #[arg(
        long,
        env = "BALLAST_PROXY_DEFAULT_INBOUND_POLICY",
        default_value = "all-unauthenticated"
    )]
    default_inbound_policy: defaults::DefaultInboundPolicy,

    /// The cluster's pod and node networks, comma-separated: whom the
    /// cluster-* default policies admit.
    #[arg(long, env = "BALLAST_PROXY_CLUSTER_NETWORKS", default_value = ballast_proxy::network::DEFAULT_CLUSTER_NETWORKS,
          value_parser = parse_networks)]
    cluster_networks: std::vec::Vec<ballast_proxy::network::IpNetwork>,

    /// Largest HTTP/1 head (request line or status line and headers), in
    /// bytes; a larger request gets 431 and the connection closes. Also
    /// bounds each connection's read buffer.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_MAX_HEADER_BYTES", default_value_t = defaults::DEFAULT_HTTP1_MAX_HEADER_BYTES,
          value_parser = bytes::<usize>(8 * KIB, 16 * MIB))]
    http1_max_header_bytes: usize,

    /// Most headers in one HTTP/1 head; more gets 431.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_MAX_HEADERS", default_value_t = defaults::DEFAULT_HTTP1_MAX_HEADERS,
          value_parser = count(1, 10_000))]
    http1_max_headers: usize,

    /// Time for a whole HTTP/1 request head to arrive once the connection is
    /// ready for one (new, or idle between requests); then it is closed.
    /// Cuts slowloris heads, and bounds keep-alive idle time.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = TIMEOUT)]
    http1_header_read_timeout: Duration,

    /// An HTTP/1 client connection with no request for about this long (up
    /// to twice it) frees its HTTP state (buffers of 16 KiB) and waits for
    /// the client's next byte holding only the socket.
    #[arg(long, env = "BALLAST_PROXY_HTTP1_PARK_AFTER", default_value = "1s", value_parser = TIMEOUT)]
    http1_park_after: Duration,

    /// Concurrent streams a client may open on one HTTP/2 connection.
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = defaults::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    http2_max_concurrent_streams: u32,

    /// Largest HTTP/2 header list (decoded), in bytes.
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_HEADER_LIST_BYTES", default_value_t = defaults::DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES,
          value_parser = bytes::<u32>(KIB, 16 * MIB))]
    http2_max_header_list_bytes: u32,

    /// Largest HTTP/2 frame accepted, in bytes (16384 to 16777215).
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_FRAME_BYTES", default_value_t = defaults::DEFAULT_HTTP2_MAX_FRAME_BYTES,
          value_parser = bytes::<u32>(16 * KIB, 16 * MIB - 1))]
    http2_max_frame_bytes: u32,

    /// HTTP/2 flow-control window per stream: bytes a peer may send on one
    /// stream before the proxy has passed them on.
    #[arg(long, env = "BALLAST_PROXY_HTTP2_INITIAL_STREAM_WINDOW_BYTES", default_value_t = defaults::DEFAULT_HTTP2_INITIAL_STREAM_WINDOW_BYTES,
          value_parser = bytes::<u32>(1, (1 << 31) - 1))]
    http2_initial_stream_window_bytes: u32,

    /// HTTP/2 flow-control window per connection (all streams together).
    #[arg(long, env = "BALLAST_PROXY_HTTP2_INITIAL_CONNECTION_WINDOW_BYTES", default_value_t = defaults::DEFAULT_HTTP2_INITIAL_CONNECTION_WINDOW_BYTES,
          value_parser = bytes::<u32>(65_535, (1 << 31) - 1))]
    http2_initial_connection_window_bytes: u32,

    /// Bytes buffered for sending per HTTP/2 stream; a peer that does not
    /// read makes the proxy wait, not buffer.
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_SEND_BUFFER_BYTES", default_value_t = defaults::DEFAULT_HTTP2_MAX_SEND_BUFFER_BYTES,
          value_parser = bytes::<usize>(KIB, 64 * MIB))]
    http2_max_send_buffer_bytes: usize,

    /// Streams one client HTTP/2 connection may make the proxy reset for
    /// stream protocol errors before it gets GOAWAY ENHANCE_YOUR_CALM and is
    /// closed (MadeYouReset, CVE-2025-8671). Streams refused past
    /// --http2-max-concurrent-streams come on top, up to twice that limit
    /// (a refused stream's body costs a second reset).
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_LOCAL_ERROR_RESETS", default_value_t = defaults::DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS,
          value_parser = count(1, MANY))]
    http2_max_local_error_resets: usize,

    /// Streams a client opened and reset itself that may wait at once to be
    /// accepted before its connection gets GOAWAY ENHANCE_YOUR_CALM (Rapid
    /// Reset, CVE-2023-44487).
    #[arg(long, env = "BALLAST_PROXY_HTTP2_MAX_PENDING_ACCEPT_RESETS", default_value_t = defaults::DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS,
          value_parser = count(1, MANY))]
    http2_max_pending_accept_resets: usize,

    /// A client HTTP/2 connection with no request for this long gets GOAWAY
    /// and closes (HTTP/1 is bounded by --http1-header-read-timeout).
    #[arg(long, env = "BALLAST_PROXY_HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = TIMEOUT)]
    http_idle_timeout: Duration,

    /// HTTP/1 connections open at once to one endpoint; a request that finds
    /// none free waits until its failfast deadline, then gets 503.
    #[arg(long, env = "BALLAST_PROXY_MAX_CONNECTIONS_PER_ENDPOINT", default_value_t = defaults::DEFAULT_MAX_CONNECTIONS_PER_ENDPOINT,
          value_parser = count(1, MANY))]
    max_connections_per_endpoint: usize,

    /// Allocated memory (bytes; K, M, G suffixes as powers of 1024) at which
    /// new connections are closed at accept and new requests get 503, until
    /// it falls back. 0: no limit.
    #[arg(long, env = "BALLAST_PROXY_MEMORY_LIMIT", default_value = "0", value_parser = bytes::<u64>(MIB, 1 << 40).or_zero())]
    memory_limit: u64,

    /// The Tap API (`io.linkerd.proxy.tap.Tap/Observe`; Linkerd's port is 4190): live
    /// requests for the dashboard and `ballast tap`. Off unless given. With identity on,
    /// the listener is mutual TLS with this proxy's certificate and serves only
    /// --tap-client-identity (others get UNAUTHENTICATED); without, plaintext.
    #[arg(long, env = "BALLAST_PROXY_TAP_ADDR")]
    tap_addr: Option<SocketAddr>,

    /// The one client identity that may tap this proxy (identity on). Default: the
    /// `ballast-viz` service account of namespace `ballast`
    /// (ballast-viz.ballast.serviceaccount.identity.CONTROLLER_NS.TRUST_DOMAIN).
    #[arg(long, env = "BALLAST_PROXY_TAP_CLIENT_IDENTITY", value_parser = dns_name)]
    tap_client_identity: Option<String>,

    /// Taps open at once; the next is refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "BALLAST_PROXY_TAP_MAX_TAPS", default_value_t = defaults::DEFAULT_TAP_MAX_TAPS,
          value_parser = count(1, 1_000))]
    tap_max_taps: usize,

    /// Most requests one tap observes; a tap asking for more (its `limit`) gets this many.
    #[arg(long, env = "BALLAST_PROXY_TAP_MAX_REQUESTS_PER_TAP", default_value_t = defaults::DEFAULT_TAP_MAX_REQUESTS_PER_TAP as usize,
          value_parser = count(1, MANY))]
    tap_max_requests_per_tap: usize,

    /// Events each tap may receive per second (a request is three events, admitted
    /// together); over it, requests go untapped and their events are counted as dropped.
    #[arg(long, env = "BALLAST_PROXY_TAP_MAX_EVENTS_PER_SECOND", default_value_t = defaults::DEFAULT_TAP_MAX_EVENTS_PER_SECOND as usize,
          value_parser = count(1, MANY))]
    tap_max_events_per_second: usize,

    /// Events queued for each tap's client; a client that does not read loses the
    /// rest (counted), the traffic never waits for it.
    #[arg(long, env = "BALLAST_PROXY_TAP_QUEUE_CAPACITY", default_value_t = defaults::DEFAULT_TAP_QUEUE_CAPACITY,
          value_parser = count(1, 65_536))]
    tap_queue_capacity: usize,

    /// The size bound of an event's variable parts, in bytes: authority and path are cut
    /// to a quarter of it each, extracted headers to the rest.
    #[arg(long, env = "BALLAST_PROXY_TAP_MAX_EVENT_BYTES", default_value_t = defaults::DEFAULT_TAP_MAX_EVENT_BYTES,
          value_parser = bytes::<usize>(256, MIB))]
    tap_max_event_bytes: usize,

    /// Connections open at once on the tap listener; more are closed at accept.
    #[arg(long, env = "BALLAST_PROXY_TAP_MAX_CONNECTIONS", default_value_t = defaults::DEFAULT_TAP_MAX_CONNECTIONS,
          value_parser = count(1, 10_000))]
    tap_max_connections: usize,
}

fn parse_tcp_route(s: &str) -> Result<(SocketAddr, String), String> {
    let (listen, authority) = s
        .split_once('=')
        .ok_or_else(|| format!("expected LISTEN=AUTHORITY, got {s:?}"))?;
    let listen = listen
        .trim()
        .parse()
        .map_err(|e| format!("listen address {listen:?}: {e}"))?;
    let authority = ballast_flags::host_port(authority.trim())
        .map_err(|e| format!("{e} (as NAME.NS.svc.CLUSTER_DOMAIN:PORT)"))?;
    Ok((listen, authority))
}

/// Runs the proxy on a runtime of its own size: one thread by default, as a
/// sidecar with one core.
pub fn run_blocking(args: Args) -> anyhow::Result<()> {
    args.check_pairs()?;
    let built = if args.workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.workers))
            .enable_all()
            .build()
    };
    let runtime = built.context("cannot start the async runtime")?;
    runtime.block_on(run(args))
}

impl Args {
    /// Pairs of flags that are each in range but must also agree.
    pub fn check_pairs(&self) -> Result<(), ballast_flags::UsageError> {
        ballast_flags::ordered(
            "--control-backoff-min",
            self.control_backoff_min,
            "--control-backoff-max",
            self.control_backoff_max,
        )?;
        ballast_flags::ordered(
            "--connect-backoff-min",
            self.connect_backoff_min,
            "--connect-backoff-max",
            self.connect_backoff_max,
        )?;
        if self.snapshot_path.is_none() {
            return Ok(());
        }
        ballast_flags::ordered(
            "--snapshot-wait",
            self.snapshot_wait,
            "--profile-timeout",
            self.profile_timeout,
        )
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let outbound = TcpListener::bind(args.outbound_addr)
        .await
        .with_context(|| format!("cannot listen on --outbound-addr {}", args.outbound_addr))?;
    let inbound = TcpListener::bind(args.inbound_addr)
        .await
        .with_context(|| format!("cannot listen on --inbound-addr {}", args.inbound_addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {}", args.admin_addr))?;
    let tap = match args.tap_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --tap-addr {addr}"))?,
        ),
        None => None,
    };
    let mut tcp_routes = Vec::new();
    for (addr, authority) in &args.outbound_tcp {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --outbound-tcp {addr}"))?;
        tracing::info!(
            "outbound TCP route listening on {} for {authority}",
            l.local_addr()?
        );
        tcp_routes.push((l, authority.clone()));
    }
    tracing::info!("outbound listening on {}", outbound.local_addr()?);
    tracing::info!("inbound listening on {}", inbound.local_addr()?);
    tracing::info!("admin listening on {}", admin.local_addr()?);
    if let Some(t) = &tap {
        tracing::info!("tap listening on {}", t.local_addr()?);
    }
    tracing::info!(destination = %args.destination_addr, "resolving through the destination controller");

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ballast_proxy::Metrics::register_with(
        &mut registry,
        ballast_proxy::metrics::SeriesLimits {
            retention: args.metrics_retention,
            max_series: args.metrics_max_series,
        },
    );
    ballast_admin::register_memory_metrics(&mut registry);
    ballast_admin::register_process_metrics(&mut registry);
    ballast_admin::register_build_info(&mut registry, "proxy", env!("CARGO_PKG_VERSION"));
    let _sampler = ballast_admin::spawn_memory_sampler();
    // What parsing flags and setting up freed goes back to the kernel now,
    // not when jemalloc next decays (it would wait for traffic).
    ballast_admin::release_unused_memory();
    let mesh = identity(&args, &mut registry)?;
    let snapshot = snapshot(&args, &metrics)?;
    let tap_config = tap_config(&args, mesh.is_some())?;
    let tap = tap.map(|listener| {
        let metrics = ballast_proxy::tap::TapMetrics::default();
        metrics.register(&mut registry);
        ballast_proxy::tap::TapListener { listener, metrics }
    });
    // Listeners are bound: the proxy is ready to take traffic, once it holds
    // a certificate when it has an identity.
    let ready = match &mesh {
        Some(m) => {
            let store = m.store.clone();
            Readiness::from_fn(move || store.is_ready())
        }
        None => Readiness::from_flag(Arc::new(AtomicBool::new(true))),
    };
    let ready = match &snapshot {
        Some(book) => {
            let book = book.clone();
            ready.with_detail(move || book.readiness_detail())
        }
        None => ready,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin_addr = admin.local_addr()?;
    // POST /shutdown (loopback only) stops the proxy as SIGTERM does: a Job's
    // workload can end its sidecar when it is done.
    let shutdown_request = ShutdownRequest::new();
    let admin_state =
        AdminState::new(Arc::new(registry), ready).with_shutdown(shutdown_request.clone());
    let mut admin_stop = stop_rx.clone();
    let admin_task = tokio::spawn(AdminServer::new(admin_state).serve(admin, async move {
        let _ = admin_stop.wait_for(|s| *s).await;
    }));

    let control_tls = control_tls(&args, mesh.as_ref())?;
    let config = ballast_proxy::Config {
        control: ControlConfig {
            tls: control_tls,
            addr: args.destination_addr,
            connect_timeout: args.connect_timeout,
            backoff: BackoffConfig {
                initial: args.control_backoff_min,
                max: args.control_backoff_max,
                jitter: args.control_backoff_jitter,
                ..defaults::default_control_backoff()
            },
            max_message_bytes: args.control_max_message_bytes,
            profile_timeout: args.profile_timeout,
            context_token: format!("{{\"ns\":\"{}\"}}", args.pod_namespace.replace('"', "")),
        },
        outbound: OutboundConfig {
            addr: args.outbound_addr,
            tcp_routes: args.outbound_tcp.clone(),
            cluster_domain: args.cluster_domain,
            max_endpoints_per_target: args.max_endpoints_per_target,
            stale_endpoints_grace: args.stale_endpoints_grace,
            max_connections: args.max_connections,
        },
        traffic: TrafficConfig {
            detect_timeout: args.detect_timeout,
            connect_timeout: args.connect_timeout,
            connect_backoff: BackoffConfig {
                initial: args.connect_backoff_min,
                max: args.connect_backoff_max,
                ..defaults::default_connect_backoff()
            },
            http_failfast_timeout: args.http_failfast_timeout,
            tcp_failfast_timeout: args.tcp_failfast_timeout,
            queue_capacity: args.queue_capacity,
            discovery_idle_timeout: args.discovery_idle_timeout,
            http1_pool_idle_timeout: args.http1_pool_idle_timeout,
            http1_pool_max_idle: args.http1_pool_max_idle,
            max_targets: args.max_targets,
        },
        inbound: InboundConfig {
            addr: args.inbound_addr,
            forward_port: args.inbound_forward_port,
            opaque_ports: args.inbound_opaque_ports,
            max_connections: args.max_connections,
            pod: PodIdentity {
                namespace: args.pod_namespace.clone(),
                name: args.pod_name.clone(),
                service_account: args.pod_service_account.clone(),
                owner: args.pod_owner.clone(),
                pod_template_hash: args.pod_template_hash.clone(),
            },
            default_policy: args.default_inbound_policy,
            cluster_networks: args.cluster_networks.clone(),
        },
        http: HttpLimits {
            h1_max_header_bytes: args.http1_max_header_bytes,
            h1_max_headers: args.http1_max_headers,
            h1_header_read_timeout: args.http1_header_read_timeout,
            h1_park_after: args.http1_park_after,
            h2_max_concurrent_streams: args.http2_max_concurrent_streams,
            h2_max_header_list_bytes: args.http2_max_header_list_bytes,
            h2_max_frame_bytes: args.http2_max_frame_bytes,
            h2_initial_stream_window_bytes: args.http2_initial_stream_window_bytes,
            h2_initial_connection_window_bytes: args.http2_initial_connection_window_bytes,
            h2_max_send_buffer_bytes: args.http2_max_send_buffer_bytes,
            h2_max_local_error_resets: args.http2_max_local_error_resets,
            h2_max_pending_accept_resets: args.http2_max_pending_accept_resets,
            idle_timeout: args.http_idle_timeout,
            max_connections_per_endpoint: args.max_connections_per_endpoint,
        },
        memory_limit: (args.memory_limit > 0).then_some(args.memory_limit),
        admin_addr,
        shutdown_grace: args.shutdown_grace,
        mesh,
        tap: tap_config,
        snapshot,
    };
    let listeners = ballast_proxy::Listeners {
        outbound,
        inbound,
        tcp_routes,
        admin: admin_addr,
        tap,
    };
    let shutdown = async move {
        tokio::select! {
            () = crate::signal::shutdown() => {}
            () = shutdown_request.requested() => {}
        }
    };
    let result = ballast_proxy::serve(config, listeners, metrics, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = admin_task.await;
    result.map_err(|e| anyhow::anyhow!(e))
}

/// The snapshot's book, read from --snapshot-path; `None` without it.
fn snapshot(
    args: &Args,
    metrics: &Arc<ballast_proxy::Metrics>,
) -> anyhow::Result<Option<Arc<ballast_proxy::discovery::snapshot::Book>>> {
    use ballast_proxy::discovery::{snapshot, workload_json};
    let Some(path) = &args.snapshot_path else {
        return Ok(None);
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        anyhow::bail!(
            "--snapshot-path {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let config = snapshot::SnapshotConfig {
        path: path.clone(),
        interval: args.snapshot_interval,
        wait: args.snapshot_wait,
        max_bytes: args.snapshot_max_bytes,
        grace: args.stale_endpoints_grace,
        max_entries: args.max_targets,
        workload: workload_json(&args.pod_namespace, &args.pod_name),
    };
    Ok(Some(snapshot::Book::load(config, metrics.clone())))
}

/// The proxy's identity from its flags, started; `None` with --identity-disabled.
fn identity(
    args: &Args,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Option<Arc<ballast_proxy::identity::MeshTls>>> {
    use ballast_meshtls::IdentityName;
    if args.identity_disabled {
        tracing::info!("identity disabled: no mutual TLS");
        return Ok(None);
    }
    let roots = match (&args.identity_trust_anchors, &args.identity_trust_anchors_pem) {
        (Some(file), _) => tls::root_store_file(file)
            .map_err(|e| anyhow::anyhow!("--identity-trust-anchors: {e}"))?,
        (None, Some(pem)) => ballast_meshtls::pem::certificates(pem.as_bytes())
            .map_err(|e| tls::TlsError::Anchors(e.to_string()))
            .and_then(|anchors| tls::root_store(&anchors))
            .map_err(|e| anyhow::anyhow!("--identity-trust-anchors-pem: {e}"))?,
        (None, None) => anyhow::bail!("--identity-trust-anchors (or --identity-trust-anchors-pem) is required (or pass --identity-disabled to run without mesh identity)"),
    };
    let (ns, td) = (
        &args.identity_controller_namespace,
        &args.identity_trust_domain,
    );
    let local_name = match &args.identity_local_name {
        Some(n) => IdentityName::parse(n).map_err(|e| anyhow::anyhow!("--identity-local-name {n:?}: {e}"))?,
        None => IdentityName::for_service_account(&args.pod_service_account, &args.pod_namespace, ns, td)
            .map_err(|e| anyhow::anyhow!("--pod-service-account and --pod-namespace make no identity name ({e}); set --identity-local-name"))?,
    };
    let server_name = certify::service_name(
        args.identity_server_name.as_deref(),
        &args.identity_addr,
        || IdentityName::for_service_account("linkerd-identity", ns, ns, td),
    )
    .map_err(|e| anyhow::anyhow!("--identity-server-name: {e}"))?;
    let metrics = ballast_proxy::identity::IdentityMetrics::default();
    metrics.register(registry);
    let config = ballast_proxy::identity::IdentityConfig {
        local_name,
        renewal: certify::Renewal {
            addr: args.identity_addr.clone(),
            server_name,
            connect_timeout: args.connect_timeout,
            certify: certify::CertifyConfig {
                token_file: args.identity_token_file.clone(),
                roots,
                min_refresh: args.identity_min_refresh,
                max_refresh: args.identity_max_refresh,
                backoff: BackoffConfig {
                    initial: args.control_backoff_min,
                    max: args.control_backoff_max,
                    jitter: args.control_backoff_jitter,
                    ..defaults::default_control_backoff()
                },
                request_timeout: Duration::from_secs(10),
            },
        },
        handshake_timeout: args.tls_handshake_timeout,
        max_handshakes: args.max_tls_handshakes,
    };
    ballast_proxy::identity::start(config, metrics)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("identity: {e}"))
}

/// The Tap API's settings; `None` without --tap-addr.
fn tap_config(args: &Args, identity: bool) -> anyhow::Result<Option<TapConfig>> {
    use ballast_meshtls::IdentityName;
    if args.tap_addr.is_none() {
        return Ok(None);
    }
    let client_identity = match (&args.tap_client_identity, identity) {
        (Some(n), true) => Some(
            IdentityName::parse(n)
                .map_err(|e| anyhow::anyhow!("--tap-client-identity {n:?}: {e}"))?,
        ),
        (None, true) => Some(
            IdentityName::for_service_account(
                "ballast-viz",
                "ballast",
                &args.identity_controller_namespace,
                &args.identity_trust_domain,
            )
            .map_err(|e| anyhow::anyhow!("the default --tap-client-identity: {e}"))?,
        ),
        (Some(_), false) => {
            tracing::warn!("--tap-client-identity has no effect with identity disabled: the tap listener is plaintext");
            None
        }
        (None, false) => None,
    };
    let limit = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(Some(TapConfig {
        client_identity,
        max_taps: args.tap_max_taps,
        max_requests_per_tap: limit(args.tap_max_requests_per_tap),
        max_events_per_second: limit(args.tap_max_events_per_second),
        queue_capacity: args.tap_queue_capacity,
        max_event_bytes: args.tap_max_event_bytes,
        max_connections: args.tap_max_connections,
        handshake_timeout: args.tls_handshake_timeout,
        ..TapConfig::default()
    }))
}

/// TLS to the destination controller: with an identity, unless it is on
/// loopback and no name was given.
fn control_tls(
    args: &Args,
    mesh: Option<&Arc<ballast_proxy::identity::MeshTls>>,
) -> anyhow::Result<Option<ballast_proxy::config::ControlTls>> {
    use ballast_meshtls::IdentityName;
    let Some(mesh) = mesh else { return Ok(None) };
    let (ns, td) = (
        &args.identity_controller_namespace,
        &args.identity_trust_domain,
    );
    let server_name = certify::service_name(
        args.destination_server_name.as_deref(),
        &args.destination_addr,
        || IdentityName::for_service_account("linkerd-destination", ns, ns, td),
    )
    .map_err(|e| anyhow::anyhow!("--destination-server-name: {e}"))?;
    // Our certificate is sent when we hold one (the controller may use it).
    Ok(
        server_name.map(|server_name| ballast_proxy::config::ControlTls {
            config: mesh.client.clone(),
            server_name,
        }),
    )
}

/// `--cluster-networks`: comma-separated CIDRs.
/// At least one network, as `ballast destination` asks: with none, the
/// cluster-* policies would admit no one.
fn parse_networks(s: &str) -> Result<Vec<ballast_proxy::network::IpNetwork>, String> {
    let nets = ballast_proxy::network::parse_networks(s).map_err(|e| e.to_string())?;
    if nets.is_empty() {
        return Err("at least one network is needed".into());
    }
    Ok(nets)
}

/// `KIND/NAME`, as `--pod-owner` takes it.
fn parse_owner(s: &str) -> Result<(OwnerKind, String), String> {
    let (kind, name) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not KIND/NAME (e.g. deployment/web)"))?;
    let name = ballast_flags::dns_name(name).map_err(|e| format!("{s:?}: {e}"))?;
    Ok((kind.parse()?, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_kind_slash_name() {
        assert_eq!(
            parse_owner("Deployment/web"),
            Ok((OwnerKind::Deployment, "web".to_string()))
        );
        assert_eq!(
            parse_owner("job/backup-1"),
            Ok((OwnerKind::Job, "backup-1".to_string()))
        );
        for bad in ["web", "deployment/", "cronjob/x", "/web", "deployment/Web"] {
            assert!(parse_owner(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tcp_routes_are_a_listen_address_and_an_authority() {
        assert_eq!(
            parse_tcp_route("127.0.0.1:5432=db.shop.svc.cluster.local:5432"),
            Ok((
                "127.0.0.1:5432".parse().unwrap(),
                "db.shop.svc.cluster.local:5432".to_string()
            ))
        );
        for bad in [
            "127.0.0.1:25432=http://x",
            "127.0.0.1:25432=db.shop",
            "127.0.0.1:25432=",
            "127.0.0.1=db:5432",
            "db:5432",
        ] {
            assert!(parse_tcp_route(bad).is_err(), "{bad}");
        }
    }
}
