//! The dashboard in a real headless browser. `ballast demo` runs the whole
//! thing (controller, the meshed client's proxy, backends, `ballast viz`,
//! steady traffic); `tests/dashboard/check.py` drives Chromium through
//! Selenium over every page and checks the figures against the JSON API and
//! the client proxy's own counters, the live updates, the Tap panel and the
//! browser's console (see the script for each check and its tolerance).
//!
//! Needs Debian's `chromium`, `chromium-driver` and `python3-selenium` (the
//! system `/usr/bin/python3`, or `BALLAST_TEST_PYTHON`). Under CI (the `CI`
//! environment variable set) a missing one fails the test; elsewhere the
//! test prints SKIPPED and passes.
//!
//! Screenshots of each page go to `target/dashboard-screenshots/`, and to
//! `docs/screenshots/` with `BALLAST_WRITE_SCREENSHOTS=1`.

use ballast_testsupport as support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::demo::{dashboard_url, Demo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The whole test: the demo's start, the collector's first cycles and
/// every page, on a busy machine.
const DEADLINE: Duration = Duration::from_secs(240);
/// For the demo to print its dashboard's address.
const DEMO_READY: Duration = Duration::from_secs(60);
/// For the demo to stop (and stop its children) after SIGTERM.
const DEMO_STOP: Duration = Duration::from_secs(20);
/// The demo's load: enough requests per scrape interval for steady figures.
const DEMO_RPS: &str = "50";
/// The demo's first steady step outlasts the test, so the browser always
/// sees steady traffic; the test stops the demo itself.
const DEMO_STEADY_FOR: &str = "600s";

fn python() -> String {
    std::env::var("BALLAST_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_string())
}

fn script() -> PathBuf {
    dashboard_dir().join("check.py")
}

fn dashboard_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn screenshots_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("dashboard-screenshots")
}

/// Whether a browser is here: `None` when it is, else the reason.
async fn missing_browser() -> Option<String> {
    let out = Command::new(python())
        .arg(script())
        .arg("--preflight")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(30), out).await {
        Ok(Ok(out)) if out.status.success() => {
            println!("{}", String::from_utf8_lossy(&out.stdout).trim());
            None
        }
        Ok(Ok(out)) => Some(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Err(e)) => Some(format!("{}: {e}", python())),
        Err(_) => Some("the browser preflight did not answer in 30 s".to_string()),
    }
}

/// Skips (prints why) when no browser is here, outside CI; `false` then.
async fn browser_here() -> bool {
    let Some(reason) = missing_browser().await else {
        return true;
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "no headless browser under CI (apt-get install chromium chromium-driver \
         python3-selenium): {reason}"
    );
    println!("SKIPPED: no headless browser here: {reason}");
    false
}

/// Runs a check script of tests/dashboard (its own process group, so a
/// hang is killed with the browser it started) within `limit`; panics with
/// its output unless it exits 0.
async fn run_script(name: &str, args: &[String], limit: Duration, context: impl Fn() -> String) {
    // Chromium and its driver leave directories in TMPDIR; theirs is removed
    // with the run.
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let mut script = Command::new(python());
    script
        .arg(dashboard_dir().join(name))
        .args(args)
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = script
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let group = child.id();
    let output = tokio::time::timeout(limit, child.wait_with_output()).await;
    if let (Err(_), Some(pid)) = (&output, group) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
    }
    let output = match output {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("cannot run {}: {e}", python()),
        Err(_) => panic!("{name} did not finish in {limit:?}\n{}", context()),
    };
    let report = format!(
        "--- {name} stdout ---\n{}\n--- {name} stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{report}");
    assert!(
        output.status.success(),
        "{name} failed ({}); screenshots in {}\n{report}\n{}",
        output.status,
        screenshots_dir().display(),
        context()
    );
}

#[tokio::test]
async fn dashboard_in_a_headless_browser() {
    let started = Instant::now();
    if !browser_here().await {
        return;
    }

    let mut demo = Demo::start(&[
        "--plain",
        "--rps",
        DEMO_RPS,
        "--steady-for",
        DEMO_STEADY_FOR,
    ]);
    let Some(url) = demo.try_line(DEMO_READY, dashboard_url).await else {
        let logs = demo.logs().text();
        demo.stop(DEMO_STOP).await;
        panic!("the demo printed no `dashboard: http://ADDR/` line in {DEMO_READY:?}\n{logs}");
    };
    println!("dashboard at {url}");

    let mut args = vec![
        "--url".to_string(),
        url.clone(),
        "--out".to_string(),
        screenshots_dir().display().to_string(),
    ];
    if std::env::var("BALLAST_WRITE_SCREENSHOTS").as_deref() == Ok("1") {
        args.push("--docs".to_string());
        args.push(workspace().join("docs/screenshots").display().to_string());
    }
    // The script's own deadline ends first, with its reason; the limit only
    // bounds a script that hangs.
    let left = DEADLINE.saturating_sub(started.elapsed() + DEMO_STOP);
    args.push("--deadline".to_string());
    args.push(
        left.saturating_sub(Duration::from_secs(15))
            .as_secs()
            .to_string(),
    );
    let logs = {
        let logs = demo.logs();
        move || logs.text()
    };
    let checked = tokio::spawn(async move { run_script("check.py", &args, left, logs).await });
    let result = checked.await;
    demo.stop(DEMO_STOP).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// What a live demo never shows (markup in names, an unreachable pod,
/// unknown figures, a failing API, a stalled collector), from
/// tests/dashboard/fixture.py serving the dashboard's own files; checked by
/// tests/dashboard/hostile.py.
#[tokio::test]
async fn dashboard_edge_cases_in_a_headless_browser() {
    if !browser_here().await {
        return;
    }
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../viz/src/assets");
    let mut fixture = Command::new(python())
        .arg(dashboard_dir().join("fixture.py"))
        .arg(&assets)
        // It exits when its stdin closes: with this test.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn fixture.py");
    let mut lines = BufReader::new(fixture.stdout.take().expect("piped stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("fixture.py starts in 30 s")
        .expect("read fixture.py")
        .expect("fixture.py prints its address");
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("fixture.py said {first:?}"))
        .to_string();
    let args = [
        "--url".to_string(),
        url,
        "--out".to_string(),
        screenshots_dir().display().to_string(),
        "--deadline".to_string(),
        "100".to_string(),
    ];
    run_script("hostile.py", &args, Duration::from_secs(120), String::new).await;
    drop(fixture);
}

#[test]
fn the_dashboard_line_is_read() {
    assert_eq!(
        dashboard_url("dashboard: http://127.0.0.1:40123/").as_deref(),
        Some("http://127.0.0.1:40123/")
    );
    assert_eq!(
        dashboard_url("  dashboard: http://[::1]:8084/  (ballast viz)").as_deref(),
        Some("http://[::1]:8084/")
    );
    assert_eq!(dashboard_url("dashboard: starting"), None);
    assert_eq!(dashboard_url("no address here"), None);
}
