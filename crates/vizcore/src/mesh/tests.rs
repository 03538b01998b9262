//! Cycles of synthetic pages, printed as our proxy prints its metrics.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::api::*;
use crate::expo::{parse, Limits};
use crate::targets::PodTarget;

const LATENCY_BUCKETS_MS: [f64; 25] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
    1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
];
const ROUTE_BUCKETS_S: [f64; 4] = [0.05, 0.5, 1.0, 10.0];

/// Linkerd's `authority` and `dst_*` labels, in our proxy's order.
fn dst(direction: &str, ns: &str, svc: &str, pod: &str, deploy: &str) -> String {
    let authority = if svc.is_empty() {
        String::new()
    } else {
        format!("{svc}.{ns}.svc.cluster.local:80")
    };
    format!(
        "direction=\"{direction}\",authority=\"{authority}\",dst_namespace=\"{ns}\",dst_service=\"{svc}\",\
         dst_pod=\"{pod}\",dst_deployment=\"{deploy}\",dst_statefulset=\"\",dst_daemonset=\"\",\
         dst_replicaset=\"\",dst_k8s_job=\"\",dst_serviceaccount=\"default\",dst_pod_template_hash=\"\""
    )
}

fn route_labels(ns: &str, svc: &str, kind: &str, name: &str) -> String {
    let route_ns = if kind == "default" { "" } else { ns };
    format!(
        "parent_group=\"core\",parent_kind=\"Service\",parent_namespace=\"{ns}\",parent_name=\"{svc}\",\
         parent_port=\"80\",parent_section_name=\"\",route_group=\"\",route_kind=\"{kind}\",\
         route_namespace=\"{route_ns}\",route_name=\"{name}\",hostname=\"{svc}.{ns}.svc.cluster.local\""
    )
}

/// One proxy's cumulative series, as it would export them.
#[derive(Clone, Debug, Default)]
struct Proxy {
    series: BTreeMap<String, f64>,
}

impl Proxy {
    fn inc(&mut self, series: String, n: f64) {
        *self.series.entry(series).or_default() += n;
    }

    /// `ok` and `failed` responses on `labels`, all taking `ms`.
    fn serve(&mut self, labels: &str, ok: u64, failed: u64, ms: f64) {
        if ok > 0 {
            self.inc(
                format!("response_total{{{labels},classification=\"success\",status_code=\"200\",grpc_status_code=\"\"}}"),
                ok as f64,
            );
        }
        if failed > 0 {
            self.inc(
                format!("response_total{{{labels},classification=\"failure\",status_code=\"503\",grpc_status_code=\"\"}}"),
                failed as f64,
            );
        }
        let n = (ok + failed) as f64;
        for le in LATENCY_BUCKETS_MS {
            let hit = if ms <= le { n } else { 0.0 };
            self.inc(
                format!("response_latency_ms_bucket{{le=\"{le:?}\",{labels}}}"),
                hit,
            );
        }
        self.inc(
            format!("response_latency_ms_bucket{{le=\"+Inf\",{labels}}}"),
            n,
        );
        self.inc(format!("response_latency_ms_count{{{labels}}}"), n);
        self.inc(format!("request_total{{{labels}}}"), n);
    }

    fn tcp(&mut self, peer: &str, labels: &str, tls: &str, opened: u64, open: i64) {
        self.inc(
            format!("tcp_open_total{{peer=\"{peer}\",{labels},{tls}}}"),
            opened as f64,
        );
        self.inc(
            format!("tcp_open_connections{{peer=\"{peer}\",{labels},{tls}}}"),
            open as f64,
        );
    }

    fn route(&mut self, labels: &str, ok: u64, failed: u64, secs: f64) {
        self.inc(
            format!("outbound_http_route_request_statuses_total{{{labels},http_status=\"200\",error=\"\"}}"),
            ok as f64,
        );
        self.inc(
            format!("outbound_http_route_request_statuses_total{{{labels},http_status=\"503\",error=\"\"}}"),
            failed as f64,
        );
        let n = (ok + failed) as f64;
        for le in ROUTE_BUCKETS_S {
            let hit = if secs <= le { n } else { 0.0 };
            self.inc(
                format!(
                    "outbound_http_route_request_duration_seconds_bucket{{le=\"{le:?}\",{labels}}}"
                ),
                hit,
            );
        }
        self.inc(
            format!("outbound_http_route_request_duration_seconds_bucket{{le=\"+Inf\",{labels}}}"),
            n,
        );
    }

    fn page(&self) -> Page {
        let mut text = String::from("# TYPE response counter\n");
        for (s, v) in &self.series {
            text.push_str(&format!("{s} {v}\n"));
        }
        text.push_str("# EOF\n");
        parse(text.as_bytes(), &Limits::default(), None).expect("a proxy's page parses")
    }
}

