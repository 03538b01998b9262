//! A proxy restarted while every destination controller is away starts from
//! its snapshot (the file in the `emptyDir` injection gives it, which
//! outlives the proxy's container): web's restarted proxy still calls emoji
//! and voting over mutual TLS, and emoji's restarted proxy still denies the
//! caller its inbound policy denied (without the snapshot, that port would
//! fall to the default policy, which admits it). Once the controller is
//! back, its answers replace the snapshot's.
//!
//! Needs root, iproute2, iptables, util-linux and curl; see installed_mesh.rs.
//! Run alone: `cargo build -p ballast-sidecar && cargo test -p ballast --test
//! installed_snapshot -- --nocapture` (it prints each step's figures).

#[path = "installed/cluster.rs"]
mod cluster;

use ballast_inject::pod::{PROXY_CONTAINER, SNAPSHOT_VOLUME};
use ballast_testsupport::metrics::Metrics;
use cluster::{caller_objects, can_run, emojivoto, ClusterBox};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NS: &str = "emojivoto";

/// The snapshot's file in its volume (injection's `BALLAST_PROXY_SNAPSHOT_PATH`).
const SNAPSHOT_FILE: &str = "proxy.snapshot";

fn identity(sa: &str) -> String {
    format!("{sa}.{NS}.serviceaccount.identity.ballast.cluster.local")
}

/// A meshed caller of its own service account printing `code STATUS` for
/// each request to emoji (`000` when no HTTP answer came).
const STRANGER: &str = "while :; do echo code $(curl -s -o /dev/null -m 5 -w '%{http_code}' \
                        http://emoji.emojivoto.svc.cluster.local/); sleep 0.2; done";

/// The lines of `log` after its first `skip` lines.
fn lines_after(log: &str, skip: usize) -> String {
    log.lines().skip(skip).map(|l| format!("{l}\n")).collect()
}

/// The status codes the stranger printed after its first `skip` lines.
fn codes(log: &str, skip: usize) -> Vec<String> {
    log.lines()
        .skip(skip)
        .filter_map(|l| l.strip_prefix("code "))
        .map(|c| c.trim().to_string())
        .collect()
}

/// Whether the last five of `codes` are all 403.
fn denied(codes: &[String]) -> bool {
    codes.len() >= 5 && codes[codes.len() - 5..].iter().all(|c| c == "403")
}

/// web's successful calls to `target` in `log`.
fn oks(log: &str, target: &str) -> usize {
    log.matches(&format!("ok http://{target}.")).count()
}

fn line_count(cluster: &ClusterBox, app: &str) -> usize {
    cluster.log_of(NS, app, "caller").lines().count()
}

/// The sum of the samples of `name` that carry every one of `labels`.
fn sum(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    Metrics::parse(page).sum(name, labels)
}

