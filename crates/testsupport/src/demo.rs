//! `ballast demo` as a child process for the tests that read a running demo
//! (the CLI, the dashboard): its output kept line by line, lines waited for
//! with a deadline, and SIGTERM to stop it (so it stops the processes it
//! started), also on drop.

use std::{
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
    sync::watch,
};

/// Lines of stderr shown with a failure.
const STDERR_TAIL: usize = 40;

pub struct Demo {
    child: Child,
    logs: DemoLogs,
    /// The tasks reading stdout and stderr; they end at the pipes' end.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

/// What the demo printed so far; cheap to clone into another task.
#[derive(Clone, Default)]
pub struct DemoLogs {
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// Bumped on each stdout line, and when stdout ends (`u64::MAX`).
    printed: Arc<watch::Sender<u64>>,
}

impl DemoLogs {
    /// Stdout whole and the tail of stderr, for a failure message.
    pub fn text(&self) -> String {
        let out = self.stdout.lock().expect("lines lock").join("\n");
        let err = self.stderr.lock().expect("lines lock");
        let tail = &err[err.len().saturating_sub(STDERR_TAIL)..];
        format!(
            "--- demo stdout ---\n{out}\n--- demo stderr (last {STDERR_TAIL} lines) ---\n{}",
            tail.join("\n")
        )
    }
}

impl Demo {
    /// Starts `ballast demo ARGS` (logging at `warn`).
    pub fn start(args: &[&str]) -> Demo {
        let mut child = Command::new(crate::ballast_bin())
            .arg("demo")
            .args(args)
            .env("BALLAST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ballast demo");
        let logs = DemoLogs {
            printed: Arc::new(watch::channel(0).0),
            ..DemoLogs::default()
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let readers = vec![
            collect(stdout, logs.stdout.clone(), Some(logs.printed.clone())),
            collect(stderr, logs.stderr.clone(), None),
        ];
        Demo {
            child,
            logs,
            readers,
        }
    }

    pub fn logs(&self) -> DemoLogs {
        self.logs.clone()
    }

    /// The first stdout line `pick` accepts, waiting at most `limit`;
    /// `None` when none came (the demo ended, or the time ran out).
    pub async fn try_line<T>(
        &self,
        limit: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let mut printed = self.logs.printed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let seen = *printed.borrow_and_update();
            let found = self
                .logs
                .stdout
                .lock()
                .expect("lines lock")
                .iter()
                .find_map(|l| pick(l));
            if found.is_some() || seen == u64::MAX {
                return found;
            }
            match tokio::time::timeout_at(deadline, printed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// As `try_line`, panicking with the demo's output when no line came.
    pub async fn line<T>(
        &self,
        what: &str,
        limit: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        match self.try_line(limit, pick).await {
            Some(v) => v,
            None => panic!(
                "the demo printed no {what} in {limit:?}\n{}",
                self.logs.text()
            ),
        }
    }

    /// The dashboard's `http://ADDR/` from the demo's `dashboard:` line.
    pub async fn dashboard_url(&self, limit: Duration) -> String {
        self.line("`dashboard: http://ADDR/` line", limit, dashboard_url)
            .await
    }

    /// Waits at most `limit` for the demo to end by itself and for all it
    /// printed: its exit status, stdout and stderr whole.
    pub async fn finish(&mut self, limit: Duration) -> (ExitStatus, String, String) {
        let deadline = tokio::time::Instant::now() + limit;
        let status = tokio::time::timeout_at(deadline, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the demo did not end in {limit:?}\n{}", self.logs.text()))
            .expect("the demo's exit status");
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout_at(deadline, reader).await;
        }
        let whole = |lines: &Mutex<Vec<String>>| lines.lock().expect("lines lock").join("\n");
        (status, whole(&self.logs.stdout), whole(&self.logs.stderr))
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    /// SIGTERM, then waits at most `limit` for the demo to exit; `None`
    /// (and the process killed) when it did not.
    pub async fn stop(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.terminate();
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                let _ = self.child.start_kill();
                None
            }
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The URL in a `dashboard: http://ADDR/` line.
pub fn dashboard_url(line: &str) -> Option<String> {
    let rest = &line[line.find("dashboard: ")? + "dashboard: ".len()..];
    let url = rest.split_whitespace().next()?;
    url.starts_with("http://").then(|| url.to_string())
}

/// Keeps every line of `stream` in `lines`, counting them in `printed`.
fn collect(
    stream: impl AsyncRead + Unpin + Send + 'static,
    lines: Arc<Mutex<Vec<String>>>,
    printed: Option<Arc<watch::Sender<u64>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            lines.lock().expect("lines lock").push(line);
            if let Some(p) = &printed {
                p.send_modify(|n| *n = n.saturating_add(1).min(u64::MAX - 1));
            }
        }
        if let Some(p) = &printed {
            p.send_replace(u64::MAX);
        }
    })
}
