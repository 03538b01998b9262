//! What one pod costs in memory, stage by stage (not a test).
//!
//! Decodes N generated pods (shaped as the API server sends them) into the
//! index's projection, then holds them in the index, and reports the bytes
//! jemalloc holds per pod after each stage.
//!
//! Usage: index-memory [N]

use ballast_destination::{
    index::{Index, IndexConfig},
    resource::Resource,
};
use serde_json::json;
use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn allocated() -> usize {
    let _ = epoch::advance();
    stats::allocated::read().unwrap_or(0)
}

fn pod(n: usize) -> serde_json::Value {
    let svc = n / 10;
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("svc-{svc}-6d4cf56db6-p{n}"), "namespace": format!("ns-{}", svc % 10),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app": format!("svc-{svc}"), "pod-template-hash": "6d4cf56db6",
                       "linkerd.io/control-plane-ns": "linkerd"},
            "annotations": {"linkerd.io/proxy-version": "stable",
                            "kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": format!("svc-{svc}-6d4cf56db6"), "controller": true}],
        },
        "spec": {
            "serviceAccountName": format!("svc-{svc}"), "nodeName": format!("node-{}", n % 50),
            "containers": [
                {"name": "app", "image": "example/app:1.0",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]},
                {"name": "linkerd-proxy", "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"}]},
            ],
        },
        "status": {
            "phase": "Running", "podIP": format!("10.{}.{}.{}", n / 62_500, n / 250 % 250, n % 250 + 1),
            "hostIP": format!("172.16.0.{}", n % 50 + 1),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let base = allocated();
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        match Resource::from_value(pod(i)) {
            Ok(Some(r)) => pods.push(r),
            other => panic!("pod {i} did not decode: {other:?}"),
        }
    }
    let decoded = allocated();
    let mut index = Index::new(IndexConfig::default());
    for p in pods.iter().cloned() {
        index.apply(p);
    }
    let indexed = allocated();
    drop(pods);
    let held = allocated();
    let per = |a: usize, b: usize| (b.saturating_sub(a)) as f64 / n as f64;
    println!("{n} pods");
    println!("| stage | bytes per pod |");
    println!("|---|---|");
    println!(
        "| decoded projection (Arc<Pod>) | {:.0} |",
        per(base, decoded)
    );
    println!("| index maps on top | {:.0} |", per(decoded, indexed));
    println!(
        "| index alone, projections shared | {:.0} |",
        per(base, held)
    );
}
