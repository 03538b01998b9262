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

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected a Status answer, got {other:?}"),
    }
}

#[tokio::test]
async fn writes_through_the_kube_client_create_replace_patch_and_delete() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    let server = ApiServer::start().await;
    let client = client_without_retries(&server).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "ns1");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "c1"}, "data": {"a": "1"}
    }))
    .expect("configmap");
    let created = maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    assert_eq!(created.metadata.namespace.as_deref(), Some("ns1"));
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());

    let again = api_status(
        maps.create(&PostParams::default(), &cm)
            .await
            .expect_err("twice"),
    );
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
    assert!(
        again.message.contains("configmaps \"c1\" already exists"),
        "{}",
        again.message
    );

    // Replace at the read resourceVersion works once; the stale copy conflicts.
    let mut changed = created.clone();
    changed.data = Some([("a".to_string(), "2".to_string())].into());
    let replaced = maps
        .replace("c1", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_eq!(
        replaced
            .data
            .as_ref()
            .and_then(|d| d.get("a"))
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    let stale = api_status(
        maps.replace("c1", &PostParams::default(), &changed)
            .await
            .expect_err("stale"),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));

    let merged = maps
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "3"}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(merged.data.as_ref().map(|d| d.len()), Some(2));
    let json_patched = maps
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/data/a"}]))
                    .expect("patch"),
            ),
        )
        .await
        .expect("json patch");
    assert_eq!(json_patched.data.as_ref().map(|d| d.len()), Some(1));
    let bad = api_status(
        maps.patch(
            "c1",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/data/zz"}]))
                    .expect("patch"),
            ),
        )
        .await
        .expect_err("cannot apply"),
    );
    assert_eq!(bad.code, 422);

    // Server-side apply creates, then merges the given fields.
    let apply = PatchParams::apply("testkit").force();
    let applied = maps
        .patch(
            "c2",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}, "data": {"x": "1"}})),
        )
        .await
        .expect("apply creates");
    assert_eq!(applied.metadata.name.as_deref(), Some("c2"));
    let applied = maps
        .patch(
            "c2",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}, "data": {"y": "2"}})),
        )
        .await
        .expect("apply merges");
    assert_eq!(applied.data.as_ref().map(|d| d.len()), Some(2));

    // A dry run answers as the write would and stores nothing.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut c3 = cm.clone();
    c3.metadata.name = Some("c3".into());
    let would = maps.create(&dry, &c3).await.expect("dry create");
    assert_eq!(would.metadata.name.as_deref(), Some("c3"));
    assert!(server.get("configmaps", "ns1", "c3").is_none());
    maps.delete("c2", &DeleteParams::default().dry_run())
        .await
        .expect("dry delete");
    assert!(server.get("configmaps", "ns1", "c2").is_some());

    maps.delete("c1", &DeleteParams::default())
        .await
        .expect("delete");
    let gone = api_status(maps.get("c1").await.expect_err("deleted"));
    assert_eq!((gone.code, gone.reason.as_str()), (404, "NotFound"));
    let gone = api_status(
        maps.delete("c1", &DeleteParams::default())
            .await
            .expect_err("twice"),
    );
    assert_eq!(gone.code, 404);
    assert_eq!(server.count("create", "configmaps"), 3);
}

#[tokio::test]
async fn pods_are_deleted_gracefully_and_status_is_a_subresource() {
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    let server = ApiServer::start().await;
    let client = client_without_retries(&server).await;
    let pods: Api<Pod> = Api::namespaced(client, "ns1");
    let mut p: Pod = serde_json::from_value(pod("p1", "Running")).expect("pod");
    p.spec.as_mut().expect("spec").node_name = Some("node-1".into());
    let created = pods
        .create(&PostParams::default(), &p)
        .await
        .expect("create");
    // Create resets status to what the API server starts a Pod with.
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );

    let status = pods
        .patch_status(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.0.0.9"}, "spec": {"nodeName": "elsewhere"}})),
        )
        .await
        .expect("status patch");
    assert_eq!(
        status.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(
        status.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-1")
    );
    // A write of the object keeps the stored status.
    let relabelled = pods
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .expect("patch");
    assert_eq!(
        relabelled.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );

    let marked = pods
        .delete("p1", &DeleteParams::default().grace_period(5))
        .await
        .expect("delete");
    let marked = marked.left().expect("the pod is kept while it terminates");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(5));
    assert!(pods.get("p1").await.is_ok(), "kept for the kubelet");
    server.delete_now("pods", "ns1", "p1").expect("removed");
    assert_eq!(
        api_status(pods.get("p1").await.expect_err("gone")).code,
        404
    );

    // An unscheduled Pod, or grace 0, goes at once.
    let q: Pod = serde_json::from_value(pod("p2", "Pending")).expect("pod");
    pods.create(&PostParams::default(), &q)
        .await
        .expect("create");
    pods.delete("p2", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(server.get("pods", "ns1", "p2").is_none());
}

