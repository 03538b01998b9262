//! The API server emulation, driven by the real kube client and watcher.

use std::time::Duration;

use ballast_testkit::{ApiServer, Settings};
use futures_util::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Config, ResourceExt};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(10);

fn pod(name: &str, phase: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns1", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase}
    })
}

/// A kube client configured the way a user would: from a kubeconfig file.
async fn client(server: &ApiServer) -> Client {
    Client::try_from(config(server).await).expect("client builds")
}

/// A client that does not retry 429, 503 and 504 answers (kube's default does, up to
/// 15 times, honouring `Retry-After`).
async fn client_without_retries(server: &ApiServer) -> Client {
    let mut config = config(server).await;
    config.default_retry = false;
    Client::try_from(config).expect("client builds")
}

async fn config(server: &ApiServer) -> Config {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = server.write_kubeconfig(dir.path());
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig parses");
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads")
}

type Events = futures_util::stream::BoxStream<'static, Result<Event<Pod>, watcher::Error>>;

/// Runs a watcher in its own task, as a controller would (a watcher only sends its
/// next request when polled), and hands its events over.
fn drive<S>(watcher: S) -> Events
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut watcher = std::pin::pin!(watcher);
        while let Some(event) = watcher.next().await {
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
        .boxed()
}

async fn next<S, T>(stream: &mut S) -> T
where
    S: Stream<Item = T> + Unpin,
{
    match tokio::time::timeout(DEADLINE, stream.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("stream ended"),
        Err(_) => panic!("no item within {DEADLINE:?}"),
    }
}

/// Drives a watcher to the end of its initial list; returns the names it listed.
async fn init<S>(events: &mut S) -> Vec<String>
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    let mut names = Vec::new();
    loop {
        match next(events).await {
            Ok(Event::Init) => names.clear(),
            Ok(Event::InitApply(p)) => names.push(p.name_any()),
            Ok(Event::InitDone) => return names,
            Ok(other) => panic!("unexpected event before InitDone: {other:?}"),
            Err(e) => panic!("watcher error before InitDone: {e}"),
        }
    }
}

fn is_apply(e: &Result<Event<Pod>, watcher::Error>, name: &str) -> bool {
    matches!(e, Ok(Event::Apply(p)) if p.name_any() == name)
}

#[tokio::test]
async fn list_pages_through_continue_tokens_at_one_resource_version() {
    let server = ApiServer::start().await;
    for n in 0..5 {
        server.apply(pod(&format!("p{n}"), "Running"));
    }
    let api: Api<Pod> = Api::namespaced(client(&server).await, "ns1");
    let mut names = Vec::new();
    let mut versions = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = api.list(&lp).await.expect("list page");
        names.extend(page.items.iter().map(|p| p.name_any()));
        versions.push(page.metadata.resource_version.clone());
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
        // A change between pages does not show in the later pages.
        server.apply(pod("p9", "Running"));
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(server.count("list", "pods"), 3);
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
    let lists: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == "list")
        .collect();
    assert_eq!(lists[0].param("limit").as_deref(), Some("2"));
    assert!(lists[0].param("continue").is_none());
    assert!(lists[1].param("continue").is_some());
    assert_eq!(lists[2].namespace.as_deref(), Some("ns1"));

    // A list across namespaces sees the object added meanwhile.
    let all: Api<Pod> = Api::all(client(&server).await);
    let listed = all.list(&ListParams::default()).await.expect("list");
    assert_eq!(listed.items.len(), 6);
    assert_eq!(
        listed.metadata.resource_version,
        Some(server.resource_version())
    );
}

#[tokio::test]
async fn an_expired_continue_token_is_410() {
    let server = ApiServer::start().await;
    for n in 0..3 {
        server.apply(pod(&format!("p{n}"), "Running"));
    }
    let api: Api<Pod> = Api::all(client(&server).await);
    let first = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("list");
    let token = first.metadata.continue_.expect("a continue token");
    server.apply(pod("p0", "Succeeded"));
    server.expire_history();
    let err = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect_err("expired");
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 Status, got {other}"),
    }
}

