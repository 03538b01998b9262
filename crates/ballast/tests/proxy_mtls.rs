//! Two proxies with identities from `ballast identity`, on loopback: the
//! bytes between them are TLS, the workload learns its caller's identity,
//! a peer with the wrong identity, another CA's certificate or an expired
//! one is refused, the issuer rotates under load with no failed request,
//! and proxies ride out the identity controller's absence.

use ballast_testsupport as support;

use http::StatusCode;
use hyper::{body::Incoming, service::service_fn, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};
use support::{
    eventually,
    identity::{
        identity, meshed_service_yaml, proxy_identity_flags, token_secret, IdentityCa, Pki,
    },
    proxy::{authority, Http1, Proxy, NS},
    write_atomic, Controller,
};
use tokio::net::{TcpListener, TcpStream};

/// A workload that answers with the `l5d-client-id` it was given.
async fn whoami() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let id = req
                        .headers()
                        .get("l5d-client-id")
                        .map(|v| v.to_str().unwrap_or("?").to_string())
                        .unwrap_or_else(|| "none".into());
                    Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                        hyper::body::Bytes::from(format!("client={id} path={}", req.uri().path())),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A relay in front of `to` keeping the first 64 KiB each client sent.
async fn tap(to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(to).await else {
                    return;
                };
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let up = async {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        {
                            let mut k = keep.lock().unwrap();
                            if k.len() < 64 * 1024 {
                                k.extend_from_slice(&buf[..n]);
                            }
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = sw.shutdown().await;
                };
                let down = tokio::io::copy(&mut sr, &mut cw);
                let _ = tokio::join!(up, down);
            });
        }
    });
    (addr, seen)
}

/// The `api` pod (service account `sa`), reachable at `addr`, meshed.
fn api_pod(dir: &Path, sa: &str, addr: SocketAddr) {
    write_atomic(
        &dir.join("api.yaml"),
        &meshed_service_yaml("api", sa, addr, "127.0.0.100"),
    );
}

struct World {
    _tmp: tempfile::TempDir,
    pki: Pki,
    ca: IdentityCa,
    cluster: std::path::PathBuf,
    _controller: Controller,
    client: Proxy,
    server: Proxy,
    seen: Arc<Mutex<Vec<u8>>>,
    tap: SocketAddr,
    tmp_path: std::path::PathBuf,
    tokens: std::path::PathBuf,
}

/// The client side takes its anchors inline, as injected pods do
/// (`ballast injector` puts them in the environment); the server from a file.
fn identity_flags(
    pki: &Pki,
    ca: SocketAddr,
    sa: &str,
    token: &Path,
    extra: &[&str],
) -> Vec<String> {
    proxy_identity_flags(pki, ca, sa, token, sa == "web", extra)
}

async fn world(ca_flags: &[&str], proxy_flags: &[&str]) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    write_atomic(
        &tokens.join("secrets.yaml"),
        &[
            token_secret(NS, "web", "tok-web"),
            token_secret(NS, "api", "tok-api"),
            token_secret(NS, "db", "tok-db"),
        ]
        .join("---\n"),
    );
    for (sa, tok) in [("web", "tok-web"), ("api", "tok-api"), ("dst", "tok-dst")] {
        std::fs::write(tmp.path().join(format!("{sa}.token")), tok).unwrap();
    }
    // A port of its own, so that a restarted controller is found again.
    let ca_addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let ca = IdentityCa::spawn_at(&pki, &tokens, ca_addr, ca_flags).await;
    eventually("the identity controller's /ready", || async {
        (ca.ready().await == 200).then_some(())
    })
    .await;

    let app = whoami().await;
    let server_flags = identity_flags(
        &pki,
        ca.grpc,
        "api",
        &tmp.path().join("api.token"),
        proxy_flags,
    );
    let mut args: Vec<&str> = server_flags.iter().map(String::as_str).collect();
    let port = app.port().to_string();
    args.extend(["--inbound-forward-port", &port]);
    // No controller is needed by the server side; any address will do.
    let server = Proxy::start("127.0.0.1:1".parse().unwrap(), &args).await;
    let (tap_addr, seen) = tap(server.inbound).await;

    let cluster = tmp.path().join("cluster");
    std::fs::create_dir_all(&cluster).unwrap();
    api_pod(&cluster, "api", tap_addr);
    let controller = Controller::start(&cluster, &[]).await;
    let client_flags = identity_flags(
        &pki,
        ca.grpc,
        "web",
        &tmp.path().join("web.token"),
        proxy_flags,
    );
    let args: Vec<&str> = client_flags.iter().map(String::as_str).collect();
    let client = Proxy::start(controller.grpc, &args).await;
    eventually("a 200 through both proxies", || async {
        (get(&client, "/").await.ok()?.status == StatusCode::OK).then_some(())
    })
    .await;
    World {
        tmp_path: tmp.path().to_owned(),
        _tmp: tmp,
        pki,
        ca,
        cluster,
        _controller: controller,
        client,
        server,
        seen,
        tap: tap_addr,
        tokens,
    }
}

