//! The cluster's controllers over the API server emulation: a test kubelet here gives
//! scheduled Pods an IP and a `Ready` condition (when told to) and removes Pods
//! marked for deletion, as the real kubelet would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ballast_testkit::cluster::controllers::Controllers;
use ballast_testkit::{ApiServer, DeleteOptions};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{json, Value};

/// Generous: these machines have two busy cores.
const DEADLINE: Duration = Duration::from_secs(30);
const NODE: &str = "node-1";

/// What the test kubelet does; flags a test flips.
struct TestKubelet {
    ready: Arc<AtomicBool>,
    remove_terminating: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestKubelet {
    fn start(api: Arc<ApiServer>, ready: bool) -> TestKubelet {
        let ready = Arc::new(AtomicBool::new(ready));
        let remove_terminating = Arc::new(AtomicBool::new(true));
        let (r, t) = (ready.clone(), remove_terminating.clone());
        let task = tokio::spawn(async move {
            let next_ip = AtomicU32::new(2);
            let mut changes = api.changes();
            loop {
                changes.borrow_and_update();
                pass(
                    &api,
                    r.load(Ordering::SeqCst),
                    t.load(Ordering::SeqCst),
                    &next_ip,
                )
                .await;
                let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
            }
        });
        TestKubelet {
            ready,
            remove_terminating,
            task,
        }
    }

    fn set_ready(&self, on: bool) {
        self.ready.store(on, Ordering::SeqCst);
    }
}

async fn pass(api: &ApiServer, ready: bool, remove: bool, next_ip: &AtomicU32) {
    for pod in api.list("pods") {
        let (ns, name) = (
            text(&pod, "/metadata/namespace"),
            text(&pod, "/metadata/name"),
        );
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            if remove {
                api.delete_now("pods", &ns, &name);
            }
            continue;
        }
        if text(&pod, "/spec/nodeName").is_empty() {
            continue;
        }
        let ip = match text(&pod, "/status/podIP") {
            ip if !ip.is_empty() => ip,
            _ => {
                let n = next_ip.fetch_add(1, Ordering::SeqCst);
                format!("10.244.{}.{}", n >> 8, n & 0xff)
            }
        };
        let status = json!({
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        });
        if pod.get("status") != Some(&status) {
            let mut p = pod.clone();
            p["status"] = status;
            // A conflict: the pod changed; the next pass sees it.
            let _ = api.update_status(p).await;
        }
    }
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn deployment(name: &str, ns: &str, replicas: i64, strategy: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "web:1", "ports": [{"name": "http", "containerPort": 8080}]}]},
            },
        },
    })
}

fn in_ns(api: &ApiServer, plural: &str, ns: &str) -> Vec<Value> {
    api.list(plural)
        .into_iter()
        .filter(|o| text(o, "/metadata/namespace") == ns)
        .collect()
}

fn is_ready(p: &Value) -> bool {
    p.pointer("/status/conditions/0/status") == Some(&json!("True"))
        && p.pointer("/metadata/deletionTimestamp").is_none()
}

async fn client(server: &ApiServer) -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = server.write_kubeconfig(dir.path());
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads");
    Client::try_from(config).expect("client builds")
}

