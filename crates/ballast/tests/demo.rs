//! `ballast demo` end to end: the controllers, the proxies and viz as
//! processes, the destination controller killed under traffic while a
//! backend is removed, and every connection from load to web mutual TLS.

use ballast_testsupport as support;

use std::net::SocketAddr;
use std::time::Duration;

use ballast_vizcore::api::{Edge, EdgesResponse};
use support::demo::Demo;

/// Setup, 2 + 3 + 2 s of steps, convergence and shutdown take about 12 s;
/// the rest is slack for a loaded machine.
const DEADLINE: Duration = Duration::from_secs(90);
/// How often viz's edges are read while the demo runs.
const POLL_EVERY: Duration = Duration::from_millis(500);

const LOAD_ID: &str = "load.demo.serviceaccount.identity.linkerd.cluster.local";
const WEB_ID: &str = "web.demo.serviceaccount.identity.linkerd.cluster.local";

/// Viz's edge from deploy/load to deploy/web, once it has judged its TLS
/// (an edge with no connection seen yet says "unknown").
async fn load_to_web(viz: SocketAddr) -> Option<Edge> {
    let (status, body) = support::http_get(viz, "/api/edges?kind=deployment&namespace=demo").await;
    if status != 200 {
        return None;
    }
    let answer: EdgesResponse = serde_json::from_str(&body).ok()?;
    answer.edges.into_iter().find(|e| {
        e.src.name == "load" && e.dst.name == "web" && (e.mtls || e.no_tls_reason != "unknown")
    })
}

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
    let url = demo.dashboard_url(DEADLINE).await;
    let viz: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the dashboard's address");
    // Viz's view of the edge, read while the demo runs (viz ends with it).
    let mut edge = None;
    let (status, stdout, stderr) = {
        let finish = demo.finish(DEADLINE);
        tokio::pin!(finish);
        loop {
            tokio::select! {
                done = &mut finish => break done,
                () = tokio::time::sleep(POLL_EVERY), if edge.is_none() => {
                    edge = load_to_web(viz).await;
                }
            }
        }
    };
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.success(), "exit {status}; {context}");

    // Not a terminal: plain lines, no escapes.
    assert!(!stdout.contains('\x1b'), "{context}");
    assert!(stdout.contains("every step held"), "{context}");
    let rows: Vec<&str> = ["a ", "b ", "c ", "d1 ", "d2 ", "e "]
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

    // Mutual TLS, as the proxies counted it: step e's checks, and the
    // summary's line naming both ends.
    assert!(
        stdout.lines().any(|l| l.starts_with("ok   e   ")
            && l.contains(&format!(
                "the load proxy's connections to web were mutual TLS with {WEB_ID}"
            ))),
        "{context}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("ok   e   ")
            && l.contains("web's proxies accepted only mutual TLS")
            && l.contains(LOAD_ID)),
        "{context}"
    );
    assert!(
        stdout.contains(&format!(
            "\ntraffic from load to web was mutual TLS: {LOAD_ID} -> {WEB_ID} ("
        )),
        "{context}"
    );
    // And as viz saw it from the proxies' metrics: the edge is secured, by
    // web's identity.
    let edge = edge.unwrap_or_else(|| panic!("viz showed no edge load -> web; {context}"));
    assert!(edge.mtls, "{edge:?}; {context}");
    assert_eq!(edge.server_id.as_deref(), Some(WEB_ID), "{edge:?}");
    assert_eq!(edge.no_tls_reason, "", "{edge:?}");
}
