//! The rule model: what to redirect and what to leave alone, and the
//! `iptables-restore` input that brings a nat table to exactly that. Pure:
//! no IO, so every rule is unit-tested here.

use std::{fmt, net::Ipv4Addr, str::FromStr};

/// Our chain for TCP arriving at the pod, jumped to from PREROUTING.
pub const INBOUND_CHAIN: &str = "BALLAST_INBOUND";
/// Our chain for TCP the pod opens, jumped to from OUTPUT.
pub const OUTBOUND_CHAIN: &str = "BALLAST_OUTBOUND";

/// The proxy's inbound listener port (Linkerd's).
pub const DEFAULT_INCOMING_PROXY_PORT: u16 = 4143;
/// The proxy's outbound listener port (Linkerd's).
pub const DEFAULT_OUTGOING_PROXY_PORT: u16 = 4140;
/// The uid the proxy runs as (Linkerd's).
pub const DEFAULT_PROXY_UID: u32 = 2102;
/// The proxy's own control and admin ports, and 4567,4568, as Linkerd ignores them.
pub const DEFAULT_INBOUND_PORTS_TO_IGNORE: &str = "4190,4191,4567,4568";
/// Outbound ports Linkerd leaves alone by default.
pub const DEFAULT_OUTBOUND_PORTS_TO_IGNORE: &str = "4567,4568";

/// iptables' multiport match takes at most 15 ports (a range counts two).
const MULTIPORT_LIMIT: usize = 15;

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
pub struct PortList(pub Vec<PortRange>);

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
pub struct SubnetList(pub Vec<Subnet>);

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

/// Rules that cannot work together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RulesError {
    /// Both redirects would go to one listener.
    #[error(
        "--incoming-proxy-port and --outgoing-proxy-port are both {0}; \
         the proxy's inbound and outbound listeners need different ports"
    )]
    SamePorts(u16),
}

impl Rules {
    /// These rules, if they can work: both directions need their own listener.
    pub fn check(self) -> Result<Rules, RulesError> {
        if self.incoming_proxy_port == self.outgoing_proxy_port {
            return Err(RulesError::SamePorts(self.incoming_proxy_port));
        }
        Ok(self)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules `ballast init` applies with no flags.
    fn defaults() -> Rules {
        Rules {
            incoming_proxy_port: DEFAULT_INCOMING_PROXY_PORT,
            outgoing_proxy_port: DEFAULT_OUTGOING_PROXY_PORT,
            proxy_uid: DEFAULT_PROXY_UID,
            proxy_gid: None,
            ports_to_redirect: Vec::new(),
            inbound_ports_to_ignore: ports(DEFAULT_INBOUND_PORTS_TO_IGNORE),
            outbound_ports_to_ignore: ports(DEFAULT_OUTBOUND_PORTS_TO_IGNORE),
            subnets_to_ignore: Vec::new(),
            outbound_subnets_to_ignore: Vec::new(),
        }
    }

    fn ports(s: &str) -> Vec<PortRange> {
        s.parse::<PortList>().expect("test ports parse").0
    }

    fn subnets(s: &str) -> Vec<Subnet> {
        s.parse::<SubnetList>().expect("test subnets parse").0
    }

    #[test]
    fn defaults_redirect_both_ways_and_leave_the_proxy_alone() {
        let r = defaults();
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
        let input = defaults().restore_input("");
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
        let r = defaults();
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
        let r = defaults();
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
        let r = Rules {
            incoming_proxy_port: 5143,
            outgoing_proxy_port: 5140,
            proxy_uid: 65534,
            proxy_gid: Some(65533),
            ports_to_redirect: ports("80,8080"),
            inbound_ports_to_ignore: ports("22,8000-8100"),
            outbound_ports_to_ignore: ports(""),
            subnets_to_ignore: subnets("10.1.0.0/16"),
            outbound_subnets_to_ignore: subnets("10.96.0.0/12, 192.168.1.7"),
        };
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
        for (value, needle) in [
            ("0", "not a port"),
            ("70000", "not a port"),
            ("90-80", "backwards"),
        ] {
            let err = value.parse::<PortList>().expect_err(value);
            assert!(err.contains(needle), "{value}: {err}");
        }
        for (value, needle) in [
            ("10.0.0.0/33", "prefix"),
            ("fd00::/8", "IPv6"),
            ("ten", "not an IPv4 CIDR"),
        ] {
            let err = value.parse::<SubnetList>().expect_err(value);
            assert!(err.contains(needle), "{value}: {err}");
        }
        let same = Rules {
            outgoing_proxy_port: DEFAULT_INCOMING_PROXY_PORT,
            ..defaults()
        };
        let err = same.check().expect_err("same ports").to_string();
        assert!(err.contains("different ports"), "{err}");
        assert!(defaults().check().is_ok());
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
}