#[tokio::test]
async fn watcher_lists_in_pages_then_watches_changes() {
    let server = ApiServer::start().await;
    for n in 0..3 {
        server.apply(pod(&format!("p{n}"), "Pending"));
    }
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = drive(watcher::watcher(
        api,
        watcher::Config::default().page_size(2),
    ));
    assert_eq!(init(&mut events).await, ["p0", "p1", "p2"]);
    assert_eq!(server.count("list", "pods"), 2);
    assert!(server.wait_for_watches(1, DEADLINE).await);
    let watch = server
        .requests()
        .into_iter()
        .find(|r| r.verb == "watch")
        .expect("a watch request");
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert!(watch.param("resourceVersion").is_some());

    server.apply(pod("p3", "Pending"));
    assert!(is_apply(&next(&mut events).await, "p3"));
    server.apply(pod("p0", "Running"));
    match next(&mut events).await {
        Ok(Event::Apply(p)) => {
            assert_eq!(p.name_any(), "p0");
            let phase = p.status.and_then(|s| s.phase);
            assert_eq!(phase.as_deref(), Some("Running"));
        }
        other => panic!("expected Apply(p0), got {other:?}"),
    }
    assert!(server.delete("v1", "Pod", "ns1", "p1"));
    assert!(matches!(next(&mut events).await, Ok(Event::Delete(p)) if p.name_any() == "p1"));
    assert_eq!(server.count("list", "pods"), 2, "no relist");
}

#[tokio::test]
async fn a_watch_from_a_compacted_resource_version_gets_410() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    let old = server.resource_version();
    server.apply(pod("p1", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);

    // Still retained: the change after `old` is replayed.
    let mut stream = api
        .watch(&WatchParams::default().disable_bookmarks(), &old)
        .await
        .expect("watch")
        .boxed();
    match next(&mut stream).await {
        Ok(WatchEvent::Added(p)) => assert_eq!(p.name_any(), "p1"),
        other => panic!("expected ADDED p1, got {other:?}"),
    }
    drop(stream);

    server.expire_history();
    let mut stream = api
        .watch(&WatchParams::default().disable_bookmarks(), &old)
        .await
        .expect("watch")
        .boxed();
    match next(&mut stream).await {
        Ok(WatchEvent::Error(s)) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("ends")
        .is_none());
    // The current revision is still watchable.
    let now = server.resource_version();
    let mut stream = api
        .watch(&WatchParams::default().disable_bookmarks(), &now)
        .await
        .expect("watch")
        .boxed();
    server.apply(pod("p2", "Pending"));
    assert!(matches!(next(&mut stream).await, Ok(WatchEvent::Added(p)) if p.name_any() == "p2"));
}

#[tokio::test]
async fn watcher_relists_after_410() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = drive(watcher::watcher(api, watcher::Config::default()));
    assert_eq!(init(&mut events).await, ["p0"]);
    assert!(server.wait_for_watches(1, DEADLINE).await);
    assert_eq!(server.count("list", "pods"), 1);

    // Hold the re-watch until its resourceVersion is compacted away.
    server.stall(true);
    server.cut_watches();
    assert!(server.wait_for_requests("watch", "pods", 2, DEADLINE).await);
    server.apply(pod("p1", "Pending"));
    server.expire_history();
    server.stall(false);

    match next(&mut events).await {
        Err(watcher::Error::WatchError(s)) => assert_eq!(s.code, 410),
        other => panic!("expected the 410 watch error, got {other:?}"),
    }
    let mut names = init(&mut events).await;
    names.sort();
    assert_eq!(names, ["p0", "p1"]);
    assert_eq!(server.count("list", "pods"), 2);
}

#[tokio::test]
async fn cut_watches_make_the_watcher_rewatch_without_relisting() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = drive(watcher::watcher(api, watcher::Config::default()).default_backoff());
    init(&mut events).await;
    assert!(server.wait_for_watches(1, DEADLINE).await);

    server.cut_watches();
    server.apply(pod("p1", "Pending"));
    // Poll the watcher until it has re-watched and seen the change made meanwhile.
    let seen = async {
        loop {
            if is_apply(&next(&mut events).await, "p1") {
                break;
            }
        }
    };
    tokio::time::timeout(DEADLINE, seen).await.expect("p1 seen");
    assert!(server.count("watch", "pods") >= 2);
    assert!(server.wait_for_watches(1, DEADLINE).await);
    assert_eq!(
        server.count("list", "pods"),
        1,
        "a cut watch resumes, no relist"
    );
}

