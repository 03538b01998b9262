//! What every controller command wires the same way: its two listeners, its
//! metrics registry, the stop signal its tasks wait on, and for those that
//! read the cluster (destination, viz) the source and their own identity.

use anyhow::Context;
use ballast_certify as certify;
use ballast_meshtls::{
    tls::{self, CertStore},
    IdentityName,
};
use ballast_source_kube::{self as kube_source, BackoffConfig, KubeConfig, KubeMetrics};
use ballast_source_manifests::{self as manifests, ManifestsConfig, ManifestsMetrics};
use ballast_store::store::Store;
use prometheus_client::registry::Registry;
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

/// Binds the gRPC (`--addr`) and admin (`--admin-addr`) listeners and logs
/// where they listen (`{what} gRPC listening on ...`, which tests and scripts
/// read).
pub async fn listeners(
    what: &str,
    addr: SocketAddr,
    admin_addr: SocketAddr,
) -> anyhow::Result<(TcpListener, TcpListener)> {
    let grpc = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --addr {addr}"))?;
    let admin = TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {admin_addr}"))?;
    tracing::info!("{what} gRPC listening on {}", grpc.local_addr()?);
    let local = admin.local_addr()?;
    tracing::info!(%local, "admin listening on {local}");
    Ok((grpc, admin))
}

/// A registry with the process and memory metrics and the controller's own
/// (`register`), and the task sampling memory for it.
pub fn registry(register: impl FnOnce(&mut Registry)) -> (Registry, JoinHandle<()>) {
    let mut registry = Registry::default();
    register(&mut registry);
    ballast_admin::register_memory_metrics(&mut registry);
    ballast_admin::register_process_metrics(&mut registry);
    (registry, ballast_admin::spawn_memory_sampler())
}

/// A controller's memory budget from its `--memory-limit`: `None` (the flag
/// not given) takes the default share of the container's limit; 0 is none.
pub fn memory_budget(flag: Option<u64>) -> ballast_admin::MemoryBudget {
    let limit = match flag {
        Some(0) => None,
        Some(limit) => Some(limit),
        None => ballast_admin::budget::default_limit(),
    };
    match limit {
        Some(limit) => tracing::info!(
            limit,
            "memory budget: new work is refused near this many resident bytes"
        ),
        None => tracing::info!("no memory limit (none given, and no container limit found)"),
    }
    ballast_admin::MemoryBudget::start(limit)
}

/// The stop flag's receiving side, as a future each task can wait on.
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Where a controller reads the cluster from: `--manifests DIR`, else the
/// Kubernetes API. The flags are each command's own (their environment
/// variables differ); their meaning is this one.
pub struct SourceConfig {
    pub manifests: Option<PathBuf>,
    pub manifests_max_file_bytes: u64,
    pub kubeconfig: Option<PathBuf>,
    pub kube_page_size: u32,
    pub kube_backoff_initial: Duration,
    pub kube_backoff_max: Duration,
    pub kube_max_retry_after: Duration,
    pub kube_server_settle: Duration,
}

impl SourceConfig {
    /// A missing `--manifests` directory, said before anything starts.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(dir) = &self.manifests {
            manifests::check_dir(dir)?;
        }
        Ok(())
    }
}

/// The sources' metrics, each source's own. Both are registered whichever
/// source runs, so that a controller's /metrics page has the same families
/// either way.
#[derive(Clone, Default)]
pub struct SourceMetrics {
    pub kube: KubeMetrics,
    pub manifests: ManifestsMetrics,
}

impl SourceMetrics {
    pub fn register(&self, registry: &mut Registry) {
        self.kube.register(registry);
        self.manifests.register(registry);
    }
}

