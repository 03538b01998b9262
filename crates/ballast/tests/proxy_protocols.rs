//! `ballast proxy` in explicit mode, as a process on loopback: HTTP/1.1,
//! HTTP/2 with prior knowledge, gRPC (unary and server streaming, trailers
//! and error statuses intact) and opaque TCP, each to a mesh service resolved
//! through a real `ballast destination`.

use ballast_testsupport as support;

use http::{Request, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use std::{collections::BTreeSet, net::SocketAddr, time::Duration};
use support::{
    backends::{echo, GrpcHealth},
    proxy::{authority, random_bytes, Cluster, Http1, Mesh, Proxy, H2, NS},
    Controller, DEADLINE,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    HealthCheckResponse,
};

fn backend_names(mesh: &Mesh) -> BTreeSet<String> {
    mesh.backends.iter().map(|b| b.name().to_string()).collect()
}

#[tokio::test]
async fn http1_requests_are_balanced_to_the_service_endpoints() {
    let mesh = Mesh::start(3, &[]).await;
    let names = backend_names(&mesh);
    let mut conn = Http1::connect(mesh.proxy.outbound).await.unwrap();
    // One keep-alive connection, every Host spelling the contract names.
    let hosts = [
        mesh.web(),
        format!("web.{NS}.svc.cluster.local"),
        format!("web.{NS}"),
        format!("web.{NS}.svc"),
        format!("web.{NS}:80"),
    ];
    for i in 0..60 {
        let host = &hosts[i % hosts.len()];
        let a = conn.get(host, "/some/path?q=1").await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "Host {host}: {a:?}");
        let body = a.text();
        let name = body.trim_end();
        assert!(names.contains(name), "answered by {name:?}, not a web pod");
        assert_eq!(a.backend(), Some(name), "x-backend header matches the body");
    }
    let served: u64 = mesh.counts().iter().sum();
    assert!(served >= 60, "backends counted {served} requests");

    // The proxy counts what it carried, labelled by destination.
    let metrics = mesh.proxy.metrics().await;
    let total = metrics.sum("request_total", &[("dst_service", "web")]);
    assert!(
        total >= 60.0,
        "request_total{{dst_service=\"web\"}} = {total}; metric names: {:?}",
        metrics.names()
    );
    let ok = metrics.sum(
        "response_total",
        &[("dst_service", "web"), ("status_code", "200")],
    );
    assert!(ok >= 60.0, "response_total for 200s = {ok}");
}

#[tokio::test]
async fn http2_prior_knowledge_multiplexes_requests_on_one_connection() {
    let mesh = Mesh::start(3, &[]).await;
    let names = backend_names(&mesh);
    let conn = H2::connect(mesh.proxy.outbound).await.unwrap();
    let web = mesh.web();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let conn = conn.clone();
        let web = web.clone();
        tasks.spawn(async move { conn.get(&web, &format!("/stream/{i}")).await });
    }
    let mut seen = BTreeSet::new();
    while let Some(joined) = tasks.join_next().await {
        let a = joined.unwrap().unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        let name = a.text().trim_end().to_string();
        assert!(names.contains(&name), "answered by {name:?}");
        assert_eq!(a.backend(), Some(name.as_str()));
        seen.insert(name);
    }
    assert!(
        seen.len() >= 2,
        "64 concurrent streams reach several endpoints: {seen:?}"
    );
}

/// gRPC health servers on 127.0.0.2 and 127.0.0.3 behind service `grpc`.
async fn grpc_mesh() -> (Cluster, GrpcHealth, Controller, Proxy) {
    let cluster = Cluster::new();
    let health = GrpcHealth::start(&[
        "127.0.0.2:0".parse().unwrap(),
        "127.0.0.3:0".parse().unwrap(),
    ])
    .await
    .unwrap();
    cluster.pods(
        "grpc",
        &[("grpc-a", health.addrs[0]), ("grpc-b", health.addrs[1])],
    );
    cluster.service("grpc", "grpc", "127.0.0.101", 8080);
    let controller = Controller::start(cluster.path(), &[]).await;
    let proxy = Proxy::start(controller.grpc, &[]).await;
    (cluster, health, controller, proxy)
}

fn grpc_client(proxy: &Proxy, authority: &str) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.outbound))
        .unwrap()
        .origin(format!("http://{authority}").parse().unwrap())
        .connect_lazy();
    HealthClient::new(channel)
}

