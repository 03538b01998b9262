//! The cluster in a box: a Node and its Kubelet run real Pod specs from the API
//! server emulation as processes in network namespaces.
//!
//! Needs root, iproute2, iptables, util-linux (setpriv, unshare, mount), curl and
//! python3. Without them each test prints `SKIPPED: <why>` and passes, except under
//! `CI`, where it fails saying why.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_testkit::cluster::{ImageSpec, Images, Kubelet, Node};
use ballast_testkit::{ApiServer, DeleteOptions};
use serde_json::{json, Value};

const PYTHON: &str = "/usr/bin/python3";

/// Why this machine cannot run these tests, if it cannot.
fn missing_tools() -> Option<String> {
    let out = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        return Some("not root (network namespaces need it)".into());
    }
    for tool in [
        "ip",
        "iptables-restore",
        "setpriv",
        "unshare",
        "mount",
        "curl",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !std::path::Path::new(PYTHON).exists() {
        return Some(format!("{PYTHON} is not installed"));
    }
    None
}

/// False (after saying why) when the test cannot run here; under CI, a failure.
fn can_run() -> bool {
    match missing_tools() {
        None => true,
        Some(why) if std::env::var_os("CI").is_some() => {
            panic!("the kubelet tests cannot run: {why} (install it in .ci/run)")
        }
        Some(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

fn images() -> Images {
    Images::new()
        .with("python", ImageSpec::entrypoint(PYTHON))
        .with(
            "shell",
            ImageSpec::entrypoint("/bin/sh")
                .command("sh", "/bin/sh")
                .command("curl", "/usr/bin/curl"),
        )
}

struct Cluster {
    api: Arc<ApiServer>,
    kubelet: Kubelet,
    node: Arc<Node>,
}

impl Cluster {
    async fn start() -> Cluster {
        let api = Arc::new(ApiServer::start().await);
        let node = Arc::new(Node::start("node-a", api.addr()).expect("the node starts"));
        let kubelet =
            Kubelet::start(api.clone(), node.clone(), images()).expect("the kubelet starts");
        Cluster { api, kubelet, node }
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.api.get("pods", "default", name)
    }

    /// Every container's log, for a failure message.
    fn all_logs(&self, pod: &str) -> String {
        let Some(p) = self.pod(pod) else {
            return format!("(pod {pod} is gone)");
        };
        let mut out = format!("pod {pod} status: {}\n", p["status"]);
        for field in ["initContainers", "containers"] {
            for c in p["spec"][field].as_array().into_iter().flatten() {
                let name = c["name"].as_str().unwrap_or("");
                out.push_str(&format!(
                    "--- {name}:\n{}\n",
                    self.kubelet.logs("default", pod, name)
                ));
            }
        }
        out
    }

    /// Waits (re-checking on every change in the store) until the pod satisfies
    /// `cond`; on timeout, fails with the pod's status and logs.
    async fn wait_pod(&self, name: &str, what: &str, secs: u64, cond: impl Fn(&Value) -> bool) {
        let ok = self
            .api
            .wait_until(Duration::from_secs(secs), |api| {
                api.get("pods", "default", name).is_some_and(|p| cond(&p))
            })
            .await;
        assert!(
            ok,
            "pod {name}: {what} within {secs}s\n{}",
            self.all_logs(name)
        );
    }

    async fn wait_ready(&self, name: &str) {
        self.wait_pod(name, "Ready", 30, is_ready).await;
    }

    /// Waits until the container's log contains `text`.
    async fn wait_log(&self, pod: &str, container: &str, text: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let log = self.kubelet.logs("default", pod, container);
            if log.contains(text) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "{pod}/{container} did not log {text:?} within {secs}s\n{}",
                self.all_logs(pod)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn netns_list() -> String {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pod(name: &str, labels: Value, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    })
}

fn web_server(name: &str) -> Value {
    pod(
        name,
        json!({"app": "web"}),
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": "python",
                "args": ["-m", "http.server", "8080", "--bind", "0.0.0.0"],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 1},
            }],
        }),
    )
}

