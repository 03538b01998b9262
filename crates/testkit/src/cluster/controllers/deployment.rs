//! The Deployment controller: one ReplicaSet per template (`NAME-HASH`, labelled
//! `pod-template-hash`), rolled to within `maxSurge` and `maxUnavailable` (numbers or
//! percentages; `Recreate` too), availability judged by Pods' `Ready` condition; and
//! the Deployment's status.

use serde_json::{json, Value};

use super::{
    active, controller_uid, name, namespace, owner_reference, ready, safe_encode, stable_hash,
    terminating, text, uid,
};
use crate::ApiServer;

/// One ReplicaSet of a Deployment, as the rollout sees it.
struct Owned {
    rs: Value,
    /// `spec.replicas` as the rollout sets it.
    replicas: i64,
    /// Active Pods, and of them those `Ready`.
    pods: i64,
    ready: i64,
}

impl Owned {
    /// Ready Pods that will stay: Pods beyond `replicas` are about to go, and may be
    /// the ready ones.
    fn available(&self) -> i64 {
        self.ready.min(self.replicas)
    }
}

pub(super) async fn reconcile(api: &ApiServer) {
    let pods = api.list("pods");
    let sets = api.list("replicasets");
    for d in api.list("deployments") {
        if terminating(&d) {
            continue;
        }
        reconcile_one(api, &d, &sets, &pods).await;
    }
}

/// A ReplicaSet's `deployment.kubernetes.io/revision` (0 when missing).
fn revision_of(rs: &Value) -> u64 {
    text(
        rs,
        "/metadata/annotations/deployment.kubernetes.io~1revision",
    )
    .parse()
    .unwrap_or(0)
}

fn replicas_of(v: &Value) -> i64 {
    v.pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(0)
}

/// `maxSurge` / `maxUnavailable`: a number, or a percentage of `desired` rounded up
/// (surge) or down (unavailable).
fn resolve(v: Option<&Value>, default: &str, desired: i64, round_up: bool) -> i64 {
    let v = v.cloned().unwrap_or_else(|| json!(default));
    if let Some(n) = v.as_i64() {
        return n.max(0);
    }
    let pct = v
        .as_str()
        .and_then(|s| s.strip_suffix('%'))
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(25)
        .max(0);
    let scaled = desired * pct;
    if round_up {
        (scaled + 99) / 100
    } else {
        scaled / 100
    }
}

async fn reconcile_one(api: &ApiServer, d: &Value, sets: &[Value], pods: &[Value]) {
    let ns = namespace(d);
    let template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let hash = safe_encode(stable_hash(&template));
    let new_name = format!("{}-{hash}", name(d));
    let mut owned: Vec<Owned> = sets
        .iter()
        .filter(|rs| namespace(rs) == ns && controller_uid(rs) == Some(uid(d)) && !terminating(rs))
        .map(|rs| {
            let of_rs =
                |p: &&Value| namespace(p) == ns && controller_uid(p) == Some(uid(rs)) && active(p);
            Owned {
                replicas: replicas_of(rs),
                pods: pods.iter().filter(of_rs).count() as i64,
                ready: pods.iter().filter(of_rs).filter(|p| ready(p)).count() as i64,
                rs: rs.clone(),
            }
        })
        .collect();
    let desired = replicas_of(d);
    let new_index = owned.iter().position(|o| name(&o.rs) == new_name);
    let old_total: i64 = owned
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != new_index)
        .map(|(_, o)| o.replicas)
        .sum();
    let recreate = text(d, "/spec/strategy/type") == "Recreate";
    let rolling = d.pointer("/spec/strategy/rollingUpdate");
    let surge = resolve(
        rolling.and_then(|r| r.get("maxSurge")),
        "25%",
        desired,
        true,
    );
    let mut unavailable = resolve(
        rolling.and_then(|r| r.get("maxUnavailable")),
        "25%",
        desired,
        false,
    );
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }

    // A paused Deployment keeps its ReplicaSets as they are and makes none; its
    // status still follows the Pods.
    let paused = d.pointer("/spec/paused") == Some(&json!(true));
    // The new ReplicaSet, made with as many replicas as the surge allows.
    let new_index = match new_index {
        Some(i) => i,
        None if paused => {
            write_status(api, d, &owned, None, desired, unavailable).await;
            return;
        }
        None => {
            let replicas = if recreate {
                if old_total == 0 {
                    desired
                } else {
                    0
                }
            } else {
                desired.min((desired + surge - old_total).max(0))
            };
            let revision = owned.iter().map(|o| revision_of(&o.rs)).max().unwrap_or(0) + 1;
            let rs = replica_set_for(d, &template, &hash, &new_name, replicas, revision);
            match api.create(rs).await {
                Ok(rs) => owned.push(Owned {
                    rs,
                    replicas,
                    pods: 0,
                    ready: 0,
                }),
                Err(e) => {
                    tracing::debug!(deployment = name(d), error = %e, "deployment: cannot create the replica set");
                    return;
                }
            }
            owned.len() - 1
        }
    };

    let mut targets: Vec<i64> = owned.iter().map(|o| o.replicas).collect();
    if paused {
    } else if recreate {
        let old_pods: i64 = owned
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != new_index)
            .map(|(_, o)| o.pods)
            .sum();
        for (i, t) in targets.iter_mut().enumerate() {
            if i != new_index {
                *t = 0;
            }
        }
        if old_pods == 0 {
            targets[new_index] = desired;
        }
    } else {
        // Scale the new ReplicaSet up within the surge, counting Pods not yet gone
        // from a ReplicaSet scaled down, so the surge bounds real Pods too.
        let total: i64 = owned
            .iter()
            .zip(&targets)
            .map(|(o, t)| o.pods.max(*t))
            .sum();
        let new = targets[new_index];
        if new > desired {
            targets[new_index] = desired;
        } else if new < desired {
            let room = desired + surge - total;
            if room > 0 {
                targets[new_index] = desired.min(new + room);
            }
        }
        // Old ReplicaSets: unready replicas go freely; ready ones only while at least
        // `desired - maxUnavailable` stay available.
        let mut can_remove =
            owned.iter().map(Owned::available).sum::<i64>() - (desired - unavailable);
        for (i, o) in owned.iter().enumerate() {
            if i == new_index || targets[i] == 0 {
                continue;
            }
            let unready = (o.replicas - o.available()).max(0);
            let mut t = o.replicas - unready;
            let take = t.min(can_remove.max(0));
            t -= take;
            can_remove -= take;
            targets[i] = t;
        }
    }
    for (o, target) in owned.iter().zip(&targets) {
        if *target != o.replicas {
            let patch = json!({"spec": {"replicas": target}});
            if let Err(e) = api.patch_merge("replicasets", ns, name(&o.rs), patch).await {
                tracing::debug!(replicaset = name(&o.rs), error = %e, "deployment: cannot scale");
            }
        }
    }

    // Old ReplicaSets scaled to zero and empty, beyond `revisionHistoryLimit`
    // (default 10), oldest first.
    let limit = d
        .pointer("/spec/revisionHistoryLimit")
        .and_then(Value::as_i64)
        .unwrap_or(10)
        .max(0) as usize;
    let mut spent: Vec<&Owned> = owned
        .iter()
        .enumerate()
        .filter(|(i, o)| *i != new_index && targets[*i] == 0 && o.replicas == 0 && o.pods == 0)
        .map(|(_, o)| o)
        .collect();
    spent.sort_by_key(|o| revision_of(&o.rs));
    let excess = spent.len().saturating_sub(limit);
    for o in spent.iter().take(excess) {
        let _ = api.delete_with("replicasets", ns, name(&o.rs), &Default::default());
    }

    write_status(api, d, &owned, Some(new_index), desired, unavailable).await;
}

