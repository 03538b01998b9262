//! `ballast destination`: flags, then wiring of source, store, gRPC and admin.

use crate::controller;
use anyhow::Context;
use ballast_admin::{AdminServer, AdminState, Readiness};
use ballast_certify as certify;
use ballast_destination::{
    policy::{self, PolicyConfig, PolicyMetrics, PolicyService, PolicyStore},
    server::{self, DestinationService, MeshConfig, ServerConfig},
};
use ballast_flags::{
    bytes, count, dns_label, dns_name, dns_name_or_empty, BACKOFF, GIB, GRACE, KIB, MANY, MIB,
    TIMEOUT,
};
use ballast_meshtls::tls::{self, CertStore};
use ballast_source_kube as kube_source;
use ballast_store::{
    index::DEFAULT_CLUSTER_NETWORKS,
    index::{Index, IndexConfig, PortSet, DEFAULT_OPAQUE_PORTS},
    metrics::Metrics,
    resource::{DefaultPolicy, IpNet},
    store::Store,
};
use clap::Args as ClapArgs;
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::sync::watch;

controller::own_identity_flags!(
    OwnIdentityFlags,
    "BALLAST_DESTINATION",
    "Serve TLS with the controller's own identity (certified by the identity service) to clients that start a TLS handshake; the trust anchors (PEM). Without it, plaintext only."
);

