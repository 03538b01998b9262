//! Routes end to end: `ballast destination` (on the manifests source and on
//! the Kubernetes source, against testkit) serving Gateway API HTTPRoutes,
//! and `ballast proxy` enforcing them: a 90/10 split shifted live to 0/100
//! with no failed request, path and header matches, a request timeout,
//! retries of 503s stopping at their limit, and a route broken on purpose
//! while traffic flows.

use ballast_testsupport as support;

#[path = "policy/fake.rs"]
mod fake;

use ballast_testkit::ApiServer;
use fake::TestBackend;
use http::StatusCode;
use serde_json::{json, Value};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use support::{
    proxy::{Http1, Proxy},
    write_atomic, Controller, DEADLINE,
};

const NS: &str = "shop";

/// Where the controller reads the cluster from.
enum Source {
    Manifests(tempfile::TempDir),
    Kube {
        api: ApiServer,
        _dir: tempfile::TempDir,
        kubeconfig: String,
    },
}

impl Source {
    async fn new(kube: bool) -> Source {
        let dir = tempfile::tempdir().unwrap();
        if !kube {
            return Source::Manifests(dir);
        }
        let api = ApiServer::start().await;
        let kubeconfig = api.write_kubeconfig(dir.path()).display().to_string();
        Source::Kube {
            api,
            _dir: dir,
            kubeconfig,
        }
    }

    fn file(obj: &Value) -> String {
        format!(
            "{}-{}.json",
            obj["kind"].as_str().unwrap().to_lowercase(),
            obj["metadata"]["name"].as_str().unwrap()
        )
    }

    /// Creates or replaces one object.
    fn apply(&self, obj: Value) {
        match self {
            Source::Manifests(dir) => {
                write_atomic(&dir.path().join(Self::file(&obj)), &obj.to_string())
            }
            Source::Kube { api, .. } => {
                api.apply(obj);
            }
        }
    }

    fn args(&self) -> Vec<String> {
        match self {
            Source::Manifests(dir) => vec!["--manifests".into(), dir.path().display().to_string()],
            Source::Kube { kubeconfig, .. } => vec!["--kubeconfig".into(), kubeconfig.clone()],
        }
    }
}

fn service(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": ip, "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    })
}

fn pod(app: &str, addr: SocketAddr) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{app}-1"), "namespace": NS, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main",
                                 "ports": [{"name": "http", "containerPort": addr.port()}]}]},
        "status": {"phase": "Running", "podIP": addr.ip().to_string(),
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// An HTTPRoute on `web` port 80 with these rules.
fn route(name: &str, annotations: Value, rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                 "rules": rules}
    })
}

fn split(a: u32, b: u32) -> Value {
    json!([{"backendRefs": [{"name": "web-a", "port": 80, "weight": a},
                            {"name": "web-b", "port": 80, "weight": b}]}])
}

const WEB: &str = "web.shop.svc.cluster.local:80";

/// Services `web` (no endpoints of its own), `web-a` and `web-b` (one
/// backend each), the controller on `source`, and a proxy in explicit mode.
struct World {
    source: Source,
    controller: Controller,
    a: TestBackend,
    b: TestBackend,
    proxy: Proxy,
}

impl World {
    async fn start(kube: bool) -> World {
        let source = Source::new(kube).await;
        let a = TestBackend::start("web-a", "127.0.0.2").await;
        let b = TestBackend::start("web-b", "127.0.0.3").await;
        source.apply(service("web", "127.0.0.100"));
        source.apply(service("web-a", "127.0.0.101"));
        source.apply(service("web-b", "127.0.0.102"));
        source.apply(pod("web-a", a.addr));
        source.apply(pod("web-b", b.addr));
        let controller = Controller::start_with(&source.args()).await;
        let proxy = Proxy::start(
            controller.grpc,
            &["--pod-namespace", NS, "--pod-name", "client-0"],
        )
        .await;
        World {
            source,
            controller,
            a,
            b,
            proxy,
        }
    }