#[tokio::test]
async fn a_deployment_makes_a_replica_set_and_pods_and_reports_their_readiness() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let kubelet = TestKubelet::start(api.clone(), false);
    let d = api
        .create(deployment("web", "ns1", 3, json!({})))
        .await
        .expect("create");

    assert!(
        api.wait_until(DEADLINE, |s| in_ns(s, "pods", "ns1").len() == 3
            && in_ns(s, "pods", "ns1")
                .iter()
                .all(|p| !text(p, "/status/podIP").is_empty()))
            .await,
        "three pods running: {:#?}",
        api.list("pods")
    );
    let sets = in_ns(&api, "replicasets", "ns1");
    assert_eq!(sets.len(), 1);
    let rs = &sets[0];
    let hash = text(rs, "/metadata/labels/pod-template-hash");
    assert!(!hash.is_empty());
    assert_eq!(text(rs, "/metadata/name"), format!("web-{hash}"));
    assert_eq!(
        rs["metadata"]["ownerReferences"][0]["uid"],
        d["metadata"]["uid"]
    );
    assert_eq!(rs["metadata"]["ownerReferences"][0]["controller"], true);
    for p in in_ns(&api, "pods", "ns1") {
        let name = text(&p, "/metadata/name");
        assert!(
            name.starts_with(&format!("web-{hash}-"))
                && name.len() == format!("web-{hash}-").len() + 5,
            "{name}"
        );
        assert_eq!(
            p["metadata"]["labels"],
            json!({"app": "web", "pod-template-hash": hash})
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["uid"],
            rs["metadata"]["uid"]
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(text(&p, "/spec/nodeName"), NODE, "scheduled");
        assert_eq!(p["spec"]["containers"][0]["image"], "web:1");
    }
    let status = |s: &ApiServer| {
        s.get("deployments", "ns1", "web")
            .map(|d| d["status"].clone())
            .unwrap_or_default()
    };
    assert!(
        api.wait_until(DEADLINE, |s| status(s)["replicas"] == 3
            && status(s)["readyReplicas"] == 0)
            .await,
        "{}",
        status(&api)
    );

    kubelet.set_ready(true);
    assert!(
        api.wait_until(DEADLINE, |s| {
            let st = status(s);
            st["readyReplicas"] == 3
                && st["availableReplicas"] == 3
                && st["updatedReplicas"] == 3
                && st["observedGeneration"] == 1
        })
        .await,
        "{}",
        status(&api)
    );
    let rs_status = api
        .get("replicasets", "ns1", &format!("web-{hash}"))
        .expect("rs")["status"]
        .clone();
    assert_eq!(rs_status["readyReplicas"], 3);

    // Scaling is a spec change: the generation moves and the pods follow.
    api.patch_merge(
        "deployments",
        "ns1",
        "web",
        json!({"spec": {"replicas": 1}}),
    )
    .await
    .expect("scale");
    assert!(
        api.wait_until(DEADLINE, |s| in_ns(s, "pods", "ns1").len() == 1
            && status(s)["replicas"] == 1
            && status(s)["observedGeneration"] == 2)
            .await,
        "{}",
        status(&api)
    );
}

#[tokio::test]
async fn a_template_change_rolls_one_surge_pod_at_a_time_never_under_three_ready() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let _kubelet = TestKubelet::start(api.clone(), true);
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    api.create(deployment("web", "ns1", 3, strategy))
        .await
        .expect("create");
    let status = |s: &ApiServer| {
        s.get("deployments", "ns1", "web")
            .map(|d| d["status"].clone())
            .unwrap_or_default()
    };
    assert!(
        api.wait_until(DEADLINE, |s| status(s)["readyReplicas"] == 3)
            .await,
        "{}",
        status(&api)
    );

    // Every pod event from here on, in order, through a real watch.
    let pods: Api<Pod> = Api::namespaced(client(&api).await, "ns1");
    let mut events = pods
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watching = tokio::spawn(async move {
        let mut state: BTreeMap<String, Pod> = BTreeMap::new();
        let (mut min_ready, mut max_active) = (usize::MAX, 0);
        let mut seen = 0usize;
        while let Some(Ok(event)) = events.next().await {
            match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    state.insert(p.metadata.name.clone().unwrap_or_default(), p);
                }
                WatchEvent::Deleted(p) => {
                    state.remove(p.metadata.name.as_deref().unwrap_or_default());
                }
                _ => continue,
            }
            seen += 1;
            let values: Vec<Value> = state
                .values()
                .map(|p| serde_json::to_value(p).unwrap_or_default())
                .collect();
            let active = values
                .iter()
                .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
                .count();
            let ready = values.iter().filter(|p| is_ready(p)).count();
            // The initial ADDED events build the starting state first.
            if seen > 3 {
                min_ready = min_ready.min(ready);
                max_active = max_active.max(active);
            }
            let _ = tx.send((min_ready, max_active));
        }
    });

    let before = api.get("deployments", "ns1", "web").expect("deployment");
    let old_hash =
        in_ns(&api, "replicasets", "ns1")[0]["metadata"]["labels"]["pod-template-hash"].clone();
    api.patch_merge(
        "deployments",
        "ns1",
        "web",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "web:2", "ports": [{"name": "http", "containerPort": 8080}]}]}}}}),
    )
    .await
    .expect("new template");
    let rolled = |s: &ApiServer| {
        let st = status(s);
        let pods = in_ns(s, "pods", "ns1");
        st["observedGeneration"] == 2
            && st["updatedReplicas"] == 3
            && st["readyReplicas"] == 3
            && st["replicas"] == 3
            && pods.len() == 3
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "web:2" && is_ready(p))
    };
    assert!(
        api.wait_until(DEADLINE, rolled).await,
        "{}\n{:#?}",
        status(&api),
        api.list("pods")
    );
    assert_eq!(before["metadata"]["generation"], 1);
    let sets = in_ns(&api, "replicasets", "ns1");
    assert_eq!(sets.len(), 2, "the old replica set is kept, scaled to zero");
    let old = sets
        .iter()
        .find(|rs| rs["metadata"]["labels"]["pod-template-hash"] == old_hash)
        .expect("old rs");
    assert_eq!(old["spec"]["replicas"], 0);

    // Let the watch catch up with the final state, then judge every state it saw.
    let mut last = (usize::MAX, 0);
    let caught_up = tokio::time::timeout(DEADLINE, async {
        while let Some(v) = rx.recv().await {
            last = v;
            if rx.is_empty() && rolled(&api) {
                tokio::task::yield_now().await;
                if rx.is_empty() {
                    break;
                }
            }
        }
    })
    .await;
    watching.abort();
    assert!(caught_up.is_ok(), "the watch kept up");
    let (min_ready, max_active) = last;
    assert!(
        min_ready >= 3,
        "ready pods fell to {min_ready} during the rollout"
    );
    assert!(
        max_active <= 4,
        "{max_active} active pods: more than one surge pod"
    );
}

