//! Starts `ballast proxy` as a real process next to a `ballast destination`
//! on a manifests directory, and talks to it with real HTTP/1.1, HTTP/2 and
//! TCP clients; reads its /metrics.

pub use crate::metrics::{Metrics, Sample};
use crate::{ballast_bin, eventually, manifests::PodSpec, write_atomic, Controller, DEADLINE};
use ballast_demo::Backend;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{
    body::Bytes,
    client::conn::{http1, http2},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpStream,
    process::{Child, Command},
    sync::watch,
};

/// The namespace every fixture service lives in.
pub const NS: &str = "shop";

/// Log lines kept per process (the newest); enough to explain a failure
/// without growing through a long test.
const LOG_LINES_KEPT: usize = 2_000;

/// `NAME.shop.svc.cluster.local:PORT`.
pub fn authority(name: &str, port: u16) -> String {
    format!("{name}.{NS}.svc.cluster.local:{port}")
}

/// A child process whose stderr is read line by line: the newest lines are
/// kept, and every `... listening on ADDR` line is remembered.
pub struct Logged {
    pub child: Child,
    logs: Arc<Mutex<VecDeque<String>>>,
    listening: watch::Receiver<Vec<(String, SocketAddr)>>,
}

impl Logged {
    /// Spawns `cmd` with stderr piped, killed when dropped.
    pub fn spawn(mut cmd: Command) -> Logged {
        let mut child = cmd
            .env("BALLAST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn process");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, listening) = watch::channel(Vec::new());
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                // `... listening on ADDR`, or `http://ADDR/` (viz's dashboard).
                if let Some(addr) = line
                    .split(" listening on ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(|a| a.trim_start_matches("http://").trim_end_matches('/'))
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                {
                    tx.send_modify(|all| all.push((line.clone(), addr)));
                }
                let mut logs = sink.lock().unwrap();
                if logs.len() == LOG_LINES_KEPT {
                    logs.pop_front();
                }
                logs.push_back(line);
            }
        });
        Logged {
            child,
            logs,
            listening,
        }
    }

    /// Waits for `count` lines containing `marker` (e.g. `"admin listening on "`)
    /// and returns their addresses, in log order; panics with the log otherwise.
    pub async fn listening(&mut self, marker: &str, count: usize) -> Vec<SocketAddr> {
        let found = tokio::time::timeout(DEADLINE, async {
            let all = self
                .listening
                .wait_for(|all| all.iter().filter(|(l, _)| l.contains(marker)).count() >= count)
                .await
                .ok()?;
            Some(
                all.iter()
                    .filter(|(l, _)| l.contains(marker))
                    .map(|(_, a)| *a)
                    .collect::<Vec<_>>(),
            )
        })
        .await;
        match found {
            Ok(Some(addrs)) => addrs,
            _ => {
                // Let the reader catch the last lines of a process that died.
                let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
                panic!(
                    "no {count} line(s) with {marker:?} in time; the log:\n{}",
                    self.log()
                );
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("process is running")
    }

    /// The newest log lines, one per line.
    pub fn log(&self) -> String {
        let logs = self.logs.lock().unwrap();
        logs.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub fn logs_containing(&self, needle: &str) -> Vec<String> {
        let logs = self.logs.lock().unwrap();
        logs.iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

/// A running `ballast proxy`.
pub struct Proxy {
    pub process: Logged,
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    /// The `--outbound-tcp` listeners, in the order they were logged.
    pub tcp_routes: Vec<SocketAddr>,
}

impl Proxy {
    /// Starts `ballast proxy --destination-addr DESTINATION` on OS-picked
    /// loopback ports, with `extra` flags after them, and waits for /ready.
    pub async fn start(destination: SocketAddr, extra: &[&str]) -> Proxy {
        Self::start_on(
            destination,
            "127.0.0.1:0".parse().expect("an address"),
            extra,
        )
        .await
    }

    /// As [`Proxy::start`], its inbound listener on `inbound` (a proxy
    /// restarted where its peers knew it).
    pub async fn start_on(destination: SocketAddr, inbound: SocketAddr, extra: &[&str]) -> Proxy {
        let mut cmd = Command::new(ballast_bin());
        cmd.arg("proxy")
            .args(["--destination-addr", &destination.to_string()])
            .args(["--outbound-addr", "127.0.0.1:0"])
            .args(["--inbound-addr", &inbound.to_string()])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(extra);
        if !extra
            .iter()
            .any(|a| a.starts_with("--identity-trust-anchors"))
        {
            cmd.arg("--identity-disabled");
        }
        let routes = extra.iter().filter(|a| **a == "--outbound-tcp").count();
        let proxy = Proxy::from_command(cmd, routes).await;
        eventually("the proxy's /ready", || async {
            let answer = get(proxy.admin, "admin", "/ready").await.ok()?;
            (answer.status == StatusCode::OK).then_some(())
        })
        .await;
        proxy
    }

    /// Spawns a prepared `ballast proxy` command and waits for its listeners
    /// (not for /ready: the caller may not be able to reach it).
    pub async fn from_command(cmd: Command, tcp_routes: usize) -> Proxy {
        let mut process = Logged::spawn(cmd);
        let outbound = process.listening("outbound listening on ", 1).await[0];
        let inbound = process.listening("inbound listening on ", 1).await[0];
        let admin = process.listening("admin listening on ", 1).await[0];
        let tcp_routes = process
            .listening("outbound TCP route listening on ", tcp_routes)
            .await;
        Proxy {
            process,
            outbound,
            inbound,
            admin,
            tcp_routes,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub async fn metrics(&self) -> Metrics {
        let answer = get(self.admin, "admin", "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics from the proxy: {e}"));
        assert_eq!(answer.status, StatusCode::OK, "GET /metrics");
        Metrics::parse(&answer.text())
    }

    /// Open file descriptors of the proxy process (sockets included).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("read the proxy's /proc/PID/fd")
            .count()
    }
}

/// A manifests directory with services in namespace `shop`: pods in one file
/// per app, services in one file each, so several services can select the
/// same pods.
pub struct Cluster {
    dir: tempfile::TempDir,
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster {
            dir: tempfile::tempdir().expect("manifests dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes (or rewrites) the pods labelled `app: APP`: Running and Ready,
    /// each exposing its own address's port as the named container port `http`.
    pub fn pods<S: AsRef<str>>(&self, app: &str, pods: &[(S, SocketAddr)]) {
        let docs: Vec<String> = pods
            .iter()
            .map(|(name, addr)| {
                let ip = addr.ip().to_string();
                PodSpec::new(NS, name.as_ref(), app, &ip, addr.port()).yaml()
            })
            .collect();
        write_atomic(
            &self.path().join(format!("pods-{app}.yaml")),
            &docs.join("---\n"),
        );
    }

    /// Writes service NAME selecting `app: APP`, port PORT to the pods' named
    /// port `http`.
    pub fn service(&self, name: &str, app: &str, cluster_ip: &str, port: u16) {
        write_atomic(
            &self.path().join(format!("svc-{name}.yaml")),
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\n\
                 spec:\n  clusterIP: {cluster_ip}\n  selector: {{app: {app}}}\n\
                 \x20 ports: [{{name: http, port: {port}, targetPort: http}}]\n"
            ),
        );
    }
}

/// `(name, addr)` of each backend, as `Cluster::pods` takes them.
pub fn pods_of(backends: &[Backend]) -> Vec<(String, SocketAddr)> {
    backends
        .iter()
        .map(|b| (b.name().to_string(), b.addr()))
        .collect()
}

/// Starts `n` demo backends named `APP-a`, `APP-b`, ... on 127.0.0.2,
/// 127.0.0.3, ... with OS-picked ports.
pub async fn start_backends(app: &str, n: usize) -> Vec<Backend> {
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{app}-{}", char::from(b'a' + i as u8));
        let ip = format!("127.0.0.{}", 2 + i);
        let bind: SocketAddr = format!("{ip}:0").parse().unwrap();
        all.push(Backend::start(&name, bind).await.expect("start a backend"));
    }
    all
}

/// A service `web` (cluster IP 127.0.0.100, port 80) over `n` demo backends,
/// a controller on it and a proxy with `extra` flags, with traffic flowing.
pub struct Mesh {
    pub cluster: Cluster,
    pub backends: Vec<Backend>,
    pub controller: Controller,
    pub proxy: Proxy,
}

pub const WEB_PORT: u16 = 80;

impl Mesh {
    pub async fn start(n: usize, extra: &[&str]) -> Mesh {
        let cluster = Cluster::new();
        let backends = start_backends("web", n).await;
        cluster.pods("web", &pods_of(&backends));
        cluster.service("web", "web", "127.0.0.100", WEB_PORT);
        let controller = Controller::start(cluster.path(), &[]).await;
        let proxy = Proxy::start(controller.grpc, extra).await;
        let mesh = Mesh {
            cluster,
            backends,
            controller,
            proxy,
        };
        mesh.wait_for_route(&mesh.web()).await;
        mesh
    }

    pub fn web(&self) -> String {
        authority("web", WEB_PORT)
    }

    /// Waits until a request for `authority` through the proxy is answered 200.
    pub async fn wait_for_route(&self, authority: &str) {
        let outbound = self.proxy.outbound;
        let what = format!("a 200 for {authority} through the proxy");
        let result = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Ok(a) = get(outbound, authority, "/").await {
                    if a.status == StatusCode::OK {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if result.is_err() {
            panic!(
                "timed out waiting for {what}; proxy log:\n{}",
                self.proxy.process.log()
            );
        }
    }

    /// Requests served by each backend so far.
    pub fn counts(&self) -> Vec<u64> {
        self.backends.iter().map(|b| b.requests()).collect()
    }
}

/// An HTTP answer, body read whole (tests only read small ones).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
    pub elapsed: Duration,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The backend that answered, by its `x-backend` header.
    pub fn backend(&self) -> Option<&str> {
        self.header("x-backend")
    }
}

async fn read_answer(
    started: Instant,
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<Answer, String> {
    let (parts, body) = response.into_parts();
    let collected = body
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?;
    let trailers = collected.trailers().cloned();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
        elapsed: started.elapsed(),
    })
}

/// An HTTP/1.1 keep-alive connection.
pub struct Http1 {
    send: http1::SendRequest<Full<Bytes>>,
}

impl Http1 {
    pub async fn connect(addr: SocketAddr) -> Result<Http1, String> {
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connect to {addr} timed out"))?
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(Http1 { send })
    }

    /// GET `path` with `Host: AUTHORITY`.
    pub async fn get(&mut self, authority: &str, path: &str) -> Result<Answer, String> {
        let request = Request::get(path)
            .header(http::header::HOST, authority)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("building the request: {e}"))?;
        self.send(request).await
    }

    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let started = Instant::now();
        tokio::time::timeout(DEADLINE, async {
            self.send
                .ready()
                .await
                .map_err(|e| format!("connection not ready: {e}"))?;
            let response = self
                .send
                .send_request(request)
                .await
                .map_err(|e| format!("HTTP/1.1 request: {e}"))?;
            read_answer(started, response).await
        })
        .await
        .map_err(|_| format!("no HTTP/1.1 answer within {DEADLINE:?}"))?
    }
}

/// An HTTP/2 connection with prior knowledge (h2c); cheap to clone, requests
/// on clones share the connection.
#[derive(Clone)]
pub struct H2 {
    send: http2::SendRequest<Full<Bytes>>,
}

impl H2 {
    pub async fn connect(addr: SocketAddr) -> Result<H2, String> {
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connect to {addr} timed out"))?
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(H2 { send })
    }

    /// GET `http://AUTHORITY/PATH` (the authority goes in `:authority`).
    pub async fn get(&self, authority: &str, path: &str) -> Result<Answer, String> {
        let request = Request::get(format!("http://{authority}{path}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("building the request: {e}"))?;
        self.send(request).await
    }

    pub async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let started = Instant::now();
        let mut send = self.send.clone();
        tokio::time::timeout(DEADLINE, async {
            send.ready()
                .await
                .map_err(|e| format!("connection not ready: {e}"))?;
            let response = send
                .send_request(request)
                .await
                .map_err(|e| format!("HTTP/2 request: {e}"))?;
            read_answer(started, response).await
        })
        .await
        .map_err(|_| format!("no HTTP/2 answer within {DEADLINE:?}"))?
    }
}

/// One HTTP/1.1 GET on a fresh connection.
pub async fn get(addr: SocketAddr, authority: &str, path: &str) -> Result<Answer, String> {
    Http1::connect(addr).await?.get(authority, path).await
}

/// A deterministic pseudo-random byte string (xorshift64*), so a failing
/// payload can be made again from its seed.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.max(1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Network namespaces for transparent-mode tests: processes run inside with
/// `ip netns exec`, the test talks to them only through processes it runs
/// there too (curl), and iptables in the namespace redirects connections to
/// the proxy. Nothing made here can reach outside the namespace: it has no
/// interface but its own loopback.
pub mod netns {
    use super::Answer;
    use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use hyper::body::Bytes;
    use std::{
        path::{Path, PathBuf},
        process::Stdio,
        sync::atomic::{AtomicU32, Ordering},
        time::{Duration, Instant},
    };
    use tokio::process::Command;

    /// The uid the proxy runs as, and whose connections are not redirected.
    pub const PROXY_UID: u32 = 65534;

    pub const POD_A: &str = "10.244.0.2";
    pub const POD_B: &str = "10.244.0.3";
    pub const CLUSTER_IP: &str = "10.96.0.10";
    /// The node's side and each pod's side of the pod-to-node links.
    pub const NODE_TO_A: (&str, &str) = ("10.245.1.1", "10.245.1.2");
    pub const NODE_TO_B: (&str, &str) = ("10.245.2.1", "10.245.2.2");

    /// A "node" namespace and two "pods" joined by a veth pair (`eth0`,
    /// [`POD_A`] and [`POD_B`]), each pod linked to the node (`node`), with
    /// service addresses routed out of `eth0`; or why not.
    pub fn two_pods() -> Result<(NetNs, NetNs, NetNs), String> {
        let node = NetNs::empty()?;
        let a = NetNs::empty()?;
        let b = NetNs::empty()?;
        a.link(
            "eth0",
            &format!("{POD_A}/24"),
            &b,
            "eth0",
            &format!("{POD_B}/24"),
        )?;
        // Services are virtual: their addresses are routed out of the pod
        // as on a node, and never get there (the proxy takes them first).
        a.route(&["10.96.0.0/12", "dev", "eth0"])?;
        b.route(&["10.96.0.0/12", "dev", "eth0"])?;
        let (n, p) = NODE_TO_A;
        node.link("to-a", &format!("{n}/30"), &a, "node", &format!("{p}/30"))?;
        let (n, p) = NODE_TO_B;
        node.link("to-b", &format!("{n}/30"), &b, "node", &format!("{p}/30"))?;
        Ok((node, a, b))
    }

    /// A network namespace with its loopback up, removed when dropped
    /// (after the processes in it, which must be dropped first).
    pub struct NetNs {
        pub name: String,
        /// A copy of the `ballast` binary that the proxy's unprivileged
        /// user can execute wherever the build directory lives.
        pub bin: PathBuf,
        _bin_dir: tempfile::TempDir,
    }

    fn effective_uid() -> Option<u32> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("Uid:"))?;
        line.split_whitespace().nth(2)?.parse().ok()
    }

    fn have(tool: &str) -> bool {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Runs a command to completion: its stdout, or why it failed.
    fn run(program: &str, args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`{program} {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Says why a root-only test cannot run here: under CI (which must run
    /// it) that is a failure; elsewhere a `SKIPPED` line, written past the
    /// test harness's capture so it shows in every run's output.
    pub fn cannot_run(test: &str, why: &str) {
        if std::env::var_os("CI").is_some() {
            panic!("CI must run the {test} test, but: {why}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
    }

    /// Whether this machine can make namespaces and run the tools the tests
    /// use there; why not otherwise.
    pub fn preflight() -> Result<(), String> {
        match effective_uid() {
            Some(0) => {}
            Some(uid) => {
                return Err(format!(
                    "needs root to make a network namespace (uid {uid})"
                ))
            }
            None => return Err("cannot tell the uid from /proc/self/status".into()),
        }
        for tool in ["ip", "iptables", "iptables-save", "setpriv", "curl"] {
            if !have(tool) {
                return Err(format!(
                    "`{tool}` is not installed (Debian: iproute2, iptables, util-linux, curl)"
                ));
            }
        }
        Ok(())
    }

    impl NetNs {
        /// Makes a namespace with `addresses` (IPv4, each a /32) on its
        /// loopback, or says why this machine cannot: not root, a tool
        /// missing, or the kernel refusing.
        pub fn create(addresses: &[&str]) -> Result<NetNs, String> {
            let ns = NetNs::empty()?;
            for addr in addresses {
                ns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])?;
            }
            // Only loopback: nothing sent in here can leave the namespace.
            let links = ns.ip(&["-o", "link", "show"])?;
            if links.lines().count() != 1 || !links.contains(": lo:") {
                return Err(format!("the namespace has other links than lo: {links}"));
            }
            Ok(ns)
        }

        /// Makes a namespace with only its loopback, up; links to other
        /// namespaces come from [`NetNs::link`]. Nothing in it reaches the
        /// machine's own network.
        pub fn empty() -> Result<NetNs, String> {
            preflight()?;
            // Namespaces of tests killed before their drop ran.
            ballast_testkit::cluster::sweep_stale();
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let name = format!(
                "ballast-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            run("ip", &["netns", "add", &name])?;
            // From here on, Drop removes it whatever fails next.
            let bin_dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
            let mut ns = NetNs {
                name,
                bin: PathBuf::new(),
                _bin_dir: bin_dir,
            };
            ns.bin = ns.copy_binary()?;
            ns.ip(&["link", "set", "lo", "up"])?;
            ns.exec_sync(&["iptables", "-t", "nat", "-S", "OUTPUT"])
                .map_err(|e| format!("iptables nat table not usable here: {e}"))?;
            Ok(ns)
        }

        /// Joins this namespace and `peer` with a veth pair: `dev` here with
        /// `addr` (CIDR), `peer_dev` there with `peer_addr`; both up.
        pub fn link(
            &self,
            dev: &str,
            addr: &str,
            peer: &NetNs,
            peer_dev: &str,
            peer_addr: &str,
        ) -> Result<(), String> {
            self.ip(&[
                "link", "add", dev, "type", "veth", "peer", "name", peer_dev, "netns", &peer.name,
            ])?;
            self.ip(&["addr", "add", addr, "dev", dev])?;
            peer.ip(&["addr", "add", peer_addr, "dev", peer_dev])?;
            self.ip(&["link", "set", dev, "up"])?;
            peer.ip(&["link", "set", peer_dev, "up"])?;
            Ok(())
        }

        /// `ip route add ROUTE...` in the namespace.
        pub fn route(&self, route: &[&str]) -> Result<(), String> {
            let mut args = vec!["route", "add"];
            args.extend_from_slice(route);
            self.ip(&args).map(|_| ())
        }

        /// The namespace's nat table as `iptables-save` prints it, without
        /// its comment lines and packet counters (which change with traffic).
        pub fn nat_table(&self) -> Result<String, String> {
            let saved = self.exec_sync(&["iptables-save", "-t", "nat"])?;
            Ok(saved
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| match l.rfind(" [") {
                    Some(i) if l.starts_with(':') => &l[..i],
                    _ => l,
                })
                .collect::<Vec<_>>()
                .join("\n"))
        }

        fn copy_binary(&self) -> Result<PathBuf, String> {
            use std::os::unix::fs::PermissionsExt;
            let dir = self._bin_dir.path();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
            let bin = dir.join("ballast");
            std::fs::copy(crate::ballast_bin(), &bin)
                .map_err(|e| format!("copy the ballast binary: {e}"))?;
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("chmod {}: {e}", bin.display()))?;
            Ok(bin)
        }

        fn ip(&self, args: &[&str]) -> Result<String, String> {
            let mut all = vec!["-n", self.name.as_str()];
            all.extend_from_slice(args);
            run("ip", &all)
        }

        /// Runs `args` inside the namespace to completion.
        pub fn exec_sync(&self, args: &[&str]) -> Result<String, String> {
            let mut all = vec!["netns", "exec", self.name.as_str()];
            all.extend_from_slice(args);
            run("ip", &all)
        }

        /// A command that runs `program` inside the namespace, as root.
        pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &self.name]).arg(program);
            cmd
        }

        /// A command that runs `program` inside the namespace as
        /// [`PROXY_UID`], with no supplementary groups.
        pub fn command_as_proxy_user(&self, program: impl AsRef<Path>) -> Command {
            let mut cmd = self.command("setpriv");
            cmd.arg(format!("--reuid={PROXY_UID}"))
                .arg(format!("--regid={PROXY_UID}"))
                .arg("--clear-groups")
                .arg(program.as_ref());
            cmd
        }

        /// Redirects every TCP connection made in the namespace to
        /// 127.0.0.1:`port`, except those of [`PROXY_UID`] and those to
        /// 127.0.0.1 (controller, admin servers).
        pub fn redirect_outbound_to(&self, port: u16) -> Result<(), String> {
            let uid = PROXY_UID.to_string();
            let port = port.to_string();
            let rules: [&[&str]; 3] = [
                &["-d", "127.0.0.1/32", "-j", "RETURN"],
                &["-m", "owner", "--uid-owner", &uid, "-j", "RETURN"],
                &["-j", "REDIRECT", "--to-ports", &port],
            ];
            for rule in rules {
                let mut args = vec!["iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp"];
                args.extend_from_slice(rule);
                self.exec_sync(&args)?;
            }
            Ok(())
        }

        /// The pod's proxy as [`PROXY_UID`] on init's default ports,
        /// resolving through `destination`, with `extra` flags; ready.
        pub async fn start_proxy(&self, destination: &str, extra: &[&str]) -> super::Proxy {
            let mut cmd = self.command_as_proxy_user(&self.bin);
            cmd.arg("proxy")
                .args(["--destination-addr", destination])
                .args(["--outbound-addr", "127.0.0.1:4140"])
                .args(["--inbound-addr", "0.0.0.0:4143"])
                .args(["--admin-addr", "127.0.0.1:4191"])
                .args(["--pod-namespace", super::NS])
                .args(extra);
            let proxy = super::Proxy::from_command(cmd, 0).await;
            self.wait_for_200(&format!("http://{}/ready", proxy.admin))
                .await;
            proxy
        }

        /// `proxy`'s /metrics, read from inside the namespace.
        pub async fn metrics(&self, proxy: &super::Proxy) -> super::Metrics {
            let answer = self
                .curl(&format!("http://{}/metrics", proxy.admin))
                .await
                .unwrap_or_else(|e| panic!("the proxy's /metrics: {e}"));
            super::Metrics::parse(&answer.text())
        }

        /// One request by curl run inside the namespace (an unmodified
        /// client, which knows nothing of the proxy).
        pub async fn curl(&self, url: &str) -> Result<Answer, String> {
            let started = Instant::now();
            let out = self
                .command("curl")
                .args(["-sS", "-i", "--max-time", "10", url])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| format!("run curl: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "curl {url} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            parse_curl(&out.stdout, started.elapsed()).ok_or_else(|| {
                format!(
                    "curl {url}: unreadable answer {:?}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
        }

        /// Waits until `url` is answered `200` from inside the namespace.
        pub async fn wait_for_200(&self, url: &str) {
            let started = Instant::now();
            loop {
                let last = match self.curl(url).await {
                    Ok(a) if a.status == StatusCode::OK => return,
                    Ok(a) => format!("{} {}", a.status, a.text()),
                    Err(e) => e,
                };
                assert!(
                    started.elapsed() < super::DEADLINE,
                    "{url} not answered 200 in the namespace in time; last: {last}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    fn parse_curl(out: &[u8], elapsed: Duration) -> Option<Answer> {
        let split = out.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&out[..split]).ok()?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
        let mut headers = HeaderMap::new();
        for line in lines {
            let (k, v) = line.split_once(':')?;
            headers.append(
                HeaderName::from_bytes(k.trim().as_bytes()).ok()?,
                HeaderValue::from_str(v.trim()).ok()?,
            );
        }
        Some(Answer {
            status: StatusCode::from_u16(status).ok()?,
            headers,
            body: Bytes::copy_from_slice(&out[split + 4..]),
            trailers: None,
            elapsed,
        })
    }

    impl Drop for NetNs {
        fn drop(&mut self) {
            if let Err(e) = run("ip", &["netns", "del", &self.name]) {
                eprintln!("could not remove network namespace {}: {e}", self.name);
            }
        }
    }
}
