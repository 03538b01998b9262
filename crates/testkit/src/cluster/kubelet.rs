//! The kubelet (and kube-proxy) of one [`Node`]: runs the Pods bound to it from the
//! in-process [`ApiServer`], writes their status back, and keeps the node's Service
//! rules and hosts files in step with the store.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::images::Images;
use super::kube_proxy::service_entries;
use super::netns::unique_name;
use super::node::{Node, ServiceEntry, MAX_PODS};
use super::pod::{run_pod, KubeletShared, LogIndex};
use crate::api_server::{lock, ServiceRef};
use crate::ApiServer;

/// How long the kubelet waits for a change in the store before looking anyway.
const RESYNC: Duration = Duration::from_millis(100);

/// A kubelet for one [`Node`].
///
/// It runs the Pods whose `spec.nodeName` is the node's name (or that have none: there
/// is no scheduler it would wait for), at most [`MAX_PODS`] at once (others stay
/// unstarted until one goes). Each pod gets a sandbox on the node; each container is
/// a process in it (see the crate's `cluster` module). Restarts back off from 1 s,
/// doubling, capped at 10 s (Kubernetes: 10 s to 5 min).
///
/// It also makes its node the way the API server reaches webhook Services
/// ([`ApiServer::set_service_dialer`]): their cluster IP, dialed from the node.
///
/// Dropping it kills every process it started and removes every namespace, mount
/// point and file it made, at once (SIGKILL: graceful termination is for deletions).
pub struct Kubelet {
    shared: Arc<KubeletShared>,
    task: JoinHandle<()>,
}

impl Kubelet {
    /// Starts the kubelet's loop (inside a tokio runtime). Its files (volumes, logs)
    /// go under a new directory in the system's temp dir.
    pub fn start(api: Arc<ApiServer>, node: Arc<Node>, images: Images) -> io::Result<Kubelet> {
        let dir = std::env::temp_dir().join(unique_name("ballast-kubelet"));
        std::fs::create_dir_all(dir.join("logs"))?;
        // Containers run as other users read their volumes through this directory.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let shared = Arc::new(KubeletShared {
            api,
            node,
            images,
            dir,
            pods: Mutex::new(Default::default()),
            logs: Mutex::new(LogIndex::default()),
            closed: Default::default(),
        });
        install_service_dialer(&shared.api, &shared.node);
        let task = tokio::spawn(sync_loop(shared.clone()));
        Ok(Kubelet { shared, task })
    }

    /// What a container has written to stdout and stderr (the last 1 MiB, across its
    /// restarts), with the kubelet's notes on hook and probe failures; empty when
    /// there is no such container.
    pub fn logs(&self, namespace: &str, pod: &str, container: &str) -> String {
        lock(&self.shared.logs)
            .get(namespace, pod, container)
            .map(|l| l.text())
            .unwrap_or_default()
    }

    /// The network namespace of a running pod (`ip netns exec NAME ...`).
    pub fn pod_netns(&self, namespace: &str, pod: &str) -> Option<String> {
        lock(&self.shared.pods)
            .values()
            .find(|r| r.namespace == namespace && r.name == pod)
            .map(|r| r.netns.clone())
    }

    /// The kubelet's directory (pods' volumes under `pods/UID/volumes`, logs under
    /// `logs/`).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The node it runs pods on.
    pub fn node(&self) -> &Arc<Node> {
        &self.shared.node
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // Aborting the loop drops its JoinSet of pod workers, which aborts them and
        // their container tasks; what they held on the machine is freed here, now.
        self.task.abort();
        let pods = std::mem::take(&mut *lock(&self.shared.pods));
        drop(pods);
        let _ = std::fs::remove_dir_all(&self.shared.dir);
    }
}

/// The API server reaches webhook Services as a node does: the Service's cluster IP,
/// dialed from the node's namespace (so through kube-proxy's DNAT to a ready pod).
/// Weak references: the dialer lives in the API server and must keep neither alive.
fn install_service_dialer(api: &Arc<ApiServer>, node: &Arc<Node>) {
    let (api_ref, node_ref) = (Arc::downgrade(api), Arc::downgrade(node));
    api.set_service_dialer(move |svc: ServiceRef| {
        let (api, node) = (api_ref.upgrade(), node_ref.upgrade());
        async move {
            let (Some(api), Some(node)) = (api, node) else {
                return Err(io::Error::other("the node is gone"));
            };
            let ip = api
                .get("services", &svc.namespace, &svc.name)
                .and_then(|s| {
                    s.pointer("/spec/clusterIP")?
                        .as_str()?
                        .parse::<Ipv4Addr>()
                        .ok()
                })
                .ok_or_else(|| {
                    io::Error::other(format!(
                        "service {}/{} not found or without a cluster IP",
                        svc.namespace, svc.name
                    ))
                })?;
            node.dial(SocketAddr::from((ip, svc.port))).await
        }
    });
}

fn bound_here(pod: &Value, node: &str) -> bool {
    match pod.pointer("/spec/nodeName").and_then(Value::as_str) {
        None | Some("") => true,
        Some(n) => n == node,
    }
}

async fn sync_loop(k: Arc<KubeletShared>) {
    let mut workers: HashMap<String, watch::Sender<Option<Value>>> = HashMap::new();
    let mut tasks: JoinSet<String> = JoinSet::new();
    let mut services: Option<Vec<ServiceEntry>> = None;
    loop {
        while let Some(done) = tasks.try_join_next() {
            if let Ok(uid) = done {
                workers.remove(&uid);
            }
        }
        let pods = k.api.list("pods");
        let mut seen = std::collections::HashSet::new();
        for pod in pods {
            if !bound_here(&pod, k.node.name()) {
                continue;
            }
            let Some(uid) = pod.pointer("/metadata/uid").and_then(Value::as_str) else {
                continue;
            };
            let uid = uid.to_string();
            seen.insert(uid.clone());
            if let Some(tx) = workers.get(&uid) {
                tx.send_if_modified(|current| {
                    if current.as_ref() == Some(&pod) {
                        false
                    } else {
                        *current = Some(pod.clone());
                        true
                    }
                });
                continue;
            }
            if pod.pointer("/metadata/deletionTimestamp").is_some() {
                // Never started here: nothing to stop, so the deletion completes now.
                let ns = pod
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let name = pod
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                k.api.delete_now("pods", ns, name);
                continue;
            }
            if workers.len() >= MAX_PODS {
                continue;
            }
            let (tx, rx) = watch::channel(Some(pod));
            workers.insert(uid.clone(), tx);
            let k = k.clone();
            tasks.spawn(async move {
                run_pod(k, uid.clone(), rx).await;
                uid
            });
        }
        for (uid, tx) in &workers {
            if !seen.contains(uid) {
                tx.send_if_modified(|current| current.take().is_some());
            }
        }

        let entries = service_entries(&k.api);
        if services.as_ref() != Some(&entries) {
            let node = k.node.clone();
            let wanted = entries.clone();
            let synced = tokio::task::spawn_blocking(move || node.sync_services(&wanted)).await;
            match synced {
                Ok(Ok(())) => services = Some(entries),
                Ok(Err(e)) => tracing::warn!(error = %e, "testkit kube-proxy: services not synced"),
                Err(e) => tracing::warn!(error = %e, "testkit kube-proxy: sync task failed"),
            }
        }

        // Wakes on the next change in the store, or after RESYNC.
        let mut first = true;
        k.api
            .wait_until(RESYNC, |_| !std::mem::replace(&mut first, false))
            .await;
    }
}
