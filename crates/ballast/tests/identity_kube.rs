//! `ballast identity` on the Kubernetes source: tokens proven by TokenReviews
//! (Linkerd's audience, the retry without it for old tokens) against the
//! testkit API server, and the status codes when the review fails.

use ballast_testsupport as support;

use ballast_testkit::ApiServer;
use support::{
    eventually, http_get,
    identity::{chain, identity, plaintext_client, request, Pki},
    proxy::Logged,
};
use tokio::process::Command;
use tonic::Code;

#[tokio::test]
async fn tokens_are_proven_by_token_reviews() {
    let api = ApiServer::start().await;
    api.add_token(
        "tok-web",
        "system:serviceaccount:shop:web",
        &["identity.l5d.io"],
    );
    // A token minted before projected audiences.
    api.add_token(
        "tok-old",
        "system:serviceaccount:shop:old",
        &["https://kubernetes.default.svc"],
    );
    api.add_token("tok-node", "system:node:worker-1", &["identity.l5d.io"]);
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(tmp.path());
    let pki = Pki::generate(&tmp.path().join("pki")).await;

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ballast"));
    cmd.arg("identity")
        .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .arg("--issuer-dir")
        .arg(pki.issuer_dir())
        .arg("--trust-anchors")
        .arg(pki.anchors())
        .arg("--kubeconfig")
        .arg(&kubeconfig);
    let mut ca = Logged::spawn(cmd);
    let grpc = ca.listening("identity gRPC listening on ", 1).await[0];
    let admin = ca.listening("admin listening on ", 1).await[0];
    eventually("/ready", || async {
        (http_get(admin, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let mut client = plaintext_client(grpc).await;

    let web = identity("web", "shop");
    let (key, req) = request(&web, "tok-web");
    let rsp = client
        .certify(req)
        .await
        .expect("a reviewed token")
        .into_inner();
    key.accept(pki.roots(), chain(&rsp)).unwrap();
    let reviews = || {
        api.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/tokenreviews"))
            .count()
    };
    assert_eq!(reviews(), 1, "one TokenReview for one Certify");

    // An old token: refused for the audience, then reviewed without it.
    let before = reviews();
    let (_, req) = request(&identity("old", "shop"), "tok-old");
    client
        .certify(req)
        .await
        .expect("an old token, retried without an audience");
    assert_eq!(
        reviews() - before,
        2,
        "one review with Linkerd's audience, one without"
    );

    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.map(|_| ()).unwrap_err().code();
    // Unknown token: the review names an error, which Linkerd answers with
    // INVALID_ARGUMENT.
    let (_, req) = request(&web, "tok-forged");
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    // A valid token of a node, not a service account.
    let (_, req) = request(&web, "tok-node");
    assert_eq!(code(client.certify(req).await), Code::InvalidArgument);
    // A valid token of another account.
    let (_, req) = request(&identity("db", "shop"), "tok-web");
    assert_eq!(code(client.certify(req).await), Code::FailedPrecondition);
    // The API server failing: INTERNAL, and the controller stays up.
    api.fail_with(Some((500, None)));
    let (_, req) = request(&web, "tok-web");
    assert_eq!(code(client.certify(req).await), Code::Internal);
    api.fail_with(None);
    let (_, req) = request(&web, "tok-web");
    client
        .certify(req)
        .await
        .expect("served again once the API server is back");
    drop(ca);
}
