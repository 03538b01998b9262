//! A Node: a network namespace holding a bridge (`cbr0`) with the node IP, the pods'
//! sandboxes joined to it by veth pairs, kube-proxy's Service rules, and the API
//! server's endpoint at `NODE_IP:6443`.
//!
//! Pods get a /32 address with the node IP as their only gateway (as Calico does), so
//! all pod traffic, pod to pod included, is routed through the node namespace. That is
//! what lets Service DNAT live in the node (nat PREROUTING and OUTPUT, as kube-proxy
//! programs it) with conntrack seeing both directions, and leaves each pod's own
//! iptables to what runs in the pod (a proxy's init container), as on a real node:
//! the proxy sees the cluster IP as the original destination of what the app opens.
//!
//! Not done: a pod reaching itself through its own Service's cluster IP (hairpin)
//! does not connect; nodes are not routed to one another.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;

use super::api_endpoint::{ApiServerEndpoint, ClusterCa, API_SERVER_PORT, KUBERNETES_SERVICE_IP};
use super::netns::{sweep_stale, unique_name, NetNs, SocketMaker};
use crate::api_server::lock;

/// At most this many pods per node (addresses .2 to .65 of the node's /24).
pub const MAX_PODS: usize = 64;
/// The Service CIDR: cluster IPs are routed to the bridge so that the node's own
/// connections reach the DNAT rules.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
pub(crate) const BRIDGE: &str = "cbr0";
const SERVICES_CHAIN: &str = "BOX-SERVICES";
const POSTROUTING_CHAIN: &str = "BOX-POSTROUTING";
const REJECT_CHAIN: &str = "BOX-NO-ENDPOINTS";

/// One port of a Service, with the endpoints its traffic is spread over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// The Service's port.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Ready endpoints: pod IP and target port.
    pub endpoints: Vec<SocketAddrV4>,
}

/// What kube-proxy and DNS need of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    pub namespace: String,
    pub name: String,
    /// `None` for a headless Service: its name resolves to `ready_ips` instead.
    pub cluster_ip: Option<Ipv4Addr>,
    pub ports: Vec<ServicePort>,
    /// The ready pod IPs behind it (the names of headless Services resolve to them).
    pub ready_ips: Vec<Ipv4Addr>,
}

struct PodNames {
    namespace: String,
    hostname: String,
    ip: Ipv4Addr,
    hosts_file: PathBuf,
}

#[derive(Default)]
struct NodeState {
    used_ips: BTreeSet<u8>,
    next_veth: u64,
    /// By pod netns name.
    pods: BTreeMap<String, PodNames>,
    services: Vec<ServiceEntry>,
}

struct NodeShared {
    name: String,
    ip: Ipv4Addr,
    subnet: Ipv4Addr,
    state: Mutex<NodeState>,
    sockets: SocketMaker,
    // Last: dropped after the socket thread is told to end.
    netns: NetNs,
}

/// A node: its network namespace, bridge, pod sandboxes and Services.
///
/// Everything it made is removed on drop (once the [`PodSandbox`]es are dropped too).
pub struct Node {
    shared: Arc<NodeShared>,
    ca: ClusterCa,
    _api_endpoint: ApiServerEndpoint,
}

impl Node {
    /// A node with pod subnet 10.244.0.0/24 (node IP 10.244.0.1); see
    /// [`Node::start_with_subnet`].
    pub fn start(name: &str, api_server: SocketAddr) -> io::Result<Node> {
        Node::start_with_subnet(name, Ipv4Addr::new(10, 244, 0, 0), api_server)
    }

