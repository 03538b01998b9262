//! `POST /shutdown` on the proxy's admin port stops `ballast-proxy` as
//! SIGTERM does: with nothing in flight, it exits 0 at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(10);

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

#[test]
fn post_shutdown_stops_an_idle_proxy_with_exit_code_zero() {
    let child = Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .args([
            // Nothing listens on port 1: the controller is unreachable.
            "--destination-addr=127.0.0.1:1",
            "--outbound-addr=127.0.0.1:0",
            "--inbound-addr=127.0.0.1:0",
            "--admin-addr=127.0.0.1:0",
            "--shutdown-grace=5s",
            "--identity-disabled",
        ])
        .env("BALLAST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ballast-proxy starts");
    let mut proxy = Proxy(child);

    // The admin address is in the log; the rest of the log is kept for failures.
    let stderr = proxy.0.stderr.take().expect("stderr piped");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let admin: SocketAddr = loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let line = lines
            .recv_timeout(left)
            .expect("the proxy logs its admin address");
        if let Some(rest) = line.split("admin listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            break addr.parse().expect("an address after `admin listening on`");
        }
    };

    let metrics = http(admin, "GET", "/metrics");
    assert!(
        metrics.contains("\nproxy_build_info{version=\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nprocess_cpu_seconds_total "),
        "{metrics}"
    );
    assert!(http(admin, "GET", "/shutdown").starts_with("HTTP/1.1 405"));

    let reply = http(admin, "POST", "/shutdown");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let status = loop {
        if let Some(status) = proxy.0.try_wait().expect("wait on the proxy") {
            break status;
        }
        assert!(
            started.elapsed() < 2 * DEADLINE,
            "the proxy did not exit after POST /shutdown"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let log: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
    assert!(
        !log.iter().any(|l| l.contains("panicked")),
        "{}",
        log.join("\n")
    );
}
