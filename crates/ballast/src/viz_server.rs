//! `ballast viz`: flags, then wiring of source, store, collector, dashboard
//! server, tap and admin.

use crate::controller;
use anyhow::Context;
use ballast_admin::{AdminServer, AdminState, Readiness};
use ballast_certify as certify;
use ballast_flags::{
    bytes, count, dns_label, dns_name, dns_name_or_empty, duration, BACKOFF, GIB, GRACE, HOUR, KIB,
    MIB, TIMEOUT,
};
use ballast_meshtls::tls;
use ballast_source_kube as kube_source;
use ballast_store::{
    index::{Index, IndexConfig},
    metrics::Metrics,
    store::Store,
};
use ballast_viz::{
    collector::{self, Clock, Collector, CollectorConfig, HttpFetch, Source},
    metrics::VizMetrics,
    prometheus::{self, Federation, PrometheusUrl},
    server::{self, ServerConfig, Viz},
    tap::{TapConfig, TapTls, Tapper},
    Targets,
};
use ballast_vizcore::{
    expo::Limits,
    mesh::{Mesh, MeshConfig},
};
use clap::Args as ClapArgs;
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::watch;

controller::own_identity_flags!(
    OwnIdentityFlags,
    "BALLAST_VIZ",
    "Tap the proxies over mutual TLS as viz's own identity (certified by the identity service); the trust anchors (PEM). Without it, taps are plaintext."
);