#[tokio::test]
async fn malformed_writes_get_status_answers() {
    let server = ApiServer::start().await;
    let client = client_without_retries(&server).await;
    let send = |method: &str, path: &str, ct: &str, body: Vec<u8>| {
        let client = client.clone();
        let req = http::Request::builder()
            .method(method)
            .uri(path.to_string())
            .header("content-type", ct)
            .body(body)
            .expect("request");
        async move { client.request_text(req).await }
    };
    let big = vec![b' '; ballast_testkit::api_server::MAX_BODY + 1];
    let cases: Vec<(&str, &str, &str, Vec<u8>, u16)> = vec![
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            b"{".to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            b"[]".to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            br#"{"metadata":{}}"#.to_vec(),
            422,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            br#"{"kind":"Secret","metadata":{"name":"a"}}"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            br#"{"metadata":{"name":"a","namespace":"other"}}"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            "application/json",
            big,
            413,
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns1/configmaps/missing",
            "application/json",
            br#"{"metadata":{"name":"missing"}}"#.to_vec(),
            404,
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns1/configmaps/a",
            "application/json",
            br#"{"metadata":{"name":"b"}}"#.to_vec(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns1/configmaps/a",
            "text/plain",
            b"{}".to_vec(),
            415,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns1/configmaps/missing",
            "application/merge-patch+json",
            b"{}".to_vec(),
            404,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/configmaps/missing",
            "application/json",
            b"".to_vec(),
            404,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/configmaps/a?gracePeriodSeconds=x",
            "application/json",
            b"".to_vec(),
            400,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/configmaps/a",
            "application/json",
            b"{\"propagationPolicy\":\"Sideways\"}".to_vec(),
            400,
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns1/configmaps/a/status",
            "application/json",
            b"{}".to_vec(),
            404,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/configmaps/a",
            "application/json",
            b"{}".to_vec(),
            405,
        ),
    ];
    for (method, path, ct, body, code) in cases {
        match send(method, path, ct, body).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, code, "{method} {path}: {}", s.message);
                assert_eq!(
                    s.status,
                    Some(kube::core::response::StatusSummary::Failure),
                    "{method} {path}"
                );
                assert!(
                    !s.reason.is_empty() && !s.message.is_empty(),
                    "{method} {path}"
                );
            }
            other => panic!("{method} {path}: expected a {code} Status, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn services_get_cluster_ips_and_namespaces_their_name_label() {
    let server = ApiServer::start().await;
    let svc = |name: &str, ip: Option<&str>| {
        let mut s = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ns1"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}});
        if let Some(ip) = ip {
            s["spec"]["clusterIP"] = json!(ip);
        }
        s
    };
    let a = server.create(svc("a", None)).await.expect("create");
    let b = server.create(svc("b", None)).await.expect("create");
    let h = server.create(svc("h", Some("None"))).await.expect("create");
    let ip = |v: &serde_json::Value| v["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
    assert!(
        ip(&a).starts_with("10.96.") && ip(&a) != "10.96.0.1",
        "{}",
        ip(&a)
    );
    assert_ne!(ip(&a), ip(&b));
    assert_eq!(ip(&h), "None");
    // Defaulted as the API server does.
    assert_eq!(a["spec"]["type"], "ClusterIP");
    assert_eq!(
        a["spec"]["ports"][0],
        json!({"port": 80, "protocol": "TCP", "targetPort": 80})
    );
    // A replace without the field keeps the allocated address.
    let mut replaced = svc("a", None);
    replaced["metadata"]["labels"] = json!({"x": "y"});
    assert_eq!(ip(&server.update(replaced).await.expect("update")), ip(&a));

    let ns = server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .await
        .expect("namespace");
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "shop"
    );
    assert_eq!(ns["status"]["phase"], "Active");
    // Deleting it leaves it Terminating for the namespace controller.
    let t = server
        .delete_with("namespaces", "", "shop", &Default::default())
        .expect("delete");
    assert_eq!(t["status"]["phase"], "Terminating");
    let refused = server
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "shop"}}))
        .await
        .expect_err("terminating");
    assert_eq!(refused.code, 403);
    // Generation moves with the spec only.
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns1"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}}}});
    let d1 = server.create(d.clone()).await.expect("create");
    assert_eq!(d1["metadata"]["generation"], 1);
    assert_eq!(
        d1["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
    );
    let d2 = server
        .patch_merge(
            "deployments",
            "ns1",
            "d",
            json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await
        .expect("patch");
    assert_eq!(d2["metadata"]["generation"], 1);
    let d3 = server
        .patch_merge("deployments", "ns1", "d", json!({"spec": {"replicas": 2}}))
        .await
        .expect("patch");
    assert_eq!(d3["metadata"]["generation"], 2);
}

/// Gateway API's and Linkerd's HTTPRoute share the plural `httproutes`: each
/// is served at its own group's path and holds only its own objects.
#[tokio::test]
async fn both_groups_httproutes_are_served_apart() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let server = ApiServer::start().await;
    let client = client(&server).await;
    let api = |group: &str, version: &str| {
        let gvk = GroupVersionKind::gvk(group, version, "HTTPRoute");
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            "ns1",
            &ApiResource::from_gvk_with_plural(&gvk, "httproutes"),
        )
    };
    let (gateway, linkerd) = (
        api("gateway.networking.k8s.io", "v1"),
        api("policy.linkerd.io", "v1beta3"),
    );
    for (version, name) in [
        ("gateway.networking.k8s.io/v1", "gw-route"),
        ("policy.linkerd.io/v1beta3", "l5d-route"),
    ] {
        server
            .create(json!({"apiVersion": version, "kind": "HTTPRoute",
                           "metadata": {"name": name, "namespace": "ns1"}, "spec": {}}))
            .await
            .expect("created");
    }
    let names = |list: kube::core::ObjectList<DynamicObject>| -> Vec<String> {
        list.items.iter().map(|o| o.name_any()).collect()
    };
    let lp = ListParams::default();
    assert_eq!(names(gateway.list(&lp).await.unwrap()), ["gw-route"]);
    assert_eq!(names(linkerd.list(&lp).await.unwrap()), ["l5d-route"]);
    assert_eq!(
        linkerd.get("l5d-route").await.unwrap().name_any(),
        "l5d-route"
    );
    assert!(gateway.get("l5d-route").await.is_err());
}