#[tokio::test]
async fn grpc_unary_streaming_and_error_statuses_pass_through() {
    let (_cluster, health, _controller, proxy) = grpc_mesh().await;
    let grpc = authority("grpc", 8080);
    let mut client = grpc_client(&proxy, &grpc);

    // Unary: the first calls may race discovery; wait for a first answer.
    let check = |service: &str| HealthCheckRequest {
        service: service.to_string(),
    };
    let started = std::time::Instant::now();
    let first = loop {
        match client.check(check("")).await {
            Ok(r) => break r.into_inner(),
            Err(status) => {
                assert!(
                    started.elapsed() < DEADLINE,
                    "no gRPC answer through the proxy: {status:?}\nproxy log:\n{}",
                    proxy.process.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(first.status, ServingStatus::Serving as i32);
    for _ in 0..20 {
        let r = client.check(check("")).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32);
    }

    // A non-OK status (a trailers-only answer) passes through with its code
    // and message.
    let err = client.check(check("nope")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(!err.message().is_empty(), "grpc-message kept: {err:?}");

    // Server streaming: each status change arrives as it happens.
    let mut watch = client.watch(check("")).await.unwrap().into_inner();
    let m = next(&mut watch).await;
    assert_eq!(m.status, ServingStatus::Serving as i32);
    health
        .reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let m = next(&mut watch).await;
    assert_eq!(m.status, ServingStatus::NotServing as i32);
    health
        .reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let m = next(&mut watch).await;
    assert_eq!(m.status, ServingStatus::Serving as i32);
    drop(watch);

    // The same unary call by hand: the answer's DATA is followed by real
    // trailers carrying grpc-status 0.
    let h2 = H2::connect(proxy.outbound).await.unwrap();
    let call = |service: &'static [u8]| {
        // Length-prefixed message: no compression, 4-byte length, protobuf.
        let mut body = vec![0u8];
        body.extend_from_slice(&(service.len() as u32).to_be_bytes());
        body.extend_from_slice(service);
        Request::post(format!("http://{grpc}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let a = h2.send(call(b"")).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    // HealthCheckResponse { status: SERVING }: field 1, varint 1.
    assert_eq!(&a.body[..], &[0, 0, 0, 0, 2, 0x08, 0x01], "{a:?}");
    let trailers = a.trailers.as_ref().expect("trailers arrive after the body");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..]),
        "{trailers:?}"
    );
    // HealthCheckRequest { service: "nope" }: field 1, length 4.
    let a = h2.send(call(b"\x0a\x04nope")).await.unwrap();
    let status = a
        .trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| a.headers.get("grpc-status"))
        .map(|v| v.as_bytes().to_vec());
    assert_eq!(status.as_deref(), Some(&b"5"[..]), "NOT_FOUND kept: {a:?}");

    // response_total names gRPC's status, as Linkerd's dashboards read it.
    let m = support::eventually("response_total with grpc_status_code 5", || async {
        let m = proxy.metrics().await;
        let not_found = m.sum(
            "response_total",
            &[("dst_service", "grpc"), ("grpc_status_code", "5")],
        );
        (not_found >= 2.0).then_some(m)
    })
    .await;
    let ok = m.sum(
        "response_total",
        &[("grpc_status_code", "0"), ("classification", "success")],
    );
    assert!(ok >= 20.0, "grpc_status_code 0: {ok}\n{}", m.text);
}

async fn next(watch: &mut tonic::Streaming<HealthCheckResponse>) -> HealthCheckResponse {
    tokio::time::timeout(DEADLINE, watch.message())
        .await
        .expect("a Watch message in time")
        .expect("Watch stream failed")
        .expect("Watch stream ended")
}

#[tokio::test]
async fn opaque_tcp_route_echoes_large_payloads_byte_for_byte() {
    let cluster = Cluster::new();
    let mut echoes = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        echoes.push(echo(format!("{ip}:0").parse().unwrap()).await.unwrap());
    }
    let pods: Vec<(String, SocketAddr)> = echoes
        .iter()
        .enumerate()
        .map(|(i, e)| (format!("echo-{i}"), e.addr()))
        .collect();
    cluster.pods("echo", &pods);
    cluster.service("echo", "echo", "127.0.0.102", 7000);
    let controller = Controller::start(cluster.path(), &[]).await;
    let route = format!("127.0.0.1:0={}", authority("echo", 7000));
    let proxy = Proxy::start(controller.grpc, &["--outbound-tcp", &route]).await;
    let listen = proxy.tcp_routes[0];

    // Six connections at once, 4 MiB each, written while the echo is read.
    const PAYLOAD: usize = 4 << 20;
    let mut tasks = tokio::task::JoinSet::new();
    for seed in 1..=6u64 {
        tasks.spawn(async move {
            let payload = random_bytes(seed, PAYLOAD);
            let mut stream = tokio::net::TcpStream::connect(listen).await.unwrap();
            let (mut read, mut write) = stream.split();
            let writer = async {
                write.write_all(&payload).await.unwrap();
                write.shutdown().await.unwrap();
            };
            let reader = async {
                let mut back = Vec::with_capacity(PAYLOAD);
                read.read_to_end(&mut back).await.map(|_| back)
            };
            let ((), back) = tokio::time::timeout(DEADLINE, async { tokio::join!(writer, reader) })
                .await
                .expect("echo within the deadline");
            let back = back.expect("read the echo");
            assert_eq!(back.len(), payload.len(), "seed {seed}: echoed length");
            if let Some(at) = back.iter().zip(&payload).position(|(a, b)| a != b) {
                panic!("seed {seed}: echo differs at byte {at}");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap_or_else(|e| panic!("{e}\nproxy log:\n{}", proxy.process.log()));
    }
    let accepted: u64 = echoes.iter().map(|e| e.accepted()).sum();
    assert_eq!(accepted, 6, "one upstream connection per client connection");

    // Byte counters cover at least what was sent each way.
    let metrics = proxy.metrics().await;
    let read = metrics.sum("tcp_read_bytes_total", &[]);
    let written = metrics.sum("tcp_write_bytes_total", &[]);
    assert!(
        read >= (6 * PAYLOAD) as f64 && written >= (6 * PAYLOAD) as f64,
        "tcp bytes read {read}, written {written}; names: {:?}",
        metrics.names()
    );
    // Each endpoint connection's lifetime is recorded when it closes.
    support::eventually("six connection durations", || async {
        let m = proxy.metrics().await;
        let closed = m.sum(
            "tcp_connection_duration_ms_count",
            &[("peer", "dst"), ("dst_service", "echo")],
        );
        (closed == 6.0).then_some(())
    })
    .await;
}

/// Issue 9, defect 1: a Prometheus server scrapes every 10-30 s, so a
/// service's counts must outlive the balancer that made them (dropped after
/// `--discovery-idle-timeout`) and continue, not restart, when it comes back.
#[tokio::test]
async fn request_counts_outlive_the_idle_balancer_and_continue_after_it() {
    let mesh = Mesh::start(1, &["--discovery-idle-timeout", "1s"]).await;
    let web = [("dst_service", "web")];
    let before = mesh.proxy.metrics().await.sum("request_total", &web);
    assert!(before >= 1.0, "the route's first requests are counted");

    // The balancer (and its resolution) goes once the target is idle.
    support::eventually("the idle target's resolution to close", || async {
        let m = mesh.proxy.metrics().await;
        (m.sum("discovery_resolutions", &[]) == 0.0).then_some(())
    })
    .await;
    let idle = mesh.proxy.metrics().await;
    assert_eq!(
        idle.sum("request_total", &web),
        before,
        "request_total for web is still exported, unchanged, after its balancer went:\n{}",
        idle.text
    );

    let a = support::proxy::get(mesh.proxy.outbound, &mesh.web(), "/")
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let after = mesh.proxy.metrics().await.sum("request_total", &web);
    assert_eq!(after, before + 1.0, "a new balancer counts on from there");
}

/// Linkerd's dashboards group outbound traffic by the destination's
/// workload: the controller's metric labels become `dst_*` labels on HTTP
/// series and on the TCP series of the connections HTTP requests use.
#[tokio::test]
async fn outbound_series_carry_the_destination_workload_as_linkerd_labels() {
    let cluster = Cluster::new();
    let backends = support::proxy::start_backends("web", 1).await;
    let addr = backends[0].addr();
    support::write_atomic(
        &cluster.path().join("pods-web.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-5d8f9-x7k2p\n  namespace: {NS}\n\
             \x20 labels: {{app: web, pod-template-hash: 5d8f9}}\n\
             \x20 ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d8f9, uid: u-1, controller: true}}]\n\
             spec:\n  serviceAccountName: web-sa\n\
             \x20 containers: [{{name: main, ports: [{{name: http, containerPort: {port}}}]}}]\n\
             status: {{phase: Running, podIP: {ip}, hostIP: 127.99.0.1}}\n",
            port = addr.port(),
            ip = addr.ip(),
        ),
    );
    cluster.service("web", "web", "127.0.0.100", 80);
    let controller = Controller::start(cluster.path(), &[]).await;
    let proxy = Proxy::start(controller.grpc, &[]).await;
    let web = authority("web", 80);
    support::eventually("a 200 for web through the proxy", || async {
        let a = support::proxy::get(proxy.outbound, &web, "/").await.ok()?;
        (a.status == StatusCode::OK).then_some(())
    })
    .await;

    let workload = [
        ("dst_deployment", "web"),
        ("dst_serviceaccount", "web-sa"),
        ("dst_pod_template_hash", "5d8f9"),
        ("dst_pod", "web-5d8f9-x7k2p"),
    ];
    let m = proxy.metrics().await;
    for family in ["request_total", "response_total"] {
        assert!(
            m.sum(family, &workload) >= 1.0,
            "{family} with {workload:?}:\n{}",
            m.text
        );
    }
    // The pool's connection to the pod counts as Linkerd's `peer="dst"`.
    let mut dst = vec![("peer", "dst")];
    dst.extend_from_slice(&workload);
    assert!(m.sum("tcp_open_total", &dst) >= 1.0, "{}", m.text);
    assert!(m.sum("tcp_write_bytes_total", &dst) >= 1.0, "{}", m.text);
}
