//! The demo backend over real HTTP/1.1 and HTTP/2 connections on loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ballast_demo::Backend;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

mod support;
use ballast_testkit::eventually;
use support::{any_port, DEADLINE};

struct Answer {
    status: StatusCode,
    backend: Option<String>,
    body: String,
}

async fn h1(addr: SocketAddr) -> http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("h1 handshake");
    tokio::spawn(connection);
    sender
}

async fn h2(addr: SocketAddr) -> http2::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

fn request(method: Method, path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("http://backend.test{path}"))
        .body(Full::new(Bytes::new()))
        .expect("request")
}

async fn read(response: http::Response<hyper::body::Incoming>) -> Answer {
    let status = response.status();
    let backend = response
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Answer {
        status,
        backend,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn send1(sender: &mut http1::SendRequest<Full<Bytes>>, method: Method, path: &str) -> Answer {
    sender.ready().await.expect("connection ready");
    read(
        sender
            .send_request(request(method, path))
            .await
            .expect("response"),
    )
    .await
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    send1(&mut h1(addr).await, Method::GET, path).await
}

async fn post(addr: SocketAddr, path: &str) -> Answer {
    send1(&mut h1(addr).await, Method::POST, path).await
}

#[tokio::test]
async fn http1_keep_alive_answers_with_the_name() {
    let backend = Backend::start("web-a", any_port()).await.expect("start");
    assert_eq!(backend.name(), "web-a");
    assert_eq!(backend.addr().ip().to_string(), "127.0.0.1");
    assert_ne!(backend.addr().port(), 0);

    let mut sender = h1(backend.addr()).await;
    for i in 1..=3 {
        let answer = send1(&mut sender, Method::GET, "/anything?x=1").await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.backend.as_deref(), Some("web-a"));
        assert_eq!(answer.body, "web-a\n");
        assert_eq!(backend.requests(), i);
    }
}

#[tokio::test]
async fn http2_prior_knowledge_on_the_same_port() {
    let backend = Backend::start("web-b", any_port()).await.expect("start");
    let sender = h2(backend.addr()).await;
    // Concurrent streams on one connection.
    let mut answers = Vec::new();
    for _ in 0..8 {
        let mut sender = sender.clone();
        answers.push(tokio::spawn(async move {
            sender.ready().await.expect("ready");
            read(
                sender
                    .send_request(request(Method::GET, "/"))
                    .await
                    .expect("response"),
            )
            .await
        }));
    }
    for answer in answers {
        let answer = answer.await.expect("task");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.backend.as_deref(), Some("web-b"));
        assert_eq!(answer.body, "web-b\n");
    }
    assert_eq!(backend.requests(), 8);
    // And HTTP/1.1 still works beside it.
    assert_eq!(get(backend.addr(), "/").await.status, StatusCode::OK);
    assert_eq!(backend.requests(), 9);
}

