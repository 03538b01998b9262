//! `ballast demo` end to end: the controller and the proxy as processes,
//! the controller killed under traffic while a backend is removed.

mod support;

use std::time::Duration;

use support::demo::Demo;

/// Setup, 2 + 3 + 2 s of steps, convergence and shutdown take about 12 s;
/// the rest is slack for a loaded machine.
const DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test]
async fn demo_holds_every_step() {
    let mut demo = Demo::start(&[
        "--steady-for",
        "2s",
        "--down-for",
        "3s",
        "--converge-within",
        "15s",
        "--rps",
        "100",
    ]);
    let (status, stdout, stderr) = demo.finish(DEADLINE).await;
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.success(), "exit {status}; {context}");

    // Not a terminal: plain lines, no escapes.
    assert!(!stdout.contains('\x1b'), "{context}");
    assert!(stdout.contains("every step held"), "{context}");
    let rows: Vec<&str> = ["a ", "b ", "c ", "d1 ", "d2 "]
        .iter()
        .map(|label| {
            stdout
                .lines()
                .find(|l| l.starts_with(label) && (l.ends_with("PASS") || l.ends_with("FAIL")))
                .unwrap_or_else(|| panic!("no summary row for step {label}; {context}"))
        })
        .collect();
    for row in &rows {
        assert!(row.ends_with("PASS"), "{row}; {context}");
        assert!(row.contains("100.00%"), "{row}; {context}");
    }
    // Once converged, web-c got nothing: its column (right-aligned under
    // its header) reads 0 in row d2.
    let header = stdout
        .lines()
        .find(|l| l.starts_with("step ") && l.contains(" what "))
        .expect("summary header");
    let web_c_end = header.find("web-c").expect("web-c column") + "web-c".len();
    let cell = rows[4]
        .get(web_c_end.saturating_sub(7)..web_c_end)
        .unwrap_or_default();
    assert_eq!(cell.trim(), "0", "{}; {context}", rows[4]);
    assert!(stdout.contains("web-c got 0 new requests"), "{context}");
    assert!(
        stdout.contains("web-c stopped receiving traffic"),
        "{context}"
    );
}
