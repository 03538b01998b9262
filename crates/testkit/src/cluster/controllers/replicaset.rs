//! The ReplicaSet controller: as many active Pods as `spec.replicas`, made from the
//! template (named `RS-NAME-xxxxx`, owned by the ReplicaSet), and the status.

use serde_json::{json, Value};

use super::{
    active, controller_uid, name, namespace, owner_reference, ready, terminating, text, uid,
};
use crate::{ApiServer, DeleteOptions};

pub(super) async fn reconcile(api: &ApiServer) {
    let pods = api.list("pods");
    for rs in api.list("replicasets") {
        if terminating(&rs) {
            continue;
        }
        let owned: Vec<&Value> = pods
            .iter()
            .filter(|p| namespace(p) == namespace(&rs) && controller_uid(p) == Some(uid(&rs)))
            .filter(|p| active(p))
            .collect();
        let desired = rs
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0) as usize;
        if owned.len() < desired {
            for _ in owned.len()..desired {
                if let Err(e) = api.create(pod_for(&rs)).await {
                    // Retried at the next reconcile (a webhook may be starting).
                    tracing::debug!(replicaset = name(&rs), error = %e, "replicaset: cannot create a pod");
                    break;
                }
            }
        } else if owned.len() > desired {
            let mut doomed = owned.clone();
            // Unscheduled, then unready, then the newest go first, as Kubernetes ranks them.
            doomed.sort_by_key(|p| {
                (
                    !text(p, "/spec/nodeName").is_empty(),
                    ready(p),
                    std::cmp::Reverse(text(p, "/metadata/creationTimestamp").to_string()),
                )
            });
            for pod in doomed.iter().take(owned.len() - desired) {
                let _ =
                    api.delete_with("pods", namespace(pod), name(pod), &DeleteOptions::default());
            }
        }
        let ready_count = owned.iter().filter(|p| ready(p)).count();
        let mut status = json!({
            "replicas": owned.len(),
            "fullyLabeledReplicas": owned.len(),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
        });
        if let Some(g) = rs.pointer("/metadata/generation") {
            status["observedGeneration"] = g.clone();
        }
        if rs.get("status") != Some(&status) {
            let mut updated = rs.clone();
            updated["status"] = status;
            // A conflict means a newer ReplicaSet: the next reconcile writes its status.
            let _ = api.update_status(updated).await;
        }
    }
}

/// A Pod from the ReplicaSet's template.
fn pod_for(rs: &Value) -> Value {
    let template = rs.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut metadata = template.get("metadata").cloned().unwrap_or(json!({}));
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["generateName"] = json!(format!("{}-", name(rs)));
    metadata["namespace"] = json!(namespace(rs));
    metadata["ownerReferences"] = json!([owner_reference(rs)]);
    if let Some(m) = metadata.as_object_mut() {
        m.remove("name");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    })
}
