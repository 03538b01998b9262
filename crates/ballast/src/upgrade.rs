//! `ballast upgrade`: the installed control plane re-rendered by this
//! version, with its configuration and key material read back from the
//! cluster, for `kubectl apply -f -`.

use anyhow::Context;
use ballast_flags::{dns_label, non_empty as not_empty};
use ballast_install::{
    install_yaml,
    installed::{read, InstalledObjects},
    manifests,
};
use clap::Args as ClapArgs;
use serde_json::Value;
use std::{path::PathBuf, time::Duration};

#[derive(ClapArgs)]
#[command(
    after_help = "Reads the installed control plane (its Deployments, the trust anchors \
ConfigMap, the issuer and webhook Secrets and the webhook configuration) and prints it as this \
version renders it, for `ballast upgrade | kubectl apply -f -`: the same settings (images, domains, \
HA, failure policy, log level, the destination controller's resources and stream limits) unless a flag below changes one, and the same trust anchors, issuer \
and webhook certificate, so that meshed workloads keep verifying each other while the controllers \
roll one replica at a time (their disruption budgets and maxUnavailable 1)."
)]
pub struct Args {
    /// The control plane's namespace.
    #[arg(long, default_value = ballast_controlplane::DEFAULT_NAMESPACE, value_parser = dns_label)]
    namespace: String,

    /// A kubeconfig (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,

    /// A new `ballast` image for the controllers (default: the installed one).
    #[arg(long, value_parser = not_empty)]
    controller_image: Option<String>,

    /// A new proxy image for newly injected pods (default: the installed one).
    #[arg(long, value_parser = not_empty)]
    proxy_image: Option<String>,

    /// A new init container image for newly injected pods (default: the installed one).
    #[arg(long, value_parser = not_empty)]
    init_image: Option<String>,

    /// A new log filter for the controllers (default: the installed one).
    #[arg(long, value_parser = not_empty)]
    controller_log_level: Option<String>,

    /// Whether the destination controller's heap is in transparent huge
    /// pages (see `install --controller-huge-pages`; default: as installed).
    #[arg(long, value_name = "true|false")]
    controller_huge_pages: Option<bool>,

    /// The destination controller's CPU request (see `install
    /// --destination-cpu-request`; default: as installed).
    #[arg(long, value_name = "QUANTITY", value_parser = crate::install::quantity)]
    destination_cpu_request: Option<String>,

    /// The destination controller's memory request (default: as installed).
    #[arg(long, value_name = "QUANTITY", value_parser = crate::install::quantity)]
    destination_memory_request: Option<String>,

    /// The destination controller's memory limit (see `install
    /// --destination-memory-limit`; default: as installed).
    #[arg(long, value_name = "QUANTITY", value_parser = crate::install::quantity)]
    destination_memory_limit: Option<String>,

    /// The destination controller's stream limits (see `install
    /// --destination-max-streams`; default: as installed).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    destination_max_streams: Option<u32>,

    /// Print the CRDs too (they replace the cluster's; see `install --skip-crds`).
    #[arg(long)]
    include_crds: bool,
}

/// How long the cluster gets to answer each read.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `read`'s answer within the timeout, its error naming `what`.
async fn fetch(
    what: String,
    read: impl std::future::Future<Output = Result<Value, kube::Error>>,
) -> anyhow::Result<Value> {
    match tokio::time::timeout(TIMEOUT, read).await {
        Err(_) => Err(anyhow::anyhow!(
            "cannot read {what}: no answer within {}s",
            TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(anyhow::anyhow!(
            "cannot read {what}: {}",
            ballast_kubeconfig::first_line(&e.to_string())
        )),
        Ok(Ok(v)) => Ok(v),
    }
}

/// One object as JSON, `Null` when there is none.
async fn get<K>(api: kube::Api<K>, name: &str) -> Result<Value, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
        .unwrap_or(Value::Null))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    use k8s_openapi::api::{
        admissionregistration::v1::MutatingWebhookConfiguration,
        apps::v1::Deployment,
        core::v1::{ConfigMap, Secret},
    };
    let ns = args.namespace.as_str();
    let config = ballast_kubeconfig::load(args.kubeconfig.as_deref()).await?;
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), ns);
    let params = kube::api::ListParams::default().labels("app.kubernetes.io/part-of=ballast");
    let list = fetch(format!("the Deployments of {ns}"), async {
        deployments
            .list(&params)
            .await
            .map(|l| serde_json::to_value(l.items).unwrap_or(Value::Null))
    })
    .await?;
    let list: Vec<Value> = match list {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    let roots = fetch(
        format!("ConfigMap {ns}/{}", manifests::TRUST_ROOTS_CONFIG_MAP),
        get::<ConfigMap>(
            kube::Api::namespaced(client.clone(), ns),
            manifests::TRUST_ROOTS_CONFIG_MAP,
        ),
    )
    .await?;
    let issuer = fetch(
        format!("Secret {ns}/{}", manifests::ISSUER_SECRET),
        get::<Secret>(
            kube::Api::namespaced(client.clone(), ns),
            manifests::ISSUER_SECRET,
        ),
    )
    .await?;
    let tls = fetch(
        format!("Secret {ns}/{}", manifests::INJECTOR_TLS_SECRET),
        get::<Secret>(
            kube::Api::namespaced(client.clone(), ns),
            manifests::INJECTOR_TLS_SECRET,
        ),
    )
    .await?;
    let webhook = fetch(
        format!(
            "MutatingWebhookConfiguration {}",
            manifests::WEBHOOK_CONFIGURATION
        ),
        get::<MutatingWebhookConfiguration>(
            kube::Api::all(client.clone()),
            manifests::WEBHOOK_CONFIGURATION,
        ),
    )
    .await?;
    fn present(v: &Value) -> Option<&Value> {
        (!v.is_null()).then_some(v)
    }
    let (mut config, material) = read(&InstalledObjects {
        namespace: ns,
        deployments: &list,
        trust_roots: present(&roots),
        issuer: present(&issuer),
        injector_tls: present(&tls),
        webhook_configuration: present(&webhook),
    })?;
    if let Some(image) = args.controller_image {
        config.controller_image = image;
    }
    if let Some(image) = args.proxy_image {
        config.proxy_image = image;
    }
    if let Some(image) = args.init_image {
        config.init_image = image;
    }
    if let Some(level) = args.controller_log_level {
        config.log_level = level;
    }
    if let Some(huge) = args.controller_huge_pages {
        config.controller_huge_pages = huge;
    }
    let size = &mut config.destination;
    if let Some(q) = args.destination_cpu_request {
        size.cpu_request = q;
    }
    if let Some(q) = args.destination_memory_request {
        size.memory_request = q;
    }
    if let Some(q) = args.destination_memory_limit {
        size.memory_limit = q;
    }
    if let Some(n) = args.destination_max_streams {
        size.max_streams = Some(n);
    }
    // The installed values with the new ones: a request raised past the
    // installed limit is refused here, not by the API server mid-apply.
    crate::install::check_destination_size(&config.destination)?;
    config.crds = args.include_crds;
    print!("{}", install_yaml(&config, &material));
    Ok(())
}