    /// Creates the node's namespace and bridge with `.1` of `subnet` (a /24), and
    /// serves the API server at `https://NODE_IP:6443` relayed to `api_server` (the
    /// in-process [`crate::ApiServer`]'s 127.0.0.1 address). Must be called inside a
    /// tokio runtime. Needs root and iproute2 and iptables. The first node of a process
    /// also removes namespaces and files that test processes which died uncleanly left.
    pub fn start_with_subnet(
        name: &str,
        subnet: Ipv4Addr,
        api_server: SocketAddr,
    ) -> io::Result<Node> {
        let [a, b, c, _] = subnet.octets();
        let ip = Ipv4Addr::new(a, b, c, 1);
        sweep_stale();
        let netns = NetNs::create(unique_name("ballast-node"))?;
        netns.ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        netns.ip(&["addr", "add", &format!("{ip}/24"), "dev", BRIDGE])?;
        netns.ip(&["link", "set", BRIDGE, "up"])?;
        netns.ip(&["route", "add", SERVICE_CIDR, "dev", BRIDGE])?;
        // Namespace-local: forwarding between pods, and no ICMP redirects telling a pod
        // to bypass the node (the Service NAT must see both directions).
        netns.sysctl(&[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
            &format!("net.ipv4.conf.{BRIDGE}.send_redirects=0"),
        ])?;
        netns.exec(
            "iptables-restore",
            &["--noflush"],
            Some(&format!(
                "*nat\n:{SERVICES_CHAIN} - [0:0]\n:{POSTROUTING_CHAIN} - [0:0]\n\
                 -A PREROUTING -j {SERVICES_CHAIN}\n-A OUTPUT -j {SERVICES_CHAIN}\n\
                 -A POSTROUTING -j {POSTROUTING_CHAIN}\nCOMMIT\n\
                 *filter\n:{REJECT_CHAIN} - [0:0]\n\
                 -A FORWARD -j {REJECT_CHAIN}\n-A OUTPUT -j {REJECT_CHAIN}\nCOMMIT\n"
            )),
        )?;
        let sockets = netns.socket_maker()?;
        let listener = sockets.listen(SocketAddr::from((ip, API_SERVER_PORT)))?;
        let ca = ClusterCa::generate(ip)?;
        let api_endpoint = ApiServerEndpoint::start(listener, &ca, api_server)?;
        let node = Node {
            shared: Arc::new(NodeShared {
                name: name.to_string(),
                ip,
                subnet,
                state: Mutex::new(NodeState::default()),
                sockets,
                netns,
            }),
            ca,
            _api_endpoint: api_endpoint,
        };
        node.sync_services(&[])?;
        Ok(node)
    }

    /// The Node's name (what `spec.nodeName` says).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The node IP (`status.hostIP`), on the bridge.
    pub fn ip(&self) -> Ipv4Addr {
        self.shared.ip
    }

    /// The node's network namespace (`ip netns exec NAME ...`).
    pub fn netns(&self) -> &str {
        self.shared.netns.name()
    }

    /// PEM of the cluster CA that signed the API server's certificate (the `ca.crt`
    /// of service-account volumes).
    pub fn ca_pem(&self) -> &str {
        &self.ca.ca_pem
    }

    /// Connects to `addr` from inside the node namespace (as the API server reaches a
    /// webhook, or the kubelet a probe).
    pub async fn dial(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        self.shared.sockets.connect(addr).await
    }

