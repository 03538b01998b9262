//! The Kubernetes source against testkit's API server emulation, counting
//! the requests it costs: a start, cut watches, 410 Gone, and a failing
//! API server.

use ballast_source_kube::{self as kube_source, BackoffConfig, KubeConfig, KubeMetrics};
use ballast_store::{
    index::{Index, IndexConfig},
    metrics::{KindLabel, Metrics},
    store::Store,
};
use ballast_testkit::ApiServer;
use serde_json::{json, Value};
use std::{sync::Arc, time::Duration};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(10);
const KINDS: [&str; 3] = ["pods", "services", "endpointslices"];

fn pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "ports": [{"containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    })
}

fn slice() -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "ns", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"port": 8080}],
        "endpoints": [{"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "p0", "namespace": "ns"}}],
    })
}

struct Running {
    store: Arc<Store>,
    metrics: KubeMetrics,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), kube_source::KubeError>>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }

    fn pods(&self) -> usize {
        self.store.with_index(|i| i.sizes().pods)
    }

    fn counter(&self, family: &str, kind: &str) -> u64 {
        let label = KindLabel { kind: kind.into() };
        match family {
            "relists" => self.metrics.kube_relists_total.get_or_create(&label).get(),
            "restarts" => self
                .metrics
                .kube_watch_restarts_total
                .get_or_create(&label)
                .get(),
            _ => unreachable!(),
        }
    }
}

fn config() -> KubeConfig {
    KubeConfig {
        page_size: 2,
        backoff: BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            ..BackoffConfig::default()
        },
        ..KubeConfig::default()
    }
}

async fn start(api: &ApiServer, config: KubeConfig) -> Running {
    let metrics = KubeMetrics::default();
    let kube_config = kube::Config::new(api.url().parse().unwrap());
    let client = kube_source::client_from_config(kube_config, &config, &metrics).unwrap();
    let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(kube_source::run(
        config,
        client,
        store.clone(),
        metrics.clone(),
        async {
            let _ = rx.await;
        },
    ));
    Running {
        store,
        metrics,
        stop: Some(tx),
        task,
    }
}

async fn cluster() -> ApiServer {
    let api = ApiServer::start().await;
    for i in 0..5 {
        api.apply(pod(&format!("p{i}"), &format!("10.0.0.{}", i + 1)));
    }
    api.apply(service());
    api.apply(slice());
    api
}

/// Watches the source holds open on testkit: one per watched kind that
/// testkit serves (it serves neither Namespaces nor Linkerd's own HTTPRoute,
/// which the source then takes as not installed).
fn served_watches() -> usize {
    ballast_source_kube::WATCHED_RESOURCES
        .iter()
        .filter(|(group, _, plural)| ballast_testkit::serves(group, plural))
        .count()
}

async fn ready(api: &ApiServer, run: &Running) {
    tokio::time::timeout(WAIT, run.store.wait_ready())
        .await
        .expect("ready");
    assert!(
        api.wait_for_watches(served_watches(), WAIT).await,
        "a watch open per served kind"
    );
}

#[tokio::test]
async fn a_start_costs_one_list_per_page_and_one_watch_per_kind() {
    let api = cluster().await;
    let run = start(&api, config()).await;
    ready(&api, &run).await;
    // 5 pods at 2 a page: 3 pages.
    assert_eq!(api.count("list", "pods"), 3);
    assert_eq!(api.count("list", "services"), 1);
    assert_eq!(api.count("list", "endpointslices"), 1);
    for kind in KINDS {
        assert_eq!(api.count("watch", kind), 1, "{kind}");
    }
    assert_eq!(run.pods(), 5);
    // Pages after the first continue one consistent read.
    let lists: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.verb == "list" && r.resource.as_deref() == Some("pods"))
        .collect();
    assert!(lists[0].param("continue").is_none());
    assert!(lists[1].param("continue").is_some() && lists[2].param("continue").is_some());
    run.stop().await;
}