fn pod_ref(ns: &str, name: &str) -> ResourceRef {
    ResourceRef {
        kind: "pod".into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

fn deploy(ns: &str, name: &str) -> ResourceRef {
    ResourceRef {
        kind: "deployment".into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

fn target(ns: &str, name: &str, workload: Option<ResourceRef>, n: u8) -> PodTarget {
    PodTarget {
        pod: pod_ref(ns, name),
        workload,
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        admin_port: 4191,
        tap_port: 4190,
        service_account: "default".into(),
    }
}

const WEB_ID: &str = "default.demo.serviceaccount.identity.linkerd.cluster.local";
const NO_ID: &str = "tls=\"no_identity\",no_tls_reason=\"not_provided_by_service_discovery\"";

/// Namespace `demo`: `web` (meshed, pods web-1 and web-2) serves; `load`
/// (meshed, load-1) calls Service `web` (mTLS) and Service `backend`
/// (Deployment `backend`, two pods, no proxy: plaintext); `idle` (one pod,
/// no proxy) has no traffic.
struct Demo {
    mesh: Mesh,
    web1: Proxy,
    web2: Proxy,
    load: Proxy,
    snapshot: Snapshot,
    now: u64,
    /// load still calls backend.
    backend: bool,
    /// The TLS labels of load's connections to backend.
    backend_tls: String,
}

impl Demo {
    fn new(config: MeshConfig) -> Self {
        let mut pods_per_workload = HashMap::new();
        pods_per_workload.insert(deploy("demo", "web"), 2);
        pods_per_workload.insert(deploy("demo", "load"), 1);
        pods_per_workload.insert(deploy("demo", "backend"), 2);
        pods_per_workload.insert(deploy("demo", "idle"), 1);
        let snapshot = Snapshot {
            meshed: vec![
                target("demo", "load-1", Some(deploy("demo", "load")), 1),
                target("demo", "web-1", Some(deploy("demo", "web")), 2),
                target("demo", "web-2", Some(deploy("demo", "web")), 3),
            ],
            pods_per_workload,
        };
        Self {
            mesh: Mesh::new(config),
            web1: Proxy::default(),
            web2: Proxy::default(),
            load: Proxy::default(),
            snapshot,
            now: 1_000,
            backend: true,
            backend_tls: NO_ID.into(),
        }
    }

    /// One cycle's traffic: web-1 100 ok at 7 ms, web-2 50 ok and 50 failed
    /// at 15 ms; load's view of the same, and 30 calls to backend.
    fn traffic(&mut self) {
        let web1_in = dst("inbound", "demo", "", "web-1", "web");
        let web2_in = dst("inbound", "demo", "", "web-2", "web");
        self.web1.serve(&web1_in, 100, 0, 7.0);
        self.web2.serve(&web2_in, 50, 50, 15.0);
        let in_tls =
            "tls=\"true\",client_id=\"default.demo.serviceaccount.identity.linkerd.cluster.local\"";
        self.web1.tcp("src", &web1_in, in_tls, 1, 0);
        self.web1.series.insert(
            format!("tcp_open_connections{{peer=\"src\",{web1_in},{in_tls}}}"),
            3.0,
        );

        let to_web1 = dst("outbound", "demo", "web", "web-1", "web");
        let to_web2 = dst("outbound", "demo", "web", "web-2", "web");
        let to_backend = dst("outbound", "demo", "backend", "backend-x", "backend");
        self.load.serve(&to_web1, 100, 0, 7.0);
        self.load.serve(&to_web2, 50, 50, 15.0);
        let tls = format!("tls=\"true\",server_id=\"{WEB_ID}\"");
        self.load.tcp("dst", &to_web1, &tls, 1, 0);
        self.load.tcp("dst", &to_web2, &tls, 1, 0);
        self.load.route(
            &route_labels("demo", "web", "HTTPRoute", "web-route"),
            160,
            40,
            0.02,
        );
        if self.backend {
            self.load.serve(&to_backend, 30, 0, 40.0);
            let tls = self.backend_tls.clone();
            self.load.tcp("dst", &to_backend, &tls, 1, 0);
            self.load.route(
                &route_labels("demo", "backend", "default", "http"),
                30,
                0,
                0.04,
            );
        }
    }

    /// A cycle: traffic, every pod's page (but those in `failing`), end.
    fn cycle(&mut self, failing: &[&str]) {
        self.traffic();
        self.mesh.begin_cycle(&self.snapshot);
        self.now += 10;
        for (name, proxy) in [
            ("load-1", &self.load),
            ("web-1", &self.web1),
            ("web-2", &self.web2),
        ] {
            let pod = pod_ref("demo", name);
            if failing.contains(&name) {
                self.mesh.record_failure(
                    &pod,
                    self.now * 1000,
                    "connect: connection refused".into(),
                    Some(20),
                );
            } else {
                self.mesh.record_page(&pod, self.now * 1000, proxy.page());
            }
        }
        self.mesh.end_cycle(self.now * 1000, 12.5);
    }

    fn stat(&self, kind: &str, name: &str) -> StatRow {
        let q = StatQuery {
            kind: kind.into(),
            namespace: Some("demo".into()),
            name: Some(name.into()),
            window_secs: None,
        };
        let mut rows = self.mesh.stat(&q, self.now).expect("stat").rows;
        assert_eq!(rows.len(), 1, "{kind}/{name}: {rows:?}");
        rows.remove(0)
    }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-6)
}

#[test]
fn cycles_give_rps_success_rate_and_quantiles() {
    let mut demo = Demo::new(MeshConfig::default());
    // The first page of each pod is its baseline: nothing to show yet.
    demo.cycle(&[]);
    let web = demo.stat("deploy", "web");
    assert_eq!(web.golden.requests, 0);
    assert_eq!(web.golden.success_rate, None);
    demo.cycle(&[]);
    demo.cycle(&[]);

    let web = demo.stat("deploy", "web");
    assert_eq!(web.source, "inbound");
    assert_eq!(
        (web.meshed_pods, web.total_pods, web.unreachable_pods),
        (2, 2, 0)
    );
    assert_eq!(web.golden.requests, 400);
    assert_eq!(web.golden.successes, 300);
    assert!(close(web.golden.success_rate, 0.75));
    // Two cycles of 10 s counted.
    assert!((web.golden.rps - 20.0).abs() < 1e-9, "{:?}", web.golden);
    // 200 in (5,10] ms and 200 in (10,20] ms.
    assert!(close(web.golden.p50_ms, 10.0), "{:?}", web.golden);
    assert!(close(web.golden.p95_ms, 19.0), "{:?}", web.golden);
    assert!(close(web.golden.p99_ms, 19.8), "{:?}", web.golden);
    assert_eq!(web.tcp_connections, Some(3));

    let web1 = demo.stat("po", "web-1");
    assert_eq!(web1.golden.requests, 200);
    assert!(close(web1.golden.success_rate, 1.0));
    assert!(close(web1.golden.p50_ms, 7.5), "{:?}", web1.golden);

    // The namespace: its meshed pods' inbound.
    let ns = demo.stat("ns", "demo");
    assert_eq!(ns.source, "inbound");
    assert_eq!(ns.golden.requests, 400);
    assert_eq!((ns.meshed_pods, ns.total_pods), (3, 6));

    // The sparkline: one point per cycle, the first a zero (baseline).
    assert_eq!(web.spark.t, vec![1010, 1020, 1030]);
    assert_eq!(web.spark.rps, vec![0.0, 20.0, 20.0]);
    assert_eq!(web.spark.success_rate, vec![None, Some(0.75), Some(0.75)]);
    assert!(web.spark.p99_ms[2].is_some_and(|p| (p - 19.8).abs() < 1e-3));

    // A 10 s window is the last cycle only.
    let q = StatQuery {
        kind: "deployment".into(),
        namespace: None,
        name: Some("web".into()),
        window_secs: Some(10),
    };
    let r = demo.mesh.stat(&q, demo.now).expect("stat");
    assert_eq!(r.window_secs, 10);
    assert_eq!(r.rows[0].golden.requests, 200);
}

#[test]
fn a_counter_that_goes_down_was_reset_and_counts_from_zero() {
    let mut demo = Demo::new(MeshConfig::default());
    demo.cycle(&[]);
    demo.cycle(&[]);
    // web-1's proxy restarts: its counters start over with this cycle's.
    demo.web1 = Proxy::default();
    demo.cycle(&[]);
    let q = StatQuery {
        kind: "pod".into(),
        namespace: Some("demo".into()),
        name: Some("web-1".into()),
        window_secs: Some(10),
    };
    let row = demo.mesh.stat(&q, demo.now).expect("stat").rows.remove(0);
    assert_eq!(row.golden.requests, 100, "{:?}", row.golden);
    assert!(close(row.golden.p50_ms, 7.5));
}

#[test]
fn rows_come_from_inbound_then_clients_then_nothing() {
    let mut demo = Demo::new(MeshConfig::default());
    for _ in 0..3 {
        demo.cycle(&[]);
    }
    let load = demo.stat("deploy", "load");
    assert_eq!(load.source, "inbound");
    assert_eq!(load.golden.requests, 0);
    assert_eq!(load.golden.p99_ms, None);

    // No proxy: what load saw calling it.
    let backend = demo.stat("deploy", "backend");
    assert_eq!(backend.source, "clients");
    assert_eq!((backend.meshed_pods, backend.total_pods), (0, 2));
    assert_eq!(backend.golden.requests, 60);
    assert!(close(backend.golden.p50_ms, 35.0), "{:?}", backend.golden);
    assert_eq!(backend.tcp_connections, None);
    let unmeshed_pod = demo.stat("pod", "backend-x");
    assert_eq!(unmeshed_pod.source, "clients");
    assert_eq!((unmeshed_pod.meshed_pods, unmeshed_pod.total_pods), (0, 1));

    let idle = demo.stat("deploy", "idle");
    assert_eq!(idle.source, "none");
    assert_eq!((idle.meshed_pods, idle.total_pods), (0, 1));
    assert_eq!(idle.golden, Golden::default());
    assert_eq!(idle.spark.t.len(), 3);

    // A service is always its clients' view.
    let svc = demo.stat("svc", "web");
    assert_eq!(svc.source, "clients");
    assert_eq!(svc.golden.requests, 400);
    assert!(close(svc.golden.success_rate, 0.75));
}

#[test]
fn unreachable_pods_are_shown_and_their_workload_falls_back_to_clients() {
    let mut demo = Demo::new(MeshConfig::default());
    demo.cycle(&[]);
    demo.cycle(&[]);
    demo.cycle(&["web-2"]);
    let web = demo.stat("deploy", "web");
    assert_eq!(web.unreachable_pods, 1);
    assert_eq!(web.source, "inbound");
    let pods = demo.mesh.pods(Some("demo"), demo.now).pods;
    let web2 = pods.iter().find(|p| p.pod.name == "web-2").expect("web-2");
    assert_eq!(web2.state, "unreachable");
    assert_eq!(
        web2.last_error.as_deref(),
        Some("connect: connection refused")
    );
    assert_eq!(web2.consecutive_failures, 1);
    assert_eq!(web2.next_attempt_in_secs, Some(20));
    // Counted down, as the collector waits.
    let later = demo.mesh.pods(Some("demo"), demo.now + 5).pods;
    assert_eq!(later[2].next_attempt_in_secs, Some(15));
    assert_eq!(web2.addr, "10.0.0.3:4191");
    assert_eq!(web2.workload, Some(deploy("demo", "web")));
    let web1 = pods.iter().find(|p| p.pod.name == "web-1").expect("web-1");
    assert_eq!(web1.state, "ok");
    assert_eq!(web1.last_scrape_at, Some(demo.now));

    demo.cycle(&["web-1", "web-2"]);
    let web = demo.stat("deploy", "web");
    assert_eq!(web.unreachable_pods, 2);
    assert_eq!(web.source, "clients");
    assert_eq!(web.golden.requests, 3 * 200);
    let overview = demo.mesh.overview(demo.now);
    assert_eq!(overview.collector.pods_unreachable, 2);
    assert_eq!(overview.collector.pods_ok, 1);
    assert_eq!(overview.collector.last_cycle_ms, Some(12.5));
    assert_eq!(overview.namespaces.len(), 1);

    // Back: its deltas cover the cycle it missed too.
    demo.cycle(&[]);
    let web1 = demo.stat("po", "web-1");
    assert_eq!(web1.source, "inbound");
    assert_eq!(web1.unreachable_pods, 0);
    assert_eq!(web1.spark.rps.last(), Some(&20.0));
}

#[test]
fn edges_carry_traffic_and_mtls() {
    let mut demo = Demo::new(MeshConfig::default());
    for _ in 0..3 {
        demo.cycle(&[]);
    }
    let edges = demo
        .mesh
        .edges("deploy", Some("demo"), demo.now)
        .expect("edges");
    let names: Vec<(String, String)> = edges
        .edges
        .iter()
        .map(|e| (e.src.name.clone(), e.dst.name.clone()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("load".into(), "backend".into()),
            ("load".into(), "web".into())
        ]
    );
    let backend = &edges.edges[0];
    assert!(!backend.mtls);
    assert_eq!(
        backend.no_tls_reason,
        "no_identity: not_provided_by_service_discovery"
    );
    assert_eq!(backend.server_id, None);
    let web = &edges.edges[1];
    assert!(web.mtls);
    assert_eq!(web.no_tls_reason, "");
    assert_eq!(web.server_id.as_deref(), Some(WEB_ID));
    assert_eq!(web.golden.requests, 400);
    assert!(close(web.golden.success_rate, 0.75));
    assert!(web.golden.p50_ms.is_some());

    let pods = demo.mesh.edges("po", None, demo.now).expect("edges");
    let to_web1 = pods
        .edges
        .iter()
        .find(|e| e.dst.name == "web-1")
        .expect("load-1 -> web-1");
    assert_eq!(to_web1.src, pod_ref("demo", "load-1"));
    assert_eq!(to_web1.golden.requests, 200);
    assert!(to_web1.mtls);

    let ns = demo.mesh.edges("ns", None, demo.now).expect("edges");
    assert_eq!(ns.edges.len(), 1);
    assert!(!ns.edges[0].mtls, "one of demo's edges is plaintext");
    assert_eq!(ns.edges[0].golden.requests, 460);

    assert!(matches!(
        demo.mesh.edges("bogus", None, demo.now),
        Err(QueryError::UnknownKind(_))
    ));
}

#[test]
fn an_edge_that_turned_mtls_is_mtls_once_the_window_has_only_mtls() {
    let mut demo = Demo::new(MeshConfig::default());
    demo.cycle(&[]);
    demo.cycle(&[]);
    let edge = |demo: &Demo| {
        demo.mesh
            .edges("deploy", None, demo.now)
            .expect("edges")
            .edges
            .into_iter()
            .find(|e| e.dst.name == "backend")
            .expect("edge")
    };
    assert!(!edge(&demo).mtls);
    // From now on, backend's connections are mTLS; the window (6 cycles)
    // still holds plaintext ones for a while.
    demo.backend_tls = "tls=\"true\",server_id=\"backend.demo\"".into();
    for i in 0..5 {
        demo.cycle(&[]);
        let e = edge(&demo);
        assert!(!e.mtls, "cycle {i}");
        assert_eq!(e.no_tls_reason, "mixed", "cycle {i}");
        assert_eq!(e.server_id.as_deref(), Some("backend.demo"));
    }
    demo.cycle(&[]);
    let e = edge(&demo);
    assert!(e.mtls, "{e:?}");
    assert_eq!(e.server_id.as_deref(), Some("backend.demo"));
}

#[test]
fn routes_by_parent_service() {
    let mut demo = Demo::new(MeshConfig::default());
    for _ in 0..3 {
        demo.cycle(&[]);
    }
    let all = demo.mesh.routes(None, None, demo.now).expect("routes");
    let names: Vec<(&str, &str, &str)> = all
        .rows
        .iter()
        .map(|r| {
            (
                r.parent.name.as_str(),
                r.route.kind.as_str(),
                r.route.name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("backend", "default", "http"),
            ("web", "HTTPRoute", "web-route")
        ]
    );
    let web = demo
        .mesh
        .routes(Some("svc/web"), Some("demo"), demo.now)
        .expect("routes");
    assert_eq!(web.rows.len(), 1);
    let row = &web.rows[0];
    assert_eq!(
        row.parent,
        ResourceRef {
            kind: "service".into(),
            namespace: "demo".into(),
            name: "web".into()
        }
    );
    assert_eq!(row.parent_port, Some(80));
    assert_eq!(row.route.namespace, "demo");
    assert_eq!(row.golden.requests, 400);
    assert!(close(row.golden.success_rate, 0.8));
    // Seconds into milliseconds: everything in (0, 50] ms.
    assert!(close(row.golden.p50_ms, 25.0), "{:?}", row.golden);
    assert_eq!(row.spark.t.len(), 3);

    assert_eq!(
        demo.mesh
            .routes(Some("service/web"), None, demo.now)
            .expect("routes")
            .rows
            .len(),
        1
    );
    assert!(demo
        .mesh
        .routes(Some("svc/nope"), None, demo.now)
        .expect("routes")
        .rows
        .is_empty());
    for bad in ["deploy/web", "web", "svc/"] {
        assert!(
            matches!(
                demo.mesh.routes(Some(bad), None, demo.now),
                Err(QueryError::BadTarget(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        demo.mesh.routes(Some("zz/web"), None, demo.now),
        Err(QueryError::UnknownKind(_))
    ));

    let rows = demo
        .mesh
        .stat(
            &StatQuery {
                kind: "rt".into(),
                ..StatQuery::default()
            },
            demo.now,
        )
        .expect("stat")
        .rows;
    let names: Vec<&str> = rows.iter().map(|r| r.resource.name.as_str()).collect();
    assert_eq!(names, vec!["[default]", "web-route"]);
}

#[test]
fn a_workloads_page_has_its_pods_peers_and_routes() {
    let mut demo = Demo::new(MeshConfig::default());
    for _ in 0..3 {
        demo.cycle(&[]);
    }
    let page = demo
        .mesh
        .workload(&deploy("demo", "web"), demo.now)
        .expect("web");
    assert_eq!(page.stat.resource, deploy("demo", "web"));
    let pods: Vec<&str> = page.pods.iter().map(|p| p.resource.name.as_str()).collect();
    assert_eq!(pods, vec!["web-1", "web-2"]);
    assert_eq!(page.inbound.len(), 1);
    assert_eq!(page.inbound[0].src.name, "load");
    assert!(page.outbound.is_empty());
    let routes: Vec<&str> = page.routes.iter().map(|r| r.route.name.as_str()).collect();
    assert_eq!(routes, vec!["web-route"]);

    let load = demo
        .mesh
        .workload(&deploy("demo", "load"), demo.now)
        .expect("load");
    assert_eq!(load.outbound.len(), 2);
    assert_eq!(load.routes.len(), 2, "the routes it calls");

    let alias = ResourceRef {
        kind: "deploy".into(),
        ..deploy("demo", "web")
    };
    assert!(demo.mesh.workload(&alias, demo.now).is_ok());
    assert!(matches!(
        demo.mesh.workload(&deploy("demo", "nope"), demo.now),
        Err(QueryError::NotFound(_))
    ));
    assert!(matches!(
        demo.mesh.stat(
            &StatQuery {
                kind: "deploy".into(),
                name: Some("nope".into()),
                ..StatQuery::default()
            },
            demo.now
        ),
        Err(QueryError::NotFound(_))
    ));
    assert!(matches!(
        demo.mesh.stat(
            &StatQuery {
                kind: "widgets".into(),
                ..StatQuery::default()
            },
            demo.now
        ),
        Err(QueryError::UnknownKind(_))
    ));
}

#[test]
fn history_is_bounded_and_the_unseen_is_forgotten() {
    let config = MeshConfig {
        history_points: 5,
        ..MeshConfig::default()
    };
    let mut demo = Demo::new(config);
    for _ in 0..8 {
        demo.cycle(&[]);
    }
    let web = demo.stat("deploy", "web");
    assert_eq!(web.spark.t.len(), 5);
    assert_eq!(web.spark.rps.len(), 5);
    assert_eq!(*web.spark.t.last().unwrap(), demo.now);
    let before = demo.mesh.heap_bytes();

    // backend goes away: no more calls (its series leave load's page, as
    // the proxy's retention drops them), no pods.
    demo.backend = false;
    demo.load.series.retain(|s, _| !s.contains("backend"));
    demo.snapshot
        .pods_per_workload
        .remove(&deploy("demo", "backend"));
    for _ in 0..4 {
        demo.cycle(&[]);
    }
    assert!(demo
        .mesh
        .stat(
            &StatQuery {
                kind: "deploy".into(),
                name: Some("backend".into()),
                ..StatQuery::default()
            },
            demo.now
        )
        .is_ok());
    demo.cycle(&[]);
    assert!(matches!(
        demo.mesh.stat(
            &StatQuery {
                kind: "deploy".into(),
                name: Some("backend".into()),
                ..StatQuery::default()
            },
            demo.now
        ),
        Err(QueryError::NotFound(_))
    ));
    let edges = demo
        .mesh
        .edges("deploy", None, demo.now)
        .expect("edges")
        .edges;
    assert!(edges.iter().all(|e| e.dst.name != "backend"), "{edges:?}");
    assert!(demo
        .mesh
        .routes(Some("svc/backend"), None, demo.now)
        .expect("routes")
        .rows
        .is_empty());
    assert!(
        demo.mesh.strings.find("backend-x").is_none(),
        "its strings went too"
    );
    assert!(
        demo.mesh.heap_bytes() < before,
        "{} < {before}",
        demo.mesh.heap_bytes()
    );

    // A pod gone from the snapshot is dropped at once (its row stays for
    // the history).
    demo.snapshot.meshed.retain(|t| t.pod.name != "web-2");
    demo.cycle(&[]);
    assert_eq!(demo.mesh.pods(None, demo.now).pods.len(), 2);
    assert_eq!(demo.stat("po", "web-2").meshed_pods, 0);
}

#[test]
fn pods_past_max_pods_are_listed_not_recorded() {
    let config = MeshConfig {
        max_pods: 2,
        ..MeshConfig::default()
    };
    let mut demo = Demo::new(config);
    demo.cycle(&[]);
    demo.cycle(&[]);
    let pods = demo.mesh.pods(None, demo.now).pods;
    let states: Vec<(&str, &str)> = pods
        .iter()
        .map(|p| (p.pod.name.as_str(), p.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![("load-1", "ok"), ("web-1", "ok"), ("web-2", "over_limit")]
    );
    assert!(pods[2]
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("--max-pods 2")));
    assert_eq!(demo.mesh.pods_over_limit(), 1);
    assert_eq!(demo.mesh.ignored_pages(), 2);
    assert_eq!(demo.mesh.overview(demo.now).collector.pods_known, 3);
    assert_eq!(demo.stat("deploy", "web").golden.requests, 100);
}

#[test]
fn pages_of_unknown_pods_are_ignored() {
    let mut mesh = Mesh::new(MeshConfig::default());
    mesh.begin_cycle(&Snapshot::default());
    let mut p = Proxy::default();
    p.serve(&dst("inbound", "x", "", "y", ""), 1, 0, 1.0);
    mesh.record_page(&pod_ref("x", "y"), 1000, p.page());
    mesh.record_failure(&pod_ref("x", "y"), 1000, "nope".into(), None);
    mesh.end_cycle(1000, 1.0);
    assert_eq!(mesh.ignored_pages(), 1);
    assert!(mesh.pods(None, 1).pods.is_empty());
    assert!(mesh
        .stat(
            &StatQuery {
                kind: "pod".into(),
                ..StatQuery::default()
            },
            1
        )
        .expect("stat")
        .rows
        .is_empty());
}

/// A mesh of `n` meshed pods in deployments of 4, each serving inbound and
/// calling two services of two pods each (4 destinations), through
/// `cycles` cycles.
fn mesh_of(n: usize, cycles: usize) -> Mesh {
    let mut mesh = Mesh::new(MeshConfig::default());
    let deployments = n.div_ceil(4);
    let mut snapshot = Snapshot::default();
    let mut proxies = Vec::new();
    for i in 0..n {
        let d = format!("app-{}", i / 4);
        let w = deploy("bench", &d);
        *snapshot.pods_per_workload.entry(w.clone()).or_default() += 1;
        let name = format!("{d}-{}", i % 4);
        let mut t = target("bench", &name, Some(w), (i % 250) as u8);
        t.admin_port = 4191;
        snapshot.meshed.push(t);
        proxies.push((name, d, Proxy::default()));
    }
    snapshot.meshed.sort_by(|a, b| a.pod.cmp(&b.pod));
    for c in 0..cycles {
        mesh.begin_cycle(&snapshot);
        for (i, (name, d, proxy)) in proxies.iter_mut().enumerate() {
            proxy.serve(
                &dst("inbound", "bench", "", name, d),
                20,
                1,
                3.0 + (c % 5) as f64,
            );
            let tls = format!("tls=\"true\",server_id=\"{d}.bench\"");
            for k in 1..=2 {
                let callee = format!("app-{}", (i / 4 + k) % deployments);
                for p in 0..2 {
                    let to = dst(
                        "outbound",
                        "bench",
                        &callee,
                        &format!("{callee}-{p}"),
                        &callee,
                    );
                    proxy.serve(&to, 10, 0, 4.0 + (p + c % 3) as f64 * 10.0);
                    proxy.tcp("dst", &to, &tls, u64::from(c % 4 == 0), 0);
                }
                proxy.route(
                    &route_labels("bench", &callee, "default", "http"),
                    20,
                    0,
                    0.01,
                );
            }
            mesh.record_page(&pod_ref("bench", name), c as u64 * 10_000, proxy.page());
        }
        mesh.end_cycle(c as u64 * 10_000, 1.0);
    }
    mesh
}

/// Where the bytes are, for the record.
fn breakdown(m: &Mesh) -> String {
    let tracks: usize = m.resources.values().map(Resource::heap_bytes).sum();
    let last: usize = m.pods.values().map(PodState::heap_bytes).sum();
    let edges: usize = m.edges.values().map(|e| e.track.heap_bytes()).sum();
    let pod_edges: usize = m.pod_edges.values().map(|e| e.track.heap_bytes()).sum();
    format!(
        "resources {} (tracks {tracks} B), pods {} (last values {last} B), edges {} ({edges} B), \
         pod edges {} ({pod_edges} B), routes {}, strings {} B",
        m.resources.len(),
        m.pods.len(),
        m.edges.len(),
        m.pod_edges.len(),
        m.routes.len(),
        m.strings.heap_bytes(),
    )
}

#[test]
fn memory_grows_with_pods_and_stays_bounded_per_pod() {
    // Rings grow with what they hold: past the history (the longest
    // ring), the state has its full size.
    let history = MeshConfig::default().history_points;
    let cycles = history + 5;
    let small = mesh_of(16, cycles);
    let big = mesh_of(32, cycles);
    let (a, b) = (small.heap_bytes(), big.heap_bytes());
    let per_pod = (b - a) / 16;
    eprintln!(
        "heap: 16 pods {a} B, 32 pods {b} B: {per_pod} B per pod at {history} points\n  {}\n  {}",
        breakdown(&small),
        breakdown(&big)
    );
    assert!(b > a);
    assert!(per_pod <= 8 * 1024, "{per_pod} B per pod");
    // More cycles do not grow it.
    let longer = mesh_of(16, cycles + 20);
    let c = longer.heap_bytes();
    assert!(c <= a + a / 20, "{c} vs {a} after 20 more cycles");
    // And the figures are right: 20+1 responses per pod per cycle.
    let row = longer
        .stat(
            &StatQuery {
                kind: "ns".into(),
                ..StatQuery::default()
            },
            0,
        )
        .expect("stat")
        .rows
        .remove(0);
    assert_eq!(row.golden.requests, 16 * 21 * 6);
    assert_eq!(row.spark.t.len(), history);
}

#[test]
fn a_namespace_whose_meshed_pods_serve_nothing_shows_its_clients_view() {
    // Namespace `solo`: only `client` is meshed, and it calls pods without a
    // proxy in its own namespace (the demo's shape).
    let mut pods_per_workload = HashMap::new();
    pods_per_workload.insert(deploy("solo", "client"), 1);
    pods_per_workload.insert(deploy("solo", "server"), 1);
    let snapshot = Snapshot {
        meshed: vec![target(
            "solo",
            "client-1",
            Some(deploy("solo", "client")),
            9,
        )],
        pods_per_workload,
    };
    let mut mesh = Mesh::new(MeshConfig::default());
    let mut client = Proxy::default();
    let mut now = 1_000;
    for _ in 0..3 {
        client.serve(
            &dst("outbound", "solo", "server", "server-1", "server"),
            50,
            0,
            3.0,
        );
        mesh.begin_cycle(&snapshot);
        mesh.record_page(&pod_ref("solo", "client-1"), now * 1000, client.page());
        mesh.end_cycle(now * 1000, 1.0);
        now += 10;
    }
    let q = StatQuery {
        kind: "ns".into(),
        name: Some("solo".into()),
        ..StatQuery::default()
    };
    let ns = mesh.stat(&q, now).expect("stat").rows.remove(0);
    assert_eq!(ns.source, "clients");
    assert_eq!(ns.golden.requests, 100, "{:?}", ns.golden);
    assert_eq!(ns.tcp_connections, None);
    // The meshed client itself still shows its own (empty) inbound side.
    let q = StatQuery {
        kind: "deploy".into(),
        name: Some("client".into()),
        ..StatQuery::default()
    };
    let client_row = mesh.stat(&q, now).expect("stat").rows.remove(0);
    assert_eq!(client_row.source, "inbound");
    assert_eq!(client_row.golden.requests, 0);
}

#[test]
fn a_pod_that_hangs_moves_no_other_pods_rates() {
    // `client-1` sends a steady 40 rps; `stuck-1` hangs on /metrics: when
    // it is tried, its scrape fails at the 5 s timeout and the cycle ends
    // then; on its back-off (every other cycle here) the cycle ends at once.
    // Stamped by when it ended, a cycle covered 5, 10 or 15 s and the
    // steady 40 rps read as 80, 40 or 26.7; stamped by when its pages were
    // read (50 ms after each 10 s tick), every cycle reads 40.
    let mut pods_per_workload = HashMap::new();
    pods_per_workload.insert(deploy("solo", "client"), 1);
    pods_per_workload.insert(deploy("solo", "stuck"), 1);
    let snapshot = Snapshot {
        meshed: vec![
            target("solo", "client-1", Some(deploy("solo", "client")), 9),
            target("solo", "stuck-1", Some(deploy("solo", "stuck")), 10),
        ],
        pods_per_workload,
    };
    let mut mesh = Mesh::new(MeshConfig::default());
    let mut client = Proxy::default();
    let labels = dst("inbound", "solo", "", "", "");
    for cycle in 0..12u64 {
        let tick_ms = 1_000_000 + cycle * 10_000;
        client.serve(&labels, 400, 0, 3.0);
        mesh.begin_cycle(&snapshot);
        mesh.record_page(&pod_ref("solo", "client-1"), tick_ms + 50, client.page());
        let ended = if cycle % 2 == 0 {
            mesh.record_failure(
                &pod_ref("solo", "stuck-1"),
                tick_ms + 5_000,
                "timed out".into(),
                Some(10),
            );
            tick_ms + 5_000
        } else {
            tick_ms + 60
        };
        mesh.end_cycle(ended, 5_000.0);
    }
    let q = StatQuery {
        kind: "deploy".into(),
        namespace: Some("solo".into()),
        name: Some("client".into()),
        ..StatQuery::default()
    };
    let row = mesh.stat(&q, 1_120).expect("stat").rows.remove(0);
    let rps = &row.spark.rps;
    // The first point is the baseline page's (nothing counted).
    for (i, r) in rps.iter().enumerate().skip(1) {
        assert!(
            (r - 40.0).abs() < 1e-9,
            "point {i}: {r} rps, not 40: {rps:?}"
        );
    }
    assert!(
        (row.golden.rps - 40.0).abs() < 1e-9,
        "window: {:?}",
        row.golden
    );
    assert_eq!(row.unreachable_pods, 0, "{row:?}");
}

/// Bytes that were never written as last values read as some values: no
/// panic, no loop past the bytes.
#[test]
fn last_values_of_any_bytes_read_without_a_panic() {
    let mut inputs: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0xFF; 64],
        // A huge count of counters, then a counter cut short.
        [vec![0xFF; 9], vec![0x01], vec![7; 5]].concat(),
        // A bucket series claiming 2^64 buckets, then one.
        [vec![0], vec![9; 8], vec![0xFF; 9], vec![0x01], vec![3, 2]].concat(),
        // A value flagged f64 without its 8 bytes.
        [vec![1], vec![9; 8], vec![1, 0, 0]].concat(),
    ];
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for len in [1, 9, 10, 30, 300] {
        for _ in 0..300 {
            inputs.push(
                (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (seed >> 24) as u8
                    })
                    .collect(),
            );
        }
    }
    for bytes in inputs {
        let most = bytes.len();
        let last = LastValues(bytes.into_boxed_slice());
        let (counters, buckets) = last.read();
        // Each value takes a byte at least.
        assert!(counters.count() + buckets.count() <= most);
        assert!(last.len() <= most);
    }
}

#[test]
fn last_values_read_back_exactly_in_few_bytes() {
    let values = [
        0.0,
        1.0,
        127.0,
        128.0,
        12_345.0,
        4_294_967_296.0,
        9_007_199_254_740_993.0,
        (1u64 << 63) as f64,
        f64::MAX,
        0.5,
        1e-9,
        123_456.75,
    ];
    let counters: Vec<Last> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Last {
            id: (i as u64) << 60 | 0xABCD,
            value: *v,
        })
        .collect();
    let buckets: Vec<LastBucket> = values
        .iter()
        .enumerate()
        .map(|(i, v)| LastBucket {
            series: (i as u64 / 5) << 50,
            le: (i % 5 * 100) as u16,
            value: *v,
        })
        .collect();
    let last = LastValues::build(&counters, &buckets);
    let (c, b) = last.read();
    let (c, b): (Vec<Last>, Vec<LastBucket>) = (c.collect(), b.collect());
    assert_eq!(c.len(), counters.len());
    for (a, b) in counters.iter().zip(&c) {
        assert_eq!(a.id, b.id);
        assert_eq!(a.value.to_bits(), b.value.to_bits(), "{}", a.value);
    }
    assert_eq!(b.len(), buckets.len());
    for (x, y) in buckets.iter().zip(&b) {
        assert_eq!((x.series, x.le), (y.series, y.le));
        assert_eq!(x.value.to_bits(), y.value.to_bits(), "{}", x.value);
    }
    assert_eq!(last.len(), 24);
    // Whole counters: 8 bytes of id and a varint; buckets: a few bytes
    // each past their series'.
    let counters: Vec<Last> = (0..100u64)
        .map(|i| Last {
            id: i,
            value: (1_000 + i * 1_000) as f64,
        })
        .collect();
    let buckets: Vec<LastBucket> = (0..100u64)
        .map(|i| LastBucket {
            series: i / 25,
            le: (i % 25) as u16,
            value: (100 + i) as f64,
        })
        .collect();
    let last = LastValues::build(&counters, &buckets);
    assert!(
        last.heap_bytes() <= 100 * 11 + 4 * 9 + 100 * 3 + 2,
        "{}",
        last.heap_bytes()
    );
    assert_eq!(LastValues::default().len(), 0);
    // In place when the size is the same.
    let mut same = LastValues::build(&counters, &buckets);
    let at = same.0.as_ptr();
    let more: Vec<Last> = counters
        .iter()
        .map(|l| Last {
            value: l.value + 1.0,
            ..*l
        })
        .collect();
    same.set(&more, &buckets);
    assert_eq!(same.0.as_ptr(), at);
    assert_eq!(same.read().0.next().map(|l| l.value), Some(1_001.0));
}

#[test]
fn a_bucket_counts_its_delta_whatever_else_comes_and_goes() {
    // Buckets of one series, then a bucket more (a new `le`), one gone,
    // and a reset: each bucket's delta is its own.
    let mut demo = Demo::new(MeshConfig::default());
    let labels = dst("inbound", "demo", "", "web-1", "web");
    let mut proxy = Proxy::default();
    let snapshot = demo.snapshot.clone();
    let mut counts = Vec::new();
    for (cycle, les) in [
        vec![(1.0, 10.0), (5.0, 20.0)],
        vec![(1.0, 13.0), (5.0, 25.0)],
        vec![(1.0, 15.0), (2.0, 17.0), (5.0, 30.0)],
        vec![(1.0, 16.0), (5.0, 33.0)],
        vec![(1.0, 2.0), (5.0, 3.0)],
    ]
    .into_iter()
    .enumerate()
    {
        proxy
            .series
            .retain(|k, _| !k.starts_with("response_latency_ms_bucket"));
        for (le, n) in &les {
            proxy.series.insert(
                format!("response_latency_ms_bucket{{le=\"{le:?}\",{labels}}}"),
                *n,
            );
        }
        proxy.series.insert(
            format!("response_latency_ms_bucket{{le=\"+Inf\",{labels}}}"),
            les.last().unwrap().1,
        );
        demo.mesh.begin_cycle(&snapshot);
        demo.mesh.record_page(
            &pod_ref("demo", "web-1"),
            (cycle as u64 + 1) * 10_000,
            proxy.page(),
        );
        demo.mesh.end_cycle((cycle as u64 + 1) * 10_000, 1.0);
        let key = demo
            .mesh
            .strings
            .find_key_of("pod", "demo", "web-1")
            .expect("web-1");
        let mut w = track::Window::default();
        if let Some(t) = &demo.mesh.resources[&key].inbound {
            t.add_window(1, &mut w, &demo.mesh.bounds);
        }
        let mut b: Vec<(f32, u64)> = w.buckets.iter().map(|b| (b.1, b.2)).collect();
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        counts.push(b);
    }
    // Cycle 1 is the baseline. A bucket is a counter of its own, named by
    // its series and `le`: what is in it is the cumulative buckets'
    // difference, its delta the change of that.
    assert_eq!(counts[0], []);
    assert_eq!(counts[1], [(1.0, 3), (5.0, 2)]);
    // (1, 2] is new: all of its 17 - 15 = 2 counts; `le` 5 now holds
    // 30 - 17 = 13 against 25 - 13 = 12 before.
    assert_eq!(counts[2], [(1.0, 2), (2.0, 2), (5.0, 1)]);
    // `le` 2 gone: `le` 5 holds 33 - 16 = 17 against its 13.
    assert_eq!(counts[3], [(1.0, 1), (5.0, 4)]);
    // A reset: what the counters say now is new.
    assert_eq!(counts[4], [(1.0, 2), (5.0, 1)]);
}

#[test]
fn pods_are_found_by_namespace_and_name_and_keep_their_state_across_cycles() {
    let mut mesh = Mesh::new(MeshConfig::default());
    let names = ["web-2", "web-1", "api-1"];
    let snapshot = |names: &[&str]| Snapshot {
        meshed: names
            .iter()
            .enumerate()
            .map(|(i, n)| target("demo", n, None, i as u8 + 1))
            .collect(),
        ..Snapshot::default()
    };
    // Unsorted, as a test might give it: sorted here.
    mesh.begin_cycle(&snapshot(&names));
    let order: Vec<&str> = mesh.pods.iter().map(|(k, _)| &*k.name).collect();
    assert_eq!(order, ["api-1", "web-1", "web-2"]);
    mesh.record_failure(&pod_ref("demo", "web-1"), 5_000, "refused".into(), Some(20));
    assert!(mesh.pod_index(&pod_ref("demo", "nope")).is_none());
    assert!(mesh.pod_index(&pod_ref("other", "web-1")).is_none());
    mesh.end_cycle(6_000, 1.0);
    // The next cycle keeps what is known of the pods still there.
    mesh.begin_cycle(&snapshot(&["web-1", "web-3"]));
    let pods = mesh.pods(None, 10).pods;
    let shown: Vec<(&str, &str, u32)> = pods
        .iter()
        .map(|p| {
            (
                p.pod.name.as_str(),
                p.state.as_str(),
                p.consecutive_failures,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("web-1", "unreachable", 1), ("web-3", "pending", 0)]
    );
    assert_eq!(pods[0].last_error.as_deref(), Some("refused"));
    assert_eq!(pods[0].last_scrape_at, Some(5));
    assert_eq!(pods[0].next_attempt_in_secs, Some(15));
    // Its address is the newest snapshot's.
    assert_eq!(pods[0].addr, "10.0.0.1:4191");
    assert_eq!(mesh.pods_recorded(), 2);
}
