//! `ballast identity` over real gRPC: Linkerd's Certify semantics, its own
//! TLS identity, issuer rotation and refusal, per-client rate.

use ballast_testsupport as support;

use ballast_meshtls::tls;
use std::time::{Duration, SystemTime};
use support::{
    eventually,
    identity::{
        chain, controller_identity, identity, plaintext_client, request, tls_client, token_secret,
        IdentityCa, Pki, CONTROL_NS,
    },
    write_atomic,
};
use tonic::Code;

fn manifests(dir: &std::path::Path) {
    write_atomic(
        &dir.join("tokens.yaml"),
        &[
            token_secret("shop", "web", "tok-web"),
            token_secret("shop", "db", "tok-db"),
        ]
        .join("---\n"),
    );
}

/// A PKI, token Secrets for `web` and `db` in `shop`, and the identity
/// controller on them (ready).
async fn started(extra: &[&str]) -> (tempfile::TempDir, Pki, IdentityCa) {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    let m = tmp.path().join("manifests");
    std::fs::create_dir_all(&m).unwrap();
    manifests(&m);
    let ca = IdentityCa::start(&pki, &m, extra).await;
    (tmp, pki, ca)
}

#[tokio::test]
async fn certifies_what_linkerd_certifies_and_refuses_the_rest() {
    let (_tmp, pki, ca) = started(&[]).await;
    let mut client = plaintext_client(ca.grpc).await;

    let web = identity("web", "shop");
    let (key, req) = request(&web, "tok-web");
    let rsp = client.certify(req).await.expect("certify web").into_inner();
    let creds = key
        .accept(pki.roots(), chain(&rsp))
        .expect("the chain verifies for web");
    assert_eq!(
        rsp.intermediate_certificates.len(),
        1,
        "the issuer follows the leaf"
    );
    let valid_until: SystemTime = rsp.valid_until.unwrap().try_into().unwrap();
    assert_eq!(valid_until, creds.not_after);
    let life = valid_until.duration_since(SystemTime::now()).unwrap();
    assert!(
        life > Duration::from_secs(23 * 3600) && life <= Duration::from_secs(24 * 3600 + 21),
        "{life:?}"
    );
    let leaf = &chain(&rsp)[0];
    assert_eq!(tls::dns_names(leaf), vec![web.clone()]);

    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.map(|_| ()).unwrap_err().code();
    // A token that proves nothing.
    let (_, req) = request(&web, "forged");
    assert_eq!(code(client.certify(req).await), Code::FailedPrecondition);
    // A real token for another account.
    let (_, req) = request(&web, "tok-db");
    let err = client.certify(req).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("did not match"), "{}", err.message());
    // A CSR for another name than the one requested.
    let (_, mut req) = request(&identity("db", "shop"), "tok-web");
    req.identity = web.to_string();
    assert_eq!(code(client.certify(req).await), Code::FailedPrecondition);
    // Garbage and missing fields.
    let (_, mut req) = request(&web, "tok-web");
    req.certificate_signing_request = b"garbage".to_vec();
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    let (_, mut req) = request(&web, "tok-web");
    req.identity.clear();
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    let (_, mut req) = request(&web, "tok-web");
    req.token.clear();
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    // A name outside this control plane's form.
    let other = ballast_meshtls::IdentityName::parse(
        "web.shop.serviceaccount.identity.other.cluster.local",
    )
    .unwrap();
    let (_, req) = request(&other, "tok-web");
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    // Oversized requests are refused before they are read whole.
    let (_, mut req) = request(&web, "tok-web");
    req.token = vec![b'a'; 64 * 1024];
    assert_eq!(code(client.certify(req).await), Code::OutOfRange);

    let metrics = support::http_get(ca.admin, "/metrics").await.1;
    assert!(
        metrics.contains("identity_certify_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("identity_certify_total{result=\"unauthenticated\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("identity_cert_expiration_timestamp_seconds{cert=\"issuer\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("identity_cert_expiration_timestamp_seconds{cert=\"anchor\""),
        "{metrics}"
    );
    if let Some(page) = support::openmetrics::check_page(ca.admin, "identity controller").await {
        page.assert_has("identity_certify", "counter");
        page.assert_has("identity_cert_expiration_timestamp_seconds", "gauge");
    }
}

#[tokio::test]
async fn serves_tls_as_its_own_identity() {
    let (tmp, pki, ca) = started(&[]).await;

    let mut client = tls_client(ca.grpc, pki.roots(), controller_identity())
        .await
        .expect("TLS to the controller");
    let (key, req) = request(&identity("db", "shop"), "tok-db");
    let rsp = client
        .certify(req)
        .await
        .expect("certify over TLS")
        .into_inner();
    key.accept(pki.roots(), chain(&rsp)).unwrap();
    let metrics = support::http_get(ca.admin, "/metrics").await.1;
    assert!(
        metrics.contains("grpc_server_connections_total{tls=\"true\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("grpc_server_connections_open 1"),
        "{metrics}"
    );
    if let Some(page) = support::openmetrics::check_page(ca.admin, "identity controller").await {
        page.assert_has("grpc_server_connections", "counter");
        page.assert_has("grpc_server_connections_open", "gauge");
    }

    // Dialled as another identity, or under other anchors: refused.
    let mut wrong = tls_client(ca.grpc, pki.roots(), identity("web", "shop")).await;
    if let Ok(c) = &mut wrong {
        let (_, req) = request(&identity("db", "shop"), "tok-db");
        assert!(
            c.certify(req).await.is_err(),
            "a server for another name was trusted"
        );
    }
    let other = Pki::generate(&tmp.path().join("other")).await;
    let mut foreign = tls_client(ca.grpc, other.roots(), controller_identity()).await;
    if let Ok(c) = &mut foreign {
        let (_, req) = request(&identity("db", "shop"), "tok-db");
        assert!(
            c.certify(req).await.is_err(),
            "a server under other anchors was trusted"
        );
    }
}

#[tokio::test]
async fn rotates_the_issuer_and_refuses_one_that_does_not_chain() {
    let (tmp, pki, ca) = started(&[]).await;
    let mut client = plaintext_client(ca.grpc).await;
    let web = identity("web", "shop");
    let issuer_of = |rsp: &linkerd2_proxy_api::identity::CertifyResponse| {
        rsp.intermediate_certificates[0].clone()
    };

    let (_, req) = request(&web, "tok-web");
    let first = issuer_of(&client.certify(req).await.unwrap().into_inner());

    pki.rotate_issuer().await;
    let rotated = ballast_meshtls::pem::certificates(&pki.issuer_cert()).unwrap()[0].to_vec();
    assert_ne!(rotated, first);
    eventually("leaves signed by the rotated issuer", || {
        let mut client = client.clone();
        let rotated = rotated.clone();
        let web = web.clone();
        let roots = pki.roots();
        async move {
            let (key, req) = request(&web, "tok-web");
            let rsp = client.certify(req).await.ok()?.into_inner();
            key.accept(roots, chain(&rsp)).ok()?;
            (issuer_of(&rsp) == rotated).then_some(())
        }
    })
    .await;
    assert_eq!(ca.ready().await, 200);

    // An issuer from another anchor: refused, not ready, still signing with
    // the last valid issuer.
    let other = Pki::generate(&tmp.path().join("other")).await;
    for f in ["tls.key", "tls.crt"] {
        let text = std::fs::read_to_string(other.issuer_dir().join(f)).unwrap();
        write_atomic(&pki.issuer_dir().join(f), &text);
    }
    eventually("/ready to fail on a foreign issuer", || async {
        (ca.ready().await == 503).then_some(())
    })
    .await;
    eventually("the refusal to be logged", || async {
        (!ca.process
            .logs_containing("does not chain to the trust anchors")
            .is_empty())
        .then_some(())
    })
    .await;
    let (key, req) = request(&web, "tok-web");
    let rsp = client
        .certify(req)
        .await
        .expect("still signing")
        .into_inner();
    key.accept(pki.roots(), chain(&rsp))
        .expect("with the last valid issuer");
    assert_eq!(issuer_of(&rsp), rotated);
}

#[tokio::test]
async fn a_client_over_its_rate_is_refused_and_others_are_not() {
    let (_tmp, _pki, ca) = started(&["--client-burst", "3", "--client-rate", "0.01"]).await;
    let mut client = plaintext_client(ca.grpc).await;
    let web = identity("web", "shop");
    let mut codes = Vec::new();
    for _ in 0..5 {
        let (_, req) = request(&web, "tok-web");
        codes.push(
            client
                .certify(req)
                .await
                .map(|_| Code::Ok)
                .unwrap_or_else(|s| s.code()),
        );
    }
    assert_eq!(&codes[..3], &[Code::Ok; 3]);
    assert_eq!(&codes[3..], &[Code::ResourceExhausted; 2]);

    // Another client address has its own budget.
    let grpc = ca.grpc;
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind("127.0.0.2:0".parse().unwrap())?;
        socket.connect(grpc).await.map(hyper_util::rt::TokioIo::new)
    });
    let channel = tonic::transport::Endpoint::from_static("http://identity.invalid")
        .connect_with_connector(connector)
        .await
        .expect("connect from 127.0.0.2");
    let mut other = linkerd2_proxy_api::identity::identity_client::IdentityClient::new(channel);
    let (_, req) = request(&web, "tok-web");
    other
        .certify(req)
        .await
        .expect("another client is not limited");
}

/// Defect: `identity generate` replaced an existing trust anchor and key
/// without asking, cutting every certificate issued under it loose.
#[test]
fn generate_never_overwrites_a_trust_anchor_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pki");
    let generate = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args(["identity", "generate", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .expect("ballast runs")
    };
    assert!(generate(&[]).status.success());
    let anchor = std::fs::read(out.join("ca.crt")).unwrap();
    let key = std::fs::read(out.join("ca.key")).unwrap();
    let again = generate(&[]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("ca.crt exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(out.join("ca.crt")).unwrap(), anchor);
    assert_eq!(std::fs::read(out.join("ca.key")).unwrap(), key);
    // Rotation keeps the anchor; --force replaces it.
    assert!(generate(&["--rotate-issuer"]).status.success());
    assert_eq!(std::fs::read(out.join("ca.crt")).unwrap(), anchor);
    assert!(generate(&["--force"]).status.success());
    assert_ne!(std::fs::read(out.join("ca.crt")).unwrap(), anchor);
}

/// A controller with an identity of its own exports its certificate's expiry
/// and renewals under the proxy's names, so that one alert covers both.
#[tokio::test]
async fn a_controller_exports_its_own_certificates_expiry() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    write_atomic(
        &tokens.join("tokens.yaml"),
        &token_secret(CONTROL_NS, "linkerd-destination", "tok-dst"),
    );
    let ca = IdentityCa::start(&pki, &tokens, &[]).await;
    let token = tmp.path().join("dst.token");
    std::fs::write(&token, "tok-dst").unwrap();
    let cluster = tmp.path().join("cluster");
    std::fs::create_dir_all(&cluster).unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    // Ready only once it holds a certificate.
    let dst = support::Controller::start(
        &cluster,
        &[
            "--identity-trust-anchors",
            &pki.anchors().display().to_string(),
            "--identity-addr",
            &ca.grpc.to_string(),
            "--identity-token-file",
            &token.display().to_string(),
        ],
    )
    .await;
    let expiry = dst
        .metric("control_identity_cert_expiration_timestamp_seconds")
        .await
        .expect("the expiry is exported");
    assert!(
        expiry > now + 3600.0,
        "a day's certificate expires at {expiry}, now {now}"
    );
    assert_eq!(
        dst.metric("control_identity_cert_refreshes_total{result=\"ok\"}")
            .await,
        Some(1.0)
    );
    let refreshed = dst
        .metric("control_identity_cert_refresh_timestamp_seconds")
        .await
        .expect("the renewal time is exported");
    assert!(refreshed >= now.floor(), "{refreshed} < {now}");
    if let Some(page) = support::openmetrics::check_page(dst.admin, "destination controller").await
    {
        page.assert_has(
            "control_identity_cert_expiration_timestamp_seconds",
            "gauge",
        );
        page.assert_has("control_identity_cert_refreshes", "counter");
    }
}
