//! `ballast install`: flags to `ballast_install::InstallConfig`, key
//! material generated or read, manifests to stdout (or deploy/'s files).

use anyhow::Context;
use ballast_flags::{dns_label, dns_name, non_empty as not_empty, UsageError};
use ballast_inject::values::{self, parse_quantity};
use ballast_install::{
    deploy_files, install_yaml, manifests,
    pki::{IdentityPki, WebhookTls, WEBHOOK_CERT_LIFETIME},
    secrets_yaml, DestinationSize, FailurePolicy, InstallConfig, KeyMaterial,
};
use clap::Args as ClapArgs;
use std::{path::PathBuf, time::SystemTime};

#[derive(ClapArgs)]
#[command(after_help = "Prints every manifest the control plane needs, for \
`ballast install | kubectl apply -f -`: the namespace, the CRDs, RBAC, the destination, identity \
and injector Deployments with their Services and disruption budgets, the trust anchors ConfigMap, \
the issuer Secret, the injector's serving certificate and the MutatingWebhookConfiguration. \
The trust anchor and issuer are generated (ECDSA P-256, 10 years and 1 year) unless given by \
the three --identity-*-file flags; the webhook's CA and certificate are always generated (1 year). \
The output is the same for the same flags and files, but for generated key material.\n\
deploy/ is `--deploy-dir deploy/`: all but the key material, which `--secrets-only` prints.")]
pub struct Args {
    /// The control plane's namespace.
    #[arg(long, default_value = "ballast", value_parser = dns_label)]
    namespace: String,

    /// The `ballast` image the controllers and the injector run.
    #[arg(long, default_value = "ballast:latest", value_parser = not_empty)]
    controller_image: String,

    /// The proxy image the injector adds to pods.
    #[arg(long, default_value = ballast_inject::config::DEFAULT_PROXY_IMAGE, value_parser = not_empty)]
    proxy_image: String,

    /// The init container image the injector adds to pods.
    #[arg(long, default_value = ballast_inject::config::DEFAULT_INIT_IMAGE, value_parser = not_empty)]
    init_image: String,

    /// imagePullPolicy of every container.
    #[arg(long, default_value = "IfNotPresent", value_parser = ["Always", "IfNotPresent", "Never"])]
    image_pull_policy: String,

    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local", value_parser = dns_name)]
    cluster_domain: String,

    /// The mesh's trust domain, the last part of every identity name.
    #[arg(long, default_value = "cluster.local", value_parser = dns_name)]
    identity_trust_domain: String,

    /// The trust anchors (PEM) to install instead of a generated one; with
    /// the issuer's certificate and key.
    #[arg(long, requires_all = ["identity_issuer_certificate_file", "identity_issuer_key_file"])]
    identity_trust_anchors_file: Option<PathBuf>,

    /// The issuer's certificate (PEM), under the trust anchors.
    #[arg(long, requires_all = ["identity_trust_anchors_file", "identity_issuer_key_file"])]
    identity_issuer_certificate_file: Option<PathBuf>,

    /// The issuer's private key (PEM, ECDSA P-256).
    #[arg(long, requires_all = ["identity_trust_anchors_file", "identity_issuer_certificate_file"])]
    identity_issuer_key_file: Option<PathBuf>,

    /// High availability: three replicas of each controller, never two on
    /// one node (otherwise two, spread when possible). Every controller has a
    /// PodDisruptionBudget of maxUnavailable 1 either way.
    #[arg(long)]
    ha: bool,

    /// What the API server does with a pod when the injector cannot answer:
    /// Ignore admits it without a proxy (Linkerd's default), Fail refuses it.
    #[arg(long, default_value = "Ignore", value_parser = ["Ignore", "Fail"])]
    webhook_failure_policy: String,

    /// How long the API server waits for the injector (seconds, 1 to 30).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=30))]
    webhook_timeout: u32,

    /// The controllers' log filter (BALLAST_LOG).
    #[arg(long, default_value = "info", value_parser = not_empty)]
    controller_log_level: String,

    /// Write deploy/'s files into DIR (everything but the key material, one
    /// file per component) instead of printing.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["secrets_only", "identity_trust_anchors_file"])]
    deploy_dir: Option<PathBuf>,

    /// Print only the key material: the trust anchors ConfigMap, the issuer
    /// and webhook Secrets and the webhook configuration (what deploy/ leaves out).
    #[arg(long)]
    secrets_only: bool,

    /// Leave the CustomResourceDefinitions out: for a cluster that already
    /// has Gateway API or Linkerd's CRDs, whose complete schemas Ballast's
    /// minimal ones would replace (`ballast check` says whether the
    /// installed ones serve the versions Ballast reads).
    #[arg(long, conflicts_with = "secrets_only")]
    skip_crds: bool,

    /// Whether the destination controller's heap is in transparent huge
    /// pages (jemalloc's `thp:always` in one arena, through
    /// _RJEM_MALLOC_CONF in its container). On by default: measured about a
    /// fifth less CPU per update fanned out, for 8% more resident memory
    /// with 100,000 streams and 2 MiB more in an idle controller
    /// (bench/RESULTS.md). `--controller-huge-pages false` keeps 4 KiB
    /// pages. Where the node allows no huge pages (`never` in
    /// /sys/kernel/mm/transparent_hugepage/enabled) the heap stays in 4 KiB
    /// pages either way. The memory budget counts what the kernel charges.
    #[arg(
        long,
        value_name = "true|false",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    controller_huge_pages: bool,

