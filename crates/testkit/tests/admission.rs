//! Admission through stored MutatingWebhookConfigurations: a real HTTPS webhook on
//! 127.0.0.1, called by the API server emulation on writes over HTTP (the real kube
//! client) and in process.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast_testkit::{AdmissionOutcome, ApiServer, ServiceRef};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};
use tokio::net::TcpListener;

const DEADLINE: Duration = Duration::from_secs(10);

/// What the webhook answers a review request with: a delay, then the `response`
/// fields besides `uid`.
type Answer = Arc<dyn Fn(&Value) -> (Duration, Value) + Send + Sync>;

/// A CA and an HTTPS AdmissionReview server whose certificate it signed (for
/// 127.0.0.1 and `hook.ns1.svc`).
struct Webhook {
    addr: SocketAddr,
    ca_bundle: String,
    reviews: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ca() -> (String, CertificateParams, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().expect("ca key");
    let cert = params.self_signed(&key).expect("ca certificate");
    (cert.pem(), params, key)
}

impl Webhook {
    async fn start(answer: Answer) -> Webhook {
        let (ca_pem, ca_params, ca_key) = ca();
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let leaf_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "hook.ns1.svc".to_string()])
                .expect("leaf params");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = leaf_params
            .signed_by(&leaf_key, &issuer)
            .expect("leaf certificate");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).expect("key der"),
        )
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let seen = reviews.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let answer = answer.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    // Handshakes a client refuses (a wrong CA) end here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let answer = answer.clone();
                            let seen = seen.clone();
                            async move {
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let review: Value =
                                    serde_json::from_slice(&body).unwrap_or(Value::Null);
                                seen.lock().expect("reviews").push(review.clone());
                                let (delay, mut response) = answer(&review);
                                tokio::time::sleep(delay).await;
                                response["uid"] = review["request"]["uid"].clone();
                                let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
                                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(
                                    out.to_string(),
                                ))))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Webhook {
            addr,
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca_pem),
            reviews,
            task,
        }
    }

    fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().expect("reviews").clone()
    }

    fn url_config(&self) -> Value {
        json!({"url": format!("https://{}/mutate", self.addr), "caBundle": self.ca_bundle})
    }
}

fn patch_answer(ops: Value) -> Answer {
    Arc::new(move |_| {
        let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
        (
            Duration::ZERO,
            json!({"allowed": true, "patchType": "JSONPatch", "patch": patch}),
        )
    })
}

fn injecting() -> Answer {
    patch_answer(json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"injected": "yes"}},
    ]))
}

/// A MutatingWebhookConfiguration with one webhook on Pod creates; `extra` merges
/// into the webhook.
fn configuration(name: &str, client_config: Value, extra: Value) -> Value {
    let mut hook = json!({
        "name": format!("{name}.testkit.io"),
        "clientConfig": client_config,
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    });
    json_patch::merge(&mut hook, &extra);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    })
}

fn pod(name: &str, namespace: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

async fn client(server: &ApiServer) -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = server.write_kubeconfig(dir.path());
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig parses");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads");
    config.default_retry = false;
    Client::try_from(config).expect("client builds")
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected a Status answer, got {other:?}"),
    }
}

#[tokio::test]
async fn a_webhook_patch_is_applied_and_seen_through_the_kube_client() {
    let hook = Webhook::start(injecting()).await;
    let server = ApiServer::start().await;
    server.apply(configuration("inject", hook.url_config(), json!({})));
    let pods: Api<Pod> = Api::namespaced(client(&server).await, "ns1");
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod("p1", "ns1")).expect("pod"),
        )
        .await
        .expect("admitted");
    let injected = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("injected"))
            .cloned()
    };
    assert_eq!(injected(&created).as_deref(), Some("yes"));
    assert_eq!(
        injected(&pods.get("p1").await.expect("get")).as_deref(),
        Some("yes")
    );

    let reviews = hook.reviews();
    assert_eq!(reviews.len(), 1);
    let req = &reviews[0]["request"];
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(req["resource"]["resource"], "pods");
    assert_eq!(req["namespace"], "ns1");
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["object"]["metadata"]["name"], "p1");
    assert!(req["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(req["userInfo"]["username"].is_string());

    let calls = server.admission_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].webhook, "inject.testkit.io");
    assert_eq!(
        calls[0].outcome,
        AdmissionOutcome::Allowed { patched: true }
    );

    // In-process creates take the same path; other kinds are not sent.
    let q = server.create(pod("p2", "ns1")).await.expect("admitted");
    assert_eq!(q["metadata"]["annotations"]["injected"], "yes");
    server
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns1"}}))
        .await
        .expect("not a pod");
    assert_eq!(hook.reviews().len(), 2);
}

