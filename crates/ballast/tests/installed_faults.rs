//! Faults on the installed mesh, under load (seed 002): the application of
//! installed_mesh.rs keeps calling while a destination controller is killed,
//! while every destination replica is down for a minute, while the API
//! server answers 500 for 30 s, and through a rolling restart of a meshed
//! workload. The callers' requests do not fail, and the controllers cost the
//! API server a bounded number of requests while it fails.
//!
//! Needs root, iproute2, iptables, util-linux and curl; see installed_mesh.rs.
//! Run alone: `cargo build -p ballast-sidecar && cargo test -p ballast --test
//! installed_faults -- --nocapture` (it prints each phase's figures).

#[path = "installed/cluster.rs"]
mod cluster;

use cluster::{can_run, emojivoto, ClusterBox};
use serde_json::json;
use std::time::{Duration, Instant};

/// The callers counted: web's (to emoji and voting) and vote-bot's (to web).
const CALLERS: &[&str] = &["web", "vote-bot"];

/// `ok` and `fail` lines of `callers` so far: (ok, fail).
fn tally_of(cluster: &ClusterBox, callers: &[&str]) -> (usize, usize) {
    callers.iter().fold((0, 0), |(ok, fail), app| {
        let log = cluster.log_of("emojivoto", app, "caller");
        (
            ok + log.matches("ok http").count(),
            fail + log.matches("fail http").count(),
        )
    })
}

fn tally(cluster: &ClusterBox) -> (usize, usize) {
    tally_of(cluster, CALLERS)
}

/// The callers' figures over one phase.
struct Phase {
    name: &'static str,
    callers: &'static [&'static str],
    started: Instant,
    at_start: (usize, usize),
}

impl Phase {
    fn start(cluster: &ClusterBox, name: &'static str) -> Phase {
        Phase::of(cluster, name, CALLERS)
    }

