//! Real pages, 10 s apart (see data/README.md): one Ballast proxy's, and two
//! linkerd2-proxies' run with Ballast as their control plane; read as the
//! collector reads them, the figures are checked against the proxies' own
//! counters, read here line by line without the parser.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use ballast_vizcore::api::ResourceRef;
use ballast_vizcore::expo::{parse, Limits};
use ballast_vizcore::mesh::{Mesh, MeshConfig, StatQuery};
use ballast_vizcore::targets::{PodTarget, Snapshot};

const T0: &str = include_str!("data/demo-proxy-t0.txt");
const T10: &str = include_str!("data/demo-proxy-t10.txt");
const L2P_LOAD_T0: &str = include_str!("data/l2p-load-a-t0.txt");
const L2P_LOAD_T10: &str = include_str!("data/l2p-load-a-t10.txt");
const L2P_WEB_T0: &str = include_str!("data/l2p-web-a-t0.txt");
const L2P_WEB_T10: &str = include_str!("data/l2p-web-a-t10.txt");

/// The values of the sample lines of `name` whose labels contain every
/// one of `with`, summed.
fn sum(page: &str, name: &str, with: &[&str]) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn delta(name: &str, with: &[&str]) -> f64 {
    delta_of((T0, T10), name, with)
}

fn delta_of((t0, t10): (&str, &str), name: &str, with: &[&str]) -> f64 {
    sum(t10, name, with) - sum(t0, name, with)
}

fn quantile(name: &str, with: &[&str], q: f64, scale: f64) -> f64 {
    quantile_of((T0, T10), name, with, q, scale)
}

/// `histogram_quantile` over the two pages' bucket deltas, by definition.
fn quantile_of(pages: (&str, &str), name: &str, with: &[&str], q: f64, scale: f64) -> f64 {
    let mut cumulative: Vec<(f64, f64)> = Vec::new();
    for line in pages
        .1
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
    {
        if !with.iter().all(|w| line.contains(w)) {
            continue;
        }
        let le = line.split("le=\"").nth(1).and_then(|r| r.split('"').next());
        let le: f64 = le.expect("le").parse().expect("le parses");
        let label = format!(
            "le=\"{}\"",
            line.split("le=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        );
        let mut filter = with.to_vec();
        filter.push(&label);
        cumulative.push((le * scale, delta_of(pages, name, &filter)));
    }
    cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = cumulative.last().expect("+Inf").1;
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, c) in cumulative {
        if c >= rank {
            return prev.0 + (le - prev.0) * (rank - prev.1) / (c - prev.1);
        }
        prev = (le, c);
    }
    unreachable!()
}

fn snapshot() -> Snapshot {
    let load = ResourceRef {
        kind: "deployment".into(),
        namespace: "demo".into(),
        name: "load".into(),
    };
    let mut pods_per_workload = HashMap::new();
    pods_per_workload.insert(load.clone(), 1);
    Snapshot {
        meshed: vec![PodTarget {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: "demo".into(),
                name: "load-5d8f9-abcde".into(),
            },
            workload: Some(load),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            admin_port: 4191,
            tap_port: 4190,
            service_account: "default".into(),
        }],
        pods_per_workload,
    }
}

/// The row of `kind`/`name` in namespace demo over the last 10 s (to 1010).
fn stat_row(mesh: &Mesh, kind: &str, name: &str) -> ballast_vizcore::api::StatRow {
    let q = StatQuery {
        kind: kind.into(),
        namespace: Some("demo".into()),
        name: Some(name.into()),
        window_secs: Some(10),
    };
    mesh.stat(&q, 1010).expect("stat").rows.remove(0)
}

fn close(got: Option<f64>, want: f64) {
    let got = got.expect("a figure");
    assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
}

#[test]
fn two_real_pages_give_the_proxys_own_figures() {
    let t0 = parse(T0.as_bytes(), &Limits::default(), Some(4191)).expect("t0 parses");
    let t10 = parse(T10.as_bytes(), &Limits::default(), Some(4191)).expect("t10 parses");
    assert_eq!(t0.skipped_lines(), 0);
    assert_eq!(t10.skipped_lines(), 0);
    assert!(!t10.is_empty());

    let snap = snapshot();
    let pod = snap.meshed[0].pod.clone();
    let mut mesh = Mesh::new(MeshConfig::default());
    mesh.begin_cycle(&snap);
    mesh.record_page(&pod, 1_000_000, t0);
    mesh.end_cycle(1_000_000, 3.0);
    mesh.begin_cycle(&snap);
    mesh.record_page(&pod, 1_010_000, t10);
    mesh.end_cycle(1_010_000, 3.0);

    let stat = |kind: &str, name: &str| stat_row(&mesh, kind, name);

    let web = stat("svc", "web");
    let requests = delta(
        "response_total",
        &["direction=\"outbound\"", "dst_service=\"web\""],
    );
    assert!(requests > 100.0, "the demo sent traffic: {requests}");
    assert_eq!(web.source, "clients");
    assert_eq!(web.golden.requests as f64, requests);
    assert_eq!(web.golden.rps, requests / 10.0);
    close(web.golden.success_rate, 1.0);

    for backend in ["web-a", "web-b", "web-c"] {
        let row = stat("po", backend);
        let pod_label = format!("dst_pod=\"{backend}\"");
        let with = ["direction=\"outbound\"", pod_label.as_str()];
        assert_eq!(
            row.golden.requests as f64,
            delta("response_total", &with),
            "{backend}"
        );
        close(
            row.golden.p50_ms,
            quantile("response_latency_ms_bucket", &with, 0.5, 1.0),
        );
        close(
            row.golden.p99_ms,
            quantile("response_latency_ms_bucket", &with, 0.99, 1.0),
        );
    }

    // The client: its own inbound (none), and its edge to the service.
    let load = stat("deploy", "load");
    assert_eq!((load.source.as_str(), load.golden.requests), ("inbound", 0));
    let edges = mesh
        .edges("deploy", Some("demo"), 1010)
        .expect("edges")
        .edges;
    assert_eq!(edges.len(), 1, "{edges:?}");
    assert_eq!(edges[0].src.name, "load");
    assert_eq!(
        (edges[0].dst.kind.as_str(), edges[0].dst.name.as_str()),
        ("service", "web")
    );
    assert!(!edges[0].mtls);
    assert_eq!(
        edges[0].no_tls_reason, "disabled",
        "the demo runs without identity"
    );

    // The proxy's default route of Service web.
    let routes = mesh
        .routes(Some("svc/web"), Some("demo"), 1010)
        .expect("routes");
    assert_eq!(routes.rows.len(), 1);
    let route = &routes.rows[0];
    assert_eq!(route.route.kind, "default");
    assert_eq!(route.parent_port, Some(80));
    let route_labels = ["parent_name=\"web\""];
    assert_eq!(
        route.golden.requests as f64,
        delta("outbound_http_route_request_statuses_total", &route_labels)
    );
    let p99 = quantile(
        "outbound_http_route_request_duration_seconds_bucket",
        &route_labels,
        0.99,
        1000.0,
    );
    // Kept as f32 milliseconds.
    assert!((route.golden.p99_ms.expect("p99") - p99).abs() < 1e-3);

    // The JSON the dashboard gets.
    let json = serde_json::to_value(mesh.overview(1010)).expect("serializes");
    assert_eq!(json["collector"]["pods_ok"], 1);
    assert_eq!(json["namespaces"][0]["resource"]["name"], "demo");
}

