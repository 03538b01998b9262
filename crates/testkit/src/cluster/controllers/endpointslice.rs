//! The EndpointSlice controller: for every Service with a selector, slices of the
//! selected Pods that have an IP, one slice per set of resolved ports (a named
//! `targetPort` resolves against each Pod's container ports), named
//! `SERVICE-HASH`, labelled `kubernetes.io/service-name`, owned by the Service.
//! Conditions follow the Pod: `ready` when Ready and not terminating, `serving` when
//! Ready, `terminating` when marked for deletion.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{
    name, namespace, owner_reference, ready, safe_encode, selects, stable_hash, terminating, text,
    uid,
};
use crate::ApiServer;

const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

pub(super) async fn reconcile(api: &ApiServer) {
    let pods = api.list("pods");
    let slices = api.list("endpointslices");
    let services = api.list("services");
    for svc in &services {
        let selector = svc
            .pointer("/spec/selector")
            .cloned()
            .unwrap_or(Value::Null);
        if selector.as_object().is_none_or(|m| m.is_empty()) {
            continue;
        }
        let wanted = desired(svc, &selector, &pods);
        let mine = |s: &&Value| {
            namespace(s) == namespace(svc)
                && text(s, "/metadata/labels/kubernetes.io~1service-name") == name(svc)
                && text(
                    s,
                    "/metadata/labels/endpointslice.kubernetes.io~1managed-by",
                ) == MANAGED_BY
        };
        let existing: Vec<&Value> = slices.iter().filter(mine).collect();
        for (slice_name, slice) in &wanted {
            match existing.iter().find(|s| name(s) == slice_name) {
                Some(stored) if same(stored, slice) => {}
                Some(stored) => {
                    let mut updated = slice.clone();
                    updated["metadata"]["resourceVersion"] =
                        stored["metadata"]["resourceVersion"].clone();
                    let _ = api.update(updated).await;
                }
                None => {
                    if let Err(e) = api.create(slice.clone()).await {
                        tracing::debug!(service = name(svc), error = %e, "endpointslice: cannot create");
                    }
                }
            }
        }
        for stale in existing.iter().filter(|s| !wanted.contains_key(name(s))) {
            api.delete_now("endpointslices", namespace(stale), name(stale));
        }
    }
    // Slices of Services gone, or no longer selecting: the controller's to remove.
    for s in &slices {
        if text(
            s,
            "/metadata/labels/endpointslice.kubernetes.io~1managed-by",
        ) != MANAGED_BY
        {
            continue;
        }
        let svc_name = text(s, "/metadata/labels/kubernetes.io~1service-name");
        let has_service = services.iter().any(|svc| {
            namespace(svc) == namespace(s)
                && name(svc) == svc_name
                && svc
                    .pointer("/spec/selector")
                    .and_then(Value::as_object)
                    .is_some_and(|m| !m.is_empty())
        });
        if !has_service {
            api.delete_now("endpointslices", namespace(s), name(s));
        }
    }
}

fn same(stored: &Value, wanted: &Value) -> bool {
    ["endpoints", "ports", "addressType"]
        .iter()
        .all(|k| stored.get(*k) == wanted.get(*k))
        && stored.pointer("/metadata/labels") == wanted.pointer("/metadata/labels")
}

/// A Service port resolved against one Pod: (name, port, protocol, appProtocol).
fn resolve_ports(svc: &Value, pod: &Value) -> Vec<Value> {
    let service_ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for sp in &service_ports {
        let protocol = sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        let port = match sp.get("targetPort") {
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(named)) => match named.parse::<i64>() {
                Ok(n) => Some(n),
                Err(_) => containers
                    .iter()
                    .flat_map(|c| {
                        c.get("ports")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default()
                    })
                    .find(|p| {
                        p.get("name").and_then(Value::as_str) == Some(named.as_str())
                            && p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                                == protocol
                    })
                    .and_then(|p| p.get("containerPort").and_then(Value::as_i64)),
            },
            _ => sp.get("port").and_then(Value::as_i64),
        };
        let Some(port) = port else {
            continue;
        };
        let mut p = json!({
            "name": sp.get("name").and_then(Value::as_str).unwrap_or(""),
            "port": port,
            "protocol": protocol,
        });
        if let Some(ap) = sp.get("appProtocol") {
            p["appProtocol"] = ap.clone();
        }
        out.push(p);
    }
    out
}

/// The slices the Service should have, by name.
fn desired(svc: &Value, selector: &Value, pods: &[Value]) -> BTreeMap<String, Value> {
    let publish_not_ready = svc
        .pointer("/spec/publishNotReadyAddresses")
        .and_then(Value::as_bool)
        == Some(true);
    let mut groups: BTreeMap<String, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
    let selector = json!({"matchLabels": selector});
    let mut chosen: Vec<&Value> = pods
        .iter()
        .filter(|p| namespace(p) == namespace(svc))
        .filter(|p| {
            selects(
                &selector,
                p.pointer("/metadata/labels").unwrap_or(&Value::Null),
            )
        })
        .filter(|p| !text(p, "/status/podIP").is_empty())
        .filter(|p| !matches!(text(p, "/status/phase"), "Succeeded" | "Failed"))
        .collect();
    chosen.sort_by_key(|p| name(p).to_string());
    for pod in chosen {
        let ports = resolve_ports(svc, pod);
        if ports.is_empty() {
            continue;
        }
        let is_ready = ready(pod);
        let gone = terminating(pod);
        let mut endpoint = json!({
            "addresses": [text(pod, "/status/podIP")],
            "conditions": {
                "ready": (is_ready || publish_not_ready) && !gone,
                "serving": is_ready || publish_not_ready,
                "terminating": gone,
            },
            "targetRef": {"kind": "Pod", "namespace": namespace(pod), "name": name(pod), "uid": uid(pod)},
        });
        let node = text(pod, "/spec/nodeName");
        if !node.is_empty() {
            endpoint["nodeName"] = json!(node);
        }
        let key = format!(
            "{}-{}",
            name(svc),
            safe_encode(stable_hash(&Value::Array(ports.clone())))
        );
        groups
            .entry(key)
            .or_insert_with(|| (ports, Vec::new()))
            .1
            .push(endpoint);
    }
    groups
        .into_iter()
        .map(|(slice_name, (ports, endpoints))| {
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": slice_name,
                    "namespace": namespace(svc),
                    "labels": {
                        "kubernetes.io/service-name": name(svc),
                        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                    },
                    "ownerReferences": [owner_reference(svc)],
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": ports,
            });
            (slice_name, slice)
        })
        .collect()
}