#[tokio::test]
async fn delay_is_added_before_each_answer() {
    let backend = Backend::start("slow", any_port()).await.expect("start");
    let mut sender = h1(backend.addr()).await;
    let quick = Instant::now();
    send1(&mut sender, Method::GET, "/").await;
    let quick = quick.elapsed();

    backend.set_delay(Duration::from_millis(300));
    let slow = Instant::now();
    let answer = send1(&mut sender, Method::GET, "/").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        slow.elapsed() >= Duration::from_millis(300),
        "answered after {:?} with a 300 ms delay",
        slow.elapsed()
    );
    assert!(
        quick < Duration::from_millis(300),
        "undelayed answer took {quick:?}"
    );

    backend.set_delay(Duration::ZERO);
    let again = Instant::now();
    send1(&mut sender, Method::GET, "/").await;
    assert!(again.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn failure_rate_answers_500_and_counts_them() {
    let backend = Backend::start("flaky", any_port()).await.expect("start");
    let mut sender = h1(backend.addr()).await;

    backend.set_failure_rate(1.0);
    let answer = send1(&mut sender, Method::GET, "/").await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.backend.as_deref(), Some("flaky"));

    backend.set_failure_rate(0.5);
    let mut failed = 0;
    for _ in 0..20 {
        if send1(&mut sender, Method::GET, "/").await.status == StatusCode::INTERNAL_SERVER_ERROR {
            failed += 1;
        }
    }
    assert!(
        (9..=11).contains(&failed),
        "{failed} of 20 failed at rate 0.5"
    );

    backend.set_failure_rate(0.0);
    for _ in 0..5 {
        assert_eq!(
            send1(&mut sender, Method::GET, "/").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(backend.requests(), 26);
}

#[tokio::test]
async fn control_paths_steer_a_running_backend() {
    let backend = Backend::start("steered", any_port()).await.expect("start");
    let addr = backend.addr();

    let set = post(addr, "/_backend/delay?ms=250").await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    let start = Instant::now();
    assert_eq!(get(addr, "/").await.status, StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        post(addr, "/_backend/delay?ms=0").await.status,
        StatusCode::OK
    );

    assert_eq!(
        post(addr, "/_backend/fail?rate=1").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(addr, "/").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        post(addr, "/_backend/fail?rate=0").await.status,
        StatusCode::OK
    );
    assert_eq!(get(addr, "/").await.status, StatusCode::OK);

    let stats = get(addr, "/_backend/stats").await;
    assert_eq!(stats.status, StatusCode::OK);
    let stats: serde_json::Value = serde_json::from_str(&stats.body).expect("stats JSON");
    assert_eq!(stats["name"], "steered");
    // Control requests are not counted.
    assert_eq!(stats["requests"], 3);
    assert_eq!(backend.requests(), 3);
}

#[tokio::test]
async fn control_paths_reject_bad_requests() {
    let backend = Backend::start("strict", any_port()).await.expect("start");
    let addr = backend.addr();
    for path in [
        "/_backend/delay",
        "/_backend/delay?ms=-1",
        "/_backend/delay?ms=abc",
        "/_backend/delay?ms=60001",
        "/_backend/fail?rate=1.5",
        "/_backend/fail?rate=-0.1",
        "/_backend/fail?rate=NaN",
        "/_backend/fail",
    ] {
        assert_eq!(
            post(addr, path).await.status,
            StatusCode::BAD_REQUEST,
            "{path}"
        );
    }
    assert_eq!(
        get(addr, "/_backend/delay?ms=5").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        post(addr, "/_backend/stats").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        get(addr, "/_backend/nope").await.status,
        StatusCode::NOT_FOUND
    );
    // Nothing above changed the behaviour.
    assert_eq!(get(addr, "/").await.status, StatusCode::OK);
    assert_eq!(backend.requests(), 1);
}

#[tokio::test]
async fn request_bodies_are_drained_and_the_connection_kept() {
    let backend = Backend::start("sink", any_port()).await.expect("start");
    let stream = TcpStream::connect(backend.addr()).await.expect("connect");
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    for _ in 0..2 {
        // 8 MiB in 64 KiB chunks, chunked encoding.
        let chunks = (0..128).map(|_| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))
        });
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        let request = Request::builder()
            .method(Method::POST)
            .uri("http://backend.test/upload")
            .body(body)
            .expect("request");
        sender.ready().await.expect("connection kept alive");
        let answer = read(sender.send_request(request).await.expect("response")).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.body, "sink\n");
    }
    assert_eq!(backend.requests(), 2);
}

#[tokio::test]
async fn dropping_the_backend_stops_it_and_closes_connections() {
    let backend = Backend::start("gone", any_port()).await.expect("start");
    let addr = backend.addr();
    let mut sender = h1(addr).await;
    assert_eq!(
        send1(&mut sender, Method::GET, "/").await.status,
        StatusCode::OK
    );
    let empty = h2(addr).await;
    drop(backend);

    eventually("the listener to close", DEADLINE, || async {
        TcpStream::connect(addr).await.is_err()
    })
    .await;
    eventually("the HTTP/1.1 connection to close", DEADLINE, || async {
        sender.is_closed()
    })
    .await;
    eventually("the HTTP/2 connection to close", DEADLINE, || async {
        empty.is_closed()
    })
    .await;
}

#[tokio::test]
async fn unusable_names_are_refused() {
    for name in ["", "bad\nname", &"x".repeat(254)] {
        let error = Backend::start(name, any_port()).await.expect_err(name);
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    }
}

#[tokio::test]
async fn binds_other_loopback_addresses() {
    let bind: SocketAddr = "127.0.0.3:0".parse().expect("address");
    let backend = Backend::start("web-b", bind).await.expect("start");
    assert_eq!(backend.addr().ip(), bind.ip());
    assert_eq!(get(backend.addr(), "/").await.body, "web-b\n");
}
