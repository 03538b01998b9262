//! The proxy's Tap API (`io.linkerd.proxy.tap.Tap/Observe`) as a process,
//! between a client and a demo backend: a tap sees exactly the requests it
//! matches with their method, path, status and latencies, and its limit ends
//! it; taps past `--tap-max-taps` and bad ones are refused; a tap client that
//! never reads loses events (counted) while traffic flows and the proxy's
//! memory stays bounded; with identity on, only `--tap-client-identity` taps.

use ballast_testsupport as support;

#[allow(dead_code)]
#[path = "hostile/common.rs"]
mod common;

use common::{Footprint, Peak, MB};
use http::StatusCode;
use linkerd2_proxy_api::{
    http_types::HttpMethod,
    tap::{
        observe_request::{self, r#match as m},
        tap_client::TapClient,
        tap_event::{self, http::Event as Http, ProxyDirection},
        ObserveRequest, TapEvent,
    },
};
use std::{net::SocketAddr, time::Duration};
use support::{
    eventually,
    proxy::{Http1, Mesh, Proxy},
    DEADLINE,
};
use tonic::{transport::Channel, Code};

/// The tap listener's address, from the proxy's log.
async fn tap_addr(proxy: &mut Proxy) -> SocketAddr {
    proxy.process.listening("tap listening on ", 1).await[0]
}

/// A plaintext tap client whose HTTP/2 windows are the protocol's default
/// (64 KiB), as a small client's would be.
async fn client(addr: SocketAddr) -> TapClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect to the tap listener");
    TapClient::new(channel)
}

fn wrap(x: m::Match) -> observe_request::Match {
    observe_request::Match { r#match: Some(x) }
}

fn path_prefix(p: &str) -> m::Match {
    m::Match::Http(m::Http {
        r#match: Some(m::http::Match::Path(m::http::StringMatch {
            r#match: Some(m::http::string_match::Match::Prefix(p.into())),
        })),
    })
}

fn everything() -> m::Match {
    m::Match::All(m::Seq { matches: vec![] })
}

fn observe(limit: u32, matching: m::Match) -> ObserveRequest {
    ObserveRequest {
        limit,
        r#match: Some(wrap(matching)),
        extract: None,
    }
}

async fn metric(proxy: &Proxy, name: &str, labels: &[(&str, &str)]) -> f64 {
    proxy.metrics().await.sum(name, labels)
}

async fn wait_open(proxy: &Proxy, n: f64) {
    eventually(&format!("{n} open taps"), || async {
        (metric(proxy, "tap_observations_open", &[]).await == n).then_some(())
    })
    .await;
}

/// Events until the stream ends (within the deadline).
async fn all_events(stream: &mut tonic::Streaming<TapEvent>) -> Vec<TapEvent> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, stream.message()).await {
            Ok(Ok(Some(e))) => out.push(e),
            Ok(Ok(None)) => return out,
            Ok(Err(status)) => panic!("the tap failed: {status:?}; events so far: {out:?}"),
            Err(_) => panic!("the tap did not end within {DEADLINE:?}; events so far: {out:?}"),
        }
    }
}

fn http_event(e: &TapEvent) -> &Http {
    match &e.event {
        Some(tap_event::Event::Http(tap_event::Http { event: Some(h) })) => h,
        other => panic!("not an HTTP event: {other:?}"),
    }
}

