//! `POST /shutdown` on the proxy's admin port stops `ballast-proxy` as
//! SIGTERM does: with nothing in flight, it exits 0 at once.

mod support;

use support::{http, Proxy};

#[test]
fn post_shutdown_stops_an_idle_proxy_with_exit_code_zero() {
    let mut proxy = Proxy::idle(&["--shutdown-grace=5s"]);
    // The admin address is in the log; the rest of the log is kept for failures.
    let mut log = Vec::new();
    let admin = proxy.admin_addr(&mut log, str::to_string);

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
    let status = proxy.wait_exit(&mut log);
    let log = String::from_utf8_lossy(&log);
    assert!(status.success(), "exit {status}; log:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn await_returns_once_the_proxy_is_ready_and_fails_when_nothing_answers() {
    let proxy = Proxy::idle(&[]);
    let mut log = Vec::new();
    let admin = proxy.admin_addr(&mut log, str::to_string);
    let waited = std::process::Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .args(["await", "--timeout=20s", "--admin-addr"])
        .arg(admin.to_string())
        .output()
        .expect("ballast-proxy await runs");
    assert!(waited.status.success(), "{waited:?}");

    // A port bound and not listening, held to the end: a connection to it
    // is refused, and no server started meanwhile (by a test beside this
    // one) can be handed it, as a port freed again could be.
    let held = tokio::net::TcpSocket::new_v4().expect("a socket");
    held.bind("127.0.0.1:0".parse().expect("an address"))
        .expect("bind");
    let closed = held.local_addr().expect("addr");
    let waited = std::process::Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .args(["await", "--timeout=300ms", "--admin-addr"])
        .arg(closed.to_string())
        .output()
        .expect("ballast-proxy await runs");
    assert_eq!(waited.status.code(), Some(1), "{waited:?}");
    let err = String::from_utf8_lossy(&waited.stderr);
    assert!(err.contains("was not ready within"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
