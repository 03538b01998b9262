//! `ballast init`: the iptables nat rules that send a pod's TCP through its
//! sidecar proxy, set in the current network namespace.
//!
//! Two chains of our own, `BALLAST_INBOUND` (jumped to from PREROUTING) and
//! `BALLAST_OUTBOUND` (from OUTPUT), are flushed and refilled on every run in
//! one `iptables-restore --noflush` transaction; the jumps to them are added
//! only when missing, so running it again leaves exactly one set of rules.
//! What to write is decided by pure functions ([`Rules::restore_input`]);
//! only [`run`] reads or changes the kernel's tables.

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, ValueEnum};
use std::{
    fmt,
    io::Write,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    str::FromStr,
};

pub const INBOUND_CHAIN: &str = "BALLAST_INBOUND";
pub const OUTBOUND_CHAIN: &str = "BALLAST_OUTBOUND";

/// iptables' multiport match takes at most 15 ports (a range counts two).
const MULTIPORT_LIMIT: usize = 15;

/// CAP_NET_ADMIN's bit in /proc/self/status `CapEff`.
const CAP_NET_ADMIN: u32 = 12;

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "Inbound: TCP arriving at the pod (PREROUTING) goes to the proxy's \
incoming port, except the --inbound-ports-to-ignore and sources in --subnets-to-ignore. \
Outbound: TCP the pod opens (OUTPUT) goes to the proxy's outgoing port, except the proxy's \
own (--proxy-uid, --proxy-gid), anything leaving through loopback, the \
--outbound-ports-to-ignore and destinations in --outbound-subnets-to-ignore.\n\
Needs root or CAP_NET_ADMIN (and CAP_NET_RAW for legacy iptables); --dry-run needs neither.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Port of the proxy's inbound listener: incoming TCP is redirected there.
    #[arg(
        long,
        env = "BALLAST_INIT_INCOMING_PROXY_PORT",
        default_value_t = 4143,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    incoming_proxy_port: u16,

    /// Port of the proxy's outbound listener: the workload's TCP is redirected there.
    #[arg(
        long,
        env = "BALLAST_INIT_OUTGOING_PROXY_PORT",
        default_value_t = 4140,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    outgoing_proxy_port: u16,

    /// User id the proxy runs as: its connections are never redirected (no loops).
    #[arg(long, env = "BALLAST_INIT_PROXY_UID", default_value_t = 2102)]
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
        default_value = "4190,4191,4567,4568"
    )]
    inbound_ports_to_ignore: PortList,

    /// Outbound destination ports (and LOW-HIGH ranges) never redirected, comma-separated.
    #[arg(
        long,
        env = "BALLAST_INIT_OUTBOUND_PORTS_TO_IGNORE",
        default_value = "4567,4568"
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
        default_value_t = IptablesMode::Plain
    )]
    iptables_mode: IptablesMode,

    /// Wait for the xtables lock instead of failing when another process holds it.
    #[arg(long, env = "BALLAST_INIT_USE_WAIT_FLAG")]
    use_wait_flag: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum IptablesMode {
    Plain,
    Legacy,
    Nft,
}

impl IptablesMode {
    /// The save and restore programs of this mode.
    fn programs(self) -> (&'static str, &'static str) {
        match self {
            IptablesMode::Plain => ("iptables-save", "iptables-restore"),
            IptablesMode::Legacy => ("iptables-legacy-save", "iptables-legacy-restore"),
            IptablesMode::Nft => ("iptables-nft-save", "iptables-nft-restore"),
        }
    }
}

/// A port or an inclusive range of ports.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortRange {
    low: u16,
    high: u16,
}

impl PortRange {
    /// Slots it takes in a multiport match.
    fn weight(self) -> usize {
        if self.low == self.high {
            1
        } else {
            2
        }
    }
}

