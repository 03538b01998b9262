//! The collector against real sockets: fake proxies' `/metrics` servers on
//! 127.0.0.1, among them one that never answers and one that answers
//! 100 MB; and a fake Prometheus' `/federate`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballast_viz::collector::{Clock, Collector, CollectorConfig, HttpFetch, Source};
use ballast_viz::metrics::{ResultLabels, StateLabels, VizMetrics};
use ballast_viz::prometheus::Federation;
use ballast_viz::Targets;
use ballast_vizcore::api::ResourceRef;
use ballast_vizcore::expo::Limits;
use ballast_vizcore::mesh::{Mesh, MeshConfig, StatQuery};
use ballast_vizcore::targets::{PodTarget, Snapshot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Generous for a busy 2-core machine: a local scrape takes milliseconds.
const TIMEOUT: Duration = Duration::from_secs(2);
const MAX_PAGE: usize = 1024 * 1024;

#[derive(Clone, Copy)]
enum Fake {
    /// A small page; `response_total` grows by 7 per scrape.
    Page,
    /// Accepts, reads the request, never answers.
    Hang,
    /// 200, chunked, 100 MB of series (written until the client goes).
    Huge,
}

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    /// Body bytes the server managed to write.
    sent: AtomicU64,
    requests: Mutex<Vec<String>>,
}

const HUGE: u64 = 100 * 1024 * 1024;

fn page(n: u64) -> String {
    format!(
        "# HELP response Responses.\n# TYPE response counter\n\
response_total{{direction=\"inbound\",tls=\"true\",status_code=\"200\",classification=\"success\"}} {}\n# EOF\n",
        n * 7
    )
}