#[derive(ClapArgs)]
#[command(
    after_help = "Source: with `--manifests DIR`, the Kubernetes objects written in DIR, following \
edits to it; without it, the Kubernetes API (`--kubeconfig` if given, else KUBECONFIG or \
~/.kube/config, else the in-cluster service account), as `ballast destination` reads them. The \
meshed pods (a `linkerd-proxy` container, Running, with an IP) are scraped at their \
`linkerd-admin` port (else 4191) and tapped at their `linkerd-tap` port (else 4190).\n\
A pod whose scrape fails is retried after 1, 2, 4 ... up to 30 intervals, each delay lowered by \
up to half at random per pod, and shown unreachable meanwhile. At most --scrape-concurrency pages \
of at most --max-page-bytes are held at once.\n\
Every flag can also be set by the environment variable shown.",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    #[command(subcommand)]
    action: Option<VizAction>,

    /// Address of the dashboard and its JSON API (/, /assets/*, /api/*,
    /// /live, /ready); Linkerd viz's web port.
    #[arg(long, env = "BALLAST_VIZ_ADDR", default_value = "127.0.0.1:8084")]
    addr: SocketAddr,

    /// Address of the admin server (/live, /ready, /metrics).
    #[arg(long, env = "BALLAST_VIZ_ADMIN_ADDR", default_value = "127.0.0.1:9994")]
    admin_addr: SocketAddr,

    /// Directory of Kubernetes manifests (*.yaml, *.yml, *.json, read
    /// recursively) standing in for a cluster; edits are followed.
    #[arg(long, env = "BALLAST_VIZ_MANIFESTS")]
    manifests: Option<PathBuf>,

    /// Kubeconfig for the Kubernetes source (when --manifests is not given);
    /// default: KUBECONFIG, ~/.kube/config, else in-cluster.
    #[arg(long, env = "BALLAST_VIZ_KUBECONFIG", conflicts_with = "manifests")]
    kubeconfig: Option<PathBuf>,

    /// Objects per LIST page when listing the Kubernetes API.
    #[arg(long, env = "BALLAST_VIZ_KUBE_PAGE_SIZE", default_value_t = kube_source::DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    kube_page_size: u32,

    /// First retry delay after a Kubernetes API error; doubles per failure, with jitter.
    #[arg(long, env = "BALLAST_VIZ_KUBE_BACKOFF_INITIAL", default_value = "800ms", value_parser = BACKOFF)]
    kube_backoff_initial: Duration,

    /// Longest retry delay after Kubernetes API errors.
    #[arg(long, env = "BALLAST_VIZ_KUBE_BACKOFF_MAX", default_value = "30s", value_parser = BACKOFF)]
    kube_backoff_max: Duration,

    /// Longest wait honoured from the API server's `429 Retry-After`.
    #[arg(long, env = "BALLAST_VIZ_KUBE_MAX_RETRY_AFTER", default_value = "60s", value_parser = BACKOFF)]
    kube_max_retry_after: Duration,

    /// Largest manifest file read; larger files are refused with an error.
    #[arg(long, env = "BALLAST_VIZ_MANIFESTS_MAX_FILE_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = bytes::<u64>(KIB, GIB))]
    manifests_max_file_bytes: u64,

    /// The cluster's DNS domain, as in NAME.NS.svc.CLUSTER_DOMAIN.
    #[arg(long, env = "BALLAST_VIZ_CLUSTER_DOMAIN", default_value = "cluster.local", value_parser = dns_name)]
    cluster_domain: String,

    /// Namespace of the control plane (the proxies' identities end in
    /// `identity.CONTROLLER_NAMESPACE.TRUST_DOMAIN`).
    #[arg(long, env = "BALLAST_VIZ_CONTROLLER_NAMESPACE", default_value = "linkerd", value_parser = dns_label)]
    controller_namespace: String,

    /// Trust domain of mesh identities; an empty value disables identities.
    #[arg(long, env = "BALLAST_VIZ_IDENTITY_TRUST_DOMAIN", default_value = "cluster.local",
          value_parser = dns_name_or_empty)]
    identity_trust_domain: String,

    /// How often every meshed pod is scraped (a fixed schedule: a cycle
    /// that overruns skips the ticks it overlapped); one history point each.
    #[arg(long, env = "BALLAST_VIZ_SCRAPE_INTERVAL", default_value = "10s",
          value_parser = duration(Duration::from_secs(1), HOUR))]
    scrape_interval: Duration,

    /// Longest one scrape may take, connect to last byte; less than
    /// --scrape-interval (default: 5s, or half the interval when that is less).
    #[arg(long, env = "BALLAST_VIZ_SCRAPE_TIMEOUT", value_parser = TIMEOUT)]
    scrape_timeout: Option<Duration>,

    /// Scrapes in flight at most.
    #[arg(long, env = "BALLAST_VIZ_SCRAPE_CONCURRENCY", default_value_t = collector::DEFAULT_SCRAPE_CONCURRENCY,
          value_parser = count(1, 10_000))]
    scrape_concurrency: usize,

    /// Largest /metrics page read; a larger one is a failed scrape (the read
    /// stops there and the connection is dropped).
    #[arg(long, env = "BALLAST_VIZ_MAX_PAGE_BYTES", default_value = "8M",
          value_parser = bytes::<usize>(KIB, GIB))]
    max_page_bytes: usize,

    /// Series of interest kept from one page at most; a page with more is a
    /// failed scrape.
    #[arg(long, env = "BALLAST_VIZ_MAX_PAGE_SERIES", default_value_t = Limits::default().max_series,
          value_parser = count(1, 10_000_000))]
    max_page_series: usize,

    /// History points kept per resource (90 at 10 s: 15 minutes).
    #[arg(long, env = "BALLAST_VIZ_HISTORY", default_value_t = 90,
          value_parser = count(1, 10_000))]
    history: usize,

    /// Meshed pods scraped at most (the first by namespace and name); the
    /// rest are counted in viz_pods_over_limit.
    #[arg(long, env = "BALLAST_VIZ_MAX_PODS", default_value_t = collector::DEFAULT_MAX_PODS,
          value_parser = count(1, 1_000_000))]
    max_pods: usize,

    /// Read an existing Prometheus (http://HOST:PORT[/PREFIX]) instead of
    /// scraping the proxies: `URL/federate` once per interval, series split
    /// by their `namespace` and `pod` labels.
    #[arg(long, env = "BALLAST_VIZ_PROMETHEUS_URL")]
    prometheus_url: Option<PrometheusUrl>,

    /// Largest federation page read from --prometheus-url.
    #[arg(long, env = "BALLAST_VIZ_MAX_FEDERATE_BYTES", default_value = "256M",
          value_parser = bytes::<usize>(KIB, 4 * GIB))]
    max_federate_bytes: usize,

    /// Series kept from one federation page at most.
    #[arg(long, env = "BALLAST_VIZ_MAX_FEDERATE_SERIES", default_value_t = prometheus::DEFAULT_MAX_FEDERATE_SERIES,
          value_parser = count(1, 100_000_000))]
    max_federate_series: usize,

    /// Dashboard and API connections open at once; past it new ones wait in
    /// the listen backlog.
    #[arg(long, env = "BALLAST_VIZ_MAX_CONNECTIONS", default_value_t = server::DEFAULT_MAX_CONNECTIONS,
          value_parser = count(1, 100_000))]
    max_connections: usize,

    /// Concurrent /api/tap streams; more get 503.
    #[arg(long, env = "BALLAST_VIZ_MAX_TAPS", default_value_t = 16, value_parser = count(1, 1_000))]
    max_taps: usize,

    /// Requests per second a tap shows when it asks for no rate, and the
    /// most it may ask (Linkerd's default).
    #[arg(long, env = "BALLAST_VIZ_TAP_MAX_RPS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    tap_max_rps: u32,

    /// Dialling a proxy's tap port, TLS handshake included.
    #[arg(long, env = "BALLAST_VIZ_TAP_CONNECT_TIMEOUT", default_value = "5s", value_parser = TIMEOUT)]
    tap_connect_timeout: Duration,

    /// Resident memory (bytes; K, M, G suffixes as powers of 1024) the
    /// server keeps under: past 85% of it pods not scraped yet are not taken
    /// on until it is back under 80%; past 95% a twentieth of the scraped
    /// pods is let go each cycle. Default: 75% of the container's memory
    /// limit (cgroup v2 memory.max or v1 memory.limit_in_bytes) when it has
    /// one, else none. 0: no limit.
    #[arg(long, env = "BALLAST_VIZ_MEMORY_LIMIT", value_parser = bytes::<u64>(MIB, 1 << 40).or_zero())]
    memory_limit: Option<u64>,

    /// On SIGTERM, how long open answers (taps) get to finish before exit.
    #[arg(long, env = "BALLAST_VIZ_SHUTDOWN_GRACE", default_value = "10s", value_parser = GRACE)]
    shutdown_grace: Duration,

    #[command(flatten)]
    own_identity: OwnIdentityFlags,

    /// The service account viz runs as: its identity is the one proxies
    /// admit to their tap ports.
    #[arg(long, env = "BALLAST_VIZ_SERVICE_ACCOUNT", default_value = "ballast-viz", value_parser = dns_name)]
    service_account: String,

    /// The namespace viz runs in (its service account's).
    #[arg(long, env = "BALLAST_VIZ_NAMESPACE", default_value = "ballast", value_parser = dns_label)]
    namespace: String,
}