/// A protobuf duration (prost-types', as the API crate uses it) in ms.
macro_rules! millis {
    ($d:expr) => {{
        let d = $d.as_ref().expect("a duration");
        d.seconds as f64 * 1000.0 + f64::from(d.nanos) / 1e6
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_tap_sees_exactly_the_matching_requests_until_its_limit() {
    let mut mesh = Mesh::start(1, &["--tap-addr", "127.0.0.1:0"]).await;
    let tap = tap_addr(&mut mesh.proxy).await;
    let mut tap_client = client(tap).await;
    let mut stream = tap_client
        .observe(observe(5, path_prefix("/tapped/")))
        .await
        .expect("a tap opens")
        .into_inner();
    wait_open(&mesh.proxy, 1.0).await;

    let web = mesh.web();
    let backend = &mesh.backends[0];
    let mut c = Http1::connect(mesh.proxy.outbound).await.unwrap();
    backend.set_delay(Duration::from_millis(40));
    backend.set_failure_rate(1.0);
    let mut sent = Vec::new();
    for path in ["/tapped/1", "/other/1", "/tapped/2"] {
        let a = c.get(&web, path).await.unwrap();
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        sent.push((path, a.status, a.body.len()));
    }
    backend.set_failure_rate(0.0);
    for path in [
        "/other/2",
        "/tapped/3",
        "/tapped",
        "/tapped/4",
        "/x/tapped/",
        "/tapped/5",
        "/tapped/6",
    ] {
        let a = c.get(&web, path).await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{path}");
        sent.push((path, a.status, a.body.len()));
    }

    // The fifth match was the tap's limit: the stream ends after its
    // events, and /tapped/6 is not among them.
    let events = all_events(&mut stream).await;
    assert_eq!(events.len(), 15, "three events per request: {events:#?}");
    let expected: Vec<_> = sent
        .iter()
        .filter(|(p, ..)| p.starts_with("/tapped/") && *p != "/tapped/6")
        .collect();
    for (i, want) in expected.iter().enumerate() {
        let (init, rsp, end) = (&events[3 * i], &events[3 * i + 1], &events[3 * i + 2]);
        let (Http::RequestInit(req), Http::ResponseInit(head), Http::ResponseEnd(tail)) =
            (http_event(init), http_event(rsp), http_event(end))
        else {
            panic!("request {i}: not init, response, end: {init:?} {rsp:?} {end:?}");
        };
        assert_eq!(req.path, want.0);
        assert_eq!(req.method, Some(HttpMethod::from(http::Method::GET)));
        assert_eq!(req.authority, web);
        assert_eq!(req.id, head.id);
        assert_eq!(req.id, tail.id);
        assert_eq!(head.http_status, u32::from(want.1.as_u16()), "{}", want.0);
        let to_headers = millis!(head.since_request_init);
        assert!(
            to_headers >= 40.0,
            "{}: {to_headers} ms, the backend waits 40",
            want.0
        );
        assert!(millis!(tail.since_request_init) >= to_headers);
        assert!(tail.since_response_init.is_some());
        assert_eq!(tail.response_bytes, want.2 as u64, "{}", want.0);
        assert_eq!(init.proxy_direction, ProxyDirection::Outbound as i32);
        let backend_addr = linkerd2_proxy_api::net::TcpAddress::from(backend.addr());
        assert_eq!(init.destination, Some(backend_addr));
        let dst = &init
            .destination_meta
            .as_ref()
            .expect("destination meta")
            .labels;
        assert_eq!(dst.get("namespace").map(String::as_str), Some("shop"));
        assert_eq!(dst.get("service").map(String::as_str), Some("web"));
        assert_eq!(dst.get("tls").map(String::as_str), Some("disabled"));
    }
    let ids: std::collections::HashSet<_> = events
        .iter()
        .filter_map(|e| match http_event(e) {
            Http::RequestInit(r) => r.id,
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 5, "each request its own stream id");
    wait_open(&mesh.proxy, 0.0).await;
    assert_eq!(metric(&mesh.proxy, "tap_events_total", &[]).await, 15.0);
    if let Some(page) = support::openmetrics::check_page(mesh.proxy.admin, "tapped proxy").await {
        page.assert_has("tap_observations_open", "gauge");
        page.assert_has("tap_events", "counter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taps_past_the_bound_and_bad_taps_are_refused() {
    let mut mesh = Mesh::start(1, &["--tap-addr", "127.0.0.1:0"]).await;
    let tap = tap_addr(&mut mesh.proxy).await;
    let mut c = client(tap).await;
    let mut open = Vec::new();
    for _ in 0..8 {
        open.push(
            c.observe(observe(10, everything()))
                .await
                .expect("one of eight"),
        );
    }
    let ninth = c.observe(observe(10, everything())).await.unwrap_err();
    assert_eq!(ninth.code(), Code::ResourceExhausted, "{ninth:?}");

    let zero = c.observe(observe(0, everything())).await.unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero:?}");
    let mut deep = path_prefix("/");
    for _ in 0..16 {
        deep = m::Match::Not(Box::new(wrap(deep)));
    }
    let too_deep = c.observe(observe(10, deep)).await.unwrap_err();
    assert_eq!(too_deep.code(), Code::InvalidArgument, "{too_deep:?}");
    assert!(too_deep.message().contains("deeper"), "{too_deep:?}");
    // No match at all is refused, as by Linkerd's proxy.
    let unmatched = c
        .observe(ObserveRequest {
            r#match: None,
            ..observe(10, everything())
        })
        .await
        .unwrap_err();
    assert_eq!(unmatched.code(), Code::InvalidArgument, "{unmatched:?}");

    let p = &mesh.proxy;
    assert_eq!(
        metric(p, "tap_observations_refused_total", &[("reason", "limit")]).await,
        1.0
    );
    assert_eq!(
        metric(
            p,
            "tap_observations_refused_total",
            &[("reason", "invalid")]
        )
        .await,
        3.0
    );
    assert_eq!(metric(p, "tap_observations_open", &[]).await, 8.0);

    // A client that goes away frees its place.
    drop(open.pop());
    wait_open(p, 7.0).await;
    let again = c.observe(observe(10, everything())).await;
    assert!(again.is_ok(), "{:?}", again.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_client_that_never_reads_loses_events_not_traffic_or_memory() {
    const REQUESTS: usize = 20_000;
    const CONNECTIONS: usize = 8;
    // No rate bound here: every tapped request's events meet the queue.
    let mut mesh = Mesh::start(
        1,
        &[
            "--tap-addr",
            "127.0.0.1:0",
            "--tap-max-events-per-second",
            "1000000",
        ],
    )
    .await;
    let tap = tap_addr(&mut mesh.proxy).await;
    // Warm up, then the baseline.
    let mut c = Http1::connect(mesh.proxy.outbound).await.unwrap();
    for _ in 0..200 {
        c.get(&mesh.web(), "/warm").await.unwrap();
    }
    let base = Footprint::of(&mesh.proxy).await;
    let peak = Peak::start(mesh.proxy.pid());

    let mut tap_client = client(tap).await;
    // Opened and never read: its response is held, its stream never polled.
    let _unread = tap_client
        .observe(observe(10_000, everything()))
        .await
        .expect("a tap opens");
    wait_open(&mesh.proxy, 1.0).await;

    let mut load = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let (outbound, web) = (mesh.proxy.outbound, mesh.web());
        load.spawn(async move {
            let mut c = Http1::connect(outbound).await.unwrap();
            let mut ok = 0;
            for i in 0..REQUESTS / CONNECTIONS {
                match c.get(&web, &format!("/load/{i}")).await {
                    Ok(a) if a.status == StatusCode::OK => ok += 1,
                    other => panic!("request {i}: {other:?}"),
                }
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(n) = load.join_next().await {
        ok += n.expect("a load task");
    }
    assert_eq!(ok, REQUESTS, "every request answered 200");
    let peak = peak.stop().await;

    // The tap's limit (10,000 requests) was reached although nobody read.
    wait_open(&mesh.proxy, 0.0).await;
    let p = &mesh.proxy;
    let queued = metric(p, "tap_events_total", &[]).await;
    let dropped = metric(p, "tap_events_dropped_total", &[("reason", "queue")]).await;
    let rate = metric(p, "tap_events_dropped_total", &[("reason", "rate")]).await;
    eprintln!(
        "unread tap: {queued} events queued, {dropped} dropped (queue), {rate} (rate); \
         baseline {base}, peak RSS {:.1} MiB",
        peak.rss as f64 / MB as f64
    );
    assert_eq!(rate, 0.0);
    assert_eq!(
        queued + dropped,
        30_000.0,
        "each of the 10,000 tapped requests' three events is queued or counted as dropped"
    );
    // What was taken: the queue (1,024) and what HTTP/2's 64 KiB windows
    // and the server's 64 KiB send buffer hold of events of ~150 bytes.
    assert!(
        queued <= 4_000.0,
        "{queued} events were taken from an unread tap"
    );
    assert!(dropped >= 26_000.0, "{dropped}");
    // The queue holds at most 1,024 events of a few hundred bytes: the
    // proxy grows by a few MiB at most over its baseline under this load.
    let ceiling = base.rss + 16 * MB;
    common::assert_peak_under("unread tap", base, peak, ceiling);
}

mod identity_on {
    use super::*;
    use ballast_certify as certify;
    use ballast_meshtls::{io, tls, CertStore, IdentityName};
    use hyper_util::rt::TokioIo;
    use std::{path::Path, sync::Arc};
    use support::{
        identity::{identity, token_secret, IdentityCa, Pki},
        proxy::NS,
        write_atomic,
    };

    /// A certificate for `sa` in `ns` from the identity controller.
    async fn certificate(
        pki: &Pki,
        ca: SocketAddr,
        sa: &str,
        ns: &str,
        token: &Path,
    ) -> Arc<CertStore> {
        let renewal = certify::Renewal {
            addr: ca.to_string(),
            server_name: None,
            connect_timeout: Duration::from_secs(1),
            certify: certify::CertifyConfig {
                token_file: token.to_owned(),
                roots: pki.roots(),
                min_refresh: Duration::from_secs(10),
                max_refresh: Duration::from_secs(3600),
                backoff: ballast_backoff::BackoffConfig {
                    initial: Duration::from_millis(50),
                    max: Duration::from_millis(500),
                    factor: 2.0,
                    jitter: 0.0,
                    reset_after: Duration::from_secs(60),
                },
                request_timeout: Duration::from_secs(5),
            },
        };
        let store = certify::spawn(identity(sa, ns), renewal, Default::default()).unwrap();
        eventually(&format!("a certificate for {sa}.{ns}"), || async {
            store.is_ready().then_some(())
        })
        .await;
        store
    }

    /// A tap client over TLS to `addr`, verifying the proxy as `proxy`,
    /// presenting `cert` (if any).
    async fn tls_client(
        addr: SocketAddr,
        pki: &Pki,
        proxy: IdentityName,
        cert: Option<Arc<CertStore>>,
    ) -> TapClient<Channel> {
        let config = tls::client_config(pki.roots(), cert, &[b"h2"]).unwrap();
        let connector = tower::service_fn(move |_: http::Uri| {
            let (config, name) = (config.clone(), proxy.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                io::connect(tcp, Some((&config, &name)))
                    .await
                    .map(TokioIo::new)
            }
        });
        let channel = tonic::transport::Endpoint::from_static("http://tap.invalid")
            .connect_with_connector(connector)
            .await
            .expect("a TLS connection to the tap listener");
        TapClient::new(channel)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_configured_client_identity_may_tap() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = Pki::generate(&tmp.path().join("pki")).await;
        let tokens = tmp.path().join("tokens");
        std::fs::create_dir_all(&tokens).unwrap();
        write_atomic(
            &tokens.join("secrets.yaml"),
            &[
                token_secret(NS, "api", "tok-api"),
                token_secret(NS, "web", "tok-web"),
                token_secret("ballast", "ballast-viz", "tok-viz"),
            ]
            .join("---\n"),
        );
        for (name, tok) in [("api", "tok-api"), ("web", "tok-web"), ("viz", "tok-viz")] {
            std::fs::write(tmp.path().join(format!("{name}.token")), tok).unwrap();
        }
        let ca = IdentityCa::start(&pki, &tokens, &[]).await;

        let backend = ballast_demo::Backend::start("api-a", "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let port = backend.addr().port().to_string();
        let anchors = pki.anchors().display().to_string();
        let token = tmp.path().join("api.token").display().to_string();
        let ca_addr = ca.grpc.to_string();
        let mut proxy = Proxy::start(
            "127.0.0.1:1".parse().unwrap(),
            &[
                "--identity-trust-anchors",
                &anchors,
                "--identity-addr",
                &ca_addr,
                "--identity-token-file",
                &token,
                "--pod-namespace",
                NS,
                "--pod-service-account",
                "api",
                "--inbound-forward-port",
                &port,
                "--tap-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
        let tap = tap_addr(&mut proxy).await;
        let proxy_name = identity("api", NS);

        // Another workload's identity, no certificate, and plaintext: refused.
        let web = certificate(&pki, ca.grpc, "web", NS, &tmp.path().join("web.token")).await;
        let mut wrong = tls_client(tap, &pki, proxy_name.clone(), Some(web)).await;
        let refused = wrong.observe(observe(10, everything())).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        let mut anonymous = tls_client(tap, &pki, proxy_name.clone(), None).await;
        let refused = anonymous
            .observe(observe(10, everything()))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        let mut plain = client(tap).await;
        let refused = plain.observe(observe(10, everything())).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        assert_eq!(
            metric(
                &proxy,
                "tap_observations_refused_total",
                &[("reason", "unauthorized")]
            )
            .await,
            3.0
        );
        assert_eq!(metric(&proxy, "tap_observations_open", &[]).await, 0.0);

        // The dashboard's identity is served, and sees inbound requests.
        let viz = certificate(
            &pki,
            ca.grpc,
            "ballast-viz",
            "ballast",
            &tmp.path().join("viz.token"),
        )
        .await;
        let mut allowed = tls_client(tap, &pki, proxy_name, Some(viz)).await;
        let mut stream = allowed
            .observe(observe(1, everything()))
            .await
            .expect("the viz identity may tap")
            .into_inner();
        wait_open(&proxy, 1.0).await;
        let mut c = Http1::connect(proxy.inbound).await.unwrap();
        let answer = c
            .get("api.shop.svc.cluster.local", "/orders")
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        let events = all_events(&mut stream).await;
        assert_eq!(events.len(), 3, "{events:#?}");
        let Http::RequestInit(req) = http_event(&events[0]) else {
            panic!("{events:?}");
        };
        assert_eq!(req.path, "/orders");
        assert_eq!(events[0].proxy_direction, ProxyDirection::Inbound as i32);
        let src = &events[0].source_meta.as_ref().expect("source meta").labels;
        assert_eq!(
            src.get("tls").map(String::as_str),
            Some("no_tls_from_remote")
        );
    }
}
