//! Garbage collection and the namespace controller.
//!
//! An object whose owner references all name objects that are gone is deleted
//! (background propagation; a Pod gracefully). A Terminating Namespace has
//! everything in it deleted, and is removed once nothing is left (Pods wait for
//! their kubelet).

use std::collections::HashSet;

use serde_json::Value;

use super::{name, namespace, terminating, text, uid};
use crate::api_server::{plural_of_kind, served_plurals};
use crate::{ApiServer, DeleteOptions};

pub(super) fn reconcile(api: &ApiServer) {
    let plurals = served_plurals();
    let objects: Vec<(&'static str, Vec<Value>)> = plurals
        .iter()
        .map(|(p, _)| (*p, api.metadata_list(p)))
        .collect();
    let uids: HashSet<&str> = objects
        .iter()
        .flat_map(|(_, os)| os.iter().map(uid))
        .collect();
    for (plural, os) in &objects {
        for o in os {
            let Some(refs) = o
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
            else {
                continue;
            };
            if refs.is_empty() || terminating(o) {
                continue;
            }
            let any_alive = refs.iter().any(|r| {
                let owner_uid = text(r, "/uid");
                uids.contains(owner_uid) || owner_exists(api, o, r)
            });
            if !any_alive {
                let _ = api.delete_with(plural, namespace(o), name(o), &DeleteOptions::default());
            }
        }
    }
    // Namespaces being deleted: empty them, then remove them.
    let namespaces = objects
        .iter()
        .find(|(p, _)| *p == "namespaces")
        .map(|(_, os)| os.as_slice())
        .unwrap_or(&[]);
    for ns in namespaces.iter().filter(|n| terminating(n)) {
        let mut left = 0;
        for ((plural, namespaced), (_, os)) in plurals.iter().zip(&objects) {
            if !namespaced {
                continue;
            }
            for o in os.iter().filter(|o| namespace(o) == name(ns)) {
                left += 1;
                if !terminating(o) {
                    let _ =
                        api.delete_with(plural, namespace(o), name(o), &DeleteOptions::default());
                }
            }
        }
        if left == 0 {
            api.delete_now("namespaces", "", name(ns));
        }
    }
}

/// Looks the owner up now: it may have been created after the lists were read.
/// An owner of a type not served is assumed alive (never collect what cannot be judged).
fn owner_exists(api: &ApiServer, dependent: &Value, r: &Value) -> bool {
    let Some((plural, namespaced)) = plural_of_kind(text(r, "/apiVersion"), text(r, "/kind"))
    else {
        return true;
    };
    let ns = if namespaced { namespace(dependent) } else { "" };
    api.get(plural, ns, text(r, "/name"))
        .is_some_and(|o| uid(&o) == text(r, "/uid"))
}
