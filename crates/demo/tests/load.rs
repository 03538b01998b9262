//! The load client against real backends on loopback.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use ballast_demo::load::{LoadClient, LoadConfig, NO_BACKEND};
use ballast_demo::Backend;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

mod support;
use ballast_testkit::eventually;
use support::{any_port, DEADLINE};

#[tokio::test]
async fn steady_rate_attributed_to_the_backend() {
    let backend = Backend::start("web-a", any_port()).await.expect("backend");
    let mut config = LoadConfig::new(backend.addr(), "web.demo.svc.cluster.local");
    config.rps = 200;
    config.connections = 4;
    let load = LoadClient::start(config).expect("load");
    eventually("300 answers", DEADLINE, || async {
        load.snapshot().requests("web-a") >= 300
    })
    .await;
    let elapsed = load.started().elapsed();
    let snap = load.snapshot();
    let a = &snap.backends["web-a"];
    assert_eq!(a.successes, a.requests);
    assert_eq!(a.failures.total(), 0);
    let p99 = a.latency.quantile(0.99).expect("latency");
    assert!(p99 < Duration::from_millis(500), "p99 {p99:?} on loopback");
    // 300 requests at 200 rps take about 1.5 s; a client that ignored the
    // rate would be done in a few milliseconds.
    assert!(
        elapsed >= Duration::from_millis(1300),
        "300 requests after {elapsed:?}: faster than 200 rps"
    );
    // The backend saw what the client counted (give or take those in flight).
    assert!(backend.requests() >= a.requests);
    assert!(backend.requests() <= a.requests + 4);
    // The rolling window holds the recent ones only.
    let recent = load.window(Duration::from_secs(1)).requests("web-a");
    assert!(recent > 0 && recent <= 400, "{recent} in the last second");
    assert_eq!(load.last_error(), None);
}

#[tokio::test]
async fn backend_failures_are_counted_as_failures() {
    let backend = Backend::start("flaky", any_port()).await.expect("backend");
    backend.set_failure_rate(0.5);
    let mut config = LoadConfig::new(backend.addr(), "flaky.test");
    config.rps = 400;
    let load = LoadClient::start(config).expect("load");
    eventually("100 answers", DEADLINE, || async {
        load.snapshot().requests("flaky") >= 100
    })
    .await;
    let counts = load.snapshot().backends["flaky"].clone();
    let failed = counts.failures.status;
    assert_eq!(counts.successes + failed, counts.requests);
    let rate = failed as f64 / counts.requests as f64;
    assert!(
        (0.4..=0.6).contains(&rate),
        "{failed} of {} failed",
        counts.requests
    );
}

/// A stand-in for a proxy that cannot route: 503 with `l5d-proxy-error`.
async fn failing_proxy() -> SocketAddr {
    let listener = TcpListener::bind(any_port()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|_: Request<Incoming>| async {
                    let response = Response::builder()
                        .status(503)
                        .header("l5d-proxy-error", "no endpoints")
                        .body(Full::new(Bytes::new()))
                        .expect("response");
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn proxy_errors_and_refused_connections_are_failures() {
    let proxy = failing_proxy().await;
    let load = LoadClient::start(LoadConfig::new(proxy, "web.demo")).expect("load");
    eventually("proxy errors", DEADLINE, || async {
        load.snapshot().total().failures.proxy_error >= 10
    })
    .await;
    let snap = load.snapshot();
    assert_eq!(snap.total().successes, 0);
    assert_eq!(snap.requests(NO_BACKEND), snap.total().requests);
    drop(load);

    // Nothing listens there any more once the backend is dropped.
    let gone = Backend::start("gone", any_port()).await.expect("backend");
    let addr = gone.addr();
    drop(gone);
    eventually("the port to close", DEADLINE, || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    let load = LoadClient::start(LoadConfig::new(addr, "web.demo")).expect("load");
    eventually("transport errors", DEADLINE, || async {
        load.snapshot().total().failures.transport >= 10
    })
    .await;
    let error = load.last_error().expect("an error was noted");
    assert!(error.contains("cannot connect"), "{error}");
}

#[tokio::test]
async fn slow_answers_time_out() {
    let backend = Backend::start("slow", any_port()).await.expect("backend");
    backend.set_delay(Duration::from_secs(5));
    let mut config = LoadConfig::new(backend.addr(), "slow.test");
    config.timeout = Duration::from_millis(100);
    config.rps = 20;
    let load = LoadClient::start(config).expect("load");
    eventually("timeouts", DEADLINE, || async {
        load.snapshot().total().failures.timeout >= 3
    })
    .await;
    assert_eq!(load.snapshot().total().successes, 0);
}

#[test]
fn unusable_configurations_are_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut config = LoadConfig::new(any_port(), "web.demo");
        config.rps = 0;
        assert!(LoadClient::start(config).is_err());
        let config = LoadConfig::new(any_port(), "bad\nhost");
        assert!(LoadClient::start(config).is_err());
        let mut config = LoadConfig::new(any_port(), "web.demo");
        config.path = "not a path".to_string();
        assert!(LoadClient::start(config).is_err());
    });
}
