//! The API's answers as `linkerd viz` prints them: aligned tables with `-`
//! for what is not known, tap events as `req` / `rsp` / `end` lines. Pure:
//! answers in, text out.

use ballast_vizcore::api::{EdgesResponse, Golden, RoutesResponse, StatResponse, TapEvent};

/// Columns are separated by this many spaces.
const GAP: usize = 3;

/// A text table: a header row, then rows; each column left or right aligned.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `columns`: name and whether it is right-aligned.
    pub fn new(columns: &[(&'static str, bool)]) -> Self {
        Self {
            headers: columns.iter().map(|(h, _)| *h).collect(),
            right: columns.iter().map(|(_, r)| *r).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table, each line ending in `\n`, no trailing spaces.
    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(widths.len()) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                let pad = w.saturating_sub(width(cell));
                if i > 0 {
                    line.push_str(&" ".repeat(GAP));
                }
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `100.00%`, or `-` with no requests.
pub fn percent(rate: Option<f64>) -> String {
    rate.filter(|r| r.is_finite())
        .map_or_else(|| "-".into(), |r| format!("{:.2}%", r * 100.0))
}

/// `2.0rps`; `-` when nothing was counted.
pub fn rps(g: &Golden) -> String {
    if g.requests == 0 && g.rps == 0.0 {
        return "-".into();
    }
    if g.rps.is_finite() {
        format!("{:.1}rps", g.rps)
    } else {
        "-".into()
    }
}

/// `123ms`; under 10 ms with a decimal (`1.5ms`), as a local mesh is fast.
pub fn latency(ms: Option<f64>) -> String {
    match ms.filter(|v| v.is_finite() && *v >= 0.0) {
        None => "-".into(),
        Some(v) if v < 10.0 => format!("{v:.1}ms"),
        Some(v) => format!("{v:.0}ms"),
    }
}

/// How a stat table is laid out.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatView {
    /// A NAMESPACE column first (`-A`).
    pub namespaces: bool,
    /// More columns: requests, unreachable pods, where the figures come from.
    pub wide: bool,
}

pub fn stat_table(answer: &StatResponse, view: StatView) -> String {
    let mut columns = Vec::new();
    if view.namespaces {
        columns.push(("NAMESPACE", false));
    }
    columns.extend([
        ("NAME", false),
        ("MESHED", true),
        ("SUCCESS", true),
        ("RPS", true),
        ("LATENCY_P50", true),
        ("LATENCY_P95", true),
        ("LATENCY_P99", true),
        ("TCP_CONN", true),
    ]);
    if view.wide {
        columns.extend([("REQUESTS", true), ("UNREACHABLE", true), ("SOURCE", false)]);
    }
    let mut table = Table::new(&columns);
    for row in &answer.rows {
        let mut cells = Vec::new();
        if view.namespaces {
            cells.push(row.resource.namespace.clone());
        }
        let meshed = if row.resource.kind == "service" || row.resource.kind == "route" {
            "-".to_string()
        } else {
            format!("{}/{}", row.meshed_pods, row.total_pods)
        };
        cells.extend([
            row.resource.name.clone(),
            meshed,
            percent(row.golden.success_rate),
            rps(&row.golden),
            latency(row.golden.p50_ms),
            latency(row.golden.p95_ms),
            latency(row.golden.p99_ms),
            row.tcp_connections
                .map_or_else(|| "-".into(), |n| n.to_string()),
        ]);
        if view.wide {
            cells.extend([
                row.golden.requests.to_string(),
                row.unreachable_pods.to_string(),
                row.source.clone(),
            ]);
        }
        table.push(cells);
    }
    table.render()
}

/// `√` for mutual TLS, else the reason.
fn secured(mtls: bool, reason: &str) -> String {
    if mtls {
        "√".into()
    } else if reason.is_empty() {
        "no".into()
    } else {
        reason.to_string()
    }
}

pub fn edges_table(answer: &EdgesResponse, wide: bool) -> String {
    let mut columns = vec![
        ("SRC", false),
        ("DST", false),
        ("SRC_NS", false),
        ("DST_NS", false),
        ("SECURED", false),
    ];
    if wide {
        columns.extend([("SERVER_ID", false), ("RPS", true), ("SUCCESS", true)]);
    }
    let mut table = Table::new(&columns);
    for e in &answer.edges {
        let mut cells = vec![
            e.src.name.clone(),
            e.dst.name.clone(),
            e.src.namespace.clone(),
            e.dst.namespace.clone(),
            secured(e.mtls, &e.no_tls_reason),
        ];
        if wide {
            cells.extend([
                e.server_id.clone().unwrap_or_else(|| "-".into()),
                rps(&e.golden),
                percent(e.golden.success_rate),
            ]);
        }
        table.push(cells);
    }
    table.render()
}

pub fn routes_table(answer: &RoutesResponse, wide: bool) -> String {
    let mut columns = vec![
        ("ROUTE", false),
        ("SERVICE", true),
        ("SUCCESS", true),
        ("RPS", true),
        ("LATENCY_P50", true),
        ("LATENCY_P95", true),
        ("LATENCY_P99", true),
    ];
    if wide {
        columns.extend([("KIND", false), ("NAMESPACE", false), ("PORT", true)]);
    }
    let mut table = Table::new(&columns);
    for r in &answer.rows {
        let name = if r.route.kind.eq_ignore_ascii_case("default") || r.route.name.is_empty() {
            "[DEFAULT]".to_string()
        } else {
            r.route.name.clone()
        };
        let mut cells = vec![
            name,
            r.parent.name.clone(),
            percent(r.golden.success_rate),
            rps(&r.golden),
            latency(r.golden.p50_ms),
            latency(r.golden.p95_ms),
            latency(r.golden.p99_ms),
        ];
        if wide {
            cells.extend([
                r.route.kind.clone(),
                r.route.namespace.clone(),
                r.parent_port.map_or_else(|| "-".into(), |p| p.to_string()),
            ]);
        }
        table.push(cells);
    }
    table.render()
}

/// Microseconds, as Linkerd's tap prints them.
fn micros(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1000.0).round() as u64
    } else {
        0
    }
}

/// A tapped request as Linkerd's `tap` prints its events: `req`, then
/// `rsp` when a response began, then `end` (with the error when it ended
/// without one). `wide` adds the workloads and identities.
pub fn tap_lines(e: &TapEvent, wide: bool) -> String {
    let proxy = match e.direction.as_str() {
        "inbound" => "in ",
        "outbound" => "out",
        _ => "???",
    };
    let flow = format!(
        "id={} proxy={proxy} src={} dst={} tls={}",
        e.id, e.source, e.destination, e.tls
    );
    let mut extra = String::new();
    if wide {
        for (key, value) in [
            ("src_res", &e.source_workload),
            ("src_id", &e.source_identity),
            ("dst_res", &e.destination_workload),
            ("dst_id", &e.destination_identity),
        ] {
            if let Some(v) = value {
                extra.push_str(&format!(" {key}={v}"));
            }
        }
    }
    let mut out = format!(
        "req {flow} :method={} :authority={} :path={}{extra}\n",
        e.method, e.authority, e.path
    );
    if let Some(status) = e.status {
        out.push_str(&format!(
            "rsp {flow} :status={status} latency={}µs{extra}\n",
            micros(e.latency_ms.unwrap_or(0.0))
        ));
    }
    let mut end = format!("end {flow}");
    if let Some(code) = e.grpc_status {
        end.push_str(&format!(" grpc-status={}", grpc_code(code)));
    }
    if let Some(error) = &e.error {
        end.push_str(&format!(" error={error:?}"));
    }
    if let Some(d) = e.duration_ms {
        end.push_str(&format!(" duration={}µs", micros(d)));
    }
    if let Some(bytes) = e.response_bytes {
        end.push_str(&format!(" response-length={bytes}B"));
    }
    out.push_str(&end);
    out.push_str(&extra);
    out.push('\n');
    out
}

/// gRPC's names for its codes.
fn grpc_code(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("Code({code})"), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_vizcore::api::{Edge, ResourceRef, RouteRow, StatRow};

    fn r(kind: &str, ns: &str, name: &str) -> ResourceRef {
        ResourceRef {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn golden(requests: u64, rps: f64, success: Option<f64>, p: [Option<f64>; 3]) -> Golden {
        Golden {
            requests,
            successes: 0,
            rps,
            success_rate: success,
            p50_ms: p[0],
            p95_ms: p[1],
            p99_ms: p[2],
        }
    }

    #[test]
    fn stat_tables_look_like_linkerds() {
        let answer = StatResponse {
            kind: "deployment".into(),
            rows: vec![
                StatRow {
                    resource: r("deployment", "emojivoto", "emoji"),
                    meshed_pods: 1,
                    total_pods: 2,
                    golden: golden(120, 2.0, Some(1.0), [Some(123.0); 3]),
                    tcp_connections: Some(123),
                    source: "inbound".into(),
                    ..StatRow::default()
                },
                StatRow {
                    resource: r("deployment", "emojivoto", "web"),
                    meshed_pods: 0,
                    total_pods: 3,
                    golden: golden(0, 0.0, None, [None; 3]),
                    source: "none".into(),
                    unreachable_pods: 2,
                    ..StatRow::default()
                },
            ],
            ..StatResponse::default()
        };
        assert_eq!(
            stat_table(&answer, StatView::default()),
            "NAME    MESHED   SUCCESS      RPS   LATENCY_P50   LATENCY_P95   LATENCY_P99   TCP_CONN\n\
             emoji      1/2   100.00%   2.0rps         123ms         123ms         123ms        123\n\
             web        0/3         -        -             -             -             -          -\n"
        );
        let wide = stat_table(
            &answer,
            StatView {
                namespaces: true,
                wide: true,
            },
        );
        let lines: Vec<&str> = wide.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE   NAME "), "{wide}");
        assert!(
            lines[0].ends_with("TCP_CONN   REQUESTS   UNREACHABLE   SOURCE"),
            "{wide}"
        );
        assert!(lines[1].starts_with("emojivoto   emoji "), "{wide}");
        assert!(lines[2].ends_with("0             2   none"), "{wide}");
    }

    #[test]
    fn services_have_no_meshed_column_and_small_latencies_keep_a_decimal() {
        let answer = StatResponse {
            rows: vec![StatRow {
                resource: r("service", "demo", "web"),
                golden: golden(10, 0.34, Some(0.5), [Some(0.24), Some(4.0), Some(12.4)]),
                ..StatRow::default()
            }],
            ..StatResponse::default()
        };
        let text = stat_table(&answer, StatView::default());
        let row = text.lines().nth(1).expect("row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["web", "-", "50.00%", "0.3rps", "0.2ms", "4.0ms", "12ms", "-"]
        );
    }

    #[test]
    fn edges_say_secured_or_why_not() {
        let answer = EdgesResponse {
            edges: vec![
                Edge {
                    src: r("deployment", "emojivoto", "vote-bot"),
                    dst: r("deployment", "emojivoto", "web"),
                    mtls: true,
                    server_id: Some(
                        "web.emojivoto.serviceaccount.identity.linkerd.cluster.local".into(),
                    ),
                    ..Edge::default()
                },
                Edge {
                    src: r("deployment", "demo", "load"),
                    dst: r("deployment", "demo", "web"),
                    mtls: false,
                    no_tls_reason: "no_identity: not_provided_by_service_discovery".into(),
                    ..Edge::default()
                },
            ],
            ..EdgesResponse::default()
        };
        assert_eq!(
            edges_table(&answer, false),
            "SRC        DST   SRC_NS      DST_NS      SECURED\n\
             vote-bot   web   emojivoto   emojivoto   √\n\
             load       web   demo        demo        no_identity: not_provided_by_service_discovery\n"
        );
        let wide = edges_table(&answer, true);
        assert!(
            wide.lines()
                .nth(1)
                .expect("row")
                .contains("web.emojivoto.serviceaccount"),
            "{wide}"
        );
        assert!(wide.lines().nth(2).expect("row").contains("   -"), "{wide}");
    }

    #[test]
    fn routes_name_the_default_route() {
        let answer = RoutesResponse {
            rows: vec![
                RouteRow {
                    route: r("HTTPRoute", "demo", "web-get"),
                    parent: r("service", "demo", "web"),
                    parent_port: Some(80),
                    golden: golden(30, 1.5, Some(1.0), [Some(123.0); 3]),
                    ..RouteRow::default()
                },
                RouteRow {
                    route: r("default", "demo", ""),
                    parent: r("service", "demo", "web"),
                    golden: golden(0, 0.0, None, [None; 3]),
                    ..RouteRow::default()
                },
            ],
            ..RoutesResponse::default()
        };
        assert_eq!(
            routes_table(&answer, false),
            "ROUTE       SERVICE   SUCCESS      RPS   LATENCY_P50   LATENCY_P95   LATENCY_P99\n\
             web-get         web   100.00%   1.5rps         123ms         123ms         123ms\n\
             [DEFAULT]       web         -        -             -             -             -\n"
        );
        let wide = routes_table(&answer, true);
        let cells: Vec<&str> = wide
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .collect();
        assert_eq!(cells[7..], ["HTTPRoute", "demo", "80"], "{wide}");
        assert!(
            wide.lines()
                .next()
                .expect("header")
                .ends_with("KIND        NAMESPACE   PORT"),
            "{wide}"
        );
    }

    #[test]
    fn tap_events_print_as_req_rsp_end() {
        let e = TapEvent {
            proxy: "demo/load-1".into(),
            id: "7:1".into(),
            direction: "outbound".into(),
            source: "127.0.0.1:5000".into(),
            destination: "127.0.0.2:8080".into(),
            destination_workload: Some("deployment/web".into()),
            tls: true,
            method: "GET".into(),
            authority: "web.demo.svc.cluster.local".into(),
            path: "/".into(),
            status: Some(200),
            latency_ms: Some(1.5),
            duration_ms: Some(2.25),
            response_bytes: Some(42),
            ..TapEvent::default()
        };
        assert_eq!(
            tap_lines(&e, false),
            "req id=7:1 proxy=out src=127.0.0.1:5000 dst=127.0.0.2:8080 tls=true :method=GET :authority=web.demo.svc.cluster.local :path=/\n\
             rsp id=7:1 proxy=out src=127.0.0.1:5000 dst=127.0.0.2:8080 tls=true :status=200 latency=1500µs\n\
             end id=7:1 proxy=out src=127.0.0.1:5000 dst=127.0.0.2:8080 tls=true duration=2250µs response-length=42B\n"
        );
        let wide = tap_lines(&e, true);
        assert!(
            wide.lines().all(|l| l.ends_with(" dst_res=deployment/web")),
            "{wide}"
        );

        let failed = TapEvent {
            direction: "inbound".into(),
            grpc_status: Some(14),
            error: Some("incomplete: the tap ended first".into()),
            status: None,
            ..e
        };
        let text = tap_lines(&failed, false);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("req id=7:1 proxy=in  src="), "{text}");
        assert!(
            text.contains(" grpc-status=Unavailable error=\"incomplete: the tap ended first\" duration=2250µs"),
            "{text}"
        );
        assert_eq!(grpc_code(99), "Code(99)");
    }
}
