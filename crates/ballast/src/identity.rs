//! `ballast identity`: flags, then wiring of the issuer watch, the token
//! check, the Certify server (TLS with its own identity, or plaintext, per
//! connection) and admin; `ballast identity generate`.

use crate::controller;
use anyhow::Context;
use ballast_admin::{AdminServer, AdminState, Readiness};
use ballast_flags::{bytes, count, dns_label, dns_name, GRACE, MANY, MIB, TIMEOUT};
use ballast_identity::{
    generate::{generate, issue_issuer, GenerateConfig},
    issuer::{IssuerFiles, SignConfig},
    metrics::Metrics,
    service::{self, IdentityConfig, IdentityService},
    token::{self, ManifestTokens, TokenValidator},
};
use ballast_meshtls::{
    server::{self as tls_server, ServeLimits, ServeStats},
    tls::{self, CertStore},
    IdentityName,
};
use clap::{Args as ClapArgs, Subcommand};
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::sync::watch;

/// Streams one client connection may make the identity server reset for
/// protocol errors before GOAWAY ENHANCE_YOUR_CALM (MadeYouReset,
/// CVE-2025-8671); refusals of one window past the stream limit come on top.
const IDENTITY_HTTP2_MAX_LOCAL_ERROR_RESETS: usize = 100;

