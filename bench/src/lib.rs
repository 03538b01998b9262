//! What the benchmarks share: the controller under test as a process, and
//! the probes that read it from outside (HTTP, /proc).

// What the proxy benchmarks share (proxy, mtls, policy, tap; viz reads
// processes' CPU): load generators, the servers under test, /proc probes.
#[path = "proxy/load.rs"]
pub mod load;
#[path = "proxy/servers.rs"]
pub mod servers;
#[path = "proxy/system.rs"]
pub mod system;

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

    /// Fails if the controller has exited: what it measured is not its own.
    pub fn running(&mut self) -> anyhow::Result<()> {
        running(&mut self.child, "ballast destination")
    }
}

/// Fails if the child `name` has exited (a process that exited during a
/// measurement makes its figures those of nothing).
pub fn running(child: &mut Child, name: &str) -> anyhow::Result<()> {
    match child.try_wait()? {
        Some(status) => anyhow::bail!("{name} exited during the benchmark ({status})"),
        None => Ok(()),
    }
}

/// Starts `ballast destination ARGS` and waits for `/ready`; returns it with
/// the time from spawn to ready.
pub async fn start(ballast: &Path, args: &[String]) -> anyhow::Result<(Controller, Duration)> {
    let started = Instant::now();
    let (child, [grpc, admin]) = spawn_listening(
        "ballast destination",
        Command::new(ballast)
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
            .env("BALLAST_LOG", "warn,ballast=info"),
        ["destination gRPC listening on ", "admin listening on "],
        is_error_line,
    )
    .await?;
    let mut c = Controller { child, grpc, admin };
    wait_ready(
        "ballast destination",
        &c.admin,
        &mut c.child,
        started + Duration::from_secs(300),
    )
    .await?;
    Ok((c, started.elapsed()))
}

/// Spawns a server child (no stdin, stdout dropped, killed when dropped) and
/// reads its log (stderr) until it has named an address after each of
/// `markers` (`admin listening on `): the first word after it, without
/// `http://` and a trailing `/`. The addresses come in the order of
/// `markers`. Then its log is drained for as long as it runs, so that it
/// never blocks on a full pipe, and the lines `show` picks are printed.
pub async fn spawn_listening<const N: usize>(
    name: &str,
    cmd: &mut Command,
    markers: [&str; N],
    show: fn(&str) -> bool,
) -> anyhow::Result<(Child, [String; N])> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = system::dies_with_bench(child)
        .spawn()
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    // What it said before exiting is the only clue to why it did.
    let mut said = Vec::new();
    while found.iter().any(Option::is_none) {
        let Some(line) = lines.next_line().await? else {
            anyhow::bail!("{name} exited early: {}", said.join(" | "));
        };
        for (addr, marker) in found.iter_mut().zip(markers) {
            if addr.is_none() {
                *addr = address_after(&line, marker);
            }
        }
        said.push(line);
    }
    let prefix = format!("  [{name}]");
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if show(&line) {
                eprintln!("{prefix} {line}");
            }
        }
    });
    Ok((child, found.map(Option::unwrap_or_default)))
}

/// Log lines worth showing while a benchmark runs: errors and panics.
pub fn is_error_line(line: &str) -> bool {
    line.contains("ERROR") || line.contains("panic")
}

/// `ADDR` of `... MARKER[http://]ADDR[/] ...`.
fn address_after(line: &str, marker: &str) -> Option<String> {
    let (_, rest) = line.split_once(marker)?;
    let word = rest.split_whitespace().next()?;
    Some(
        word.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
    )
}