#[derive(ClapArgs)]
#[command(
    after_help = "Source: with `--manifests DIR`, the Kubernetes objects (Pods, Services, \
EndpointSlices, Namespaces, Gateway API HTTPRoutes and GRPCRoutes, and Linkerd's policy.linkerd.io \
HTTPRoutes, Servers, AuthorizationPolicies, MeshTLSAuthentications and NetworkAuthentications, \
and ServiceProfiles) written in DIR, following edits to it (the embedded default for local runs). \
Without it, the Kubernetes API: `--kubeconfig` if given, else KUBECONFIG or ~/.kube/config, \
else the in-cluster service account.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Address of the gRPC server (Linkerd Destination API and gRPC health).
    #[arg(
        long,
        env = "BALLAST_DESTINATION_ADDR",
        default_value = "127.0.0.1:8086"
    )]
    addr: SocketAddr,

    /// Address of the admin server (/live, /ready, /metrics).
    #[arg(
        long,
        env = "BALLAST_DESTINATION_ADMIN_ADDR",
        default_value = "127.0.0.1:9996"
    )]
    admin_addr: SocketAddr,

    /// Directory of Kubernetes manifests (*.yaml, *.yml, *.json, read
    /// recursively) standing in for a cluster; edits are followed.
    #[arg(long, env = "BALLAST_DESTINATION_MANIFESTS")]
    manifests: Option<PathBuf>,

    /// Kubeconfig for the Kubernetes source (when --manifests is not given);
    /// default: KUBECONFIG, ~/.kube/config, else in-cluster.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_KUBECONFIG",
        conflicts_with = "manifests"
    )]
    kubeconfig: Option<PathBuf>,

    /// Objects per LIST page when listing the Kubernetes API.
    #[arg(long, env = "BALLAST_DESTINATION_KUBE_PAGE_SIZE", default_value_t = kube_source::DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    kube_page_size: u32,

    /// First retry delay after a Kubernetes API error; doubles per failure, with jitter.
    #[arg(long, env = "BALLAST_DESTINATION_KUBE_BACKOFF_INITIAL", default_value = "800ms", value_parser = BACKOFF)]
    kube_backoff_initial: Duration,

    /// Longest retry delay after Kubernetes API errors.
    #[arg(long, env = "BALLAST_DESTINATION_KUBE_BACKOFF_MAX", default_value = "30s", value_parser = BACKOFF)]
    kube_backoff_max: Duration,

    /// Longest wait honoured from the API server's `429 Retry-After`.
    #[arg(long, env = "BALLAST_DESTINATION_KUBE_MAX_RETRY_AFTER", default_value = "60s", value_parser = BACKOFF)]
    kube_max_retry_after: Duration,

    /// How long a Server added or changed in the cluster is held before it
    /// takes effect, so that AuthorizationPolicies and authentications
    /// created just before it (read on other watches) apply first and its
    /// port never denies the clients they admit. 0 applies Servers at once.
    #[arg(long, env = "BALLAST_DESTINATION_KUBE_SERVER_SETTLE", default_value = "1s", value_parser = ballast_flags::duration(Duration::ZERO, ballast_flags::HOUR))]
    kube_server_settle: Duration,

    /// Largest manifest file read; larger files are refused with an error.
    #[arg(long, env = "BALLAST_DESTINATION_MANIFESTS_MAX_FILE_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = bytes::<u64>(KIB, GIB))]
    manifests_max_file_bytes: u64,

    /// The cluster's DNS domain, as in NAME.NS.svc.CLUSTER_DOMAIN.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_CLUSTER_DOMAIN",
        default_value = "cluster.local",
        value_parser = dns_name
    )]
    cluster_domain: String,

    /// Namespace of the control plane: pods injected by it (label
    /// linkerd.io/control-plane-ns) get a TLS identity.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_CONTROLLER_NAMESPACE",
        default_value = "linkerd",
        value_parser = dns_label
    )]
    controller_namespace: String,

    /// Trust domain of mesh identities; an empty value disables identities.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_IDENTITY_TRUST_DOMAIN",
        default_value = "cluster.local",
        value_parser = dns_name_or_empty
    )]
    identity_trust_domain: String,

    /// Do not hint HTTP/2 to meshed endpoints.
    #[arg(long, env = "BALLAST_DESTINATION_DISABLE_H2_UPGRADE")]
    disable_h2_upgrade: bool,

    /// Ports treated as opaque where no config.linkerd.io/opaque-ports
    /// annotation says otherwise: comma-separated ports and ranges LO-HI
    /// (empty for none).
    #[arg(long, env = "BALLAST_DESTINATION_DEFAULT_OPAQUE_PORTS", default_value = DEFAULT_OPAQUE_PORTS,
          value_parser = parse_opaque_ports)]
    default_opaque_ports: PortSet,

    /// Changes each subscription keeps for its streams that fall behind (a
    /// stream further behind gets the whole answer again); streams have no
    /// queue of their own.
    #[arg(long, env = "BALLAST_DESTINATION_STREAM_QUEUE", default_value_t = server::DEFAULT_STREAM_QUEUE,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    stream_queue: u32,

    /// A stream that has not taken a change this long after its publication
    /// is cut off with RESOURCE_EXHAUSTED at the next change to its target.
    #[arg(long, env = "BALLAST_DESTINATION_STREAM_SEND_WAIT", default_value = "1s", value_parser = TIMEOUT)]
    stream_send_wait: Duration,

    /// Open client connections per listener (--addr, --policy-addr); a
    /// connection past it is closed at once and counted
    /// (grpc_server_connections_refused_total), so that its proxy backs off
    /// and may reach another replica.
    #[arg(long, env = "BALLAST_DESTINATION_MAX_CONNECTIONS", default_value_t = ballast_meshtls::server::DEFAULT_MAX_CONNECTIONS,
          value_parser = count(1, MANY))]
    max_connections: usize,

    /// Concurrent Get and GetProfile streams; past it new streams get RESOURCE_EXHAUSTED.
    #[arg(long, env = "BALLAST_DESTINATION_MAX_STREAMS", default_value_t = server::DEFAULT_MAX_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_streams: u32,

    /// HTTP/2 streams one client connection may have open at once
    /// (advertised in SETTINGS; a client past it waits or is refused).
    #[arg(long, env = "BALLAST_DESTINATION_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = server::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..))]
    http2_max_concurrent_streams: u32,

    /// Streams one client connection may make the controller reset for
    /// stream protocol errors before it gets GOAWAY ENHANCE_YOUR_CALM and is
    /// closed (MadeYouReset, CVE-2025-8671). Streams refused past
    /// --http2-max-concurrent-streams come on top, up to twice that limit
    /// (a refused stream's body costs a second reset).
    #[arg(long, env = "BALLAST_DESTINATION_HTTP2_MAX_LOCAL_ERROR_RESETS", default_value_t = server::DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS,
          value_parser = count(1, MANY))]
    http2_max_local_error_resets: usize,

    /// Streams a client opened and reset itself that may wait at once to be
    /// accepted before its connection gets GOAWAY ENHANCE_YOUR_CALM (Rapid
    /// Reset, CVE-2023-44487).
    #[arg(long, env = "BALLAST_DESTINATION_HTTP2_MAX_PENDING_ACCEPT_RESETS", default_value_t = server::DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS,
          value_parser = count(1, MANY))]
    http2_max_pending_accept_resets: usize,

    /// Largest decoded HTTP/2 header list of a request, in bytes.
    #[arg(long, env = "BALLAST_DESTINATION_HTTP2_MAX_HEADER_LIST_BYTES", default_value_t = server::DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES,
          value_parser = clap::value_parser!(u32).range(1024..))]
    http2_max_header_list_bytes: u32,

    /// Address of Linkerd's policy API (OutboundPolicies and
    /// InboundServerPolicies), for Linkerd's proxies, which dial it apart from
    /// Destination. Both services are served on --addr too, for Ballast's.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_POLICY_ADDR",
        default_value = "127.0.0.1:8090"
    )]
    policy_addr: SocketAddr,

    /// Inbound policy of pods whose ports no Server selects, unless the pod
    /// or its namespace names one (config.linkerd.io/default-inbound-policy):
    /// all-unauthenticated, all-authenticated, cluster-unauthenticated,
    /// cluster-authenticated, deny or audit.
    #[arg(long, env = "BALLAST_DESTINATION_DEFAULT_INBOUND_POLICY", default_value = "all-unauthenticated",
          value_parser = parse_default_policy)]
    default_inbound_policy: DefaultPolicy,

    /// The cluster's pod and node networks, comma-separated CIDRs: what the
    /// cluster-* default policies admit.
    #[arg(long, env = "BALLAST_DESTINATION_CLUSTER_NETWORKS", default_value = DEFAULT_CLUSTER_NETWORKS,
          value_parser = parse_networks)]
    cluster_networks: Networks,

    /// Concurrent policy Watch streams (both policy APIs); past it new ones
    /// get RESOURCE_EXHAUSTED.
    #[arg(long, env = "BALLAST_DESTINATION_MAX_POLICY_STREAMS", default_value_t = policy::DEFAULT_MAX_POLICY_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_policy_streams: u32,

    /// Resident memory (bytes; K, M, G suffixes as powers of 1024) the
    /// controller keeps under: past 85% of it new streams get
    /// RESOURCE_EXHAUSTED with a retry hint (grpc-retry-pushback-ms) until
    /// it is back under 80%; past 95% the costliest open streams are closed
    /// too (5% of them every 200 ms) until it falls. Default: 75% of the container's memory limit
    /// (cgroup v2 memory.max or v1 memory.limit_in_bytes) when it has one,
    /// else none. 0: no limit.
    #[arg(long, env = "BALLAST_DESTINATION_MEMORY_LIMIT", value_parser = bytes::<u64>(MIB, 1 << 40).or_zero())]
    memory_limit: Option<u64>,

    /// On SIGTERM, how long open streams and connections get to close before exit.
    #[arg(long, env = "BALLAST_DESTINATION_SHUTDOWN_GRACE", default_value = "10s", value_parser = GRACE)]
    shutdown_grace: Duration,

    #[command(flatten)]
    own_identity: OwnIdentityFlags,

    /// The service account this controller runs as: its identity names the certificate it serves.
    #[arg(
        long,
        env = "BALLAST_DESTINATION_SERVICE_ACCOUNT",
        default_value = "linkerd-destination",
        value_parser = dns_name
    )]
    service_account: String,

    /// The namespace this controller runs in (its service account's; default:
    /// --controller-namespace).
    #[arg(long, env = "BALLAST_DESTINATION_NAMESPACE", value_parser = dns_label)]
    namespace: Option<String>,
}