async fn fake(kind: Fake) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let stats = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let n = stats.connections.fetch_add(1, Ordering::SeqCst) as u64 + 1;
            let stats = stats.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 16 * 1024];
                let mut len = 0;
                while !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut head[len..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => len += k,
                    }
                }
                let line = String::from_utf8_lossy(&head[..len])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                stats.requests.lock().unwrap().push(line);
                match kind {
                    Fake::Page => {
                        let body = page(n);
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = s.write_all(answer.as_bytes()).await;
                    }
                    Fake::Hang => {
                        // Hold the socket open, answer nothing.
                        let mut sink = [0u8; 1024];
                        while let Ok(k) = s.read(&mut sink).await {
                            if k == 0 {
                                break;
                            }
                        }
                    }
                    Fake::Huge => {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        let line = "response_total{direction=\"inbound\",status_code=\"200\",classification=\"success\",pad=\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"} 1\n";
                        let chunk: String = line.repeat(64 * 1024 / line.len());
                        let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
                        while stats.sent.load(Ordering::SeqCst) < HUGE {
                            if s.write_all(framed.as_bytes()).await.is_err() {
                                return;
                            }
                            stats.sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                        }
                        let _ = s.write_all(b"0\r\n\r\n").await;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn target(name: &str, addr: SocketAddr) -> PodTarget {
    PodTarget {
        pod: ResourceRef {
            kind: "pod".into(),
            namespace: "shop".into(),
            name: name.into(),
        },
        workload: Some(ResourceRef {
            kind: "deployment".into(),
            namespace: "shop".into(),
            name: name.split('-').next().unwrap().into(),
        }),
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        admin_port: addr.port(),
        tap_port: 4190,
        service_account: "default".into(),
    }
}

fn scrapes(m: &VizMetrics, result: &'static str) -> u64 {
    m.scrapes.get_or_create(&ResultLabels { result }).get()
}

fn pods(m: &VizMetrics, state: &'static str) -> i64 {
    m.pods.get_or_create(&StateLabels { state }).get()
}

fn collector(
    targets: Vec<PodTarget>,
    source: Source,
    concurrency: usize,
) -> (Collector, VizMetrics, Arc<Mutex<Mesh>>) {
    let metrics = VizMetrics::default();
    let snapshot = Snapshot {
        meshed: targets,
        ..Snapshot::default()
    };
    let targets: Targets = Arc::new(move || snapshot.clone());
    let mesh = Arc::new(Mutex::new(Mesh::new(MeshConfig::default())));
    let c = Collector::new(
        CollectorConfig {
            interval: Duration::from_secs(10),
            timeout: TIMEOUT,
            concurrency,
            max_page_bytes: MAX_PAGE,
            ..CollectorConfig::default()
        },
        mesh.clone(),
        targets,
        source,
        metrics.clone(),
        Clock::new(),
    );
    (c, metrics, mesh)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_and_a_huge_proxy_do_not_hold_up_the_others_and_back_off() {
    let mut targets = Vec::new();
    let mut good = Vec::new();
    for i in 0..20 {
        let (addr, seen) = fake(Fake::Page).await;
        targets.push(target(&format!("web-{i:02}"), addr));
        good.push(seen);
    }
    let (hang_addr, hang) = fake(Fake::Hang).await;
    targets.push(target("hang-0", hang_addr));
    let (huge_addr, huge) = fake(Fake::Huge).await;
    targets.push(target("huge-0", huge_addr));
    let (mut c, metrics, _) = collector(targets, Source::Scrape(Arc::new(HttpFetch)), 4);

    let started = Instant::now();
    c.cycle().await;
    let took = started.elapsed();
    // The hanging pod holds one of four slots for the timeout; the others
    // (and the huge one) are done meanwhile, so the cycle is the timeout,
    // not 22 scrapes in a row.
    assert!(took >= TIMEOUT, "{took:?}");
    assert!(took < TIMEOUT * 3, "{took:?}");
    assert_eq!(scrapes(&metrics, "ok"), 20);
    assert_eq!(scrapes(&metrics, "timeout"), 1);
    assert_eq!(scrapes(&metrics, "too_large"), 1);
    for seen in &good {
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
        let requests = seen.requests.lock().unwrap();
        assert_eq!(requests.as_slice(), ["GET /metrics HTTP/1.1"]);
    }
    // The huge page was cut at the bound: what was read is the bound plus
    // at most one read buffer, and the server was made to stop writing.
    let good_bytes = page(1).len() as u64 * 20;
    let read_of_huge = metrics.scrape_bytes.get() - good_bytes;
    assert!(read_of_huge > MAX_PAGE as u64 / 2, "{read_of_huge}");
    assert!(
        read_of_huge <= MAX_PAGE as u64 + 512 * 1024,
        "{read_of_huge}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sent = huge.sent.load(Ordering::SeqCst);
        // Stopped short of 100 MB: the collector hung up.
        let before = sent;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if huge.sent.load(Ordering::SeqCst) == before {
            assert!(sent < HUGE / 4, "the huge server wrote {sent} bytes");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the huge server is still writing"
        );
    }
    assert_eq!(pods(&metrics, "ok"), 20);
    assert_eq!(pods(&metrics, "unreachable"), 2);
    assert_eq!(metrics.scrapes_in_flight.get(), 0);

    // Backoff: failing pods are tried on cycles 0 and 1, then at most every
    // other cycle; the healthy ones every cycle.
    for _ in 1..6 {
        c.cycle().await;
    }
    for seen in &good {
        assert_eq!(seen.connections.load(Ordering::SeqCst), 6);
    }
    for (what, seen) in [("hang", &hang), ("huge", &huge)] {
        let attempts = seen.connections.load(Ordering::SeqCst);
        // 0, 1, then 1..=2 later, then 2..=4 later: 3 or 4 within 6 cycles.
        assert!(
            (3..=4).contains(&attempts),
            "{what}: {attempts} attempts in 6 cycles"
        );
    }
    assert_eq!(scrapes(&metrics, "ok"), 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_unreachable_and_an_error_status_is_named() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    let targets = vec![target("gone-0", closed), target("broken-0", err_addr)];
    let (mut c, metrics, _) = collector(targets, Source::Scrape(Arc::new(HttpFetch)), 2);
    c.cycle().await;
    assert_eq!(scrapes(&metrics, "connect_error"), 1);
    assert_eq!(scrapes(&metrics, "http_error"), 1);
    assert_eq!(pods(&metrics, "unreachable"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_federation_is_read_once_per_cycle() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(line);
                    seen.len() as u64
                };
                // Prometheus' answer: each proxy series with the namespace
                // and pod labels its scrape configuration adds; web-0 counts
                // 5 more each time, a pod viz does not know counts too.
                // Prometheus cannot scrape web-1, and has no target for
                // web-2.
                let body = format!("# TYPE response_total untyped\n\
response_total{{direction=\"inbound\",classification=\"success\",status_code=\"200\",namespace=\"shop\",pod=\"web-0\",instance=\"10.0.0.1:4191\",job=\"linkerd-proxy\"}} {} 1700000000000\n\
response_total{{direction=\"inbound\",classification=\"success\",status_code=\"200\",namespace=\"shop\",pod=\"other-0\",instance=\"10.0.0.2:4191\",job=\"linkerd-proxy\"}} {} 1700000000000\n\
# TYPE up untyped\n\
up{{namespace=\"shop\",pod=\"web-0\",instance=\"10.0.0.1:4191\",job=\"linkerd-proxy\"}} 1 1700000000000\n\
up{{namespace=\"shop\",pod=\"web-1\",instance=\"10.0.0.3:4191\",job=\"linkerd-proxy\"}} 0 1700000000000\n", 5 * n, 100 * n);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    let federation = Federation {
        url: format!("http://{addr}/prom").parse().unwrap(),
        timeout: TIMEOUT,
        max_bytes: MAX_PAGE,
        limits: Limits::default(),
    };
    let web: Vec<PodTarget> = (0..3)
        .map(|i| target(&format!("web-{i}"), "127.0.0.1:1".parse().unwrap()))
        .collect();
    let (mut c, metrics, mesh) = collector(web, Source::Prometheus(federation), 1);
    c.cycle().await;
    c.cycle().await;
    assert_eq!(scrapes(&metrics, "ok"), 2);
    // The first answer is the baseline; the second counted 5 more.
    let now = Clock::new().now_unix();
    let stat = mesh
        .lock()
        .unwrap()
        .stat(
            &StatQuery {
                kind: "pod".into(),
                namespace: Some("shop".into()),
                ..StatQuery::default()
            },
            now,
        )
        .unwrap();
    let web0 = stat
        .rows
        .iter()
        .find(|r| r.resource.name == "web-0")
        .expect("web-0's row");
    assert_eq!(web0.golden.requests, 5);
    assert!(
        stat.rows
            .iter()
            .all(|r| r.resource.name.starts_with("web-")),
        "only the pods of the index: {stat:?}"
    );
    // Prometheus' `up`: web-1 it cannot scrape, web-2 it has no target for.
    let states = mesh.lock().unwrap().pods(Some("shop"), now);
    let state = |name: &str| {
        let p = states
            .pods
            .iter()
            .find(|p| p.pod.name == name)
            .unwrap_or_else(|| panic!("{name} in {states:?}"));
        (p.state.clone(), p.last_error.clone().unwrap_or_default())
    };
    assert_eq!(state("web-0").0, "ok");
    let (s1, e1) = state("web-1");
    assert_eq!(s1, "unreachable");
    assert!(e1.contains("up 0"), "{e1}");
    let (s2, e2) = state("web-2");
    assert_eq!(s2, "unreachable");
    assert!(e2.contains("no scrape target"), "{e2}");
    assert_eq!(
        mesh.lock().unwrap().overview(now).collector.source,
        "prometheus"
    );
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[0].starts_with("GET /prom/federate?match%5B%5D=%7B__name__%3D%7E%22response_total%7Cresponse_latency_ms_bucket%7C"),
        "{}",
        requests[0]
    );
    assert_eq!(pods(&metrics, "ok"), 1);
    assert_eq!(pods(&metrics, "unreachable"), 2);
}

/// Serves `answer` (status line, headers, body) to every connection.
async fn serve(answer: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 16 * 1024];
                let _ = s.read(&mut head).await;
                let _ = s.write_all(&answer).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_page_parsed_as_it_arrives_is_the_page_parsed_whole() {
    use ballast_viz::collector::{Fetch, ScrapeError, SCRAPE_READ_BUFFER_BYTES};
    use ballast_vizcore::expo;
    use std::fmt::Write;
    // Many read buffers of series, some lines cut between them.
    let mut body = String::new();
    for i in 0..3_000u64 {
        let _ = writeln!(
            body,
            "response_total{{direction=\"outbound\",dst_namespace=\"ns\",dst_service=\"svc-{i}\",classification=\"success\"}} {}",
            i + 1
        );
        let _ = writeln!(
            body,
            "response_latency_ms_bucket{{le=\"{}.0\",direction=\"inbound\",authority=\"x\"}} {}",
            i % 50,
            i / 50
        );
        let _ = writeln!(body, "request_total{{direction=\"inbound\"}} {i}");
    }
    assert!(body.len() > 20 * SCRAPE_READ_BUFFER_BYTES);
    let content_length = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes();
    let mut chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for piece in body.as_bytes().chunks(777) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    for (answer, declared) in [(content_length, true), (chunked, false)] {
        let addr = serve(answer).await;
        let t = target("web-0", addr);
        let whole = expo::parse(body.as_bytes(), &Limits::default(), Some(addr.port()));
        let (read, page) = HttpFetch.fetch_page(&t, 1 << 20, Limits::default()).await;
        assert_eq!(read, body.len());
        let page = page.expect("parses");
        assert!(page.len() > 3_000, "{}", page.len());
        assert_eq!(format!("{:?}", Ok::<_, ()>(page)), format!("{whole:?}"));
        // Too many series is a parse error, its bytes counted; over the
        // page bound it is too large first.
        let few = Limits {
            max_series: 100,
            ..Limits::default()
        };
        let (read, page) = HttpFetch.fetch_page(&t, 1 << 20, few).await;
        assert_eq!(read, body.len());
        assert!(matches!(page, Err(ScrapeError::Parse(_))), "{page:?}");
        let (read, page) = HttpFetch.fetch_page(&t, 100 * 1024, few).await;
        if declared {
            // Refused unread.
            assert_eq!(read, 0);
        } else {
            assert!(read > 100 * 1024 && read <= 100 * 1024 + SCRAPE_READ_BUFFER_BYTES);
        }
        assert_eq!(page.map(|_| ()).unwrap_err().result_label(), "too_large");
    }
}