#[tokio::test]
async fn cut_watches_resume_without_listing() {
    let api = cluster().await;
    let run = start(&api, config()).await;
    ready(&api, &run).await;
    const CUTS: usize = 100;
    for n in 1..=CUTS {
        // A watch cut sooner than the shortest backoff delay (50 ms here)
        // after it opened is reopened on the backoff schedule instead of at
        // once; let each one live past that, so the cuts are not paced.
        tokio::time::sleep(Duration::from_millis(60)).await;
        api.cut_watches();
        let reopened = api
            .wait_until(WAIT, |a| {
                KINDS.iter().all(|k| a.count("watch", k) == n + 1)
                    && a.open_watches() == served_watches()
            })
            .await;
        assert!(reopened, "cut {n}: watches not reopened");
    }
    for kind in KINDS {
        assert_eq!(api.count("watch", kind), CUTS + 1, "{kind}");
        assert_eq!(run.counter("restarts", kind), CUTS as u64, "{kind}");
        assert_eq!(run.counter("relists", kind), 0, "{kind}");
    }
    assert_eq!(api.count("list", "pods"), 3, "no new LIST");
    assert_eq!(api.count("list", "services"), 1);
    assert_eq!(api.count("list", "endpointslices"), 1);
    // Still in step: a change made now arrives.
    api.apply(pod("p9", "10.0.0.9"));
    let arrived = async {
        while run.pods() != 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, arrived)
        .await
        .expect("p9 applied");
    run.stop().await;
}

