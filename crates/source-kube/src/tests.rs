//! The source end to end against a scripted HTTP/1.1 fake of the API server
//! (raw TCP, one response per connection): the real kube client, this
//! module's layer, kube's watcher and the store. The full emulation with
//! fault injection is `ballast-testkit`; this checks the wiring and kube's
//! resume and relist behaviour as the source relies on it.

use super::*;
use ballast_store::index::{Index, IndexConfig};
use ballast_testkit::eventually_sync;
use serde_json::json;
use std::sync::Mutex;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Bound on each wait for the source to catch up.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Fake {
    /// Request targets, in order: `GET /api/v1/pods?limit=500`.
    log: Mutex<Vec<String>>,
}

impl Fake {
    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, verb_watch: bool, plural: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.contains(&format!("/{plural}?")))
            .filter(|r| r.contains("watch=true") == verb_watch)
            .count()
    }
}

fn pod(name: &str, ip: &str, rv: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": name,
                      "managedFields": [{"manager": "x"}]},
        "spec": {"containers": [{"name": "app", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn list(kind: &str, rv: &str, items: Vec<serde_json::Value>) -> String {
    json!({"apiVersion": "v1", "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": rv}, "items": items})
    .to_string()
}

async fn respond(mut sock: TcpStream, fake: Arc<Fake>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let n_same = {
        let mut log = fake.log.lock().unwrap();
        log.push(target.clone());
        let path = target.split('?').next().unwrap_or("").to_string();
        let watch = target.contains("watch=true");
        log.iter()
            .filter(|r| r.split('?').next() == Some(&path) && r.contains("watch=true") == watch)
            .count()
    };
    let watch = target.contains("watch=true");
    let pods = target.starts_with("/api/v1/pods");
    // Pods: list {a} at rv 10; watch 1 adds b (rv 11) then is cut; watch 2
    // (from rv 11) gets 410; the relist finds {b} at rv 20; watch 3 holds.
    // Services and slices: empty lists, watches held open.
    let (status, body, stream): (&str, String, Vec<String>) = match (pods, watch, n_same) {
        (true, false, 1) => (
            "200 OK",
            list("Pod", "10", vec![pod("a", "10.0.0.1", "9")]),
            vec![],
        ),
        (true, false, _) => (
            "200 OK",
            list("Pod", "20", vec![pod("b", "10.0.0.2", "11")]),
            vec![],
        ),
        (true, true, 1) => {
            assert!(target.contains("resourceVersion=10"), "{target}");
            let ev = json!({"type": "ADDED", "object": pod("b", "10.0.0.2", "11")});
            ("200 OK", String::new(), vec![ev.to_string()])
        }
        (true, true, 2) => {
            assert!(target.contains("resourceVersion=11"), "{target}");
            let ev = json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "too old resource version: 11 (15)", "reason": "Expired", "code": 410}});
            ("200 OK", String::new(), vec![ev.to_string()])
        }
        (_, false, _) => ("200 OK", list("X", "5", vec![]), vec![]),
        (_, true, _) => {
            let bm = json!({"type": "BOOKMARK", "object": {"kind": "X", "apiVersion": "v1",
                "metadata": {"resourceVersion": "30"}}});
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
                .await;
            let _ = sock.write_all(format!("{bm}\n").as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
    };
    let _ = sock
        .write_all(
            format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n")
                .as_bytes(),
        )
        .await;
    if stream.is_empty() {
        let _ = sock
            .write_all(format!("Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes())
            .await;
    } else {
        let _ = sock.write_all(b"\r\n").await;
        for line in stream {
            let _ = sock.write_all(format!("{line}\n").as_bytes()).await;
        }
    }
    let _ = sock.shutdown().await;
}

#[tokio::test]
async fn lists_once_resumes_watches_and_relists_only_on_gone() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(Fake::default());
    let server = {
        let fake = fake.clone();
        tokio::spawn(async move {
            loop {
                let (sock, _) = listener.accept().await.unwrap();
                tokio::spawn(respond(sock, fake.clone()));
            }
        })
    };

    let config = KubeConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(20),
            ..BackoffConfig::default()
        },
        ..KubeConfig::default()
    };
    let metrics = KubeMetrics::default();
    let kube_config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = client_from_config(kube_config, &config, &metrics).unwrap();
    let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let source = tokio::spawn(run(config, client, store.clone(), metrics.clone(), async {
        let _ = stop_rx.await;
    }));

    tokio::time::timeout(Duration::from_secs(10), store.wait_ready())
        .await
        .expect("ready");
    // The 410 relist ends with pod b only (a was deleted while away).
    eventually_sync("the relist", WAIT, || fake.count(false, "pods") == 2).await;
    eventually_sync("the third pods watch", WAIT, || {
        fake.count(true, "pods") == 3
    })
    .await;
    eventually_sync("pod a removed", WAIT, || {
        store.with_index(|i| i.sizes().pods) == 1
    })
    .await;

    assert_eq!(fake.count(false, "services"), 1, "{:#?}", fake.requests());
    assert_eq!(fake.count(true, "services"), 1);
    assert_eq!(fake.count(false, "endpointslices"), 1);
    assert_eq!(fake.count(true, "endpointslices"), 1);
    // The cut watch resumed from the last event's resourceVersion without a
    // LIST (asserted by the fake); only the 410 relisted.
    let pods_requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("/api/v1/pods"))
        .map(|r| {
            if r.contains("watch=true") {
                "watch"
            } else {
                "list"
            }
        })
        .collect();
    assert_eq!(pods_requests, ["list", "watch", "watch", "list", "watch"]);

    let kind = |k: &str| Metrics::kind(k);
    assert_eq!(
        metrics
            .kube_relists_total
            .get_or_create(&kind("pods"))
            .get(),
        1
    );
    assert_eq!(
        metrics
            .kube_relists_total
            .get_or_create(&kind("services"))
            .get(),
        0
    );
    assert_eq!(
        metrics
            .kube_watch_restarts_total
            .get_or_create(&kind("pods"))
            .get(),
        2
    );
    let req = |verb: &str, k: &str| {
        metrics
            .kube_requests_total
            .get_or_create(&crate::metrics::KubeRequestLabel {
                verb: verb.into(),
                kind: k.into(),
            })
            .get()
    };
    assert_eq!((req("list", "pods"), req("watch", "pods")), (2, 3));
    assert_eq!((req("list", "services"), req("watch", "services")), (1, 1));
    assert!(metrics.kube_last_event.age("services").unwrap() < Duration::from_secs(5));

    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in [
        "destination_kube_requests_total{verb=\"list\",kind=\"pods\"} 2",
        "destination_kube_responses_total{kind=\"pods\",code=\"200\"} 5",
        "destination_kube_relists_total{kind=\"pods\"} 1",
        "destination_kube_watch_restarts_total{kind=\"pods\"} 2",
        "destination_kube_last_event_age_seconds{kind=\"endpointslices\"}",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }

    stop_tx.send(()).unwrap();
    source.await.unwrap().unwrap();
    server.abort();
}