    /// Waits until GETs of `path` are answered by `backend`, `n` in a row.
    async fn until_answered_by(&self, path: &str, backend: &str, n: usize) {
        let mut conn = Http1::connect(self.proxy.outbound).await.unwrap();
        let deadline = Instant::now() + DEADLINE;
        let mut in_a_row = 0;
        let mut last = None;
        while in_a_row < n {
            assert!(
                Instant::now() < deadline,
                "{path} never went to {backend}; last answer {last:?}; proxy log:\n{}",
                self.proxy.process.log()
            );
            match conn.get(WEB, path).await {
                Ok(answer) => {
                    in_a_row =
                        if answer.status == StatusCode::OK && answer.backend() == Some(backend) {
                            in_a_row + 1
                        } else {
                            0
                        };
                    last = Some(answer);
                }
                Err(_) => {
                    in_a_row = 0;
                    conn = Http1::connect(self.proxy.outbound).await.unwrap();
                }
            }
        }
    }
}

/// Sends GETs for `web` on one keep-alive connection until `done`, counting
/// answers by backend; panics on any answer but 200.
async fn get_until(proxy: SocketAddr, done: impl Fn(u64) -> bool) -> (u64, u64) {
    let mut conn = Http1::connect(proxy).await.unwrap();
    let (mut a, mut b) = (0, 0);
    while !done(a + b) {
        let answer = conn.get(WEB, "/").await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        match answer.backend() {
            Some("web-a") => a += 1,
            Some("web-b") => b += 1,
            other => panic!("answered by {other:?}"),
        }
    }
    (a, b)
}

/// Load from `workers` connections until `stop`; each panics on a non-200.
fn background_load(
    proxy: SocketAddr,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinSet<(u64, u64)> {
    let mut load = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let stop = stop.clone();
        load.spawn(async move { get_until(proxy, |_| stop.load(Ordering::Relaxed)).await });
    }
    load
}

async fn split_then_shift(kube: bool) {
    // 10,000 requests split 90/10: web-b's count is binomial (n = 10,000,
    // p = 0.1): mean 1,000, sigma 30; the bound is 5 sigma, 850..=1,150.
    const TOTAL: u64 = 10_000;
    const WORKERS: u64 = 8;
    let w = World::start(kube).await;
    w.source.apply(route("canary", json!({}), split(90, 10)));
    // In use once web-b answers.
    w.until_answered_by("/", "web-b", 1).await;

    let outbound = w.proxy.outbound;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        tasks.spawn(async move { get_until(outbound, |n| n >= TOTAL / WORKERS).await });
    }
    let (mut a, mut b) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (x, y) = joined.unwrap();
        a += x;
        b += y;
    }
    eprintln!("{TOTAL} requests split 90/10: web-a {a}, web-b {b}");
    assert_eq!(a + b, TOTAL);
    assert!((850..=1_150).contains(&b), "web-b got {b} of {TOTAL}");

    // Shifted to 0/100 while keep-alive connections send: no failed request.
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = background_load(outbound, 4, stop.clone());
    w.source.apply(route("canary", json!({}), split(0, 100)));
    w.until_answered_by("/", "web-b", 200).await;
    let a_before = w.a.requests();
    get_until(outbound, |n| n >= 500).await;
    assert_eq!(w.a.requests(), a_before, "weight 0 is never chosen");
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = load.join_next().await {
        joined.unwrap();
    }
}

#[tokio::test]
async fn a_split_holds_and_shifts_live_on_the_manifests_source() {
    split_then_shift(false).await;
}

#[tokio::test]
async fn a_split_holds_and_shifts_live_on_the_kubernetes_source() {
    split_then_shift(true).await;
}

