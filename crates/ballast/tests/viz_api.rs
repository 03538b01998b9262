//! `ballast viz --manifests DIR` as a process: meshed pods whose proxies are
//! fakes serving `/metrics` pages whose counters advance by known amounts
//! and then stop, so that every figure of the JSON API is known exactly.

use ballast_testsupport as support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use support::{eventually, manifests::docs, proxy::Logged, write_atomic, DEADLINE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::Command;

/// Scrapes after the first that advance the fakes' counters; later pages
/// repeat the last, so the totals end at exactly STEPS × the per-step amounts.
const STEPS: u64 = 3;
/// Per step and web pod: inbound 15 successes and 5 failures (all under
/// 10 ms), outbound 10 successes to api over its HTTPRoute.
const IN_OK: u64 = 15;
const IN_FAIL: u64 = 5;
const OUT: u64 = 10;
const OPEN_INBOUND: u64 = 3;
const API_ID: &str = "default.shop.serviceaccount.identity.linkerd.cluster.local";

/// One fake proxy admin server; counts the scrapes it answered.
struct FakeProxy {
    addr: SocketAddr,
    scrapes: Arc<AtomicU64>,
}

fn page(step: u64) -> String {
    let inbound = |class: &str, code: &str, n: u64| {
        format!("response_total{{direction=\"inbound\",authority=\"web.shop.svc.cluster.local:8080\",target_addr=\"127.0.0.1:8080\",tls=\"true\",client_id=\"default.shop.serviceaccount.identity.linkerd.cluster.local\",status_code=\"{code}\",classification=\"{class}\"}} {n}\n")
    };
    let dst = "dst_control_plane_ns=\"linkerd\",dst_deployment=\"api\",dst_namespace=\"shop\",dst_pod=\"api-1\",dst_pod_template_hash=\"7c9d\",dst_service=\"api\",dst_serviceaccount=\"default\"";
    let route = "parent_group=\"core\",parent_kind=\"Service\",parent_namespace=\"shop\",parent_name=\"api\",parent_port=\"80\",parent_section_name=\"\",route_group=\"gateway.networking.k8s.io\",route_kind=\"HTTPRoute\",route_namespace=\"shop\",route_name=\"api-route\",hostname=\"api.shop.svc.cluster.local\"";
    let (ok, fail, out) = (IN_OK * step, IN_FAIL * step, OUT * step);
    let mut p = String::new();
    p.push_str("# HELP request_total Requests.\n# TYPE request_total counter\n");
    p.push_str(&format!(
        "request_total{{direction=\"inbound\"}} {}\n",
        ok + fail
    ));
    p.push_str("# HELP response_total Responses.\n# TYPE response_total counter\n");
    p.push_str(&inbound("success", "200", ok));
    p.push_str(&inbound("failure", "500", fail));
    p.push_str(&format!("response_total{{direction=\"outbound\",authority=\"api.shop.svc.cluster.local:80\",target_addr=\"127.0.5.4:8080\",tls=\"true\",server_id=\"{API_ID}\",{dst},status_code=\"200\",classification=\"success\"}} {out}\n"));
    p.push_str("# HELP response_latency_ms Latency.\n# TYPE response_latency_ms histogram\n");
    for (le, n) in [("5", 0), ("10", ok + fail), ("+Inf", ok + fail)] {
        p.push_str(&format!("response_latency_ms_bucket{{direction=\"inbound\",status_code=\"200\",le=\"{le}\"}} {n}\n"));
    }
    p.push_str(&format!(
        "response_latency_ms_sum{{direction=\"inbound\",status_code=\"200\"}} {}\n",
        8 * (ok + fail)
    ));
    p.push_str(&format!(
        "response_latency_ms_count{{direction=\"inbound\",status_code=\"200\"}} {}\n",
        ok + fail
    ));
    for (le, n) in [("20", 0), ("30", out), ("+Inf", out)] {
        p.push_str(&format!("response_latency_ms_bucket{{direction=\"outbound\",authority=\"api.shop.svc.cluster.local:80\",tls=\"true\",server_id=\"{API_ID}\",{dst},status_code=\"200\",le=\"{le}\"}} {n}\n"));
    }
    p.push_str("# HELP tcp_open_total Connections opened.\n# TYPE tcp_open_total counter\n");
    p.push_str(&format!("tcp_open_total{{direction=\"outbound\",peer=\"dst\",tls=\"true\",server_id=\"{API_ID}\",{dst}}} {step}\n"));
    p.push_str(&format!("tcp_open_total{{direction=\"inbound\",peer=\"src\",tls=\"true\",client_id=\"default.shop.serviceaccount.identity.linkerd.cluster.local\"}} {step}\n"));
    p.push_str(
        "# HELP tcp_open_connections Connections open.\n# TYPE tcp_open_connections gauge\n",
    );
    p.push_str(&format!("tcp_open_connections{{direction=\"inbound\",peer=\"src\",tls=\"true\",client_id=\"default.shop.serviceaccount.identity.linkerd.cluster.local\"}} {OPEN_INBOUND}\n"));
    p.push_str("# HELP outbound_http_route_request_statuses Statuses.\n# TYPE outbound_http_route_request_statuses counter\n");
    p.push_str(&format!("outbound_http_route_request_statuses_total{{{route},http_status=\"200\",error=\"\"}} {out}\n"));
    p.push_str("# HELP outbound_http_route_request_duration_seconds Durations.\n# TYPE outbound_http_route_request_duration_seconds histogram\n");
    for (le, n) in [("0.025", 0), ("0.05", out), ("+Inf", out)] {
        p.push_str(&format!(
            "outbound_http_route_request_duration_seconds_bucket{{{route},le=\"{le}\"}} {n}\n"
        ));
    }
    p.push_str("# HELP process_cpu_seconds CPU.\n# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 1.5\n# EOF\n");
    p
}

async fn fake_proxy(ip: &str) -> FakeProxy {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind a fake proxy");
    let addr = listener.local_addr().unwrap();
    let scrapes = Arc::new(AtomicU64::new(0));
    let count = scrapes.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if !head.starts_with(b"GET /metrics ") {
                    let _ = s
                        .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let n = count.fetch_add(1, Ordering::SeqCst);
                let body = page(n.min(STEPS));
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    FakeProxy { addr, scrapes }
}

fn pod(name: &str, deploy: &str, hash: &str, ip: &str, admin: Option<u16>) -> String {
    let proxy = match admin {
        Some(port) => format!(
            ", {{name: linkerd-proxy, ports: [{{name: linkerd-admin, containerPort: {port}}}, {{name: linkerd-tap, containerPort: 4190}}]}}"
        ),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: shop\n\
         \x20 labels: {{app: {deploy}, pod-template-hash: \"{hash}\"}}\n\
         \x20 ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: {deploy}-{hash}, uid: u-{deploy}, controller: true}}]\n\
         spec:\n  serviceAccountName: default\n  containers: [{{name: main, ports: [{{name: http, containerPort: 8080}}]}}{proxy}]\n\
         status: {{phase: Running, podIP: {ip}, hostIP: 127.99.0.1}}\n"
    )
}

struct Viz {
    process: Logged,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Viz {
    async fn start(dir: &std::path::Path) -> Viz {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ballast"));
        cmd.args(["viz", "--manifests"])
            .arg(dir)
            .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--scrape-interval", "2s", "--scrape-timeout", "1500ms"]);
        let mut process = Logged::spawn(cmd);
        let addr = process.listening("viz dashboard listening on ", 1).await[0];
        let admin = process.listening("admin listening on ", 1).await[0];
        Viz {
            process,
            addr,
            admin,
        }
    }

    /// GET on the dashboard port: status, head, body.
    async fn get(&self, path: &str) -> (u16, String, String) {
        request(self.addr, "GET", path).await
    }

    async fn json(&self, path: &str) -> Value {
        let (status, _, body) = self.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to viz");
    let req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut buf))
        .await
        .expect("answered in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn row<'a>(rows: &'a Value, kind: &str, name: &str) -> &'a Value {
    rows.as_array()
        .expect("rows")
        .iter()
        .find(|r| r["resource"]["kind"] == kind && r["resource"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in {rows}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_shows_what_the_proxies_counted() {
    let web1 = fake_proxy("127.0.5.1").await;
    let web2 = fake_proxy("127.0.5.2").await;
    let closed = {
        let l = TcpListener::bind("127.0.5.3:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let objects = vec![
        pod("web-1", "web", "5d8f7", "127.0.5.1", Some(web1.addr.port())),
        pod("web-2", "web", "5d8f7", "127.0.5.2", Some(web2.addr.port())),
        pod("down-1", "down", "4b2a1", "127.0.5.3", Some(closed)),
        pod("api-1", "api", "7c9d", "127.0.5.4", None),
        support::manifests::service("shop", "web", "127.0.6.1", 80, 8080),
        support::manifests::service("shop", "api", "127.0.6.2", 80, 8080),
    ];
    write_atomic(&dir.path().join("shop.yaml"), &docs(&objects));
    let mut viz = Viz::start(dir.path()).await;

    eventually("/ready after the first cycle", || async {
        (viz.get("/ready").await.0 == 200).then_some(())
    })
    .await;
    // The fakes stop advancing after STEPS + 1 scrapes; then every figure
    // of a 60 s window (30 cycles of 2 s: all of them) is final.
    let final_requests = 2 * (IN_OK + IN_FAIL) * STEPS;
    let stat = eventually("web's final count", || async {
        let stat = viz
            .json("/api/stat?kind=deploy&namespace=shop&window=60")
            .await;
        let done = web1.scrapes.load(Ordering::SeqCst) > STEPS + 1
            && web2.scrapes.load(Ordering::SeqCst) > STEPS + 1;
        let web = stat["rows"]
            .as_array()?
            .iter()
            .find(|r| r["resource"]["name"] == "web")?
            .clone();
        (done && web["golden"]["requests"] == final_requests).then_some(stat)
    })
    .await;
    assert_eq!(stat["kind"], "deployment");
    assert_eq!(stat["interval_secs"], 2);
    let web = row(&stat["rows"], "deployment", "web");
    assert_eq!(web["source"], "inbound");
    assert_eq!(web["meshed_pods"], 2);
    assert_eq!(web["total_pods"], 2);
    assert_eq!(web["unreachable_pods"], 0);
    assert_eq!(web["golden"]["successes"], 2 * IN_OK * STEPS);
    assert_eq!(web["golden"]["success_rate"], 0.75);
    let p50 = web["golden"]["p50_ms"].as_f64().expect("a p50");
    let p99 = web["golden"]["p99_ms"].as_f64().expect("a p99");
    assert!(
        5.0 < p50 && p50 <= 10.0 && 5.0 < p99 && p99 <= 10.0,
        "{web}"
    );
    assert_eq!(web["tcp_connections"], 2 * OPEN_INBOUND);
    // api has no proxy: what its meshed clients saw.
    let api = row(&stat["rows"], "deployment", "api");
    assert_eq!(api["source"], "clients");
    assert_eq!(api["meshed_pods"], 0);
    assert_eq!(api["golden"]["requests"], 2 * OUT * STEPS);
    assert_eq!(api["golden"]["success_rate"], 1.0);
    let api_p50 = api["golden"]["p50_ms"].as_f64().expect("api's p50");
    assert!(20.0 < api_p50 && api_p50 <= 30.0, "{api}");
    let down = row(&stat["rows"], "deployment", "down");
    assert_eq!(down["unreachable_pods"], 1);

    // One pod, the namespace, the service.
    let pod = viz
        .json("/api/stat?kind=po&namespace=shop&name=web-1&window=60")
        .await;
    assert_eq!(
        row(&pod["rows"], "pod", "web-1")["golden"]["requests"],
        (IN_OK + IN_FAIL) * STEPS
    );
    let ns = viz.json("/api/stat?kind=ns&window=60").await;
    assert_eq!(
        row(&ns["rows"], "namespace", "shop")["golden"]["requests"],
        final_requests
    );
    let svc = viz
        .json("/api/stat?kind=svc&namespace=shop&window=60")
        .await;
    assert_eq!(
        row(&svc["rows"], "service", "api")["golden"]["requests"],
        2 * OUT * STEPS
    );

    // The edge web -> api, mutual TLS with api's identity.
    let edges = viz.json("/api/edges?kind=deployment&namespace=shop").await;
    let edge = edges["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["src"]["name"] == "web" && e["dst"]["name"] == "api")
        .unwrap_or_else(|| panic!("no web -> api edge: {edges}"));
    assert_eq!(edge["mtls"], true);
    assert_eq!(edge["server_id"], API_ID);
    assert_eq!(edge["dst"]["kind"], "deployment");

    // The route, from the clients' route metrics.
    let routes = viz.json("/api/routes?target=svc/api&namespace=shop").await;
    let route = routes["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"]["name"] == "api-route")
        .unwrap_or_else(|| panic!("no api-route: {routes}"));
    assert_eq!(route["parent"]["name"], "api");
    assert_eq!(route["parent_port"], 80);
    assert_eq!(route["golden"]["requests"], 2 * OUT * STEPS);

    // The workload page.
    let w = viz
        .json("/api/workload?kind=deploy&namespace=shop&name=web")
        .await;
    assert_eq!(w["stat"]["resource"]["name"], "web");
    assert_eq!(w["pods"].as_array().unwrap().len(), 2);
    assert!(
        w["outbound"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["dst"]["name"] == "api"),
        "{w}"
    );

    // Pods: the one with no proxy answering is unreachable, with why and when next.
    let pods = viz.json("/api/pods?namespace=shop").await;
    let by_name = |name: &str| {
        pods["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pod"]["name"] == name)
            .unwrap_or_else(|| panic!("no pod {name}: {pods}"))
            .clone()
    };
    assert_eq!(by_name("web-1")["state"], "ok");
    assert_eq!(by_name("web-1")["addr"], web1.addr.to_string());
    let down = by_name("down-1");
    assert_eq!(down["state"], "unreachable");
    assert!(
        down["last_error"].as_str().unwrap().contains("connect"),
        "{down}"
    );
    assert!(down["next_attempt_in_secs"].as_u64().is_some(), "{down}");
    assert!(
        down["consecutive_failures"].as_u64().unwrap() >= 1,
        "{down}"
    );
    assert_eq!(
        pods["pods"].as_array().unwrap().len(),
        3,
        "api-1 has no proxy: {pods}"
    );

    let overview = viz.json("/api/overview").await;
    assert_eq!(overview["collector"]["source"], "scrape");
    assert_eq!(overview["collector"]["interval_secs"], 2);
    assert_eq!(overview["collector"]["pods_ok"], 2);
    assert_eq!(overview["collector"]["pods_unreachable"], 1);
    assert_eq!(
        row(&overview["namespaces"], "namespace", "shop")["golden"]["requests"],
        final_requests
    );

    // JSON headers.
    let (_, head, _) = viz.get("/api/overview").await;
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(head.contains("cache-control: no-store"), "{head}");

    // The schedule: no pod scraped faster than the interval allows.
    let (s1, s2) = (
        web1.scrapes.load(Ordering::SeqCst),
        web2.scrapes.load(Ordering::SeqCst),
    );
    assert!(s1.abs_diff(s2) <= 1, "{s1} vs {s2}");

    bad_queries(&viz).await;
    dashboard(&viz).await;

    // The admin server: OpenMetrics, and the collector's own figures.
    if let Some(page) = support::openmetrics::check_page(viz.admin, "viz").await {
        page.assert_has("viz_scrapes", "counter");
        page.assert_has("viz_scrape_duration_seconds", "histogram");
        page.assert_has("viz_pods", "gauge");
        page.assert_has("viz_scrape_cycles", "counter");
    }
    let (_, metrics) = support::http_get(viz.admin, "/metrics").await;
    let read = support::metrics::Metrics::parse(&metrics);
    let sample = |name: &str| -> f64 {
        read.value(name)
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert_eq!(sample("viz_pods{state=\"ok\"}"), 2.0);
    assert_eq!(sample("viz_pods{state=\"unreachable\"}"), 1.0);
    assert!(sample("viz_scrapes_total{result=\"ok\"}") >= 2.0 * (STEPS + 1) as f64);
    assert!(sample("viz_scrapes_total{result=\"connect_error\"}") >= 1.0);
    assert_eq!(sample("viz_pods_over_limit"), 0.0);

    // SIGTERM: a clean exit.
    let pid = viz.process.pid();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(DEADLINE, viz.process.child.wait())
        .await
        .expect("viz exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit}; log:\n{}", viz.process.log());
}

async fn bad_queries(viz: &Viz) {
    for (path, status, says) in [
        ("/api/stat", 400, "\"kind\" is required"),
        ("/api/stat?kind=bogus", 400, "unknown resource kind"),
        (
            "/api/stat?kind=deploy&window=abc",
            400,
            "not a number of seconds",
        ),
        (
            "/api/stat?kind=deploy&namepsace=shop",
            400,
            "unknown parameter",
        ),
        ("/api/stat?kind=deploy&kind=pod", 400, "given twice"),
        ("/api/edges", 400, "\"kind\" is required"),
        (
            "/api/workload?kind=deploy&namespace=shop",
            400,
            "\"name\" is required",
        ),
        (
            "/api/workload?kind=deploy&namespace=shop&name=nope",
            404,
            "not found",
        ),
        ("/api/overview?x=1", 400, "unknown parameter"),
        ("/api/nope", 404, "no API at /api/nope"),
    ] {
        let (got, head, body) = viz.get(path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            head.contains("content-type: application/json"),
            "{path}: {head}"
        );
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        let message = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: {body}"));
        assert!(message.contains(says), "{path}: {message}");
        assert!(!message.contains('\n'), "{path}: one line: {message:?}");
    }
    // A name that is not a Kubernetes name is refused on every path, and
    // not echoed back whole.
    let long = "a".repeat(300);
    for bad in [
        "..%2F..%2Fetc%2Fpasswd",
        "%3Cscript%3E",
        long.as_str(),
        "Shop",
    ] {
        for path in [
            format!("/api/stat?kind=deploy&namespace={bad}"),
            format!("/api/stat?kind=deploy&namespace=shop&name={bad}"),
            format!("/api/edges?kind=deploy&namespace={bad}"),
            format!("/api/pods?namespace={bad}"),
            format!("/api/routes?namespace={bad}"),
            format!("/api/routes?target=svc/{bad}&namespace=shop"),
            format!("/api/workload?kind=deploy&namespace={bad}&name=web"),
            format!("/api/workload?kind=deploy&namespace=shop&name={bad}"),
            format!("/api/tap?target=deploy/web&namespace={bad}"),
        ] {
            let (got, _, body) = viz.get(&path).await;
            assert_eq!(got, 400, "{path}: {body}");
            assert!(
                !body.contains("<script>") && !body.contains(&long) && body.len() < 400,
                "{path}: the refusal echoes the input: {body}"
            );
        }
    }
    let (got, head, _) = request(viz.addr, "POST", "/api/overview").await;
    assert_eq!(got, 405);
    assert!(head.contains("allow: get"), "{head}");
    let (got, _, _) = viz.get("/nope").await;
    assert_eq!(got, 404);
}

async fn dashboard(viz: &Viz) {
    let (status, head, body) = viz.get("/").await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'self'"),
        "{head}"
    );
    assert!(
        body.contains("<html") || body.contains("<!doctype"),
        "{body}"
    );
    let (status, head, _) = viz.get("/assets/app.js").await;
    assert_eq!(status, 200);
    assert!(head.contains("javascript"), "{head}");
    assert_eq!(viz.get("/assets/nope.js").await.0, 404);
    assert_eq!(viz.get("/live").await.0, 200);
}
