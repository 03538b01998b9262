//! The inbound side and shutdown, with real processes on loopback: HTTP/1,
//! HTTP/2 and opaque TCP through the inbound listener to the workload port;
//! two hops (proxy A outbound to proxy B inbound); SIGTERM finishing
//! in-flight requests and exiting 0.
//!
//! Without iptables, connections reach the inbound listener directly, so
//! `--inbound-forward-port` names the workload port.

use ballast_testsupport as support;

use ballast_demo::backend::Backend;
use http::StatusCode;
use std::{net::SocketAddr, time::Duration};
use support::{
    backends::echo,
    eventually,
    proxy::{authority, Cluster, Http1, Mesh, Proxy, H2},
    Controller, DEADLINE,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Nothing listens here: the inbound side needs no controller.
const NO_CONTROLLER: &str = "127.0.0.1:9";

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

async fn inbound_proxy(workload_port: u16, extra: &[&str]) -> Proxy {
    let port = workload_port.to_string();
    let mut flags = vec!["--inbound-forward-port", port.as_str()];
    flags.extend_from_slice(extra);
    Proxy::start(NO_CONTROLLER.parse().expect("addr"), &flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_http1_and_http2_reach_the_workload_port_and_are_counted() {
    let app = Backend::start("app", loopback()).await.expect("backend");
    // The pod's own identity, as the sidecar's environment gives it.
    let pod = [
        "--pod-namespace",
        "shop",
        "--pod-name",
        "web-5d8f9-abcde",
        "--pod-service-account",
        "web-sa",
        "--pod-owner",
        "deployment/web",
        "--pod-template-hash",
        "5d8f9",
    ];
    let proxy = inbound_proxy(app.addr().port(), &pod).await;

    let mut h1 = Http1::connect(proxy.inbound).await.expect("connect h1");
    for _ in 0..5 {
        let a = h1.get("app.example", "/one").await.expect("h1 request");
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.backend(), Some("app"), "{a:?}");
    }
    let h2 = H2::connect(proxy.inbound).await.expect("connect h2");
    for _ in 0..5 {
        let a = h2.get("app.example", "/two").await.expect("h2 request");
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.backend(), Some("app"), "{a:?}");
    }
    assert_eq!(app.requests(), 10);

    let m = proxy.metrics().await;
    let inbound = [("direction", "inbound")];
    assert_eq!(m.sum("request_total", &inbound), 10.0, "{}", m.text);
    assert_eq!(
        m.sum(
            "response_total",
            &[("direction", "inbound"), ("status_code", "200")]
        ),
        10.0,
        "{}",
        m.text
    );
    // Inbound series name this pod as their destination.
    let this_pod = [
        ("direction", "inbound"),
        ("dst_namespace", "shop"),
        ("dst_pod", "web-5d8f9-abcde"),
        ("dst_serviceaccount", "web-sa"),
        ("dst_deployment", "web"),
        ("dst_pod_template_hash", "5d8f9"),
    ];
    assert_eq!(m.sum("request_total", &this_pod), 10.0, "{}", m.text);
    let src = [this_pod.as_slice(), &[("peer", "src")]].concat();
    assert!(m.sum("tcp_open_total", &src) >= 2.0, "{}", m.text);
    assert_eq!(m.sum("request_total", &[("direction", "outbound")]), 0.0);
    assert!(
        m.sum(
            "tcp_open_total",
            &[("direction", "inbound"), ("peer", "src")]
        ) >= 2.0,
        "{}",
        m.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_opaque_ports_and_undetected_bytes_are_forwarded_as_tcp() {
    let echo = echo(loopback()).await.expect("echo");
    let port = echo.addr().port().to_string();
    // Marked opaque: forwarded without waiting for detection.
    let opaque = inbound_proxy(echo.addr().port(), &["--inbound-opaque-ports", &port]).await;
    // Not marked: detected as not HTTP, then forwarded the same way.
    let detected = inbound_proxy(echo.addr().port(), &["--inbound-opaque-ports", ""]).await;
    for proxy in [&opaque, &detected] {
        let mut s = tokio::net::TcpStream::connect(proxy.inbound)
            .await
            .expect("connect");
        let payload = b"\x00\x01 not http at all \xff".repeat(1000);
        s.write_all(&payload).await.expect("write");
        let mut back = vec![0; payload.len()];
        tokio::time::timeout(DEADLINE, s.read_exact(&mut back))
            .await
            .expect("echo in time")
            .expect("read echo");
        assert_eq!(back, payload);
        drop(s);
        let m = eventually("the inbound TCP connection closed and counted", || async {
            let m = proxy.metrics().await;
            let closed = m.sum(
                "tcp_close_total",
                &[("direction", "inbound"), ("peer", "dst")],
            );
            (closed >= 1.0).then_some(m)
        })
        .await;
        assert!(
            m.sum(
                "tcp_read_bytes_total",
                &[("direction", "inbound"), ("peer", "src")]
            ) >= payload.len() as f64
        );
        assert_eq!(m.sum("request_total", &[("direction", "inbound")]), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_refuses_unredirected_connections_without_a_forward_port() {
    let proxy = Proxy::start(NO_CONTROLLER.parse().expect("addr"), &[]).await;
    let mut s = tokio::net::TcpStream::connect(proxy.inbound)
        .await
        .expect("connect");
    let _ = s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum(
            "proxy_errors_total",
            &[("direction", "inbound"), ("error", "no_original_dst")]
        ),
        1.0,
        "{}",
        m.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hops_go_through_proxy_a_outbound_and_proxy_b_inbound() {
    let app = Backend::start("web-b", loopback()).await.expect("backend");
    let b = inbound_proxy(app.addr().port(), &[]).await;
    // The pod's address is proxy B's inbound listener, as iptables would make it.
    let cluster = Cluster::new();
    cluster.pods("web", &[("web-b", b.inbound)]);
    cluster.service("web", "web", "127.0.0.100", 80);
    let controller = Controller::start(cluster.path(), &[]).await;
    let a = Proxy::start(controller.grpc, &[]).await;

    let web = authority("web", 80);
    let mut conn = eventually("a 200 through both proxies", || async {
        let mut c = Http1::connect(a.outbound).await.ok()?;
        let answer = c.get(&web, "/").await.ok()?;
        (answer.status == StatusCode::OK).then_some(c)
    })
    .await;
    for _ in 0..9 {
        let answer = conn.get(&web, "/hop").await.expect("request");
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.backend(), Some("web-b"));
    }
    let served = app.requests() as f64;
    assert!(served >= 10.0);
    let ma = a.metrics().await;
    let mb = b.metrics().await;
    assert_eq!(
        ma.sum(
            "request_total",
            &[("direction", "outbound"), ("dst_pod", "web-b")]
        ),
        served,
        "{}",
        ma.text
    );
    assert_eq!(
        mb.sum("request_total", &[("direction", "inbound")]),
        served,
        "{}",
        mb.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_refuses_new_ones_and_exits_zero() {
    let mut mesh = Mesh::start(1, &["--shutdown-grace", "10s"]).await;
    let before = mesh
        .proxy
        .metrics()
        .await
        .sum("request_total", &[("direction", "outbound")]);
    mesh.backends[0].set_delay(Duration::from_millis(1500));
    let outbound = mesh.proxy.outbound;
    let web = mesh.web();
    let in_flight = tokio::spawn(async move {
        let mut c = Http1::connect(outbound).await?;
        c.get(&web, "/slow").await
    });
    eventually("the slow request reached the endpoint", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("request_total", &[("direction", "outbound")]) > before).then_some(())
    })
    .await;

    let pid = mesh.proxy.pid().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(status.success());

    eventually("new connections refused after SIGTERM", || async {
        tokio::net::TcpStream::connect(outbound)
            .await
            .err()
            .map(|_| ())
    })
    .await;
    let answer = tokio::time::timeout(DEADLINE, in_flight)
        .await
        .expect("the in-flight request finished in time")
        .expect("task")
        .expect("the in-flight request was answered");
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let exit = tokio::time::timeout(DEADLINE, mesh.proxy.process.child.wait())
        .await
        .expect("the proxy exited in time")
        .expect("wait");
    assert_eq!(
        exit.code(),
        Some(0),
        "exit {exit:?}; log:\n{}",
        mesh.proxy.process.log()
    );
}