async fn matches_timeouts_and_retries(kube: bool) {
    let w = World::start(kube).await;
    w.source.apply(route(
        "rules",
        json!({}),
        json!([
            {"matches": [{"headers": [{"name": "x-canary", "value": "1"}]},
                         {"path": {"type": "PathPrefix", "value": "/beta"}}],
             "backendRefs": [{"name": "web-b", "port": 80}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/slow"}}],
             "backendRefs": [{"name": "web-a", "port": 80}],
             "timeouts": {"request": "300ms"}},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
             "backendRefs": [{"name": "web-a", "port": 80}]}
        ]),
    ));
    w.until_answered_by("/beta/x", "web-b", 1).await;
    let mut conn = Http1::connect(w.proxy.outbound).await.unwrap();
    assert_eq!(conn.get(WEB, "/").await.unwrap().backend(), Some("web-a"));
    // A path prefix matches whole segments, as Gateway API says.
    assert_eq!(
        conn.get(WEB, "/betamax").await.unwrap().backend(),
        Some("web-a")
    );
    assert_eq!(
        conn.get(WEB, "/beta/max").await.unwrap().backend(),
        Some("web-b")
    );
    let canary = http::Request::get("/other")
        .header("host", WEB)
        .header("x-canary", "1")
        .body(http_body_util::Full::new(hyper::body::Bytes::new()))
        .unwrap();
    assert_eq!(conn.send(canary).await.unwrap().backend(), Some("web-b"));

    // The backend takes 5 s; the route allows 300 ms.
    let started = Instant::now();
    let slow = conn.get(WEB, "/slow").await.unwrap();
    assert_eq!(slow.status, StatusCode::GATEWAY_TIMEOUT, "{slow:?}");
    let error = slow
        .header("l5d-proxy-error")
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("timeout"), "l5d-proxy-error: {error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered at the timeout"
    );

    // Retries: 503s retried twice (Linkerd's annotations), then given up.
    w.source.apply(route(
        "rules",
        json!({"retry.linkerd.io/http": "503", "retry.linkerd.io/limit": "2"}),
        json!([{"backendRefs": [{"name": "web-a", "port": 80}]}]),
    ));
    let mut conn = Http1::connect(w.proxy.outbound).await.unwrap();
    // The new route is in once a flaky request is retried into a 200.
    let deadline = Instant::now() + DEADLINE;
    let mut id = 0;
    loop {
        id += 1;
        let a = conn
            .get(WEB, &format!("/flaky/1/probe-{id}"))
            .await
            .unwrap();
        if a.status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "retries never took effect");
    }
    let before = w.a.requests();
    let failed = conn.get(WEB, "/status/503").await.unwrap();
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        w.a.requests() - before,
        3,
        "one request and two retries, then the 503 is returned"
    );
    // A 500 is not among the conditions: sent once.
    let before = w.a.requests();
    let other = conn.get(WEB, "/status/500").await.unwrap();
    assert_eq!(other.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(w.a.requests() - before, 1);
    let _ = &w.controller;
    let _ = &w.b;
}

#[tokio::test]
async fn matches_timeouts_and_retries_on_the_manifests_source() {
    matches_timeouts_and_retries(false).await;
}

#[tokio::test]
async fn matches_timeouts_and_retries_on_the_kubernetes_source() {
    matches_timeouts_and_retries(true).await;
}

async fn broken_route_while_traffic_flows(kube: bool) {
    let w = World::start(kube).await;
    // Two routes match every request; the older (then by name) wins:
    // `canary` sends everything to web-b, `stable` to web-a.
    w.source.apply(route("canary", json!({}), split(0, 100)));
    w.until_answered_by("/", "web-b", 1).await;
    w.source.apply(route("stable", json!({}), split(100, 0)));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = background_load(w.proxy.outbound, 4, stop.clone());
    w.until_answered_by("/", "web-b", 50).await;

    // Broken on purpose, a backend that does not exist: `canary` is left
    // out, named in the log, and `stable` serves.
    w.source.apply(route(
        "canary",
        json!({}),
        json!([{"backendRefs": [{"name": "web-gone", "port": 80}]}]),
    ));
    w.until_answered_by("/", "web-a", 50).await;
    eventually_logged(&w.controller, "shop/web-gone").await;
    // Fixed: `canary` serves again.
    w.source.apply(route("canary", json!({}), split(0, 100)));
    w.until_answered_by("/", "web-b", 50).await;

    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    while let Some(joined) = load.join_next().await {
        // Each load task panics on any answer but 200.
        let (a, b) = joined.unwrap();
        total += a + b;
    }
    assert!(total > 0, "the load ran");
}

async fn eventually_logged(c: &Controller, needle: &str) {
    support::eventually("the broken route named in the log", || async {
        c.logs_containing("Route left out")
            .iter()
            .any(|l| l.contains(needle))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_route_broken_while_traffic_flows_fails_no_request_on_the_manifests_source() {
    broken_route_while_traffic_flows(false).await;
}

#[tokio::test]
async fn a_route_broken_while_traffic_flows_fails_no_request_on_the_kubernetes_source() {
    broken_route_while_traffic_flows(true).await;
}