/// Starts the source filling `store` until `stop` turns, counting in
/// `metrics`; the task ends with
/// the source's error, if it fails. Also hands memory back to the kernel
/// after each bulk load.
pub async fn start_source(
    config: SourceConfig,
    store: &Arc<Store>,
    metrics: &SourceMetrics,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let source = match config.manifests {
        Some(dir) => {
            tracing::info!(dir = %dir.display(), "source: manifests directory");
            let config = ManifestsConfig {
                max_file_bytes: config.manifests_max_file_bytes,
                ..ManifestsConfig::new(dir)
            };
            let run = manifests::run(
                config,
                store.clone(),
                metrics.manifests.clone(),
                stopped(stop),
            );
            tokio::spawn(async move { run.await.map_err(anyhow::Error::new) })
        }
        None => {
            let config = KubeConfig {
                kubeconfig: config.kubeconfig,
                page_size: config.kube_page_size,
                backoff: BackoffConfig {
                    initial: config.kube_backoff_initial,
                    max: config.kube_backoff_max,
                    ..BackoffConfig::default()
                },
                max_retry_after: config.kube_max_retry_after,
                server_settle: config.kube_server_settle,
                ..KubeConfig::default()
            };
            let client = kube_source::client(&config, &metrics.kube)
                .await
                .context("cannot set up the Kubernetes client (or pass --manifests DIR to run without a cluster)")?;
            tracing::info!("source: Kubernetes API");
            let run = kube_source::run(
                config,
                client,
                store.clone(),
                metrics.kube.clone(),
                stopped(stop),
            );
            tokio::spawn(async move { run.await.map_err(anyhow::Error::new) })
        }
    };

    // Loading a cluster (or relisting it) allocates far more than it keeps:
    // hand the rest back to the kernel after each bulk load.
    let mut bulk_loads = store.bulk_loads();
    tokio::spawn(async move {
        while bulk_loads.changed().await.is_ok() {
            ballast_admin::release_unused_memory();
        }
    });
    Ok(source)
}

/// Declares a command's `--identity-*` flags for its own mesh identity
/// (trust anchors, identity service address, its name, the token file) under
/// its own environment prefix, with the anchors' help saying what the
/// identity is for there. One declaration, so the commands cannot drift.
macro_rules! own_identity_flags {
    ($name:ident, $prefix:literal, $anchors_help:literal) => {
        #[derive(clap::Args)]
        pub struct $name {
            #[doc = $anchors_help]
            #[arg(long, env = concat!($prefix, "_IDENTITY_TRUST_ANCHORS"))]
            identity_trust_anchors: Option<std::path::PathBuf>,

            /// The identity service, HOST:PORT.
            #[arg(
                        long,
                        env = concat!($prefix, "_IDENTITY_ADDR"),
                        default_value = "ballast-identity-headless.ballast.svc.cluster.local:8080",
                        value_parser = ballast_flags::host_port
                    )]
            identity_addr: String,

            /// The identity service's identity; it is dialled in TLS verifying this
            /// name (default: the `linkerd-identity` service account's), except at a
            /// loopback address when no name is given; an empty value dials it in plaintext.
            #[arg(long, env = concat!($prefix, "_IDENTITY_SERVER_NAME"),
                          value_parser = ballast_flags::dns_name_or_empty)]
            identity_server_name: Option<String>,

            /// The service-account token sent with each certificate request.
            #[arg(
                        long,
                        env = concat!($prefix, "_IDENTITY_TOKEN_FILE"),
                        default_value = "/var/run/secrets/tokens/linkerd-identity-token"
                    )]
            identity_token_file: std::path::PathBuf,
        }

        impl $name {
            /// These flags with the rest of what names the identity.
            pub fn config(
                &self,
                service_account: &str,
                namespace: Option<&str>,
                controller_namespace: &str,
                trust_domain: &str,
            ) -> $crate::controller::IdentityConfig {
                $crate::controller::IdentityConfig {
                    trust_anchors: self.identity_trust_anchors.clone(),
                    addr: self.identity_addr.clone(),
                    server_name: self.identity_server_name.clone(),
                    token_file: self.identity_token_file.clone(),
                    service_account: service_account.to_string(),
                    namespace: namespace.map(str::to_string),
                    controller_namespace: controller_namespace.to_string(),
                    trust_domain: trust_domain.to_string(),
                }
            }
        }
    };
}
pub(crate) use own_identity_flags;

/// A controller's own mesh identity: the `--identity-*` flags, each
/// command's own, meaning this.
pub struct IdentityConfig {
    /// Without them, no identity.
    pub trust_anchors: Option<PathBuf>,
    pub addr: String,
    pub server_name: Option<String>,
    pub token_file: PathBuf,
    pub service_account: String,
    /// Its service account's namespace (default: the controller namespace).
    pub namespace: Option<String>,
    pub controller_namespace: String,
    pub trust_domain: String,
}

