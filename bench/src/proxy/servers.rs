//! The processes of the proxy benchmark: nginx as the backend, haproxy and
//! `ballast proxy` as the proxies under test, each pinned with `taskset`.

use super::load::Conn;
use crate::spawn_listening;
use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};
use tokio::process::{Child, Command};

/// The service the Ballast proxy is asked for (explicit mode, by Host).
pub const SERVICE_HOST: &str = "backend.bench.svc.cluster.local";

/// The service of the two-hop path: its one endpoint is proxy B's inbound
/// listener, which forwards to the backend.
pub const HOP_HOST: &str = "hop.bench.svc.cluster.local";

/// Body size of the backend's one response.
pub const BODY_BYTES: usize = 1024;

/// A port the OS picked on 127.0.0.1, released for a child to bind. Another
/// process could take it in between; the children's start-up checks say so.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A child process serving HTTP on `addr`.
pub struct Server {
    pub child: Child,
    pub addr: String,
    /// A Ballast proxy's admin listener (/metrics).
    pub admin: Option<String>,
    /// A Ballast proxy's inbound listener.
    pub inbound: Option<String>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

fn taskset(core: u32, program: &str) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", &core.to_string(), program])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    crate::system::dies_with_bench(&mut c);
    c
}

/// Waits until one GET through `addr` with `Host: host` answers 200.
pub async fn wait_ok(
    addr: &str,
    host: &str,
    child: &mut Child,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("exited early ({status})");
        }
        let attempt = async {
            let mut c = Conn::open(addr).await?;
            c.get(host).await
        };
        match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(200)) => return Ok(()),
            Ok(Ok(status)) => last = format!("status {status}"),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("{addr} not answering 200 within {within:?}: {last}")
}

