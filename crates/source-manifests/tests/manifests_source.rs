//! The manifests-directory source, against a real directory: what it loads,
//! how it follows edits, and what it does with bad files.

use ballast_source_manifests::{
    self as manifests, ManifestsConfig, ManifestsError, ManifestsMetrics,
};
use ballast_store::{
    index::{Index, IndexConfig},
    metrics::Metrics,
    resource::{ObjectKey, Resource},
    store::Store,
};
use ballast_testkit::eventually_sync;
use std::{fs, path::Path, sync::Arc, time::Duration};
use tokio::{sync::oneshot, task::JoinHandle};

/// Changes must show within this long.
const CHANGE_DEADLINE: Duration = Duration::from_secs(1);

fn pod(ns: &str, name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: {name}\n\
         spec:\n  containers:\n  - name: main\n    ports:\n    - containerPort: 8080\n\
         status:\n  phase: Running\n  podIP: {ip}\n"
    )
}

fn service(ns: &str, name: &str, port: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  clusterIP: 10.96.0.10\n  selector:\n    app: {name}\n  ports:\n  - port: {port}\n"
    )
}

fn pod_ip(store: &Store, ns: &str, name: &str) -> Option<String> {
    store.with_index(|i| {
        i.pod(&ObjectKey::new(ns, name))
            .and_then(|p| p.ips.first())
            .map(|ip| ip.to_string())
    })
}

fn counts(store: &Store) -> (usize, usize, usize) {
    let s = store.with_index(|i| i.sizes());
    (s.pods, s.services, s.endpoint_slices)
}