#[tokio::test]
async fn a_denial_refuses_the_write_with_the_webhooks_status() {
    let hook = Webhook::start(Arc::new(|_| {
        (
            Duration::ZERO,
            json!({"allowed": false, "status": {"code": 403, "message": "pods need a team label"}}),
        )
    }))
    .await;
    let server = ApiServer::start().await;
    server.apply(configuration("deny", hook.url_config(), json!({})));
    let pods: Api<Pod> = Api::namespaced(client(&server).await, "ns1");
    let status = api_status(
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod("p1", "ns1")).expect("pod"),
        )
        .await
        .expect_err("denied"),
    );
    assert_eq!(status.code, 403);
    assert!(
        status.message.contains(
            "admission webhook \"deny.testkit.io\" denied the request: pods need a team label"
        ),
        "{}",
        status.message
    );
    assert!(server.get("pods", "ns1", "p1").is_none());
    assert!(matches!(
        &server.admission_calls()[0].outcome,
        AdmissionOutcome::Denied { code: 403, .. }
    ));
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_closed_or_is_ignored() {
    let hook = Webhook::start(injecting()).await;
    let (other_ca, _, _) = ca();
    let wrong = json!({
        "url": format!("https://{}/mutate", hook.addr),
        "caBundle": base64::engine::general_purpose::STANDARD.encode(other_ca),
    });
    let server = ApiServer::start().await;
    server.apply(configuration(
        "strict",
        wrong.clone(),
        json!({"failurePolicy": "Fail"}),
    ));
    let err = server
        .create(pod("p1", "ns1"))
        .await
        .expect_err("fails closed");
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert!(
        err.message
            .contains("failed calling webhook \"strict.testkit.io\""),
        "{}",
        err.message
    );
    assert!(err.message.contains("certificate"), "{}", err.message);
    assert!(server.get("pods", "ns1", "p1").is_none());

    server.apply(configuration(
        "strict",
        wrong,
        json!({"failurePolicy": "Ignore"}),
    ));
    let created = server.create(pod("p1", "ns1")).await.expect("ignored");
    assert!(
        created["metadata"].get("annotations").is_none(),
        "admitted unchanged"
    );
    let calls = server.admission_calls();
    assert!(
        matches!(
            &calls[1].outcome,
            AdmissionOutcome::Failed { ignored: true, .. }
        ),
        "{:?}",
        calls[1]
    );
    assert!(
        hook.reviews().is_empty(),
        "no review crossed a refused handshake"
    );
}

#[tokio::test]
async fn a_slow_webhook_times_out_within_timeout_seconds() {
    let hook = Webhook::start(Arc::new(|_| {
        (Duration::from_secs(5), json!({"allowed": true}))
    }))
    .await;
    let server = ApiServer::start().await;
    server.apply(configuration(
        "slow",
        hook.url_config(),
        json!({"timeoutSeconds": 1}),
    ));
    let started = std::time::Instant::now();
    let err = server
        .create(pod("p1", "ns1"))
        .await
        .expect_err("timed out");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.code, 500);
    assert!(
        err.message.contains("slow.testkit.io") && err.message.contains("deadline"),
        "{}",
        err.message
    );
    let calls = server.admission_calls();
    assert!(
        calls[0].duration >= Duration::from_millis(900),
        "{:?}",
        calls[0].duration
    );
}

#[tokio::test]
async fn namespace_and_object_selectors_exclude() {
    let hook = Webhook::start(injecting()).await;
    let server = ApiServer::start().await;
    server.apply(configuration(
        "selective",
        hook.url_config(),
        json!({
            "namespaceSelector": {
                "matchLabels": {"mesh": "on"},
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}],
            },
            "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        }),
    ));
    for (name, labels) in [
        ("meshed", json!({"mesh": "on"})),
        ("plain", json!({})),
        ("kube-system", json!({"mesh": "on"})),
    ] {
        server
            .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}))
            .await
            .expect("namespace");
    }
    let annotated = |v: &Value| v["metadata"]["annotations"]["injected"] == "yes";
    assert!(annotated(
        &server.create(pod("a", "meshed")).await.expect("create")
    ));
    assert!(!annotated(
        &server.create(pod("b", "plain")).await.expect("create")
    ));
    assert!(!annotated(
        &server
            .create(pod("c", "kube-system"))
            .await
            .expect("create")
    ));
    let mut skipped = pod("d", "meshed");
    skipped["metadata"]["labels"]["skip"] = json!("true");
    assert!(!annotated(&server.create(skipped).await.expect("create")));
    assert_eq!(hook.reviews().len(), 1, "only the selected pod was sent");
}