async fn get(proxy: &Proxy, path: &str) -> Result<support::proxy::Answer, String> {
    let mut c = Http1::connect(proxy.outbound).await?;
    c.get(&authority("api", 80), path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshed_traffic_is_mutual_tls_and_names_both_ends() {
    let w = world(&[], &[]).await;
    let answer = get(&w.client, "/secret-path").await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let web = identity("web", NS);
    let api = identity("api", NS);
    assert_eq!(answer.text(), format!("client={web} path=/secret-path"));

    let wire = w.seen.lock().unwrap().clone();
    assert_eq!(
        wire.first(),
        Some(&0x16),
        "the first byte on the wire is a TLS handshake"
    );
    assert!(
        !wire
            .windows(b"secret-path".len())
            .any(|x| x == b"secret-path"),
        "the request crossed the wire in plaintext"
    );

    let mc = w.client.metrics().await;
    assert!(
        mc.sum(
            "tcp_open_total",
            &[
                ("peer", "dst"),
                ("tls", "true"),
                ("server_id", api.as_str())
            ]
        ) >= 1.0,
        "{}",
        mc.text
    );
    let ms = w.server.metrics().await;
    assert!(
        ms.sum(
            "tcp_open_total",
            &[
                ("peer", "src"),
                ("tls", "true"),
                ("client_id", web.as_str())
            ]
        ) >= 1.0,
        "{}",
        ms.text
    );
    // Linkerd's proxy's identity metrics, by its names.
    let expires = mc.sum("control_identity_cert_expiration_timestamp_seconds", &[]);
    let refreshed_at = mc.sum("control_identity_cert_refresh_timestamp_seconds", &[]);
    assert!(
        refreshed_at > 1.7e9 && expires > refreshed_at,
        "refreshed at {refreshed_at}, expires at {expires}"
    );
    assert!(mc.sum("control_identity_cert_refreshes_total", &[("result", "ok")]) >= 1.0);
    // After meshed traffic both ends' pages have samples in their traffic
    // families, and a standard OpenMetrics parser reads them.
    for (proxy, what) in [(&w.client, "client proxy"), (&w.server, "server proxy")] {
        if let Some(page) = support::openmetrics::check_page(proxy.admin, what).await {
            page.assert_has("tcp_open", "counter");
            page.assert_has("request", "counter");
            page.assert_has("response_latency_ms", "histogram");
            page.assert_has(
                "control_identity_cert_expiration_timestamp_seconds",
                "gauge",
            );
        }
    }

    // A plaintext caller cannot claim an identity.
    let mut plain = Http1::connect(w.server.inbound).await.unwrap();
    let request = Request::get("/")
        .header(http::header::HOST, authority("api", 80))
        .header(
            "l5d-client-id",
            "admin.kube-system.serviceaccount.identity.linkerd.cluster.local",
        )
        .body(http_body_util::Full::new(hyper::body::Bytes::new()))
        .unwrap();
    let forged = plain.send(request).await.unwrap();
    assert_eq!(forged.text(), "client=none path=/");
}

/// A TLS server that presents `chain` whatever name it is dialled as.
async fn tls_server(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> SocketAddr {
    let config = rustls::ServerConfig::builder_with_provider(ballast_meshtls::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    let svc = service_fn(|_req: Request<Incoming>| async {
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            hyper::body::Bytes::from("impostor"),
                        )))
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                }
            });
        }
    });
    addr
}