/// nginx (Debian), one worker, no master, a fixed body, keep-alive, room
/// for `max_conns` connections.
pub async fn nginx(dir: &Path, core: u32, max_conns: usize) -> anyhow::Result<Server> {
    let port = free_port()?;
    let nofile = max_conns + 1024;
    let d = dir.display();
    let body = "x".repeat(BODY_BYTES);
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log stderr warn;\nworker_rlimit_nofile {nofile};\n\
         events {{ worker_connections {max_conns}; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 keepalive_requests 100000000;\n  keepalive_timeout 3600s;\n\
         \x20 default_type text/plain;\n\
         \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 \"{body}\"; }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let mut child = taskset(core, "nginx")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .args(["-e", "stderr"])
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| anyhow::anyhow!("nginx: {e} (apt-get install nginx)"))?;
    let addr = format!("127.0.0.1:{port}");
    wait_ok(&addr, "b", &mut child, Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("nginx: {e}"))?;
    Ok(Server {
        child,
        addr,
        admin: None,
        inbound: None,
    })
}

/// haproxy (Debian) as the equivalent reverse proxy: HTTP mode, keep-alive
/// on both sides, one server, idle server connections shared. `name` keeps
/// the configuration files of chained instances apart.
pub async fn haproxy(
    dir: &Path,
    name: &str,
    backend: &str,
    core: u32,
    maxconn: usize,
) -> anyhow::Result<Server> {
    let port = free_port()?;
    // maxconn bounds the descriptors haproxy asks for (2 per connection).
    let conf = format!(
        "global\n  nbthread 1\n  maxconn {maxconn}\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 3600s\n\
         \x20 timeout server 3600s\n  timeout http-keep-alive 3600s\n\
         frontend fe\n  bind 127.0.0.1:{port}\n  default_backend be\n\
         backend be\n  http-reuse always\n  server s1 {backend}\n"
    );
    let path = dir.join(format!("{name}.cfg"));
    std::fs::write(&path, conf)?;
    let mut child = taskset(core, "haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| anyhow::anyhow!("haproxy: {e} (apt-get install haproxy)"))?;
    let addr = format!("127.0.0.1:{port}");
    wait_ok(&addr, SERVICE_HOST, &mut child, Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    Ok(Server {
        child,
        addr,
        admin: None,
        inbound: None,
    })
}

/// The arguments that start the proxy of `binary`: `ballast proxy`, or the
/// sidecar binary `ballast-proxy` alone.
pub fn proxy_subcommand(binary: &Path) -> &'static [&'static str] {
    if binary.file_name().is_some_and(|n| n == "ballast-proxy") {
        &[]
    } else {
        &["proxy"]
    }
}

/// `ballast proxy --help`, or `None` when this build has no proxy.
pub async fn ballast_proxy_help(ballast: &Path) -> Option<String> {
    let out = Command::new(ballast)
        .args(proxy_subcommand(ballast))
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The manifests the controller serves: one Service whose one endpoint is
/// the backend, and one (`hop`) whose one endpoint is proxy B's inbound
/// listener on `hop_port`. With `meshed_route`, each takes the path a meshed
/// pod's request takes (as bench/callgrind/run.sh's): failure accrual on the
/// Service, and an HTTPRoute from OutboundPolicies with a request timeout and
/// retries; without, the default route (benchmarks that add routes of their
/// own).
pub fn write_manifests(
    dir: &Path,
    backend_port: u16,
    hop_port: u16,
    meshed_route: bool,
) -> anyhow::Result<()> {
    for (name, port) in [("backend", backend_port), ("hop", hop_port)] {
        let mut text = service_yaml(name, port, meshed_route);
        if meshed_route {
            text.push_str(&route_yaml(name));
        }
        std::fs::write(dir.join(format!("{name}.yaml")), text)?;
    }
    Ok(())
}

fn service_yaml(name: &str, port: u16, failure_accrual: bool) -> String {
    let ip = if name == "backend" { 10 } else { 11 };
    let annotations = if failure_accrual {
        "\x20 annotations: {balancer.linkerd.io/failure-accrual: consecutive}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: bench\n\
         {annotations}\
         spec:\n  clusterIP: 10.96.0.{ip}\n  selector: {{app: {name}}}\n\
         \x20 ports: [{{name: http, port: 80, targetPort: {port}}}]\n\
         ---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-0\n  namespace: bench\n\
         \x20 labels: {{app: {name}}}\n\
         spec:\n  containers: [{{name: app, ports: [{{name: http, containerPort: {port}}}]}}]\n\
         status:\n  phase: Running\n  podIP: 127.0.0.1\n  hostIP: 127.0.0.1\n\
         \x20 conditions: [{{type: Ready, status: \"True\"}}]\n"
    )
}

/// `NAME-route`: every path of the Service's port 80, a 10 s request timeout,
/// retries on 5xx (at most 2, 5 s per try).
fn route_yaml(name: &str) -> String {
    format!(
        "---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata:\n  name: {name}-route\n  namespace: bench\n\
         \x20 annotations:\n\
         \x20   retry.linkerd.io/http: 5xx\n\
         \x20   retry.linkerd.io/limit: \"2\"\n\
         \x20   retry.linkerd.io/timeout: 5s\n\
         spec:\n\
         \x20 parentRefs: [{{group: core, kind: Service, name: {name}, port: 80}}]\n\
         \x20 rules:\n\
         \x20 - matches: [{{path: {{type: PathPrefix, value: /}}}}]\n\
         \x20   backendRefs: [{{name: {name}, port: 80}}]\n\
         \x20   timeouts: {{request: 10s}}\n"
    )
}

/// How one `ballast proxy` of the benchmark is started.
pub struct BallastArgs<'a> {
    pub ballast: &'a Path,
    pub destination: &'a str,
    pub core: u32,
    /// Inbound listener address (`127.0.0.1:0`: OS-picked).
    pub inbound: String,
    /// `--inbound-forward-port`: where connections not redirected go.
    pub forward_port: Option<u16>,
    /// `--max-connections` per listener (room for the idle connections).
    pub max_connections: usize,
    /// More flags (those this build has).
    pub extra: &'a [String],
}

/// `ballast proxy` on OS-picked ports (but the inbound one, if given),
/// resolving through `destination`; `addr` is its outbound listener. The
/// caller checks that it answers.
pub async fn ballast(a: &BallastArgs<'_>) -> anyhow::Result<Server> {
    let mut cmd = taskset(a.core, &a.ballast.display().to_string());
    cmd.args(proxy_subcommand(a.ballast));
    cmd.args([
        "--destination-addr",
        a.destination,
        "--outbound-addr",
        "127.0.0.1:0",
        "--inbound-addr",
        &a.inbound,
        "--admin-addr",
        "127.0.0.1:0",
        "--max-connections",
        &a.max_connections.to_string(),
    ]);
    if !a.extra.iter().any(|f| f == "--identity-trust-anchors") {
        cmd.arg("--identity-disabled");
    }
    if let Some(port) = a.forward_port {
        cmd.args(["--inbound-forward-port", &port.to_string()]);
    }
    cmd.args(a.extra);
    cmd.env("BALLAST_LOG", "warn,ballast=info");
    // Its log is at warn: what it says once listening is shown as it comes.
    let listening = spawn_listening(
        "ballast proxy",
        &mut cmd,
        [
            "outbound listening on ",
            "inbound listening on ",
            "admin listening on ",
        ],
        |_| true,
    );
    let (child, [addr, inbound, admin]) = tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .map_err(|_| anyhow::anyhow!("ballast proxy: no listeners within 30 s"))??;
    Ok(Server {
        child,
        addr,
        admin: Some(admin),
        inbound: Some(inbound),
    })
}
