//! `ballast` subcommands run as child processes: started with OS-picked
//! ports, their listening addresses read from their log, their last log
//! lines kept for the report, killed when dropped.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Log lines kept per process.
const LOG_TAIL_LINES: usize = 200;
/// Longest log line kept (longer ones are cut).
const MAX_LINE_LEN: usize = 1000;

/// A running `ballast` child process.
pub struct Process {
    label: String,
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
    exited: Option<ExitStatus>,
}

impl Process {
    /// Runs `ballast ARGS...` and waits up to `deadline` until its log has
    /// named an address after each of `markers` (e.g. `"admin listening on "`);
    /// returns the addresses in the order of `markers`.
    pub async fn start(
        ballast: &Path,
        label: &str,
        args: &[String],
        markers: &[&str],
        deadline: Duration,
    ) -> anyhow::Result<(Process, Vec<SocketAddr>)> {
        let mut child = Command::new(ballast)
            .args(args)
            .env("BALLAST_LOG", "info")
            // Plain log lines: the addresses are read from them.
            .env("NO_COLOR", "1")
            .env("BALLAST_LOG_FORMAT", "plain")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {} {}", ballast.display(), args.join(" ")))?;
        let stderr = child
            .stderr
            .take()
            .context("the child's stderr was not captured")?;
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL_LINES)));
        let owned_markers: Vec<String> = markers.iter().map(|m| m.to_string()).collect();
        let (found_tx, mut found_rx) = watch::channel(vec![None; markers.len()]);
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line = strip_ansi(&line);
                for (i, marker) in owned_markers.iter().enumerate() {
                    if let Some(addr) = address_after(&line, marker) {
                        found_tx.send_modify(|found| found[i] = Some(addr));
                    }
                }
                push_line(&sink, line);
            }
        });
        let mut process = Process {
            label: label.to_string(),
            child,
            log,
            exited: None,
        };
        let found = tokio::time::timeout(deadline, async {
            loop {
                {
                    let found = found_rx.borrow_and_update();
                    if found.iter().all(Option::is_some) {
                        return Ok(found.iter().flatten().copied().collect::<Vec<_>>());
                    }
                }
                tokio::select! {
                    changed = found_rx.changed() => if changed.is_err() {
                        // The log closed: the process is gone.
                        return Err(());
                    },
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {
                        if process.exit_status().is_some() {
                            return Err(());
                        }
                    }
                }
            }
        })
        .await;
        match found {
            Ok(Ok(addrs)) => Ok((process, addrs)),
            Ok(Err(())) | Err(_) => {
                // Give the log reader a moment to catch the last lines.
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), process.child.wait()).await;
                let status = process
                    .exit_status()
                    .map_or("still running".to_string(), |s| s.to_string());
                process.kill().await;
                anyhow::bail!(
                    "{label} did not start listening within {deadline:?} ({status}); its last log lines:\n{}",
                    process.log_tail(20).join("\n")
                )
            }
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Its exit status, if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// SIGKILL, then waits (briefly) for it to be gone.
    pub async fn kill(&mut self) {
        if self.exit_status().is_some() {
            return;
        }
        if let Err(error) = self.child.start_kill() {
            tracing::debug!(label = %self.label, %error, "cannot kill a child process");
        }
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await
        {
            self.exited = Some(status);
        }
    }

    /// Its last `n` log lines (at most the 200 kept).
    pub fn log_tail(&self, n: usize) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter()
            .skip(log.len().saturating_sub(n))
            .cloned()
            .collect()
    }
}

/// Waits up to `deadline` until `GET http://ADMIN/ready` answers 200.
pub async fn wait_ready(admin: SocketAddr, label: &str, deadline: Duration) -> anyhow::Result<()> {
    let start = tokio::time::Instant::now();
    loop {
        let last = match ready_status(admin).await {
            Ok(200) => return Ok(()),
            Ok(status) => format!("status {status}"),
            Err(error) => error,
        };
        if start.elapsed() >= deadline {
            anyhow::bail!("{label} was not ready within {deadline:?} ({admin}/ready: {last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ready_status(admin: SocketAddr) -> Result<u16, String> {
    // The body is a word; it is read so the connection ends cleanly.
    http_get(admin, "/ready", 1024, Duration::from_secs(1))
        .await
        .map(|(status, _)| status)
}

/// `GET http://ADDR/PATH` over HTTP/1.1 within `limit`: the status and at
/// most `max_bytes` of the body (a longer body is an error).
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    max_bytes: usize,
    limit: Duration,
) -> Result<(u16, String), String> {
    use http_body_util::{BodyExt, Empty, Limited};
    use hyper::body::Bytes;
    let ask = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, driver) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(driver);
        let request = http::Request::builder()
            .uri(path)
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(limit, ask)
        .await
        .map_err(|_| format!("no answer within {limit:?}"))?
}

fn push_line(log: &Mutex<VecDeque<String>>, mut line: String) {
    if line.len() > MAX_LINE_LEN {
        let mut cut = MAX_LINE_LEN;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
    if log.len() == LOG_TAIL_LINES {
        log.pop_front();
    }
    log.push_back(line);
}

/// The socket address right after `marker` in `line`, if any.
fn address_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once(marker)?;
    let word = rest.split_whitespace().next()?;
    word.trim_end_matches([',', ';', '.', '/'])
        .parse()
        .ok()
        .or_else(|| word.parse().ok())
}

/// `line` without ANSI escape sequences (CSI `ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.clone().next() == Some('[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_log_lines() {
        let line = "2026-01-01T00:00:00Z  INFO destination gRPC listening on 127.0.0.1:4567";
        assert_eq!(
            address_after(line, "destination gRPC listening on "),
            Some("127.0.0.1:4567".parse().expect("addr"))
        );
        assert_eq!(
            address_after(
                "outbound listening on 127.0.0.1:9, ready",
                "outbound listening on "
            ),
            Some("127.0.0.1:9".parse().expect("addr"))
        );
        assert_eq!(
            address_after(
                "outbound TCP route listening on 127.0.0.1:9",
                "outbound listening on "
            ),
            None
        );
        assert_eq!(
            address_after("admin listening on nowhere", "admin listening on "),
            None
        );
        assert_eq!(
            address_after(
                "INFO viz dashboard listening on http://127.0.0.1:8084/",
                "viz dashboard listening on http://"
            ),
            Some("127.0.0.1:8084".parse().expect("addr"))
        );
    }

    #[test]
    fn ansi_escapes_are_stripped() {
        assert_eq!(
            strip_ansi(
                "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m admin listening on 127.0.0.1:1"
            ),
            "2026  INFO admin listening on 127.0.0.1:1"
        );
        assert_eq!(strip_ansi("plain"), "plain");
    }

    #[test]
    fn the_log_tail_is_bounded() {
        let log = Mutex::new(VecDeque::new());
        for i in 0..1000 {
            push_line(&log, format!("line {i}"));
        }
        push_line(&log, "é".repeat(2000));
        let log = log.into_inner().expect("lock");
        assert_eq!(log.len(), LOG_TAIL_LINES);
        assert_eq!(log.front().map(String::as_str), Some("line 801"));
        assert!(log.back().expect("line").len() <= MAX_LINE_LEN + '…'.len_utf8());
    }
}
