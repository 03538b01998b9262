//! `ballast-proxy`'s log as `kubectl logs` shows it: stderr is a pipe, so
//! plain lines carry no colour escapes; with `--log-format json` every line
//! is one JSON object. Its `/metrics` page is read by the reference
//! OpenMetrics parser on the way.

#[path = "../../ballast/tests/support/openmetrics.rs"]
mod openmetrics;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

/// Kills the proxy if the test fails before it exits.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(addr: SocketAddr, method: &str, path: &str) -> String {
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

/// The message of a log line, in either format.
fn message(line: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) => v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Err(_) => line.to_string(),
    }
}

/// Runs an idle proxy with `extra` flags and stderr on a pipe, reads its
/// `/metrics`, stops it with `POST /shutdown`; its whole log, raw bytes.
fn run_proxy(extra: &[&str]) -> Vec<u8> {
    let child = Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
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
    let mut proxy = Proxy(child);
    let stderr = proxy.0.stderr.take().expect("stderr piped");
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
    let started = Instant::now();
    let mut log = Vec::new();
    let admin: SocketAddr = loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let line = lines.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "the proxy logs its admin address; log:\n{}",
                String::from_utf8_lossy(&log)
            )
        });
        log.extend_from_slice(&line);
        let text = message(String::from_utf8_lossy(&line).trim_end());
        if let Some(rest) = text.split("admin listening on ").nth(1) {
            break rest.trim().parse().expect("an address");
        }
    };

    let page = http(admin, "GET", "/metrics");
    let (head, body) = page.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-type: {}", openmetrics::CONTENT_TYPE)),
        "{head}"
    );
    if let Some(page) = openmetrics::parse_strict(body, "ballast-proxy") {
        page.assert_has("process_cpu_seconds", "counter");
        page.assert_has("proxy_build_info", "gauge");
    }

    let reply = http(admin, "POST", "/shutdown");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    loop {
        if proxy.0.try_wait().expect("wait on the proxy").is_some() {
            break;
        }
        assert!(started.elapsed() < 2 * DEADLINE, "the proxy did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The reader ends at EOF, once the exited proxy's pipe closes.
    while let Ok(line) = lines.recv_timeout(DEADLINE) {
        log.extend_from_slice(&line);
    }
    log
}

#[test]
fn plain_logs_to_a_pipe_carry_no_colour_escapes() {
    let log = run_proxy(&[]);
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("admin listening on"), "{text}");
    assert!(!log.contains(&0x1b), "an ESC byte in a piped log:\n{text}");
}

#[test]
fn json_logs_are_one_object_per_line_with_level_and_message() {
    let log = run_proxy(&["--log-format", "json"]);
    let text = String::from_utf8_lossy(&log);
    assert!(!log.contains(&0x1b), "{text}");
    let mut messages = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line:?}"));
        let level = v["level"].as_str().unwrap_or_default();
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
            "{line}"
        );
        assert!(v["timestamp"].is_string(), "{line}");
        let message = v["fields"]["message"].as_str();
        let message = message.unwrap_or_else(|| panic!("no fields.message: {line}"));
        messages.push(message.to_string());
    }
    assert!(
        messages.iter().any(|m| m.starts_with("admin listening on")),
        "{text}"
    );
    // Structured fields stay fields, not text in the message.
    assert!(
        text.lines().any(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            v["fields"]["destination"] == "127.0.0.1:1"
        }),
        "{text}"
    );
}