/// Writes as careful tools do: a temporary file, then a rename over the
/// target.
fn write_atomic(path: &Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

struct Source {
    store: Arc<Store>,
    counters: ManifestsMetrics,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ManifestsError>>,
}

impl Source {
    async fn start(dir: &Path) -> Self {
        Self::start_with(ManifestsConfig::new(dir)).await
    }

    async fn start_with(config: ManifestsConfig) -> Self {
        let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
        let counters = ManifestsMetrics::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(manifests::run(
            config,
            store.clone(),
            counters.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        let ready = store.clone();
        eventually_sync("the first load", Duration::from_secs(5), || {
            assert!(
                !task.is_finished(),
                "the source stopped during its first load"
            );
            ready.is_ready()
        })
        .await;
        Self {
            store,
            counters,
            stop: Some(stop),
            task,
        }
    }

    fn metrics(&self) -> (u64, i64, u64) {
        let m = &self.counters;
        (
            m.reload_errors_total.get(),
            m.manifest_files_invalid.get(),
            m.reloads_total.get(),
        )
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .expect("the source stops when shutdown resolves")
            .expect("the source task does not panic");
        assert!(result.is_ok(), "{result:?}");
    }
}

#[tokio::test]
async fn initial_load_reads_yaml_json_and_lists_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(
        d.join("web.yaml"),
        format!(
            "---\n{}---\n{}---\n",
            pod("shop", "web-1", "10.0.0.1"),
            service("shop", "web", 80)
        ),
    )
    .unwrap();
    fs::write(
        d.join("cart.json"),
        r#"{"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "cart-1", "namespace": "shop", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"containers": [{"name": "cart"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.2", "conditions": [{"type": "Ready", "status": "True"}]}}"#,
    )
    .unwrap();
    fs::create_dir(d.join("more")).unwrap();
    // As `kubectl get pods -o yaml` prints several objects.
    let list = format!(
        "apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n{}{}",
        indent_item(&pod("db", "db-1", "10.0.0.3")),
        indent_item(&pod("db", "db-2", "10.0.0.4")),
    );
    fs::write(d.join("more/db.yml"), list).unwrap();
    // A typed list as the API server returns it: items without apiVersion/kind.
    fs::write(
        d.join("more/podlist.json"),
        r#"{"apiVersion": "v1", "kind": "PodList", "metadata": {},
            "items": [{"metadata": {"name": "raw-1", "namespace": "db"}, "status": {"podIP": "10.0.0.5"}}]}"#,
    )
    .unwrap();
    // Not read: hidden, editor leftovers, other extensions.
    fs::create_dir(d.join(".git")).unwrap();
    fs::write(d.join(".git/x.yaml"), pod("shop", "hidden", "10.0.9.1")).unwrap();
    fs::write(d.join("web.yaml~"), pod("shop", "backup", "10.0.9.2")).unwrap();
    fs::write(d.join(".web.yaml.swp"), "binary junk").unwrap();
    fs::write(d.join("notes.txt"), "not a manifest").unwrap();

    let loaded = manifests::load(&ManifestsConfig::new(d)).unwrap();
    assert_eq!(loaded.problems, Vec::<String>::new());
    assert_eq!((loaded.files, loaded.invalid_files), (4, 0));
    let names: Vec<String> = loaded.objects.iter().map(|r| r.key().to_string()).collect();
    assert_eq!(
        names,
        [
            "db/db-1",
            "db/db-2",
            "db/raw-1",
            "shop/cart-1",
            "shop/web-1",
            "shop/web"
        ]
    );

    let source = Source::start(d).await;
    assert_eq!(counts(&source.store), (5, 1, 0));
    assert_eq!(
        pod_ip(&source.store, "shop", "web-1").as_deref(),
        Some("10.0.0.1")
    );
    assert_eq!(
        pod_ip(&source.store, "shop", "cart-1").as_deref(),
        Some("10.0.0.2")
    );
    assert_eq!(
        pod_ip(&source.store, "db", "db-2").as_deref(),
        Some("10.0.0.4")
    );
    assert_eq!(
        pod_ip(&source.store, "db", "raw-1").as_deref(),
        Some("10.0.0.5")
    );
    assert_eq!(pod_ip(&source.store, "shop", "hidden"), None);
    assert_eq!(pod_ip(&source.store, "shop", "backup"), None);
    assert_eq!(source.metrics(), (0, 0, 0));
    source.stop().await;
}

fn indent_item(object: &str) -> String {
    let mut out = String::new();
    for (i, line) in object.lines().enumerate() {
        out.push_str(if i == 0 { "- " } else { "  " });
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[tokio::test]
async fn an_edit_in_place_changes_a_pod_ip() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, pod("shop", "web-1", "10.0.0.1")).unwrap();
    let source = Source::start(dir.path()).await;
    assert_eq!(
        pod_ip(&source.store, "shop", "web-1").as_deref(),
        Some("10.0.0.1")
    );

    // Same length, written in place: only the content tells it changed.
    fs::write(&file, pod("shop", "web-1", "10.0.0.2")).unwrap();
    let store = source.store.clone();
    eventually_sync("the new pod IP", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2")
    })
    .await;
    let (errors, invalid, reloads) = source.metrics();
    assert_eq!((errors, invalid), (0, 0));
    assert!(reloads >= 1, "reloads_total counts the re-read");
    source.stop().await;
}

#[tokio::test]
async fn new_files_and_new_directories_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::start(dir.path()).await;
    assert_eq!(counts(&source.store), (0, 0, 0));
    let store = source.store.clone();

    fs::write(dir.path().join("a.yaml"), pod("ns", "a", "10.0.1.1")).unwrap();
    eventually_sync("a new file", CHANGE_DEADLINE, || {
        pod_ip(&store, "ns", "a").is_some()
    })
    .await;

    fs::create_dir_all(dir.path().join("team/deep")).unwrap();
    fs::write(
        dir.path().join("team/deep/b.yaml"),
        pod("ns", "b", "10.0.1.2"),
    )
    .unwrap();
    eventually_sync("a file in a new directory", CHANGE_DEADLINE, || {
        pod_ip(&store, "ns", "b").is_some()
    })
    .await;

    // A directory made elsewhere and moved in whole.
    let outside = tempfile::tempdir_in(dir.path().parent().unwrap()).unwrap();
    fs::create_dir(outside.path().join("moved")).unwrap();
    fs::write(
        outside.path().join("moved/c.json"),
        pod_json("ns", "c", "10.0.1.3"),
    )
    .unwrap();
    fs::rename(outside.path().join("moved"), dir.path().join("moved")).unwrap();
    eventually_sync("a directory moved in", CHANGE_DEADLINE, || {
        pod_ip(&store, "ns", "c").is_some()
    })
    .await;
    assert_eq!(source.metrics().0, 0);
    source.stop().await;
}

