//! `ballast stat`, `edges`, `routes`, `tap` and `top` against a running
//! demo: `ballast demo` starts the controllers, the load client's proxy (the
//! meshed pod `load`), three backends behind their own proxies (the meshed
//! pods of Deployment `web`) and `ballast viz`, all with identities, and
//! prints the dashboard's address; the commands read that server.

use ballast_testsupport as support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use ballast_vizcore::api::{EdgesResponse, StatResponse, TapEvent};
use support::demo::Demo;
use tokio::process::Command;

/// Setup on a loaded machine, and a few scrape cycles (2 s each).
const DEADLINE: Duration = Duration::from_secs(90);
/// One CLI command.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn ballast(args: &[&str]) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .env_remove("BALLAST_VIZ_ADDR")
        .env("BALLAST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ballast");
    let out = tokio::time::timeout(COMMAND_DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("ballast {} did not finish in time", args.join(" ")))
        .expect("output");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `args` until `check` accepts the result (figures need a few scrape
/// cycles), within the deadline.
async fn until<T>(args: &[&str], check: impl Fn(&Run) -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        let run = ballast(args).await;
        if let Some(v) = check(&run) {
            return v;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "ballast {}: exit {}\nstdout:\n{}\nstderr:\n{}",
            args.join(" "),
            run.code,
            run.stdout,
            run.stderr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn with<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    a.iter().chain(b).copied().collect()
}

fn cells(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test]
async fn the_cli_reads_a_running_demo() {
    // Steps long enough for the whole test.
    let mut demo = Demo::start(&[
        "--plain",
        "--rps",
        "50",
        "--steady-for",
        "120s",
        "--down-for",
        "120s",
    ]);
    let url = demo.dashboard_url(DEADLINE).await;
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    demo.line("traffic", DEADLINE, |l| {
        l.starts_with("traffic reached all three backends")
            .then_some(())
    })
    .await;
    let viz = ["--viz-addr", addr.as_str()];

    // stat -o json: the API's answer; Deployment web (three meshed pods,
    // each behind its proxy) carries the traffic, Deployment load calls it.
    let answer: StatResponse = until(
        &with(
            &["stat", "deploy", "-n", "demo", "-t", "10s", "-o", "json"],
            &viz,
        ),
        |run| {
            let answer: StatResponse = serde_json::from_str(&run.stdout).ok()?;
            let web = answer.rows.iter().find(|r| r.resource.name == "web")?;
            // A request that failed while the proxy first resolved ages
            // out of the 10 s window; the steps then fail none.
            (web.golden.requests > 0 && web.golden.success_rate == Some(1.0)).then_some(answer)
        },
    )
    .await;
    assert_eq!(answer.kind, "deployment");
    let mut names: Vec<&str> = answer
        .rows
        .iter()
        .map(|r| r.resource.name.as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["load", "web"]);
    for row in &answer.rows {
        assert_eq!(row.resource.kind, "deployment");
        assert_eq!(row.resource.namespace, "demo");
    }
    let web = answer
        .rows
        .iter()
        .find(|r| r.resource.name == "web")
        .expect("web");
    assert_eq!(web.golden.success_rate, Some(1.0), "{web:?}");
    assert!(web.golden.rps > 0.0, "{web:?}");
    assert_eq!((web.meshed_pods, web.total_pods), (3, 3), "{web:?}");
    let load = answer
        .rows
        .iter()
        .find(|r| r.resource.name == "load")
        .expect("load");
    assert_eq!((load.meshed_pods, load.total_pods), (1, 1), "{load:?}");

    // The table: Linkerd's columns, web's row with figures.
    let run = ballast(&with(&["stat", "deploy", "-n", "demo", "-t", "10s"], &viz)).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let mut lines = run.stdout.lines();
    assert_eq!(
        cells(lines.next().expect("header")),
        [
            "NAME",
            "MESHED",
            "SUCCESS",
            "RPS",
            "LATENCY_P50",
            "LATENCY_P95",
            "LATENCY_P99",
            "TCP_CONN"
        ]
    );
    let web_row = run
        .stdout
        .lines()
        .find(|l| l.starts_with("web "))
        .expect("web row");
    let web_cells = cells(web_row);
    assert_eq!(web_cells[1], "3/3", "{web_row}");
    assert_eq!(web_cells[2], "100.00%", "{web_row}");
    assert!(web_cells[3].ends_with("rps"), "{web_row}");
    let load_row = run
        .stdout
        .lines()
        .find(|l| l.starts_with("load "))
        .expect("load row");
    assert_eq!(cells(load_row)[1], "1/1", "{load_row}");

    // edges: load calls web, in mutual TLS (the demo runs with identity).
    let run = until(&with(&["edges", "deploy", "-n", "demo"], &viz), |run| {
        (run.code == 0 && run.stdout.lines().any(|l| l.starts_with("load ")))
            .then(|| run.stdout.clone())
    })
    .await;
    let mut lines = run.lines();
    assert_eq!(
        cells(lines.next().expect("header")),
        ["SRC", "DST", "SRC_NS", "DST_NS", "SECURED"]
    );
    let edge = run.lines().find(|l| l.starts_with("load ")).expect("edge");
    let edge = cells(edge);
    assert_eq!(edge[..4], ["load", "web", "demo", "demo"], "{run}");
    assert_eq!(edge[4], "√", "{run}");
    // The API behind it names the identity load's proxy verified.
    let (status, body) = support::http_get(
        addr.parse().expect("viz address"),
        "/api/edges?kind=deployment&namespace=demo",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let edges: EdgesResponse = serde_json::from_str(&body).expect("edges JSON");
    let edge = edges
        .edges
        .iter()
        .find(|e| e.src.name == "load" && e.dst.name == "web")
        .unwrap_or_else(|| panic!("no edge load -> web: {body}"));
    assert!(edge.mtls, "{edge:?}");
    assert_eq!(
        edge.server_id.as_deref(),
        Some("web.demo.serviceaccount.identity.linkerd.cluster.local"),
        "{edge:?}"
    );

    // routes of Service web: its clients' route metrics.
    let run = until(&with(&["routes", "svc/web", "-n", "demo"], &viz), |run| {
        (run.code == 0 && run.stdout.lines().count() > 1).then(|| run.stdout.clone())
    })
    .await;
    assert_eq!(
        cells(run.lines().next().expect("header")),
        [
            "ROUTE",
            "SERVICE",
            "SUCCESS",
            "RPS",
            "LATENCY_P50",
            "LATENCY_P95",
            "LATENCY_P99"
        ]
    );
    assert!(run.lines().skip(1).all(|l| cells(l)[1] == "web"), "{run}");

    // tap: three requests, each as req, rsp and end lines.
    let run = ballast(&with(
        &[
            "tap",
            "deploy/load",
            "-n",
            "demo",
            "--max-rps",
            "5",
            "--limit",
            "3",
        ],
        &viz,
    ))
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let req: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("req "))
        .collect();
    assert_eq!(req.len(), 3, "{}", run.stdout);
    for line in &req {
        assert!(line.contains(" proxy=out "), "{line}");
        assert!(
            line.contains(" :method=GET :authority=web.demo.svc.cluster.local :path=/"),
            "{line}"
        );
    }
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("rsp ") && l.contains(" :status=200 latency="))
            .count(),
        3,
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("end ") && l.contains(" duration="))
            .count(),
        3,
        "{}",
        run.stdout
    );

    // tap -o json: one TapEvent per line.
    let run = ballast(&with(
        &[
            "tap",
            "deploy/load",
            "-n",
            "demo",
            "--limit",
            "2",
            "-o",
            "json",
        ],
        &viz,
    ))
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let events: Vec<TapEvent> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), 2, "{}", run.stdout);
    for e in &events {
        assert_eq!(e.method, "GET");
        assert_eq!(e.direction, "outbound");
        assert_eq!(e.source_workload.as_deref(), Some("deployment/load"));
        assert_eq!(e.destination_workload.as_deref(), Some("deployment/web"));
        assert_eq!(e.status, Some(200));
    }

    // top, not on a terminal: the table every interval, then it stops.
    let top = |output: &'static str| -> Vec<&str> {
        let args = [
            "top",
            "deploy/load",
            "-n",
            "demo",
            "-o",
            output,
            "--interval",
            "1s",
            "--duration",
            "3s",
        ];
        with(&args, &viz)
    };
    let run = ballast(&top("table")).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stdout.contains('\x1b'), "{}", run.stdout);
    let header = run.stdout.lines().next().expect("header");
    assert_eq!(
        cells(header),
        [
            "SOURCE",
            "DESTINATION",
            "METHOD",
            "PATH",
            "COUNT",
            "BEST",
            "WORST",
            "LAST",
            "SUCCESS_RATE"
        ]
    );
    let rows: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("deployment/load "))
        .map(cells)
        .collect();
    assert!(!rows.is_empty(), "{}", run.stdout);
    let last = rows.last().expect("row");
    assert_eq!(
        last[..4],
        ["deployment/load", "deployment/web", "GET", "/"],
        "{}",
        run.stdout
    );
    assert!(last[4].parse::<u64>().expect("count") > 0, "{}", run.stdout);

    // The same as JSON: one document a line.
    let run = ballast(&top("json")).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let tables: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = tables.last().expect("a table");
    let row = &last["rows"][0];
    assert_eq!(
        (
            &row["source"],
            &row["destination"],
            &row["method"],
            &row["path"]
        ),
        (
            &serde_json::json!("deployment/load"),
            &serde_json::json!("deployment/web"),
            &serde_json::json!("GET"),
            &serde_json::json!("/")
        ),
        "{}",
        run.stdout
    );
    let count = row["count"].as_u64().expect("count");
    assert!(
        count > 0 && last["requests"].as_u64() >= Some(count),
        "{}",
        run.stdout
    );

    // The server's refusals: one line, exit 1.
    let run = ballast(&with(&["tap", "deploy/nothing", "-n", "demo"], &viz)).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "ballast: cannot tap deployment demo/nothing: no running meshed pods\n"
    );
    let run = ballast(&with(
        &["tap", "deploy/load", "-n", "demo", "--path", "no-slash"],
        &viz,
    ))
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "ballast: path: \"no-slash\" must start with '/'\n"
    );

    // Stopping the demo stops its viz.
    let status = demo.stop(DEADLINE).await.expect("the demo stopped in time");
    assert!(!status.success(), "an interrupted demo exits non-zero");
    let run = ballast(&with(&["stat", "deploy", "-n", "demo"], &viz)).await;
    assert_eq!(run.code, 1, "viz is gone with the demo: {}", run.stdout);
}

