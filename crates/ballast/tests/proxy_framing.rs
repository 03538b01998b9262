//! HTTP/1 framing through the proxy, by the rules (RFC 9112 sections 3.2, 6
//! and 7): whatever framing a peer sends, what the proxy forwards is one
//! well-framed message or a refusal, on the outbound and the inbound side,
//! and between two meshed proxies (HTTP/1 carried as HTTP/2 over mutual
//! TLS, l5d-orig-proto).
//!
//! - A message whose body is read by Transfer-Encoding never goes on with the
//!   Content-Length it also carried (that length is not the body's).
//! - Contradictory framing from a backend (two different lengths) is a 502,
//!   never a guess.
//! - A backend's response head longer than a read buffer (within the limit)
//!   is forwarded whole.
//! - A request with two `Host` lines, or a `Host` other than its absolute-form
//!   target's authority, is answered 400 and its connection closed.
//!
//! The backend here is raw TCP answering fixed bytes, so that what a
//! conforming server would never send can be sent.

use ballast_testsupport as support;

// The hand-written HTTP/2 client of the hostile suites.
#[allow(dead_code)]
#[path = "hostile/common.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::identity::{meshed_service_yaml, proxy_identity_flags, token_secret, IdentityCa, Pki};
use support::proxy::{authority, Cluster, Proxy, NS};
use support::{write_atomic, Controller, DEADLINE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Nothing listens here: the inbound side needs no controller.
const NO_CONTROLLER: &str = "127.0.0.1:9";

/// The body every raw answer carries: 74 bytes in three chunks.
const BODY: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz-0123456789abcdefghijklmnopqrstuvwxyz.";

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [&body[..10], &body[10..40], &body[40..]] {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// A backend that answers every request (read up to its blank line) with
/// `answer`, on every connection, until dropped; POSTs only when
/// `answer_posts` (else they wait). It keeps every byte it received.
struct RawBackend {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    received: Arc<Mutex<Vec<u8>>>,
}

impl RawBackend {
    async fn start(answer: Vec<u8>) -> RawBackend {
        Self::serve(answer, true).await
    }

    async fn serve(answer: Vec<u8>, answer_posts: bool) -> RawBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let all = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let answer = answer.clone();
                let all = all.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = conn.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        all.lock().unwrap().extend_from_slice(&buf[..n]);
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            let post = seen.starts_with(b"POST ");
                            seen.drain(..end + 4);
                            if post && !answer_posts {
                                continue;
                            }
                            if conn.write_all(&answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        RawBackend {
            addr,
            task,
            received,
        }
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.received.lock().unwrap()).into_owned()
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response as the client read it off the wire.
#[derive(Debug)]
struct Read {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Whether the connection was closed after it.
    closed: bool,
}

impl Read {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Sends `request` on a new connection to `addr` and reads one response by
/// its own framing (chunked, else Content-Length, else to the close).
async fn exchange(addr: SocketAddr, request: &str) -> Read {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request.as_bytes()).await.expect("write");
    tokio::time::timeout(DEADLINE, read_response(&mut conn))
        .await
        .expect("a response in time")
}

async fn read_response(conn: &mut TcpStream) -> Read {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = conn.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before a response head: {data:?}");
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut rest = data[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let te = headers.iter().any(|(n, _)| n == "transfer-encoding");
    let cl = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse::<usize>().expect("a numeric Content-Length"));
    let body = if te {
        let mut body = Vec::new();
        loop {
            while !rest.windows(2).any(|w| w == b"\r\n") {
                assert!(
                    more(conn, &mut rest).await > 0,
                    "closed inside a chunk size"
                );
            }
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size_text = String::from_utf8_lossy(&rest[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                .expect("a chunk size");
            rest.drain(..line_end + 2);
            while rest.len() < size + 2 {
                assert!(more(conn, &mut rest).await > 0, "closed inside a chunk");
            }
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                break body;
            }
        }
    } else if let Some(len) = cl {
        while rest.len() < len {
            assert!(
                more(conn, &mut rest).await > 0,
                "closed after {} of its Content-Length {len}",
                rest.len()
            );
        }
        rest.drain(..len).collect()
    } else {
        while more(conn, &mut rest).await > 0 {}
        std::mem::take(&mut rest)
    };
    // Nothing else may follow a response to one request.
    let after = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
    let closed = match after {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("{n} bytes after the response: {:?}", &buf[..n]),
        Err(_) => false,
    };
    assert!(rest.is_empty(), "bytes after the body: {rest:?}");
    Read {
        status,
        headers,
        body,
        closed,
    }
}

/// Reads what comes next onto `rest`; 0 at the end.
async fn more(conn: &mut TcpStream, rest: &mut Vec<u8>) -> usize {
    let mut buf = [0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap_or(0);
    rest.extend_from_slice(&buf[..n]);
    n
}

/// The three paths to `backend`: the outbound proxy (the backend as the pod
/// of service `raw`), an inbound proxy forwarding to it, and two meshed
/// proxies (the backend behind the server one as the pod of service
/// `mraw`): HTTP/1 carried as HTTP/2 (l5d-orig-proto) over mutual TLS.
struct Paths {
    _tmp: tempfile::TempDir,
    _cluster: Cluster,
    _controller: Controller,
    _ca: IdentityCa,
    outbound: Proxy,
    inbound: Proxy,
    meshed_client: Proxy,
    _meshed_server: Proxy,
}

impl Paths {
    async fn start(backend: SocketAddr) -> Paths {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pki = Pki::generate(&tmp.path().join("pki")).await;
        let tokens = tmp.path().join("tokens");
        std::fs::create_dir_all(&tokens).expect("tokens dir");
        write_atomic(
            &tokens.join("secrets.yaml"),
            &[
                token_secret(NS, "web", "tok-web"),
                token_secret(NS, "raw", "tok-raw"),
            ]
            .join("---\n"),
        );
        for sa in ["web", "raw"] {
            std::fs::write(tmp.path().join(format!("{sa}.token")), format!("tok-{sa}"))
                .expect("token file");
        }
        let ca = IdentityCa::start(&pki, &tokens, &[]).await;
        let port = backend.port().to_string();
        let server_flags = proxy_identity_flags(
            &pki,
            ca.grpc,
            "raw",
            &tmp.path().join("raw.token"),
            false,
            &["--inbound-forward-port", &port],
        );
        let args: Vec<&str> = server_flags.iter().map(String::as_str).collect();
        let meshed_server = Proxy::start(NO_CONTROLLER.parse().expect("addr"), &args).await;

        let cluster = Cluster::new();
        cluster.pods("raw", &[("raw-0", backend)]);
        cluster.service("raw", "raw", "127.0.0.101", 80);
        write_atomic(
            &cluster.path().join("mraw.yaml"),
            &meshed_service_yaml("mraw", "raw", meshed_server.inbound, "127.0.0.102"),
        );
        let controller = Controller::start(cluster.path(), &[]).await;
        let outbound = Proxy::start(controller.grpc, &[]).await;
        let inbound = Proxy::start(
            NO_CONTROLLER.parse().expect("addr"),
            &["--inbound-forward-port", &port],
        )
        .await;
        let client_flags = proxy_identity_flags(
            &pki,
            ca.grpc,
            "web",
            &tmp.path().join("web.token"),
            true,
            &[],
        );
        let args: Vec<&str> = client_flags.iter().map(String::as_str).collect();
        let meshed_client = Proxy::start(controller.grpc, &args).await;
        let paths = Paths {
            _tmp: tmp,
            _cluster: cluster,
            _controller: controller,
            _ca: ca,
            outbound,
            inbound,
            meshed_client,
            _meshed_server: meshed_server,
        };
        // Each side knows its service once a request is answered by it.
        for (side, addr, host) in paths.each() {
            let deadline = std::time::Instant::now() + DEADLINE;
            loop {
                let r = exchange(addr, &get(&host, "/")).await;
                if r.status != 503 && r.status != 404 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{side}: {host} never routed: {r:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        paths
    }

    /// Each path: its name, where a client connects, and the host to ask
    /// for.
    fn each(&self) -> [(&'static str, SocketAddr, String); 3] {
        [
            ("outbound", self.outbound.outbound, authority("raw", 80)),
            ("inbound", self.inbound.inbound, authority("raw", 80)),
            ("meshed", self.meshed_client.outbound, authority("mraw", 80)),
        ]
    }
}

fn get(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_read_by_transfer_encoding_never_goes_on_with_a_content_length() {
    let chunks = chunked(BODY);
    for stale in ["4", "100", &BODY.len().to_string()] {
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {stale}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        answer.extend_from_slice(&chunks);
        let backend = RawBackend::start(answer).await;
        let paths = Paths::start(backend.addr).await;
        for (side, addr, host) in paths.each() {
            let r = exchange(addr, &get(&host, "/")).await;
            assert_eq!(r.status, 200, "{side}, Content-Length {stale}: {r:?}");
            assert_eq!(
                r.body, BODY,
                "{side}, Content-Length {stale}: the whole body"
            );
            let lengths = r.all("content-length");
            assert!(
                lengths.is_empty() || r.all("transfer-encoding").is_empty(),
                "{side}: both framings forwarded: {r:?}"
            );
            assert!(
                lengths.iter().all(|l| *l == BODY.len().to_string()),
                "{side}: a length that is not the body's: {r:?}"
            );
        }
    }
}

/// A backend's response head past hyper's 8 KiB read buffer (and past any
/// fixed read size) but inside `--http1-max-header-bytes` (64 KiB) is
/// forwarded whole: the endpoint connection's buffer grows to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_response_head_within_the_limit_is_forwarded_whole() {
    let value = "v".repeat(4000);
    let mut answer = String::from("HTTP/1.1 200 OK\r\nContent-Length: 74\r\n");
    for i in 0..6 {
        answer.push_str(&format!("x-long-{i}: {value}\r\n"));
    }
    answer.push_str("\r\n");
    let mut answer = answer.into_bytes();
    assert!(answer.len() > 16 * 1024, "a head of {} bytes", answer.len());
    answer.extend_from_slice(BODY);
    let backend = RawBackend::start(answer).await;
    let paths = Paths::start(backend.addr).await;
    for (side, addr, host) in paths.each() {
        let r = exchange(addr, &get(&host, "/")).await;
        assert_eq!(r.status, 200, "{side}: {:?}", r.status);
        assert_eq!(r.body, BODY, "{side}");
        for i in 0..6 {
            assert_eq!(
                r.all(&format!("x-long-{i}")),
                [value.as_str()],
                "{side}: header x-long-{i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradictory_lengths_from_a_backend_are_a_502() {
    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 74\r\n\r\n".to_vec();
    answer.extend_from_slice(BODY);
    let backend = RawBackend::start(answer).await;
    let paths = Paths::start(backend.addr).await;
    for (side, addr, host) in paths.each() {
        let r = exchange(addr, &get(&host, "/")).await;
        assert_eq!(r.status, 502, "{side}: {r:?}");
        assert!(
            !r.body.windows(10).any(|w| w == &BODY[..10]),
            "{side}: {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_or_a_host_against_the_target_are_refused() {
    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 74\r\n\r\n".to_vec();
    answer.extend_from_slice(BODY);
    let backend = RawBackend::start(answer).await;
    let paths = Paths::start(backend.addr).await;
    for (side, addr, raw) in paths.each() {
        let bare = raw.strip_suffix(":80").expect("port 80");
        for (request, why) in [
            (
                format!("GET / HTTP/1.1\r\nHost: {raw}\r\nHost: evil.example\r\n\r\n"),
                "duplicate_host",
            ),
            (
                format!("GET / HTTP/1.1\r\nHost: {raw}\r\nhost: {raw}\r\n\r\n"),
                "duplicate_host",
            ),
            (
                format!("GET http://{raw}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
                "host_mismatch",
            ),
            (
                format!("GET http://{raw}/ HTTP/1.1\r\nHost: {bare}:81\r\n\r\n"),
                "host_mismatch",
            ),
        ] {
            let r = exchange(addr, &request).await;
            assert_eq!(r.status, 400, "{side} {request:?}: {r:?}");
            assert_eq!(r.all("l5d-proxy-error"), [why], "{side} {request:?}: {r:?}");
            assert!(r.closed, "{side} {request:?}: the connection stays open");
        }
        // The same host in both places (its default port left out) passes.
        let same = format!("GET http://{raw}/ HTTP/1.1\r\nHost: {bare}\r\n\r\n");
        let r = exchange(addr, &same).await;
        assert_eq!((r.status, r.body.as_slice()), (200, BODY), "{side}: {r:?}");
    }
}

/// A chunk extension whose quoted-string runs across the line end: hyper
/// would end the body at that line and take what follows as a second
/// request, where a front end that reads quoted-strings sees one. The
/// request is answered 400 `malformed_chunk`, its connection closed, and
/// the bytes after the bad line never reach the backend as a request. Each
/// malformed chunk line the same, and a trailer line ended by a bare LF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunk_extensions_are_refused_and_nothing_is_smuggled() {
    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 74\r\n\r\n".to_vec();
    answer.extend_from_slice(BODY);
    // POSTs are never answered: the proxy's answer is its own.
    let backend = RawBackend::serve(answer, false).await;
    let paths = Paths::start(backend.addr).await;
    let cases = [
        ("1;a=\"\r\nX\r\n0\r\n", "/smuggled-quote"),
        ("1;a=\"x\\\r\nX\r\n0\r\n", "/smuggled-escape"),
        ("1;a=\"x\x01\"\r\nX\r\n0\r\n", "/smuggled-control"),
        ("1;\r\nX\r\n0\r\n", "/smuggled-empty"),
        ("1;a=b c\r\nX\r\n0\r\n", "/smuggled-space"),
        // A trailer line ended by a bare LF: hyper reads on to the next
        // CRLFCRLF, so what a lenient reader takes for the next request
        // would be hyper's trailers.
        ("0\r\nT: x\n", "/smuggled-trailer"),
    ];
    for (side, addr, raw) in paths.each() {
        for (line, smuggled) in cases {
            let request = format!(
                "POST /upload HTTP/1.1\r\nHost: {raw}\r\nTransfer-Encoding: chunked\r\n\r\n\
                 {line}\r\nGET {smuggled} HTTP/1.1\r\nHost: {raw}\r\n\r\n"
            );
            let r = exchange(addr, &request).await;
            assert_eq!(r.status, 400, "{side} {line:?}: {r:?}");
            assert_eq!(
                r.all("l5d-proxy-error"),
                ["malformed_chunk"],
                "{side} {line:?}: {r:?}"
            );
            assert!(r.closed, "{side} {line:?}: the connection stays open");
            assert!(
                !backend.received().contains(smuggled),
                "{side} {line:?}: the backend got the smuggled request:\n{}",
                backend.received()
            );
        }
    }
    // Each refusal is counted by the proxy that made it (a connection ends
    // after its counter is bumped; the metrics are read after the close).
    for (side, proxy) in [
        ("outbound", &paths.outbound),
        ("inbound", &paths.inbound),
        ("meshed", &paths.meshed_client),
    ] {
        let want = cases.len() as f64;
        let counted = support::eventually("the refusals counted", || async {
            let n = proxy
                .metrics()
                .await
                .sum("http1_framing_refused_total", &[]);
            (n >= want).then_some(n)
        })
        .await;
        assert_eq!(counted, want, "{side}: http1_framing_refused_total");
    }
}

/// A backend speaking HTTP/1 and HTTP/2 (hyper's), that keeps the path and
/// body length of each request it read whole, and answers 200 with BODY.
struct WholeBackend {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    whole: Arc<Mutex<Vec<(String, usize)>>>,
}

impl WholeBackend {
    async fn start() -> WholeBackend {
        use http_body_util::BodyExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let whole: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
        let keep = whole.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let keep = keep.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let keep = keep.clone();
                            async move {
                                let path = req.uri().path().to_string();
                                if let Ok(body) = req.into_body().collect().await {
                                    keep.lock().unwrap().push((path, body.to_bytes().len()));
                                }
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(hyper::body::Bytes::from_static(
                                        BODY,
                                    )),
                                ))
                            }
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                    .await;
                });
            }
        });
        WholeBackend { addr, task, whole }
    }

    fn read_whole(&self, path: &str) -> Vec<usize> {
        self.whole
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, n)| *n)
            .collect()
    }
}

impl Drop for WholeBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A path, the headers it adds, and the DATA bytes it sends.
type H2Case = (&'static str, &'static [(&'static str, &'static str)], usize);

/// HTTP/2 end to end (RFC 9113 section 8.2): a request whose DATA is not
/// its content-length, or that carries a header of the HTTP/1 hop
/// (connection, keep-alive, proxy-connection, transfer-encoding, upgrade, a
/// `te` other than trailers), or an uppercase field name, is malformed: the
/// stream is reset or answered with an error, and the backend never reads
/// it whole. A well-formed one on the same paths is read whole, its length
/// intact. On the meshed path the client's HTTP/2 goes on as HTTP/2 over
/// mutual TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http2_requests_never_reach_the_backend_whole() {
    let backend = WholeBackend::start().await;
    let paths = Paths::start(backend.addr).await;
    let body = [b'x'; 5];
    for (side, addr, host) in paths.each() {
        let head = |path: &'static str| {
            vec![
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", host.as_str()),
                (":path", path),
            ]
        };
        let cases: [H2Case; 8] = [
            ("/short", &[("content-length", "10")], 5),
            ("/long", &[("content-length", "2")], 5),
            ("/connection", &[("connection", "close")], 0),
            ("/keep-alive", &[("keep-alive", "5")], 0),
            ("/proxy-connection", &[("proxy-connection", "close")], 0),
            ("/transfer-encoding", &[("transfer-encoding", "chunked")], 5),
            ("/te", &[("te", "gzip")], 0),
            ("/uppercase", &[("X-Upper", "1")], 0),
        ];
        for (path, extra, len) in cases {
            let raw = common::RawH2::connect(addr).await.expect("connect");
            let mut headers = head(path);
            headers.extend_from_slice(extra);
            let mut frames = Vec::new();
            common::h2_headers(&mut frames, 1, &headers, false);
            common::h2_frame(
                &mut frames,
                common::H2_DATA,
                common::H2_END_STREAM,
                1,
                &body[..len],
            );
            raw.send(&frames).await.expect("send");
            let seen = raw
                .wait_for(DEADLINE, |s| s.resets > 0 || s.headers > 0 || s.closed)
                .await;
            assert!(
                seen.resets > 0 || seen.headers > 0 || seen.closed,
                "{side} {path}: no answer: {seen:?}"
            );
            assert!(
                backend.read_whole(path).is_empty(),
                "{side} {path}: the backend read the malformed request whole: {seen:?}"
            );
        }
        // The same shape, well formed, is read whole with its length.
        let raw = common::RawH2::connect(addr).await.expect("connect");
        let mut headers = head("/good");
        headers.push(("content-length", "5"));
        let mut frames = Vec::new();
        common::h2_headers(&mut frames, 1, &headers, false);
        common::h2_frame(
            &mut frames,
            common::H2_DATA,
            common::H2_END_STREAM,
            1,
            &body,
        );
        raw.send(&frames).await.expect("send");
        let seen = raw.wait_for(DEADLINE, |s| s.headers > 0 || s.closed).await;
        assert_eq!(seen.resets, 0, "{side} /good: {seen:?}");
        support::eventually("the good request read whole", || async {
            (!backend.read_whole("/good").is_empty()).then_some(())
        })
        .await;
        assert!(
            backend.read_whole("/good").iter().all(|n| *n == 5),
            "{side}: {:?}",
            backend.read_whole("/good")
        );
        backend.whole.lock().unwrap().clear();
    }
}
