//! `ballast injector`: flags and wiring of the admission webhook (HTTPS
//! server, namespace cache, certificate reload, admin, SIGTERM).

use crate::{controller, inject::ProxyConfigFlags};
use anyhow::Context;
use ballast_admin::{AdminServer, AdminState, Readiness};
use ballast_flags::{bytes, count, GRACE, KIB, MANY, MIB, TIMEOUT};
use ballast_webhook::{
    decide::{Decider, FailurePolicy, ReviewMetrics},
    namespaces::{self, CacheMetrics, KubeLookup, NamespaceCache},
    server::{self, Limits, ServerMetrics},
    tls::{CertFiles, ReloadingCert},
};
use clap::Args as ClapArgs;
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};

#[derive(ClapArgs)]
#[command(
    after_help = "Serves AdmissionReview v1 on POST /inject over HTTPS (TLS 1.3). A pod is \
injected when its `linkerd.io/inject` annotation, else its namespace's, is `enabled` (the \
namespace is read from the Kubernetes API: `get` on namespaces); the answer is a JSON Patch \
from the pod as sent to the pod as `ballast inject` would write it. A body that is not an \
AdmissionReview gets HTTP 400; a review the injector cannot decide (namespace unreadable, \
invalid annotation, not a pod) is answered per --failure-policy.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Where to serve the webhook (HTTPS).
    #[arg(long, env = "BALLAST_INJECTOR_ADDR", default_value = "0.0.0.0:8443")]
    addr: SocketAddr,

    /// Where to serve /live, /ready and /metrics.
    #[arg(
        long,
        env = "BALLAST_INJECTOR_ADMIN_ADDR",
        default_value = "127.0.0.1:9995"
    )]
    admin_addr: SocketAddr,

    /// The serving certificate (PEM chain; a mounted kubernetes.io/tls Secret's tls.crt).
    #[arg(long, env = "BALLAST_INJECTOR_TLS_CERT")]
    tls_cert: PathBuf,

    /// The serving certificate's key (PEM, PKCS#8 or SEC1; tls.key).
    #[arg(long, env = "BALLAST_INJECTOR_TLS_KEY")]
    tls_key: PathBuf,

    /// How often the certificate files are re-read (a renewed Secret is served without a restart).
    #[arg(long, env = "BALLAST_INJECTOR_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = TIMEOUT)]
    tls_reload_interval: Duration,

    /// What to answer when a review cannot be decided: Ignore admits the pod
    /// unchanged (with a warning), Fail refuses it. Give the webhook
    /// configuration's failurePolicy (`ballast install --webhook-failure-policy`).
    #[arg(long, env = "BALLAST_INJECTOR_FAILURE_POLICY", default_value = "Ignore",
          value_parser = ["Ignore", "Fail"])]
    failure_policy: String,

    /// Kubernetes client configuration (else KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(long, env = "BALLAST_INJECTOR_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// How long a namespace's annotations are reused before they are read again.
    #[arg(long, env = "BALLAST_INJECTOR_NAMESPACE_CACHE_TTL", default_value = "10s", value_parser = TIMEOUT)]
    namespace_cache_ttl: Duration,

    /// Namespaces cached at most.
    #[arg(long, env = "BALLAST_INJECTOR_NAMESPACE_CACHE_SIZE", default_value_t = namespaces::DEFAULT_MAX_ENTRIES,
          value_parser = count(1, MANY))]
    namespace_cache_size: usize,

    /// One namespace read's time limit (the API server waits 10 s for the whole review by default).
    #[arg(long, env = "BALLAST_INJECTOR_NAMESPACE_LOOKUP_TIMEOUT", default_value = "3s", value_parser = TIMEOUT)]
    namespace_lookup_timeout: Duration,

    /// Largest AdmissionReview read (the API server refuses requests over 3 MiB).
    #[arg(long, env = "BALLAST_INJECTOR_MAX_BODY_BYTES", default_value = "3MiB",
          value_parser = bytes::<usize>(KIB, 64 * MIB))]
    max_body_bytes: usize,

    /// Open connections; beyond it, new ones wait in the listen backlog.
    #[arg(long, env = "BALLAST_INJECTOR_MAX_CONNECTIONS", default_value_t = server::DEFAULT_MAX_CONNECTIONS,
          value_parser = count(1, MANY))]
    max_connections: usize,

    /// Reviews read and decided at once (each holds up to --max-body-bytes).
    #[arg(long, env = "BALLAST_INJECTOR_MAX_CONCURRENT_REVIEWS", default_value_t = server::DEFAULT_MAX_CONCURRENT_REVIEWS,
          value_parser = count(1, 10_000))]
    max_concurrent_reviews: usize,

    /// How long a review waits for one of those before HTTP 503.
    #[arg(long, env = "BALLAST_INJECTOR_REVIEW_QUEUE_TIMEOUT", default_value = "2s", value_parser = TIMEOUT)]
    review_queue_timeout: Duration,

    /// A connection's TLS handshake must complete within this.
    #[arg(long, env = "BALLAST_INJECTOR_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    handshake_timeout: Duration,

    /// A request's head must arrive within this (also closes idle connections).
    #[arg(long, env = "BALLAST_INJECTOR_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    header_read_timeout: Duration,

    /// A request's body must arrive within this.
    #[arg(long, env = "BALLAST_INJECTOR_BODY_READ_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    body_read_timeout: Duration,

    /// After SIGTERM, how long open requests may finish.
    #[arg(long, env = "BALLAST_INJECTOR_SHUTDOWN_GRACE", default_value = "10s", value_parser = GRACE)]
    shutdown_grace: Duration,

    #[command(flatten)]
    proxy: ProxyConfigFlags,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let failure_policy = match args.failure_policy.as_str() {
        "Fail" => FailurePolicy::Fail,
        _ => FailurePolicy::Ignore,
    };
    // What proxies it injects get, checked first: without trust anchors
    // they would never start.
    let proxy_config = args.proxy.config(None)?;
    let cert = ReloadingCert::load(CertFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
    })
    .map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key: {e}"))?;
    let tls = cert
        .server_config()
        .context("cannot make the TLS configuration")?;
    let client = namespaces::kube_client(args.kubeconfig.as_deref()).await?;

    let listener = TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on --addr {}", args.addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {}", args.admin_addr))?;
    tracing::info!("injector listening on {}", listener.local_addr()?);
    tracing::info!("admin listening on {}", admin.local_addr()?);

    let cache_metrics = CacheMetrics::default();
    let review_metrics = ReviewMetrics::default();
    let server_metrics = ServerMetrics::default();
    let (registry, _sampler) = controller::registry(|r| {
        cache_metrics.register(r);
        review_metrics.register(r);
        server_metrics.register(r);
        cert.register(r);
    });
    let decider = Arc::new(Decider {
        config: proxy_config,
        namespaces: NamespaceCache::new(
            KubeLookup { client },
            args.namespace_cache_ttl,
            args.namespace_cache_size,
            args.namespace_lookup_timeout,
            cache_metrics,
        ),
        failure_policy,
        metrics: review_metrics,
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let admin_task = tokio::spawn(
        AdminServer::new(AdminState::new(Arc::new(registry), Readiness::always()))
            .serve(admin, controller::stopped(stop_rx.clone())),
    );
    let reload_task = tokio::spawn(cert.clone().watch(
        args.tls_reload_interval,
        controller::stopped(stop_rx.clone()),
    ));
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        max_connections: args.max_connections,
        max_concurrent_reviews: args.max_concurrent_reviews,
        review_queue_timeout: args.review_queue_timeout,
        handshake_timeout: args.handshake_timeout,
        header_read_timeout: args.header_read_timeout,
        body_read_timeout: args.body_read_timeout,
        shutdown_grace: args.shutdown_grace,
    };
    let server_task = tokio::spawn(server::serve(
        listener,
        tls,
        decider,
        limits,
        server_metrics,
        controller::stopped(stop_rx.clone()),
    ));

    ballast_sidecar::signal::shutdown().await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(args.shutdown_grace + Duration::from_secs(1), async {
        let _ = server_task.await;
        let _ = admin_task.await;
        let _ = reload_task.await;
    })
    .await;
    Ok(())
}