fn pod_json(ns: &str, name: &str, ip: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "namespace": "{ns}"}},
            "status": {{"phase": "Running", "podIP": "{ip}"}}}}"#
    )
}

#[tokio::test]
async fn deleting_a_file_removes_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("web.yaml"),
        format!(
            "{}---\n{}",
            pod("shop", "web-1", "10.0.0.1"),
            service("shop", "web", 80)
        ),
    )
    .unwrap();
    fs::write(
        dir.path().join("cart.yaml"),
        pod("shop", "cart-1", "10.0.0.2"),
    )
    .unwrap();
    let source = Source::start(dir.path()).await;
    assert_eq!(counts(&source.store), (2, 1, 0));

    fs::remove_file(dir.path().join("web.yaml")).unwrap();
    let store = source.store.clone();
    eventually_sync("web.yaml's pod and service gone", CHANGE_DEADLINE, || {
        counts(&store) == (1, 0, 0)
    })
    .await;
    assert!(pod_ip(&store, "shop", "cart-1").is_some());

    // A whole directory removed.
    fs::create_dir(dir.path().join("sub")).unwrap();
    fs::write(dir.path().join("sub/x.yaml"), pod("shop", "x", "10.0.0.3")).unwrap();
    eventually_sync("sub/x.yaml loaded", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "x").is_some()
    })
    .await;
    fs::remove_dir_all(dir.path().join("sub")).unwrap();
    eventually_sync("sub/x.yaml's pod gone", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "x").is_none()
    })
    .await;
    source.stop().await;
}

#[tokio::test]
async fn an_invalid_file_keeps_its_last_good_objects_until_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(
        &file,
        format!(
            "{}---\n{}",
            pod("shop", "web-1", "10.0.0.1"),
            service("shop", "web", 80)
        ),
    )
    .unwrap();
    let source = Source::start(dir.path()).await;
    assert_eq!(counts(&source.store), (1, 1, 0));
    let store = source.store.clone();
    let counters = source.counters.clone();

    // Broken YAML, with a change to the pod that must not be applied.
    fs::write(
        &file,
        format!("{}---\nkind: [unclosed\n", pod("shop", "web-1", "10.0.0.9")),
    )
    .unwrap();
    eventually_sync("the error counted", CHANGE_DEADLINE, || {
        counters.reload_errors_total.get() == 1 && counters.manifest_files_invalid.get() == 1
    })
    .await;
    assert_eq!(counts(&store), (1, 1, 0));
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));

    // Valid YAML, invalid object: the same policy.
    fs::write(
        &file,
        format!(
            "{}---\n{}",
            pod("shop", "web-1", "10.0.0.9"),
            service("shop", "web", 70000)
        ),
    )
    .unwrap();
    eventually_sync("the second error counted", CHANGE_DEADLINE, || {
        counters.reload_errors_total.get() == 2
    })
    .await;
    assert_eq!(counters.manifest_files_invalid.get(), 1);
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));
    let loaded = manifests::load(&ManifestsConfig::new(dir.path())).unwrap();
    assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
    let problem = &loaded.problems[0];
    assert!(
        problem.ends_with(
            "web.yaml: document 2 at line 17 (Service shop/web): field spec.ports[0].port: \
             port must be between 1 and 65535"
        ),
        "{problem}"
    );

    // Fixed: the new content is applied, the service now without its old port.
    fs::write(
        &file,
        format!(
            "{}---\n{}",
            pod("shop", "web-1", "10.0.0.2"),
            service("shop", "web", 81)
        ),
    )
    .unwrap();
    eventually_sync("the fixed content applied", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2")
            && counters.manifest_files_invalid.get() == 0
    })
    .await;
    let port = store.with_index(|i| {
        i.service(&ObjectKey::new("shop", "web"))
            .map(|s| s.ports[0].port)
    });
    assert_eq!(port, Some(81));
    assert_eq!(counters.reload_errors_total.get(), 2);
    source.stop().await;
}