    /// A phase counting only `callers` (a pod that restarts starts a new log).
    fn of(cluster: &ClusterBox, name: &'static str, callers: &'static [&'static str]) -> Phase {
        Phase {
            name,
            callers,
            started: Instant::now(),
            at_start: tally_of(cluster, callers),
        }
    }

    /// (requests, failures) since the start; printed.
    fn end(self, cluster: &ClusterBox) -> (usize, usize) {
        let (ok, fail) = tally_of(cluster, self.callers);
        let (ok, fail) = (
            ok.saturating_sub(self.at_start.0),
            fail.saturating_sub(self.at_start.1),
        );
        eprintln!(
            "{}: {} requests, {} failed, over {:.1}s",
            self.name,
            ok + fail,
            fail,
            self.started.elapsed().as_secs_f64()
        );
        (ok + fail, fail)
    }
}

/// Waits until the callers have made `more` further requests (load is flowing).
async fn requests_flow(cluster: &ClusterBox, more: usize, what: &str) {
    requests_flow_of(cluster, CALLERS, more, what).await
}

async fn requests_flow_of(cluster: &ClusterBox, callers: &[&str], more: usize, what: &str) {
    let from = tally_of(cluster, callers);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let now = tally_of(cluster, callers);
        if now.0 + now.1 >= from.0 + from.1 + more {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "requests stopped flowing {what}\n{}",
            cluster.describe("emojivoto")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lets the load run for `period`: the fault's duration, not a synchronization.
async fn under_load(period: Duration) {
    tokio::time::sleep(period).await;
}

/// SIGKILLs the `destination` container's process of `pod`.
fn kill_destination(cluster: &ClusterBox, pod: &str) {
    let netns = cluster
        .kubelet
        .pod_netns("ballast", pod)
        .expect("the pod's network namespace");
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", &netns])
        .output()
        .expect("ip netns pids");
    let mut killed = 0;
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("destination") && cmdline.contains("--controller-namespace") {
            let ok = std::process::Command::new("kill")
                .args(["-9", pid])
                .status()
                .is_ok_and(|s| s.success());
            killed += usize::from(ok);
        }
    }
    assert!(killed > 0, "no destination process found in {netns}");
}

async fn scale(cluster: &ClusterBox, deployment: &str, replicas: u32) {
    cluster
        .api
        .patch_merge(
            "deployments",
            "ballast",
            deployment,
            json!({"spec": {"replicas": replicas}}),
        )
        .await
        .expect("scaled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mesh_rides_out_controller_and_api_server_faults_under_load() {
    if !can_run() {
        return;
    }
    let cluster = ClusterBox::installed().await;
    cluster.apply(&emojivoto()).await;
    cluster
        .wait_deployments_ready("emojivoto", Duration::from_secs(120))
        .await;
    requests_flow(&cluster, 40, "before any fault").await;
    let mut failures = Vec::new();

    // A. One destination controller killed: the kubelet restarts it.
    let phase = Phase::start(&cluster, "a destination pod killed");
    let destination_pods: Vec<String> = cluster
        .api
        .list("pods")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"] == "ballast"
                && p["metadata"]["labels"]["app.kubernetes.io/name"] == "ballast-destination"
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    kill_destination(&cluster, &destination_pods[0]);
    let restarted = cluster
        .api
        .wait_until(Duration::from_secs(60), |api| {
            api.get("pods", "ballast", &destination_pods[0])
                .is_some_and(|p| {
                    p["status"]["containerStatuses"][0]["restartCount"].as_u64() >= Some(1)
                        && p["status"]["containerStatuses"][0]["ready"] == true
                })
        })
        .await;
    assert!(
        restarted,
        "the killed destination controller came back ready"
    );
    requests_flow(&cluster, 20, "after a destination pod was killed").await;
    failures.push(phase.end(&cluster));

    // B. Every destination replica down for a minute: proxies route on
    // what they know.
    let phase = Phase::start(&cluster, "every destination replica down for 60s");
    scale(&cluster, "ballast-destination", 0).await;
    let gone = cluster
        .api
        .wait_until(Duration::from_secs(60), |api| {
            !api.list("pods")
                .iter()
                .any(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == "ballast-destination")
        })
        .await;
    assert!(gone, "the destination pods went away");
    under_load(Duration::from_secs(60)).await;
    requests_flow(&cluster, 20, "while no destination controller runs").await;
    scale(&cluster, "ballast-destination", 2).await;
    cluster
        .wait_deployments_ready("ballast", Duration::from_secs(120))
        .await;
    failures.push(phase.end(&cluster));

    // C. The API server answers 500 for 30 s (and every watch is cut): the
    // controllers keep serving what they know and back off.
    let phase = Phase::start(&cluster, "the API server answering 500 for 30s");
    let before = cluster.api.requests().len();
    cluster.api.fail_with(Some((500, None)));
    cluster.api.cut_watches();
    under_load(Duration::from_secs(30)).await;
    let during = cluster.api.requests().len() - before;
    cluster.api.fail_with(None);
    requests_flow(&cluster, 20, "after the API server recovered").await;
    failures.push(phase.end(&cluster));
    // Four controller pods watch (two destination, two viz), 11 kinds each;
    // with back-off from 0.8 s doubling, each kind retries about 6 times in
    // 30 s. Hammering (seed 002) would be thousands.
    eprintln!("API server requests during its 30s of 500s: {during}");
    assert!(
        during < 4 * 11 * 12,
        "the controllers sent {during} requests to a failing API server in 30s"
    );

    // E. A rolling restart of a meshed workload (web), as `kubectl rollout
    // restart` does it.
    // web's own pod (and its caller's log) is replaced: vote-bot's calls to web count.
    let phase = Phase::of(&cluster, "a rolling restart of web", &["vote-bot"]);
    cluster
        .api
        .patch_merge(
            "deployments",
            "emojivoto",
            "web",
            json!({"spec": {"template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-12-03T00:00:00Z"
            }}}}}),
        )
        .await
        .expect("restarted");
    let rolled = cluster
        .api
        .wait_until(Duration::from_secs(120), |api| {
            let pods: Vec<_> = api
                .list("pods")
                .into_iter()
                .filter(|p| p["metadata"]["labels"]["app"] == "web")
                .collect();
            pods.len() == 1
                && pods[0]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
                    .is_string()
                && pods[0]["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .await;
    assert!(rolled, "web rolled\n{}", cluster.describe("emojivoto"));
    requests_flow_of(&cluster, &["vote-bot"], 20, "after web rolled").await;
    failures.push(phase.end(&cluster));

    let (a, b, c, e) = (failures[0], failures[1], failures[2], failures[3]);
    assert_eq!(a.1, 0, "requests failed when a destination pod was killed");
    assert_eq!(b.1, 0, "requests failed while the controllers were down");
    assert_eq!(c.1, 0, "requests failed while the API server failed");
    assert_eq!(e.1, 0, "requests failed during web's rolling restart");
}
