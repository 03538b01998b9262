//! Which pods to scrape and tap: the meshed pods of the index.

use std::collections::HashMap;
use std::net::IpAddr;

use ballast_index::resource::{Phase, Pod};
use ballast_index::Index;

use crate::api::ResourceRef;

/// A meshed pod: where its proxy's admin (`/metrics`) and Tap APIs listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    /// Kind `pod`.
    pub pod: ResourceRef,
    /// Its top owner as Linkerd names it (`deployment`, `statefulset`, ...).
    pub workload: Option<ResourceRef>,
    pub ip: IpAddr,
    pub admin_port: u16,
    pub tap_port: u16,
    pub service_account: String,
}

/// What the collector reads from the index each cycle.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Running, not terminating, with an IP and a proxy; sorted by pod.
    pub meshed: Vec<PodTarget>,
    /// Every live pod per workload (meshed or not), for "meshed 2/3".
    pub pods_per_workload: HashMap<ResourceRef, u32>,
}

/// The workload `pod` belongs to, as Linkerd's `dst_*` labels name it.
pub fn workload_of(pod: &Pod) -> Option<ResourceRef> {
    let (kind, name) = ballast_index::owner_label(pod)?;
    Some(ResourceRef {
        kind: if kind == "k8s_job" {
            "job".into()
        } else {
            kind
        },
        namespace: pod.key.namespace.to_string(),
        name,
    })
}

pub fn snapshot(index: &Index) -> Snapshot {
    let mut snap = Snapshot::default();
    for pod in index.pods() {
        if pod.terminating || matches!(pod.phase, Phase::Succeeded | Phase::Failed) {
            continue;
        }
        let workload = workload_of(pod);
        if let Some(w) = &workload {
            *snap.pods_per_workload.entry(w.clone()).or_default() += 1;
        }
        let (Some(ports), Some(ip), Phase::Running) = (pod.proxy_ports, pod.ips.first(), pod.phase)
        else {
            continue;
        };
        snap.meshed.push(PodTarget {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: pod.key.namespace.to_string(),
                name: pod.key.name.to_string(),
            },
            workload,
            ip: *ip,
            admin_port: ports.admin,
            tap_port: ports.tap,
            service_account: pod.service_account.clone(),
        });
    }
    snap.meshed.sort_by(|a, b| a.pod.cmp(&b.pod));
    snap
}
