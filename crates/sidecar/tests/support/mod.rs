//! An idle `ballast-proxy` as a child process, reached on its admin port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(20);

/// Kills the proxy if the test fails before it exits.
pub struct Proxy {
    pub child: Child,
    /// stderr, line by line (raw bytes, newline included), read by a thread.
    pub lines: mpsc::Receiver<Vec<u8>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// Starts a proxy whose controller is unreachable, every listener on
    /// an OS-picked loopback port, with `extra` flags after those.
    pub fn idle(extra: &[&str]) -> Proxy {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
            .args([
                // Nothing listens on port 1: the controller is unreachable.
                "--destination-addr=127.0.0.1:1",
                "--outbound-addr=127.0.0.1:0",
                "--inbound-addr=127.0.0.1:0",
                "--admin-addr=127.0.0.1:0",
                "--identity-disabled",
            ])
            .args(extra)
            .env("BALLAST_LOG", "info")
            .env_remove("BALLAST_LOG_FORMAT")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ballast-proxy starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if lines_tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Proxy { child, lines }
    }

    /// The admin address from the log (`message` reads a line's message in
    /// the log's format); the lines read on the way are added to `log`.
    pub fn admin_addr(&self, log: &mut Vec<u8>, message: impl Fn(&str) -> String) -> SocketAddr {
        let started = Instant::now();
        loop {
            let left = DEADLINE.saturating_sub(started.elapsed());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "the proxy logs its admin address; log:\n{}",
                    String::from_utf8_lossy(log)
                )
            });
            log.extend_from_slice(&line);
            let text = message(String::from_utf8_lossy(&line).trim_end());
            if let Some(rest) = text.split("admin listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                return addr.parse().expect("an address after `admin listening on`");
            }
        }
    }

    /// Waits for the proxy to exit (within twice the deadline), then reads
    /// the rest of its log into `log`.
    pub fn wait_exit(&mut self, log: &mut Vec<u8>) -> std::process::ExitStatus {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait on the proxy") {
                break status;
            }
            assert!(started.elapsed() < 2 * DEADLINE, "the proxy did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader ends at EOF, once the exited proxy's pipe closes.
        while let Ok(line) = self.lines.recv_timeout(DEADLINE) {
            log.extend_from_slice(&line);
        }
        status
    }
}

/// One HTTP/1.1 request on its own connection; the whole answer.
pub fn http(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to admin");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read reply");
    reply
}