#[derive(ClapArgs)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Issuer: --issuer-dir holds Linkerd's `linkerd-identity-issuer` Secret as mounted \
(tls.crt/tls.key, or crt.pem/key.pem); --trust-anchors is the trust roots bundle (PEM). Both are \
re-read every --reload-interval: the issuer rotates without a restart, and one that is expired, \
not yet valid, or does not chain to the anchors is refused (and /ready fails).\n\
Tokens: with --manifests DIR, a token must equal the `token` of a Secret of type \
kubernetes.io/service-account-token in DIR for the requested service account; otherwise a \
TokenReview (audience identity.l5d.io) on the Kubernetes API.\n\
The gRPC port serves TLS with the controller's own identity to clients that start a TLS \
handshake, and plaintext to the others.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// Where to serve Linkerd's Identity API (Certify).
    #[arg(long, env = "BALLAST_IDENTITY_ADDR", default_value = "127.0.0.1:8080")]
    addr: SocketAddr,

    /// Where to serve /live, /ready and /metrics.
    #[arg(
        long,
        env = "BALLAST_IDENTITY_ADMIN_ADDR",
        default_value = "127.0.0.1:9990"
    )]
    admin_addr: SocketAddr,

    /// Directory with the issuer certificate and key (a mounted `linkerd-identity-issuer` Secret).
    #[arg(long, env = "BALLAST_IDENTITY_ISSUER_DIR")]
    issuer_dir: Option<PathBuf>,

    /// The trust anchors bundle (PEM).
    #[arg(long, env = "BALLAST_IDENTITY_TRUST_ANCHORS")]
    trust_anchors: Option<PathBuf>,

    /// Check tokens against the service-account token Secrets in this manifests directory, not the Kubernetes API.
    #[arg(long, env = "BALLAST_IDENTITY_MANIFESTS")]
    manifests: Option<PathBuf>,

    /// Kubernetes client configuration for TokenReviews (else KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(
        long,
        env = "BALLAST_IDENTITY_KUBECONFIG",
        conflicts_with = "manifests"
    )]
    kubeconfig: Option<PathBuf>,

    /// The control plane's namespace, part of every identity name.
    #[arg(
        long,
        env = "BALLAST_IDENTITY_CONTROLLER_NAMESPACE",
        default_value = "linkerd",
        value_parser = dns_label
    )]
    controller_namespace: String,

    /// The trust domain, the last part of every identity name.
    #[arg(
        long,
        env = "BALLAST_IDENTITY_TRUST_DOMAIN",
        default_value = "cluster.local",
        value_parser = dns_name
    )]
    trust_domain: String,

    /// The service account this controller runs as; its identity names the TLS certificate it serves.
    #[arg(
        long,
        env = "BALLAST_IDENTITY_SERVICE_ACCOUNT",
        default_value = "linkerd-identity",
        value_parser = dns_name
    )]
    service_account: String,

    /// The namespace this controller runs in (its service account's; default:
    /// --controller-namespace).
    #[arg(long, env = "BALLAST_IDENTITY_NAMESPACE", value_parser = dns_label)]
    namespace: Option<String>,

    /// How long issued certificates live (Linkerd's default).
    #[arg(long, env = "BALLAST_IDENTITY_ISSUANCE_LIFETIME", default_value = "24h",
          value_parser = ballast_flags::duration(Duration::from_secs(10), Duration::from_secs(366 * 86_400)))]
    issuance_lifetime: Duration,

    /// How far back certificates are dated, for peers whose clocks run behind (Linkerd's default).
    #[arg(long, env = "BALLAST_IDENTITY_CLOCK_SKEW_ALLOWANCE", default_value = "20s",
          value_parser = ballast_flags::duration(Duration::ZERO, Duration::from_secs(3600)))]
    clock_skew_allowance: Duration,

    /// How often the issuer and anchor files are re-read.
    #[arg(long, env = "BALLAST_IDENTITY_RELOAD_INTERVAL", default_value = "2s", value_parser = TIMEOUT)]
    reload_interval: Duration,

    /// Certify requests checked and signed at once; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "BALLAST_IDENTITY_MAX_CONCURRENT_CERTIFY", default_value_t = service::DEFAULT_MAX_CONCURRENT_CERTIFY,
          value_parser = count(1, MANY))]
    max_concurrent_certify: usize,

    /// Certify requests per second one client address may make (after its burst).
    #[arg(long, env = "BALLAST_IDENTITY_CLIENT_RATE", default_value_t = service::DEFAULT_CLIENT_RATE,
          value_parser = parse_rate)]
    client_rate: f64,

    /// Certify requests one client address may make at once before --client-rate applies.
    #[arg(long, env = "BALLAST_IDENTITY_CLIENT_BURST", default_value_t = service::DEFAULT_CLIENT_BURST,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    client_burst: u32,

    /// Client addresses the rate limit tracks; beyond it, new clients are refused until others go idle.
    #[arg(long, env = "BALLAST_IDENTITY_MAX_TRACKED_CLIENTS", default_value_t = service::DEFAULT_MAX_TRACKED_CLIENTS,
          value_parser = count(1, MANY))]
    max_tracked_clients: usize,

    /// Largest Certify request accepted (bytes).
    #[arg(long, env = "BALLAST_IDENTITY_MAX_REQUEST_BYTES", default_value_t = service::DEFAULT_MAX_REQUEST_BYTES,
          value_parser = count(1024, 1 << 20))]
    max_request_bytes: usize,

    /// A connection's TLS handshake (or first byte) must complete within this.
    #[arg(long, env = "BALLAST_IDENTITY_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = TIMEOUT)]
    handshake_timeout: Duration,

    /// TLS handshakes in progress at once; more connections are closed.
    #[arg(long, env = "BALLAST_IDENTITY_MAX_HANDSHAKES", default_value_t = tls_server::DEFAULT_MAX_HANDSHAKES,
          value_parser = count(1, MANY))]
    max_handshakes: usize,

    /// Open client connections; a connection past it is closed at once and
    /// counted (grpc_server_connections_refused_total).
    #[arg(long, env = "BALLAST_IDENTITY_MAX_CONNECTIONS", default_value_t = tls_server::DEFAULT_MAX_CONNECTIONS,
          value_parser = count(1, MANY))]
    max_connections: usize,

    /// HTTP/2 streams per connection.
    #[arg(long, env = "BALLAST_IDENTITY_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    http2_max_concurrent_streams: u32,

    /// Resident memory (bytes; K, M, G suffixes as powers of 1024) the
    /// controller keeps under: past 85% of it Certify gets RESOURCE_EXHAUSTED
    /// with a retry hint (grpc-retry-pushback-ms) until it is back under 80%.
    /// Default: 75% of the container's memory limit (cgroup v2 memory.max or
    /// v1 memory.limit_in_bytes) when it has one, else none. 0: no limit.
    #[arg(long, env = "BALLAST_IDENTITY_MEMORY_LIMIT", value_parser = bytes::<u64>(MIB, 1 << 40).or_zero())]
    memory_limit: Option<u64>,

    /// After SIGTERM, how long open requests may finish.
    #[arg(long, env = "BALLAST_IDENTITY_SHUTDOWN_GRACE", default_value = "10s", value_parser = GRACE)]
    shutdown_grace: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Write a fresh trust anchor and issuer (ECDSA P-256, PEM) for local runs and tests:
    /// OUT/ca.crt (the trust anchors), OUT/ca.key, OUT/issuer/tls.crt and OUT/issuer/tls.key.
    Generate(GenerateArgs),
}