/// The Deployment's status from its ReplicaSets' Pods (`updatedReplicas` counts the
/// new ReplicaSet's, none when it is not made yet).
async fn write_status(
    api: &ApiServer,
    d: &Value,
    owned: &[Owned],
    new_index: Option<usize>,
    desired: i64,
    unavailable: i64,
) {
    let total_pods: i64 = owned.iter().map(|o| o.pods).sum();
    let total_ready: i64 = owned.iter().map(|o| o.ready).sum();
    let updated = new_index.and_then(|i| owned.get(i)).map_or(0, |o| o.pods);
    let available = total_ready >= desired - unavailable;
    let mut status = json!({
        "replicas": total_pods,
        "updatedReplicas": updated,
        "readyReplicas": total_ready,
        "availableReplicas": total_ready,
        "unavailableReplicas": (desired - total_ready).max(0),
        "conditions": [
            {
                "type": "Available",
                "status": if available { "True" } else { "False" },
                "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
            },
            {
                "type": "Progressing",
                "status": "True",
                "reason": if updated == desired && total_pods == desired { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
            },
        ],
    });
    if let Some(g) = d.pointer("/metadata/generation") {
        status["observedGeneration"] = g.clone();
    }
    if d.get("status") != Some(&status) {
        let mut with = d.clone();
        with["status"] = status;
        // A conflict means a newer Deployment: the next reconcile writes its status.
        let _ = api.update_status(with).await;
    }
}

fn replica_set_for(
    d: &Value,
    template: &Value,
    hash: &str,
    rs_name: &str,
    replicas: i64,
    revision: u64,
) -> Value {
    let mut template = template.clone();
    if !template.is_object() {
        template = json!({});
    }
    if !template.get("metadata").is_some_and(Value::is_object) {
        template["metadata"] = json!({});
    }
    if !template["metadata"]
        .get("labels")
        .is_some_and(Value::is_object)
    {
        template["metadata"]["labels"] = json!({});
    }
    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = d
        .pointer("/spec/selector")
        .filter(|s| s.is_object())
        .cloned()
        .unwrap_or(json!({}));
    if !selector.get("matchLabels").is_some_and(Value::is_object) {
        selector["matchLabels"] = json!({});
    }
    selector["matchLabels"]["pod-template-hash"] = json!(hash);
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": rs_name,
            "namespace": namespace(d),
            "labels": template["metadata"]["labels"].clone(),
            "annotations": {"deployment.kubernetes.io/revision": revision.to_string()},
            "ownerReferences": [owner_reference(d)],
        },
        "spec": {
            "replicas": replicas,
            "selector": selector,
            "template": template,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surge_and_unavailability_resolve_like_kubernetes() {
        assert_eq!(resolve(None, "25%", 3, true), 1);
        assert_eq!(resolve(None, "25%", 3, false), 0);
        assert_eq!(resolve(Some(&json!(2)), "25%", 3, true), 2);
        assert_eq!(resolve(Some(&json!("50%")), "25%", 3, false), 1);
        assert_eq!(resolve(Some(&json!("50%")), "25%", 3, true), 2);
    }
}