    /// Makes a pod's network namespace joined to the bridge with the next free IP, a
    /// default route via the node IP, and a hosts file of the Services last synced.
    pub fn create_pod_sandbox(&self, namespace: &str, pod_name: &str) -> io::Result<PodSandbox> {
        let shared = &self.shared;
        let (host_octet, veth) = {
            let mut state = lock(&shared.state);
            let Some(octet) = (2..2 + MAX_PODS as u8).find(|o| !state.used_ips.contains(o)) else {
                return Err(io::Error::other(format!(
                    "node {} is full: at most {MAX_PODS} pods",
                    shared.name
                )));
            };
            state.used_ips.insert(octet);
            state.next_veth += 1;
            (octet, format!("veth{}", state.next_veth))
        };
        let [a, b, c, _] = shared.subnet.octets();
        let ip = Ipv4Addr::new(a, b, c, host_octet);
        let netns_name = unique_name("ballast-pod");
        let hosts_dir = PathBuf::from("/etc/netns").join(&netns_name);
        // Owned from here on: any error below drops it, which removes what was made.
        let mut sandbox = PodSandbox {
            node: shared.clone(),
            ip,
            host_octet,
            veth: veth.clone(),
            hosts_dir: hosts_dir.clone(),
            netns: None,
        };
        std::fs::create_dir_all(&hosts_dir)?;
        // `ip netns exec` binds these over /etc/hosts and /etc/resolv.conf; DNS at
        // 127.0.0.1 fails at once, so names not in the hosts file do not hang.
        std::fs::write(
            hosts_dir.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )?;
        std::fs::write(hosts_dir.join("hosts"), "")?;
        let netns = NetNs::create(netns_name.clone())?;
        let pod_ns = netns.name().to_string();
        sandbox.netns = Some(netns);
        shared.netns.ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &pod_ns,
        ])?;
        shared
            .netns
            .ip(&["link", "set", &veth, "master", BRIDGE, "up"])?;
        let pod = sandbox
            .netns
            .as_ref()
            .ok_or_else(|| io::Error::other("no netns"))?;
        pod.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        pod.ip(&["link", "set", "eth0", "up"])?;
        let node_ip = shared.ip.to_string();
        pod.ip(&["route", "add", &node_ip, "dev", "eth0", "scope", "link"])?;
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            &node_ip,
            "src",
            &ip.to_string(),
        ])?;
        {
            let mut state = lock(&shared.state);
            let names = PodNames {
                namespace: namespace.to_string(),
                hostname: pod_name.to_string(),
                ip,
                hosts_file: hosts_dir.join("hosts"),
            };
            write_hosts(&names, &state.services)?;
            state.pods.insert(pod_ns, names);
        }
        Ok(sandbox)
    }

    /// Programs the Services: DNAT from each cluster IP and port to its endpoints
    /// (chosen at random, as kube-proxy's iptables mode does), a reject for ports with
    /// no endpoint, and every pod's hosts file. The `kubernetes` Service
    /// (10.96.0.1:443 to the node's API server endpoint) is always there. Only this
    /// node's own chains are flushed, so calling it again is how changes are applied.
    pub fn sync_services(&self, services: &[ServiceEntry]) -> io::Result<()> {
        let mut all = vec![self.kubernetes_service()];
        all.extend(
            services
                .iter()
                .filter(|s| !(s.namespace == "default" && s.name == "kubernetes"))
                .cloned(),
        );
        let mut state = lock(&self.shared.state);
        if state.services == all && !state.services.is_empty() {
            return Ok(());
        }
        self.shared.netns.exec(
            "iptables-restore",
            &["--noflush"],
            Some(&service_rules(&all)),
        )?;
        for names in state.pods.values() {
            write_hosts(names, &all)?;
        }
        state.services = all;
        Ok(())
    }

    fn kubernetes_service(&self) -> ServiceEntry {
        ServiceEntry {
            namespace: "default".into(),
            name: "kubernetes".into(),
            cluster_ip: Some(KUBERNETES_SERVICE_IP),
            ports: vec![ServicePort {
                port: 443,
                protocol: "TCP".into(),
                endpoints: vec![SocketAddrV4::new(self.shared.ip, API_SERVER_PORT)],
            }],
            ready_ips: vec![self.shared.ip],
        }
    }
}

/// A pod's network namespace, its veth and its hosts file; all removed on drop.
pub struct PodSandbox {
    node: Arc<NodeShared>,
    ip: Ipv4Addr,
    host_octet: u8,
    veth: String,
    hosts_dir: PathBuf,
    netns: Option<NetNs>,
}

impl PodSandbox {
    /// The pod IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The pod's network namespace name (`ip netns exec NAME ...`).
    pub fn netns(&self) -> &str {
        self.netns.as_ref().map_or("", NetNs::name)
    }
}

impl Drop for PodSandbox {
    fn drop(&mut self) {
        if let Some(ns) = &self.netns {
            lock(&self.node.state).pods.remove(ns.name());
        }
        // Deleting the pod's namespace takes the veth pair with it once no process is
        // left in it; deleting the node's end now frees the name and the bridge port.
        let _ = self.node.netns.ip(&["link", "del", &self.veth]);
        self.netns = None;
        let _ = std::fs::remove_dir_all(&self.hosts_dir);
        lock(&self.node.state).used_ips.remove(&self.host_octet);
    }
}