#[derive(ClapArgs)]
struct GenerateArgs {
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Keep OUT/ca.crt and OUT/ca.key; write only a new issuer under them (rotation).
    #[arg(long)]
    rotate_issuer: bool,
    /// Replace a trust anchor already in OUT (every certificate under it
    /// stops verifying). Without it an existing OUT/ca.crt or ca.key is
    /// never overwritten.
    #[arg(long, conflicts_with = "rotate_issuer")]
    force: bool,
    /// The control plane's namespace: the issuer is `identity.NS.TRUST_DOMAIN`, the anchor `root.NS.TRUST_DOMAIN`.
    #[arg(long, default_value = "linkerd", value_parser = dns_label)]
    controller_namespace: String,
    /// The trust domain, the last part of the certificates' names.
    #[arg(long, default_value = "cluster.local", value_parser = dns_name)]
    trust_domain: String,
    /// Lifetime of the issuer certificate.
    #[arg(long, default_value = "8760h", value_parser = ballast_flags::duration(Duration::from_secs(60), Duration::from_secs(100 * 366 * 86_400)))]
    issuer_lifetime: Duration,
    /// Lifetime of the trust anchor.
    #[arg(long, default_value = "87600h", value_parser = ballast_flags::duration(Duration::from_secs(60), Duration::from_secs(100 * 366 * 86_400)))]
    anchor_lifetime: Duration,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.001..=1_000_000.0).contains(&r) {
        return Err("must be between 0.001 and 1000000".into());
    }
    Ok(r)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::Generate(g)) => return generate_files(g),
        None => {}
    }
    let (Some(issuer_dir), Some(trust_anchors)) =
        (args.issuer_dir.clone(), args.trust_anchors.clone())
    else {
        anyhow::bail!("--issuer-dir and --trust-anchors are required (`ballast identity generate --out DIR` makes a pair for local runs)");
    };
    let own_name = IdentityName::for_service_account(
        &args.service_account,
        args.namespace.as_deref().unwrap_or(&args.controller_namespace),
        &args.controller_namespace,
        &args.trust_domain,
    )
    .map_err(|e| anyhow::anyhow!("--service-account, --controller-namespace and --trust-domain make no valid identity: {e}"))?;

    let validator = match &args.manifests {
        Some(dir) => {
            let tokens = ManifestTokens::new(dir.clone());
            tracing::info!(dir = %dir.display(), tokens = tokens.count().await, "tokens: service-account token Secrets in the manifests directory");
            TokenValidator::Manifests(tokens)
        }
        None => {
            let client = token::kube_client(args.kubeconfig.as_deref())
                .await
                .map_err(|e| anyhow::anyhow!("cannot set up the Kubernetes client ({e}); pass --manifests DIR to run without a cluster"))?;
            tracing::info!("tokens: TokenReview on the Kubernetes API");
            TokenValidator::Kubernetes(client)
        }
    };

    let (grpc, admin) = controller::listeners("identity", args.addr, args.admin_addr).await?;

    let memory = controller::memory_budget(args.memory_limit);
    let metrics = Metrics::default();
    let stats = Arc::new(ServeStats::default());
    let (registry, _sampler) = controller::registry(|r| {
        metrics.register(r);
        stats.register(r);
        memory.register(r);
    });

    let config = IdentityConfig {
        sign: SignConfig {
            lifetime: args.issuance_lifetime,
            clock_skew: args.clock_skew_allowance,
            control_ns: args.controller_namespace.clone(),
            trust_domain: args.trust_domain.clone(),
        },
        max_concurrent: args.max_concurrent_certify,
        client_rate: args.client_rate,
        client_burst: args.client_burst,
        max_tracked_clients: args.max_tracked_clients,
        max_request_bytes: args.max_request_bytes,
        memory: memory.clone(),
    };
    let service = IdentityService::new(config, validator, metrics);

    let (stop_tx, stop_rx) = watch::channel(false);

    let files = IssuerFiles {
        dir: issuer_dir,
        anchors: trust_anchors,
    };
    // The serving certificate chains to the anchors as they were at start;
    // anchors change with a restart (as Linkerd's do).
    let anchors = files
        .read()
        .ok()
        .and_then(|raw| ballast_meshtls::pem::certificates(&raw.anchors).ok());
    let own_store = CertStore::new();
    let tls_config = match anchors.as_deref().map(tls::root_store) {
        Some(Ok(roots)) => Some(tls::server_config(roots, own_store.clone(), &[])?),
        _ => {
            tracing::warn!(
                "trust anchors unreadable at start: serving plaintext only until restarted"
            );
            None
        }
    };
    let watch_task = tokio::spawn(service::watch_issuer(
        service.clone(),
        files,
        Some((own_name.clone(), own_store.clone())),
        args.reload_interval,
        controller::stopped(stop_rx.clone()),
    ));

    // Ready once the issuer loaded and, when serving TLS, the controller's
    // own certificate is issued: until then a TLS client is refused.
    let ready = service.clone();
    let serving_tls = tls_config.is_some().then(|| own_store.clone());
    let admin_state = AdminState::new(
        Arc::new(registry),
        Readiness::from_fn(move || {
            ready.status().is_ready() && serving_tls.as_ref().is_none_or(|own| own.is_ready())
        }),
    );
    let admin_task = tokio::spawn(
        AdminServer::new(admin_state).serve(admin, controller::stopped(stop_rx.clone())),
    );

    let incoming = tls_server::incoming(
        grpc,
        tls_config,
        ServeLimits {
            handshake_timeout: args.handshake_timeout,
            max_handshakes: args.max_handshakes,
            max_connections: args.max_connections,
            keepalive: Some(Duration::from_secs(10)),
        },
        stats,
    );
    tracing::info!(identity = %own_name, "serving TLS as");
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(args.http2_max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(100))
        .http2_max_local_error_reset_streams(Some(tls_server::h2_local_reset_budget(
            IDENTITY_HTTP2_MAX_LOCAL_ERROR_RESETS,
            args.http2_max_concurrent_streams,
        )))
        .http2_max_header_list_size(16 * 1024)
        .timeout(Duration::from_secs(30))
        .add_service(service.server())
        .serve_with_incoming_shutdown(incoming, controller::stopped(stop_rx.clone()));
    let mut grpc_task = tokio::spawn(server);

    let outcome: anyhow::Result<()> = tokio::select! {
        _ = ballast_sidecar::signal::shutdown() => Ok(()),
        r = &mut grpc_task => match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(anyhow::anyhow!("identity server failed: {e}")),
            Err(e) => Err(anyhow::anyhow!("identity server stopped: {e}")),
        },
    };
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(args.shutdown_grace, async {
        let _ = grpc_task.await;
        let _ = admin_task.await;
        let _ = watch_task.await;
    })
    .await;
    outcome
}