impl fmt::Display for PortRange {
    /// In iptables' syntax: `N` or `LOW:HIGH`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}:{}", self.low, self.high)
        }
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let port = |p: &str| -> Result<u16, String> {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{p:?} is not a port (1-65535)")),
            }
        };
        let (low, high) = match s.split_once('-') {
            Some((low, high)) => (port(low)?, port(high)?),
            None => {
                let p = port(s)?;
                (p, p)
            }
        };
        if low > high {
            return Err(format!("port range {s:?} runs backwards"));
        }
        Ok(PortRange { low, high })
    }
}

/// Comma-separated ports and ranges; the empty string is the empty list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortList(Vec<PortRange>);

impl FromStr for PortList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(PortRange::from_str)
            .collect::<Result<_, _>>()
            .map(PortList)
    }
}

/// An IPv4 network.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    addr: Ipv4Addr,
    prefix: u8,
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.contains(':') {
            return Err(format!(
                "{s:?}: IPv6 networks are not supported (ballast init sets IPv4 rules)"
            ));
        }
        let (addr, prefix) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 CIDR (e.g. 10.0.0.0/8)"))?;
        let prefix: u8 = match prefix.parse() {
            Ok(p) if p <= 32 => p,
            _ => return Err(format!("{s:?}: the prefix length must be 0-32")),
        };
        // Normalised to the network address, as iptables prints it back.
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        Ok(Subnet {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        })
    }
}

/// Comma-separated networks; the empty string is the empty list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubnetList(Vec<Subnet>);

impl FromStr for SubnetList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Subnet::from_str)
            .collect::<Result<_, _>>()
            .map(SubnetList)
    }
}

/// What to redirect and what to leave alone; checked, then turned into rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    pub proxy_uid: u32,
    pub proxy_gid: Option<u32>,
    pub ports_to_redirect: Vec<PortRange>,
    pub inbound_ports_to_ignore: Vec<PortRange>,
    pub outbound_ports_to_ignore: Vec<PortRange>,
    pub subnets_to_ignore: Vec<Subnet>,
    pub outbound_subnets_to_ignore: Vec<Subnet>,
}

impl Rules {
    fn from_args(args: &Args) -> anyhow::Result<Rules> {
        if args.incoming_proxy_port == args.outgoing_proxy_port {
            bail!(
                "--incoming-proxy-port and --outgoing-proxy-port are both {}; \
                 the proxy's inbound and outbound listeners need different ports",
                args.incoming_proxy_port
            );
        }
        Ok(Rules {
            incoming_proxy_port: args.incoming_proxy_port,
            outgoing_proxy_port: args.outgoing_proxy_port,
            proxy_uid: args.proxy_uid,
            proxy_gid: args.proxy_gid,
            ports_to_redirect: args.ports_to_redirect.0.clone(),
            inbound_ports_to_ignore: args.inbound_ports_to_ignore.0.clone(),
            outbound_ports_to_ignore: args.outbound_ports_to_ignore.0.clone(),
            subnets_to_ignore: args.subnets_to_ignore.0.clone(),
            outbound_subnets_to_ignore: args.outbound_subnets_to_ignore.0.clone(),
        })
    }