/// iptables-restore input (`--noflush`) for the node's own chains.
fn service_rules(services: &[ServiceEntry]) -> String {
    let mut nat = format!(
        "*nat\n:{SERVICES_CHAIN} - [0:0]\n:{POSTROUTING_CHAIN} - [0:0]\n\
         -A {POSTROUTING_CHAIN} -m mark --mark 0x4000/0x4000 -j MASQUERADE\n"
    );
    let mut filter = format!("*filter\n:{REJECT_CHAIN} - [0:0]\n");
    for svc in services {
        let Some(cip) = svc.cluster_ip else { continue };
        for port in &svc.ports {
            let proto = port.protocol.to_ascii_lowercase();
            let head = format!(
                "-d {cip}/32 -p {proto} -m {proto} --dport {} -m comment --comment \"{}/{}:{}\"",
                port.port, svc.namespace, svc.name, port.port
            );
            if port.endpoints.is_empty() {
                filter.push_str(&format!(
                    "-A {REJECT_CHAIN} {head} -j REJECT --reject-with icmp-port-unreachable\n"
                ));
                continue;
            }
            let n = port.endpoints.len();
            for (i, ep) in port.endpoints.iter().enumerate() {
                let left = n - i;
                if left > 1 {
                    nat.push_str(&format!(
                        "-A {SERVICES_CHAIN} {head} -m statistic --mode random --probability {:.10} -j DNAT --to-destination {ep}\n",
                        1.0 / left as f64
                    ));
                } else {
                    nat.push_str(&format!(
                        "-A {SERVICES_CHAIN} {head} -j DNAT --to-destination {ep}\n"
                    ));
                }
            }
        }
    }
    nat.push_str("COMMIT\n");
    filter.push_str("COMMIT\n");
    nat + &filter
}

/// The pod's hosts file: itself, then each Service's names (the short one in the pod's
/// own namespace), a headless Service's once per ready pod IP.
fn hosts_text(pod: &PodNames, services: &[ServiceEntry]) -> String {
    let mut text = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
        pod.ip, pod.hostname
    );
    for svc in services {
        let (ns, name) = (&svc.namespace, &svc.name);
        // The fully qualified name with its root dot too: the hosts file matches names
        // exactly, and Linkerd's proxies dial `NAME.NS.svc.cluster.local.:PORT`.
        let mut names = format!(
            "{name}.{ns}.svc.cluster.local {name}.{ns}.svc {name}.{ns} {name}.{ns}.svc.cluster.local."
        );
        if *ns == pod.namespace {
            names.push(' ');
            names.push_str(name);
        }
        match svc.cluster_ip {
            Some(ip) => text.push_str(&format!("{ip}\t{names}\n")),
            None => {
                for ip in &svc.ready_ips {
                    text.push_str(&format!("{ip}\t{names}\n"));
                }
            }
        }
    }
    text
}

fn write_hosts(pod: &PodNames, services: &[ServiceEntry]) -> io::Result<()> {
    replace_in_place(&pod.hosts_file, hosts_text(pod, services).as_bytes())
}