fn shell(name: &str, script: &str) -> Value {
    pod(
        name,
        json!({"app": name}),
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "shell", "command": ["sh", "-c", script]}],
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_an_ip_on_the_node_and_becomes_ready_by_its_http_readiness_probe() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(web_server("web-0"));
    c.wait_ready("web-0").await;

    let p = c.pod("web-0").expect("the pod is stored");
    let ip: Ipv4Addr = p["status"]["podIP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a pod IP");
    assert_eq!(ip.octets()[..3], [10, 244, 0], "{p}");
    assert_eq!(p["status"]["hostIP"], c.node.ip().to_string());
    assert_eq!(p["status"]["podIPs"][0]["ip"], ip.to_string());
    assert_eq!(p["status"]["phase"], "Running");
    let status = &p["status"]["containerStatuses"][0];
    assert_eq!(status["ready"], true, "{p}");
    assert_eq!(status["started"], true, "{p}");
    assert_eq!(status["restartCount"], 0, "{p}");
    assert!(status["state"]["running"]["startedAt"].is_string(), "{p}");
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert!(
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == kind && c["status"] == "True"),
            "{kind}: {p}"
        );
    }
    // The node reaches the pod IP, as the API server would a webhook.
    c.node
        .dial((ip, 8080).into())
        .await
        .expect("the node dials the pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_sees_its_env_field_refs_and_volumes_as_its_own_user_after_init_and_post_start()
{
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": "default"},
        "data": {"greeting": "hello from a ConfigMap", "mode": "fast"},
    }));
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-secret", "namespace": "default"},
        // "s3cr3t"
        "data": {"password": "czNjcjN0"},
    }));
    let script = "echo \"name=$POD_NAME ns=$POD_NS app=$APP ip=$POD_IP sa=$SA node=$NODE host=$HOST_IP\"; \
                  echo \"mode=$MODE password=$PASSWORD id=$IDENTITY k8s=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\"; \
                  echo \"greeting=$(cat /etc/app-config/greeting)\"; \
                  echo \"secret-file=$(cat /etc/secret/pw)\"; \
                  echo \"init=$(cat /srv/work/init-done)\"; \
                  echo \"uid=$(id -u) gid=$(id -g) hostname=$(cat /proc/sys/kernel/hostname)\"; \
                  echo \"sa-namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)\"; \
                  exec sleep 1000";
    c.api.apply(pod(
        "env-0",
        json!({"app": "envtest"}),
        json!({
            "serviceAccountName": "envtest",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config"}},
                {"name": "secret", "secret": {"secretName": "app-secret", "items": [{"key": "password", "path": "pw"}]}},
                {"name": "work", "emptyDir": {}},
            ],
            "initContainers": [{
                "name": "init",
                "image": "shell",
                // Fails once: retried (with back-off) before any container starts.
                "command": ["sh", "-c",
                    "if [ -f /srv/work/tried ]; then echo yes > /srv/work/init-done; else touch /srv/work/tried; exit 3; fi"],
                "volumeMounts": [{"name": "work", "mountPath": "/srv/work"}],
            }],
            "containers": [{
                "name": "main",
                "image": "shell",
                "command": ["sh", "-c", script],
                "securityContext": {"runAsUser": 2102},
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "password"}}},
                    {"name": "IDENTITY", "value": "$(SA).$(POD_NS).serviceaccount"},
                ],
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/app-config", "readOnly": true},
                    {"name": "secret", "mountPath": "/etc/secret"},
                    {"name": "work", "mountPath": "/srv/work"},
                ],
                "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "sleep 0.5; echo yes > /srv/work/hook-done"]}}},
            }, {
                // Started only once the first container's postStart hook returned.
                "name": "after-hook",
                "image": "shell",
                "command": ["sh", "-c", "echo \"hook=$(cat /srv/work/hook-done)\"; exec sleep 1000"],
                "volumeMounts": [{"name": "work", "mountPath": "/srv/work"}],
            }],
        }),
    ));
    let log = c.wait_log("env-0", "main", "sa-namespace=", 30).await;
    c.wait_ready("env-0").await;
    let p = c.pod("env-0").expect("the pod is stored");
    let ip = p["status"]["podIP"].as_str().expect("a pod IP").to_string();
    let node_ip = c.node.ip();
    for want in [
        format!("name=env-0 ns=default app=envtest ip={ip} sa=envtest node=node-a host={node_ip}"),
        "mode=fast password=s3cr3t id=envtest.default.serviceaccount k8s=10.96.0.1:443".to_string(),
        "greeting=hello from a ConfigMap".to_string(),
        "secret-file=s3cr3t".to_string(),
        "init=yes".to_string(),
        "uid=2102 gid=1000 hostname=env-0".to_string(),
        "sa-namespace=default".to_string(),
    ] {
        assert!(log.contains(&want), "want {want:?} in\n{log}");
    }
    let after = c.wait_log("env-0", "after-hook", "hook=", 10).await;
    assert!(after.contains("hook=yes"), "{after}");
    let init = &p["status"]["initContainerStatuses"][0];
    assert_eq!(init["state"]["terminated"]["reason"], "Completed", "{p}");
    assert_eq!(init["restartCount"], 1, "{p}");
    assert_eq!(init["lastState"]["terminated"]["exitCode"], 3, "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reaches_another_through_its_service_cluster_ip_and_dns_names() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(web_server("web-0"));
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.50", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }));
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web-headless", "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 8080}]},
    }));
    c.wait_ready("web-0").await;
    let web_ip = c.pod("web-0").expect("stored")["status"]["podIP"]
        .as_str()
        .expect("a pod IP")
        .to_string();
    // Each step waits for the kube-proxy sync rather than assuming it happened.
    let get = |url: &str| {
        format!("until curl -sf -m 2 -o /dev/null {url}; do sleep 0.2; done; echo \"ok {url}\"; ")
    };
    let script = format!(
        "{}{}{}{}{}echo \"headless=$(getent hosts web-headless | cut -d' ' -f1)\"; exec sleep 1000",
        get("http://10.96.0.50/"),
        get("http://web.default.svc.cluster.local/"),
        get("http://web/"),
        get("http://web.default.svc.cluster.local.:80/"),
        get(&format!("http://{web_ip}:8080/")),
    );
    c.api.apply(shell("client", &script));
    let log = c.wait_log("client", "main", "headless=", 30).await;
    assert!(log.contains("ok http://10.96.0.50/"), "{log}");
    assert!(
        log.contains("ok http://web.default.svc.cluster.local/"),
        "{log}"
    );
    assert!(log.contains("ok http://web/"), "{log}");
    assert!(
        log.contains("ok http://web.default.svc.cluster.local.:80/"),
        "{log}"
    );
    assert!(log.contains(&format!("headless={web_ip}")), "{log}");
    // From the node too (as the API server calls a webhook through its Service).
    c.node
        .dial(([10, 96, 0, 50], 80).into())
        .await
        .expect("the node dials the cluster IP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(pod(
        "sick-0",
        json!({"app": "sick"}),
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "shell",
                "command": ["sh", "-c", "echo started; exec sleep 1000"],
                // Nothing listens there: every probe fails.
                "livenessProbe": {"tcpSocket": {"port": 9999}, "periodSeconds": 1, "failureThreshold": 2},
            }],
        }),
    ));
    let restarts = |p: &Value| p["status"]["containerStatuses"][0]["restartCount"].as_u64();
    c.wait_pod("sick-0", "restarted twice", 40, |p| restarts(p) >= Some(2))
        .await;
    let p = c.pod("sick-0").expect("stored");
    let last = &p["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert!(last["exitCode"].as_i64().is_some_and(|c| c != 0), "{p}");
    let log = c.kubelet.logs("default", "sick-0", "main");
    assert!(log.matches("started").count() >= 2, "{log}");
    assert!(log.contains("Liveness probe failed"), "{log}");
}