    /// The destination controller's CPU request. Its fan-out is CPU-bound:
    /// an update to 1,000 streams costs it 9-12 ms of CPU, and its latency
    /// follows the CPU it gets beside busy neighbours (bench/RESULTS.md).
    #[arg(long, value_name = "QUANTITY", default_value = "100m", value_parser = quantity)]
    destination_cpu_request: String,

    /// The destination controller's memory request.
    #[arg(long, value_name = "QUANTITY", default_value = "64Mi", value_parser = quantity)]
    destination_memory_request: String,

    /// The destination controller's memory limit (at least 64Mi). Its
    /// memory budget is three quarters of it, and it refuses new streams
    /// past 85% of the budget: 256Mi holds the default 20,000 + 20,000
    /// streams (10,000 proxies) at 10,000 pods; a stream costs about 2 KB.
    #[arg(long, value_name = "QUANTITY", default_value = "256Mi", value_parser = quantity)]
    destination_memory_limit: String,

    /// The destination controller's stream limits: rendered as both its
    /// --max-streams (Get + GetProfile) and --max-policy-streams (default:
    /// its own, 20,000 each). Each proxy opens about two of each.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    destination_max_streams: Option<u32>,
}

/// A Kubernetes quantity, as the API server would accept it.
pub(crate) fn quantity(s: &str) -> Result<String, values::InvalidValue> {
    parse_quantity(s)?;
    Ok(s.to_string())
}

/// The least memory limit the destination controller is given: it idles
/// near 20 MiB, and its budget is three quarters of the limit.
const MIN_DESTINATION_MEMORY_LIMIT: f64 = 64.0 * 1024.0 * 1024.0;

/// What Kubernetes or the controller would refuse later, refused now as a
/// usage error (exit code 2, as clap's): a memory request above the limit,
/// a limit the controller cannot start in.
pub(crate) fn check_destination_size(size: &DestinationSize) -> anyhow::Result<()> {
    let usage = |why: String| anyhow::Error::new(UsageError(why));
    let bytes = |flag: &str, q: &str| {
        parse_quantity(q)
            .map(|q| q.value)
            .map_err(|e| usage(format!("--destination-{flag}: {e}")))
    };
    parse_quantity(&size.cpu_request)
        .map_err(|e| usage(format!("--destination-cpu-request: {e}")))?;
    let request = bytes("memory-request", &size.memory_request)?;
    let limit = bytes("memory-limit", &size.memory_limit)?;
    if limit < MIN_DESTINATION_MEMORY_LIMIT {
        return Err(usage(format!(
            "--destination-memory-limit ({}) is under 64Mi: the controller idles near 20 MiB \
             and its memory budget is three quarters of the limit",
            size.memory_limit
        )));
    }
    if request > limit {
        return Err(usage(format!(
            "--destination-memory-request ({}) must not be more than \
             --destination-memory-limit ({}): Kubernetes refuses such a container",
            size.memory_request, size.memory_limit
        )));
    }
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = InstallConfig {
        namespace: args.namespace,
        controller_image: args.controller_image,
        proxy_image: args.proxy_image,
        init_image: args.init_image,
        image_pull_policy: args.image_pull_policy,
        cluster_domain: args.cluster_domain,
        trust_domain: args.identity_trust_domain,
        log_level: args.controller_log_level,
        ha: args.ha,
        webhook_failure_policy: args
            .webhook_failure_policy
            .parse::<FailurePolicy>()
            .map_err(|e| anyhow::anyhow!("--webhook-failure-policy: {e}"))?,
        webhook_timeout_seconds: args.webhook_timeout,
        crds: !args.skip_crds,
        controller_huge_pages: args.controller_huge_pages,
        destination: DestinationSize {
            cpu_request: args.destination_cpu_request,
            memory_request: args.destination_memory_request,
            memory_limit: args.destination_memory_limit,
            max_streams: args.destination_max_streams,
        },
    };
    check_destination_size(&config.destination)?;

    if let Some(dir) = &args.deploy_dir {
        for (file, text) in deploy_files(&config) {
            let path = dir.join(&file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }

    let identity = match (
        &args.identity_trust_anchors_file,
        &args.identity_issuer_certificate_file,
        &args.identity_issuer_key_file,
    ) {
        (Some(anchors), Some(cert), Some(key)) => {
            IdentityPki::from_files(anchors, cert, key, SystemTime::now())?
        }
        _ => IdentityPki::generate(&config.trust_domain)?,
    };
    let webhook = WebhookTls::generate(
        manifests::INJECTOR,
        &config.namespace,
        &config.cluster_domain,
        WEBHOOK_CERT_LIFETIME,
    )?;
    let material = KeyMaterial { identity, webhook };
    let text = if args.secrets_only {
        secrets_yaml(&config, &material)
    } else {
        install_yaml(&config, &material)
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    Ok(())
}