/// Replaces a file's content keeping its inode: running containers have the pod's
/// hosts file bound over their /etc/hosts, and a renamed new file would not reach
/// them. Readers (every name lookup in the pod) never see it empty or cut short: the
/// new text goes in with one write at offset 0, padded with blank lines (harmless in
/// a hosts file) to the old length, and only then is the padding cut off. Truncating
/// first, as `O_TRUNC` does, left a window in which a lookup found no names at all.
fn replace_in_place(path: &std::path::Path, text: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let old_len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    let mut padded = text.to_vec();
    if old_len > padded.len() {
        padded.resize(old_len, b'\n');
    }
    file.write_all_at(&padded, 0)?;
    file.set_len(text.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, cip: Option<Ipv4Addr>, eps: &[&str]) -> ServiceEntry {
        ServiceEntry {
            namespace: "ns".into(),
            name: name.into(),
            cluster_ip: cip,
            ports: vec![ServicePort {
                port: 80,
                protocol: "TCP".into(),
                endpoints: eps.iter().map(|e| e.parse().expect("endpoint")).collect(),
            }],
            ready_ips: eps
                .iter()
                .map(|e| e.parse::<SocketAddrV4>().expect("endpoint").ip().to_owned())
                .collect(),
        }
    }

    #[test]
    fn endpoints_are_chosen_at_random_with_the_last_taking_what_is_left() {
        let rules = service_rules(&[svc(
            "web",
            Some(Ipv4Addr::new(10, 96, 0, 10)),
            &["10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080"],
        )]);
        let dnat: Vec<&str> = rules.lines().filter(|l| l.contains("DNAT")).collect();
        assert_eq!(dnat.len(), 3, "{rules}");
        assert!(dnat[0].contains("--probability 0.3333333333"), "{rules}");
        assert!(dnat[1].contains("--probability 0.5000000000"), "{rules}");
        assert!(!dnat[2].contains("statistic"), "{rules}");
        assert!(
            dnat[2].ends_with("--to-destination 10.244.0.4:8080"),
            "{rules}"
        );
    }

    #[test]
    fn a_port_without_endpoints_is_rejected_and_a_headless_service_gets_no_rule() {
        let rules = service_rules(&[
            svc("empty", Some(Ipv4Addr::new(10, 96, 0, 11)), &[]),
            svc("headless", None, &["10.244.0.2:80"]),
        ]);
        assert!(
            rules.contains("-A BOX-NO-ENDPOINTS -d 10.96.0.11/32"),
            "{rules}"
        );
        assert!(!rules.contains("headless"), "{rules}");
    }

    #[test]
    fn hosts_name_services_fully_and_shortly_in_the_pods_own_namespace() {
        let pod = PodNames {
            namespace: "ns".into(),
            hostname: "web-0".into(),
            ip: Ipv4Addr::new(10, 244, 0, 2),
            hosts_file: PathBuf::new(),
        };
        let mut other = svc("db", Some(Ipv4Addr::new(10, 96, 0, 12)), &[]);
        other.namespace = "data".into();
        let text = hosts_text(
            &pod,
            &[
                svc("web", Some(Ipv4Addr::new(10, 96, 0, 10)), &[]),
                other,
                svc("peers", None, &["10.244.0.2:80", "10.244.0.3:80"]),
            ],
        );
        assert!(text.contains("10.244.0.2\tweb-0\n"), "{text}");
        assert!(
            text.contains(
                "10.96.0.10\tweb.ns.svc.cluster.local web.ns.svc web.ns web.ns.svc.cluster.local. web\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "10.96.0.12\tdb.data.svc.cluster.local db.data.svc db.data db.data.svc.cluster.local.\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("10.244.0.3\tpeers.ns.svc.cluster.local"),
            "{text}"
        );
        assert_eq!(
            text.matches("\tpeers.ns.svc.cluster.local ").count(),
            2,
            "{text}"
        );
    }

    #[test]
    fn a_hosts_file_rewritten_in_place_is_never_seen_empty() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("hosts");
        let first = "127.0.0.1\tlocalhost\n";
        let long = format!(
            "{first}{}",
            "10.96.0.10\tweb.ns.svc.cluster.local web\n".repeat(40)
        );
        let short = format!("{first}10.96.0.11\tdb.ns.svc.cluster.local db\n");
        replace_in_place(&path, long.as_bytes()).expect("write");
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let reader = {
            let (path, stop, reads) = (path.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&path).expect("read");
                    assert!(text.starts_with(first), "a reader saw {text:?}");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // At least 3,000 rewrites, and on until the reader has read 1,000 times
        // (on a busy machine its thread may start late); a panicked reader ends it.
        let mut i = 0;
        while (i < 3000 || reads.load(Ordering::Relaxed) < 1000) && !reader.is_finished() {
            let text = if i % 2 == 0 { &short } else { &long };
            replace_in_place(&path, text.as_bytes()).expect("rewrite");
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("no reader saw the file empty");
        assert!(reads.load(Ordering::Relaxed) >= 1000);
        replace_in_place(&path, short.as_bytes()).expect("rewrite");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), short);
    }
}
