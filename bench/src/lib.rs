//! What the benchmarks share: the controller under test as a process, and
//! the probes that read it from outside (HTTP, /proc).

use serde_json::json;
use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    process::{Child, Command},
};

/// A `ballast destination` process on OS-picked ports.
pub struct Controller {
    pub child: Child,
    pub grpc: String,
    pub admin: String,
}

impl Controller {
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

/// Starts `ballast destination ARGS` and waits for `/ready`; returns it with
/// the time from spawn to ready.
pub async fn start(ballast: &Path, args: &[String]) -> anyhow::Result<(Controller, Duration)> {
    let started = Instant::now();
    let mut child = Command::new(ballast)
        .args([
            "destination",
            "--addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--policy-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .env("BALLAST_LOG", "warn,ballast=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (mut grpc, mut admin) = (None, None);
    while grpc.is_none() || admin.is_none() {
        let line = lines
            .next_line()
            .await?
            .ok_or_else(|| anyhow::anyhow!("ballast exited early"))?;
        let after = |m: &str| line.split(m).nth(1).map(|s| s.trim().to_string());
        grpc = grpc.or(after("destination gRPC listening on "));
        admin = admin.or(after("admin listening on "));
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let c = Controller {
        child,
        grpc: grpc.unwrap_or_default(),
        admin: admin.unwrap_or_default(),
    };
    while http_get(&c.admin, "/ready").await.0 != 200 {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(300), "not ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((c, started.elapsed()))
}

/// A plain HTTP/1.1 GET: (status, whole response text).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// jemalloc's allocated bytes, from the controller's /metrics, in KiB.
pub async fn allocated(admin: &str) -> u64 {
    let (_, text) = http_get(admin, "/metrics").await;
    text.lines()
        .find(|l| l.starts_with("process_memory_allocated_bytes "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|b| (b / 1024.0) as u64)
        .unwrap_or(0)
}

/// (VmRSS, VmHWM) of a process, in KiB.
pub fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Pod `n` of a generated cluster (10 per service, 10 namespaces), shaped as
/// the API server returns it: managedFields, images, env, volumes, statuses.
pub fn pod(n: usize) -> serde_json::Value {
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
                                 "name": format!("svc-{svc}-6d4cf56db6"), "controller": true,
                                 "uid": format!("0f6c2a34-1111-2222-3333-{n:012}")}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}, "f:pod-template-hash": {}}},
                                            "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {"f:image": {}}}}}}],
        },
        "spec": {
            "serviceAccountName": format!("svc-{svc}"), "nodeName": format!("node-{}", n % 50),
            "containers": [
                {"name": "app", "image": "example/app:1.0",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:stable",
                 "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                         {"name": "LINKERD2_PROXY_LOG", "value": "warn,linkerd=info"}]},
            ],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
        },
        "status": {
            "phase": "Running",
            "podIP": format!("10.{}.{}.{}", n / 62_500 + 1, n / 250 % 250, n % 250 + 1),
            "hostIP": format!("172.16.0.{}", n % 50 + 1),
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "example/app:1.0"}],
        },
    })
}

/// Service `i` of a generated cluster, selecting its 10 pods.
pub fn service(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": format!("ns-{}", i % 10)},
        "spec": {"clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
                 "selector": {"app": format!("svc-{i}")},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    })
}

/// Writes a file whole (the manifests source never reads half of it).
pub fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// The `p` quantile (0..=1) of sorted durations; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// A process's memory at one moment: RSS and jemalloc allocated, KiB.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub rss: u64,
    pub allocated: u64,
}

pub async fn memory(c: &Controller) -> Memory {
    Memory {
        rss: rss(c.pid()).0,
        allocated: allocated(&c.admin).await,
    }
}
