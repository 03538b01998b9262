//! `ballast uninstall`: references to what `ballast install` made, for
//! `kubectl delete -f -`.

use ballast_flags::dns_label;
use ballast_install::{uninstall_yaml, InstallConfig};
use clap::Args as ClapArgs;

#[derive(ClapArgs)]
#[command(
    after_help = "Prints a reference (apiVersion, kind, namespace, name) to every object \
`ballast install` makes, for `ballast uninstall | kubectl delete -f -`: the webhook configuration \
first (so that no pod creation waits on an injector being removed), the namespace last. Meshed \
workloads keep their proxies until they are re-created without them (`ballast inject --uninject`)."
)]
pub struct Args {
    /// The control plane's namespace (as given to `ballast install`).
    #[arg(long, default_value = ballast_controlplane::DEFAULT_NAMESPACE, value_parser = dns_label)]
    namespace: String,

    /// Delete the CRDs too. Deleting them deletes every HTTPRoute, GRPCRoute,
    /// Server, AuthorizationPolicy and ServiceProfile in the cluster,
    /// including those made for another mesh or gateway.
    #[arg(long)]
    include_crds: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = InstallConfig {
        namespace: args.namespace,
        ..InstallConfig::default()
    };
    print!("{}", uninstall_yaml(&config, args.include_crds));
    Ok(())
}
