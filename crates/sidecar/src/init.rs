//! `ballast init`: flags, then the rules of `ballast-init` applied (or
//! printed, with --dry-run).

use ballast_init::{
    rules::{
        DEFAULT_INBOUND_PORTS_TO_IGNORE, DEFAULT_INCOMING_PROXY_PORT,
        DEFAULT_OUTBOUND_PORTS_TO_IGNORE, DEFAULT_OUTGOING_PROXY_PORT, DEFAULT_PROXY_UID,
    },
    IptablesMode, PortList, Rules, Runner, SubnetList,
};
use clap::{Args as ClapArgs, ValueEnum};

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "Inbound: TCP arriving at the pod (PREROUTING) goes to the proxy's \
incoming port, except the --inbound-ports-to-ignore and sources in --subnets-to-ignore. \
Outbound: TCP the pod opens (OUTPUT) goes to the proxy's outgoing port, except the proxy's \
own (--proxy-uid, --proxy-gid), anything leaving through loopback, the \
--outbound-ports-to-ignore and destinations in --outbound-subnets-to-ignore.\n\
Needs root or CAP_NET_ADMIN (and CAP_NET_RAW for legacy iptables); --dry-run needs neither.\n\
Run in a pod's network namespace (as its init container). In one that looks like a host's \
(hardware or wireless devices, or the host ends of container networks such as docker0, cni0 or \
veth*, in PID 1's namespace) it refuses, naming what it saw, and exits 1 without changing \
anything: on a host the rules would send every TCP connection to a proxy that is not there. \
--force overrides this (pods with SR-IOV devices, or in virtual machines such as Kata).\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Port of the proxy's inbound listener: incoming TCP is redirected there.
    #[arg(
        long,
        env = "BALLAST_INIT_INCOMING_PROXY_PORT",
        default_value_t = DEFAULT_INCOMING_PROXY_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    incoming_proxy_port: u16,

    /// Port of the proxy's outbound listener: the workload's TCP is redirected there.
    #[arg(
        long,
        env = "BALLAST_INIT_OUTGOING_PROXY_PORT",
        default_value_t = DEFAULT_OUTGOING_PROXY_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    outgoing_proxy_port: u16,

    /// User id the proxy runs as: its connections are never redirected (no loops).
    #[arg(long, env = "BALLAST_INIT_PROXY_UID", default_value_t = DEFAULT_PROXY_UID)]
    proxy_uid: u32,

    /// Group id whose connections are never redirected either (unset: none).
    #[arg(long, env = "BALLAST_INIT_PROXY_GID")]
    proxy_gid: Option<u32>,

    /// Inbound ports redirected to the proxy, comma-separated, ranges as
    /// LOW-HIGH (empty: every port).
    #[arg(long, env = "BALLAST_INIT_PORTS_TO_REDIRECT", default_value = "")]
    ports_to_redirect: PortList,

    /// Inbound ports (and LOW-HIGH ranges) never redirected, comma-separated;
    /// the defaults are the proxy's own control and admin ports and 4567,4568.
    #[arg(
        long,
        env = "BALLAST_INIT_INBOUND_PORTS_TO_IGNORE",
        default_value = DEFAULT_INBOUND_PORTS_TO_IGNORE
    )]
    inbound_ports_to_ignore: PortList,

    /// Outbound destination ports (and LOW-HIGH ranges) never redirected, comma-separated.
    #[arg(
        long,
        env = "BALLAST_INIT_OUTBOUND_PORTS_TO_IGNORE",
        default_value = DEFAULT_OUTBOUND_PORTS_TO_IGNORE
    )]
    outbound_ports_to_ignore: PortList,

    /// Source networks (IPv4 CIDRs, comma-separated) whose incoming TCP is not redirected.
    #[arg(long, env = "BALLAST_INIT_SUBNETS_TO_IGNORE", default_value = "")]
    subnets_to_ignore: SubnetList,

    /// Destination networks (IPv4 CIDRs, comma-separated) the workload reaches
    /// directly, not through the proxy.
    #[arg(
        long,
        env = "BALLAST_INIT_OUTBOUND_SUBNETS_TO_IGNORE",
        default_value = ""
    )]
    outbound_subnets_to_ignore: SubnetList,

    /// Print the rules a first run applies (iptables-restore input) and change nothing.
    #[arg(long, visible_alias = "simulate", env = "BALLAST_INIT_DRY_RUN")]
    dry_run: bool,

    /// Which iptables to run: `plain` (iptables-save/-restore on PATH, whatever
    /// their backend), `legacy` (iptables-legacy-*) or `nft` (iptables-nft-*).
    /// Use the backend the node's kube-proxy uses.
    #[arg(
        long,
        env = "BALLAST_INIT_IPTABLES_MODE",
        value_enum,
        default_value_t = Mode::Plain
    )]
    iptables_mode: Mode,

    /// Wait for the xtables lock instead of failing when another process holds it.
    #[arg(long, env = "BALLAST_INIT_USE_WAIT_FLAG")]
    use_wait_flag: bool,

    /// Apply the rules even where the network namespace looks like a host's, not a pod's.
    #[arg(long, env = "BALLAST_INIT_FORCE")]
    force: bool,
}