#[tokio::test]
async fn an_object_without_a_name_is_reported_and_the_rest_served() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("good.yaml"),
        pod("shop", "web-1", "10.0.0.1"),
    )
    .unwrap();
    fs::write(
        dir.path().join("bad.yaml"),
        format!(
            "{}---\napiVersion: v1\nkind: Pod\nmetadata:\n  namespace: shop\nstatus:\n  podIP: 10.0.0.5\n",
            pod("shop", "other", "10.0.0.4")
        ),
    )
    .unwrap();

    let loaded = manifests::load(&ManifestsConfig::new(dir.path())).unwrap();
    assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
    let problem = &loaded.problems[0];
    assert!(problem.contains("bad.yaml: document 2"), "{problem}");
    assert!(
        problem.contains("(Pod): field metadata.name: required but missing"),
        "{problem}"
    );
    assert_eq!((loaded.files, loaded.invalid_files), (2, 1));
    // A file with a problem contributes nothing, not even its good objects.
    assert_eq!(loaded.objects.len(), 1);

    let source = Source::start(dir.path()).await;
    assert_eq!(
        pod_ip(&source.store, "shop", "web-1").as_deref(),
        Some("10.0.0.1")
    );
    assert_eq!(pod_ip(&source.store, "shop", "other"), None);
    assert_eq!(source.metrics(), (1, 1, 0));
    source.stop().await;
}

#[tokio::test]
async fn kinds_the_index_does_not_use_are_skipped_quietly() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("app.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n---\n\
             apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: web\n---\n{}",
            pod("shop", "web-1", "10.0.0.1")
        ),
    )
    .unwrap();
    let loaded = manifests::load(&ManifestsConfig::new(dir.path())).unwrap();
    assert_eq!(loaded.problems, Vec::<String>::new());
    assert_eq!(loaded.objects.len(), 1);
    let source = Source::start(dir.path()).await;
    assert_eq!(counts(&source.store), (1, 0, 0));
    assert_eq!(source.metrics(), (0, 0, 0));
    source.stop().await;
}

#[tokio::test]
async fn duplicate_definitions_first_file_wins_and_ownership_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    fs::write(&a, pod("shop", "web-1", "10.0.0.1")).unwrap();
    fs::write(&b, pod("shop", "web-1", "10.0.0.2")).unwrap();
    let source = Source::start(dir.path()).await;
    let store = source.store.clone();
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));

    // Removing the winner serves the other definition; it is not deleted.
    fs::remove_file(&a).unwrap();
    eventually_sync("b.yaml's definition served", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2")
    })
    .await;

    // The first file back: it wins again.
    fs::write(&a, pod("shop", "web-1", "10.0.0.1")).unwrap();
    eventually_sync("a.yaml's definition served again", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.1")
    })
    .await;

    // Editing the loser changes nothing served; removing it neither.
    fs::write(&b, pod("shop", "web-1", "10.0.0.3")).unwrap();
    fs::remove_file(&b).unwrap();
    fs::write(dir.path().join("c.yaml"), pod("shop", "marker", "10.0.0.7")).unwrap();
    eventually_sync("a later change seen", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "marker").is_some()
    })
    .await;
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));

    fs::remove_file(&a).unwrap();
    eventually_sync(
        "the pod gone with its last definition",
        CHANGE_DEADLINE,
        || pod_ip(&store, "shop", "web-1").is_none(),
    )
    .await;
    source.stop().await;
}

#[tokio::test]
async fn atomic_rename_writes_and_files_moved_in_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    write_atomic(&file, &pod("shop", "web-1", "10.0.0.1"));
    let source = Source::start(dir.path()).await;
    let store = source.store.clone();
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));

    for (i, ip) in ["10.0.0.2", "10.0.0.3", "10.0.0.4"].into_iter().enumerate() {
        write_atomic(&file, &pod("shop", "web-1", ip));
        eventually_sync(&format!("rename {i} applied"), CHANGE_DEADLINE, || {
            pod_ip(&store, "shop", "web-1").as_deref() == Some(ip)
        })
        .await;
    }

    let outside = tempfile::tempdir_in(dir.path().parent().unwrap()).unwrap();
    fs::write(
        outside.path().join("cart.yaml"),
        pod("shop", "cart-1", "10.0.0.8"),
    )
    .unwrap();
    fs::rename(
        outside.path().join("cart.yaml"),
        dir.path().join("cart.yaml"),
    )
    .unwrap();
    eventually_sync("a file moved in", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "cart-1").is_some()
    })
    .await;

    // Moved out again: as good as deleted.
    fs::rename(
        dir.path().join("cart.yaml"),
        outside.path().join("cart.yaml"),
    )
    .unwrap();
    eventually_sync("a file moved out", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "cart-1").is_none()
    })
    .await;
    assert_eq!(source.metrics().0, 0);
    source.stop().await;
}

