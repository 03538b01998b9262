//! `ballast-proxy`'s log as `kubectl logs` shows it: stderr is a pipe, so
//! plain lines carry no colour escapes; with `--log-format json` every line
//! is one JSON object. Its `/metrics` page is read by the reference
//! OpenMetrics parser on the way.

#[path = "../../testsupport/src/openmetrics.rs"]
mod openmetrics;
mod support;

use support::{http, Proxy, DEADLINE};

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
    let mut proxy = Proxy::idle(extra);
    let mut log = Vec::new();
    let admin = proxy.admin_addr(&mut log, message);

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
    proxy.wait_exit(&mut log);
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
