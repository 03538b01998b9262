//! Checks of the workloads: the faults from the seeds that took meshes down
//! (two live pods on one IP, seed 000; a proxy sending traffic to its own
//! listeners, seed 004), and the proxies' health and versions.

use crate::pods::{self, InitPorts, ProxyPorts};
use crate::report::{CheckResult, Finding, ObjectRef};
use crate::snapshot::{self, labels, namespace, object_ref, refs, string_map, text, Snapshot};
use crate::Config;
use serde_json::Value;
use std::collections::BTreeMap;

const CATEGORY: &str = "data-plane";
/// Most objects named by one finding (the message gives the count).
const MAX_OBJECTS: usize = 10;

pub const SHARED_IP: &str = "no two live pods share an IP";
pub const HOST_PORTS: &str = "no two hostNetwork pods on a node declare the same port";
pub const SELECTORS: &str = "every Service selector matches a pod";
pub const PROXY_READY: &str = "meshed pods have a ready proxy";
pub const PROXY_VERSION: &str = "proxies run this version";
pub const LOOPS: &str = "no proxy sends traffic to its own listeners";
pub const FAILURE_ACCRUAL: &str = "Services' failure accrual annotations are readable";

/// Seed 000: a destination controller OOM-killed by two pods on one IP (one
/// terminating). Finished and hostNetwork pods share IPs legitimately.
pub fn shared_ips(snap: &Snapshot) -> CheckResult {
    let mut by_ip: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for pod in snap.of_kind("Pod") {
        if pods::is_live(pod) && !pods::host_network(pod) {
            for ip in pods::ips(pod) {
                by_ip.entry(ip).or_default().push(pod);
            }
        }
    }
    let findings = by_ip
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(ip, mut pods)| {
            pods.sort_by_key(|p| object_ref(p));
            let names: Vec<String> = pods
                .iter()
                .map(|p| {
                    let state = if pods::is_terminating(p) {
                        " (terminating)"
                    } else {
                        ""
                    };
                    format!("{}{state}", object_ref(p))
                })
                .collect();
            Finding::fail(
                format!(
                    "{} share IP {ip}: endpoints for that IP are ambiguous",
                    join_and(&names)
                ),
                refs(pods, MAX_OBJECTS),
            )
        })
        .collect();
    CheckResult::ran(CATEGORY, SHARED_IP, findings)
}

/// Two pods on one node's network bound to one port: one of them cannot
/// listen. hostNetwork pods declare their container ports on the node;
/// other pods only their hostPorts.
pub fn host_ports(snap: &Snapshot) -> CheckResult {
    let mut by_port: BTreeMap<(&str, u16, &str), Vec<&Value>> = BTreeMap::new();
    for pod in snap.of_kind("Pod") {
        let node = text(pod, "/spec/nodeName");
        if node.is_empty() || !pods::is_live(pod) {
            continue;
        }
        let mut mine: Vec<(u16, &str)> = pods::declared_ports(pod)
            .filter_map(|p| {
                let port = if pods::host_network(pod) {
                    p.host_port.or(p.container_port)
                } else {
                    p.host_port
                };
                Some((port?, p.protocol))
            })
            .collect();
        mine.sort_unstable();
        mine.dedup();
        for (port, protocol) in mine {
            by_port.entry((node, port, protocol)).or_default().push(pod);
        }
    }
    let findings = by_port
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|((node, port, protocol), mut pods)| {
            pods.sort_by_key(|p| object_ref(p));
            let names: Vec<String> = pods.iter().map(|p| object_ref(p).to_string()).collect();
            let mut objects = refs(pods.iter().copied(), MAX_OBJECTS);
            objects.push(ObjectRef::new("Node", None, node));
            Finding::fail(
                format!(
                    "{} on node {node} both declare host port {port}/{protocol}",
                    join_and(&names)
                ),
                objects,
            )
        })
        .collect();
    CheckResult::ran(CATEGORY, HOST_PORTS, findings)
}

/// Kinds whose pod template a Service may select before any pod exists.
const WORKLOADS: [(&str, &str); 6] = [
    ("Deployment", "/spec/template/metadata/labels"),
    ("StatefulSet", "/spec/template/metadata/labels"),
    ("DaemonSet", "/spec/template/metadata/labels"),
    ("ReplicaSet", "/spec/template/metadata/labels"),
    ("Job", "/spec/template/metadata/labels"),
    ("CronJob", "/spec/jobTemplate/spec/template/metadata/labels"),
];

