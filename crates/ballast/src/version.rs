//! `ballast version`: this binary's version, and the installed control
//! plane's (each Deployment's `app.kubernetes.io/version` and image).

use ballast_flags::dns_label;
use clap::Args as ClapArgs;
use std::{path::PathBuf, time::Duration};

#[derive(ClapArgs)]
pub struct Args {
    /// Print only the client's version; do not ask the cluster.
    #[arg(long)]
    client: bool,

    /// The control plane's namespace.
    #[arg(long, default_value = ballast_controlplane::DEFAULT_NAMESPACE, value_parser = dns_label)]
    namespace: String,

    /// A kubeconfig (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// How long the cluster gets to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(args: Args) -> anyhow::Result<()> {
    println!("Client version: {}", env!("CARGO_PKG_VERSION"));
    if args.client {
        return Ok(());
    }
    // As `linkerd version`: an unreachable control plane is said, not an error.
    match server_versions(&args).await {
        Ok(lines) if lines.is_empty() => println!(
            "Server version: unavailable (no Ballast Deployment in namespace {})",
            args.namespace
        ),
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
        }
        Err(e) => println!("Server version: unavailable ({e})"),
    }
    Ok(())
}

async fn server_versions(args: &Args) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::apps::v1::Deployment;
    let config = ballast_kubeconfig::load(args.kubeconfig.as_deref()).await?;
    let client = kube::Client::try_from(config)?;
    let api: kube::Api<Deployment> = kube::Api::namespaced(client, &args.namespace);
    let params = kube::api::ListParams::default().labels("app.kubernetes.io/part-of=ballast");
    let list = tokio::time::timeout(TIMEOUT, api.list(&params))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {}s", TIMEOUT.as_secs()))?
        .map_err(|e| anyhow::anyhow!("{}", ballast_kubeconfig::first_line(&e.to_string())))?;
    let mut lines: Vec<String> = list
        .items
        .iter()
        .map(|d| {
            let name = d.metadata.name.as_deref().unwrap_or("?");
            let version = d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/version"))
                .map_or("unknown", String::as_str);
            let image = d
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.as_deref())
                .unwrap_or("?");
            format!("Server version: {name} {version} ({image})")
        })
        .collect();
    lines.sort();
    Ok(lines)
}
