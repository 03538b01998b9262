//! Seed 000 over the wire: pods sharing an IP never make a lookup fail, and
//! never flood clients or logs.

use ballast_testsupport as support;

use support::{
    manifests::{docs, PodSpec},
    next,
    updates::{seen, Seen},
    write_atomic, Controller,
};

/// The `pod` label `Get(IP:PORT)` answers with, or `None` for a bare address.
async fn pod_at(c: &Controller, addr: &str) -> Option<String> {
    let mut s = c.get(addr).await.unwrap();
    match seen(next(&mut s).await) {
        Seen::Add(eps) => {
            assert_eq!(eps.len(), 1, "{addr}: one endpoint");
            let (got, labels) = eps.into_iter().next().unwrap();
            assert_eq!(got.to_string(), addr);
            labels.get("pod").cloned()
        }
        other => panic!("{addr}: expected an add, got {other:?}"),
    }
}

async fn profile_pod_at(c: &Controller, addr: &str) -> Option<String> {
    let p = next(&mut c.get_profile(addr).await.unwrap()).await;
    p.endpoint
        .expect("endpoint")
        .metric_labels
        .get("pod")
        .cloned()
}

#[tokio::test]
async fn every_seed_000_case_resolves_without_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut terminating = PodSpec::new("prod", "queues-old", "queues", "127.0.5.3", 8080);
    terminating.terminating = true;
    terminating.created = "2026-01-01T00:00:00Z";
    let mut running = PodSpec::new("prod", "web-new", "web", "127.0.5.3", 8080);
    running.created = "2026-01-02T00:00:00Z";
    let mut lonely_terminating = PodSpec::new("prod", "gone", "gone", "127.0.5.4", 8080);
    lonely_terminating.terminating = true;
    let mut succeeded = PodSpec::new("prod", "job-done", "job", "127.0.5.5", 8080);
    succeeded.phase = "Succeeded";
    let mut failed = PodSpec::new("prod", "job-failed", "job", "127.0.5.6", 8080);
    failed.phase = "Failed";
    let host_pod = |name: &'static str, port: u16| {
        let mut p = PodSpec::new("kube-system", name, name, "127.0.9.1", port);
        p.host_network = true;
        p.host_ip = "127.0.9.1";
        p.yaml()
    };
    let mut older = PodSpec::new("prod", "dup-older", "dup", "127.0.5.7", 8080);
    older.created = "2026-01-01T00:00:00Z";
    let mut newer = PodSpec::new("prod", "dup-newer", "dup", "127.0.5.7", 8080);
    newer.created = "2026-01-03T00:00:00Z";
    write_atomic(
        &dir.path().join("pods.yaml"),
        &docs(&[
            terminating.yaml(),
            running.yaml(),
            lonely_terminating.yaml(),
            succeeded.yaml(),
            failed.yaml(),
            host_pod("node-exporter", 9100),
            host_pod("kube-proxy", 10249),
            older.yaml(),
            newer.yaml(),
        ]),
    );
    let c = Controller::start(dir.path(), &[]).await;

    // Terminating and Running share an IP: the Running pod, on both APIs.
    assert_eq!(
        pod_at(&c, "127.0.5.3:8080").await.as_deref(),
        Some("web-new")
    );
    assert_eq!(
        profile_pod_at(&c, "127.0.5.3:8080").await.as_deref(),
        Some("web-new")
    );
    // Terminating, Succeeded or Failed alone: no pod, the address itself.
    for addr in ["127.0.5.4:8080", "127.0.5.5:8080", "127.0.5.6:8080"] {
        assert_eq!(pod_at(&c, addr).await, None, "{addr}");
        assert_eq!(profile_pod_at(&c, addr).await, None, "{addr}");
    }
    // hostNetwork pods on one node IP: each owns its port; other ports, none.
    assert_eq!(
        pod_at(&c, "127.0.9.1:9100").await.as_deref(),
        Some("node-exporter")
    );
    assert_eq!(
        pod_at(&c, "127.0.9.1:10249").await.as_deref(),
        Some("kube-proxy")
    );
    assert_eq!(pod_at(&c, "127.0.9.1:22").await, None);

    // Two live pods on one IP: the newer, every time; one conflict, logged once.
    for _ in 0..50 {
        assert_eq!(
            pod_at(&c, "127.0.5.7:8080").await.as_deref(),
            Some("dup-newer")
        );
    }
    assert_eq!(c.metric("destination_ip_conflicts").await, Some(1.0));
    assert_eq!(
        c.metric("destination_ip_conflicts_seen_total").await,
        Some(1.0)
    );
    // The conflict gauge and counter are two families of a valid page.
    if let Some(page) = support::openmetrics::check_page(c.admin, "destination controller").await {
        page.assert_has("destination_ip_conflicts", "gauge");
        page.assert_has("destination_ip_conflicts_seen", "counter");
    }
    assert_eq!(c.logs_containing("Several live pods").len(), 1);
    let line = &c.logs_containing("Several live pods")[0];
    assert!(line.len() < 500, "the conflict log line is short: {line}");
}

#[tokio::test]
async fn a_reused_ip_resolves_to_the_new_pod_with_no_stale_data() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(
        &dir.path().join("old.yaml"),
        &PodSpec::new("prod", "old-pod", "old", "127.0.6.1", 8080).yaml(),
    );
    let c = Controller::start(dir.path(), &[]).await;
    let mut profile = c.get_profile("127.0.6.1:8080").await.unwrap();
    let p = next(&mut profile).await;
    assert_eq!(p.endpoint.unwrap().metric_labels["pod"], "old-pod");
    let mut get = c.get("127.0.6.1:8080").await.unwrap();
    next(&mut get).await;

    // The old pod is deleted and its IP given to a new pod.
    std::fs::remove_file(dir.path().join("old.yaml")).unwrap();
    write_atomic(
        &dir.path().join("new.yaml"),
        &PodSpec::new("prod", "new-pod", "new", "127.0.6.1", 8080).yaml(),
    );
    // The profile stream moves to the new pod (maybe through a bare address
    // while neither pod exists).
    let labels = loop {
        let p = next(&mut profile).await;
        let labels = p.endpoint.expect("endpoint").metric_labels;
        if labels.get("pod").map(String::as_str) == Some("new-pod") {
            break labels;
        }
    };
    assert_eq!(labels["namespace"], "prod");
    assert!(!labels.values().any(|v| v == "old-pod"));

    // The Get stream moves to the new pod too: its last add carries new-pod.
    loop {
        match seen(next(&mut get).await) {
            Seen::Add(eps) => {
                let l = eps.values().next().unwrap();
                if l.get("pod").map(String::as_str) == Some("new-pod") {
                    break;
                }
            }
            Seen::Remove(_) | Seen::NoEndpoints { .. } => {}
        }
    }
    assert_eq!(
        pod_at(&c, "127.0.6.1:8080").await.as_deref(),
        Some("new-pod")
    );
}