#[tokio::test]
async fn a_service_reference_goes_through_the_dialer() {
    let hook = Webhook::start(injecting()).await;
    let server = ApiServer::start().await;
    let service = json!({
        "service": {"namespace": "ns1", "name": "hook", "port": 8443, "path": "/mutate"},
        "caBundle": hook.ca_bundle,
    });
    server.apply(configuration("svc", service, json!({})));
    let err = server
        .create(pod("p1", "ns1"))
        .await
        .expect_err("no dialer");
    assert!(err.message.contains("no service dialer"), "{}", err.message);

    let dialed = Arc::new(Mutex::new(Vec::new()));
    let (addr, seen) = (hook.addr, dialed.clone());
    server.set_service_dialer(move |svc: ServiceRef| {
        seen.lock().expect("dialed").push(svc);
        tokio::net::TcpStream::connect(addr)
    });
    let created = server.create(pod("p1", "ns1")).await.expect("admitted");
    assert_eq!(created["metadata"]["annotations"]["injected"], "yes");
    assert_eq!(
        dialed.lock().expect("dialed").as_slice(),
        &[ServiceRef {
            namespace: "ns1".into(),
            name: "hook".into(),
            port: 8443
        }]
    );
    // The API server waits on nothing else: the call is recorded by the time create returns.
    assert!(
        server
            .wait_until(DEADLINE, |s| s.admission_calls().len() == 2)
            .await
    );
}

#[tokio::test]
async fn an_answer_over_the_bound_is_a_failure() {
    let padding = "x".repeat(ballast_testkit::api_server::MAX_ANSWER + 1);
    let hook = Webhook::start(Arc::new(move |_| {
        (Duration::ZERO, json!({"allowed": true, "padding": padding}))
    }))
    .await;
    let server = ApiServer::start().await;
    server.apply(configuration("big", hook.url_config(), json!({})));
    let err = server.create(pod("p1", "ns1")).await.expect_err("too big");
    assert_eq!(err.code, 500);
    assert!(err.message.contains("big.testkit.io"), "{}", err.message);
    assert!(matches!(
        &server.admission_calls()[0].outcome,
        AdmissionOutcome::Failed { ignored: false, .. }
    ));
}

#[tokio::test]
async fn updates_are_reviewed_when_a_rule_asks_and_validating_webhooks_judge_the_result() {
    let hook = Webhook::start(Arc::new(|review: &Value| {
        let req = &review["request"];
        if req["operation"] == "UPDATE" && req["object"]["data"]["forbidden"].is_string() {
            return (
                Duration::ZERO,
                json!({"allowed": false, "status": {"code": 422, "message": "no forbidden keys"}}),
            );
        }
        (Duration::ZERO, json!({"allowed": true}))
    }))
    .await;
    let server = ApiServer::start().await;
    let mut config = configuration("validate", hook.url_config(), json!({}));
    config["kind"] = json!("ValidatingWebhookConfiguration");
    config["webhooks"][0]["rules"] = json!([{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]);
    server.apply(config);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns1"}, "data": {"a": "1"}});
    server.create(cm).await.expect("creates are not reviewed");
    assert!(hook.reviews().is_empty());
    server
        .patch_merge("configmaps", "ns1", "c", json!({"data": {"b": "2"}}))
        .await
        .expect("allowed update");
    let err = server
        .patch_merge(
            "configmaps",
            "ns1",
            "c",
            json!({"data": {"forbidden": "x"}}),
        )
        .await
        .expect_err("denied update");
    assert_eq!(err.code, 422);
    assert!(server.get("configmaps", "ns1", "c").expect("kept")["data"]
        .get("forbidden")
        .is_none());
    let reviews = hook.reviews();
    assert_eq!(reviews.len(), 2);
    assert_eq!(reviews[0]["request"]["operation"], "UPDATE");
    assert_eq!(
        reviews[0]["request"]["oldObject"]["data"],
        json!({"a": "1"})
    );
    assert_eq!(server.admission_calls()[0].phase, "validating");
}

#[tokio::test]
async fn pods_the_controllers_create_pass_admission() {
    use ballast_testkit::cluster::controllers::Controllers;
    let hook = Webhook::start(injecting()).await;
    let server = Arc::new(ApiServer::start().await);
    server.apply(configuration("inject", hook.url_config(), json!({})));
    let _controllers = Controllers::start(server.clone(), "node-1");
    server
        .create(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns1"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
            },
        }))
        .await
        .expect("deployment");
    let injected = |s: &ApiServer| {
        let pods = s.list("pods");
        pods.len() == 2
            && pods
                .iter()
                .all(|p| p["metadata"]["annotations"]["injected"] == "yes")
    };
    assert!(
        server.wait_until(DEADLINE, injected).await,
        "{:#?}",
        server.list("pods")
    );
    let reviewed: Vec<Value> = hook
        .reviews()
        .iter()
        .map(|r| r["request"]["object"]["metadata"]["ownerReferences"][0]["kind"].clone())
        .collect();
    assert_eq!(reviewed, [json!("ReplicaSet"), json!("ReplicaSet")]);
}