/// The lines of a /metrics page of the families starting with `prefix`.
fn series(page: &str, prefix: &str) -> String {
    page.lines()
        .filter(|l| l.starts_with(prefix))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `app`'s proxy's /metrics, asked again for up to 30 s (its admin port may
/// refuse for a moment on a loaded machine).
async fn proxy_metrics(cluster: &ClusterBox, app: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = Vec::new();
    loop {
        let ip = cluster.pod_ip(NS, app);
        match cluster.get((ip, 4191).into(), "/metrics").await {
            Ok((200, page)) => return page,
            Ok((status, _)) => failures.push(format!("{ip}: {status}")),
            Err(e) => failures.push(format!("{ip}: {e}")),
        }
        assert!(
            Instant::now() < deadline,
            "{app}'s proxy metrics: {failures:?}\n{}",
            cluster.describe(NS)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The name of `app`'s first pod.
fn pod_name(cluster: &ClusterBox, app: &str) -> String {
    cluster
        .pods_of(NS, app)
        .first()
        .and_then(|p| p["metadata"]["name"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no pod of {NS}/{app}"))
}

/// The snapshot file of `app`'s first pod, read from its volume on the node.
fn snapshot_file(cluster: &ClusterBox, app: &str) -> Option<Vec<u8>> {
    let pods = cluster.pods_of(NS, app);
    let uid = pods.first()?["metadata"]["uid"].as_str()?;
    let path = cluster
        .kubelet
        .dir()
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(SNAPSHOT_VOLUME)
        .join(SNAPSHOT_FILE);
    std::fs::read(path).ok()
}

/// Whether `bytes` hold `text` as it is (the snapshot's body is protobuf,
/// which stores names unchanged).
fn holds(bytes: &[u8], text: &str) -> bool {
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

/// The proxy container's status in `pod`: (restarts, ready).
fn proxy_status(pod: &Value) -> (u64, bool) {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == PROXY_CONTAINER)
        .map(|c| (c["restartCount"].as_u64().unwrap_or(0), c["ready"] == true))
        .unwrap_or((0, false))
}

/// The proxy's log lines about its snapshot, for failure messages.
fn snapshot_log(cluster: &ClusterBox, app: &str) -> String {
    cluster
        .log_of(NS, app, PROXY_CONTAINER)
        .lines()
        .filter(|l| l.contains("snapshot") || l.contains("WARN") || l.contains("ERROR"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_restarted_while_the_controller_is_away_routes_and_denies_from_its_snapshot() {
    if !can_run() {
        return;
    }
    let _one = cluster::one_at_a_time().await;
    let cluster = ClusterBox::installed().await;
    eprintln!(
        "control plane ready {:.1}s after the cluster started",
        cluster.started.elapsed().as_secs_f64()
    );
    let applied = Instant::now();
    cluster.apply(&emojivoto()).await;
    cluster
        .create_all(caller_objects(NS, "stranger", STRANGER, json!({})))
        .await;
    cluster
        .wait_deployments_ready(NS, Duration::from_secs(120))
        .await;
    eprintln!(
        "application ready {:.1}s after it was applied",
        applied.elapsed().as_secs_f64()
    );

    // 1. Load flows, and the default policy admits the stranger...
    let flowing = cluster
        .wait_for_log(NS, "web", "caller", Duration::from_secs(90), |log| {
            oks(log, "emoji") >= 10 && oks(log, "voting") >= 10
        })
        .await;
    assert!(
        flowing,
        "web's calls did not flow: {}\n{}",
        cluster.log_of(NS, "web", "caller"),
        cluster.describe(NS)
    );
    let admitted = cluster
        .wait_for_log(NS, "stranger", "caller", Duration::from_secs(90), |log| {
            codes(log, 0).iter().filter(|c| *c == "200").count() >= 3
        })
        .await;
    assert!(
        admitted,
        "the stranger is not admitted before the policy: {:?}\n{}",
        codes(&cluster.log_of(NS, "stranger", "caller"), 0),
        cluster.describe(NS)
    );
    // ... until a Server on emoji's port admits web's identity alone
    // (authentication and authorization first, the Server last, so no moment
    // has a Server without its authorization).
    let stranger_mark = line_count(&cluster, "stranger");
    let web_mark = line_count(&cluster, "web");
    let policy_at = Instant::now();
    cluster
        .create_all(cluster::only_identity_to(NS, "emoji", &identity("web")))
        .await;
    let was_denied = cluster
        .wait_for_log(NS, "stranger", "caller", Duration::from_secs(90), |log| {
            denied(&codes(log, stranger_mark))
        })
        .await;
    assert!(
        was_denied,
        "the stranger is not denied 403: {:?}\n{}",
        codes(&cluster.log_of(NS, "stranger", "caller"), stranger_mark),
        cluster.describe(NS)
    );
    eprintln!(
        "the policy denied the stranger {:.1}s after it was created",
        policy_at.elapsed().as_secs_f64()
    );
    let web_admitted = cluster
        .wait_for_log(NS, "web", "caller", Duration::from_secs(60), |log| {
            oks(&lines_after(log, web_mark), "emoji") >= 5
        })
        .await;
    assert!(
        web_admitted,
        "web's calls to emoji stopped succeeding under the policy: {}",
        lines_after(&cluster.log_of(NS, "web", "caller"), web_mark)
    );

    // 2. Both proxies wrote a snapshot holding what a restart needs: web's
    // the endpoints of emoji and voting with their identities, emoji's the
    // policy naming web's identity.
    let written_by = Instant::now() + Duration::from_secs(120);
    for (app, needs) in [
        ("web", vec![identity("emoji"), identity("voting")]),
        ("emoji", vec![identity("web")]),
    ] {
        loop {
            let page = proxy_metrics(&cluster, app).await;
            let writes = sum(
                &page,
                "discovery_snapshot_writes_total",
                &[("result", "ok")],
            );
            let file = snapshot_file(&cluster, app);
            let missing: Vec<&String> = needs
                .iter()
                .filter(|n| !file.as_deref().is_some_and(|b| holds(b, n)))
                .collect();
            if writes > 0.0 && missing.is_empty() {
                eprintln!(
                    "{app}'s proxy: {writes} snapshot writes, {} bytes on file",
                    file.map_or(0, |f| f.len())
                );
                break;
            }
            assert!(
                Instant::now() < written_by,
                "{app}'s proxy wrote no snapshot holding {missing:?} ({} bytes on file):\n{}\n{}",
                file.map_or(0, |f| f.len()),
                series(&page, "discovery_snapshot"),
                snapshot_log(&cluster, app)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    // 3. Every destination replica gone.
    let down_at = Instant::now();
    cluster.scale("ballast-destination", 0).await;
    eprintln!(
        "every destination replica gone {:.1}s after the scale-down",
        down_at.elapsed().as_secs_f64()
    );

    // 4. web's and emoji's proxies killed; the kubelet restarts them.
    let pods = [pod_name(&cluster, "web"), pod_name(&cluster, "emoji")];
    let stranger_before_kill = line_count(&cluster, "stranger");
    let killed_at = Instant::now();
    for pod in &pods {
        // Only the proxy runs with these flags (not its postStart `await`).
        let killed = cluster.signal_in_pod(NS, pod, "KILL", |cmdline| {
            cmdline.contains("--inbound-addr=") && cmdline.contains("--destination-addr=")
        });
        assert_eq!(killed, 1, "the proxy process of {NS}/{pod}");
    }
    let restarted = cluster
        .api
        .wait_until(Duration::from_secs(120), |api| {
            pods.iter().all(|pod| {
                api.get("pods", NS, pod).is_some_and(|p| {
                    let (restarts, ready) = proxy_status(&p);
                    restarts >= 1 && ready
                })
            })
        })
        .await;
    assert!(
        restarted,
        "the killed proxies did not come back ready without the controller:\nweb:\n{}\nemoji:\n{}\n{}",
        snapshot_log(&cluster, "web"),
        snapshot_log(&cluster, "emoji"),
        cluster.describe(NS)
    );
    eprintln!(
        "both proxies restarted and ready {:.1}s after they were killed",
        killed_at.elapsed().as_secs_f64()
    );

    // 5. With the controller still away: web's calls flow again, over mutual
    // TLS, and none fails once its target has answered (those made while the
    // proxies were down failed, and are before the mark).
    let web_mark = line_count(&cluster, "web");
    let stranger_mark = line_count(&cluster, "stranger");
    let restarted_at = Instant::now();
    let flowing = cluster
        .wait_for_log(NS, "web", "caller", Duration::from_secs(90), |log| {
            let after = lines_after(log, web_mark);
            oks(&after, "emoji") >= 10 && oks(&after, "voting") >= 10
        })
        .await;
    let web_after = lines_after(&cluster.log_of(NS, "web", "caller"), web_mark);
    assert!(
        flowing,
        "web's calls did not flow after its proxy restarted without the controller:\n{web_after}\n\
         web's proxy:\n{}\nemoji's proxy:\n{}",
        snapshot_log(&cluster, "web"),
        snapshot_log(&cluster, "emoji")
    );
    assert_eq!(
        cluster::failures_after_first_success(&web_after),
        0,
        "web's calls failed after the restart:\n{web_after}"
    );
    eprintln!(
        "restarted without the controller: web called emoji {} and voting {} times in {:.1}s",
        oks(&web_after, "emoji"),
        oks(&web_after, "voting"),
        restarted_at.elapsed().as_secs_f64()
    );
    for target in ["emoji", "voting"] {
        let (secured, open) = cluster.outbound_mtls_to(NS, "web", &identity(target)).await;
        assert!(
            secured,
            "web's restarted proxy did not call {target} in mutual TLS as {}:\n{open}",
            identity(target)
        );
    }
    for (app, kind) in [("web", "endpoints"), ("emoji", "inbound_policy")] {
        let page = proxy_metrics(&cluster, app).await;
        let served = sum(&page, "discovery_snapshot_served_total", &[("kind", kind)]);
        eprintln!(
            "{app}'s restarted proxy served from its snapshot:\n{}",
            series(&page, "discovery_snapshot")
        );
        assert!(
            served > 0.0,
            "{app}'s restarted proxy served no {kind} from its snapshot:\n{}\n{}",
            series(&page, "discovery_snapshot"),
            snapshot_log(&cluster, app)
        );
    }
    let (status, body) = cluster
        .get((cluster.pod_ip(NS, "web"), 4191).into(), "/ready")
        .await
        .expect("web's proxy /ready");
    assert!(
        status == 200 && body.starts_with("ready") && body.contains("snapshot"),
        "web's proxy /ready while it serves its snapshot: {status} {body:?}"
    );
    // The stranger: denied by emoji's restarted proxy, never admitted.
    let still_denied = cluster
        .wait_for_log(NS, "stranger", "caller", Duration::from_secs(90), |log| {
            denied(&codes(log, stranger_mark))
        })
        .await;
    let since_kill = codes(
        &cluster.log_of(NS, "stranger", "caller"),
        stranger_before_kill,
    );
    assert!(
        still_denied,
        "emoji's restarted proxy does not deny the stranger: {since_kill:?}\n{}",
        snapshot_log(&cluster, "emoji")
    );
    assert!(
        !since_kill.iter().any(|c| c == "200"),
        "emoji's restarted proxy admitted the stranger: {since_kill:?}\n{}",
        snapshot_log(&cluster, "emoji")
    );
    eprintln!(
        "the stranger since the kill: {} answers, {} of them 403",
        since_kill.len(),
        since_kill.iter().filter(|c| *c == "403").count()
    );

    // 6. The controller back: its answers replace the snapshot's.
    let back_at = Instant::now();
    cluster.scale("ballast-destination", 2).await;
    cluster
        .wait_deployments_ready("ballast", Duration::from_secs(120))
        .await;
    let replaced_by = Instant::now() + Duration::from_secs(90);
    for app in ["web", "emoji"] {
        loop {
            let page = proxy_metrics(&cluster, app).await;
            let serving = Metrics::parse(&page).value("discovery_snapshot_serving");
            if serving == Some(0.0) {
                break;
            }
            assert!(
                Instant::now() < replaced_by,
                "{app}'s proxy still serves from its snapshot with the controller back:\n{}\n{}",
                series(&page, "discovery_snapshot"),
                snapshot_log(&cluster, app)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    eprintln!(
        "the controller's answers replaced the snapshot's {:.1}s after it was scaled up",
        back_at.elapsed().as_secs_f64()
    );
    let back_mark = line_count(&cluster, "web");
    let flowing = cluster
        .wait_for_log(NS, "web", "caller", Duration::from_secs(60), |log| {
            let after = lines_after(log, back_mark);
            oks(&after, "emoji") >= 5 && oks(&after, "voting") >= 5
        })
        .await;
    let web_after = lines_after(&cluster.log_of(NS, "web", "caller"), web_mark);
    assert!(
        flowing,
        "web's calls stopped with the controller back:\n{web_after}"
    );
    assert_eq!(
        cluster::failures_after_first_success(&web_after),
        0,
        "web's calls failed since the restart:\n{web_after}"
    );
    let since_kill = codes(
        &cluster.log_of(NS, "stranger", "caller"),
        stranger_before_kill,
    );
    assert!(
        !since_kill.iter().any(|c| c == "200"),
        "the stranger was admitted with the controller back: {since_kill:?}"
    );
}