#[tokio::test]
async fn failures_are_answered_with_status_and_recovered_from() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);

    server.fail_with(Some((500, None)));
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (500, "InternalError")),
        other => panic!("expected a 500 Status, got {other:?}"),
    }
    let mut events =
        drive(watcher::watcher(api.clone(), watcher::Config::default()).default_backoff());
    assert!(matches!(next(&mut events).await, Ok(Event::Init)));
    assert!(matches!(
        next(&mut events).await,
        Err(watcher::Error::InitialListFailed(_))
    ));
    assert!(
        server.count("list", "pods") >= 2,
        "faulted requests are counted"
    );
    server.fail_with(None);
    assert_eq!(init(&mut events).await, ["p0"]);
    assert!(server.wait_for_watches(1, DEADLINE).await);
}

#[tokio::test]
async fn retryable_failures_are_retried_by_the_client_and_counted() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    let api: Api<Pod> = Api::namespaced(client_without_retries(&server).await, "ns1");
    server.fail_with(Some((429, Some(3))));
    match api.get("p0").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"))
        }
        other => panic!("expected a 429 Status, got {other:?}"),
    }
    assert_eq!(server.count("get", "pods"), 1);

    // kube's default client retries 503 by itself; every attempt is recorded.
    server.fail_with(Some((503, Some(0))));
    let api: Api<Pod> = Api::namespaced(client(&server).await, "ns1");
    let get = tokio::spawn(async move { api.get("p0").await });
    assert!(server.wait_for_requests("get", "pods", 4, DEADLINE).await);
    server.fail_with(None);
    let got = tokio::time::timeout(DEADLINE, get).await.expect("answered");
    assert!(matches!(got, Ok(Ok(p)) if p.name_any() == "p0"));
}

#[tokio::test]
async fn bookmarks_arrive_at_the_interval_with_the_latest_resource_version() {
    let server = ApiServer::start_with(Settings {
        bookmark_interval: Duration::from_millis(100),
        ..Settings::default()
    })
    .await;
    server.apply(pod("p0", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);
    let rv = server.resource_version();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    // A change to another type advances the bookmark's resourceVersion.
    server.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns1"},
        "spec": {"ports": [{"port": 80}]}
    }));
    let want = server.resource_version();
    let found = async {
        loop {
            match next(&mut stream).await {
                Ok(WatchEvent::Bookmark(b)) if b.metadata.resource_version == want => break,
                Ok(WatchEvent::Bookmark(_)) => {}
                other => panic!("expected only bookmarks, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(DEADLINE, found)
        .await
        .expect("bookmark");
}

#[tokio::test]
async fn watches_end_cleanly_after_timeout_seconds() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::all(client(&server).await);
    let rv = server.resource_version();
    let mut stream = api
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
        .await
        .expect("watch")
        .boxed();
    assert!(server.wait_for_watches(1, DEADLINE).await);
    let ended = tokio::time::timeout(DEADLINE, stream.try_next()).await;
    assert!(matches!(ended, Ok(Ok(None))), "{ended:?}");
    assert!(server.wait_for_watches(0, DEADLINE).await);
}

#[tokio::test]
async fn streaming_lists_get_initial_events_and_the_end_bookmark() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Pending"));
    server.apply(pod("p1", "Pending"));
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = drive(watcher::watcher(
        api,
        watcher::Config::default().streaming_lists(),
    ));
    assert_eq!(init(&mut events).await, ["p0", "p1"]);
    assert_eq!(server.count("list", "pods"), 0);
    server.apply(pod("p2", "Pending"));
    assert!(is_apply(&next(&mut events).await, "p2"));
}

#[tokio::test]
async fn odd_requests_get_status_answers() {
    let server = ApiServer::start().await;
    let client = client_without_retries(&server).await;
    let text = |path: &str| {
        let client = client.clone();
        let req = http::Request::get(path.to_string())
            .body(Vec::new())
            .expect("request");
        async move { client.request_text(req).await }
    };
    for (path, code) in [
        ("/api/v1/nonsense", 404),
        ("/apis/batch/v1/jobs", 404),
        ("/api/v1/pods?limit=x", 400),
        ("/api/v1/pods?continue=zz", 400),
        ("/api/v1/pods?labelSelector=a%20in%20b", 400),
        ("/api/v1/pods?fieldSelector=spec.image%3Dx", 400),
        (
            "/api/v1/pods?resourceVersion=999&resourceVersionMatch=Exact",
            504,
        ),
        ("/api/v1/namespaces/ns1/pods/missing", 404),
    ] {
        match text(path).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, code, "{path}"),
            other => panic!("{path}: expected a {code} Status, got {other:?}"),
        }
    }
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(version.major, "1");
    let groups = text("/apis").await.expect("groups");
    assert!(groups.contains("discovery.k8s.io"));
    assert_eq!(server.count("get", "pods"), 1);
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() {
    let server = ApiServer::start().await;
    server.apply(pod("p0", "Running"));
    let mut other = pod("p1", "Running");
    other["metadata"]["labels"]["app"] = json!("db");
    server.apply(other);
    let api: Api<Pod> = Api::all(client(&server).await);
    let web = api
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list");
    assert_eq!(web.items.len(), 1);
    let named = api
        .list(&ListParams::default().fields("metadata.name=p1"))
        .await
        .expect("list");
    assert_eq!(named.items[0].name_any(), "p1");
}

