//! `ballast injector` as a process, sent real AdmissionReview v1 bodies over
//! TLS (a rustls client trusting the webhook CA `ballast install` makes):
//! pods in an annotated namespace are patched (the patch, applied, gives the
//! injected pod), others are admitted unchanged, `disabled` wins, garbage
//! gets 400 and an oversized body 413 while the server keeps serving, and
//! every answer echoes its request's uid. Namespaces are read from a small
//! Kubernetes API (GET /api/v1/namespaces/NAME) the test serves.

use ballast_testsupport as support;

use ballast_inject::pod::{INIT_CONTAINER, PROXY_CONTAINER};
use ballast_install::pki::{WebhookTls, WEBHOOK_CERT_LIFETIME};
use base64::Engine;
use serde_json::{json, Value};
use std::{collections::HashMap, net::SocketAddr, path::Path, sync::Arc, time::Duration};
use support::{http_get, proxy::Logged};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::Command,
};

const DEADLINE: Duration = Duration::from_secs(30);

/// Serves GET /api/v1/namespaces/NAME from `namespaces` (404 otherwise) and
/// writes a kubeconfig for it into `dir`.
async fn namespace_api(namespaces: HashMap<String, Value>, dir: &Path) -> std::path::PathBuf {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let namespaces = Arc::new(namespaces);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let namespaces = namespaces.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<_>| {
                    let found = req
                        .uri()
                        .path()
                        .strip_prefix("/api/v1/namespaces/")
                        .and_then(|name| namespaces.get(name).cloned());
                    async move {
                        let (status, body) = match found {
                            Some(ns) => (200, ns),
                            None => (
                                404,
                                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404, "message": "not found"}),
                            ),
                        };
                        let mut rsp = http::Response::new(http_body_util::Full::new(
                            hyper::body::Bytes::from(body.to_string()),
                        ));
                        *rsp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        rsp.headers_mut().insert(
                            "content-type",
                            http::HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, std::convert::Infallible>(rsp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: t\n  user: {{}}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: t\n\
             current-context: t\n"
        ),
    )
    .unwrap();
    path
}

fn namespace(name: &str, annotations: Value) -> (String, Value) {
    (
        name.to_string(),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": annotations}}),
    )
}

struct Webhook {
    process: Logged,
    addr: SocketAddr,
    admin: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    /// The trust anchors it gives injected proxies.
    anchors_pem: String,
    _dir: tempfile::TempDir,
}

impl Webhook {
    async fn start() -> Webhook {
        let dir = tempfile::tempdir().unwrap();
        let certs = WebhookTls::generate(
            "ballast-injector",
            "ballast",
            "cluster.local",
            WEBHOOK_CERT_LIFETIME,
        )
        .unwrap();
        std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &certs.key_pem).unwrap();
        // Any certificate makes trust anchors for the proxies it injects.
        std::fs::write(dir.path().join("anchors.crt"), &certs.ca_pem).unwrap();
        let kubeconfig = namespace_api(
            HashMap::from([
                namespace("shop", json!({"linkerd.io/inject": "enabled"})),
                namespace("plain", json!({})),
            ]),
            dir.path(),
        )
        .await;

        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ballast"));
        cmd.arg("injector")
            .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--max-body-bytes", "64KiB"])
            .arg("--identity-trust-anchors-file")
            .arg(dir.path().join("anchors.crt"));
        let mut process = Logged::spawn(cmd);
        let addr = process.listening("injector listening on ", 1).await[0];
        let admin = process.listening("admin listening on ", 1).await[0];

        let mut roots = rustls::RootCertStore::empty();
        for c in ballast_meshtls::pem::certificates(certs.ca_pem.as_bytes()).unwrap() {
            roots.add(c).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        Webhook {
            process,
            addr,
            admin,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            anchors_pem: certs.ca_pem.clone(),
            _dir: dir,
        }
    }

