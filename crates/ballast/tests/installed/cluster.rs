//! The cluster in a box for the installed-mesh tests: one node, its kubelet
//! and the cluster's controllers over the API server emulation, with the
//! image table mapping install's images to the built binaries, and the
//! application the tests mesh.

#![allow(dead_code)]

use std::{
    path::PathBuf,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use ballast_testkit::{
    cluster::{controllers::Controllers, ImageSpec, Images, Kubelet, Node},
    ApiServer,
};
use serde_json::{json, Value};

/// Why this machine cannot run these tests, if it cannot.
pub fn missing_tools() -> Option<String> {
    let out = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        return Some("not root (network namespaces need it)".into());
    }
    for tool in [
        "ip",
        "iptables",
        "iptables-restore",
        "setpriv",
        "unshare",
        "mount",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// False (after saying why) when the test cannot run here; under CI, a failure.
pub fn can_run() -> bool {
    match missing_tools() {
        None => true,
        Some(why) if std::env::var_os("CI").is_some() => {
            panic!("the installed-mesh tests cannot run: {why} (install it in .ci/run)")
        }
        Some(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// The built binaries the images stand for: `ballast` (the controller image)
/// and `ballast-proxy` (the proxy and init images), beside it.
pub fn binaries() -> (PathBuf, PathBuf) {
    let ballast = PathBuf::from(env!("CARGO_BIN_EXE_ballast"));
    let proxy = ballast.with_file_name("ballast-proxy");
    assert!(
        proxy.exists(),
        "{} is not built: `cargo build -p ballast-sidecar` (cargo test --workspace builds it)",
        proxy.display()
    );
    (ballast, proxy)
}

/// The image table: install's image names to the binaries.
pub fn images() -> Images {
    let (ballast, proxy) = binaries();
    Images::new()
        .with(
            "ballast:latest",
            ImageSpec::entrypoint(&ballast).command("ballast", &ballast),
        )
        // A second tag of the controller image, for upgrades.
        .with(
            "ballast:v2",
            ImageSpec::entrypoint(&ballast).command("ballast", &ballast),
        )
        .with(
            "ballast-proxy:latest",
            ImageSpec::entrypoint(&proxy).command("ballast-proxy", &proxy),
        )
        .with(
            "ballast-init:latest",
            ImageSpec::entrypoint(&proxy).command("ballast-proxy", &proxy),
        )
        // The application: `ballast backend` servers, and callers in a shell.
        .with(
            "app:latest",
            ImageSpec::entrypoint(&ballast).command("ballast", &ballast),
        )
        .with(
            "tools:latest",
            ImageSpec::entrypoint("/bin/sh")
                .command("sh", "/bin/sh")
                .command("curl", "/usr/bin/curl"),
        )
}

/// One node, its kubelet and the cluster's controllers over an API server.
pub struct ClusterBox {
    pub api: Arc<ApiServer>,
    pub kubelet: Kubelet,
    _controllers: Controllers,
    dir: tempfile::TempDir,
    pub started: Instant,
}

impl ClusterBox {
    pub async fn start() -> ClusterBox {
        let started = Instant::now();
        let api = Arc::new(ApiServer::start().await);
        let node = Arc::new(Node::start("node-1", api.addr()).expect("the node starts"));
        // The kubelet installs the API server's dialer for webhooks named by
        // Service (their cluster IP, dialled from the node).
        let controllers = Controllers::start(api.clone(), node.name());
        let kubelet = Kubelet::start(api.clone(), node, images()).expect("the kubelet starts");
        ClusterBox {
            api,
            kubelet,
            _controllers: controllers,
            dir: tempfile::tempdir().expect("tempdir"),
            started,
        }
    }

    /// Creates every document of `yaml`, in order, as `kubectl apply` would
    /// on an empty cluster (through admission).
    pub async fn apply(&self, yaml: &str) {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("manifests parse");
        for doc in docs.into_iter().filter(Value::is_object) {
            let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
            if let Err(e) = self.api.create(doc).await {
                panic!("applying {what}: {e:?}");
            }
        }
    }

    /// `GET http://ADDR/PATH` from inside the node: (status, body).
    pub async fn get(
        &self,
        addr: std::net::SocketAddr,
        path: &str,
    ) -> Result<(u16, String), String> {
        use http_body_util::{BodyExt, Empty};
        let stream = self
            .kubelet
            .node()
            .dial(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake::<_, Empty<hyper::body::Bytes>>(
                hyper_util::rt::TokioIo::new(stream),
            )
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let rsp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .map_err(|_| "no answer in 10s".to_string())?
            .map_err(|e| e.to_string())?;
        let status = rsp.status().as_u16();
        let body = rsp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// A gRPC channel (HTTP/2 in plaintext) to `addr` from inside the node.
    pub async fn grpc_channel(&self, addr: std::net::SocketAddr) -> tonic::transport::Channel {
        let node = self.kubelet.node().clone();
        let connector = tower::service_fn(move |_: http::Uri| {
            let node = node.clone();
            async move {
                let stream = node.dial(addr).await?;
                // As tonic's own connector: no Nagle delay on each stream's
                // small frames.
                stream.set_nodelay(true)?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        tonic::transport::Endpoint::from_static("http://box.invalid")
            .connect_with_connector(connector)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    /// The pods of `namespace` labelled `app=APP`.
    pub fn pods_of(&self, namespace: &str, app: &str) -> Vec<Value> {
        self.api
            .list("pods")
            .into_iter()
            .filter(|p| {
                p["metadata"]["namespace"] == namespace && p["metadata"]["labels"]["app"] == app
            })
            .collect()
    }

    /// Creates or replaces every document of `yaml`, as `kubectl apply` does
    /// on a cluster that has them (through admission; a replaced
    /// Deployment's template change rolls it).
    pub async fn apply_over(&self, yaml: &str) {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("manifests parse");
        for doc in docs.into_iter().filter(Value::is_object) {
            let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
            let result = match self.api.create(doc.clone()).await {
                Err(e) if e.code == 409 => self.api.update(doc).await,
                other => other,
            };
            if let Err(e) = result {
                panic!("applying {what}: {e:?}");
            }
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.api.write_kubeconfig(self.dir.path())
    }

    /// Every pod of `namespace` with its status and its containers' logs.
    pub fn describe(&self, namespace: &str) -> String {
        let mut out = String::new();
        for pod in self.api.list("pods") {
            if pod["metadata"]["namespace"] != namespace {
                continue;
            }
            let name = pod["metadata"]["name"].as_str().unwrap_or("?");
            out.push_str(&format!("pod {name}: {}\n", pod["status"]));
            for list in ["initContainers", "containers"] {
                for c in pod["spec"][list].as_array().into_iter().flatten() {
                    let c = c["name"].as_str().unwrap_or("?");
                    let log = self.kubelet.logs(namespace, name, c);
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    out.push_str(&format!("--- {c} (last lines):\n"));
                    for line in tail.iter().rev() {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// Waits until every Deployment of `namespace` has all its replicas ready.
    pub async fn wait_deployments_ready(&self, namespace: &str, within: Duration) {
        let ready = self
            .api
            .wait_until(within, |api| {
                let deployments: Vec<Value> = api
                    .list("deployments")
                    .into_iter()
                    .filter(|d| d["metadata"]["namespace"] == namespace)
                    .collect();
                !deployments.is_empty()
                    && deployments.iter().all(|d| {
                        let want = d["spec"]["replicas"].as_u64().unwrap_or(1);
                        d["status"]["readyReplicas"].as_u64() == Some(want)
                    })
            })
            .await;
        assert!(
            ready,
            "the Deployments of {namespace} were not all ready within {within:?}\n{}",
            self.describe(namespace)
        );
    }
}

/// An application shaped like Linkerd's emojivoto, in a namespace annotated
/// `linkerd.io/inject: enabled`: `web` calls `emoji` and `voting`, and
/// `vote-bot` calls `web`. Every Deployment is created as a user writes it;
/// the pods are injected by the webhook.
pub fn emojivoto() -> String {
    let backend = |name: &str| {
        format!(
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: emojivoto}}\n\
             ---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: emojivoto}}\n\
             spec:\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n\
             ---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: emojivoto}}\n\
             spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n\
             \x20   metadata: {{labels: {{app: {name}}}}}\n\
             \x20   spec:\n      serviceAccountName: {name}\n      containers:\n\
             \x20     - name: {name}\n        image: app:latest\n        command: [ballast]\n\
             \x20       args: [backend, --addr, \"0.0.0.0:8080\", --name, {name}]\n\
             \x20       ports: [{{name: http, containerPort: 8080}}]\n"
        )
    };
    // A caller: a loop of curl through the pod's proxy, one line per request
    // (`ok URL SECONDS`, or `fail URL rc=CURL_EXIT HTTP_CODE SECONDS at
    // HH:MM:SS` in UTC, to place a failure among the proxies' logs).
    let caller = |targets: &[&str]| {
        let urls: Vec<String> = targets
            .iter()
            .map(|t| format!("http://{t}.emojivoto.svc.cluster.local/"))
            .collect();
        format!(
            "      - name: caller\n        image: tools:latest\n        command: [sh, -c]\n\
             \x20       args:\n          - 'while :; do for u in {}; do o=$(curl -s -m 5 -o /dev/null -w \"%{{http_code}} %{{time_total}}\" $u); r=$?; case \"$r $o\" in \"0 2\"*) echo ok $u ${{o#* }};; *) echo fail $u rc=$r $o at $(date -u +%H:%M:%S);; esac; done; sleep 0.2; done'\n",
            urls.join(" ")
        )
    };
    let mut out = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: emojivoto\n  annotations: {linkerd.io/inject: enabled}\n",
    );
    for name in ["emoji", "voting", "web"] {
        out.push_str(&backend(name));
    }
    // web's pod also calls emoji and voting (its second container).
    let web_caller = caller(&["emoji", "voting"]);
    let web_end = "        args: [backend, --addr, \"0.0.0.0:8080\", --name, web]\n        ports: [{name: http, containerPort: 8080}]\n";
    out = out.replace(web_end, &format!("{web_end}{web_caller}"));
    out.push_str(
        "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: vote-bot, namespace: emojivoto}\n\
         ---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vote-bot, namespace: emojivoto}\n\
         spec:\n  replicas: 1\n  selector: {matchLabels: {app: vote-bot}}\n  template:\n\
         \x20   metadata: {labels: {app: vote-bot}}\n\
         \x20   spec:\n      serviceAccountName: vote-bot\n      containers:\n",
    );
    out.push_str(&caller(&["web"]));
    out
}

impl ClusterBox {
    /// A cluster with `ballast install`'s output applied and its control
    /// plane ready.
    pub async fn installed() -> ClusterBox {
        ClusterBox::installed_with(|rendered| rendered).await
    }

    /// [`ClusterBox::installed`], with install's output changed by `edit`
    /// first (a fault test's shorter certificate lifetime).
    pub async fn installed_with(edit: impl FnOnce(String) -> String) -> ClusterBox {
        ClusterBox::installed_by(&[], edit).await
    }

    /// [`ClusterBox::installed_with`], `ballast install` given `args`.
    pub async fn installed_by(args: &[&str], edit: impl FnOnce(String) -> String) -> ClusterBox {
        let (ballast, _) = binaries();
        let cluster = ClusterBox::start().await;
        let install = Command::new(&ballast)
            .arg("install")
            .args(args)
            .output()
            .expect("ballast install runs");
        assert!(install.status.success(), "{install:?}");
        let rendered = edit(String::from_utf8_lossy(&install.stdout).into_owned());
        cluster.apply(&rendered).await;
        cluster
            .wait_deployments_ready("ballast", Duration::from_secs(120))
            .await;
        cluster
    }

    /// Scales control plane Deployment `deployment` to `replicas`; at 0,
    /// waits until its pods are gone.
    pub async fn scale(&self, deployment: &str, replicas: u32) {
        self.api
            .patch_merge(
                "deployments",
                "ballast",
                deployment,
                serde_json::json!({"spec": {"replicas": replicas}}),
            )
            .await
            .expect("scaled");
        if replicas > 0 {
            return;
        }
        let gone = self
            .api
            .wait_until(Duration::from_secs(60), |api| {
                !api.list("pods")
                    .iter()
                    .any(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == deployment)
            })
            .await;
        assert!(gone, "the pods of {deployment} went away");
    }

    /// The log of container `container` of the first pod of `app` in `namespace`.
    pub fn log_of(&self, namespace: &str, app: &str, container: &str) -> String {
        self.pods_of(namespace, app)
            .first()
            .and_then(|p| p["metadata"]["name"].as_str().map(String::from))
            .map(|pod| self.kubelet.logs(namespace, &pod, container))
            .unwrap_or_default()
    }

    /// `metric` on the admin `port` of every pod of the control plane's
    /// `name` (its `app.kubernetes.io/name`), by pod name; `None` where the
    /// page has no such series (or could not be read, said on stderr).
    pub async fn control_plane_metric(
        &self,
        name: &str,
        port: u16,
        metric: &str,
    ) -> Vec<(String, Option<f64>)> {
        let pods: Vec<Value> = self
            .api
            .list("pods")
            .into_iter()
            .filter(|p| {
                p["metadata"]["namespace"] == "ballast"
                    && p["metadata"]["labels"]["app.kubernetes.io/name"] == name
            })
            .collect();
        let mut values = Vec::new();
        for p in pods {
            let pod = p["metadata"]["name"].as_str().unwrap_or("").to_string();
            let Some(ip) = p["status"]["podIP"].as_str().and_then(|ip| ip.parse().ok()) else {
                values.push((pod, None));
                continue;
            };
            let value = match self
                .get(std::net::SocketAddr::new(ip, port), "/metrics")
                .await
            {
                Ok((200, body)) => {
                    ballast_testsupport::metrics::Metrics::parse(&body).value(metric)
                }
                other => {
                    eprintln!("{pod}:{port}/metrics: {other:?}");
                    None
                }
            };
            values.push((pod, value));
        }
        values
    }

    /// The first pod of `app` in `namespace`: its IP.
    pub fn pod_ip(&self, namespace: &str, app: &str) -> std::net::IpAddr {
        self.pods_of(namespace, app)
            .first()
            .and_then(|p| p["status"]["podIP"].as_str().and_then(|ip| ip.parse().ok()))
            .unwrap_or_else(|| panic!("no pod IP for {namespace}/{app}"))
    }
}

/// A `ballast backend` Deployment `name` in `namespace` answering its own
/// name on 8080, with its ServiceAccount and a Service `name` (port 80 to
/// 8080), as the objects to create.
pub fn backend_objects(namespace: &str, name: &str) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, "namespace": namespace}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"selector": {"app": name},
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"serviceAccountName": name, "containers": [{
                                         "name": name, "image": "app:latest", "command": ["ballast"],
                                         "args": ["backend", "--addr", "0.0.0.0:8080", "--name", name],
                                         "ports": [{"name": "http", "containerPort": 8080}]}]}}}}),
    ]
}

/// Inbound policy admitting one mesh identity to port 8080 of `app`'s pods in
/// `namespace`: a MeshTLSAuthentication `web-only`, an AuthorizationPolicy
/// `APP-from-web` and a Server `APP-http`, in that order (authentication
/// and authorization first, the Server last, so no moment has a Server
/// without its authorization).
pub fn only_identity_to(namespace: &str, app: &str, identity: &str) -> Vec<Value> {
    let server = format!("{app}-http");
    vec![
        json!({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "MeshTLSAuthentication",
               "metadata": {"name": "web-only", "namespace": namespace},
               "spec": {"identities": [identity]}}),
        json!({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
               "metadata": {"name": format!("{app}-from-web"), "namespace": namespace},
               "spec": {"targetRef": {"group": "policy.linkerd.io", "kind": "Server",
                                      "name": server},
                        "requiredAuthenticationRefs": [{
                            "group": "policy.linkerd.io", "kind": "MeshTLSAuthentication",
                            "name": "web-only"}]}}),
        json!({"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
               "metadata": {"name": server, "namespace": namespace},
               "spec": {"podSelector": {"matchLabels": {"app": app}},
                        "port": 8080, "proxyProtocol": "HTTP/1"}}),
    ]
}

/// A Deployment `name` in `namespace` (service account `name`, created with
/// it) whose container `caller` (`tools:latest`) runs `sh -c SCRIPT`; its pod
/// template carries `pod_annotations` (a JSON object).
pub fn caller_objects(
    namespace: &str,
    name: &str,
    script: &str,
    pod_annotations: Value,
) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, "namespace": namespace}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name},
                                                  "annotations": pod_annotations},
                                     "spec": {"serviceAccountName": name, "containers": [{
                                         "name": "caller", "image": "tools:latest",
                                         "command": ["sh", "-c"], "args": [script]}]}}}}),
    ]
}