#[tokio::test]
async fn refused_and_stalled_requests() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::all(client(&server).await);
    api.list(&ListParams::default()).await.expect("list");

    server.refuse_connections(true);
    assert!(api.list(&ListParams::default()).await.is_err());
    server.refuse_connections(false);
    api.list(&ListParams::default())
        .await
        .expect("list after refusing ends");

    server.stall(true);
    let stalled = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    assert!(server.wait_for_requests("list", "pods", 3, DEADLINE).await);
    assert!(!stalled.is_finished());
    server.stall(false);
    let listed = tokio::time::timeout(DEADLINE, stalled)
        .await
        .expect("answered");
    assert!(matches!(listed, Ok(Ok(_))));
}

#[tokio::test]
async fn dropping_the_server_ends_watches() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::all(client(&server).await);
    let rv = server.resource_version();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    assert!(server.wait_for_watches(1, DEADLINE).await);
    drop(server);
    let ended = async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                continue;
            }
        }
    };
    tokio::time::timeout(DEADLINE, ended)
        .await
        .expect("stream ends");
    assert!(api.list(&ListParams::default()).await.is_err());
}

#[tokio::test]
async fn a_watch_that_falls_behind_is_closed_and_the_watcher_resumes() {
    let server = ApiServer::start_with(Settings {
        watch_buffer: 4,
        ..Settings::default()
    })
    .await;
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = drive(watcher::watcher(api, watcher::Config::default()));
    assert!(init(&mut events).await.is_empty());
    assert!(server.wait_for_watches(1, DEADLINE).await);
    // A burst larger than the watch's buffer, with no chance for it to drain.
    for n in 0..10 {
        server.apply(pod(&format!("p{n}"), "Pending"));
    }
    let mut seen = Vec::new();
    while seen.len() < 10 {
        match next(&mut events).await {
            Ok(Event::Apply(p)) => seen.push(p.name_any()),
            other => panic!("expected only applies, got {other:?}"),
        }
    }
    let want: Vec<String> = (0..10).map(|n| format!("p{n}")).collect();
    assert_eq!(seen, want);
    assert!(
        server.count("watch", "pods") >= 2,
        "the lagging watch was closed"
    );
    assert_eq!(
        server.count("list", "pods"),
        1,
        "resumed from history, no relist"
    );
}

#[tokio::test]
async fn cluster_scoped_types_are_served_without_a_namespace() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let server = ApiServer::start().await;
    let stored = server.apply(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop", "namespace": "ignored"}
    }));
    assert!(stored["metadata"].get("namespace").is_none(), "{stored}");
    server.apply(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    }));
    server.apply(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {}}
    }));
    let client = client(&server).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .expect("namespaces list")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(names, ["shop"]);
    assert!(namespaces.get("shop").await.is_ok());
    assert!(namespaces
        .get_opt("nope")
        .await
        .expect("404 is none")
        .is_none());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles.get("reader").await.expect("clusterrole get");
    assert_eq!(role.rules.map(|r| r.len()), Some(1));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert!(server.delete("rbac.authorization.k8s.io/v1", "ClusterRole", "", "reader"));
    assert!(roles.get_opt("reader").await.expect("get").is_none());
    // Every answer carries the server's clock, as the real API server's do.
    let res = client
        .send(
            http::Request::get("/version")
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("version");
    assert!(res.headers().contains_key(http::header::DATE));
}