/// A certificate from the identity service for the controller's own name,
/// renewed in the background.
pub struct OwnIdentity {
    pub name: IdentityName,
    pub roots: Arc<rustls::RootCertStore>,
    pub certs: Arc<CertStore>,
}

/// Starts certifying the controller's identity when trust anchors are given;
/// `metrics` hears every renewal (the certificate's expiry among them).
pub fn own_identity(
    config: &IdentityConfig,
    metrics: &certify::CertifyMetrics,
) -> anyhow::Result<Option<OwnIdentity>> {
    let Some(anchors) = &config.trust_anchors else {
        return Ok(None);
    };
    let roots = tls::root_store_file(anchors)
        .map_err(|e| anyhow::anyhow!("--identity-trust-anchors: {e}"))?;
    let (ns, td) = (&config.controller_namespace, &config.trust_domain);
    let own_ns = config.namespace.as_deref().unwrap_or(ns);
    let name = IdentityName::for_service_account(&config.service_account, own_ns, ns, td)
        .map_err(|e| anyhow::anyhow!("--service-account, --controller-namespace and --identity-trust-domain make no identity: {e}"))?;
    let server_name = certify::service_name(config.server_name.as_deref(), &config.addr, || {
        IdentityName::for_service_account("linkerd-identity", ns, ns, td)
    })
    .map_err(|e| anyhow::anyhow!("--identity-server-name: {e}"))?;
    let renewal = certify::Renewal {
        addr: config.addr.clone(),
        server_name,
        connect_timeout: Duration::from_secs(5),
        certify: certify::CertifyConfig {
            token_file: config.token_file.clone(),
            roots: roots.clone(),
            min_refresh: certify::DEFAULT_MIN_REFRESH,
            max_refresh: certify::DEFAULT_MAX_REFRESH,
            backoff: ballast_backoff::BackoffConfig::default(),
            request_timeout: Duration::from_secs(10),
        },
    };
    let certs = certify::spawn(name.clone(), renewal, metrics.clone())
        .map_err(|e| anyhow::anyhow!("--identity-addr: {e}"))?;
    Ok(Some(OwnIdentity { name, roots, certs }))
}

/// A task a controller runs until it stops, named for the error that says it
/// ended early.
pub struct Task {
    pub name: &'static str,
    pub handle: JoinHandle<String>,
}

impl Task {
    /// Spawns `run`; its outcome, whatever its type, becomes the text of the
    /// error if it ends before the controller is told to stop.
    pub fn spawn<T: std::fmt::Debug + Send + 'static>(
        name: &'static str,
        run: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Self {
        Self {
            name,
            handle: tokio::spawn(async move { format!("{:?}", run.await) }),
        }
    }
}

/// Runs until SIGTERM, the source ending, or any task ending; then turns the
/// stop flag and waits for the tasks and the admin server to finish, for at
/// most `grace`. Streams and connections end cleanly as soon as the flag
/// turns; the wait is for clients to hang up.
pub async fn supervise<A>(
    mut source: JoinHandle<anyhow::Result<()>>,
    mut tasks: Vec<Task>,
    admin: JoinHandle<A>,
    stop: watch::Sender<bool>,
    grace: Duration,
) -> anyhow::Result<()> {
    let first_ended = futures_util::future::select_all(
        tasks
            .iter_mut()
            .map(|t| Box::pin(async { (t.name, (&mut t.handle).await) })),
    );
    let outcome: anyhow::Result<()> = tokio::select! {
        _ = ballast_sidecar::signal::shutdown() => Ok(()),
        r = &mut source => match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.context("source failed")),
            Err(e) => Err(anyhow::anyhow!("source stopped: {e}")),
        },
        ((name, r), _, _) = first_ended => Err(anyhow::anyhow!("{name} stopped: {r:?}")),
    };

    let _ = stop.send(true);
    let drain = async {
        for task in tasks {
            if !task.handle.is_finished() {
                let _ = task.handle.await;
            }
        }
        let _ = admin.await;
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(grace = ?grace, "connections still open after the grace period; exiting");
    }
    tracing::info!("stopped");
    outcome
}
