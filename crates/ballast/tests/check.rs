//! `ballast check` as a process against the testkit API server: a healthy
//! control plane made of deploy/'s own manifests (plus its pods, a PKI made
//! here, and a meshed workload) passes; then each fault is planted in turn
//! and named by the JSON findings and the exit status. Also: a manifests
//! directory, an unreachable cluster, and a usage error.

use ballast_testkit::ApiServer;
use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};
use std::{
    path::{Path, PathBuf},
    process::Output,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio::process::Command;

const DAY: u64 = 86_400;
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every object in deploy/*.yaml and deploy/crds/*.yaml.
fn deploy_objects() -> Vec<Value> {
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in [deploy_dir(), deploy_dir().join("crds")] {
        for entry in std::fs::read_dir(&dir).expect("deploy/ readable") {
            let path = entry.expect("entry").path();
            if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            serde_saphyr::from_multiple::<Value>(&text).expect("deploy/ parses")
        })
        .filter(|v| v.is_object())
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A CA certificate valid from a day ago for `days`, self-signed or signed by `by`.
fn ca(
    cn: &str,
    days: u64,
    by: Option<&(CertificateParams, KeyPair)>,
) -> (String, (CertificateParams, KeyPair)) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(now_secs() - DAY);
    params.not_after = epoch + Duration::from_secs(now_secs() + days * DAY);
    let key = KeyPair::generate().expect("key");
    let cert = match by {
        None => params.self_signed(&key),
        Some((p, k)) => params.signed_by(&key, &Issuer::from_params(p, k)),
    }
    .expect("certificate");
    (cert.pem(), (params, key))
}

fn trust_roots(pem: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "linkerd-identity-trust-roots", "namespace": "ballast"},
           "data": {"ca-bundle.crt": pem}})
}

fn issuer_secret(pem: &str) -> Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
           "metadata": {"name": "linkerd-identity-issuer", "namespace": "ballast"},
           "data": {"tls.crt": b64(pem), "tls.key": b64("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")}})
}

/// A running, ready pod of a Deployment, from its template, at 10.9.0.`n`.
fn pod_of(deployment: &Value, n: usize) -> Value {
    let template = &deployment["spec"]["template"];
    let name = deployment["metadata"]["name"].as_str().expect("name");
    let containers: Vec<Value> = template["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| json!({"name": c["name"], "ready": true, "restartCount": 0}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-{}", n % 2 + 1), "namespace": deployment["metadata"]["namespace"],
                     "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
        "status": {"phase": "Running", "podIP": format!("10.9.0.{n}"),
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": containers}
    })
}

/// A meshed pod as `ballast inject` renders it for deploy/'s control plane.
fn web_pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop",
                     "labels": {"app": "web", "linkerd.io/control-plane-ns": "ballast"},
                     "annotations": {"linkerd.io/proxy-version": VERSION}},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "linkerd-init", "image": "ballast-init:latest",
                "args": ["init", "--incoming-proxy-port=4143", "--outgoing-proxy-port=4140", "--proxy-uid=2102"]}],
            "containers": [
                {"name": "web", "image": "nginx", "ports": [{"name": "http", "containerPort": 8080}]},
                {"name": "linkerd-proxy", "image": "ballast-proxy:latest",
                 "args": ["--destination-addr=ballast-dst-headless.ballast.svc.cluster.local:8086",
                          "--outbound-addr=127.0.0.1:4140", "--inbound-addr=0.0.0.0:4143", "--admin-addr=0.0.0.0:4191",
                          "--identity-addr=ballast-identity-headless.ballast.svc.cluster.local:8080",
                          "--identity-controller-namespace=ballast", "--identity-trust-domain=cluster.local",
                          "--identity-server-name=linkerd-identity.ballast.serviceaccount.identity.ballast.cluster.local",
                          "--destination-server-name=ballast-destination.ballast.serviceaccount.identity.ballast.cluster.local"],
                 "securityContext": {"runAsUser": 2102},
                 "ports": [{"name": "linkerd-admin", "containerPort": 4191}]}
            ]
        },
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "web", "ready": true}, {"name": "linkerd-proxy", "ready": true}]}
    })
}

fn web_service(name: &str, app: &str, target: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "shop"},
           "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": target}]}})
}

/// deploy/'s objects that testkit serves, a ready pod per Deployment, a
/// PKI, and a meshed workload.
fn healthy() -> Vec<Value> {
    let mut objects = Vec::new();
    let mut pods = 0;
    for obj in deploy_objects() {
        if obj["kind"] == "Deployment" {
            for _ in 0..2 {
                pods += 1;
                objects.push(pod_of(&obj, pods));
            }
        }
        objects.push(obj);
    }
    let (anchor_pem, anchor) = ca("root.linkerd.cluster.local", 3650, None);
    let (issuer_pem, _) = ca("identity.linkerd.cluster.local", 365, Some(&anchor));
    objects.push(trust_roots(&anchor_pem));
    objects.push(issuer_secret(&issuer_pem));
    objects.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
    objects.push(web_pod("web-1", "10.0.0.7"));
    objects.push(web_pod("web-2", "10.0.0.8"));
    objects.push(web_service("web", "web", json!("http")));
    objects
}

fn plant(api: &ApiServer, objects: &[Value]) {
    for obj in objects {
        // deploy/ may hold kinds testkit does not serve (disruption budgets,
        // webhook configurations): the checks do not read those.
        if let Err(e) = api.try_apply(obj.clone()) {
            assert!(e.contains("is not served"), "{e}");
        }
    }
}

async fn ballast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("check")
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("ballast runs")
}

/// `ballast check -o json` against the kubeconfig: exit code and report.
async fn check_json(kubeconfig: &Path) -> (Option<i32>, Value) {
    let out = ballast(&[
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "-o",
        "json",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"))
}

/// Every `kind namespace/name` the check's findings name.
fn named(check: &Value) -> Vec<String> {
    check["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .flat_map(|f| f["objects"].as_array().cloned().unwrap_or_default())
        .map(|o| match o["namespace"].as_str() {
            Some(ns) => format!(
                "{} {ns}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["name"].as_str().unwrap_or("?")
            ),
            None => format!(
                "{} {}",
                o["kind"].as_str().unwrap_or("?"),
                o["name"].as_str().unwrap_or("?")
            ),
        })
        .collect()
}

fn statuses(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["status"] != "ok")
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// One planted fault: objects to apply and objects to delete, the check
/// that must name it, its status, the objects it must name, and the exit
/// code. Undone by deleting what was applied and applying the healthy
/// objects again.
struct Fault {
    what: &'static str,
    plant: Vec<Value>,
    remove: Vec<(&'static str, &'static str, &'static str, &'static str)>,
    check: &'static str,
    status: &'static str,
    names: Vec<&'static str>,
    exit: i32,
}

#[tokio::test]
async fn a_healthy_cluster_passes_and_each_planted_fault_is_named() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let base = healthy();
    plant(&api, &base);

    let (code, report) = check_json(&kubeconfig).await;
    assert_eq!(
        statuses(&report),
        Vec::<(String, String)>::new(),
        "{report:#}"
    );
    assert_eq!(code, Some(0));
    assert_eq!(report["summary"]["fail"], 0);
    assert_eq!(report["source"], "cluster");
    // The issuer's private key is never read into the report.
    assert!(!report.to_string().contains("secret\\n"));

    let mut terminating = web_pod("queues-work", "10.0.0.7");
    terminating["metadata"]["deletionTimestamp"] = json!("2021-03-16T07:36:12Z");
    let host_pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "kube-system"},
               "spec": {"hostNetwork": true, "nodeName": "node-7",
                        "containers": [{"name": "exporter", "ports": [{"containerPort": 9100}]}]},
               "status": {"phase": "Running", "podIP": "192.168.0.7"}})
    };
    let mut unready = web_pod("web-2", "10.0.0.8");
    unready["status"]["containerStatuses"][1] = json!({"name": "linkerd-proxy", "ready": false, "restartCount": 4,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}}});
    let (anchor_pem, anchor) = ca("root", 3650, None);
    let (soon_pem, _) = ca("issuer", 10, Some(&anchor));

    // deploy/'s destination controller, with its namespace or its TLS changed.
    let destination = base
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "ballast-destination")
        .expect("deploy/ has the destination controller")
        .clone();
    let with_args = |f: &dyn Fn(&str) -> Option<String>| {
        let mut d = destination.clone();
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array_mut()
            .expect("args");
        *args = args
            .iter()
            .filter_map(|a| f(a.as_str().unwrap_or("")))
            .map(Value::from)
            .collect();
        d
    };
    let elsewhere = with_args(&|a| {
        Some(match a {
            "--controller-namespace=ballast" => "--controller-namespace=nowhere".into(),
            a => a.into(),
        })
    });
    let plaintext = with_args(&|a| (!a.starts_with("--identity-trust-anchors")).then(|| a.into()));
    let mut relabelled = web_pod("web-1", "10.0.0.7");
    relabelled["metadata"]["labels"]["linkerd.io/control-plane-ns"] = json!("linkerd");

    let faults = vec![
        Fault {
            what: "the destination controller watching for another control plane namespace",
            plant: vec![elsewhere],
            remove: vec![],
            check: "control plane and proxies agree",
            status: "fail",
            // Its identity names that namespace too: no proxy verifies it.
            names: vec![
                "Deployment ballast/ballast-destination",
                "Pod shop/web-1",
                "Pod shop/web-2",
            ],
            exit: 1,
        },
        Fault {
            what: "the destination controller serving plaintext to proxies dialling TLS",
            plant: vec![plaintext],
            remove: vec![],
            check: "control plane and proxies agree",
            status: "fail",
            names: vec!["Deployment ballast/ballast-destination"],
            exit: 1,
        },
        Fault {
            what: "a meshed pod labelled for another control plane",
            plant: vec![relabelled],
            remove: vec![],
            check: "control plane and proxies agree",
            status: "fail",
            names: vec!["Pod shop/web-1"],
            exit: 1,
        },
        Fault {
            what: "two live pods share an IP",
            plant: vec![terminating],
            remove: vec![],
            check: "no two live pods share an IP",
            status: "fail",
            names: vec!["Pod shop/queues-work", "Pod shop/web-1"],
            exit: 1,
        },
        Fault {
            what: "hostNetwork pods declare one port on one node",
            plant: vec![host_pod("exporter-a"), host_pod("exporter-b")],
            remove: vec![],
            check: "no two hostNetwork pods",
            status: "fail",
            names: vec![
                "Pod kube-system/exporter-a",
                "Pod kube-system/exporter-b",
                "Node node-7",
            ],
            exit: 1,
        },
        Fault {
            what: "a Service selecting no pod",
            plant: vec![web_service("ghost", "nobody", json!(80))],
            remove: vec![],
            check: "every Service selector matches a pod",
            status: "warn",
            names: vec!["Service shop/ghost"],
            exit: 0,
        },
        Fault {
            what: "a meshed pod's proxy not ready",
            plant: vec![unready],
            remove: vec![],
            check: "meshed pods have a ready proxy",
            status: "fail",
            names: vec!["Pod shop/web-2"],
            exit: 1,
        },
        Fault {
            what: "a Service targeting the proxy's inbound listener",
            plant: vec![web_service("web-direct", "web", json!(4143))],
            remove: vec![],
            check: "no proxy sends traffic to its own listeners",
            status: "fail",
            names: vec![
                "Service shop/web-direct",
                "Pod shop/web-1",
                "Service shop/web-direct",
                "Pod shop/web-2",
            ],
            exit: 1,
        },
        Fault {
            what: "an issuer expiring in 10 days",
            plant: vec![trust_roots(&anchor_pem), issuer_secret(&soon_pem)],
            remove: vec![],
            check: "issuer certificate is valid",
            status: "warn",
            names: vec!["Secret ballast/linkerd-identity-issuer"],
            exit: 0,
        },
        Fault {
            what: "the identity controller's ClusterRoleBinding missing",
            plant: vec![],
            remove: vec![(
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                "",
                "ballast-identity",
            )],
            check: "controllers' RBAC grants what they need",
            status: "fail",
            names: vec![
                "ServiceAccount ballast/linkerd-identity",
                "Deployment ballast/ballast-identity",
            ],
            exit: 1,
        },
        Fault {
            what: "the Server CRD missing",
            plant: vec![],
            remove: vec![(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                "",
                "servers.policy.linkerd.io",
            )],
            check: "policy CRDs are installed",
            status: "warn",
            names: vec!["CustomResourceDefinition servers.policy.linkerd.io"],
            exit: 0,
        },
    ];

    for fault in faults {
        plant(&api, &fault.plant);
        for (api_version, kind, ns, name) in &fault.remove {
            api.delete(api_version, kind, ns, name);
        }
        let (code, report) = check_json(&kubeconfig).await;
        let c = check(&report, fault.check);
        assert_eq!(c["status"], fault.status, "{}: {c:#}", fault.what);
        assert_eq!(named(c), fault.names, "{}: {c:#}", fault.what);
        assert_eq!(
            statuses(&report).len(),
            1,
            "{}: only its check is not ok: {:?}",
            fault.what,
            statuses(&report)
        );
        assert_eq!(code, Some(fault.exit), "{}", fault.what);
        // Undo: the healthy objects again, planted ones deleted.
        for obj in &fault.plant {
            let kind = obj["kind"].as_str().unwrap_or("");
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
            let name = obj["metadata"]["name"].as_str().unwrap_or("");
            api.delete(obj["apiVersion"].as_str().unwrap_or(""), kind, ns, name);
        }
        plant(&api, &base);
        let (code, report) = check_json(&kubeconfig).await;
        assert_eq!(
            (code, statuses(&report)),
            (Some(0), vec![]),
            "after undoing {}",
            fault.what
        );
    }
}

#[tokio::test]
async fn human_output_has_a_line_per_check_and_a_summary() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let mut objects = healthy();
    objects.push(web_service("ghost", "nobody", json!(80)));
    plant(&api, &objects);
    let out = ballast(&["--kubeconfig", kubeconfig.to_str().expect("utf-8")]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "‼ every Service selector matches a pod\n    service shop/ghost selects no pod"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("√ no two live pods share an IP\n"),
        "{stdout}"
    );
    assert!(
        stdout
            .trim_end()
            .ends_with("15 checks: 14 ok, 1 warning, 0 failures"),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\u{1b}'),
        "no colour codes when not a terminal"
    );
}

#[tokio::test]
async fn a_manifests_directory_is_checked_without_a_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(deploy_dir()).expect("deploy/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
            std::fs::copy(&path, dir.path().join(path.file_name().expect("name"))).expect("copy");
        }
    }
    std::fs::create_dir(dir.path().join("crds")).expect("mkdir");
    for entry in std::fs::read_dir(deploy_dir().join("crds")).expect("crds") {
        let path = entry.expect("entry").path();
        std::fs::copy(
            &path,
            dir.path()
                .join("crds")
                .join(path.file_name().expect("name")),
        )
        .expect("copy");
    }
    // A workload whose init container sends outbound traffic to the
    // proxy's inbound listener.
    let pod = web_pod("tpl", "10.0.0.1");
    let mut spec = pod["spec"].clone();
    spec["initContainers"][0]["args"] = json!(["init", "--outgoing-proxy-port=4143"]);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"}}, "spec": spec}}});
    std::fs::write(dir.path().join("app.json"), deployment.to_string()).expect("write");
    let out = ballast(&[
        "--manifests",
        dir.path().to_str().expect("utf-8"),
        "-o",
        "json",
    ])
    .await;
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["source"], "manifests");
    assert_eq!(out.status.code(), Some(1));
    let loops = check(&report, "no proxy sends traffic to its own listeners");
    assert_eq!(loops["status"], "fail");
    assert_eq!(named(loops), ["Deployment shop/api"]);
    assert_eq!(check(&report, "clock is in sync")["status"], "skipped");
    // No pods in a directory: readiness is a warning, not a failure.
    assert_eq!(
        check(&report, "control plane pods are ready")["status"],
        "warn"
    );
    assert_eq!(
        check(&report, "controllers' RBAC")["status"],
        "ok",
        "deploy/'s RBAC suffices"
    );
    assert_eq!(
        check(&report, "policy CRDs")["status"],
        "ok",
        "deploy/crds has every CRD watched"
    );
}

#[tokio::test]
async fn an_unreachable_cluster_is_one_clear_line_and_bad_flags_are_exit_2() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    drop(api);
    let out = ballast(&[
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "--timeout",
        "5s",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot reach the Kubernetes API server at http://127.0.0.1:"),
        "{stderr}"
    );

    let out = ballast(&["--kubeconfig", "/nonexistent/kubeconfig"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("/nonexistent/kubeconfig").count(),
        1,
        "the path once: {stderr}"
    );

    for bad in [
        vec!["--kubeconfig", "k", "--manifests", "d"],
        vec!["--namespace", "Not/A/Name"],
        vec!["-o", "yaml"],
        vec!["--expiry-warning", "soon"],
    ] {
        let out = ballast(&bad).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
