//! What kube-proxy and cluster DNS read of the store: each Service with its ready
//! endpoints, from its EndpointSlices when it has any, else from the ready pods its
//! selector matches.

use std::net::{Ipv4Addr, SocketAddrV4};

use serde_json::Value;

use super::node::{ServiceEntry, ServicePort};
use crate::ApiServer;

fn str_at<'a>(v: &'a Value, p: &str) -> Option<&'a str> {
    v.pointer(p).and_then(Value::as_str)
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| str_at(c, "/type") == Some("Ready") && str_at(c, "/status") == Some("True"))
}

fn selects(selector: &serde_json::Map<String, Value>, pod: &Value) -> bool {
    let labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
    !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// A service port's target on one pod: a number, or a container port's name.
fn target_port(port: &Value, pod: &Value) -> Option<u16> {
    let number = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    match port.get("targetPort") {
        None => number(port.get("port")?),
        Some(Value::String(name)) => pod
            .pointer("/spec/containers")?
            .as_array()?
            .iter()
            .flat_map(|c| {
                c.get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .find(|p| str_at(p, "/name") == Some(name))
            .and_then(|p| number(p.get("containerPort")?)),
        Some(v) => number(v),
    }
}

/// Every Service of the store as the node programs it. Services without a cluster IP
/// that are not headless (`clusterIP: None`) are left out: nothing allocates one.
pub(crate) fn service_entries(api: &ApiServer) -> Vec<ServiceEntry> {
    let pods = api.list("pods");
    let slices = api.list("endpointslices");
    let mut entries = Vec::new();
    for svc in api.list("services") {
        let ns = str_at(&svc, "/metadata/namespace").unwrap_or("default");
        let Some(name) = str_at(&svc, "/metadata/name") else {
            continue;
        };
        let cluster_ip = match str_at(&svc, "/spec/clusterIP") {
            Some("None") => None,
            Some(ip) => match ip.parse::<Ipv4Addr>() {
                Ok(ip) => Some(ip),
                Err(_) => continue,
            },
            None => continue,
        };
        let ports: Vec<&Value> = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .map(|p| p.iter().collect())
            .unwrap_or_default();
        let own_slices: Vec<&Value> = slices
            .iter()
            .filter(|s| {
                str_at(s, "/metadata/namespace") == Some(ns)
                    && str_at(s, "/metadata/labels/kubernetes.io~1service-name") == Some(name)
            })
            .collect();
        let mut entry = ServiceEntry {
            namespace: ns.to_string(),
            name: name.to_string(),
            cluster_ip,
            ports: Vec::new(),
            ready_ips: Vec::new(),
        };
        if own_slices.is_empty() {
            let selector = svc.pointer("/spec/selector").and_then(Value::as_object);
            let ready: Vec<(&Value, Ipv4Addr)> = pods
                .iter()
                .filter(|p| str_at(p, "/metadata/namespace") == Some(ns))
                .filter(|p| selector.is_some_and(|s| selects(s, p)) && pod_ready(p))
                .filter_map(|p| Some((p, str_at(p, "/status/podIP")?.parse().ok()?)))
                .collect();
            entry.ready_ips = ready.iter().map(|(_, ip)| *ip).collect();
            for port in &ports {
                let Some(number) = port.get("port").and_then(Value::as_u64) else {
                    continue;
                };
                entry.ports.push(ServicePort {
                    port: number as u16,
                    protocol: str_at(port, "/protocol").unwrap_or("TCP").to_string(),
                    endpoints: ready
                        .iter()
                        .filter_map(|(p, ip)| Some(SocketAddrV4::new(*ip, target_port(port, p)?)))
                        .collect(),
                });
            }
        } else {
            for slice in &own_slices {
                for ep in slice
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
                        continue;
                    }
                    entry.ready_ips.extend(
                        ep.get("addresses")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter_map(|a| a.as_str()?.parse::<Ipv4Addr>().ok()),
                    );
                }
            }
            for port in &ports {
                let Some(number) = port.get("port").and_then(Value::as_u64) else {
                    continue;
                };
                let port_name = str_at(port, "/name").unwrap_or("");
                let mut endpoints = Vec::new();
                for slice in &own_slices {
                    let Some(target) = slice
                        .get("ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .find(|p| str_at(p, "/name").unwrap_or("") == port_name)
                        .and_then(|p| p.get("port")?.as_u64())
                    else {
                        continue;
                    };
                    for ep in slice
                        .get("endpoints")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
                            continue;
                        }
                        for a in ep
                            .get("addresses")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            if let Some(ip) = a.as_str().and_then(|a| a.parse().ok()) {
                                endpoints.push(SocketAddrV4::new(ip, target as u16));
                            }
                        }
                    }
                }
                entry.ports.push(ServicePort {
                    port: number as u16,
                    protocol: str_at(port, "/protocol").unwrap_or("TCP").to_string(),
                    endpoints,
                });
            }
        }
        entries.push(entry);
    }
    entries
}