/// `--iptables-mode`'s values; `ballast-init` knows nothing of clap.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Plain,
    Legacy,
    Nft,
}

impl From<Mode> for IptablesMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Plain => IptablesMode::Plain,
            Mode::Legacy => IptablesMode::Legacy,
            Mode::Nft => IptablesMode::Nft,
        }
    }
}

impl Args {
    fn rules(&self) -> Result<Rules, ballast_init::RulesError> {
        Rules {
            incoming_proxy_port: self.incoming_proxy_port,
            outgoing_proxy_port: self.outgoing_proxy_port,
            proxy_uid: self.proxy_uid,
            proxy_gid: self.proxy_gid,
            ports_to_redirect: self.ports_to_redirect.0.clone(),
            inbound_ports_to_ignore: self.inbound_ports_to_ignore.0.clone(),
            outbound_ports_to_ignore: self.outbound_ports_to_ignore.0.clone(),
            subnets_to_ignore: self.subnets_to_ignore.0.clone(),
            outbound_subnets_to_ignore: self.outbound_subnets_to_ignore.0.clone(),
        }
        .check()
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rules = args.rules()?;
    if args.dry_run {
        Runner::dry_run(&rules, &mut std::io::stdout().lock())?;
        return Ok(());
    }
    let runner = Runner {
        mode: args.iptables_mode.into(),
        wait_for_lock: args.use_wait_flag,
    };
    if !args.force {
        let facts = ballast_init::NetnsFacts::gather();
        if let ballast_init::HostCheck::LooksLikeHost { evidence } =
            ballast_init::HostCheck::judge(&facts)
        {
            anyhow::bail!(
                "refusing to redirect this network namespace's TCP: it looks like a host's, not a pod's ({}); \
                 run `ballast init` as a pod's init container, or pass --force if this is one",
                evidence.join("; ")
            );
        }
    }
    Ok(runner.apply(&rules)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn the_flags_default_to_linkerds_ports_and_uid() {
        let cli = Cli::try_parse_from(["init"]).expect("no flags parse");
        let rules = cli.args.rules().expect("defaults are consistent");
        assert_eq!(rules.incoming_proxy_port, 4143);
        assert_eq!(rules.outgoing_proxy_port, 4140);
        assert_eq!(rules.proxy_uid, 2102);
        assert_eq!(rules.inbound_ports_to_ignore.len(), 4);
        assert_eq!(cli.args.iptables_mode, Mode::Plain);
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        for (flag, needle) in [
            ("--inbound-ports-to-ignore=0", "not a port"),
            ("--outbound-subnets-to-ignore=fd00::/8", "IPv6"),
            ("--iptables-mode=iptables", "invalid value"),
            ("--incoming-proxy-port=0", "--incoming-proxy-port"),
        ] {
            let err = match Cli::try_parse_from(["init", flag]) {
                Ok(_) => panic!("{flag} was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(needle), "{flag}: {err}");
        }
        let cli = Cli::try_parse_from([
            "init",
            "--incoming-proxy-port=4140",
            "--outgoing-proxy-port=4140",
        ])
        .expect("each flag parses");
        let err = cli.args.rules().expect_err("same ports").to_string();
        assert!(err.contains("different ports"), "{err}");
    }
}