impl ClusterBox {
    /// Creates each object, in order, through the API server (and admission).
    pub async fn create_all(&self, objects: Vec<Value>) {
        for obj in objects {
            let what = format!("{} {}", obj["kind"], obj["metadata"]["name"]);
            if let Err(e) = self.api.create(obj).await {
                panic!("creating {what}: {e:?}");
            }
        }
    }

    /// Polls the log of `container` of `app`'s first pod until `cond` holds
    /// (a log changes no stored object, so `wait_until` would not see it);
    /// false when `within` passed first.
    pub async fn wait_for_log(
        &self,
        namespace: &str,
        app: &str,
        container: &str,
        within: Duration,
        mut cond: impl FnMut(&str) -> bool,
    ) -> bool {
        let until = Instant::now() + within;
        loop {
            if cond(&self.log_of(namespace, app, container)) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether the proxy of `app`'s first pod counts an outbound mutual-TLS
    /// connection to `server_id` (`tcp_open_total` on its `/metrics`); with its
    /// `tcp_open_total` lines, to say why not.
    pub async fn outbound_mtls_to(
        &self,
        namespace: &str,
        app: &str,
        server_id: &str,
    ) -> (bool, String) {
        let ip = self.pod_ip(namespace, app);
        let metrics = match self.get((ip, 4191).into(), "/metrics").await {
            Ok((200, body)) => body,
            Ok((status, body)) => return (false, format!("/metrics: {status} {body}")),
            Err(e) => return (false, format!("/metrics: {e}")),
        };
        let open: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("tcp_open_total{"))
            .collect();
        let secured = ballast_testsupport::metrics::Metrics::parse(&metrics)
            .find(
                "tcp_open_total",
                &[
                    ("direction", "outbound"),
                    ("tls", "true"),
                    ("server_id", server_id),
                ],
            )
            .next()
            .is_some();
        (secured, open.join("\n"))
    }
}

/// A caller's failed calls after its first success with the same URL: a
/// caller may start before its target has a ready endpoint, and its proxy
/// then fails fast until one is (that is the proxy doing its job, not a
/// failure of the mesh).
pub fn failures_after_first_success(log: &str) -> usize {
    let mut answered = std::collections::HashSet::new();
    let mut failures = 0;
    for line in log.lines() {
        let mut words = line.split(' ');
        match (words.next(), words.next()) {
            (Some("ok"), Some(url)) => {
                answered.insert(url.to_string());
            }
            (Some("fail"), Some(url)) if answered.contains(url) => failures += 1,
            _ => {}
        }
    }
    failures
}

/// The heavy box tests of one test binary run one at a time: two clusters at
/// once on a 2-core machine stretch the timings they ride out (a
/// certificate's lifetime, curl's timeout) for no coverage gained.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static BOX: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    BOX.lock().await
}