    /// The rules of our two chains, in order, as `-A CHAIN ...` lines.
    pub fn chain_rules(&self) -> Vec<String> {
        let mut out = Vec::new();
        // The comment goes before the target, where iptables-save puts it.
        let rule = |chain: &str, spec: String, why: &str| {
            let (matches, target) = spec.split_once("-j ").unwrap_or((&spec, ""));
            format!("-A {chain} {matches}-m comment --comment \"ballast: {why}\" -j {target}")
        };

        // Inbound: first what is left alone, then the redirect.
        let i = INBOUND_CHAIN;
        for group in multiport_groups(&self.inbound_ports_to_ignore) {
            out.push(rule(
                i,
                format!("-p tcp -m multiport --dports {group} -j RETURN"),
                "ignore inbound ports",
            ));
        }
        for subnet in &self.subnets_to_ignore {
            out.push(rule(
                i,
                format!("-s {subnet} -j RETURN"),
                "ignore inbound source subnet",
            ));
        }
        let to_inbound = format!("-j REDIRECT --to-ports {}", self.incoming_proxy_port);
        if self.ports_to_redirect.is_empty() {
            out.push(rule(
                i,
                format!("-p tcp {to_inbound}"),
                "redirect incoming TCP to the proxy",
            ));
        } else {
            for group in multiport_groups(&self.ports_to_redirect) {
                out.push(rule(
                    i,
                    format!("-p tcp -m multiport --dports {group} {to_inbound}"),
                    "redirect incoming TCP to the proxy",
                ));
            }
        }

        // Outbound: the proxy's own connections, loopback, ignored ports and
        // networks go as they are; the rest to the proxy.
        let o = OUTBOUND_CHAIN;
        out.push(rule(
            o,
            format!("-m owner --uid-owner {} -j RETURN", self.proxy_uid),
            "ignore the proxy's uid",
        ));
        if let Some(gid) = self.proxy_gid {
            out.push(rule(
                o,
                format!("-m owner --gid-owner {gid} -j RETURN"),
                "ignore the proxy's gid",
            ));
        }
        out.push(rule(o, "-o lo -j RETURN".into(), "ignore loopback"));
        for subnet in &self.outbound_subnets_to_ignore {
            out.push(rule(
                o,
                format!("-d {subnet} -j RETURN"),
                "ignore outbound destination subnet",
            ));
        }
        for group in multiport_groups(&self.outbound_ports_to_ignore) {
            out.push(rule(
                o,
                format!("-p tcp -m multiport --dports {group} -j RETURN"),
                "ignore outbound ports",
            ));
        }
        out.push(rule(
            o,
            format!("-p tcp -j REDIRECT --to-ports {}", self.outgoing_proxy_port),
            "redirect outgoing TCP to the proxy",
        ));
        out
    }

    /// Input for `iptables-restore --noflush` that brings the nat table from
    /// `current` (what `iptables-save -t nat` printed; empty for a fresh
    /// namespace) to exactly one set of Ballast rules: our chains declared
    /// (which creates or flushes them) and refilled, and each jump to them
    /// added unless exactly it is there already (stray copies are deleted).
    pub fn restore_input(&self, current: &str) -> String {
        let mut out = String::from("*nat\n");
        for chain in [INBOUND_CHAIN, OUTBOUND_CHAIN] {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for line in self.chain_rules() {
            out.push_str(&line);
            out.push('\n');
        }
        for (from, to) in [("PREROUTING", INBOUND_CHAIN), ("OUTPUT", OUTBOUND_CHAIN)] {
            let wanted = jump(from, to);
            let present = jumps_in(current, from, to);
            if present == [wanted.as_str()] {
                continue;
            }
            for stray in present {
                out.push_str(&format!("-D{}\n", &stray[2..]));
            }
            out.push_str(&wanted);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
        out
    }
}

/// The jump from a built-in chain to ours, as iptables-save prints it.
fn jump(from: &str, to: &str) -> String {
    format!("-A {from} -p tcp -j {to}")
}

/// Lines of `saved` that append a jump from `from` to `to`, whatever their matches.
fn jumps_in<'a>(saved: &'a str, from: &str, to: &str) -> Vec<&'a str> {
    let head = format!("-A {from} ");
    let tail = format!(" -j {to}");
    saved
        .lines()
        .map(str::trim_end)
        .filter(|l| l.starts_with(&head) && l.ends_with(&tail))
        .collect()
}

/// Ports joined for `-m multiport --dports`, split so no group exceeds the
/// match's limit.
fn multiport_groups(ports: &[PortRange]) -> Vec<String> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut used = MULTIPORT_LIMIT;
    for p in ports {
        if used + p.weight() > MULTIPORT_LIMIT {
            groups.push(Vec::new());
            used = 0;
        }
        used += p.weight();
        if let Some(group) = groups.last_mut() {
            group.push(p.to_string());
        }
    }
    groups.into_iter().map(|g| g.join(",")).collect()
}

