//! `ballast destination` on the Kubernetes source, against testkit's API
//! server emulation: what it costs the API server, and how it rides out the
//! API server's faults (seed 002) and pod IP reuse (seed 000).

use ballast_testsupport as support;

use ballast_source_kube::BackoffConfig;
use ballast_testkit::ApiServer;
use serde_json::{json, Value};
use std::{collections::BTreeSet, net::SocketAddr, time::Duration};
use support::{
    next,
    updates::{added, addrs, seen, Seen},
    Controller, DEADLINE,
};

const KINDS: [&str; 3] = ["pods", "services", "endpointslices"];

/// Watches the controller holds open on testkit: one per kind it watches
/// that testkit serves. Testkit serves neither Namespaces nor Linkerd's own
/// HTTPRoute; the controller takes those as not installed.
fn served_watches() -> usize {
    ballast_source_kube::WATCHED_RESOURCES
        .iter()
        .filter(|(group, _, plural)| ballast_testkit::serves(group, plural))
        .count()
}

fn pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "web"},
                     "creationTimestamp": "2026-11-01T00:00:00Z"},
        "spec": {"containers": [{"name": "web", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "127.9.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "127.8.0.1", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    })
}

struct Cluster {
    api: ApiServer,
    _dir: tempfile::TempDir,
    kubeconfig: String,
}

async fn cluster(pods: &[(&str, &str)]) -> Cluster {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).display().to_string();
    api.apply(service());
    for (name, ip) in pods {
        api.apply(pod(name, ip));
    }
    Cluster {
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Cluster {
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec!["--kubeconfig".to_string(), self.kubeconfig.clone()];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    fn count(&self, verb: &str) -> [usize; 3] {
        KINDS.map(|k| self.api.count(verb, k))
    }

    async fn watches_open(&self, n: usize) {
        assert!(
            self.api.wait_for_watches(n, DEADLINE).await,
            "{n} watches did not open; requests: {:?}",
            self.count("watch")
        );
    }
}

const WEB: &str = "web.shop.svc.cluster.local:80";

#[tokio::test]
async fn a_start_costs_one_list_per_kind_and_page_and_one_watch_per_kind() {
    let pods: Vec<(String, String)> = (1..=5)
        .map(|i| (format!("web-{i}"), format!("127.7.0.{i}")))
        .collect();
    let refs: Vec<(&str, &str)> = pods.iter().map(|(n, i)| (n.as_str(), i.as_str())).collect();
    let k = cluster(&refs).await;
    let c = Controller::start_with(&k.args(&["--kube-page-size", "2"])).await;
    k.watches_open(served_watches()).await;
    // 5 pods in pages of 2: 3 LISTs; one page each for the others.
    assert_eq!(k.count("list"), [3, 1, 1]);
    assert_eq!(k.count("watch"), [1, 1, 1]);
    let mut s = c.get(WEB).await.unwrap();
    assert_eq!(added(seen(next(&mut s).await)).len(), 5);
    let sample = "destination_kube_requests_total{verb=\"list\",kind=\"pods\"}";
    assert_eq!(c.metric(sample).await, Some(3.0), "{sample}");
}

#[tokio::test]
async fn cut_watches_resume_without_listing_again() {
    let k = cluster(&[("web-1", "127.7.0.1")]).await;
    let c = Controller::start_with(&k.args(&[
        "--kube-backoff-initial",
        "10ms",
        "--kube-backoff-max",
        "50ms",
    ]))
    .await;
    k.watches_open(served_watches()).await;
    let lists = k.count("list");
    for i in 1..=100 {
        k.api.cut_watches();
        let want = 1 + i;
        let ok = k
            .api
            .wait_until(DEADLINE, |api| {
                KINDS.iter().all(|kind| api.count("watch", kind) >= want)
                    && api.open_watches() == served_watches()
            })
            .await;
        assert!(ok, "round {i}: watches {:?}", k.count("watch"));
    }
    assert_eq!(k.count("watch"), [101, 101, 101]);
    assert_eq!(k.count("list"), lists, "no LIST after a cut watch");
    // And the controller still follows changes.
    let mut s = c.get(WEB).await.unwrap();
    assert_eq!(added(seen(next(&mut s).await)), addrs(&["127.7.0.1:8080"]));
    k.api.apply(pod("web-2", "127.7.0.2"));
    assert_eq!(added(seen(next(&mut s).await)), addrs(&["127.7.0.2:8080"]));
}

#[tokio::test]
async fn gone_relists_once_and_clients_see_only_real_differences() {
    let k = cluster(&[("web-1", "127.7.0.1"), ("web-2", "127.7.0.2")]).await;
    let c = Controller::start_with(&k.args(&["--kube-backoff-initial", "10ms"])).await;
    k.watches_open(served_watches()).await;
    let mut s = c.get(WEB).await.unwrap();
    assert_eq!(
        added(seen(next(&mut s).await)),
        addrs(&["127.7.0.1:8080", "127.7.0.2:8080"])
    );
    let lists = k.count("list");

    // While the watches are down, web-2 goes, web-3 comes, and history is lost.
    k.api.stall(true);
    k.api.cut_watches();
    k.api.delete("v1", "Pod", "shop", "web-2");
    k.api.apply(pod("web-3", "127.7.0.3"));
    k.api.expire_history();
    k.api.stall(false);

    k.watches_open(served_watches()).await;
    let relisted = k
        .api
        .wait_until(DEADLINE, |api| {
            KINDS
                .iter()
                .zip(lists)
                .all(|(kind, before)| api.count("list", kind) == before + 1)
        })
        .await;
    assert!(
        relisted,
        "one relist per kind: {:?} -> {:?}",
        lists,
        k.count("list")
    );
    // Exactly the differences: web-2 out, web-3 in.
    assert_eq!(
        seen(next(&mut s).await),
        Seen::Remove(addrs(&["127.7.0.2:8080"]))
    );
    assert_eq!(added(seen(next(&mut s).await)), addrs(&["127.7.0.3:8080"]));
    // Nothing else follows: web-1 was unchanged by the relist.
    let more = tokio::time::timeout(Duration::from_millis(500), s.message()).await;
    assert!(
        more.is_err(),
        "unexpected message after the relist: {more:?}"
    );
    assert_eq!(k.count("list"), lists.map(|n| n + 1));
}

#[tokio::test]
async fn thirty_seconds_of_500s_cost_requests_bounded_by_the_backoff_schedule() {
    let k = cluster(&[("web-1", "127.7.0.1"), ("web-2", "127.7.0.2")]).await;
    let c = Controller::start_with(&k.args(&[])).await;
    k.watches_open(served_watches()).await;
    let mut s = c.get(WEB).await.unwrap();
    assert_eq!(added(seen(next(&mut s).await)).len(), 2);

    let before = k.api.requests().len();
    k.api.fail_with(Some((500, None)));
    k.api.cut_watches();
    let window = Duration::from_secs(30);
    // The stream must stay quiet for the whole window: no spurious removals.
    let quiet = tokio::time::timeout(window, s.message()).await;
    assert!(
        quiet.is_err(),
        "the stream changed while the API failed: {quiet:?}"
    );
    let during = k.api.requests().len() - before;
    let schedule = BackoffConfig::default();
    // Every watched kind retries on its own schedule.
    let kinds = ballast_source_kube::WATCHED_RESOURCES.len();
    let bound = kinds * schedule.max_attempts_within(window) as usize;
    assert!(
        during <= bound,
        "{during} requests in {window:?}, the schedule allows {bound}"
    );
    assert!(during >= 3, "each kind retried at least once ({during})");
    assert_eq!(c.http_get("/live").await.0, 200, "live while the API fails");
    assert!(
        c.metric("destination_kube_last_event_age_seconds{kind=\"pods\"}")
            .await
            .unwrap_or(0.0)
            >= 10.0
    );

    // The API server recovers: the controller converges.
    k.api.fail_with(None);
    k.api.apply(pod("web-3", "127.7.0.3"));
    let got = tokio::time::timeout(Duration::from_secs(45), s.message())
        .await
        .expect("converged after recovery")
        .unwrap()
        .unwrap();
    assert_eq!(added(seen(got)), addrs(&["127.7.0.3:8080"]));
}

#[tokio::test]
async fn seed_000_terminating_deleted_and_reused_ip_over_the_kubernetes_source() {
    let k = cluster(&[("old", "127.7.1.1")]).await;
    let c = Controller::start_with(&k.args(&[])).await;
    k.watches_open(served_watches()).await;
    let mut get = c.get("127.7.1.1:8080").await.unwrap();
    let mut profile = c.get_profile("127.7.1.1:8080").await.unwrap();
    let first = seen(next(&mut get).await);
    let Seen::Add(eps) = first else {
        panic!("{first:?}")
    };
    assert_eq!(eps.values().next().unwrap()["pod"], "old");
    let p = next(&mut profile).await;
    assert_eq!(p.endpoint.unwrap().metric_labels["pod"], "old");

    // Terminating: it no longer owns the IP.
    let mut terminating = pod("old", "127.7.1.1");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-02T00:00:00Z");
    k.api.apply(terminating);
    let p = next(&mut profile).await;
    assert!(p.endpoint.unwrap().metric_labels.is_empty(), "bare address");

    // Deleted, and its IP given to a new pod.
    k.api.delete("v1", "Pod", "shop", "old");
    k.api.apply(pod("new", "127.7.1.1"));
    let labels = loop {
        let p = next(&mut profile).await;
        let labels = p.endpoint.unwrap().metric_labels;
        if labels.get("pod").map(String::as_str) == Some("new") {
            break labels;
        }
    };
    assert_eq!(labels["namespace"], "shop");
    loop {
        if let Seen::Add(eps) = seen(next(&mut get).await) {
            if eps.values().next().unwrap().get("pod").map(String::as_str) == Some("new") {
                break;
            }
        }
    }
}

#[tokio::test]
async fn after_a_restart_100_clients_end_with_exactly_the_current_set() {
    let k = cluster(&[("web-1", "127.7.0.1"), ("web-2", "127.7.0.2")]).await;
    // A fixed address, so that clients find the restarted controller.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut c = Controller::start_with(&k.args(&["--addr", &addr.to_string()])).await;

    // Each client keeps the set it was told, starting over on each new stream
    // (the first answer of a stream is the whole set), and reconnects.
    let (tx, rx) = tokio::sync::watch::channel(vec![BTreeSet::new(); 100]);
    let tx = std::sync::Arc::new(tx);
    let mut clients = Vec::new();
    for i in 0..100 {
        let tx = tx.clone();
        clients.push(tokio::spawn(async move {
            loop {
                let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect()
                    .await;
                let stream = match channel {
                    Ok(ch) => {
                        linkerd2_proxy_api::destination::destination_client::DestinationClient::new(
                            ch,
                        )
                        .get(support::req(WEB))
                        .await
                    }
                    Err(e) => Err(tonic::Status::unavailable(e.to_string())),
                };
                if let Ok(resp) = stream {
                    let mut stream = resp.into_inner();
                    // A new set per stream: what a client knows starts
                    // over with each connection.
                    let mut set = BTreeSet::new();
                    while let Ok(Some(msg)) = stream.message().await {
                        seen(msg).apply_to(&mut set);
                        tx.send_modify(|sets| sets[i] = set.clone());
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let all_equal = |want: BTreeSet<SocketAddr>| {
        let mut rx = rx.clone();
        async move {
            tokio::time::timeout(
                DEADLINE,
                rx.wait_for(|sets| sets.iter().all(|s| *s == want)),
            )
            .await
            .is_ok()
        }
    };
    assert!(all_equal(addrs(&["127.7.0.1:8080", "127.7.0.2:8080"])).await);

    // Restart; meanwhile the cluster changes.
    c.signal("TERM");
    assert!(c.wait(Duration::from_secs(15)).await.success());
    k.api.delete("v1", "Pod", "shop", "web-1");
    k.api.apply(pod("web-3", "127.7.0.3"));
    let _c2 = Controller::start_with(&k.args(&["--addr", &addr.to_string()])).await;
    assert!(
        all_equal(addrs(&["127.7.0.2:8080", "127.7.0.3:8080"])).await,
        "clients: {:?}",
        rx.borrow().iter().take(3).collect::<Vec<_>>()
    );
    for client in clients {
        client.abort();
    }
}