fn generate_files(g: GenerateArgs) -> anyhow::Result<()> {
    let config = GenerateConfig {
        control_ns: g.controller_namespace,
        trust_domain: g.trust_domain,
        anchor_lifetime: g.anchor_lifetime,
        issuer_lifetime: g.issuer_lifetime,
    };
    let issuer_dir = g.out.join("issuer");
    if !g.rotate_issuer && !g.force {
        // A new anchor silently replacing the mesh's would make every
        // certificate issued under the old one fail to verify.
        for name in ["ca.crt", "ca.key"] {
            let p = g.out.join(name);
            if p.exists() {
                anyhow::bail!(
                    "{} exists: not overwriting a trust anchor (--rotate-issuer keeps it and \
                     makes a new issuer; --force replaces it)",
                    p.display()
                );
            }
        }
    }
    std::fs::create_dir_all(&issuer_dir)
        .with_context(|| format!("cannot create {}", issuer_dir.display()))?;
    let (anchor_cert, anchor_key) = if g.rotate_issuer {
        let read = |name: &str| {
            let p = g.out.join(name);
            std::fs::read_to_string(&p)
                .with_context(|| format!("--rotate-issuer: cannot read {}", p.display()))
        };
        (read("ca.crt")?, read("ca.key")?)
    } else {
        let fresh = generate(&config).context("cannot generate the trust anchor")?;
        (fresh.anchor_cert, fresh.anchor_key)
    };
    let (issuer_cert, issuer_key) =
        issue_issuer(&anchor_cert, &anchor_key, &config).context("cannot generate the issuer")?;
    let write = |path: PathBuf, text: &str, secret: bool| -> anyhow::Result<()> {
        // Written beside, then renamed: a watcher never reads half a file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        if secret {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        }
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    };
    if !g.rotate_issuer {
        write(g.out.join("ca.crt"), &anchor_cert, false)?;
        write(g.out.join("ca.key"), &anchor_key, true)?;
    }
    // The key first: a watcher that sees the new certificate finds its key.
    write(issuer_dir.join("tls.key"), &issuer_key, true)?;
    write(issuer_dir.join("tls.crt"), &issuer_cert, false)?;
    println!(
        "trust anchors: {}\nissuer: {} (tls.crt, tls.key)",
        g.out.join("ca.crt").display(),
        issuer_dir.display()
    );
    Ok(())
}