#[tokio::test]
async fn an_unreachable_viz_is_one_line_and_bad_flags_exit_2() {
    // A port bound and not listening, held to the end: a connection to it
    // is refused, and no server started meanwhile (the demo of the test
    // beside this one) can be handed it, as a port freed again could be.
    let held = tokio::net::TcpSocket::new_v4().expect("a socket");
    held.bind("127.0.0.1:0".parse().expect("an address"))
        .expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    for args in [
        vec!["stat", "deploy", "-n", "demo"],
        vec!["edges", "deploy"],
        vec!["routes", "svc/web"],
        vec!["tap", "deploy/load"],
        vec!["top", "deploy/load", "--duration", "1s"],
    ] {
        let run = ballast(&with(&args, &["--viz-addr", &addr])).await;
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr
                .starts_with(&format!("ballast: cannot reach ballast viz at {addr}: ")),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stderr
                .contains("is `ballast viz` running? set --viz-addr"),
            "{}",
            run.stderr
        );
    }
    for args in [
        vec!["stat", "bogus"],
        vec!["stat", "deploy", "-o", "yaml"],
        vec!["stat", "deploy", "--viz-addr", "no-port"],
        vec!["stat", "deploy", "-n", "Bad_NS"],
        vec!["tap", "deploy/load", "--max-rps", "0"],
        vec!["top", "deploy/load", "--interval", "0s"],
    ] {
        let run = ballast(&args).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
}