    /// POSTs `body` to `path` over TLS as the API server would dial
    /// (`ballast-injector.ballast.svc`); returns status and body.
    async fn post(&self, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        tokio::time::timeout(DEADLINE, async {
            let tcp = TcpStream::connect(self.addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("ballast-injector.ballast.svc").unwrap();
            let mut tls = self.tls.connect(name, tcp).await.expect("TLS handshake");
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: ballast-injector.ballast.svc\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            // The server may answer (413) before taking the whole body.
            let _ = tls.write_all(body).await;
            let mut rsp = Vec::new();
            let _ = tls.read_to_end(&mut rsp).await;
            let split = rsp
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("an HTTP response");
            let status: u16 = String::from_utf8_lossy(&rsp[..split])
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("a status");
            (status, rsp[split + 4..].to_vec())
        })
        .await
        .expect("an answer before the deadline")
    }

    /// Sends a review of `pod` created in `ns`; returns the response object.
    async fn review(&self, uid: &str, ns: &str, pod: &Value) -> Value {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": ns,
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": pod,
                "oldObject": null,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        });
        let (status, body) = self.post("/inject", review.to_string().as_bytes()).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("a JSON review");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], uid, "the uid is echoed");
        answer["response"].clone()
    }
}

fn pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-5d9c8-",
            "labels": {"app": "web", "pod-template-hash": "5d9c8"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9c8",
                                 "uid": "0a1b", "controller": true}],
        },
        "spec": {
            "serviceAccountName": "web",
            "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}],
        },
    })
}