/// `program` as found on PATH.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether this process may change the network configuration.
fn has_net_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

const NEEDS_PRIVILEGE: &str = "ballast init needs CAP_NET_ADMIN / root to change iptables rules \
     (in Kubernetes: runAsUser 0 with capabilities NET_ADMIN and NET_RAW); --dry-run needs neither";

pub fn run(args: Args) -> anyhow::Result<()> {
    let rules = Rules::from_args(&args)?;
    if args.dry_run {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "# ballast init --dry-run: the nat rules a first run applies \
             (iptables-restore --noflush input); nothing was changed"
        )?;
        stdout.write_all(rules.restore_input("").as_bytes())?;
        return Ok(());
    }

    let (save_name, restore_name) = args.iptables_mode.programs();
    let (save, restore) = match (on_path(save_name), on_path(restore_name)) {
        (Some(s), Some(r)) => (s, r),
        _ => bail!(
            "iptables not found on PATH (looked for {save_name} and {restore_name}); install \
             iptables (Debian/Ubuntu: apt-get install iptables; Alpine: apk add iptables) \
             or choose another --iptables-mode"
        ),
    };
    if !has_net_admin() {
        bail!("{NEEDS_PRIVILEGE}");
    }

    let current = capture(&save, &["-t", "nat"])?;
    let input = rules.restore_input(&current);
    tracing::debug!("iptables-restore input:\n{input}");
    let mut cmd = Command::new(&restore);
    cmd.arg("--noflush");
    if args.use_wait_flag {
        cmd.arg("--wait");
    }
    feed(cmd, &input).with_context(|| format!("applying the rules:\n{input}"))?;

    let after = capture(&save, &["-t", "nat"])?;
    let ours = after
        .lines()
        .filter(|l| l.contains(INBOUND_CHAIN) || l.contains(OUTBOUND_CHAIN))
        .count();
    tracing::info!(
        inbound = rules.incoming_proxy_port,
        outbound = rules.outgoing_proxy_port,
        proxy_uid = rules.proxy_uid,
        "nat rules in place ({ours} lines in {INBOUND_CHAIN}, {OUTBOUND_CHAIN} and their jumps)"
    );
    Ok(())
}

/// Explains a failed iptables run; permission problems get the privilege hint.
fn failure(program: &Path, status: std::process::ExitStatus, stderr: &[u8]) -> anyhow::Error {
    let stderr = String::from_utf8_lossy(stderr);
    let stderr = stderr.trim();
    let lower = stderr.to_lowercase();
    if lower.contains("permission denied") || lower.contains("operation not permitted") {
        anyhow::anyhow!(
            "{} failed ({status}): {stderr}\n{NEEDS_PRIVILEGE}",
            program.display()
        )
    } else {
        anyhow::anyhow!("{} failed ({status}): {stderr}", program.display())
    }
}

