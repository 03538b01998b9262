//! The admin server, spoken to over real TCP on 127.0.0.1 with raw HTTP/1.1.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ballast_admin::{AdminServer, AdminState, Readiness, METRICS_CONTENT_TYPE};
use ballast_testkit::eventually;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

// The memory metrics are meaningful only on jemalloc, as in the binary.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Bound on every wait in these tests: a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(10);

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl Running {
    async fn start(server: AdminServer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Triggers shutdown and waits for `serve` to return.
    async fn stop(mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        timeout(DEADLINE, &mut self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve does not panic")
    }
}

fn state(registry: Registry, readiness: Readiness) -> AdminState {
    AdminState::new(Arc::new(registry), readiness)
}

fn plain_server() -> AdminServer {
    AdminServer::new(state(Registry::default(), Readiness::always()))
}

#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// Reads one response (head and a `content-length` body) from `stream`.
async fn read_reply(stream: &mut TcpStream) -> Reply {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = timeout(DEADLINE, stream.read(&mut chunk))
            .await
            .expect("response head within the deadline")
            .expect("read response head");
        assert!(
            n > 0,
            "connection closed before a full response head: {buf:?}"
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).expect("UTF-8 head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let mut reply = Reply {
        status,
        head,
        body: String::new(),
    };
    let length: usize = reply
        .header("content-length")
        .expect("content-length")
        .parse()
        .expect("numeric content-length");
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 4096];
        let n = timeout(DEADLINE, stream.read(&mut chunk))
            .await
            .expect("response body within the deadline")
            .expect("read response body");
        assert!(n > 0, "connection closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    reply.body = String::from_utf8(body).expect("UTF-8 body");
    reply
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    read_reply(&mut stream).await
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path).await
}

/// Reads until the server closes `stream` (EOF or reset), within the deadline.
async fn wait_closed(stream: &mut TcpStream) {
    let closed = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    timeout(DEADLINE, closed)
        .await
        .expect("server closes the connection within the deadline");
}

#[tokio::test]
async fn live_is_always_200() {
    let server = Running::start(plain_server()).await;
    let reply = get(server.addr, "/live").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "live\n");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn ready_follows_the_readiness_flag() {
    let flag = Arc::new(AtomicBool::new(false));
    let server = Running::start(AdminServer::new(state(
        Registry::default(),
        Readiness::from_flag(flag.clone()),
    )))
    .await;

    let reply = get(server.addr, "/ready").await;
    assert_eq!((reply.status, reply.body.as_str()), (503, "not ready\n"));

    flag.store(true, Ordering::Release);
    let reply = get(server.addr, "/ready").await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "ready\n"));

    flag.store(false, Ordering::Release);
    assert_eq!(get(server.addr, "/ready").await.status, 503);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn metrics_expose_the_registry_and_memory() {
    let mut registry = Registry::default();
    let requests = Counter::<u64>::default();
    registry.register(
        "test_requests",
        "Requests seen by the test",
        requests.clone(),
    );
    ballast_admin::register_memory_metrics(&mut registry);
    requests.inc_by(3);
    let server = Running::start(AdminServer::new(state(registry, Readiness::always()))).await;

    let reply = get(server.addr, "/metrics").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some(METRICS_CONTENT_TYPE));
    let body = &reply.body;
    assert!(body.contains("\ntest_requests_total 3\n"), "{body}");
    let mut names = vec![
        "process_memory_allocated_bytes",
        "process_memory_resident_bytes",
        "process_memory_allocated_max_bytes",
        "process_memory_resident_max_bytes",
        "admin_connections_open",
        "admin_connections_rejected_total",
    ];
    if cfg!(target_os = "linux") {
        names.extend([
            "process_resident_memory_bytes",
            "process_resident_memory_max_bytes",
        ]);
    }
    for name in names {
        assert!(
            body.contains(&format!("\n{name} ")),
            "{name} missing from:\n{body}"
        );
    }
    assert!(
        body.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF:\n{body}"
    );
    assert!(
        value(body, "process_memory_allocated_bytes") > 0,
        "jemalloc counts this test's heap"
    );
    assert!(
        value(body, "process_memory_allocated_max_bytes")
            >= value(body, "process_memory_allocated_bytes")
    );
    server.stop().await.expect("clean stop");
}