/// Prints the memory limit the container's cgroup has (v1 or v2), then
/// holds 200 MB in a shell variable.
const HUNGRY: &str = r#"cg=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
if [ -n "$cg" ]; then f=/sys/fs/cgroup/memory$cg/memory.limit_in_bytes
else f=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/memory.max; fi
echo "limit $(cat "$f")"
a=$(head -c 200000000 /dev/zero | tr '\0' x)
echo "survived ${#a}""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_runs_in_its_memory_limit_and_past_it_is_oom_killed_and_restarted() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    let mut hungry = shell("hungry-0", HUNGRY);
    hungry["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "32Mi"}});
    c.api.apply(hungry);
    // Without a limit the same script holds its 200 MB and goes on.
    c.api.apply(shell("fed-0", HUNGRY));

    let last = |p: &Value| p["status"]["containerStatuses"][0]["lastState"]["terminated"].clone();
    c.wait_pod("hungry-0", "OOMKilled", 60, |p| {
        last(p)["reason"] == "OOMKilled"
    })
    .await;
    let p = c.pod("hungry-0").expect("stored");
    assert_eq!(last(&p)["exitCode"], 137, "{p}");
    c.wait_pod("hungry-0", "restarted", 60, |p| {
        p["status"]["containerStatuses"][0]["restartCount"].as_u64() >= Some(1)
    })
    .await;
    let log = c.kubelet.logs("default", "hungry-0", "main");
    assert!(log.contains("limit 33554432"), "{log}");
    assert!(!log.contains("survived"), "{log}");

    let log = c.wait_log("fed-0", "main", "survived 200000000", 60).await;
    assert!(!log.contains("limit 33554432"), "{log}");
    let p = c.pod("fed-0").expect("stored");
    assert_ne!(last(&p)["reason"], "OOMKilled", "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pod_sends_sigterm_then_sigkill_after_the_grace_then_removes_it() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    // It ignores SIGTERM (saying so, and what its preStop hook left): only the SIGKILL
    // at the end of the grace stops it.
    c.api.apply(pod(
        "stubborn",
        json!({"app": "stubborn"}),
        json!({
            "nodeName": "node-a",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "stop", "emptyDir": {}}],
            "containers": [{
                "name": "main",
                "image": "shell",
                "command": ["sh", "-c",
                    "trap 'echo \"got TERM after $(cat /srv/stop/hook)\"' TERM; echo up; while true; do sleep 0.1; done"],
                "volumeMounts": [{"name": "stop", "mountPath": "/srv/stop"}],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo preStop > /srv/stop/hook"]}}},
            }],
        }),
    ));
    c.wait_ready("stubborn").await;
    c.wait_log("stubborn", "main", "up", 10).await;
    let netns = c
        .kubelet
        .pod_netns("default", "stubborn")
        .expect("the pod has a sandbox");
    assert!(netns_list().contains(&netns));

    // As `kubectl delete --grace-period=2`: a scheduled pod is only marked, and the
    // kubelet finishes the deletion.
    let deleted_at = Instant::now();
    c.api
        .delete_with(
            "pods",
            "default",
            "stubborn",
            &DeleteOptions {
                grace_period_seconds: Some(2),
                ..DeleteOptions::default()
            },
        )
        .expect("the delete is accepted");
    let marked = c.pod("stubborn").expect("still stored while it terminates");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    c.wait_log("stubborn", "main", "got TERM after preStop", 10)
        .await;
    let gone = c
        .api
        .wait_until(Duration::from_secs(20), |api| {
            api.get("pods", "default", "stubborn").is_none()
        })
        .await;
    let took = deleted_at.elapsed();
    assert!(gone, "the pod was not removed\n{}", c.all_logs("stubborn"));
    assert!(
        took >= Duration::from_millis(1900),
        "removed after {took:?}, before the 2 s grace"
    );
    assert!(took < Duration::from_secs(10), "removed after {took:?}");
    // Its sandbox goes with it (the kubelet removes it right after the store's delete).
    let deadline = Instant::now() + Duration::from_secs(10);
    while netns_list().contains(&netns) {
        assert!(Instant::now() < deadline, "{netns} is still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reaches_the_api_server_over_tls_at_the_kubernetes_service() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    // The projected token Linkerd's proxy presents to its identity controller, which
    // reviews it with the API server.
    let review = "printf '{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\",\
                  \"spec\":{\"token\":\"%s\",\"audiences\":[\"identity.l5d.io\"]}}' \"$(cat /var/run/secrets/tokens/identity)\"";
    let script = format!(
        "for url in https://10.96.0.1/version https://kubernetes.default.svc/version; do \
           until out=$(curl -sS -f -m 2 --cacert {sa}/ca.crt -H \"Authorization: Bearer $(cat {sa}/token)\" $url); \
           do sleep 0.2; done; echo \"$url: $out\"; done; \
         echo \"review: $({review} | curl -sS -f -m 5 --cacert {sa}/ca.crt -H 'Content-Type: application/json' \
           --data @- https://kubernetes.default.svc/apis/authentication.k8s.io/v1/tokenreviews)\"; \
         echo done; exec sleep 1000"
    );
    let mut caller = shell("caller", &script);
    caller["spec"]["volumes"] = json!([{"name": "identity-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "identity.l5d.io", "expirationSeconds": 86400, "path": "identity"}}
    ]}}]);
    caller["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "identity-token", "mountPath": "/var/run/secrets/tokens"}]);
    c.api.apply(caller);
    let log = c.wait_log("caller", "main", "done", 30).await;
    assert!(log.contains("https://10.96.0.1/version: {"), "{log}");
    assert!(
        log.contains("https://kubernetes.default.svc/version: {"),
        "{log}"
    );
    assert!(log.contains("gitVersion"), "{log}");
    let review = log
        .lines()
        .find_map(|l| l.strip_prefix("review: "))
        .unwrap_or_else(|| panic!("no review in {log}"));
    let review: Value = serde_json::from_str(review).expect("a TokenReview");
    assert_eq!(review["status"]["authenticated"], true, "{review}");
    assert_eq!(
        review["status"]["user"]["username"], "system:serviceaccount:default:default",
        "{review}"
    );
    // The API server saw the pod's requests, relayed by the node.
    assert!(
        c.api
            .requests()
            .iter()
            .filter(|r| r.path == "/version")
            .count()
            >= 2,
        "{:?}",
        c.api.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_kubelet_and_node_kills_every_process_and_removes_every_namespace() {
    if !can_run() {
        return;
    }
    // `$$` in a command is Kubernetes' escape for `$`: `$$$$` is the shell's `$$`.
    let c = Cluster::start().await;
    c.api
        .apply(shell("lingering", "echo \"pid=$$$$\"; exec sleep 1000"));
    c.wait_ready("lingering").await;
    let log = c.wait_log("lingering", "main", "pid=", 10).await;
    let pid: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the pod printed its pid: {log:?}"));
    let pod_netns = c
        .kubelet
        .pod_netns("default", "lingering")
        .expect("a sandbox");
    let node_netns = c.node.netns().to_string();
    let dir = c.kubelet.dir().to_path_buf();
    let list = netns_list();
    assert!(
        list.contains(&pod_netns) && list.contains(&node_netns),
        "{list}"
    );

    let Cluster { api, kubelet, node } = c;
    drop(kubelet);
    drop(node);
    let list = netns_list();
    assert!(!list.contains(&pod_netns), "{pod_netns} is left: {list}");
    assert!(!list.contains(&node_netns), "{node_netns} is left: {list}");
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        !std::path::Path::new("/etc/netns").join(&pod_netns).exists(),
        "/etc/netns/{pod_netns} is left"
    );
    // SIGKILLed at the drop; gone (or a zombie awaiting its reaper) soon after.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
        if stat.is_empty() || state == Some('Z') {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs: {stat}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_removed_from_the_store_is_stopped_and_its_sandbox_removed() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    // Its preStop hook is an HTTP GET the server logs.
    let mut web = web_server("removed");
    web["spec"]["containers"][0]["lifecycle"] =
        json!({"preStop": {"httpGet": {"port": "http", "path": "/pre-stop"}}});
    c.api.apply(web);
    c.wait_ready("removed").await;
    let p = c.pod("removed").expect("stored");
    assert!(p["status"]["startTime"].is_string(), "{p}");
    let netns = c
        .kubelet
        .pod_netns("default", "removed")
        .expect("the pod has a sandbox");
    assert!(c.api.delete("v1", "Pod", "default", "removed"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.kubelet.pod_netns("default", "removed").is_some() || netns_list().contains(&netns) {
        assert!(
            Instant::now() < deadline,
            "{netns} is still there\n{}",
            c.kubelet.logs("default", "removed", "web")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        c.pod("removed").is_none(),
        "the kubelet brought the pod back"
    );
    let log = c.kubelet.logs("default", "removed", "web");
    assert!(log.contains("GET /pre-stop"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_readiness_probe_gates_readiness_and_an_unknown_image_waits() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(pod(
        "gated",
        json!({"app": "gated"}),
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "flag", "emptyDir": {}}],
            "containers": [{
                "name": "main",
                "image": "shell",
                "command": ["sh", "-c", "sleep 1; touch /srv/flag/ready; exec sleep 1000"],
                "volumeMounts": [{"name": "flag", "mountPath": "/srv/flag"}],
                "readinessProbe": {"exec": {"command": ["sh", "-c", "test -f /srv/flag/ready"]}, "periodSeconds": 1},
            }],
        }),
    ));
    let ready = |p: &Value| p["status"]["containerStatuses"][0]["ready"] == true;
    c.wait_pod("gated", "not ready while the probe fails", 20, |p| {
        p["status"]["containerStatuses"][0]["started"] == true && !ready(p)
    })
    .await;
    c.wait_ready("gated").await;

    c.api.apply(pod(
        "unknown",
        json!({"app": "unknown"}),
        json!({"containers": [{"name": "main", "image": "registry.example/nope:1"}]}),
    ));
    c.wait_pod("unknown", "waiting with ImageNotKnown", 20, |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImageNotKnown"
    })
    .await;
    let p = c.pod("unknown").expect("stored");
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    assert!(!is_ready(&p), "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_made_by_the_controllers_serves_behind_its_allocated_cluster_ip() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    let _controllers =
        ballast_testkit::cluster::controllers::Controllers::start(c.api.clone(), "node-a");
    let svc = c
        .api
        .create(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
        }))
        .await
        .expect("the Service is created");
    let cluster_ip = svc["spec"]["clusterIP"]
        .as_str()
        .expect("a cluster IP allocated")
        .to_string();
    let template = web_server("unused");
    c.api
        .create(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
            },
        }))
        .await
        .expect("the Deployment is created");
    let ready_pods = |api: &ApiServer| {
        api.list("pods")
            .iter()
            .filter(|p| p["metadata"]["labels"]["app"] == "web" && is_ready(p))
            .count()
    };
    let all_ready = c
        .api
        .wait_until(Duration::from_secs(40), |api| ready_pods(api) == 2)
        .await;
    assert!(
        all_ready,
        "2 ready pods of the Deployment: {:#?}",
        c.api.list("pods")
    );
    let get = |url: &str| {
        format!("until curl -sf -m 2 -o /dev/null {url}; do sleep 0.2; done; echo \"ok {url}\"; ")
    };
    c.api.apply(shell(
        "client",
        &format!(
            "{}{}echo done; exec sleep 1000",
            get(&format!("http://{cluster_ip}/")),
            get("http://web/")
        ),
    ));
    let log = c.wait_log("client", "main", "done", 30).await;
    assert!(log.contains(&format!("ok http://{cluster_ip}/")), "{log}");
    assert!(log.contains("ok http://web/"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_the_config_map_its_volume_needs() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    let mut p = shell(
        "patient",
        "echo \"setting=$(cat /etc/patient/setting)\"; exec sleep 1000",
    );
    p["spec"]["volumes"] = json!([{"name": "config", "configMap": {"name": "late"}}]);
    p["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "config", "mountPath": "/etc/patient"}]);
    c.api.apply(p);
    c.wait_pod("patient", "a status saying what it waits for", 20, |p| {
        p["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("configmaps default/late not found"))
    })
    .await;
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "late", "namespace": "default"},
        "data": {"setting": "arrived"},
    }));
    c.wait_log("patient", "main", "setting=arrived", 30).await;
    c.wait_ready("patient").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_thirty_pods_at_once_and_removes_them_all() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    let started = Instant::now();
    for i in 0..30 {
        c.api.apply(shell(&format!("many-{i}"), "exec sleep 1000"));
    }
    let ready = |api: &ApiServer| api.list("pods").iter().filter(|p| is_ready(p)).count();
    let all = c
        .api
        .wait_until(Duration::from_secs(60), |api| ready(api) == 30)
        .await;
    assert!(all, "{} of 30 ready", ready(&c.api));
    let up = started.elapsed();
    let netns: Vec<String> = (0..30)
        .filter_map(|i| c.kubelet.pod_netns("default", &format!("many-{i}")))
        .collect();
    assert_eq!(netns.len(), 30);
    let ips: std::collections::HashSet<String> = c
        .api
        .list("pods")
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str().map(String::from))
        .collect();
    assert_eq!(ips.len(), 30, "every pod has its own IP");
    let deleting = Instant::now();
    for i in 0..30 {
        c.api.delete("v1", "Pod", "default", &format!("many-{i}"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = netns_list();
        let left = netns.iter().filter(|n| list.contains(n.as_str())).count();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} sandboxes left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "30 pods ready in {up:?}, removed in {:?}",
        deleting.elapsed()
    );
}

