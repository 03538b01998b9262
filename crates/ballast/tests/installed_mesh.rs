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

use ballast_testsupport::metrics::Metrics;
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

    // Each controller with a memory budget runs in its Deployment's memory
    // limit (the box's kubelet applies it as a cgroup, as a node does) and
    // takes its default share of it, as it does in a cluster.
    for (name, port) in [
        ("ballast-destination", 9996),
        ("ballast-identity", 9990),
        ("ballast-viz", 9994),
    ] {
        budget_follows_the_limit(&cluster, name, port).await;
    }
}

/// Every pod of the controller `name` reports a memory budget of 75% of
/// its Deployment's memory limit on its admin `port`.
async fn budget_follows_the_limit(cluster: &ClusterBox, name: &str, port: u16) {
    let deployment = cluster
        .api
        .get("deployments", "ballast", name)
        .unwrap_or_else(|| panic!("the Deployment {name}"));
    let limit =
        &deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"];
    let mebibytes: u64 = limit
        .as_str()
        .and_then(|l| l.strip_suffix("Mi"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}'s memory limit in Mi: {limit}"));
    let want = (mebibytes << 20) * 3 / 4;
    let values = cluster
        .control_plane_metric(name, port, "memory_limit_bytes")
        .await;
    assert!(!values.is_empty(), "no pod of {name}");
    for (pod, value) in values {
        assert_eq!(
            value,
            Some(want as f64),
            "{pod}: memory_limit_bytes is 75% of {name}'s {limit} limit"
        );
    }
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
    // The wire between the application's pods, from before it starts.
    let capture = cluster.capture_between_pods();
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

    // The wire between the pods carried TLS only: every connection opened
    // between them started with a TLS handshake both ways, and no packet
    // between them carried plaintext HTTP.
    let segments = capture.stop().expect("the capture is read back");
    let app_ips: Vec<std::net::Ipv4Addr> = cluster
        .api
        .list("pods")
        .into_iter()
        .filter(|p| p["metadata"]["namespace"] == "emojivoto")
        .filter_map(|p| p["status"]["podIP"].as_str()?.parse().ok())
        .collect();
    let (opened, wrong) = cluster::tls_only(&segments, &app_ips);
    eprintln!(
        "the wire between the application's pods: {} segments, {opened} connections opened, all TLS",
        segments.len()
    );
    assert!(
        opened >= 3 && wrong.is_empty(),
        "{opened} connections opened between {app_ips:?} (want the 3 edges at least); not TLS: {wrong:#?}"
    );

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

    // `ballast viz dashboard` opens it locally, through the API server.
    dashboard_through_the_api_server(&cluster).await;

    // `ballast stat` agrees with the proxies' own counters.
    stat_agrees_with_the_proxies(&cluster, viz_ip).await;

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
            // Sized for a bigger mesh on the way: kept by the next upgrade.
            "--destination-memory-limit",
            "384Mi",
            "--destination-max-streams",
            "30000",
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
    // The destination controller runs (and is ready) with its new size, and
    // an upgrade without the flags reads it back and keeps it.
    let destination = cluster
        .api
        .get("deployments", "ballast", "ballast-destination")
        .expect("the destination Deployment");
    let container = &destination["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["resources"]["limits"]["memory"], "384Mi",
        "{container}"
    );
    let args = container["args"].to_string();
    assert!(args.contains("--max-streams=30000"), "{args}");
    assert!(args.contains("--max-policy-streams=30000"), "{args}");
    budget_follows_the_limit(&cluster, "ballast-destination", 9996).await;
    let again = tokio::process::Command::new(&ballast)
        .args(["upgrade", "--kubeconfig"])
        .arg(cluster.kubeconfig())
        .output()
        .await
        .expect("ballast upgrade runs");
    assert!(again.status.success(), "{again:?}");
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(again.contains("--max-streams=30000"), "{again}");
    assert!(again.contains("memory: 384Mi"), "{again}");
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

/// The workloads `ballast stat` is compared on, and their callers.
const SERVED: &[&str] = &["web", "emoji", "voting"];
const CALLERS: &[&str] = &["web", "vote-bot"];

/// Requests the inbound side of `app`'s proxy answered (its `response_total`
/// series with `direction="inbound"`), summed over its pods.
async fn inbound_responses(cluster: &ClusterBox, app: &str) -> u64 {
    let mut total = 0.0;
    for pod in cluster.pods_of("emojivoto", app) {
        let Some(ip) = pod["status"]["podIP"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
        else {
            continue;
        };
        let ip: std::net::IpAddr = ip;
        let (code, page) = cluster
            .get((ip, 4191).into(), "/metrics")
            .await
            .expect("the proxy's /metrics");
        assert_eq!(code, 200, "{page}");
        total += Metrics::parse(&page).sum("response_total", &[("direction", "inbound")]);
    }
    total as u64
}

/// Each of [`SERVED`]'s inbound counts once they stop changing (the callers
/// are stopped; a request in flight finishes).
async fn settled_counts(cluster: &ClusterBox) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Vec::new();
    loop {
        let mut now = Vec::new();
        for app in SERVED {
            now.push(inbound_responses(cluster, app).await);
        }
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the counters never settled: {now:?}"
        );
        last = now;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The end times (Unix seconds) of viz's history points, and its interval.
async fn viz_points(cluster: &ClusterBox, viz: std::net::IpAddr) -> (Vec<u64>, u64) {
    let path = "/api/stat?kind=deployment&namespace=emojivoto&name=web";
    let (code, body) = cluster
        .get((viz, 8084).into(), path)
        .await
        .expect("viz answers");
    assert_eq!(code, 200, "{body}");
    let stat: Value = serde_json::from_str(&body).expect("stat JSON");
    let points = stat["rows"][0]["spark"]["t"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect();
    (points, stat["interval_secs"].as_u64().unwrap_or(10))
}

/// Waits until viz has at least `n` history points ending after `after`;
/// returns them.
async fn wait_viz_points(
    cluster: &ClusterBox,
    viz: std::net::IpAddr,
    after: u64,
    n: usize,
) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (points, _) = viz_points(cluster, viz).await;
        let newer: Vec<u64> = points.into_iter().filter(|t| *t > after).collect();
        if newer.len() >= n {
            return newer;
        }
        assert!(
            Instant::now() < deadline,
            "viz made no new history points after {after}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `ballast stat deploy -n emojivoto` counts exactly the requests the
/// proxies counted. Traffic is made to start and stop between viz's scrapes:
/// the callers are stopped until viz has a whole quiet cycle, let go for a
/// few requests, stopped again until viz has scraped the end; a window from
/// that quiet cycle on then holds exactly the difference of the counters.
async fn stat_agrees_with_the_proxies(cluster: &ClusterBox, viz: std::net::IpAddr) {
    for app in CALLERS {
        cluster.signal_callers("emojivoto", app, "STOP");
    }
    let before = settled_counts(cluster).await;
    let quiet_from = unix_now();
    // The first point after the stop may still hold requests from before it;
    // the cycle ending at the second one is quiet.
    let quiet = wait_viz_points(cluster, viz, quiet_from, 2).await;
    for app in CALLERS {
        cluster.signal_callers("emojivoto", app, "CONT");
    }
    let from = cluster
        .log_of("emojivoto", "vote-bot", "caller")
        .lines()
        .count();
    let more = cluster
        .wait_for_log(
            "emojivoto",
            "vote-bot",
            "caller",
            Duration::from_secs(60),
            |log| log.lines().count() >= from + 10,
        )
        .await;
    assert!(more, "vote-bot made no requests after it was let go");
    for app in CALLERS {
        cluster.signal_callers("emojivoto", app, "STOP");
    }
    let after = settled_counts(cluster).await;
    let settled_at = unix_now();
    wait_viz_points(cluster, viz, settled_at, 1).await;
    let (points, interval) = viz_points(cluster, viz).await;
    let cycles = points.iter().filter(|t| **t > quiet[0]).count() as u64;

    let (ballast, _) = cluster::binaries();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", cluster.kubelet.node().netns()])
        .arg(&ballast)
        .args(["stat", "deploy", "-n", "emojivoto", "-o", "json"])
        .arg(format!("--time-window={}s", cycles * interval))
        .arg(format!("--viz-addr={viz}:8084"))
        .output()
        .expect("ballast stat runs");
    assert!(out.status.success(), "{out:?}");
    let stat: Value = serde_json::from_slice(&out.stdout).expect("stat -o json");
    for (i, app) in SERVED.iter().enumerate() {
        let row = stat["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["resource"]["name"] == *app)
            .unwrap_or_else(|| panic!("no stat row for {app}: {stat}"));
        let counted = after[i] - before[i];
        eprintln!(
            "ballast stat deploy/{app}: {} requests over {}s; its proxies counted {counted}",
            row["golden"]["requests"],
            cycles * interval
        );
        assert!(counted > 0, "{app} served nothing while the callers ran");
        assert_eq!(
            (row["source"].as_str(), row["golden"]["requests"].as_u64()),
            (Some("inbound"), Some(counted)),
            "ballast stat and the proxies disagree on {app}: {row}"
        );
        assert_eq!(row["golden"]["successes"].as_u64(), Some(counted), "{row}");
    }
    for app in CALLERS {
        cluster.signal_callers("emojivoto", app, "CONT");
    }
}

/// `ballast viz dashboard --show url` on the user's machine (here: outside
/// the cluster's network, with the kubeconfig) serves the installed
/// dashboard and its API on a local port, and stops on SIGTERM.
async fn dashboard_through_the_api_server(cluster: &ClusterBox) {
    use std::io::BufRead;
    let (ballast, _) = binaries();
    let mut child = std::process::Command::new(&ballast)
        .args([
            "viz",
            "dashboard",
            "--show",
            "url",
            "--port",
            "0",
            "--wait",
            "60s",
        ])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("ballast viz dashboard starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let url = loop {
        match rx.recv_timeout(Duration::from_secs(90)) {
            Ok(line) if line.starts_with("http://") => break line,
            Ok(_) => continue,
            Err(e) => {
                let _ = child.kill();
                panic!("ballast viz dashboard printed no URL: {e}");
            }
        }
    };
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the URL names a local address");
    let get = |path: &'static str| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header("host", addr.to_string())
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .expect("request");
        let rsp = send.send_request(req).await.expect("an answer");
        let status = rsp.status().as_u16();
        let csp = rsp
            .headers()
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        use http_body_util::BodyExt;
        let body = rsp.into_body().collect().await.expect("a body").to_bytes();
        (status, csp, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, csp, page) = get("/").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<html") || page.contains("<!doctype"),
        "{page}"
    );
    assert_eq!(csp.as_deref(), Some("default-src 'self'"));
    let (status, _, overview) = get("/api/overview").await;
    assert_eq!(status, 200, "{overview}");
    let overview: Value = serde_json::from_str(&overview).expect("overview JSON");
    assert!(
        overview["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["resource"]["name"] == "emojivoto" && n["meshed_pods"].as_u64() >= Some(4)),
        "the dashboard's overview shows the meshed application: {overview}"
    );
    let (status, _, _) = get("/api/no-such-thing").await;
    assert_eq!(status, 404);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ballast viz dashboard did not stop on SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    eprintln!("ballast viz dashboard served {url} through the API server");
}