#[tokio::test]
async fn a_missing_directory_is_an_error_that_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
    let err = manifests::run(
        ManifestsConfig::new(&missing),
        store.clone(),
        ManifestsMetrics::default(),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&missing.display().to_string()), "{msg}");
    assert!(msg.contains("create it"), "{msg}");
    assert!(!store.is_ready());

    let file = dir.path().join("file.yaml");
    fs::write(&file, "").unwrap();
    let err = manifests::load(&ManifestsConfig::new(&file)).unwrap_err();
    assert!(err.to_string().contains("is not a directory"), "{err}");
}

#[tokio::test]
async fn files_over_the_size_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("small.yaml"),
        pod("shop", "small", "10.0.0.1"),
    )
    .unwrap();
    let big = format!("{}# {}\n", pod("shop", "big", "10.0.0.2"), "x".repeat(4096));
    fs::write(dir.path().join("big.yaml"), &big).unwrap();
    let config = ManifestsConfig {
        max_file_bytes: 1024,
        ..ManifestsConfig::new(dir.path())
    };
    let loaded = manifests::load(&config).unwrap();
    assert_eq!(loaded.objects.len(), 1);
    assert_eq!(loaded.problems.len(), 1);
    assert!(
        loaded.problems[0].contains("big.yaml: the file is larger than the limit"),
        "{:?}",
        loaded.problems
    );

    let source = Source::start_with(config).await;
    assert_eq!(pod_ip(&source.store, "shop", "big"), None);
    assert_eq!(source.metrics(), (1, 1, 0));
    // Shrunk below the limit: read and served.
    fs::write(dir.path().join("big.yaml"), pod("shop", "big", "10.0.0.2")).unwrap();
    let store = source.store.clone();
    let counters = source.counters.clone();
    eventually_sync("the shrunk file served", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "big").is_some() && counters.manifest_files_invalid.get() == 0
    })
    .await;
    source.stop().await;
}

#[tokio::test]
async fn endpoint_slices_and_empty_documents_load() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("slice.yaml"),
        "---\n# nothing here\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  \
         labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\nendpoints:\n- addresses: [10.0.0.1]\n  \
         conditions: {ready: true}\nports:\n- name: http\n  port: 8080\n---\n",
    )
    .unwrap();
    let source = Source::start(dir.path()).await;
    assert_eq!(counts(&source.store), (0, 0, 1));
    assert_eq!(source.metrics(), (0, 0, 0));
    source.stop().await;
}

#[test]
fn results_are_resources() {
    // `load` hands back the same domain types the index holds.
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("p.yaml"), pod("shop", "p", "10.0.0.1")).unwrap();
    let loaded = manifests::load(&ManifestsConfig::new(dir.path())).unwrap();
    assert!(
        matches!(loaded.objects.as_slice(), [Resource::Pod(p)] if p.key == ObjectKey::new("shop", "p"))
    );
}

#[tokio::test]
async fn a_replaced_directory_is_read_and_watched_again() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("manifests");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("web.yaml"), pod("shop", "web-1", "10.0.0.1")).unwrap();
    let source = Source::start(&dir).await;
    let store = source.store.clone();
    let counters = source.counters.clone();

    // Gone: what was loaded stays served.
    fs::remove_dir_all(&dir).unwrap();
    let errors_before = counters.reload_errors_total.get();
    // Back, with new content: seen by the periodic rescan (the old watch
    // went with the old directory), then watched again.
    let staging = parent.path().join("staging");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("web.yaml"), pod("shop", "web-1", "10.0.0.2")).unwrap();
    fs::rename(&staging, &dir).unwrap();
    eventually_sync(
        "the replaced directory read",
        Duration::from_secs(3),
        || pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2"),
    )
    .await;
    fs::write(dir.join("web.yaml"), pod("shop", "web-1", "10.0.0.3")).unwrap();
    eventually_sync("an edit in the replaced directory", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.3")
    })
    .await;
    assert_eq!(counters.reload_errors_total.get(), errors_before);
    source.stop().await;
}

