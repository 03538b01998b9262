//! The installed whole, as a user gets it: `ballast install` output applied
//! unchanged to a cluster in a box (testkit: the API server emulation with
//! admission, Deployment/ReplicaSet/EndpointSlice controllers, and a kubelet
//! running every container as a process in its pod's network namespace), and
//! then `ballast check` against that API server.
//!
//! Needs root, iproute2, iptables and util-linux, as the transparent-mode
//! tests do: without them each test prints `SKIPPED: <why>` and passes, except
//! under `CI`, where it fails saying why. Run alone:
//! `cargo build -p ballast-sidecar && cargo test -p ballast --test installed_mesh`.

use std::{
    path::PathBuf,
    process::Command,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use ballast_testkit::{
    cluster::{controllers::Controllers, ImageSpec, Images, Kubelet, Node},
    ApiServer, ServiceRef,
};
use serde_json::Value;

/// Why this machine cannot run these tests, if it cannot.
fn missing_tools() -> Option<String> {
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
fn can_run() -> bool {
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
fn binaries() -> (PathBuf, PathBuf) {
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
fn images() -> Images {
    let (ballast, proxy) = binaries();
    Images::new()
        .with(
            "ballast:latest",
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
struct ClusterBox {
    api: Arc<ApiServer>,
    kubelet: Kubelet,
    _controllers: Controllers,
    dir: tempfile::TempDir,
    started: Instant,
}

impl ClusterBox {
    async fn start() -> ClusterBox {
        let started = Instant::now();
        let api = Arc::new(ApiServer::start().await);
        let node = Arc::new(Node::start("node-1", api.addr()).expect("the node starts"));
        // Webhooks are called at their Service's cluster IP, from the node, as
        // the API server of a cluster reaches them.
        let weak: Weak<ApiServer> = Arc::downgrade(&api);
        let dial_node = node.clone();
        api.set_service_dialer(move |svc: ServiceRef| {
            let api = weak.clone();
            let node = dial_node.clone();
            async move {
                let ip = api
                    .upgrade()
                    .and_then(|api| api.get("services", &svc.namespace, &svc.name))
                    .and_then(|s| s["spec"]["clusterIP"].as_str().map(String::from))
                    .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                    .ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            format!("no cluster IP for {}/{}", svc.namespace, svc.name),
                        )
                    })?;
                node.dial((ip, svc.port).into()).await
            }
        });
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
    async fn apply(&self, yaml: &str) {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("manifests parse");
        for doc in docs.into_iter().filter(Value::is_object) {
            let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
            if let Err(e) = self.api.create(doc).await {
                panic!("applying {what}: {e:?}");
            }
        }
    }

    /// `GET http://ADDR/PATH` from inside the node: (status, body).
    async fn get(&self, addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
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

    /// The pods of `namespace` labelled `app=APP`.
    fn pods_of(&self, namespace: &str, app: &str) -> Vec<Value> {
        self.api
            .list("pods")
            .into_iter()
            .filter(|p| {
                p["metadata"]["namespace"] == namespace && p["metadata"]["labels"]["app"] == app
            })
            .collect()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.api.write_kubeconfig(self.dir.path())
    }

    /// Every pod of `namespace` with its status and its containers' logs.
    fn describe(&self, namespace: &str) -> String {
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
    async fn wait_deployments_ready(&self, namespace: &str, within: Duration) {
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

/// Test 1 of the installed whole: `ballast install`'s output, unchanged,
/// makes a control plane whose pods all become Ready, and `ballast check`
/// against that cluster passes every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_output_applied_unchanged_becomes_ready_and_check_passes() {
    if !can_run() {
        return;
    }
    let (ballast, _) = binaries();
    let cluster = ClusterBox::start().await;
    let install = Command::new(&ballast)
        .arg("install")
        .output()
        .expect("ballast install runs");
    assert!(install.status.success(), "{install:?}");
    cluster
        .apply(&String::from_utf8_lossy(&install.stdout))
        .await;
    cluster
        .wait_deployments_ready("ballast", Duration::from_secs(120))
        .await;
    eprintln!(
        "control plane ready {:.1}s after the cluster started",
        cluster.started.elapsed().as_secs_f64()
    );
    if std::env::var_os("BALLAST_BOX_DESCRIBE").is_some() {
        eprintln!("{}", cluster.describe("ballast"));
    }

    let kubeconfig = cluster.kubeconfig();
    let check = tokio::process::Command::new(&ballast)
        .args(["check", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["-o", "json"])
        .output()
        .await
        .expect("ballast check runs");
    let report: Value = serde_json::from_slice(&check.stdout).unwrap_or_else(|e| {
        panic!(
            "check printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        )
    });
    let not_ok: Vec<&Value> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["status"] != "ok")
        .collect();
    assert!(
        not_ok.is_empty() && check.status.success(),
        "every check passes on the installed control plane: {not_ok:#?}\n{}",
        cluster.describe("ballast")
    );
}

/// An application shaped like Linkerd's emojivoto, in a namespace annotated
/// `linkerd.io/inject: enabled`: `web` calls `emoji` and `voting`, and
/// `vote-bot` calls `web`. Every Deployment is created as a user writes it;
/// the pods are injected by the webhook.
fn emojivoto() -> String {
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
    // A caller: a loop of curl through the pod's proxy, one line per request.
    let caller = |targets: &[&str]| {
        let urls: Vec<String> = targets
            .iter()
            .map(|t| format!("http://{t}.emojivoto.svc.cluster.local/"))
            .collect();
        format!(
            "      - name: caller\n        image: tools:latest\n        command: [sh, -c]\n\
             \x20       args:\n          - 'while :; do for u in {}; do if curl -sf -m 5 -o /dev/null $u; then echo ok $u; else echo fail $u; fi; done; sleep 0.2; done'\n",
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

/// Test 2 of the installed whole: the webhook injects an application in an
/// annotated namespace, every pod becomes Ready, requests flow, and every
/// edge between workloads is mutual TLS (the proxies' own counters say so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_injected_by_the_webhook_talks_over_mutual_tls() {
    if !can_run() {
        return;
    }
    let (ballast, _) = binaries();
    let cluster = ClusterBox::start().await;
    let install = Command::new(&ballast)
        .arg("install")
        .output()
        .expect("ballast install runs");
    assert!(install.status.success(), "{install:?}");
    cluster
        .apply(&String::from_utf8_lossy(&install.stdout))
        .await;
    cluster
        .wait_deployments_ready("ballast", Duration::from_secs(120))
        .await;
    let app_started = Instant::now();
    cluster.apply(&emojivoto()).await;
    cluster
        .wait_deployments_ready("emojivoto", Duration::from_secs(120))
        .await;
    eprintln!(
        "application ready {:.1}s after it was applied",
        app_started.elapsed().as_secs_f64()
    );
    // The webhook injected every pod.
    for app in ["web", "emoji", "voting", "vote-bot"] {
        for pod in cluster.pods_of("emojivoto", app) {
            let names: Vec<&str> = pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            assert!(names.contains(&"linkerd-proxy"), "{app}: {names:?}");
            assert_eq!(
                pod["metadata"]["labels"]["linkerd.io/control-plane-ns"],
                "ballast"
            );
        }
    }
    assert!(
        cluster
            .api
            .admission_calls()
            .iter()
            .any(|c| c.resource == "pods"),
        "the API server called the webhook"
    );

    // Requests flow: each caller's log says ok, over and over.
    let caller_log = |app: &str| {
        cluster
            .pods_of("emojivoto", app)
            .first()
            .and_then(|p| p["metadata"]["name"].as_str().map(String::from))
            .map(|pod| cluster.kubelet.logs("emojivoto", &pod, "caller"))
            .unwrap_or_default()
    };
    let flowing = cluster
        .api
        .wait_until(Duration::from_secs(60), |_| {
            ["web", "vote-bot"]
                .iter()
                .all(|app| caller_log(app).matches("ok ").count() >= 20)
        })
        .await;
    assert!(
        flowing,
        "requests did not flow: web: {}\nvote-bot: {}\n{}",
        caller_log("web"),
        caller_log("vote-bot"),
        cluster.describe("emojivoto")
    );

    // Every edge is mutual TLS, by the callers' proxies' own counters.
    for (app, targets) in [("web", vec!["emoji", "voting"]), ("vote-bot", vec!["web"])] {
        let pod = cluster.pods_of("emojivoto", app).remove(0);
        let ip: std::net::IpAddr = pod["status"]["podIP"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
            .expect("a pod IP");
        let (status, metrics) = cluster
            .get((ip, 4191).into(), "/metrics")
            .await
            .expect("the proxy's /metrics");
        assert_eq!(status, 200);
        for target in targets {
            let identity =
                format!("{target}.emojivoto.serviceaccount.identity.ballast.cluster.local");
            let secured = metrics.lines().any(|l| {
                l.starts_with("tcp_open_total{")
                    && l.contains("direction=\"outbound\"")
                    && l.contains("tls=\"true\"")
                    && l.contains(&format!("server_id=\"{identity}\""))
            });
            assert!(
                secured,
                "{app} -> {target} is not mutual TLS to {identity}:\n{}",
                metrics
                    .lines()
                    .filter(|l| l.starts_with("tcp_open_total"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    let failed: usize = ["web", "vote-bot"]
        .iter()
        .map(|app| caller_log(app).matches("fail ").count())
        .sum();
    assert_eq!(
        failed,
        0,
        "web: {}\nvote-bot: {}",
        caller_log("web"),
        caller_log("vote-bot")
    );
}