/// A leaf for `name` signed by `pki`'s issuer, valid over [from, until].
fn leaf(
    pki: &Pki,
    name: &str,
    from: SystemTime,
    until: SystemTime,
) -> (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    let issuer_pem = std::fs::read_to_string(pki.issuer_dir().join("tls.crt")).unwrap();
    let issuer_key = std::fs::read_to_string(pki.issuer_dir().join("tls.key")).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(
        &issuer_pem,
        rcgen::KeyPair::from_pem(&issuer_key).unwrap(),
    )
    .unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    params.not_before = from.into();
    params.not_after = until.into();
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let issuer_der = ballast_meshtls::pem::certificates(issuer_pem.as_bytes()).unwrap();
    let mut chain = vec![cert.der().clone()];
    chain.extend(issuer_der);
    (
        chain,
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_the_wrong_identity_another_ca_or_an_expired_certificate_is_refused() {
    let w = world(&[], &[]).await;
    let api = identity("api", NS).to_string();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let other = Pki::generate(&w.tmp_path.join("other")).await;
    let cases = [
        (
            "another identity",
            leaf(
                &w.pki,
                &identity("db", NS).to_string(),
                now - day,
                now + day,
            ),
        ),
        ("another CA", leaf(&other, &api, now - day, now + day)),
        (
            "an expired certificate",
            leaf(&w.pki, &api, now - 3 * day, now - day),
        ),
    ];
    let mut refused_before = 0.0;
    for (what, (chain, key)) in cases {
        let impostor = tls_server(chain, key).await;
        api_pod(&w.cluster, "api", impostor);
        // Until the controller's update arrives, answers come from the real
        // pod; once it has, every request must fail, and none reach the impostor.
        eventually(&format!("{what} refused"), || async {
            let a = get(&w.client, "/").await.ok()?;
            assert_ne!(a.text(), "impostor", "{what}: the impostor was trusted");
            let m = w.client.metrics().await;
            let refused = m.sum(
                "tls_errors_total",
                &[("direction", "outbound"), ("error", "identity")],
            );
            (refused > refused_before).then_some(refused)
        })
        .await;
        for _ in 0..3 {
            let a = get(&w.client, "/").await.unwrap();
            assert_ne!(a.text(), "impostor", "{what}: the impostor was trusted");
            assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{what}: {a:?}");
        }
        refused_before = w.client.metrics().await.sum(
            "tls_errors_total",
            &[("direction", "outbound"), ("error", "identity")],
        );
    }
    // Back to the real pod: served again.
    api_pod(&w.cluster, "api", w.tap);
    eventually("the real pod again", || async {
        (get(&w.client, "/").await.ok()?.status == StatusCode::OK).then_some(())
    })
    .await;
    drop(w.ca);
}

/// Requests through both proxies until `stop`, each on a new client
/// connection; returns (answered 200, failed) and the first failure.
fn steady_load(
    client: SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(u64, u64, Option<String>)> {
    tokio::spawn(async move {
        let (mut ok, mut failed, mut first) = (0u64, 0u64, None);
        while !*stop.borrow() {
            let answer = async {
                let mut c = Http1::connect(client).await?;
                c.get(&authority("api", 80), "/load").await
            }
            .await;
            match answer {
                Ok(a) if a.status == StatusCode::OK => ok += 1,
                other => {
                    failed += 1;
                    first.get_or_insert(format!("{other:?}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (ok, failed, first)
    })
}

/// Stops the load and asserts that it was answered, every request.
async fn no_failed_request(
    stop: tokio::sync::watch::Sender<bool>,
    load: tokio::task::JoinHandle<(u64, u64, Option<String>)>,
) {
    let _ = stop.send(true);
    let (ok, failed, first) = load.await.unwrap();
    assert!(ok > 10, "only {ok} requests answered");
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed; the first: {first:?}",
        ok + failed
    );
}

/// Successful renewals of the client and the server proxy.
async fn refreshed_both(w: &World) -> (f64, f64) {
    (
        refreshed(&w.client, "ok").await,
        refreshed(&w.server, "ok").await,
    )
}

async fn refreshed_total(p: &Proxy) -> f64 {
    p.metrics()
        .await
        .sum("control_identity_cert_refreshes_total", &[])
}

async fn refreshed(p: &Proxy, result: &str) -> f64 {
    p.metrics().await.sum(
        "control_identity_cert_refreshes_total",
        &[("result", result)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issuer_rotates_under_steady_load_with_no_failed_request() {
    // Certificates of 12 s, renewed about every 8 s.
    let w = world(
        &["--issuance-lifetime", "12s", "--clock-skew-allowance", "0s"],
        &["--identity-min-refresh", "1s"],
    )
    .await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let load = steady_load(w.client.outbound, stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = refreshed_both(&w).await;
    w.pki.rotate_issuer().await;
    // Both proxies renew from the rotated issuer, then renew again.
    eventually("both proxies renewed twice after the rotation", || async {
        let now = refreshed_both(&w).await;
        (now.0 >= before.0 + 2.0 && now.1 >= before.1 + 2.0).then_some(())
    })
    .await;
    no_failed_request(stop_tx, load).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_ride_out_the_identity_controller_being_down_and_renew_when_it_returns() {
    // Certificates of 30 s: renewal falls due after about 21 s.
    let ca_flags = ["--issuance-lifetime", "30s", "--clock-skew-allowance", "0s"];
    let mut w = world(&ca_flags, &["--identity-min-refresh", "1s"]).await;
    let ca_addr = w.ca.grpc;
    let renewed = refreshed_both(&w).await;
    w.ca.process.child.kill().await.unwrap();
    let _ = w.ca.process.child.wait().await;

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let load = steady_load(w.client.outbound, stop);
    // Past the renewal time: both proxies have tried and failed, and serve on.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let failed = (
            refreshed_total(&w.client).await - refreshed(&w.client, "ok").await,
            refreshed_total(&w.server).await - refreshed(&w.server, "ok").await,
        );
        if failed.0 >= 1.0 && failed.1 >= 1.0 {
            // Linkerd's label is `error`; why is Ballast's own family.
            let page = w.client.metrics().await;
            let errors = page.sum(
                "control_identity_cert_refreshes_total",
                &[("result", "error")],
            );
            assert_eq!(
                errors,
                page.sum("control_identity_cert_refreshes_total", &[])
                    - page.sum("control_identity_cert_refreshes_total", &[("result", "ok")])
            );
            assert!(errors >= 1.0);
            assert_eq!(
                page.sum("identity_cert_refresh_failures_total", &[]),
                errors
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed renewal while the identity controller was down"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        w.client
            .metrics()
            .await
            .sum("control_identity_cert_refreshes_total", &[("result", "ok")]),
        renewed.0
    );
    let answer = get(&w.client, "/").await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "serving on the current certificates: {answer:?}"
    );

    w.ca = IdentityCa::spawn_at(&w.pki, &w.tokens, ca_addr, &ca_flags).await;
    eventually("both proxies renewed once it was back", || async {
        let now = refreshed_both(&w).await;
        (now.0 > renewed.0 && now.1 > renewed.1).then_some(())
    })
    .await;
    no_failed_request(stop_tx, load).await;
}

/// A real ClientHello for `name`, as a mesh client would send it.
fn client_hello(name: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(ballast_meshtls::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    hello
}

/// Whether the proxy closed `s` (EOF or reset) within the deadline.
async fn closed(s: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_garbage_and_excess_handshakes_are_cut_and_counted() {
    use tokio::io::AsyncWriteExt;
    // Long enough that the stalled handshake still holds the slot when the
    // excess one arrives on a busy machine.
    let w = world(
        &[],
        &["--tls-handshake-timeout", "5s", "--max-tls-handshakes", "1"],
    )
    .await;
    let inbound = w.server.inbound;
    let hello = client_hello(identity("api", NS).as_str());
    let errors = |error: &'static str| {
        let server = &w.server;
        async move {
            server.metrics().await.sum(
                "tls_errors_total",
                &[("direction", "inbound"), ("error", error)],
            )
        }
    };

    // A ClientHello for the proxy, then nothing: cut at the handshake timeout.
    let mut stalled = TcpStream::connect(inbound).await.unwrap();
    stalled.write_all(&hello).await.unwrap();
    // Meanwhile the one handshake slot is taken: another is shed at once.
    eventually("the stalled handshake holds the slot", || async {
        let m = w.server.metrics().await;
        (m.sum("tls_handshakes_in_flight", &[]) >= 1.0).then_some(())
    })
    .await;
    let mut excess = TcpStream::connect(inbound).await.unwrap();
    excess.write_all(&hello).await.unwrap();
    assert!(
        closed(&mut excess).await,
        "an excess handshake was not closed"
    );
    assert!(errors("shed").await >= 1.0);
    assert!(
        closed(&mut stalled).await,
        "a stalled handshake was not cut"
    );
    assert!(errors("timeout").await >= 1.0);

    // A ClientHello for the proxy, then garbage: a handshake error.
    let mut garbage = TcpStream::connect(inbound).await.unwrap();
    garbage.write_all(&hello).await.unwrap();
    garbage
        .write_all(&[0x17, 0x03, 0x03, 0x00, 0x10])
        .await
        .unwrap();
    garbage.write_all(&[0xAB; 16]).await.unwrap();
    assert!(
        closed(&mut garbage).await,
        "a garbage handshake was not closed"
    );
    eventually("the handshake error counted", || async {
        (errors("handshake").await >= 1.0).then_some(())
    })
    .await;

    // The proxy still serves.
    let answer = get(&w.client, "/after").await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
}

/// Defect: a proxy dialling a plaintext controller in TLS said so only at
/// debug, so an installed mesh that lost its controller looked healthy.
/// Now it warns, naming the cause and the flags, at most once per 30 s.
#[tokio::test]
async fn a_proxy_dialling_a_plaintext_controller_in_tls_warns_naming_the_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    write_atomic(
        &tokens.join("secrets.yaml"),
        &token_secret(NS, "web", "tok-web"),
    );
    std::fs::write(tmp.path().join("web.token"), "tok-web").unwrap();
    let ca = IdentityCa::start(&pki, &tokens, &[]).await;
    let cluster = tmp.path().join("cluster");
    std::fs::create_dir_all(&cluster).unwrap();
    api_pod(&cluster, "api", "127.0.0.1:9".parse().unwrap());
    // A controller without --identity-trust-anchors: plaintext only.
    let controller = Controller::start(&cluster, &[]).await;
    let mut flags = identity_flags(&pki, ca.grpc, "web", &tmp.path().join("web.token"), &[]);
    flags.push(format!(
        "--destination-server-name={}",
        identity("ballast-destination", NS)
    ));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let client = Proxy::start(controller.grpc, &args).await;
    let started = std::time::Instant::now();
    // Resolving a service makes the proxy dial its controller.
    let warned = eventually("a WARN naming the plaintext controller", || async {
        let _ = tokio::time::timeout(Duration::from_millis(500), get(&client, "/")).await;
        let lines = client
            .process
            .logs_containing("cannot reach the destination controller");
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    let line = &warned[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("answered in plaintext"), "{line}");
    assert!(line.contains("--identity-trust-anchors"), "{line}");
    assert!(line.contains("--destination-server-name"), "{line}");
    // Many attempts, few lines: one per 30 s (and the first at once).
    let attempts = eventually("several connect attempts", || async {
        let n = client
            .metrics()
            .await
            .sum("control_connect_attempts_total", &[]);
        (n >= 4.0).then_some(n)
    })
    .await;
    let lines = client
        .process
        .logs_containing("cannot reach the destination controller")
        .len();
    let allowed = 1 + started.elapsed().as_secs() as usize / 30 + 1;
    assert!(
        lines <= allowed && (lines as f64) < attempts,
        "{lines} warnings for {attempts} attempts"
    );
}