/// Waits until the admin server at `admin` answers `/ready` with 200; fails
/// at once if `child` (`name`) exits first.
pub async fn wait_ready(
    name: &str,
    admin: &str,
    child: &mut Child,
    deadline: Instant,
) -> anyhow::Result<()> {
    while http_get(admin, "/ready").await.0 != 200 {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{name} exited before it was ready ({status})");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name} never answered {admin}/ready with 200"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A benchmark's command line, read flag by flag: the caller matches each
/// flag and takes its value ([`Flags::value`]), so that switches (flags
/// without a value) and a `--` before arguments passed on fit too.
pub struct Flags {
    args: std::vec::IntoIter<String>,
    usage: &'static str,
    /// The flag last returned, for the error when its value is missing.
    flag: String,
}

/// The flags of this process's command line; `usage` is printed for
/// `--help` and `-h`, and after every error about them.
pub fn flags(usage: &'static str) -> Flags {
    Flags::new(std::env::args().skip(1).collect(), usage)
}

impl Flags {
    fn new(args: Vec<String>, usage: &'static str) -> Self {
        Flags {
            args: args.into_iter(),
            usage,
            flag: String::new(),
        }
    }

    /// The next flag, or `None` at the end; `--help` and `-h` print the
    /// usage and exit.
    pub fn next_flag(&mut self) -> Option<String> {
        let flag = self.args.next()?;
        if flag == "--help" || flag == "-h" {
            println!("{}", self.usage);
            std::process::exit(0);
        }
        self.flag.clone_from(&flag);
        Some(flag)
    }

    /// The value of the flag last returned.
    pub fn value(&mut self) -> anyhow::Result<String> {
        self.args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{} needs a value\n{}", self.flag, self.usage))
    }

    /// The value of the flag last returned, parsed.
    pub fn parse<T: std::str::FromStr>(&mut self) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let value = self.value()?;
        value
            .parse()
            .map_err(|e| anyhow::anyhow!("{} {value}: {e}", self.flag))
    }

    /// All the arguments left (those after `--`), as they are.
    pub fn rest(&mut self) -> Vec<String> {
        self.args.by_ref().collect()
    }

    /// The error for a flag the caller does not know.
    pub fn unknown(&self, flag: &str) -> anyhow::Error {
        anyhow::anyhow!("unknown flag {flag}\n{}", self.usage)
    }
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
    status_kib(pid, "VmRSS:", "VmHWM:")
}

/// Two `/proc/PID/status` fields given in KiB (0 for one missing).
pub fn status_kib(pid: u32, first: &str, second: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field(first), field(second))
}

/// Pod `n` of a generated cluster (10 per service, 10 namespaces), shaped as
/// the API server returns it: managedFields, images, env, volumes, statuses.
pub fn pod(n: usize) -> serde_json::Value {
    pod_of(n, 10)
}

/// Pod `n` of a generated cluster of `per_service` pods per service (pod
/// `n` in service `n / per_service`), shaped as [`pod`].
pub fn pod_of(n: usize, per_service: usize) -> serde_json::Value {
    let svc = n / per_service.max(1);
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

impl Memory {
    /// Fails unless both figures came out positive: a zero is a process
    /// that was gone (no /proc entry) or a /metrics page that did not answer.
    pub fn measured(self, what: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            self.rss > 0 && self.allocated > 0,
            "{what}: memory not measured (RSS {} KiB, allocated {} KiB): \
             the process is gone or its /metrics did not answer",
            self.rss,
            self.allocated
        );
        Ok(self)
    }
}

pub async fn memory(c: &Controller) -> Memory {
    Memory {
        rss: rss(c.pid()).0,
        allocated: allocated(&c.admin).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_switches_values_and_rest() {
        let args = ["--pods", "5", "--quick", "--keep", "dir", "--", "--x", "y"];
        let mut f = Flags::new(args.map(String::from).to_vec(), "USAGE");
        let (mut pods, mut quick, mut keep, mut extra) = (0, false, String::new(), vec![]);
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--pods" => pods = f.parse().unwrap(),
                "--quick" => quick = true,
                "--keep" => keep = f.value().unwrap(),
                "--" => extra = f.rest(),
                other => panic!("{}", f.unknown(other)),
            }
        }
        assert_eq!((pods, quick, keep.as_str()), (5, true, "dir"));
        assert_eq!(extra, ["--x", "y"]);
    }

    #[test]
    fn flag_errors_name_the_flag_and_show_the_usage() {
        let mut f = Flags::new(vec!["--pods".into()], "USAGE");
        assert_eq!(f.next_flag().as_deref(), Some("--pods"));
        assert_eq!(
            f.value().unwrap_err().to_string(),
            "--pods needs a value\nUSAGE"
        );
        assert_eq!(
            f.unknown("--nope").to_string(),
            "unknown flag --nope\nUSAGE"
        );
        let mut f = Flags::new(vec!["--pods".into(), "many".into()], "USAGE");
        f.next_flag();
        let e = f.parse::<usize>().unwrap_err().to_string();
        assert!(e.starts_with("--pods many: "), "{e}");
    }

    #[test]
    fn addresses_after_markers() {
        let line = "2026-01-01T00:00:00Z  INFO viz dashboard listening on http://127.0.0.1:8084/";
        assert_eq!(
            address_after(line, "dashboard listening on ").as_deref(),
            Some("127.0.0.1:8084")
        );
        assert_eq!(address_after(line, "admin listening on "), None);
        assert_eq!(
            address_after("INFO admin listening on 127.0.0.1:1", "admin listening on ").as_deref(),
            Some("127.0.0.1:1")
        );
        assert_eq!(
            address_after("admin listening on ", "admin listening on "),
            None
        );
    }
}