#[tokio::test]
async fn endpoint_slices_follow_pod_readiness_and_termination() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let kubelet = TestKubelet::start(api.clone(), false);
    let svc = api
        .create(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns1"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
        .await
        .expect("service");
    api.create(deployment("web", "ns1", 2, json!({})))
        .await
        .expect("deployment");
    let slices = |s: &ApiServer| in_ns(s, "endpointslices", "ns1");
    let endpoints = |s: &ApiServer| -> Vec<Value> {
        slices(s)
            .iter()
            .flat_map(|sl| sl["endpoints"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert!(
        api.wait_until(DEADLINE, |s| endpoints(s).len() == 2
            && endpoints(s)
                .iter()
                .all(|e| e["conditions"]["ready"] == false))
            .await,
        "{:#?}",
        slices(&api)
    );
    let slice = &slices(&api)[0];
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "web"
    );
    assert_eq!(
        slice["metadata"]["ownerReferences"][0]["uid"],
        svc["metadata"]["uid"]
    );
    assert_eq!(
        slice["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(slice["addressType"], "IPv4");
    let e = &slice["endpoints"][0];
    assert_eq!(e["targetRef"]["kind"], "Pod");
    assert_eq!(e["nodeName"], NODE);

    kubelet.set_ready(true);
    assert!(
        api.wait_until(DEADLINE, |s| endpoints(s).len() == 2
            && endpoints(s)
                .iter()
                .all(|e| e["conditions"]["ready"] == true))
            .await,
        "{:#?}",
        slices(&api)
    );

    // A pod being deleted stays, terminating and not ready, until its kubelet removes it.
    kubelet.remove_terminating.store(false, Ordering::SeqCst);
    let victim = text(&endpoints(&api)[0], "/targetRef/name");
    let marked = api
        .delete_with("pods", "ns1", &victim, &DeleteOptions::default())
        .expect("delete");
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let condition = |s: &ApiServer| {
        endpoints(s)
            .into_iter()
            .find(|e| text(e, "/targetRef/name") == victim)
            .map(|e| e["conditions"].clone())
    };
    assert!(
        api.wait_until(DEADLINE, |s| condition(s)
            == Some(json!({"ready": false, "serving": true, "terminating": true})))
            .await,
        "{:?}",
        condition(&api)
    );
    kubelet.remove_terminating.store(true, Ordering::SeqCst);
    assert!(
        api.wait_until(DEADLINE, |s| condition(s).is_none()
            && endpoints(s).len() == 2
            && endpoints(s)
                .iter()
                .all(|e| e["conditions"]["ready"] == true))
            .await,
        "the replacement pod takes its place: {:#?}",
        slices(&api)
    );

    // Without its Service, the slices go.
    api.delete_with("services", "ns1", "web", &DeleteOptions::default())
        .expect("delete");
    assert!(api.wait_until(DEADLINE, |s| slices(s).is_empty()).await);
}

#[tokio::test]
async fn deleting_a_deployment_collects_its_replica_sets_and_pods() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let _kubelet = TestKubelet::start(api.clone(), true);
    api.create(deployment("web", "ns1", 2, json!({})))
        .await
        .expect("create");
    api.create(deployment("other", "ns1", 1, json!({})))
        .await
        .expect("create");
    assert!(
        api.wait_until(DEADLINE, |s| in_ns(s, "pods", "ns1").len() == 3)
            .await
    );

    api.delete_with("deployments", "ns1", "web", &DeleteOptions::default())
        .expect("delete");
    let web_gone = |s: &ApiServer| {
        in_ns(s, "replicasets", "ns1").len() == 1
            && in_ns(s, "pods", "ns1").len() == 1
            && in_ns(s, "pods", "ns1")
                .iter()
                .all(|p| p["metadata"]["labels"]["app"] == "other")
    };
    assert!(
        api.wait_until(DEADLINE, web_gone).await,
        "{:#?}",
        api.list("pods")
    );
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_content_then_the_namespace() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let _kubelet = TestKubelet::start(api.clone(), true);
    for ns in ["shop", "keep"] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await
            .expect("namespace");
        api.create(deployment("web", ns, 2, json!({})))
            .await
            .expect("deployment");
        api.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}))
            .await
            .expect("configmap");
        api.create(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}))
            .await
            .expect("service");
    }
    assert!(
        api.wait_until(DEADLINE, |s| s.objects("pods") == 4
            && s.objects("endpointslices") == 2)
            .await
    );

    let t = api
        .delete_with("namespaces", "", "shop", &DeleteOptions::default())
        .expect("delete");
    assert_eq!(t["status"]["phase"], "Terminating");
    let emptied = |s: &ApiServer| {
        s.get("namespaces", "", "shop").is_none()
            && [
                "pods",
                "replicasets",
                "deployments",
                "configmaps",
                "services",
                "endpointslices",
            ]
            .iter()
            .all(|p| in_ns(s, p, "shop").is_empty())
    };
    assert!(
        api.wait_until(DEADLINE, emptied).await,
        "{:#?}",
        api.list("pods")
    );
    for p in [
        "pods",
        "replicasets",
        "deployments",
        "configmaps",
        "services",
        "endpointslices",
    ] {
        assert!(
            !in_ns(&api, p, "keep").is_empty(),
            "{p} of another namespace kept"
        );
    }
}