fn capture(program: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !out.status.success() {
        return Err(failure(program, out.status, &out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn feed(mut cmd: Command, input: &str) -> anyhow::Result<()> {
    let program = PathBuf::from(cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("writing to {}", program.display()))?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(failure(&program, out.status, &out.stderr));
    }
    Ok(())
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

    fn rules(flags: &[&str]) -> Rules {
        let mut argv = vec!["init"];
        argv.extend_from_slice(flags);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        Rules::from_args(&cli.args).expect("flags are consistent")
    }

    #[test]
    fn defaults_redirect_both_ways_and_leave_the_proxy_alone() {
        let r = rules(&[]);
        let c = "-m comment --comment";
        assert_eq!(
            r.chain_rules(),
            vec![
                format!("-A BALLAST_INBOUND -p tcp -m multiport --dports 4190,4191,4567,4568 {c} \"ballast: ignore inbound ports\" -j RETURN"),
                format!("-A BALLAST_INBOUND -p tcp {c} \"ballast: redirect incoming TCP to the proxy\" -j REDIRECT --to-ports 4143"),
                format!("-A BALLAST_OUTBOUND -m owner --uid-owner 2102 {c} \"ballast: ignore the proxy's uid\" -j RETURN"),
                format!("-A BALLAST_OUTBOUND -o lo {c} \"ballast: ignore loopback\" -j RETURN"),
                format!("-A BALLAST_OUTBOUND -p tcp -m multiport --dports 4567,4568 {c} \"ballast: ignore outbound ports\" -j RETURN"),
                format!("-A BALLAST_OUTBOUND -p tcp {c} \"ballast: redirect outgoing TCP to the proxy\" -j REDIRECT --to-ports 4140"),
            ]
        );
    }

    #[test]
    fn a_fresh_table_gets_chains_rules_and_jumps() {
        let input = rules(&[]).restore_input("");
        let lines: Vec<&str> = input.lines().collect();
        assert_eq!(lines[0], "*nat");
        assert_eq!(lines[1], ":BALLAST_INBOUND - [0:0]");
        assert_eq!(lines[2], ":BALLAST_OUTBOUND - [0:0]");
        assert_eq!(
            &lines[lines.len() - 3..],
            [
                "-A PREROUTING -p tcp -j BALLAST_INBOUND",
                "-A OUTPUT -p tcp -j BALLAST_OUTBOUND",
                "COMMIT"
            ]
        );
    }

    /// What iptables-save prints after the first run (chains, rules, jumps).
    fn saved_after(r: &Rules, extra: &[&str]) -> String {
        let mut s = String::from(
            "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n\
             :OUTPUT ACCEPT [3:180]\n:POSTROUTING ACCEPT [0:0]\n\
             :BALLAST_INBOUND - [0:0]\n:BALLAST_OUTBOUND - [0:0]\n\
             -A PREROUTING -p tcp -j BALLAST_INBOUND\n-A OUTPUT -p tcp -j BALLAST_OUTBOUND\n",
        );
        for l in r
            .chain_rules()
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
        {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("COMMIT\n");
        s
    }

    #[test]
    fn a_second_run_refills_the_chains_and_adds_no_jump() {
        let r = rules(&[]);
        let input = r.restore_input(&saved_after(&r, &[]));
        assert!(!input.contains("PREROUTING"), "{input}");
        assert!(!input.contains("OUTPUT "), "{input}");
        // The chains are still declared (so flushed) and refilled.
        assert!(input.contains(":BALLAST_OUTBOUND - [0:0]\n"));
        assert_eq!(
            input
                .lines()
                .filter(|l| l.starts_with("-A BALLAST_"))
                .count(),
            r.chain_rules().len()
        );
        // Another run on the same table writes the same input: a fixed point.
        assert_eq!(input, r.restore_input(&saved_after(&r, &[])));
    }

    #[test]
    fn stray_or_changed_jumps_are_replaced_by_exactly_one() {
        let r = rules(&[]);
        let saved = saved_after(
            &r,
            &[
                "-A OUTPUT -p tcp -j BALLAST_OUTBOUND",
                "-A PREROUTING -i eth0 -j BALLAST_INBOUND",
            ],
        );
        let input = r.restore_input(&saved);
        let jumps: Vec<&str> = input
            .lines()
            .filter(|l| l.contains("PREROUTING") || l.contains("OUTPUT "))
            .collect();
        assert_eq!(
            jumps,
            [
                "-D PREROUTING -p tcp -j BALLAST_INBOUND",
                "-D PREROUTING -i eth0 -j BALLAST_INBOUND",
                "-A PREROUTING -p tcp -j BALLAST_INBOUND",
                "-D OUTPUT -p tcp -j BALLAST_OUTBOUND",
                "-D OUTPUT -p tcp -j BALLAST_OUTBOUND",
                "-A OUTPUT -p tcp -j BALLAST_OUTBOUND",
            ]
        );
    }

    #[test]
    fn ignored_ports_subnets_and_ids_come_before_the_redirects() {
        let r = rules(&[
            "--incoming-proxy-port=5143",
            "--outgoing-proxy-port=5140",
            "--proxy-uid=65534",
            "--proxy-gid=65533",
            "--inbound-ports-to-ignore=22,8000-8100",
            "--outbound-ports-to-ignore=",
            "--subnets-to-ignore=10.1.0.0/16",
            "--outbound-subnets-to-ignore=10.96.0.0/12, 192.168.1.7",
            "--ports-to-redirect=80,8080",
        ]);
        let rules = r.chain_rules();
        let specs: Vec<String> = rules
            .iter()
            .map(|l| {
                let (matches, rest) = l.split_once(" -m comment --comment ").unwrap();
                let target = rest.split_once("\" ").unwrap().1;
                format!("{matches} {target}")
            })
            .collect();
        assert_eq!(
            specs,
            [
                "-A BALLAST_INBOUND -p tcp -m multiport --dports 22,8000:8100 -j RETURN",
                "-A BALLAST_INBOUND -s 10.1.0.0/16 -j RETURN",
                "-A BALLAST_INBOUND -p tcp -m multiport --dports 80,8080 -j REDIRECT --to-ports 5143",
                "-A BALLAST_OUTBOUND -m owner --uid-owner 65534 -j RETURN",
                "-A BALLAST_OUTBOUND -m owner --gid-owner 65533 -j RETURN",
                "-A BALLAST_OUTBOUND -o lo -j RETURN",
                "-A BALLAST_OUTBOUND -d 10.96.0.0/12 -j RETURN",
                "-A BALLAST_OUTBOUND -d 192.168.1.7/32 -j RETURN",
                "-A BALLAST_OUTBOUND -p tcp -j REDIRECT --to-ports 5140",
            ]
        );
    }

    #[test]
    fn multiport_matches_are_split_at_fifteen_slots() {
        let ports: Vec<PortRange> = (1..=20u16)
            .map(|p| PortRange { low: p, high: p })
            .chain([PortRange {
                low: 100,
                high: 200,
            }])
            .collect();
        let groups = multiport_groups(&ports);
        assert_eq!(
            groups,
            [
                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15".to_string(),
                "16,17,18,19,20,100:200".to_string()
            ]
        );
        assert!(multiport_groups(&[]).is_empty());
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        for (flag, needle) in [
            ("--inbound-ports-to-ignore=0", "not a port"),
            ("--inbound-ports-to-ignore=70000", "not a port"),
            ("--outbound-ports-to-ignore=90-80", "backwards"),
            ("--outbound-subnets-to-ignore=10.0.0.0/33", "prefix"),
            ("--outbound-subnets-to-ignore=fd00::/8", "IPv6"),
            ("--subnets-to-ignore=ten", "not an IPv4 CIDR"),
            ("--iptables-mode=iptables", "invalid value"),
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
        .unwrap();
        let err = Rules::from_args(&cli.args).unwrap_err().to_string();
        assert!(err.contains("different ports"), "{err}");
    }

    #[test]
    fn subnets_are_normalised_to_their_network() {
        assert_eq!(
            "10.244.3.7/16".parse::<Subnet>().unwrap().to_string(),
            "10.244.0.0/16"
        );
        assert_eq!(
            "0.0.0.0/0".parse::<Subnet>().unwrap().to_string(),
            "0.0.0.0/0"
        );
    }

    #[test]
    fn every_mode_names_its_programs() {
        assert_eq!(
            IptablesMode::Nft.programs(),
            ("iptables-nft-save", "iptables-nft-restore")
        );
        assert_eq!(
            IptablesMode::Legacy.programs(),
            ("iptables-legacy-save", "iptables-legacy-restore")
        );
    }
}
