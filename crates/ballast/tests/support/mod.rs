//! Starts `ballast destination` as a real process on OS-picked ports and
//! talks to it with a real tonic client.

#![allow(dead_code)]

pub mod backends;
pub mod demo;
pub mod identity;
pub mod manifests;
pub mod openmetrics;
pub mod proxy;
pub mod updates;

use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, DestinationProfile, GetDestination, Update,
};
use std::{
    future::Future,
    net::SocketAddr,
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::watch,
};
use tonic::{codec::Streaming, transport::Channel};

pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Controller {
    child: Child,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// Linkerd's policy port (`--policy-addr`).
    pub policy: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
}

/// Waits until `check` returns `Some`, polling every few milliseconds, for at
/// most `DEADLINE`; panics naming `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        let mut defaults = Vec::new();
        for flag in ["--addr", "--admin-addr", "--policy-addr"] {
            if !args.iter().any(|a| a == flag) {
                defaults.extend([flag, "127.0.0.1:0"]);
            }
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .arg("destination")
            .args(defaults)
            .args(args)
            .env("BALLAST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ballast");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (addrs_tx, mut addrs_rx) = watch::channel((None, None, None));
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let addr = |marker: &str| {
                    line.split(marker)
                        .nth(1)
                        .and_then(|rest| rest.split_whitespace().next())
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                };
                if let Some(a) = addr("destination gRPC listening on ") {
                    addrs_tx.send_modify(|(g, _, _)| *g = Some(a));
                }
                if let Some(a) = addr("admin listening on ") {
                    addrs_tx.send_modify(|(_, m, _)| *m = Some(a));
                }
                if let Some(a) = addr("policy gRPC listening on ") {
                    addrs_tx.send_modify(|(_, _, p)| *p = Some(a));
                }
                sink.lock().unwrap().push(line);
            }
        });
        let listening = tokio::time::timeout(DEADLINE, async {
            let r = addrs_rx
                .wait_for(|(g, a, p)| g.is_some() && a.is_some() && p.is_some())
                .await
                .ok()?;
            Some((r.0?, r.1?, r.2?))
        })
        .await;
        let Ok(Some((grpc, admin, policy))) = listening else {
            // Let the reader catch the last lines, then show them.
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            panic!(
                "ballast did not start listening; its log:\n{}",
                logs.lock().unwrap().join("\n")
            );
        };
        let c = Controller {
            child,
            grpc,
            admin,
            policy,
            logs,
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

    /// The value of one sample in /metrics, e.g. `destination_subscriptions{method="Get"}`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await;
        body.lines()
            .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
            .and_then(|l| l[sample.len()..].trim().parse().ok())
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
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
        tokio::time::timeout(limit, self.child.wait())
            .await
            .expect("process did not exit in time")
            .expect("wait")
    }

    pub fn logs_containing(&self, needle: &str) -> Vec<String> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
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