#[test]
fn the_shipped_examples_load_without_problems() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let loaded = manifests::load(&ManifestsConfig::new(&dir)).unwrap();
    assert_eq!(loaded.problems, Vec::<String>::new());
    assert_eq!(loaded.invalid_files, 0);
    assert!(!loaded.objects.is_empty());
}

/// Every test's log lines, captured by one global subscriber (the source
/// logs from the blocking pool, where a thread-local one would not see it);
/// each test reads only the lines naming its own directory.
mod logs {
    use std::{
        io::Write,
        sync::{Mutex, OnceLock},
    };
    use tracing_subscriber::fmt::MakeWriter;

    static LINES: Mutex<Vec<u8>> = Mutex::new(Vec::new());

    struct Capture;

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            LINES.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Capture {
            Capture
        }
    }

    pub fn capture() {
        static INIT: OnceLock<()> = OnceLock::new();
        INIT.get_or_init(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(Capture)
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
        });
    }

    /// The captured lines that contain `needle` (a test's directory).
    pub fn containing(needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&LINES.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

fn lines_with(dir: &Path, words: &[&str]) -> Vec<String> {
    logs::containing(&dir.display().to_string())
        .into_iter()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect()
}

/// Rescans after a change by which a just-changed file has been read again
/// (the settled re-read) and a periodic full rescan has run: what those later
/// reads would log has been logged.
const RESCANS_SETTLED: u64 = 3;

/// Waits until the source has run `RESCANS_SETTLED` more rescans.
async fn rescans_settle(counters: &ManifestsMetrics) {
    let start = counters.manifest_rescans_total.get();
    eventually_sync("later rescans", Duration::from_secs(30), || {
        counters.manifest_rescans_total.get() >= start + RESCANS_SETTLED
    })
    .await;
}

#[tokio::test]
async fn a_rename_is_logged_once_and_a_change_once() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("a.yaml"), pod("shop", "web-1", "10.0.0.1")).unwrap();
    let source = Source::start(d).await;
    let store = source.store.clone();

    fs::rename(d.join("a.yaml"), d.join("b.yaml")).unwrap();
    eventually_sync("the rename logged", CHANGE_DEADLINE, || {
        !lines_with(d, &["renamed to", "b.yaml"]).is_empty()
    })
    .await;
    fs::write(d.join("a.yaml"), pod("shop", "web-2", "10.0.0.2")).unwrap();
    eventually_sync("web-2 applied", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-2").is_some()
    })
    .await;
    rescans_settle(&source.counters).await;
    // A sentinel after the rereads: everything before it has been logged.
    fs::write(d.join("z.yaml"), pod("shop", "web-3", "10.0.0.3")).unwrap();
    eventually_sync("the sentinel logged", CHANGE_DEADLINE, || {
        !lines_with(d, &["z.yaml: added"]).is_empty()
    })
    .await;

    let lines = lines_with(d, &[]);
    let about_b: Vec<&String> = lines.iter().filter(|l| l.contains("b.yaml")).collect();
    assert_eq!(about_b.len(), 1, "one line for the rename: {lines:#?}");
    assert!(about_b[0].contains(" INFO "), "{lines:#?}");
    let about_a: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("a.yaml") && !l.contains("b.yaml"))
        .collect();
    assert_eq!(about_a.len(), 1, "one line for the new a.yaml: {lines:#?}");
    assert!(
        about_a[0].contains("a.yaml: added (1 object)"),
        "{lines:#?}"
    );
    assert_eq!(pod_ip(&store, "shop", "web-1").as_deref(), Some("10.0.0.1"));
    source.stop().await;
}

