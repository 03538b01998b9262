//! The proxy's bounds that a well-behaved but heavy client meets, with real
//! processes on loopback: running out of file descriptors pauses accepts
//! instead of failing; HTTP/1 connections per endpoint are bounded; idle
//! client connections are closed (HTTP/2 by the idle timeout, HTTP/1 by the
//! header read timeout). Hostile peers are in `proxy_hostile.rs`.

use ballast_testsupport as support;

use http::StatusCode;
use std::time::Duration;
use support::{
    eventually,
    proxy::{pods_of, start_backends, Cluster, Http1, Mesh, Proxy, H2, WEB_PORT},
    Controller, DEADLINE,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::Command,
};

/// File descriptors the proxy may have: enough to start and serve a few
/// connections, far fewer than the connections the test opens.
const FD_LIMIT: u32 = 64;
const FLOOD: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_pauses_accepts_and_the_proxy_recovers() {
    let cluster = Cluster::new();
    let backends = start_backends("web", 1).await;
    cluster.pods("web", &pods_of(&backends));
    cluster.service("web", "web", "127.0.0.100", WEB_PORT);
    let controller = Controller::start(cluster.path(), &[]).await;

    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={FD_LIMIT}:{FD_LIMIT}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_ballast"))
        .arg("proxy")
        .args(["--destination-addr", &controller.grpc.to_string()])
        .arg("--identity-disabled")
        .args(["--outbound-addr", "127.0.0.1:0"])
        .args(["--inbound-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"]);
    let mut proxy = Proxy::from_command(cmd, 0).await;
    let web = support::proxy::authority("web", WEB_PORT);
    eventually("a 200 through the proxy", || async {
        let a = support::proxy::get(proxy.outbound, &web, "/").await.ok()?;
        (a.status == StatusCode::OK).then_some(())
    })
    .await;

    // Far more connections than descriptors: they wait in detection.
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        match TcpStream::connect(proxy.outbound).await {
            Ok(s) => flood.push(s),
            Err(e) => panic!("connect to the proxy: {e}"),
        }
    }
    eventually("the proxy out of descriptors", || async {
        (proxy.open_fds() >= FD_LIMIT as usize - 1).then_some(())
    })
    .await;
    assert!(
        proxy.process.child.try_wait().expect("try_wait").is_none(),
        "the proxy exited when out of descriptors; log:\n{}",
        proxy.process.log()
    );
    drop(flood);

    // Descriptors come back: the proxy serves again and says what happened.
    let m = eventually("the proxy answers /metrics again", || async {
        let a = support::proxy::get(proxy.admin, "admin", "/metrics")
            .await
            .ok()?;
        (a.status == StatusCode::OK).then(|| support::proxy::Metrics::parse(&a.text()))
    })
    .await;
    assert!(
        m.sum("listener_accept_errors_total", &[]) > 0.0,
        "no accept errors counted: {}",
        m.text
    );
    eventually("a 200 through the proxy after the flood", || async {
        let a = support::proxy::get(proxy.outbound, &web, "/").await.ok()?;
        (a.status == StatusCode::OK).then_some(())
    })
    .await;
    let warned = proxy.process.logs_containing("out of file descriptors");
    assert!(
        !warned.is_empty() && warned.len() <= 3,
        "the accept errors are logged, and not once per error: {warned:?}"
    );
    assert!(proxy.process.child.try_wait().expect("try_wait").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connections_per_endpoint_are_bounded() {
    let mesh = Mesh::start(
        1,
        &[
            "--max-connections-per-endpoint",
            "2",
            "--http-failfast-timeout",
            "500ms",
        ],
    )
    .await;
    mesh.backends[0].set_delay(Duration::from_millis(1500));
    let web = mesh.web();
    let outbound = mesh.proxy.outbound;
    let requests: Vec<_> = (0..5)
        .map(|_| {
            let web = web.clone();
            tokio::spawn(async move {
                let mut c = Http1::connect(outbound).await?;
                c.get(&web, "/slow").await
            })
        })
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for r in requests {
        let a = r.await.expect("task").expect("an answer");
        match a.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(
                    a.header("l5d-proxy-error"),
                    Some("max_connections_per_endpoint"),
                    "{a:?}"
                );
                refused += 1;
            }
            other => panic!("unexpected status {other}: {a:?}"),
        }
    }
    assert_eq!((ok, refused), (2, 3), "two connections, two answers");
    let m = mesh.proxy.metrics().await;
    assert_eq!(
        m.sum(
            "proxy_errors_total",
            &[("error", "max_connections_per_endpoint")]
        ),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_client_connections_are_closed() {
    let mesh = Mesh::start(
        1,
        &[
            "--http-idle-timeout",
            "500ms",
            "--http1-header-read-timeout",
            "500ms",
        ],
    )
    .await;
    let web = mesh.web();

    // HTTP/2: GOAWAY after the idle timeout; counted.
    let h2 = H2::connect(mesh.proxy.outbound).await.expect("h2");
    assert_eq!(h2.get(&web, "/").await.expect("h2").status, StatusCode::OK);
    eventually("the idle HTTP/2 connection closed", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("http_idle_closed_total", &[]) >= 1.0).then_some(())
    })
    .await;
    assert!(h2.get(&web, "/").await.is_err(), "the connection is gone");

    // HTTP/1: an idle keep-alive connection closes at the header read timeout.
    let mut s = sent_get(mesh.proxy.outbound, &web).await;
    let started = tokio::time::Instant::now();
    let mut buf = vec![0; 64 * 1024];
    let mut read = 0;
    loop {
        let n = tokio::time::timeout(DEADLINE, s.read(&mut buf[read..]))
            .await
            .expect("the proxy closes the idle connection in time")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        read += n;
    }
    let head = String::from_utf8_lossy(&buf[..read]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let idle_for = started.elapsed();
    assert!(
        idle_for >= Duration::from_millis(400) && idle_for < Duration::from_secs(5),
        "closed after {idle_for:?}"
    );
}