fn target(pod: &str, workload: &str, ip: [u8; 4]) -> PodTarget {
    PodTarget {
        pod: ResourceRef {
            kind: "pod".into(),
            namespace: "demo".into(),
            name: pod.into(),
        },
        workload: Some(ResourceRef {
            kind: "deployment".into(),
            namespace: "demo".into(),
            name: workload.into(),
        }),
        ip: IpAddr::V4(Ipv4Addr::from(ip)),
        admin_port: 4191,
        tap_port: 4190,
        service_account: workload.into(),
    }
}

#[test]
fn two_linkerd2_proxies_pages_give_their_own_figures() {
    let (load, web) = (
        target("load-a", "load", [10, 77, 0, 60]),
        target("web-a", "web", [10, 77, 0, 50]),
    );
    let mut snap = Snapshot {
        meshed: vec![load.clone(), web.clone()],
        ..Snapshot::default()
    };
    for t in &snap.meshed.clone() {
        snap.pods_per_workload
            .insert(t.workload.clone().unwrap(), 1);
    }
    let page = |text: &str| {
        let p = parse(text.as_bytes(), &Limits::default(), Some(4191)).expect("parses");
        assert_eq!(p.skipped_lines(), 0);
        p
    };
    let mut mesh = Mesh::new(MeshConfig::default());
    for (at, load_page, web_page) in [
        (1000, L2P_LOAD_T0, L2P_WEB_T0),
        (1010, L2P_LOAD_T10, L2P_WEB_T10),
    ] {
        mesh.begin_cycle(&snap);
        mesh.record_page(&load.pod, at * 1000, page(load_page));
        mesh.record_page(&web.pod, at * 1000, page(web_page));
        mesh.end_cycle(at * 1000, 3.0);
    }
    let stat = |kind: &str, name: &str| stat_row(&mesh, kind, name);

    // The server's own inbound: the client's requests, not the scrapes of
    // its admin port, which linkerd2-proxy counts as inbound too.
    let web_pages = (L2P_WEB_T0, L2P_WEB_T10);
    let served = ["direction=\"inbound\"", "target_port=\"8080\""];
    let requests = delta_of(web_pages, "response_total", &served);
    let scrapes = delta_of(
        web_pages,
        "response_total",
        &["direction=\"inbound\"", "target_port=\"4191\""],
    );
    assert!(requests > 50.0 && scrapes > 0.0, "{requests} {scrapes}");
    let row = stat("deploy", "web");
    assert_eq!(row.source, "inbound");
    assert_eq!(row.golden.requests as f64, requests);
    close(row.golden.success_rate, 1.0);
    close(
        row.golden.p50_ms,
        quantile_of(web_pages, "response_latency_ms_bucket", &served, 0.5, 1.0),
    );
    close(
        row.golden.p99_ms,
        quantile_of(web_pages, "response_latency_ms_bucket", &served, 0.99, 1.0),
    );
    // The client serves nothing but its admin port.
    let row = stat("deploy", "load");
    assert_eq!((row.source.as_str(), row.golden.requests), ("inbound", 0));

    // What the client sent, by its outbound series, equals what the server
    // served; the edge is mutual TLS with both identities known.
    let sent = delta_of(
        (L2P_LOAD_T0, L2P_LOAD_T10),
        "response_total",
        &["direction=\"outbound\"", "dst_deployment=\"web\""],
    );
    assert_eq!(sent, requests);
    let edges = mesh
        .edges("deploy", Some("demo"), 1010)
        .expect("edges")
        .edges;
    assert_eq!(edges.len(), 1, "{edges:?}");
    let edge = &edges[0];
    assert_eq!(
        (edge.src.name.as_str(), edge.dst.name.as_str()),
        ("load", "web")
    );
    assert!(edge.mtls, "{edge:?}");
}
