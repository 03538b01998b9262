//! A guard against running `ballast init` on a host: its rules would send
//! every TCP connection of the machine to a proxy that is not there.
//!
//! [`HostCheck::judge`] decides from [`NetnsFacts`] alone (table-tested);
//! [`NetnsFacts::gather`] reads them from `/proc` and `/sys`.
//!
//! A pod's network namespace holds `lo`, its `eth0` (one end of a veth
//! pair: no hardware behind it) and perhaps the kernel's fallback tunnel
//! devices. A host's holds hardware (`/sys/class/net/DEV/device`), wireless
//! devices, or the host ends of containers' networks (`docker0`, `cni0`,
//! `veth…`, `cali…`, bridges). The namespace is judged a host's when it
//! shows any of these, unless it is plainly not PID 1's namespace (one made
//! with `ip netns add` or `unshare`: PID 1 of a host runs in the host's).
//! A process without CAP_NET_ADMIN cannot change the tables, so it is not
//! stopped here (iptables then says what is missing).
//!
//! Known false alarms, for `--force`: pods given hardware devices (SR-IOV
//! virtual functions) and pods in virtual machines (Kata Containers), where
//! `eth0` is a virtio device.

use std::{fs, path::Path};

/// Interface names that are the host side of containers' or VMs' networks.
const HOST_SIDE_PREFIXES: &[&str] = &[
    "docker",
    "cni",
    "cbr",
    "br-",
    "virbr",
    "veth",
    "cali",
    "flannel",
    "vxlan",
    "kube-",
    "lxc",
    "podman",
    "cilium_",
    "weave",
    "tailscale",
    "wg",
    "tun",
    "tap",
    "wl",
    "ww",
    "vmnet",
    "vboxnet",
];

/// Devices the kernel puts in every namespace when their module is loaded.
const FALLBACK_DEVICES: &[&str] = &[
    "tunl0", "gre0", "gretap0", "erspan0", "ip_vti0", "ip6_vti0", "sit0", "ip6tnl0", "ip6gre0",
];

/// Evidence named in a refusal, at most this many interfaces per kind.
const NAMED_PER_KIND: usize = 4;

/// One network interface of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// A hardware (or virtual machine's) device is behind it.
    pub hardware: bool,
    pub wireless: bool,
}

/// Whether this process's network namespace is PID 1's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pid1Netns {
    Same,
    Different,
    /// `/proc/1/ns/net` could not be read.
    Unknown,
}

/// What the current network namespace looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsFacts {
    pub pid1: Pid1Netns,
    pub interfaces: Vec<Interface>,
    /// The process has CAP_NET_ADMIN, without which no table can change.
    pub can_change_tables: bool,
}

/// The verdict on a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostCheck {
    /// Nothing says host (or nothing could change): go ahead.
    Proceed,
    /// It looks like a host's namespace; each string names one piece of evidence.
    LooksLikeHost { evidence: Vec<String> },
}

impl HostCheck {
    pub fn judge(facts: &NetnsFacts) -> Self {
        if !facts.can_change_tables || facts.pid1 == Pid1Netns::Different {
            return HostCheck::Proceed;
        }
        let mut evidence = Vec::new();
        let mut named = |what: &str, names: Vec<&str>| {
            if names.is_empty() {
                return;
            }
            let more = names.len().saturating_sub(NAMED_PER_KIND);
            let mut list = names[..names.len().min(NAMED_PER_KIND)].join(", ");
            if more > 0 {
                list.push_str(&format!(" and {more} more"));
            }
            evidence.push(format!("{what} {list}"));
        };
        let others = || facts.interfaces.iter().filter(|i| i.name != "lo");
        named(
            "wireless",
            others()
                .filter(|i| i.wireless)
                .map(|i| i.name.as_str())
                .collect(),
        );
        named(
            "hardware devices",
            others()
                .filter(|i| i.hardware && !i.wireless)
                .map(|i| i.name.as_str())
                .collect(),
        );
        named(
            "host-side interfaces",
            others()
                .filter(|i| !i.hardware && !i.wireless && is_host_side(&i.name))
                .map(|i| i.name.as_str())
                .collect(),
        );
        if evidence.is_empty() {
            HostCheck::Proceed
        } else {
            HostCheck::LooksLikeHost { evidence }
        }
    }
}