/// The scrape timeout when none is given.
const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The scrape timeout: the one given, which must be less than the interval
/// (a usage error otherwise), else the default lowered to fit.
fn scrape_timeout(
    given: Option<Duration>,
    interval: Duration,
) -> Result<Duration, ballast_flags::UsageError> {
    match given {
        Some(t) if t >= interval => Err(ballast_flags::UsageError(format!(
            "--scrape-timeout ({t:?}) must be less than --scrape-interval ({interval:?})"
        ))),
        Some(t) => Ok(t),
        None => Ok(DEFAULT_SCRAPE_TIMEOUT.min(interval / 2)),
    }
}

/// What `ballast viz` does besides running viz.
#[derive(clap::Subcommand)]
enum VizAction {
    /// Open the installed dashboard on a local port, through the Kubernetes
    /// API server (as `linkerd viz dashboard` does).
    Dashboard(crate::dashboard::Args),
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(VizAction::Dashboard(dashboard)) = args.action {
        return crate::dashboard::run(dashboard).await;
    }
    let scrape_timeout = scrape_timeout(args.scrape_timeout, args.scrape_interval)?;
    let source_config = controller::SourceConfig {
        manifests: args.manifests.clone(),
        manifests_max_file_bytes: args.manifests_max_file_bytes,
        kubeconfig: args.kubeconfig.clone(),
        kube_page_size: args.kube_page_size,
        kube_backoff_initial: args.kube_backoff_initial,
        kube_backoff_max: args.kube_backoff_max,
        kube_max_retry_after: args.kube_max_retry_after,
        // viz reads pods, not policy: nothing waits for anything.
        kube_server_settle: Duration::ZERO,
    };
    // A missing --manifests directory is said before anything starts.
    source_config.check()?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on --addr {}", args.addr))?;
    let admin = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {}", args.admin_addr))?;
    tracing::info!(
        "viz dashboard listening on http://{}/",
        listener.local_addr()?
    );
    tracing::info!("admin listening on {}", admin.local_addr()?);