/// Established TCP connections to `addr` on this host.
fn established_to(addr: std::net::SocketAddr) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-Htn", "state", "established", "dst", &addr.to_string()])
        .output()
        .expect("run ss (iproute2)");
    assert!(out.status.success(), "ss failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_endpoint_connections_are_closed_after_the_pool_idle_timeout() {
    // The target stays resolved far longer than the test: only the pool's
    // own timeout can close the connections.
    let mesh = Mesh::start(
        1,
        &[
            "--http1-pool-idle-timeout",
            "300ms",
            "--discovery-idle-timeout",
            "120s",
        ],
    )
    .await;
    let backend = mesh.backends[0].addr();
    let web = mesh.web();
    // Several at once: several pooled connections to the endpoint.
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let web = web.clone();
            let outbound = mesh.proxy.outbound;
            tokio::spawn(async move { support::proxy::get(outbound, &web, "/").await })
        })
        .collect();
    for r in requests {
        let a = r.await.expect("task").expect("answer");
        assert_eq!(a.status, StatusCode::OK);
    }
    assert!(
        established_to(backend) >= 1,
        "pooled connections to the endpoint"
    );
    // Nobody uses the pool again: the proxy's sweep closes them within its
    // period (1 s) of the timeout, long before the backend would give up on
    // them (10 s and more).
    let closed = tokio::time::timeout(Duration::from_secs(4), async {
        while established_to(backend) > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "{} idle connections to the endpoint still open after 4 s",
        established_to(backend)
    );
}

/// A connection to `addr` that has sent one `GET /` for `host`.
async fn sent_get(addr: std::net::SocketAddr, host: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET / HTTP/1.1\r\nhost: {host}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    s
}

/// Reads one whole HTTP/1 response with a `content-length` from `s`.
async fn read_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                return text;
            }
        }
        let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
            .await
            .expect("the response in time")
            .expect("read");
        assert!(n > 0, "the proxy closed mid-response: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http1_connections_park_and_keep_serving() {
    let mesh = Mesh::start(1, &["--http1-park-after", "100ms"]).await;
    let web = mesh.web();
    let src = [("direction", "outbound"), ("peer", "src")];
    let opened_before = mesh.proxy.metrics().await.sum("tcp_open_total", &src);
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = Http1::connect(mesh.proxy.outbound).await.expect("connect");
        assert_eq!(
            c.get(&web, "/").await.expect("first").status,
            StatusCode::OK
        );
        clients.push(c);
    }
    eventually("the three idle connections parked", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("http1_parked_connections", &[]) == 3.0).then_some(())
    })
    .await;
    // Each parked connection serves its next requests as before.
    for c in &mut clients {
        for _ in 0..2 {
            assert_eq!(
                c.get(&web, "/").await.expect("parked").status,
                StatusCode::OK
            );
        }
    }
    let m = mesh.proxy.metrics().await;
    let opened = m.sum("tcp_open_total", &src) - opened_before;
    assert_eq!(opened, 3.0, "no client reconnected: {}", m.text);

    // A head that is partway in when the connection would park is kept.
    let mut s = sent_get(mesh.proxy.outbound, &web).await;
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    s.write_all(b"GET / HTTP/1.1\r\nho").await.expect("write");
    // Past several park periods with the head unfinished.
    let m = mesh.proxy.metrics().await;
    let parked_before = m.sum("http1_parked_connections", &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.write_all(format!("st: {web}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let second = read_response(&mut s).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(parked_before <= 3.0);

    // A parked connection whose client leaves is gone from the gauge.
    drop(clients);
    drop(s);
    eventually("closed connections leave the gauge", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("http1_parked_connections", &[]) == 0.0).then_some(())
    })
    .await;
}