fn is_host_side(name: &str) -> bool {
    !FALLBACK_DEVICES.contains(&name) && HOST_SIDE_PREFIXES.iter().any(|p| name.starts_with(p))
}

impl NetnsFacts {
    /// Reads the facts of this process's network namespace.
    pub fn gather() -> Self {
        Self::gather_from(Path::new("/proc"), Path::new("/sys/class/net"))
    }

    /// As [`NetnsFacts::gather`], from other roots (tests).
    pub fn gather_from(proc: &Path, sys_class_net: &Path) -> Self {
        let netns = |pid: &str| fs::read_link(proc.join(pid).join("ns/net")).ok();
        let pid1 = match (netns("self"), netns("1")) {
            (Some(me), Some(one)) if me == one => Pid1Netns::Same,
            (Some(_), Some(_)) => Pid1Netns::Different,
            _ => Pid1Netns::Unknown,
        };
        // /proc/self/net is always this namespace's; /sys shows the
        // namespace that mounted it, which a process that only entered
        // this one does not share: its device details are used only when
        // it lists the same interfaces.
        let names = fs::read_to_string(proc.join("self/net/dev"))
            .map(|text| interface_names(&text))
            .unwrap_or_default();
        let mut sys_names: Vec<String> = fs::read_dir(sys_class_net)
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        sys_names.sort();
        let sys_matches = !names.is_empty() && sys_names == names;
        let interfaces = names
            .into_iter()
            .map(|name| {
                let dev = sys_class_net.join(&name);
                Interface {
                    hardware: sys_matches && dev.join("device").exists(),
                    wireless: sys_matches
                        && (dev.join("wireless").exists() || dev.join("phy80211").exists()),
                    name,
                }
            })
            .collect();
        let can_change_tables = fs::read_to_string(proc.join("self/status"))
            .ok()
            .and_then(|status| has_net_admin(&status))
            // Unknown: assume it could.
            .unwrap_or(true);
        Self {
            pid1,
            interfaces,
            can_change_tables,
        }
    }
}

/// The interface names of `/proc/net/dev`, sorted.
fn interface_names(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .lines()
        .skip(2)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .collect();
    names.sort();
    names
}