/// A Service whose selector matches no pod has no endpoints: every request
/// to it fails. In a manifests directory, a workload whose pod template
/// matches counts (its pods do not exist there).
pub fn selectors(snap: &Snapshot) -> CheckResult {
    let mut findings = Vec::new();
    for svc in snap.of_kind("Service") {
        let selector = string_map(svc, "/spec/selector");
        if selector.is_empty() || text(svc, "/spec/type") == "ExternalName" {
            continue;
        }
        let ns = namespace(svc);
        let pod_matches = snap
            .of_kind("Pod")
            .filter(|p| namespace(p) == ns && pods::is_live(p))
            .any(|p| snapshot::selects(&selector, &labels(p)));
        if pod_matches {
            continue;
        }
        let workload = WORKLOADS.iter().find_map(|(kind, pointer)| {
            snap.of_kind(kind).find(|w| {
                namespace(w) == ns && snapshot::selects(&selector, &string_map(w, pointer))
            })
        });
        let selector_text = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        match (workload, snap.source) {
            (Some(_), crate::report::Source::Manifests) => {}
            (Some(w), crate::report::Source::Cluster) => findings.push(Finding::warn(
                format!(
                    "{} selects no pod ({selector_text}); {} would match but has no pods",
                    object_ref(svc),
                    object_ref(w)
                ),
                vec![object_ref(svc), object_ref(w)],
            )),
            (None, _) => findings.push(Finding::warn(
                format!(
                    "{} selects no pod ({selector_text}): it has no endpoints",
                    object_ref(svc)
                ),
                vec![object_ref(svc)],
            )),
        }
    }
    CheckResult::ran(CATEGORY, SELECTORS, findings)
}

/// A Service's `balancer.linkerd.io/failure-accrual*` annotations that
/// cannot be read turn its circuit breaking off (as in Linkerd), which the
/// controller only logs: said here, naming the annotation.
pub fn failure_accrual(snap: &Snapshot) -> CheckResult {
    use ballast_index::resource::Resource;
    let mut findings = Vec::new();
    for svc in snap.of_kind("Service") {
        // A Service the index cannot read at all is the sources' to report.
        let Ok(Some(Resource::Service(s))) = Resource::from_value(svc.clone()) else {
            continue;
        };
        if let Err(e) = s.failure_accrual() {
            findings.push(Finding::warn(
                format!(
                    "{}: failure accrual is off: {}: {}",
                    object_ref(svc),
                    e.field,
                    e.reason
                ),
                vec![object_ref(svc)],
            ));
        }
    }
    CheckResult::ran(CATEGORY, FAILURE_ACCRUAL, findings)
}

/// A running meshed pod whose proxy is not ready receives no traffic and
/// sends none. Pods with no status (manifests) are not judged.
pub fn proxy_ready(snap: &Snapshot) -> CheckResult {
    let mut findings = Vec::new();
    let mut meshed = 0;
    for pod in snap.of_kind("Pod").filter(|p| pods::is_meshed(p)) {
        meshed += 1;
        if text(pod, "/status/phase") != "Running" || pods::is_terminating(pod) {
            continue;
        }
        let Some(proxy) = pods::proxy_container(pod) else {
            continue;
        };
        let proxy_name = text(proxy, "/name");
        let status = snapshot::array(pod, "/status/containerStatuses")
            .iter()
            .chain(snapshot::array(pod, "/status/initContainerStatuses"))
            .find(|s| text(s, "/name") == proxy_name);
        let problem = match status {
            None => Some(format!("has no status for its {proxy_name} container")),
            Some(s) if s.get("ready").and_then(Value::as_bool) == Some(true) => None,
            Some(s) => {
                let why = [
                    "/state/waiting/reason",
                    "/state/terminated/reason",
                    "/lastState/terminated/reason",
                ]
                .iter()
                .map(|p| text(s, p))
                .find(|r| !r.is_empty());
                let restarts = s.get("restartCount").and_then(Value::as_u64).unwrap_or(0);
                let mut text = format!("{proxy_name} container is not ready");
                if let Some(why) = why {
                    text.push_str(&format!(" ({why})"));
                }
                if restarts > 0 {
                    text.push_str(&format!(", {restarts} restarts"));
                }
                Some(text)
            }
        };
        if let Some(problem) = problem {
            findings.push(Finding::fail(
                format!("{}: {problem}", object_ref(pod)),
                vec![object_ref(pod)],
            ));
        }
    }
    CheckResult::ran(CATEGORY, PROXY_READY, findings).with_detail(format!("{meshed} meshed pods"))
}