impl ClusterBox {
    /// Captures the TCP traffic between pods on the node's bridge (every
    /// pod-to-pod packet is routed through it) until stopped; the node's own
    /// (probes, the API server) is left out.
    pub fn capture_between_pods(&self) -> ballast_testkit::cluster::capture::Capture {
        let node = self.kubelet.node();
        let [a, b, c, _] = node.ip().octets();
        let pods = format!("{a}.{b}.{c}.0/24");
        let filter = format!(
            "tcp and src net {pods} and dst net {pods} and not host {}",
            node.ip()
        );
        ballast_testkit::cluster::capture::Capture::start(
            node,
            &filter,
            &self.dir.path().join("pods.pcap"),
        )
        .expect("tcpdump captures on the node's bridge")
    }

    /// Sends `signal` (`STOP`, `CONT`) to every process of the `caller`
    /// container of `app`'s pods: the shell loop stops making requests (one
    /// in flight completes) and goes on.
    pub fn signal_callers(&self, namespace: &str, app: &str, signal: &str) {
        let mut signalled = 0;
        for pod in self.pods_of(namespace, app) {
            if let Some(name) = pod["metadata"]["name"].as_str() {
                // The caller's loop is `sh -c 'while :; ... curl ...'`.
                signalled += self.signal_in_pod(namespace, name, signal, |cmdline| {
                    cmdline.contains("-c while :")
                });
            }
        }
        assert!(
            signalled > 0,
            "no caller loop of {namespace}/{app} to {signal}"
        );
    }