/// A stand-in for a mesh proxy: accepts what the pod's iptables redirect to
/// 127.0.0.1:4140, logs the original destination (SO_ORIGINAL_DST), and relays one
/// request there.
const RELAY: &str = r#"
import socket, struct
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 4140))
s.listen(16)
while True:
    c, _ = s.accept()
    raw = c.getsockopt(socket.SOL_IP, 80, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    ip = socket.inet_ntoa(raw[4:8])
    print(f"orig={ip}:{port}", flush=True)
    u = socket.create_connection((ip, port), timeout=5)
    u.sendall(c.recv(65536))
    while True:
        b = u.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
    u.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_in_the_pod_sees_the_cluster_ip_as_the_original_destination() {
    if !can_run() {
        return;
    }
    let c = Cluster::start().await;
    c.api.apply(web_server("web-0"));
    c.api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.50", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }));
    // As a proxy's init container: the pod's own nat OUTPUT sends what the app opens
    // to the proxy, except the proxy's own (uid 2102). Service DNAT happens later, on
    // the node, so the proxy sees the cluster IP, as on a real node.
    c.api.apply(pod(
        "meshed",
        json!({"app": "meshed"}),
        json!({
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": "init",
                "image": "shell",
                "command": ["sh", "-c",
                    "iptables -t nat -A OUTPUT -p tcp -d 10.96.0.0/12 -m owner ! --uid-owner 2102 -j REDIRECT --to-ports 4140"],
            }],
            "containers": [
                {
                    "name": "proxy",
                    "image": "python",
                    "args": ["-c", RELAY],
                    "securityContext": {"runAsUser": 2102},
                },
                {
                    "name": "app",
                    "image": "shell",
                    "command": ["sh", "-c",
                        "until out=$(curl -sf -m 2 http://web/); do sleep 0.2; done; \
                         echo \"listing=$(echo \"$out\" | grep -q 'Directory listing' && echo yes)\"; exec sleep 1000"],
                },
            ],
        }),
    ));
    let app = c.wait_log("meshed", "app", "listing=", 30).await;
    assert!(app.contains("listing=yes"), "{app}");
    let proxy = c.kubelet.logs("default", "meshed", "proxy");
    assert!(proxy.contains("orig=10.96.0.50:80"), "{proxy}");
}