/// Proxies of another version than this `ballast` may not speak what its
/// controllers answer. Pods whose version cannot be told (an image tagged
/// `latest`) are counted, not flagged.
pub fn proxy_versions(snap: &Snapshot, config: &Config) -> CheckResult {
    let want = config.proxy_version.trim_start_matches('v');
    let mut other: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    let (mut meshed, mut unknown) = (0, 0);
    for pod in snap
        .of_kind("Pod")
        .filter(|p| pods::is_meshed(p) && pods::is_live(p))
    {
        meshed += 1;
        match pods::proxy_version(pod) {
            None => unknown += 1,
            Some(v) if v.trim_start_matches('v') == want => {}
            Some(v) => other.entry(v).or_default().push(pod),
        }
    }
    let findings = other
        .into_iter()
        .map(|(version, pods)| {
            let names: Vec<String> = pods
                .iter()
                .take(MAX_OBJECTS)
                .map(|p| snapshot::key(p))
                .collect();
            let more = pods.len().saturating_sub(MAX_OBJECTS);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            Finding::warn(
                format!(
                    "{} pod(s) run proxy version {version}, this ballast is {}: {}{more}",
                    pods.len(),
                    config.proxy_version,
                    names.join(", ")
                ),
                refs(pods, MAX_OBJECTS),
            )
        })
        .collect();
    let mut detail = format!("{meshed} meshed pods");
    if unknown > 0 {
        detail.push_str(&format!(
            ", {unknown} of unknown version (image tag latest or none)"
        ));
    }
    CheckResult::ran(CATEGORY, PROXY_VERSION, findings).with_detail(detail)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Seed 004's loop, and its cousins: traffic the proxy sends (or is sent)
/// back into its own listeners. Looked for in every meshed pod, and in the
/// pod templates of workloads (manifests directories hold those):
///
/// - a Service port whose targetPort is the proxy's inbound or outbound
///   listener (the inbound listener forwards to 127.0.0.1 at the port it was
///   sent to: itself);
/// - an `--outbound-tcp` route to a loopback authority at a listener port,
///   or listening on a listener's port;
/// - an init container redirecting to other ports than the proxy listens on,
///   or exempting another uid than the proxy's (the proxy's own connections
///   are then redirected back to it).
pub fn loops(snap: &Snapshot) -> CheckResult {
    let mut findings = Vec::new();
    let templates = WORKLOADS.iter().flat_map(|(kind, labels_at)| {
        let spec_at = labels_at.trim_end_matches("/metadata/labels");
        snap.of_kind(kind).filter_map(move |w| {
            let spec = w.pointer(spec_at)?;
            Some((w, spec))
        })
    });
    let owners = snap.of_kind("Pod").map(|p| (p, p)).chain(templates);
    for (owner, pod) in owners {
        let Some(proxy) = pods::proxy_container(pod) else {
            continue;
        };
        let ports = ProxyPorts::of(proxy);
        let me = object_ref(owner);
        for route in pods::outbound_tcp_routes(proxy) {
            if let Some(listener) = route.listen_port.and_then(|p| ports.describe(p)) {
                findings.push(Finding::fail(
                    format!(
                        "{me}: --outbound-tcp listens on {}, which is {listener}",
                        route.listen
                    ),
                    vec![me.clone()],
                ));
            }
            let to_self = is_loopback(&route.authority_host)
                || pods::ips(pod).contains(&route.authority_host.as_str());
            if let Some(listener) = route
                .authority_port
                .filter(|_| to_self)
                .and_then(|p| ports.describe(p))
            {
                findings.push(Finding::fail(
                    format!(
                        "{me}: --outbound-tcp {}={} sends to {listener}: a loop",
                        route.listen, route.authority
                    ),
                    vec![me.clone()],
                ));
            }
        }
        if let Some(init) = pods::init_container(pod) {
            let init_ports = InitPorts::of(init);
            if init_ports.incoming != ports.inbound {
                findings.push(Finding::fail(
                    format!(
                        "{me}: the init container redirects inbound TCP to port {}, but the proxy's inbound listener is {}{}",
                        init_ports.incoming,
                        ports.inbound,
                        ports.describe(init_ports.incoming).map(|l| format!(" ({l}: a loop)")).unwrap_or_default()
                    ),
                    vec![me.clone()],
                ));
            }
            if init_ports.outgoing != ports.outbound {
                findings.push(Finding::fail(
                    format!(
                        "{me}: the init container redirects outbound TCP to port {}, but the proxy's outbound listener is {}{}",
                        init_ports.outgoing,
                        ports.outbound,
                        ports.describe(init_ports.outgoing).map(|l| format!(" ({l}: a loop)")).unwrap_or_default()
                    ),
                    vec![me.clone()],
                ));
            }
            if let Some(uid) = pods::run_as_user(pod, proxy) {
                if uid != init_ports.proxy_uid {
                    findings.push(Finding::fail(
                        format!(
                            "{me}: the init container exempts uid {} from redirection but the proxy runs as uid {uid}: the proxy's own connections loop back into it",
                            init_ports.proxy_uid
                        ),
                        vec![me.clone()],
                    ));
                }
            }
        }
        findings.extend(service_loops(snap, owner, pod, ports));
    }
    CheckResult::ran(CATEGORY, LOOPS, findings)
}

/// Services selecting this pod whose targetPort is the proxy's inbound or
/// outbound listener. The admin port is left alone: metrics scrapers reach
/// it through Services on purpose, and init leaves it unredirected.
fn service_loops(snap: &Snapshot, owner: &Value, pod: &Value, ports: ProxyPorts) -> Vec<Finding> {
    let pod_labels = labels(pod);
    let mut findings = Vec::new();
    for svc in snap
        .of_kind("Service")
        .filter(|s| namespace(s) == namespace(owner))
    {
        if !snapshot::selects(&string_map(svc, "/spec/selector"), &pod_labels) {
            continue;
        }
        for sp in snapshot::array(svc, "/spec/ports") {
            let port = sp.get("port").and_then(Value::as_u64).unwrap_or(0);
            let target = match sp.get("targetPort") {
                Some(Value::Number(n)) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
                Some(Value::String(named)) => named.parse::<u16>().ok().or_else(|| {
                    pods::declared_ports(pod)
                        .find(|p| p.name == named)
                        .and_then(|p| p.container_port)
                }),
                _ => u16::try_from(port).ok(),
            };
            let Some(target) = target else { continue };
            if target != ports.inbound && target != ports.outbound {
                continue;
            }
            let listener = ports.describe(target).unwrap_or_default();
            findings.push(Finding::fail(
                format!(
                    "{} port {port} targets port {target} of {}, which is {listener}: traffic sent there loops back into the proxy",
                    object_ref(svc),
                    object_ref(owner),
                ),
                vec![object_ref(svc), object_ref(owner)],
            ));
        }
    }
    findings
}

/// `a`, `a and b`, `a, b and c`.
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{Source, Status};
    use serde_json::json;

    pub fn pod(ns: &str, name: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "app", "ready": true}]}
        })
    }

    pub fn meshed(mut pod: Value, version: &str) -> Value {
        pod["metadata"]["annotations"] = json!({"linkerd.io/proxy-version": version});
        pod["spec"]["containers"]
            .as_array_mut()
            .expect("containers")
            .push(
                json!({"name": "linkerd-proxy", "image": "ballast-proxy:latest",
                          "args": ["--inbound-addr=0.0.0.0:4143", "--outbound-addr=127.0.0.1:4140",
                                   "--destination-addr=ballast-dst-headless.ballast.svc.cluster.local:8086",
                                   "--identity-controller-namespace=ballast",
                                   "--destination-server-name=ballast-destination.ballast.serviceaccount.identity.ballast.cluster.local"],
                          "securityContext": {"runAsUser": 2102}}),
            );
        pod["metadata"]["labels"]["linkerd.io/control-plane-ns"] = json!("ballast");
        pod["spec"]["initContainers"] = json!([{"name": "linkerd-init",
            "args": ["init", "--incoming-proxy-port=4143", "--outgoing-proxy-port=4140", "--proxy-uid=2102"]}]);
        pod["status"]["containerStatuses"]
            .as_array_mut()
            .expect("statuses")
            .push(json!({"name": "linkerd-proxy", "ready": true}));
        pod
    }

    pub fn service(ns: &str, name: &str, app: &str, target: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": target}]}})
    }

    fn snap(objects: Vec<Value>) -> Snapshot {
        Snapshot::new(Source::Cluster, objects)
    }

    fn config() -> Config {
        Config::default()
    }

    /// A healthy workload: two meshed pods behind a Service.
    pub fn healthy() -> Vec<Value> {
        vec![
            meshed(pod("shop", "web-1", "10.0.0.7"), "0.1.0"),
            meshed(pod("shop", "web-2", "10.0.0.8"), "0.1.0"),
            {
                let mut s = service("shop", "web", "web-1", json!("http"));
                s["spec"]["selector"] = json!({"app": "web-1"});
                s
            },
        ]
    }

    fn names(c: &CheckResult) -> Vec<Vec<String>> {
        c.findings
            .iter()
            .map(|f| f.objects.iter().map(|o| o.to_string()).collect())
            .collect()
    }

    #[test]
    fn unreadable_failure_accrual_annotations_warn_naming_the_service() {
        let mut objects = healthy();
        let mut off = service("shop", "api", "web-1", json!("http"));
        off["metadata"]["annotations"] = json!({
            "balancer.linkerd.io/failure-accrual": "consecutive",
            "balancer.linkerd.io/failure-accrual-consecutive-max-failures": "many",
        });
        let mut on = service("shop", "cart", "web-1", json!("http"));
        on["metadata"]["annotations"] =
            json!({"balancer.linkerd.io/failure-accrual": "consecutive"});
        objects.extend([off, on]);
        let c = failure_accrual(&snap(objects));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(names(&c), [["service shop/api"]]);
        assert!(
            c.findings[0]
                .message
                .contains("failure-accrual-consecutive-max-failures"),
            "{}",
            c.findings[0].message
        );
    }

    #[test]
    fn a_clean_workload_passes_every_data_plane_check() {
        let s = snap(healthy());
        let cfg = Config {
            proxy_version: "0.1.0".into(),
            ..config()
        };
        for c in [
            shared_ips(&s),
            host_ports(&s),
            selectors(&s),
            proxy_ready(&s),
            proxy_versions(&s, &cfg),
            loops(&s),
        ] {
            assert_eq!(c.status, Status::Ok, "{}: {:?}", c.name, c.findings);
        }
    }

    #[test]
    fn two_live_pods_on_one_ip_fail_naming_both() {
        let mut objects = healthy();
        let mut old = pod("prod", "queues-work", "10.0.0.7");
        old["metadata"]["deletionTimestamp"] = json!("2021-03-16T07:36:12Z");
        objects.push(old);
        // Finished and hostNetwork pods do not count.
        let mut done = pod("prod", "job-1", "10.0.0.8");
        done["status"]["phase"] = json!("Succeeded");
        objects.push(done);
        let mut host = pod("kube-system", "agent", "10.0.0.8");
        host["spec"]["hostNetwork"] = json!(true);
        objects.push(host);
        let c = shared_ips(&snap(objects));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(names(&c), [["pod prod/queues-work", "pod shop/web-1"]]);
        assert!(c.findings[0].message.contains("share IP 10.0.0.7"));
        assert!(c.findings[0].message.contains("(terminating)"));
    }

    #[test]
    fn host_network_pods_declaring_one_port_on_one_node_fail() {
        let mut a = pod("kube-system", "agent-a", "192.168.1.10");
        a["spec"]["hostNetwork"] = json!(true);
        let mut b = pod("monitoring", "exporter", "192.168.1.10");
        b["spec"]["hostNetwork"] = json!(true);
        // Same port on another node, and a UDP port: no clash.
        let mut c = pod("kube-system", "agent-c", "192.168.1.11");
        c["spec"]["hostNetwork"] = json!(true);
        c["spec"]["nodeName"] = json!("node-2");
        let mut objects = healthy();
        objects.extend([a, b, c]);
        let check = host_ports(&snap(objects.clone()));
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            names(&check),
            [[
                "pod kube-system/agent-a",
                "pod monitoring/exporter",
                "node node-1"
            ]]
        );
        assert!(check.findings[0].message.contains("host port 8080/TCP"));
        objects[4]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("UDP");
        assert_eq!(host_ports(&snap(objects)).status, Status::Ok);
    }

    #[test]
    fn a_service_selecting_nothing_warns_unless_a_template_matches_in_manifests() {
        let mut objects = healthy();
        objects.push(service("shop", "ghost", "nobody", json!(80)));
        let c = selectors(&snap(objects.clone()));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(names(&c), [["service shop/ghost"]]);
        objects.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "nobody", "namespace": "shop"},
            "spec": {"template": {"metadata": {"labels": {"app": "nobody"}}}}}));
        let manifests = Snapshot::new(Source::Manifests, objects.clone());
        assert_eq!(selectors(&manifests).status, Status::Ok);
        let c = selectors(&snap(objects));
        assert_eq!(
            names(&c),
            [["service shop/ghost", "deployment shop/nobody"]]
        );
    }

    #[test]
    fn a_running_meshed_pod_with_an_unready_proxy_fails() {
        let mut objects = healthy();
        objects[1]["status"]["containerStatuses"][1] = json!({"name": "linkerd-proxy",
            "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "OOMKilled"}}});
        let c = proxy_ready(&snap(objects));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(names(&c), [["pod shop/web-2"]]);
        assert!(
            c.findings[0].message.contains("CrashLoopBackOff"),
            "{}",
            c.findings[0].message
        );
        assert!(c.findings[0].message.contains("3 restarts"));
    }

    #[test]
    fn other_proxy_versions_warn() {
        let mut objects = healthy();
        objects.push(meshed(pod("shop", "old", "10.0.0.9"), "0.0.9"));
        let cfg = Config {
            proxy_version: "0.1.0".into(),
            ..config()
        };
        let c = proxy_versions(&snap(objects), &cfg);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(names(&c), [["pod shop/old"]]);
        assert!(c.findings[0].message.contains("0.0.9"));
    }

    #[test]
    fn a_service_targeting_the_proxys_inbound_listener_is_a_loop() {
        let mut objects = healthy();
        objects.push(service("shop", "web-direct", "web-1", json!(4143)));
        // The admin port is scraped through Services on purpose.
        objects.push(service("shop", "web-metrics", "web-1", json!(4191)));
        let c = loops(&snap(objects));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(names(&c), [["service shop/web-direct", "pod shop/web-1"]]);
        assert!(c.findings[0].message.contains("inbound listener (4143)"));
    }

    #[test]
    fn outbound_tcp_and_init_settings_that_loop_fail() {
        let mut objects = healthy();
        objects[0]["spec"]["containers"][1]["args"]
            .as_array_mut()
            .expect("args")
            .push(json!("--outbound-tcp=127.0.0.1:5432=localhost:4140"));
        objects[1]["spec"]["initContainers"][0]["args"] =
            json!(["init", "--outgoing-proxy-port=4143", "--proxy-uid=1000"]);
        let c = loops(&snap(objects));
        assert_eq!(c.status, Status::Fail);
        let messages: Vec<&str> = c.findings.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(
            messages[0].starts_with("pod shop/web-1: --outbound-tcp"),
            "{messages:?}"
        );
        assert!(
            messages[1].contains("outbound TCP to port 4143"),
            "{messages:?}"
        );
        assert!(messages[2].contains("exempts uid 1000"), "{messages:?}");
    }

    #[test]
    fn loops_in_pod_templates_are_found_too() {
        let template = meshed(pod("shop", "tpl", "10.0.0.1"), "0.1.0");
        let mut deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "api", "namespace": "shop"},
            "spec": {"template": {"metadata": {"labels": {"app": "api"}}, "spec": template["spec"].clone()}}});
        deploy["spec"]["template"]["spec"]["initContainers"][0]["args"] =
            json!(["init", "--incoming-proxy-port=4140"]);
        let c = loops(&Snapshot::new(Source::Manifests, vec![deploy]));
        assert_eq!(names(&c), [["deployment shop/api"]]);
        assert!(
            c.findings[0].message.contains("a loop"),
            "{}",
            c.findings[0].message
        );
    }
}