#[tokio::test]
async fn a_paused_deployment_waits_and_spent_replica_sets_beyond_the_history_limit_go() {
    let api = Arc::new(ApiServer::start().await);
    let _controllers = Controllers::start(api.clone(), NODE);
    let _kubelet = TestKubelet::start(api.clone(), true);
    let mut d = deployment("web", "ns1", 1, json!({}));
    d["spec"]["revisionHistoryLimit"] = json!(0);
    api.create(d).await.expect("create");
    let image = |s: &ApiServer| {
        in_ns(s, "pods", "ns1")
            .iter()
            .map(|p| text(p, "/spec/containers/0/image"))
            .collect::<Vec<_>>()
    };
    assert!(api.wait_until(DEADLINE, |s| image(s) == ["web:1"]).await);
    let paused = json!({"spec": {"paused": true, "template": {"spec": {"containers": [{"name": "main", "image": "web:2"}]}}}});
    api.patch_merge("deployments", "ns1", "web", paused)
        .await
        .expect("patch");
    // Paused: the change is observed, but no ReplicaSet is made and no pod moves.
    let observed = |s: &ApiServer| {
        s.get("deployments", "ns1", "web")
            .is_some_and(|d| d["status"]["observedGeneration"] == 2)
    };
    assert!(api.wait_until(DEADLINE, observed).await);
    assert_eq!(image(&api), ["web:1"]);
    assert_eq!(in_ns(&api, "replicasets", "ns1").len(), 1);

    api.patch_merge(
        "deployments",
        "ns1",
        "web",
        json!({"spec": {"paused": false}}),
    )
    .await
    .expect("resume");
    // The old ReplicaSet, scaled to zero and empty, is beyond a history of 0.
    assert!(
        api.wait_until(DEADLINE, |s| image(s) == ["web:2"]
            && in_ns(s, "replicasets", "ns1").len() == 1)
            .await,
        "{:#?}",
        in_ns(&api, "replicasets", "ns1")
    );
    let rs = &in_ns(&api, "replicasets", "ns1")[0];
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "2"
    );
}
