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