/// CAP_NET_ADMIN (bit 12) in the `CapEff` line of `/proc/self/status`.
fn has_net_admin(status: &str) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << 12) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, hardware: bool, wireless: bool) -> Interface {
        Interface {
            name: name.into(),
            hardware,
            wireless,
        }
    }

    fn facts(pid1: Pid1Netns, can: bool, interfaces: Vec<Interface>) -> NetnsFacts {
        NetnsFacts {
            pid1,
            interfaces,
            can_change_tables: can,
        }
    }

    #[test]
    fn pods_proceed_and_hosts_are_named() {
        use Pid1Netns::*;
        let pod = || {
            vec![
                iface("lo", false, false),
                iface("eth0", false, false),
                iface("tunl0", false, false),
                iface("sit0", false, false),
            ]
        };
        let workstation = || {
            vec![
                iface("lo", false, false),
                iface("enp0s31f6", true, false),
                iface("wlp2s0", true, true),
                iface("docker0", false, false),
                iface("veth1a2b", false, false),
            ]
        };
        let cases: Vec<(&str, NetnsFacts, Option<&[&str]>)> = vec![
            ("a pod", facts(Same, true, pod()), None),
            ("a pod, PID 1 unreadable", facts(Unknown, true, pod()), None),
            (
                "only lo",
                facts(Unknown, true, vec![iface("lo", false, false)]),
                None,
            ),
            (
                "a workstation",
                facts(Same, true, workstation()),
                Some(&[
                    "wireless wlp2s0",
                    "hardware devices enp0s31f6",
                    "host-side interfaces docker0, veth1a2b",
                ]),
            ),
            (
                "a workstation, PID 1 unreadable",
                facts(Unknown, true, workstation()),
                Some(&[
                    "wireless wlp2s0",
                    "hardware devices enp0s31f6",
                    "host-side interfaces docker0, veth1a2b",
                ]),
            ),
            (
                "a cloud VM (virtio eth0)",
                facts(
                    Same,
                    true,
                    vec![iface("lo", false, false), iface("eth0", true, false)],
                ),
                Some(&["hardware devices eth0"]),
            ),
            (
                "a node: many veths",
                facts(
                    Same,
                    true,
                    (0..7)
                        .map(|i| iface(&format!("cali{i}"), false, false))
                        .collect(),
                ),
                Some(&["host-side interfaces cali0, cali1, cali2, cali3 and 3 more"]),
            ),
            (
                "a namespace of its own",
                facts(Different, true, workstation()),
                None,
            ),
            ("no CAP_NET_ADMIN", facts(Same, false, workstation()), None),
        ];
        for (name, facts, want) in cases {
            let got = HostCheck::judge(&facts);
            match want {
                None => assert_eq!(got, HostCheck::Proceed, "{name}"),
                Some(want) => assert_eq!(
                    got,
                    HostCheck::LooksLikeHost {
                        evidence: want.iter().map(|s| s.to_string()).collect()
                    },
                    "{name}"
                ),
            }
        }
    }

    #[test]
    fn facts_come_from_proc_and_a_matching_sysfs() {
        let root = std::env::temp_dir().join(format!("ballast-init-host-{}", std::process::id()));
        let proc = root.join("proc");
        let sys = root.join("sys");
        fs::create_dir_all(proc.join("self/net")).unwrap();
        fs::create_dir_all(proc.join("1")).unwrap();
        fs::create_dir_all(proc.join("self/ns")).unwrap();
        fs::create_dir_all(proc.join("1/ns")).unwrap();
        std::os::unix::fs::symlink("net:[1]", proc.join("self/ns/net")).unwrap();
        std::os::unix::fs::symlink("net:[1]", proc.join("1/ns/net")).unwrap();
        fs::write(
            proc.join("self/net/dev"),
            "Inter-|   Receive\n face |bytes\n    lo: 1 2\n  eth0: 3 4\n wlan0: 5 6\n",
        )
        .unwrap();
        fs::write(
            proc.join("self/status"),
            "Name:\tballast\nCapEff:\t0000000000001000\n",
        )
        .unwrap();
        for dev in ["lo", "eth0", "wlan0"] {
            fs::create_dir_all(sys.join(dev)).unwrap();
        }
        fs::create_dir_all(sys.join("eth0/device")).unwrap();
        fs::create_dir_all(sys.join("wlan0/device")).unwrap();
        fs::create_dir_all(sys.join("wlan0/wireless")).unwrap();

        let got = NetnsFacts::gather_from(&proc, &sys);
        assert_eq!(got.pid1, Pid1Netns::Same);
        assert!(got.can_change_tables);
        assert_eq!(
            got.interfaces,
            vec![
                iface("eth0", true, false),
                iface("lo", false, false),
                iface("wlan0", true, true),
            ]
        );

        // A sysfs listing other interfaces is another namespace's: names only.
        fs::create_dir_all(sys.join("docker0")).unwrap();
        let got = NetnsFacts::gather_from(&proc, &sys);
        assert!(got.interfaces.iter().all(|i| !i.hardware && !i.wireless));
        // No CAP_NET_ADMIN.
        fs::write(proc.join("self/status"), "CapEff:\t0000000000000000\n").unwrap();
        assert!(!NetnsFacts::gather_from(&proc, &sys).can_change_tables);
        fs::remove_dir_all(&root).unwrap();
    }
}
