//! The cluster's controllers, each a task over the in-process [`ApiServer`]: they
//! write through the same path as HTTP clients, so the Pods they create pass
//! admission (the injector webhook included).
//!
//! - a scheduler that binds every unscheduled Pod to the one node;
//! - Deployments to ReplicaSets (`NAME-HASH`, rolling updates within `maxSurge` and
//!   `maxUnavailable`, gated on Pods' `Ready` condition) and their status;
//! - ReplicaSets to Pods (`RS-NAME-xxxxx`) and their status;
//! - EndpointSlices for every Service with a selector, from the Pods with an IP;
//! - garbage collection (objects whose owners are all gone are deleted) and the
//!   namespace controller (a Terminating Namespace is emptied, then removed).
//!
//! Each is level-driven: it reconciles everything it owns whenever the API server
//! changes, and at least every second (a failed write, e.g. a Pod create a webhook
//! refused, is retried that way).

mod deployment;
mod endpointslice;
mod garbage;
mod replicaset;
mod scheduler;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::ApiServer;

/// How long a controller waits for a change before reconciling anyway.
const RESYNC: Duration = Duration::from_secs(1);

/// The running controllers; dropping it stops every task.
pub struct Controllers {
    tasks: Vec<JoinHandle<()>>,
}

impl Controllers {
    /// Starts the scheduler (binding Pods to `node_name`), the Deployment, ReplicaSet,
    /// EndpointSlice, garbage-collection and namespace controllers. Must be called
    /// inside a tokio runtime.
    pub fn start(api: Arc<ApiServer>, node_name: &str) -> Controllers {
        let node = node_name.to_string();
        let tasks = vec![
            run(api.clone(), move |api| {
                let node = node.clone();
                async move { scheduler::reconcile(&api, &node).await }
            }),
            run(api.clone(), |api| async move {
                deployment::reconcile(&api).await
            }),
            run(api.clone(), |api| async move {
                replicaset::reconcile(&api).await
            }),
            run(api.clone(), |api| async move {
                endpointslice::reconcile(&api).await
            }),
            run(api, |api| async move { garbage::reconcile(&api) }),
        ];
        Controllers { tasks }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn run<F, Fut>(api: Arc<ApiServer>, reconcile: F) -> JoinHandle<()>
where
    F: Fn(Arc<ApiServer>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut changes = api.changes();
        loop {
            changes.borrow_and_update();
            reconcile(api.clone()).await;
            // Ends on a change or after the resync; the sender lives as long as `api`.
            let _ = tokio::time::timeout(RESYNC, changes.changed()).await;
        }
    })
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn namespace(v: &Value) -> &str {
    text(v, "/metadata/namespace")
}

fn name(v: &Value) -> &str {
    text(v, "/metadata/name")
}

fn uid(v: &Value) -> &str {
    text(v, "/metadata/uid")
}

fn terminating(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp").is_some()
}

/// The uid of the object's controller owner, if it has one.
fn controller_uid(v: &Value) -> Option<&str> {
    v.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| r.get("uid").and_then(Value::as_str))
}

/// A Pod that counts for its controller: not being deleted, not finished.
fn active(pod: &Value) -> bool {
    !terminating(pod) && !matches!(text(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// The Pod's `Ready` condition is `True`.
fn ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type") == Some(&"Ready".into()) && c.get("status") == Some(&"True".into())
            })
        })
}

/// A controller owner reference to `owner`.
fn owner_reference(owner: &Value) -> Value {
    serde_json::json!({
        "apiVersion": text(owner, "/apiVersion"),
        "kind": text(owner, "/kind"),
        "name": name(owner),
        "uid": uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Does this (object of string) label set hold every `matchLabels` pair of the
/// selector and satisfy its `matchExpressions`?
fn selects(selector: &Value, labels: &Value) -> bool {
    crate::api_server::label_selector_matches(selector, labels).unwrap_or(false)
}

/// FNV-1a (32 bits) over the value with object keys in sorted order, so the same
/// content hashes the same whatever order its keys were written in.
fn stable_hash(v: &Value) -> u32 {
    fn feed(h: &mut u32, bytes: &[u8]) {
        for b in bytes {
            *h ^= u32::from(*b);
            *h = h.wrapping_mul(0x0100_0193);
        }
    }
    fn walk(h: &mut u32, v: &Value) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                feed(h, b"{");
                for k in keys {
                    feed(h, k.as_bytes());
                    feed(h, b":");
                    walk(h, &m[k]);
                    feed(h, b",");
                }
                feed(h, b"}");
            }
            Value::Array(a) => {
                feed(h, b"[");
                for x in a {
                    walk(h, x);
                    feed(h, b",");
                }
                feed(h, b"]");
            }
            other => feed(h, other.to_string().as_bytes()),
        }
    }
    let mut h = 0x811c_9dc5;
    walk(&mut h, v);
    h
}

/// A hash as Kubernetes spells it in names (`SafeEncodeString` of its decimal form:
/// no vowels, no look-alike characters).
fn safe_encode(n: u32) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    n.to_string()
        .bytes()
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hashes_ignore_key_order_and_names_are_safe() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"c":[1,2],"d":"x"}}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"b":{"d":"x","c":[1,2]},"a":1}"#).expect("json");
        assert_eq!(stable_hash(&a), stable_hash(&b));
        assert_ne!(stable_hash(&a), stable_hash(&json!({"a": 2})));
        let name = safe_encode(stable_hash(&a));
        assert!(
            name.chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
            "{name}"
        );
    }

    #[test]
    fn readiness_and_activity() {
        let pod = json!({"metadata": {}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(ready(&pod) && active(&pod));
        let gone = json!({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Running"}});
        assert!(!ready(&gone) && !active(&gone));
    }
}