#[tokio::test]
async fn gone_relists_each_kind_once() {
    let api = cluster().await;
    let run = start(&api, config()).await;
    ready(&api, &run).await;
    let lists_before: Vec<usize> = KINDS.iter().map(|k| api.count("list", k)).collect();
    // Away while the cluster changes and history is compacted: every kind's
    // resourceVersion is now expired.
    api.refuse_connections(true);
    assert!(api.wait_for_watches(0, WAIT).await);
    assert!(api.delete("v1", "Pod", "ns", "p4"));
    api.apply(pod("p5", "10.0.0.6"));
    api.expire_history();
    api.refuse_connections(false);

    let relisted = api
        .wait_until(WAIT, |a| {
            KINDS
                .iter()
                .zip(&lists_before)
                .all(|(k, before)| a.count("list", k) > *before)
                && a.open_watches() == served_watches()
        })
        .await;
    assert!(relisted, "{:#?}", api.requests());
    // One relist per kind (pods: 5 objects at 2 a page, 3 pages).
    assert_eq!(api.count("list", "pods"), lists_before[0] + 3);
    assert_eq!(api.count("list", "services"), lists_before[1] + 1);
    assert_eq!(api.count("list", "endpointslices"), lists_before[2] + 1);
    for kind in KINDS {
        assert_eq!(run.counter("relists", kind), 1, "{kind}");
    }
    let converged = async {
        loop {
            let keys = run.store.with_index(|i| i.sizes().pods);
            if keys == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, converged)
        .await
        .expect("p4 gone, p5 in");
    run.stop().await;
}

#[tokio::test]
async fn server_errors_are_retried_on_the_schedule_and_state_is_kept() {
    let api = cluster().await;
    let config = config();
    let schedule = config.backoff.clone();
    let run = start(&api, config).await;
    ready(&api, &run).await;
    let watches_before: Vec<usize> = KINDS.iter().map(|k| api.count("watch", k)).collect();

    api.fail_with(Some((500, None)));
    api.cut_watches();
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    // Every retry is a WATCH from the last resourceVersion; the first comes
    // at once after the cut, the rest on the schedule.
    let bound = schedule.max_attempts_within(window) as usize;
    for (kind, before) in KINDS.iter().zip(&watches_before) {
        let sent = api.count("watch", kind) - before;
        assert!(
            sent >= 3 && sent <= bound,
            "{kind}: {sent} requests, bound {bound}"
        );
        assert_eq!(api.count("list", kind), if *kind == "pods" { 3 } else { 1 });
    }
    // The last state is served throughout.
    assert!(run.store.is_ready());
    assert_eq!(run.pods(), 5);
    assert!(run.metrics.kube_last_event.age("pods").unwrap() >= Duration::from_secs(3));

    api.fail_with(None);
    api.apply(pod("p9", "10.0.0.9"));
    let converged = async {
        while run.pods() != 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, converged)
        .await
        .expect("converged after the errors");
    run.stop().await;
}

/// What the store held, each time it changed: (Servers, AuthorizationPolicies).
#[derive(Default)]
struct PolicySeen(std::sync::Mutex<Vec<(usize, usize, tokio::time::Instant)>>);

impl ballast_store::store::Observer for PolicySeen {
    fn changed(&self, index: &Index, _: &ballast_store::index::Changes) {
        use ballast_store::resource::Kind;
        self.0.lock().unwrap().push((
            index.len(Kind::Server),
            index.len(Kind::AuthorizationPolicy),
            tokio::time::Instant::now(),
        ));
    }
}

fn server_and_its_authorization() -> (Value, Value) {
    (
        json!({"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
               "metadata": {"name": "web-http", "namespace": "ns"},
               "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                        "port": 8080, "proxyProtocol": "HTTP/1"}}),
        json!({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
               "metadata": {"name": "web-from-all", "namespace": "ns"},
               "spec": {"targetRef": {"group": "policy.linkerd.io", "kind": "Server",
                                      "name": "web-http"},
                        "requiredAuthenticationRefs": [{
                            "group": "policy.linkerd.io", "kind": "NetworkAuthentication",
                            "name": "all"}]}}),
    )
}

async fn wait_for_a_server(run: &Running) {
    let until = tokio::time::Instant::now() + WAIT;
    while run
        .store
        .with_index(|i| i.len(ballast_store::resource::Kind::Server))
        != 1
    {
        assert!(
            tokio::time::Instant::now() < until,
            "the Server never applied"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An authorization read after its Server (here: created after it, as on a
/// watch that lags) is still applied first: the Server waits the settle.
#[tokio::test]
async fn a_server_waits_for_authorizations_read_just_after_it() {
    let api = cluster().await;
    let settle = Duration::from_millis(1500);
    let run = start(
        &api,
        KubeConfig {
            server_settle: settle,
            ..config()
        },
    )
    .await;
    ready(&api, &run).await;
    let seen = Arc::new(PolicySeen::default());
    run.store.observe(seen.clone());
    let (server, authz) = server_and_its_authorization();
    let created = tokio::time::Instant::now();
    api.apply(server);
    // Held: the Server is counted as settling, not in the store.
    let label = KindLabel {
        kind: "servers".into(),
    };
    let until = tokio::time::Instant::now() + WAIT;
    while run
        .metrics
        .kube_settling_objects
        .get_or_create(&label)
        .get()
        != 1
    {
        assert!(
            tokio::time::Instant::now() < until,
            "the Server is not held"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    api.apply(authz);
    wait_for_a_server(&run).await;
    let seen = seen.0.lock().unwrap().clone();
    let first = seen
        .iter()
        .find(|(servers, _, _)| *servers == 1)
        .expect("a change with the Server");
    assert_eq!(
        first.1, 1,
        "the Server came before its authorization: {seen:?}"
    );
    assert!(
        first.2 >= created + settle,
        "the Server applied before its settle ({:?})",
        first.2 - created
    );
    assert_eq!(
        run.metrics
            .kube_settling_objects
            .get_or_create(&label)
            .get(),
        0
    );
    run.stop().await;
}

/// With no settle, a Server is applied as it is read.
#[tokio::test]
async fn no_settle_applies_a_server_as_it_arrives() {
    let api = cluster().await;
    let run = start(
        &api,
        KubeConfig {
            server_settle: Duration::ZERO,
            ..config()
        },
    )
    .await;
    ready(&api, &run).await;
    let (server, _) = server_and_its_authorization();
    api.apply(server);
    wait_for_a_server(&run).await;
    assert_eq!(
        run.store
            .with_index(|i| i.len(ballast_store::resource::Kind::AuthorizationPolicy)),
        0
    );
    run.stop().await;
}