/// The pod the response's patch makes of `pod` (none: no patch).
fn patched(response: &Value, pod: &Value) -> Option<Value> {
    assert_eq!(response["allowed"], true);
    let patch = response.get("patch")?;
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("base64"))
        .expect("base64");
    // Applied as the API server applies it: by an RFC 6902 implementation
    // of its own.
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("an RFC 6902 JSON Patch");
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    Some(pod)
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|l| l.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn pods_are_injected_as_their_namespace_or_annotation_says() {
    let hook = Webhook::start().await;

    // A pod in an annotated namespace: the patch adds the proxy and init.
    let plain_pod = pod(json!({}));
    let rsp = hook.review("uid-1", "shop", &plain_pod).await;
    let injected = patched(&rsp, &plain_pod).expect("a patch");
    let spec = &injected["spec"];
    assert!(
        names(&spec["containers"]).contains(&PROXY_CONTAINER),
        "{spec}"
    );
    assert!(
        names(&spec["initContainers"]).contains(&INIT_CONTAINER),
        "{spec}"
    );
    assert!(names(&spec["containers"]).contains(&"web"), "the app stays");
    // The same as `ballast inject` in webhook mode would make it.
    let mut expected = plain_pod.clone();
    let annotations = json!({"linkerd.io/inject": "enabled"});
    ballast_inject::inject_pod(
        &mut expected,
        annotations.as_object(),
        ballast_inject::Mode::Webhook,
        &ballast_inject::Config {
            trust_anchors_pem: Some(hook.anchors_pem.clone()),
            ..ballast_inject::Config::default()
        },
    )
    .unwrap();
    assert_eq!(injected, expected);

    // No annotation on the pod or its namespace: admitted unchanged.
    let rsp = hook.review("uid-2", "plain", &plain_pod).await;
    assert!(patched(&rsp, &plain_pod).is_none(), "{rsp}");
    // A namespace the API does not know: no annotations either.
    let rsp = hook.review("uid-3", "nowhere", &plain_pod).await;
    assert!(patched(&rsp, &plain_pod).is_none(), "{rsp}");
    // `disabled` on the pod wins over its namespace's `enabled`.
    let disabled = pod(json!({"linkerd.io/inject": "disabled"}));
    let rsp = hook.review("uid-4", "shop", &disabled).await;
    assert!(patched(&rsp, &disabled).is_none(), "{rsp}");
    // `enabled` on the pod in a plain namespace.
    let enabled = pod(json!({"linkerd.io/inject": "enabled"}));
    let rsp = hook.review("uid-5", "plain", &enabled).await;
    let injected = patched(&rsp, &enabled).expect("a patch");
    assert!(names(&injected["spec"]["containers"]).contains(&PROXY_CONTAINER));

    // An invalid annotation value: admitted unchanged with a warning
    // (--failure-policy Ignore, the default), never a crash.
    let bad = pod(
        json!({"linkerd.io/inject": "enabled", "config.linkerd.io/proxy-memory-limit": "lots"}),
    );
    let rsp = hook.review("uid-6", "plain", &bad).await;
    assert!(patched(&rsp, &bad).is_none(), "{rsp}");
    assert!(
        rsp["warnings"][0]
            .as_str()
            .unwrap_or("")
            .contains("proxy-memory-limit"),
        "{rsp}"
    );

    let (status, metrics) = http_get(hook.admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("injector_admission_reviews_total{result=\"injected\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("injector_admission_reviews_total{result=\"skipped\"} 3"));
    assert!(metrics.contains("injector_admission_reviews_total{result=\"error\"} 1"));
    if let Some(page) = support::openmetrics::check_page(hook.admin, "injector").await {
        page.assert_has("injector_admission_reviews", "counter");
    }
}

#[tokio::test]
async fn malformed_and_oversized_reviews_are_refused_and_the_server_keeps_serving() {
    let mut hook = Webhook::start().await;
    let (status, body) = hook.post("/inject", b"{this is not json").await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not JSON"));

    let (status, body) = hook
        .post(
            "/inject",
            json!({"apiVersion": "v1", "kind": "Pod"})
                .to_string()
                .as_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not an admission.k8s.io/v1 AdmissionReview"));

    let no_uid =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}});
    let (status, body) = hook.post("/inject", no_uid.to_string().as_bytes()).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("uid"));

    // A uid but no pod: answered as a review, per the failure policy.
    let not_pod = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "uid-x", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                                     "operation": "CREATE", "object": {}}});
    let (status, body) = hook.post("/inject", not_pod.to_string().as_bytes()).await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "uid-x");
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());

    // Over --max-body-bytes (64 KiB): 413, whole or announced.
    let mut big = pod(json!({}));
    big["metadata"]["annotations"]["filler"] = json!("x".repeat(100 * 1024));
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": {"uid": "uid-big", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                    "namespace": "shop", "operation": "CREATE", "object": big}});
    let (status, _) = hook.post("/inject", review.to_string().as_bytes()).await;
    assert_eq!(status, 413);
    // Another path: 404.
    let (status, _) = hook.post("/", b"{}").await;
    assert_eq!(status, 404);

    // Still serving.
    let p = pod(json!({}));
    let rsp = hook.review("uid-after", "shop", &p).await;
    assert!(patched(&rsp, &p).is_some());
    let (_, metrics) = http_get(hook.admin, "/metrics").await;
    assert!(
        metrics.contains("injector_admission_reviews_total{result=\"malformed\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("injector_requests_refused_total{reason=\"too_large\"} 1"),
        "{metrics}"
    );

    // SIGTERM: a clean exit.
    let pid = hook.process.pid() as i32;
    assert_eq!(sigterm(pid), 0);
    let status = tokio::time::timeout(DEADLINE, hook.process.child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// Sends SIGTERM with the `kill` command (no unsafe code in tests).
fn sigterm(pid: i32) -> i32 {
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .map(|s| s.code().unwrap_or(1))
        .unwrap_or(1)
}

/// An injector with identity on and no trust anchors would inject pods
/// that never start: it refuses to start instead, saying what to pass.
#[test]
fn an_injector_without_trust_anchors_refuses_to_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "injector",
            "--addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            "/nonexistent/tls.key",
        ])
        .output()
        .expect("ballast runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--identity-trust-anchors-file"), "{err}");
}
