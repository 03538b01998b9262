//! Checks a `/metrics` page with the reference OpenMetrics parser (Python's
//! `prometheus_client.openmetrics.parser`, Debian's `python3-prometheus-client`),
//! the way a scraper that follows the standard reads it: a family name with two
//! types, metadata after samples or a missing `# EOF` fails the test with the
//! parser's own message.
//!
//! Under CI (the `CI` environment variable set) a missing parser fails the
//! test; elsewhere the check is skipped with a printed reason.

// Also compiled into crates/sidecar/tests/logging.rs (`#[path]`), which
// uses part of it.
#![allow(dead_code)]

use std::{
    io::Write,
    net::SocketAddr,
    process::{Command, Stdio},
};

/// The `Content-Type` an OpenMetrics page must be served with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Parses stdin strictly; prints `name<TAB>type<TAB>samples` per family.
/// Exit 3: no parser here; exit 1: the page is invalid (the reason on stdout).
const STRICT_PARSE: &str = r#"
import sys
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError as e:
    print(e)
    sys.exit(3)
try:
    families = list(text_string_to_metric_families(sys.stdin.read()))
except Exception as e:
    print("%s: %s" % (type(e).__name__, e))
    sys.exit(1)
for f in families:
    print("%s\t%s\t%d" % (f.name, f.type, len(f.samples)))
"#;

/// One metric family as the parser read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `unknown`...
    pub kind: String,
    pub samples: usize,
}

/// The families of a parsed page.
#[derive(Debug, Default)]
pub struct Page {
    pub families: Vec<Family>,
}

impl Page {
    /// The family named `name` (without `_total` for counters).
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Panics unless `name` is a family of type `kind` with at least one sample.
    pub fn assert_has(&self, name: &str, kind: &str) {
        match self.family(name) {
            Some(f) => assert!(
                f.kind == kind && f.samples > 0,
                "{name}: want a {kind} with samples, got {f:?}"
            ),
            None => panic!("no family {name} in {:?}", self.families),
        }
    }
}

/// Interpreters tried in order: `BALLAST_TEST_PYTHON` if set, the `python3`
/// on PATH, then the system's (where Debian's package installs the parser).
fn interpreters() -> Vec<String> {
    let mut found: Vec<String> = std::env::var("BALLAST_TEST_PYTHON").into_iter().collect();
    found.extend(["python3".to_string(), "/usr/bin/python3".to_string()]);
    found
}

/// Checks `page` (the body of a `/metrics` answer from `what`) with the
/// reference parser; panics with the parser's message when it is invalid.
/// `None` when no parser is installed and this is not CI.
pub fn parse_strict(page: &str, what: &str) -> Option<Page> {
    let mut missing = Vec::new();
    for python in interpreters() {
        let child = Command::new(&python)
            .args(["-c", STRICT_PARSE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                missing.push(format!("{python}: {e}"));
                continue;
            }
        };
        let mut stdin = child.stdin.take().expect("piped stdin");
        // The parser reads all of stdin before answering; the page fits the pipe
        // or is drained by it, and wait_with_output reads stdout meanwhile.
        let writer = {
            let page = page.to_string();
            std::thread::spawn(move || stdin.write_all(page.as_bytes()))
        };
        let out = child.wait_with_output().expect("the parser runs");
        let _ = writer.join();
        let stdout = String::from_utf8_lossy(&out.stdout);
        match out.status.code() {
            Some(0) => {
                let families = stdout
                    .lines()
                    .filter_map(|l| {
                        let mut cols = l.split('\t');
                        Some(Family {
                            name: cols.next()?.to_string(),
                            kind: cols.next()?.to_string(),
                            samples: cols.next()?.parse().ok()?,
                        })
                    })
                    .collect();
                return Some(Page { families });
            }
            Some(3) => missing.push(format!("{python}: {}", stdout.trim())),
            _ => panic!(
                "{what}: /metrics is not valid OpenMetrics: {}{}\n--- page ---\n{page}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }
    let reason = format!(
        "no OpenMetrics parser (apt-get install python3-prometheus-client): {}",
        missing.join("; ")
    );
    assert!(std::env::var_os("CI").is_none(), "{what}: {reason}");
    eprintln!("skipping the OpenMetrics check of {what}: {reason}");
    None
}

/// GETs `/metrics` from the admin server at `addr`, checks the status and
/// the `Content-Type`, then the page with [`parse_strict`].
pub async fn check_page(addr: SocketAddr, what: &str) -> Option<Page> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{what}: connect to the admin server {addr}: {e}"));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .expect("send GET /metrics");
    let mut answer = Vec::new();
    tokio::time::timeout(crate::DEADLINE, s.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("{what}: /metrics not answered in time"))
        .expect("read /metrics");
    let answer = String::from_utf8(answer).expect("/metrics is UTF-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{what}: {head}");
    let content_type = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim());
    assert_eq!(content_type, Some(CONTENT_TYPE), "{what}: {head}");
    parse_strict(body, what)
}