    let certify_metrics = certify::CertifyMetrics::default();
    let own = controller::own_identity(
        &args.own_identity.config(
            &args.service_account,
            Some(&args.namespace),
            &args.controller_namespace,
            &args.identity_trust_domain,
        ),
        &certify_metrics,
    )?;
    let tap_tls = match own {
        Some(own) => {
            tracing::info!(identity = %own.name, "taps are mutual TLS");
            Some(TapTls {
                client: tls::client_config(own.roots, Some(own.certs), &[])?,
                control_namespace: args.controller_namespace.clone(),
                trust_domain: args.identity_trust_domain.clone(),
            })
        }
        None => None,
    };

    let store_metrics = Metrics::default();
    let source_metrics = controller::SourceMetrics::default();
    let store = Store::new(
        Index::new(IndexConfig {
            control_plane_namespace: args.controller_namespace.clone(),
            trust_domain: args.identity_trust_domain.clone(),
            cluster_domain: args.cluster_domain.clone(),
            ..IndexConfig::default()
        }),
        store_metrics.clone(),
    );
    let targets: Targets = {
        let store = store.clone();
        Arc::new(move || store.with_index(ballast_vizcore::targets::snapshot))
    };
    let tapper = Arc::new(Tapper::new(
        TapConfig {
            max_taps: args.max_taps,
            default_max_rps: args.tap_max_rps,
            connect_timeout: args.tap_connect_timeout,
            tls: tap_tls,
            follow_interval: ballast_viz::tap::DEFAULT_FOLLOW_INTERVAL,
        },
        targets.clone(),
    ));
    let memory = controller::memory_budget(args.memory_limit);
    let metrics = VizMetrics::default();
    let (registry, _sampler) = controller::registry(|r| {
        memory.register(r);
        metrics.register(r);
        tapper.register(r);
        store_metrics.register(r);
        source_metrics.register(r);
        certify_metrics.register(r);
    });

    let mesh = Arc::new(Mutex::new(Mesh::new(MeshConfig {
        interval_secs: args.scrape_interval.as_secs().max(1),
        history_points: args.history,
        max_pods: args.max_pods,
    })));
    let source = match &args.prometheus_url {
        Some(url) => {
            tracing::info!(%url, "reading Prometheus' federation instead of scraping");
            Source::Prometheus(Federation {
                url: url.clone(),
                timeout: scrape_timeout,
                max_bytes: args.max_federate_bytes,
                limits: Limits {
                    max_series: args.max_federate_series,
                    ..Limits::default()
                },
            })
        }
        None => Source::Scrape(Arc::new(HttpFetch)),
    };
    let clock = Clock::new();
    let collector = Collector::new(
        CollectorConfig {
            interval: args.scrape_interval,
            timeout: scrape_timeout,
            concurrency: args.scrape_concurrency,
            max_page_bytes: args.max_page_bytes,
            max_pods: args.max_pods,
            limits: Limits {
                max_series: args.max_page_series,
                ..Limits::default()
            },
            memory,
            ..CollectorConfig::default()
        },
        mesh.clone(),
        targets,
        source,
        metrics.clone(),
        clock,
    );
    let ready = collector.ready_flag();
    let (stop_tx, stop_rx) = watch::channel(false);

    let admin_ready = ready.clone();
    let admin_state = AdminState::new(
        Arc::new(registry),
        Readiness::from_fn(move || admin_ready.load(std::sync::atomic::Ordering::Acquire)),
    );
    let admin_task = tokio::spawn(
        AdminServer::new(admin_state).serve(admin, controller::stopped(stop_rx.clone())),
    );

    let source =
        controller::start_source(source_config, &store, &source_metrics, stop_rx.clone()).await?;

    // The first cycle waits for the index to be loaded: scraping an empty
    // cluster would make /ready lie.
    let collector_store = store.clone();
    let collector_stop = stop_rx.clone();
    let collector_task = controller::Task::spawn("collector", async move {
        tokio::select! {
            () = collector_store.wait_ready() => {}
            () = controller::stopped(collector_stop.clone()) => return,
        }
        collector.run(controller::stopped(collector_stop)).await;
    });

    let viz = Arc::new(Viz {
        mesh,
        tapper,
        ready,
        clock,
        metrics,
    });
    let server_task = controller::Task::spawn(
        "viz server",
        server::serve(
            listener,
            viz,
            ServerConfig {
                max_connections: args.max_connections,
                shutdown_grace: args.shutdown_grace,
                ..ServerConfig::default()
            },
            controller::stopped(stop_rx.clone()),
        ),
    );
    controller::supervise(
        source,
        vec![server_task, collector_task],
        admin_task,
        stop_tx,
        args.shutdown_grace,
    )
    .await
}