#[tokio::test]
async fn a_rename_over_another_file_is_one_line() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("web.yaml"), pod("shop", "web-1", "10.0.0.1")).unwrap();
    let source = Source::start(d).await;
    let store = source.store.clone();
    fs::write(d.join("new.yaml"), pod("shop", "web-1", "10.0.0.2")).unwrap();
    eventually_sync("new.yaml logged", CHANGE_DEADLINE, || {
        !lines_with(d, &["new.yaml: added"]).is_empty()
    })
    .await;

    fs::rename(d.join("new.yaml"), d.join("web.yaml")).unwrap();
    eventually_sync("the rename logged", CHANGE_DEADLINE, || {
        !lines_with(d, &["new.yaml: renamed over", "web.yaml"]).is_empty()
    })
    .await;
    eventually_sync("web-1 from the renamed file", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2")
    })
    .await;
    let lines = lines_with(d, &[]);
    let after_add: Vec<&String> = lines
        .iter()
        .skip_while(|l| !l.contains("new.yaml: added"))
        .skip(1)
        .collect();
    assert_eq!(after_add.len(), 1, "one line for the mv: {lines:#?}");
    source.stop().await;
}

#[tokio::test]
async fn a_fixed_file_is_logged_as_fixed() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, pod("shop", "web-1", "10.0.0.1")).unwrap();
    let source = Source::start(dir.path()).await;
    let store = source.store.clone();

    fs::write(&file, "kind: [unclosed\n").unwrap();
    eventually_sync("the problem logged", CHANGE_DEADLINE, || {
        !lines_with(dir.path(), &[" WARN ", "web.yaml", "not valid YAML"]).is_empty()
    })
    .await;
    fs::write(&file, pod("shop", "web-1", "10.0.0.2")).unwrap();
    eventually_sync("the fix logged", CHANGE_DEADLINE, || {
        !lines_with(dir.path(), &[" INFO ", "web.yaml: fixed"]).is_empty()
    })
    .await;
    // Logged as read; applied to the store just after.
    eventually_sync("the fixed pod applied", CHANGE_DEADLINE, || {
        pod_ip(&store, "shop", "web-1").as_deref() == Some("10.0.0.2")
    })
    .await;
    source.stop().await;
}

#[tokio::test]
async fn two_services_with_one_cluster_ip_are_named_in_a_warning() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Both claim 10.96.0.10; a marker namespace names this test's lines.
    let ns = format!(
        "dup{}",
        d.file_name()
            .unwrap()
            .to_string_lossy()
            .to_lowercase()
            .replace(['.', '_'], "")
    );
    fs::write(d.join("web.yaml"), service(&ns, "web", 80)).unwrap();
    let source = Source::start(d).await;
    let store = source.store.clone();
    fs::write(d.join("api.yaml"), service(&ns, "api", 80)).unwrap();
    let warned = || {
        logs::containing("both claim clusterIP 10.96.0.10")
            .into_iter()
            .filter(|l| {
                l.contains(" WARN ")
                    && l.contains(&format!("{ns}/web"))
                    && l.contains(&format!("{ns}/api"))
            })
            .count()
    };
    eventually_sync("the warning", CHANGE_DEADLINE, || warned() == 1).await;
    // The index answers for the IP with the first by namespace, then name
    // (logged as read; applied to the store just after).
    let owner = || {
        store.with_index(|i| {
            i.service_for_ip("10.96.0.10".parse().unwrap())
                .map(|k| k.to_string())
        })
    };
    eventually_sync("api applied", CHANGE_DEADLINE, || {
        store.with_index(|i| i.service(&ObjectKey::new(ns.as_str(), "api")).is_some())
    })
    .await;
    assert_eq!(owner(), Some(format!("{ns}/api")));
    let line = logs::containing(&format!("{ns}/api")).join("\n");
    assert!(
        line.contains(&format!("answering for that IP with {ns}/api")),
        "{line}"
    );

    // One of them gone: no conflict left, and a new claim warns again.
    fs::remove_file(d.join("api.yaml")).unwrap();
    eventually_sync("api removed", CHANGE_DEADLINE, || {
        store.with_index(|i| i.service(&ObjectKey::new(ns.as_str(), "api")).is_none())
    })
    .await;
    assert_eq!(warned(), 1);
    fs::write(d.join("api.yaml"), service(&ns, "api", 80)).unwrap();
    eventually_sync("the second warning", CHANGE_DEADLINE, || warned() == 2).await;
    source.stop().await;
}
