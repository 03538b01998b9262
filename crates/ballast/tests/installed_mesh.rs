//! The installed whole, as a user gets it: `ballast install` output applied
//! unchanged to a cluster in a box (testkit: the API server emulation with
//! admission, Deployment/ReplicaSet/EndpointSlice controllers, and a kubelet
//! running every container as a process in its pod's network namespace), and
//! then `ballast check` against that API server, and an application meshed by
//! the webhook.
//!
//! Needs root, iproute2, iptables, util-linux and curl, as the transparent-mode
//! tests do: without them each test prints `SKIPPED: <why>` and passes, except
//! under `CI`, where it fails saying why. Run alone:
//! `cargo build -p ballast-sidecar && cargo test -p ballast --test installed_mesh`.

#[path = "installed/cluster.rs"]
mod cluster;

use cluster::{binaries, can_run, emojivoto, ClusterBox};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Test 1 of the installed whole: `ballast install`'s output, unchanged,
/// makes a control plane whose pods all become Ready, and `ballast check`
/// against that cluster passes every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_output_applied_unchanged_becomes_ready_and_check_passes() {
    if !can_run() {
        return;
    }
    let (ballast, _) = binaries();
    let cluster = ClusterBox::installed().await;
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

/// Test 2 of the installed whole: the webhook injects an application in an
/// annotated namespace, every pod becomes Ready, requests flow, and every
/// edge between workloads is mutual TLS (the proxies' own counters say so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_injected_by_the_webhook_talks_over_mutual_tls() {
    if !can_run() {
        return;
    }
    let cluster = ClusterBox::installed().await;
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
        for target in targets {
            let identity =
                format!("{target}.emojivoto.serviceaccount.identity.ballast.cluster.local");
            let (secured, open) = cluster.outbound_mtls_to("emojivoto", app, &identity).await;
            assert!(
                secured,
                "{app} -> {target} is not mutual TLS to {identity}:\n{open}"
            );
        }
    }

    // And `ballast viz` (installed, scraping every meshed pod) shows each
    // edge as mutual TLS, as `ballast edges` and the dashboard read it.
    let viz_ip: std::net::IpAddr = cluster
        .api
        .list("pods")
        .into_iter()
        .find(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == "ballast-viz")
        .and_then(|p| p["status"]["podIP"].as_str().and_then(|ip| ip.parse().ok()))
        .expect("a viz pod");
    let wanted = [("web", "emoji"), ("web", "voting"), ("vote-bot", "web")];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    loop {
        if let Ok((200, body)) = cluster
            .get(
                (viz_ip, 8084).into(),
                "/api/edges?kind=deployment&namespace=emojivoto",
            )
            .await
        {
            let edges: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let secured = |src: &str, dst: &str| {
                edges["edges"].as_array().into_iter().flatten().any(|e| {
                    e["src"]["name"] == src && e["dst"]["name"] == dst && e["mtls"] == true
                })
            };
            if wanted.iter().all(|(s, d)| secured(s, d)) {
                break;
            }
            last = body;
        }
        assert!(
            Instant::now() < deadline,
            "viz does not show every edge as mutual TLS: {last}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    let failed: usize = ["web", "vote-bot"]
        .iter()
        .map(|app| cluster::failures_after_first_success(&caller_log(app)))
        .sum();
    assert_eq!(
        failed,
        0,
        "web: {}\nvote-bot: {}",
        caller_log("web"),
        caller_log("vote-bot")
    );
}

/// Test 3 of the installed whole: `ballast upgrade` re-renders the installed
/// control plane (here with a new controller image) keeping its settings and
/// key material; applied, the controllers roll one replica at a time while
/// the meshed application keeps calling, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_rolls_the_control_plane_with_no_failed_request() {
    if !can_run() {
        return;
    }
    let (ballast, _) = binaries();
    let cluster = ClusterBox::installed().await;
    let anchors_before = cluster
        .api
        .get("configmaps", "ballast", "linkerd-identity-trust-roots");
    cluster.apply(&emojivoto()).await;
    cluster
        .wait_deployments_ready("emojivoto", Duration::from_secs(120))
        .await;
    let calls = |cluster: &ClusterBox| {
        let log = cluster.log_of("emojivoto", "vote-bot", "caller");
        (
            log.matches("ok http").count(),
            log.matches("fail http").count(),
        )
    };
    let upgrade = tokio::process::Command::new(&ballast)
        .args([
            "upgrade",
            "--controller-image",
            "ballast:v2",
            "--kubeconfig",
        ])
        .arg(cluster.kubeconfig())
        .output()
        .await
        .expect("ballast upgrade runs");
    assert!(upgrade.status.success(), "{upgrade:?}");
    let rendered = String::from_utf8_lossy(&upgrade.stdout).to_string();
    assert!(rendered.contains("image: ballast:v2"), "{rendered}");
    let before = calls(&cluster);
    cluster.apply_over(&rendered).await;
    let rolled = cluster
        .api
        .wait_until(Duration::from_secs(180), |api| {
            let deployments: Vec<Value> = api
                .list("deployments")
                .into_iter()
                .filter(|d| d["metadata"]["namespace"] == "ballast")
                .collect();
            let pods: Vec<Value> = api
                .list("pods")
                .into_iter()
                .filter(|p| p["metadata"]["namespace"] == "ballast")
                .collect();
            deployments.iter().all(|d| {
                let want = d["spec"]["replicas"].as_u64();
                d["status"]["updatedReplicas"].as_u64() == want
                    && d["status"]["readyReplicas"].as_u64() == want
                    && d["status"]["replicas"].as_u64() == want
            }) && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "ballast:v2")
        })
        .await;
    assert!(
        rolled,
        "the control plane rolled to ballast:v2\n{}",
        cluster.describe("ballast")
    );
    // Calls go on after the roll, over the same trust anchors.
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls(&cluster).0 < before.0 + 20 {
        assert!(Instant::now() < deadline, "calls stopped after the upgrade");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = calls(&cluster);
    eprintln!(
        "upgrade: {} calls during and after the roll, {} failed",
        after.0 - before.0 + after.1 - before.1,
        after.1 - before.1
    );
    assert_eq!(after.1, before.1, "calls failed during the upgrade");
    assert_eq!(
        cluster
            .api
            .get("configmaps", "ballast", "linkerd-identity-trust-roots")
            .map(|c| c["data"].clone()),
        anchors_before.map(|c| c["data"].clone()),
        "the trust anchors are kept"
    );
}
