//! The rebuilt proxy core, at process level: last-known endpoints outlive
//! idle targets while the controller is away, names outside the mesh and
//! services that do not exist are answered at once, and a burst of HTTP/2
//! requests to a cold endpoint opens one connection.

use ballast_testsupport as support;

use http::StatusCode;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use support::{
    eventually,
    proxy::{authority, get, Cluster, Mesh, Proxy, H2, WEB_PORT},
    Controller,
};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn a_target_idle_past_the_discovery_timeout_keeps_its_endpoints_while_the_controller_is_down()
{
    let mut mesh = Mesh::start(2, &["--discovery-idle-timeout", "1s"]).await;
    mesh.controller.signal("KILL");
    mesh.controller.wait(Duration::from_secs(10)).await;
    // The target's balancer and stream are dropped once idle.
    eventually("the idle target's resolution to close", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("discovery_resolutions", &[]) == 0.0).then_some(())
    })
    .await;
    let a = get(mesh.proxy.outbound, &mesh.web(), "/")
        .await
        .expect("an answer");
    assert_eq!(
        a.status,
        StatusCode::OK,
        "a target resolved before the outage is served from its last-known endpoints: {a:?}\n{}",
        mesh.proxy.process.log()
    );
    eventually("the age of the data in use to show", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("discovery_stale_seconds", &[]) >= 1.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn names_outside_the_mesh_and_missing_services_are_answered_at_once() {
    // A failfast of 20 s: any answer within 10 s came without waiting it out.
    let mesh = Mesh::start(1, &["--http-failfast-timeout", "20s"]).await;
    let cases = [
        (
            "example.com",
            StatusCode::BAD_REQUEST,
            "not_a_mesh_authority",
        ),
        (
            "nosuch.shop.svc.cluster.local",
            StatusCode::SERVICE_UNAVAILABLE,
            "service_not_found",
        ),
    ];
    for (host, status, reason) in cases {
        let started = Instant::now();
        let a = get(mesh.proxy.outbound, host, "/")
            .await
            .expect("an answer");
        let took = started.elapsed();
        assert_eq!(a.status, status, "{host}: {a:?}");
        assert_eq!(
            a.headers
                .get("l5d-proxy-error")
                .and_then(|v| v.to_str().ok()),
            Some(reason),
            "{host}"
        );
        assert!(took < Duration::from_secs(10), "{host} took {took:?}");
        let m = mesh.proxy.metrics().await;
        assert!(
            m.sum("proxy_errors_total", &[("error", reason)]) >= 1.0,
            "{reason} counted"
        );
    }
    if let Some(page) = support::openmetrics::check_page(mesh.proxy.admin, "proxy").await {
        page.assert_has("proxy_errors", "counter");
    }
    // The mesh's own services keep their short names.
    let web = mesh.web();
    let short = format!("{}:{WEB_PORT}", web.split(".svc").next().unwrap_or(&web));
    let a = get(mesh.proxy.outbound, &short, "/")
        .await
        .expect("an answer");
    assert_eq!(a.status, StatusCode::OK, "{short}: {a:?}");
}

/// Accepts connections, counts them, and only after `delay` passes their
/// bytes on to `backend`: an endpoint slow to finish its handshake.
async fn slow_front(
    bind: SocketAddr,
    backend: SocketAddr,
    delay: Duration,
) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind(bind).await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut server) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_burst_of_http2_requests_to_a_cold_endpoint_opens_one_connection() {
    let backend = ballast_demo::Backend::start("web-a", "127.0.0.2:0".parse().unwrap())
        .await
        .expect("backend");
    let (front, accepted) = slow_front(
        "127.0.0.3:0".parse().unwrap(),
        backend.addr(),
        Duration::from_millis(500),
    )
    .await;
    let cluster = Cluster::new();
    cluster.pods("web", &[("web-a".to_string(), front)]);
    cluster.service("web", "web", "127.0.0.100", WEB_PORT);
    let controller = Controller::start(cluster.path(), &[]).await;
    let proxy = Proxy::start(controller.grpc, &["--http-failfast-timeout", "20s"]).await;
    let client = H2::connect(proxy.outbound).await.expect("h2 to the proxy");
    let web = authority("web", WEB_PORT);
    let burst = (0..50).map(|_| client.get(&web, "/"));
    let answers = futures_util::future::join_all(burst).await;
    for a in &answers {
        let a = a.as_ref().expect("an answer");
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        1,
        "50 concurrent HTTP/2 requests to one cold endpoint open one connection"
    );
}
