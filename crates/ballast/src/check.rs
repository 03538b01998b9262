//! `ballast check`: flags and wiring; the checks are ballast-check's.

use ballast_check::{cluster, manifests, Config};
use ballast_flags::{count, dns_label, duration, DAY, TIMEOUT};
use clap::{Args as ClapArgs, ValueEnum};
use std::{path::PathBuf, time::Duration};
use tracing::instrument::WithSubscriber;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line per check, findings indented below, a summary line.
    Human,
    /// A JSON document: {source, checks: [{name, category, status, detail,
    /// findings: [{severity, message, objects: [{kind, namespace, name}]}]}],
    /// summary: {ok, warn, fail, skipped}}.
    Json,
}

#[derive(ClapArgs)]
#[command(
    after_help = "Checks: control plane namespace, pods ready and RBAC grants (of the destination and \
identity controllers, and of the injector and viz when installed), policy CRDs; \
trust anchors and issuer (valid, not expiring within --expiry-warning, issuer signed by an anchor); \
no two live pods sharing an IP, no hostNetwork port clashes on a node, every Service selector \
matching a pod, meshed pods' proxies ready and of this version, no proxy sending traffic into its \
own listeners, Services' failure accrual annotations readable; the API server's clock (cluster only).\n\
Exit status: 0 when no check fails (warnings allowed), 1 when one fails or the cluster or \
directory cannot be read, 2 for invalid flags.\n\
Reads: pods and services in every namespace; Deployments, ServiceAccounts, the trust roots \
ConfigMap and the issuer Secret (by name; its key is dropped at once) in --namespace; \
ClusterRoles, ClusterRoleBindings and the policy CRDs."
)]
pub struct Args {
    /// A kubeconfig file. Without it (and without --manifests): KUBECONFIG,
    /// ~/.kube/config, or the in-cluster service account.
    #[arg(long, conflicts_with = "manifests")]
    kubeconfig: Option<PathBuf>,

    /// Check a manifests directory (YAML/JSON files, recursively) instead of a cluster.
    #[arg(long)]
    manifests: Option<PathBuf>,

    /// The control plane's namespace.
    #[arg(long, default_value = ballast_check::DEFAULT_NAMESPACE, value_parser = dns_label)]
    namespace: String,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "human")]
    output: Output,

    /// Certificates expiring sooner than this warn (0s to 3650d).
    #[arg(long, default_value = "60d", value_parser = duration(Duration::ZERO, Duration::from_secs(3650 * 86_400)))]
    expiry_warning: Duration,

    /// The API server's clock further than this from this machine's warns (1s to 1d).
    #[arg(long, default_value = "1m", value_parser = duration(Duration::from_secs(1), DAY))]
    max_clock_skew: Duration,

    /// Time each API request has to complete, body included (1ms to 1d).
    #[arg(long, default_value = "30s", value_parser = TIMEOUT)]
    timeout: Duration,

    /// Objects per LIST page (1 to 10000).
    #[arg(long, default_value_t = cluster::DEFAULT_PAGE_SIZE as usize, value_parser = count(1, 10_000))]
    page_size: usize,

    /// Objects read in all, cluster or directory; more is an error (1 to 10000000).
    #[arg(long, default_value_t = cluster::DEFAULT_MAX_OBJECTS, value_parser = count(1, 10_000_000))]
    max_objects: usize,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = Config {
        namespace: args.namespace.clone(),
        expiry_warning: args.expiry_warning,
        max_clock_skew: args.max_clock_skew,
        proxy_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let snapshot = match &args.manifests {
        Some(dir) => {
            let mut opts = manifests::ManifestOptions::new(dir.clone());
            opts.max_objects = args.max_objects;
            manifests::gather(&opts)?
        }
        None => {
            let opts = cluster::ClusterOptions {
                kubeconfig: args.kubeconfig.clone(),
                namespace: args.namespace.clone(),
                page_size: u32::try_from(args.page_size).unwrap_or(u32::MAX),
                max_objects: args.max_objects,
                timeout: args.timeout,
            };
            // kube's client logs each failed request at ERROR; the check
            // states a failure once, as its own one-line error.
            cluster::gather(&opts)
                .with_subscriber(tracing::subscriber::NoSubscriber::default())
                .await?
        }
    };
    let report = ballast_check::report(&snapshot, std::time::SystemTime::now(), &config);
    match args.output {
        Output::Human => print!("{}", report.to_human()),
        Output::Json => println!("{}", report.to_json()),
    }
    if report.failed() {
        anyhow::bail!("{}", report.summary_line());
    }
    Ok(())
}