/// The controller's own serving certificate, from the identity service,
/// renewed in the background; and the TLS configuration that serves it.
fn own_identity(
    args: &Args,
    metrics: &certify::CertifyMetrics,
) -> anyhow::Result<Option<(Arc<rustls::ServerConfig>, Arc<CertStore>)>> {
    let Some(own) = controller::own_identity(
        &args.own_identity.config(
            &args.service_account,
            args.namespace.as_deref(),
            &args.controller_namespace,
            &args.identity_trust_domain,
        ),
        metrics,
    )?
    else {
        return Ok(None);
    };
    Ok(Some((
        tls::server_config(own.roots, own.certs.clone(), &[])?,
        own.certs,
    )))
}

/// Numbers and ranges only: a port name means nothing without a pod to name it.
fn parse_opaque_ports(s: &str) -> Result<PortSet, String> {
    ballast_flags::port_list(s).map_err(|e| e.to_string())?;
    PortSet::parse(s)
}

fn parse_default_policy(s: &str) -> Result<DefaultPolicy, String> {
    s.parse()
}

/// A non-empty list of networks (Linkerd's proxies refuse an authorization
/// without one).
#[derive(Clone, Debug)]
struct Networks(Vec<IpNet>);

fn parse_networks(s: &str) -> Result<Networks, String> {
    let nets = s
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<IpNet>, String>>()?;
    if nets.is_empty() {
        return Err("at least one network is needed".into());
    }
    Ok(Networks(nets))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let source_config = controller::SourceConfig {
        manifests: args.manifests.clone(),
        manifests_max_file_bytes: args.manifests_max_file_bytes,
        kubeconfig: args.kubeconfig.clone(),
        kube_page_size: args.kube_page_size,
        kube_backoff_initial: args.kube_backoff_initial,
        kube_backoff_max: args.kube_backoff_max,
        kube_max_retry_after: args.kube_max_retry_after,
        kube_server_settle: args.kube_server_settle,
    };
    // A missing --manifests directory is said before anything starts.
    source_config.check()?;
    let (grpc, admin) = controller::listeners("destination", args.addr, args.admin_addr).await?;
    let policy_listener = tokio::net::TcpListener::bind(args.policy_addr)
        .await
        .with_context(|| format!("cannot listen on --policy-addr {}", args.policy_addr))?;
    tracing::info!("policy gRPC listening on {}", policy_listener.local_addr()?);

    let memory = controller::memory_budget(args.memory_limit);
    let metrics = Metrics::default();
    let source_metrics = controller::SourceMetrics::default();
    let policy_metrics = PolicyMetrics::default();
    let stats = Arc::new(ballast_meshtls::server::ServeStats::default());
    let certify_metrics = certify::CertifyMetrics::default();
    let (registry, _sampler) = controller::registry(|r| {
        metrics.register(r);
        source_metrics.register(r);
        certify_metrics.register(r);
        policy_metrics.register(r);
        stats.register(r);
        memory.register(r);
    });

    let store = Store::new(
        Index::new(IndexConfig {
            default_opaque_ports: args.default_opaque_ports.clone(),
            default_inbound_policy: args.default_inbound_policy,
            cluster_networks: args.cluster_networks.0.clone(),
            control_plane_namespace: args.controller_namespace.clone(),
            trust_domain: args.identity_trust_domain.clone(),
            cluster_domain: args.cluster_domain.clone(),
        }),
        metrics,
    );
    let (stop_tx, stop_rx) = watch::channel(false);

    let own = own_identity(&args, &certify_metrics)?;
    let ready_store = store.clone();
    let ready_cert = own.as_ref().map(|(_, certs)| certs.clone());
    let admin_state = AdminState::new(
        Arc::new(registry),
        Readiness::from_fn(move || {
            ready_store.is_ready() && ready_cert.as_ref().is_none_or(|c| c.is_ready())
        }),
    );
    let admin_task = tokio::spawn(
        AdminServer::new(admin_state).serve(admin, controller::stopped(stop_rx.clone())),
    );

    let source =
        controller::start_source(source_config, &store, &source_metrics, stop_rx.clone()).await?;

    let mesh = MeshConfig {
        cluster_domain: args.cluster_domain,
        controller_namespace: args.controller_namespace,
        identity_trust_domain: Some(args.identity_trust_domain).filter(|d| !d.is_empty()),
        enable_h2_upgrade: !args.disable_h2_upgrade,
    };
    let policy_store = PolicyStore::new(
        store.clone(),
        PolicyConfig {
            mesh: mesh.clone(),
            ..PolicyConfig::default()
        },
        policy_metrics,
    );
    let config = ServerConfig {
        mesh,
        stream_queue: args.stream_queue as usize,
        stream_send_wait: args.stream_send_wait,
        max_streams: args.max_streams as usize,
        max_connections: args.max_connections,
        http2_max_concurrent_streams: args.http2_max_concurrent_streams,
        http2_max_local_error_resets: args.http2_max_local_error_resets,
        http2_max_pending_accept_resets: args.http2_max_pending_accept_resets,
        http2_max_header_list_bytes: args.http2_max_header_list_bytes,
        memory: memory.clone(),
        ..ServerConfig::default()
    };
    // The memory budget's closing step: past 95% of the limit, the
    // costliest streams of every API are closed first.
    let shedder = tokio::spawn(ballast_destination::shed::run(
        memory.clone(),
        store.clone(),
        policy_store.clone(),
        stop_rx.clone(),
    ));
    let policy_service = PolicyService::new(
        policy_store,
        args.max_policy_streams as usize,
        config.max_request_bytes,
        memory,
        stop_rx.clone(),
    );
    let service = DestinationService::new(store.clone(), config, stop_rx.clone());
    let tls = own.map(|(config, _)| config);
    // Linkerd's proxies dial policy on its own port; it serves the same
    // services under the same limits and TLS.
    let policy_task = controller::Task::spawn(
        "policy gRPC server",
        server::serve(
            policy_listener,
            tls.clone(),
            stats.clone(),
            service.clone(),
            Some(policy_service.clone()),
            controller::stopped(stop_rx.clone()),
        ),
    );
    let grpc_task = controller::Task::spawn(
        "gRPC server",
        server::serve(
            grpc,
            tls,
            stats,
            service,
            Some(policy_service),
            controller::stopped(stop_rx.clone()),
        ),
    );
    let result = controller::supervise(
        source,
        vec![grpc_task, policy_task],
        admin_task,
        stop_tx,
        args.shutdown_grace,
    )
    .await;
    shedder.abort();
    result
}
