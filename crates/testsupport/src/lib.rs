//! What the `ballast` binary's integration tests share: its controllers
//! and proxy started as real processes on OS-picked ports ([`Controller`],
//! [`proxy::Proxy`], [`identity::IdentityCa`], [`demo::Demo`]) and talked to
//! with real clients, manifests, backends, and readers of `/metrics`.
//!
//! One library, built once, for the tests of `crates/ballast`: they find the
//! binary at run time ([`ballast_bin`]).

#![forbid(unsafe_code)]

pub mod backends;
/// Memory cgroups, shared with the cluster in a box's kubelet.
pub use ballast_testkit::cgroup;
pub mod demo;
pub mod fake_controller;
pub mod identity;
pub mod manifests;
pub mod metrics;
pub mod openmetrics;
pub mod proxy;
pub mod updates;

use ballast_testkit::Outcome;
use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, DestinationProfile, GetDestination, Update,
};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};
use tokio::process::Command;
use tonic::{codec::Streaming, transport::Channel};

pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Controller {
    /// The `ballast destination` process and its newest log lines.
    pub process: proxy::Logged,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// Linkerd's policy port (`--policy-addr`).
    pub policy: SocketAddr,
}

/// The `ballast` binary the tests run: `CARGO_BIN_EXE_ballast` when set,
/// else `ballast` in the profile directory the running test executable
/// was built into (`target/PROFILE/deps/TEST-HASH` → `target/PROFILE/ballast`).
/// Cargo builds it before it runs `crates/ballast`'s integration tests.
pub fn ballast_bin() -> PathBuf {
    let bin = match std::env::var_os("CARGO_BIN_EXE_ballast") {
        Some(path) => PathBuf::from(path),
        None => {
            let test = std::env::current_exe().expect("the test executable's path");
            let profile = test
                .parent()
                .filter(|deps| deps.ends_with("deps"))
                .and_then(Path::parent)
                .unwrap_or_else(|| {
                    panic!(
                        "cannot find the ballast binary from {}: not a test built by cargo \
                         into target/PROFILE/deps, and CARGO_BIN_EXE_ballast is not set",
                        test.display()
                    )
                });
            profile.join(format!("ballast{}", std::env::consts::EXE_SUFFIX))
        }
    };
    assert!(
        bin.is_file(),
        "the ballast binary is not at {}: build it (`cargo build -p ballast`), or run \
         the tests with `cargo test -p ballast`, which builds it first",
        bin.display()
    );
    bin
}

/// Waits until `check` is done (`true`, or `Some(value)`), polling every
/// few milliseconds, for at most [`DEADLINE`]; panics naming `what`
/// otherwise. [`ballast_testkit::eventually`] with this crate's deadline.
pub async fn eventually<R: Outcome>(what: &str, check: impl AsyncFnMut() -> R) -> R::Value {
    ballast_testkit::eventually(what, DEADLINE, check).await
}

impl Controller {
    pub async fn start(manifests: &Path, extra: &[&str]) -> Controller {
        let mut args = vec!["--manifests".to_string(), manifests.display().to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        Self::start_with(&args).await
    }

    /// Starts `ballast destination` with these flags after OS-picked
    /// addresses (a flag given here overrides them).
    pub async fn start_with(args: &[String]) -> Controller {
        Self::launch(None, args, &[]).await
    }

    /// [`Controller::start_with`], the process inside `cgroup` from its
    /// first instruction (a shell moves itself in, then execs it).
    pub async fn start_in(
        cgroup: &cgroup::MemoryCgroup,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Controller {
        Self::launch(Some(cgroup.procs()), args, env).await
    }

    async fn launch(
        cgroup_procs: Option<PathBuf>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Controller {
        let mut defaults = Vec::new();
        for flag in ["--addr", "--admin-addr", "--policy-addr"] {
            if !args.iter().any(|a| a == flag) {
                defaults.extend([flag, "127.0.0.1:0"]);
            }
        }
        let mut cmd = match cgroup_procs {
            None => Command::new(ballast_bin()),
            Some(procs) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(procs)
                    .arg(ballast_bin());
                sh
            }
        };
        cmd.arg("destination").args(defaults).args(args);
        cmd.envs(env.iter().copied());
        let mut process = proxy::Logged::spawn(cmd);
        let grpc = process.listening("destination gRPC listening on ", 1).await[0];
        let admin = process.listening("admin listening on ", 1).await[0];
        let policy = process.listening("policy gRPC listening on ", 1).await[0];
        let c = Controller {
            process,
            grpc,
            admin,
            policy,
        };
        eventually("/ready", || async {
            (c.http_get("/ready").await.0 == 200).then_some(())
        })
        .await;
        c
    }

    pub async fn client(&self) -> DestinationClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connect to the controller");
        DestinationClient::new(channel)
    }

    pub async fn get(&self, path: &str) -> Result<Streaming<Update>, tonic::Status> {
        self.client()
            .await
            .get(req(path))
            .await
            .map(|r| r.into_inner())
    }

    pub async fn get_profile(
        &self,
        path: &str,
    ) -> Result<Streaming<DestinationProfile>, tonic::Status> {
        self.client()
            .await
            .get_profile(req(path))
            .await
            .map(|r| r.into_inner())
    }

    /// A plain HTTP/1.1 GET to the admin server: (status, body).
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).await
    }

    /// The value of one series in /metrics as the page writes it, e.g.
    /// `destination_subscriptions{method="Get"}`; `None` when absent.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await;
        metrics::Metrics::parse(&body).value(series)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(limit, self.process.child.wait())
            .await
            .expect("process did not exit in time")
            .expect("wait")
    }

    pub fn logs_containing(&self, needle: &str) -> Vec<String> {
        self.process.logs_containing(needle)
    }
}

/// Whether `status` is a controller's memory budget's answer:
/// RESOURCE_EXHAUSTED with the retry hint.
pub fn shed_by_memory(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted
        && status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .is_some_and(|v| v.to_str().ok() == Some("5000"))
}

pub fn req(path: &str) -> GetDestination {
    GetDestination {
        scheme: "k8s".into(),
        path: path.into(),
        context_token: String::new(),
    }
}

pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

/// Receives the next message within the deadline.
pub async fn next<T>(stream: &mut Streaming<T>) -> T {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("no message before the deadline")
        .expect("stream failed")
        .expect("stream ended")
}

/// Writes a file atomically (temp file, then rename), as editors and
/// config-management tools do.
pub fn write_atomic(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// One `Field:   N kB` line of a /proc file (`/proc/PID/status`,
/// `/proc/PID/smaps_rollup`), in bytes.
pub fn proc_bytes(path: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}