    /// Sends `signal` (`STOP`, `KILL`, ...) to each process in `pod`'s
    /// network namespace whose command line (arguments joined by spaces)
    /// `matches`; how many were signalled.
    pub fn signal_in_pod(
        &self,
        namespace: &str,
        pod: &str,
        signal: &str,
        matches: impl Fn(&str) -> bool,
    ) -> usize {
        let netns = self
            .kubelet
            .pod_netns(namespace, pod)
            .expect("the pod's network namespace");
        let pids = Command::new("ip")
            .args(["netns", "pids", &netns])
            .output()
            .expect("ip netns pids");
        let mut signalled = 0;
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if matches(&String::from_utf8_lossy(&cmdline).replace('\0', " ")) {
                let ok = Command::new("kill")
                    .args([&format!("-{signal}"), pid])
                    .status()
                    .is_ok_and(|s| s.success());
                signalled += usize::from(ok);
            }
        }
        signalled
    }
}

/// What the wire between `pods` carried in `segments`: the connections
/// opened during the capture, and what was not TLS. Each such connection's
/// first bytes both ways must be a TLS record, and no segment between them
/// (the connections already open included) may carry plaintext HTTP.
pub fn tls_only(
    segments: &[ballast_testkit::cluster::capture::Segment],
    pods: &[std::net::Ipv4Addr],
) -> (usize, Vec<String>) {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::SocketAddrV4;
    let between = |s: &&ballast_testkit::cluster::capture::Segment| {
        pods.contains(s.src.ip()) && pods.contains(s.dst.ip())
    };
    let opened: BTreeSet<(SocketAddrV4, SocketAddrV4)> = segments
        .iter()
        .filter(between)
        .filter(|s| s.opens)
        .map(|s| (s.src, s.dst))
        .collect();
    let mut first: BTreeMap<(SocketAddrV4, SocketAddrV4), &[u8]> = BTreeMap::new();
    let mut wrong = Vec::new();
    for s in segments
        .iter()
        .filter(between)
        .filter(|s| !s.payload.is_empty())
    {
        if opened.contains(&(s.src, s.dst)) || opened.contains(&(s.dst, s.src)) {
            first.entry((s.src, s.dst)).or_insert(&s.payload);
        }
        for marker in [&b"HTTP/1.1"[..], b"HTTP/1.0", b"PRI * HTTP/2.0"] {
            if s.payload.windows(marker.len()).any(|w| w == marker) {
                wrong.push(format!(
                    "{} -> {}: plaintext {:?}",
                    s.src,
                    s.dst,
                    String::from_utf8_lossy(marker)
                ));
            }
        }
    }
    for ((src, dst), payload) in &first {
        // A TLS record: handshake (22) or alert (21), version 3.x.
        let tls = payload.len() >= 3 && matches!(payload[0], 21 | 22) && payload[1] == 3;
        if !tls {
            let head: Vec<u8> = payload.iter().take(16).copied().collect();
            wrong.push(format!(
                "{src} -> {dst} opened with {head:02x?}, not a TLS record"
            ));
        }
    }
    wrong.sort();
    wrong.dedup();
    (opened.len(), wrong)
}