#[tokio::test]
async fn an_unreachable_api_server_is_retried_on_the_schedule() {
    // Bind then drop: connections to the port are refused.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let config = KubeConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(100),
            ..BackoffConfig::default()
        },
        ..KubeConfig::default()
    };
    let window = Duration::from_millis(1500);
    let bound = config.backoff.max_attempts_within(window);
    let metrics = KubeMetrics::default();
    let kube_config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = client_from_config(kube_config, &config, &metrics).unwrap();
    let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
    let _ = tokio::time::timeout(
        window,
        run(
            config,
            client,
            store.clone(),
            metrics.clone(),
            std::future::pending(),
        ),
    )
    .await;
    assert!(!store.is_ready());
    for k in ["pods", "services", "endpointslices"] {
        let label = crate::metrics::KubeRequestLabel {
            verb: "list".into(),
            kind: k.into(),
        };
        let sent = metrics.kube_requests_total.get_or_create(&label).get();
        assert!(
            sent >= 2 && sent <= bound,
            "{k}: {sent} requests, bound {bound}"
        );
        let errors = metrics
            .kube_responses_total
            .get_or_create(&crate::metrics::KubeResponseLabel {
                kind: k.into(),
                code: "error".into(),
            })
            .get();
        assert_eq!(errors, sent);
        // Never heard from: the age counts from the start (just after the
        // window opened).
        assert!(metrics.kube_last_event.age(k).unwrap() >= window - Duration::from_millis(200));
    }
}