/// The value of the unlabelled sample `name` in an OpenMetrics text body.
fn value(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{body}"))
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() {
    let server = Running::start(plain_server()).await;
    assert_eq!(get(server.addr, "/").await.status, 404);
    assert_eq!(get(server.addr, "/live/extra").await.status, 404);
    assert_eq!(get(server.addr, "/shutdown").await.status, 404);
    for path in ["/live", "/ready", "/metrics"] {
        let reply = request(server.addr, "POST", path).await;
        assert_eq!(reply.status, 405, "POST {path}");
        assert_eq!(reply.header("allow"), Some("GET"));
    }
    assert_eq!(request(server.addr, "DELETE", "/metrics").await.status, 405);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn request_bodies_are_not_waited_for() {
    let server = Running::start(plain_server()).await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    // Announces a gigabyte of body and sends almost none of it.
    stream
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000000000\r\n\r\nabc")
        .await
        .expect("write");
    let reply = read_reply(&mut stream).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "live\n"));
    wait_closed(&mut stream).await;
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let server = Running::start(plain_server()).await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    for path in ["/live", "/ready", "/metrics", "/live"] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        assert_eq!(read_reply(&mut stream).await.status, 200, "GET {path}");
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn garbage_and_hang_ups_do_not_kill_the_server() {
    // Some inputs are an incomplete request to the parser (blank lines before
    // a request line are allowed), so the head timeout is what ends them.
    let server =
        Running::start(plain_server().header_read_timeout(Duration::from_millis(500))).await;

    // Random-looking bytes, then a close.
    let mut garbage = Vec::with_capacity(64 * 1024);
    let mut x: u32 = 0x9E37_79B9;
    for _ in 0..garbage.capacity() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        garbage.push(x.to_le_bytes()[0]);
    }
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    // The server may close while we still write; that is its right.
    let _ = stream.write_all(&garbage).await;
    wait_closed(&mut stream).await;

    // A request line that never ends, far beyond the head limit.
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    let _ = stream.write_all(b"GET /").await;
    let _ = stream.write_all(&vec![b'a'; 256 * 1024]).await;
    wait_closed(&mut stream).await;

    // Malformed but printable requests.
    for bad in [
        &b"\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET /live HTTP/9.9\r\n\r\n",
        b"GET /live HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET /live HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /live HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ] {
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        let _ = stream.write_all(bad).await;
        wait_closed(&mut stream).await;
    }

    // Hang-ups: before sending anything, and in the middle of a request.
    drop(TcpStream::connect(server.addr).await.expect("connect"));
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHo")
        .await
        .expect("write");
    drop(stream);
    // A client that asks for /metrics and leaves without reading it.
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n")
        .await
        .expect("write");
    drop(stream);

    let reply = get(server.addr, "/live").await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "live\n"));
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn slow_request_heads_are_cut_off() {
    let server =
        Running::start(plain_server().header_read_timeout(Duration::from_millis(200))).await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream
        .write_all(b"GET /live HTTP/1.1\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    wait_closed(&mut stream).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    // An idle keep-alive connection is cut off the same way.
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_reply(&mut stream).await.status, 200);
    wait_closed(&mut stream).await;
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn connections_beyond_the_limit_are_closed_and_counted() {
    let server = Running::start(plain_server().max_connections(1)).await;

    // Holds the only slot: a keep-alive connection the server has answered.
    let mut holder = TcpStream::connect(server.addr).await.expect("connect");
    holder
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_reply(&mut holder).await.status, 200);

    let mut extra = TcpStream::connect(server.addr).await.expect("connect");
    let _ = extra
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .await;
    let mut seen = Vec::new();
    let closed = async {
        let mut chunk = [0u8; 1024];
        loop {
            match extra.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
    };
    timeout(DEADLINE, closed)
        .await
        .expect("extra connection closed");
    assert!(
        seen.is_empty(),
        "the extra connection got an answer: {seen:?}"
    );

    // Once the holder leaves, its slot frees up and the rejection shows.
    drop(holder);
    let rejected = eventually("a free admin connection slot", DEADLINE, || async {
        let mut stream = TcpStream::connect(server.addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut probe = [0u8; 1];
        // A rejected probe reads EOF or a reset; an accepted one reads the reply.
        match stream.peek(&mut probe).await {
            Ok(1) => Some(read_reply(&mut stream).await),
            _ => None,
        }
    })
    .await;
    assert_eq!(rejected.status, 200);
    assert!(
        value(&rejected.body, "admin_connections_rejected_total") >= 1,
        "{}",
        rejected.body
    );
    assert_eq!(
        value(&rejected.body, "admin_connections_open"),
        1,
        "only the scrape itself"
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn shutdown_makes_serve_return_and_closes_the_listener() {
    let server = Running::start(plain_server()).await;
    let addr = server.addr;
    assert_eq!(get(addr, "/live").await.status, 200);

    // An idle keep-alive connection must not hold shutdown up.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_reply(&mut idle).await.status, 200);

    let started = Instant::now();
    server
        .stop()
        .await
        .expect("serve returns Ok after shutdown");
    assert!(
        started.elapsed() < ballast_admin::DEFAULT_SHUTDOWN_GRACE,
        "an idle connection delayed shutdown by {:?}",
        started.elapsed()
    );
    wait_closed(&mut idle).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener still open"
    );
}

// The readiness check blocks a worker thread, so the runtime needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_request_in_flight_finish() {
    // /ready blocks inside the readiness check until the test releases it, so
    // the request is in flight when shutdown starts.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let entered_tx = std::sync::Mutex::new(entered_tx);
    let release_rx = std::sync::Mutex::new(release_rx);
    let readiness = Readiness::from_fn(move || {
        let _ = entered_tx.lock().map(|tx| tx.send(()));
        let _ = release_rx.lock().map(|rx| rx.recv_timeout(DEADLINE));
        true
    });
    let server = Running::start(AdminServer::new(state(Registry::default(), readiness))).await;
    let addr = server.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/ready").await });
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(DEADLINE))
        .await
        .expect("join")
        .expect("readiness check entered");

    let stopping = tokio::spawn(server.stop());
    // Shutdown has begun once the listener is closed.
    eventually("the listener to close", DEADLINE, || async {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
    assert!(
        !stopping.is_finished(),
        "serve returned with a request in flight"
    );
    release_tx.send(()).expect("release");

    let reply = timeout(DEADLINE, in_flight)
        .await
        .expect("in-flight reply")
        .expect("join");
    assert_eq!((reply.status, reply.body.as_str()), (200, "ready\n"));
    timeout(DEADLINE, stopping)
        .await
        .expect("stop within deadline")
        .expect("join")
        .expect("clean stop");
}

/// The value of the first sample of `name` (labelled or not) as a float.
fn float(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no sample {name} in:\n{body}"))
}

#[tokio::test]
async fn process_metrics_and_build_info_follow_prometheus_conventions() {
    let mut registry = Registry::default();
    ballast_admin::register_memory_metrics(&mut registry);
    ballast_admin::register_process_metrics(&mut registry);
    ballast_admin::register_build_info(&mut registry, "proxy", "1.2.3");
    let server = Running::start(AdminServer::new(state(registry, Readiness::always()))).await;
    let body = get(server.addr, "/metrics").await.body;

    assert!(
        body.contains("# TYPE process_cpu_seconds counter\n"),
        "{body}"
    );
    assert!(float(&body, "process_cpu_seconds_total") >= 0.0);
    let open = float(&body, "process_open_fds");
    let max = float(&body, "process_max_fds");
    assert!(open >= 3.0 && open <= max, "open {open}, max {max}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let start = float(&body, "process_start_time_seconds");
    assert!(
        start > now - 3600.0 && start <= now + 60.0,
        "started at {start}, now {now}"
    );
    assert!(
        body.contains("\nproxy_build_info{version=\"1.2.3\"} 1\n"),
        "{body}"
    );

    // Valid exposition: every metric family is described once, and no
    // sample belongs to two families.
    let mut families = std::collections::BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().expect("a name");
            assert!(families.insert(name.to_string()), "{name} twice:\n{body}");
        }
    }
    for family in &families {
        let clashing: Vec<_> = families
            .iter()
            .filter(|other| {
                *other != family
                    && ["_total", "_created", "_bucket", "_count", "_sum", "_info"]
                        .iter()
                        .any(|suffix| **other == format!("{family}{suffix}"))
            })
            .collect();
        assert!(clashing.is_empty(), "{family} clashes with {clashing:?}");
    }
    assert!(body.ends_with("# EOF\n"));
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn post_shutdown_from_loopback_makes_the_request_and_the_controller_has_none() {
    let shutdown = ballast_admin::ShutdownRequest::new();
    let with = state(Registry::default(), Readiness::always()).with_shutdown(shutdown.clone());
    let server = Running::start(AdminServer::new(with)).await;
    assert_eq!(get(server.addr, "/shutdown").await.status, 405);
    let reply = request(server.addr, "POST", "/shutdown").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    timeout(DEADLINE, shutdown.requested())
        .await
        .expect("POST /shutdown fires the request");
    server.stop().await.expect("clean stop");

    // An admin server without a shutdown request (the controller's) has no such path.
    let server = Running::start(plain_server()).await;
    assert_eq!(request(server.addr, "POST", "/shutdown").await.status, 404);
    server.stop().await.expect("clean stop");
}

/// One of this host's addresses that is not loopback (the source address of
/// its default route), if it has one.
fn host_address() -> Option<std::net::IpAddr> {
    // A UDP "connect" sends nothing: it only picks the route and source.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test]
async fn a_peer_off_the_host_reaches_only_live_ready_and_metrics() {
    let Some(ip) = host_address() else {
        // The decision itself is table-tested next to `route`; this needs
        // an address to come from.
        assert!(
            std::env::var_os("CI").is_none(),
            "no non-loopback address on this CI machine"
        );
        eprintln!("SKIPPED: no non-loopback address on this machine");
        return;
    };
    let shutdown = ballast_admin::ShutdownRequest::new();
    let with = state(Registry::default(), Readiness::always()).with_shutdown(shutdown.clone());
    // Every interface, as the proxy's admin listens by default.
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(AdminServer::new(with).serve(listener, async {
        let _ = stopped.await;
    }));
    // Connecting to the host's own address: the peer is that address.
    let off_host = SocketAddr::new(ip, port);
    for path in ["/live", "/ready", "/metrics"] {
        let reply = get(off_host, path).await;
        assert_eq!(reply.status, 200, "GET {path} from {ip}: {}", reply.body);
    }
    let reply = request(off_host, "POST", "/shutdown").await;
    assert_eq!(
        reply.status, 403,
        "POST /shutdown from {ip}: {}",
        reply.body
    );
    for path in ["/", "/debug", "/live/", "/metricsx"] {
        assert_eq!(
            get(off_host, path).await.status,
            404,
            "GET {path} from {ip}"
        );
    }
    // The same server from loopback: /shutdown works.
    let reply = request(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "POST",
        "/shutdown",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    timeout(DEADLINE, shutdown.requested())
        .await
        .expect("POST /shutdown from loopback fires the request");
    let _ = stop.send(());
    timeout(DEADLINE, task)
        .await
        .expect("serve returns")
        .expect("no panic")
        .expect("clean stop");
}
