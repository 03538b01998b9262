//! Admission through the stored MutatingWebhookConfigurations and
//! ValidatingWebhookConfigurations, as the API server calls webhooks: AdmissionReview
//! v1 over HTTPS to `clientConfig.url` or a Service (through the dialer the cluster
//! installs), the server certificate checked against `caBundle`, within
//! `timeoutSeconds`; JSONPatch answers applied; `failurePolicy` on failures.
//!
//! Bounded: a webhook's answer is read up to [`MAX_ANSWER`] bytes; a call lasts at
//! most `timeoutSeconds` (1 to 30, default 10), connection and TLS included.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::resources::{self, RESOURCES};
use super::selector::{bounded, label_selector_matches};
use super::write::ApiError;
use super::{lock, Shared};

/// The most bytes of a webhook's answer read (as the API server's 3 MiB request bound).
pub const MAX_ANSWER: usize = 3 * 1024 * 1024;

/// How many webhook calls are recorded for [`crate::ApiServer::admission_calls`]; older
/// ones are dropped first.
const MAX_RECORDS: usize = 10_000;

/// A Service a webhook's `clientConfig.service` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    /// `clientConfig.service.port`, 443 when not given.
    pub port: u16,
}

/// Connects to a Service for a webhook call (the cluster resolves it to a pod and
/// connects from inside the network), installed with
/// [`crate::ApiServer::set_service_dialer`].
pub type ServiceDialer = Arc<
    dyn Fn(ServiceRef) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>> + Send + Sync,
>;

/// What one webhook call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionOutcome {
    /// Admitted; `patched` when a patch was applied.
    Allowed { patched: bool },
    /// Refused by the webhook with this code and message.
    Denied { code: u16, message: String },
    /// The call failed (connect, TLS, timeout, bad answer); `ignored` under
    /// `failurePolicy: Ignore`, else the write was refused.
    Failed { cause: String, ignored: bool },
}

/// One webhook call, as recorded for tests.
#[derive(Debug, Clone)]
pub struct AdmissionCall {
    /// The webhook configuration's name.
    pub configuration: String,
    /// The webhook's name within it.
    pub webhook: String,
    /// `mutating` or `validating`.
    pub phase: &'static str,
    /// `CREATE` or `UPDATE`.
    pub operation: String,
    /// The resource plural, e.g. `pods`.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The object sent in the review.
    pub object: Value,
    pub outcome: AdmissionOutcome,
    pub duration: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Create,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

/// Runs the mutating webhooks (in configuration name order, each webhook in its
/// order) then the validating ones; returns the object to store or the refusal.
pub(crate) async fn admit(
    shared: &Arc<Shared>,
    resource: usize,
    op: Operation,
    mut obj: Value,
    old: Option<&Value>,
    dry_run: bool,
) -> Result<Value, ApiError> {
    for (phase, plural) in [
        ("mutating", "mutatingwebhookconfigurations"),
        ("validating", "validatingwebhookconfigurations"),
    ] {
        let configs = stored(shared, plural);
        if configs.is_empty() {
            continue;
        }
        let ns_labels = namespace_labels(shared, resource, &obj);
        for config in configs {
            let config_name = config
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some(hooks) = config.get("webhooks").and_then(Value::as_array) else {
                continue;
            };
            for hook in hooks {
                if !applies(hook, resource, op, &obj, old, &ns_labels) {
                    continue;
                }
                obj = call_one(
                    shared,
                    Review {
                        configuration: config_name,
                        phase,
                        hook,
                        resource,
                        op,
                        old,
                        dry_run,
                    },
                    obj,
                )
                .await?;
            }
        }
    }
    Ok(obj)
}

fn stored(shared: &Shared, plural: &str) -> Vec<Value> {
    let Some(resource) = resources::by_plural(plural) else {
        return Vec::new();
    };
    let store = lock(&shared.store);
    store
        .page(resource, store.rv(), None, None, 0, |_| true)
        .map(|p| p.items.iter().map(|o| (**o).clone()).collect())
        .unwrap_or_default()
}

/// The labels a `namespaceSelector` is matched against: the object's Namespace's (its
/// own for a Namespace); `None` for other cluster-scoped objects, which every
/// namespaceSelector admits.
fn namespace_labels(shared: &Shared, resource: usize, obj: &Value) -> Option<Value> {
    let rt = &RESOURCES[resource];
    if rt.plural == "namespaces" {
        return Some(
            obj.pointer("/metadata/labels")
                .cloned()
                .unwrap_or(json!({})),
        );
    }
    if !rt.namespaced {
        return None;
    }
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let stored = resources::by_plural("namespaces")
        .and_then(|n| lock(&shared.store).get(n, &(String::new(), ns.to_string())));
    let mut labels = stored
        .and_then(|n| n.pointer("/metadata/labels").cloned())
        .unwrap_or(json!({}));
    if let Some(map) = labels.as_object_mut() {
        map.insert("kubernetes.io/metadata.name".into(), json!(ns));
    }
    Some(labels)
}

fn applies(
    hook: &Value,
    resource: usize,
    op: Operation,
    obj: &Value,
    old: Option<&Value>,
    ns_labels: &Option<Value>,
) -> bool {
    let rt = &RESOURCES[resource];
    let rules = hook
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let listed = |field: &str, rule: &Value, want: &str| {
        rule.get(field)
            .and_then(Value::as_array)
            .is_some_and(|vs| vs.iter().any(|v| v == "*" || v == want))
    };
    let rule_matches = rules.iter().any(|rule| {
        let resources_ok = rule
            .get("resources")
            .and_then(Value::as_array)
            .is_some_and(|vs| {
                // `pods/*` names subresources only, which are not reviewed here.
                vs.iter().any(|v| v == "*" || v == "*/*" || v == rt.plural)
            });
        let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
            "Cluster" => !rt.namespaced,
            "Namespaced" => rt.namespaced,
            _ => true,
        };
        listed("operations", rule, op.as_str())
            && listed("apiGroups", rule, rt.group)
            && listed("apiVersions", rule, rt.version)
            && resources_ok
            && scope_ok
    });
    if !rule_matches {
        return false;
    }
    let selects = |selector: Option<&Value>, labels: &Value| {
        // A malformed selector selects nothing, as the API server refuses to store one.
        label_selector_matches(selector.unwrap_or(&Value::Null), labels).unwrap_or(false)
    };
    if let Some(labels) = ns_labels {
        if !selects(hook.get("namespaceSelector"), labels) {
            return false;
        }
    }
    let labels_of = |o: &Value| o.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
    let object_selector = hook.get("objectSelector");
    selects(object_selector, &labels_of(obj))
        || old.is_some_and(|o| selects(object_selector, &labels_of(o)))
}

/// One webhook's review of one write.
struct Review<'a> {
    configuration: &'a str,
    phase: &'static str,
    hook: &'a Value,
    resource: usize,
    op: Operation,
    old: Option<&'a Value>,
    dry_run: bool,
}

async fn call_one(shared: &Arc<Shared>, review: Review<'_>, obj: Value) -> Result<Value, ApiError> {
    let Review {
        configuration,
        phase,
        hook,
        resource,
        op,
        old,
        dry_run,
    } = review;
    let rt = &RESOURCES[resource];
    let hook_name = hook
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let uid = format!("{:032x}", rand::random::<u128>());
    let meta = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (namespace, name) = (meta("namespace"), meta("name"));
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
            "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
            "name": name,
            "namespace": namespace,
            "operation": op.as_str(),
            "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": old.cloned().unwrap_or(Value::Null),
            "dryRun": dry_run,
            "options": if op == Operation::Create {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"})
            } else {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"})
            },
        }
    });
    let timeout = Duration::from_secs(
        hook.get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let started = Instant::now();
    let dialer = lock(&shared.dialer).clone();
    let answer = match tokio::time::timeout(timeout, post(hook, dialer, &review)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "context deadline exceeded (timeoutSeconds {})",
            timeout.as_secs()
        )),
    };
    let verdict = answer.and_then(|review| judge(review, &uid, phase, obj.clone()));
    let ignore = hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
    let (result, outcome) = match verdict {
        Ok(Verdict::Allowed(new, patched)) => (Ok(new), AdmissionOutcome::Allowed { patched }),
        Ok(Verdict::Denied(code, message)) => {
            let full = format!("admission webhook {hook_name:?} denied the request: {message}");
            let reason = if code == 403 {
                "Forbidden"
            } else {
                super::status::reason(code)
            };
            (
                Err(ApiError::with_reason(code, reason, full)),
                AdmissionOutcome::Denied { code, message },
            )
        }
        Err(cause) if ignore => (
            Ok(obj.clone()),
            AdmissionOutcome::Failed {
                cause,
                ignored: true,
            },
        ),
        Err(cause) => (
            Err(ApiError::new(
                500,
                format!("Internal error occurred: failed calling webhook {hook_name:?}: {cause}"),
            )),
            AdmissionOutcome::Failed {
                cause,
                ignored: false,
            },
        ),
    };
    let mut calls = lock(&shared.admission_calls);
    if calls.len() >= MAX_RECORDS {
        calls.remove(0);
    }
    calls.push(AdmissionCall {
        configuration: configuration.to_string(),
        webhook: hook_name,
        phase,
        operation: op.as_str().to_string(),
        resource: rt.plural.to_string(),
        namespace,
        name,
        object: obj,
        outcome,
        duration: started.elapsed(),
    });
    drop(calls);
    shared.notify();
    result
}

enum Verdict {
    Allowed(Value, bool),
    Denied(u16, String),
}

/// A webhook's AdmissionReview answer to a verdict; the error is the failure cause.
fn judge(review: Value, uid: &str, phase: &str, mut obj: Value) -> Result<Verdict, String> {
    let response = review.get("response").ok_or("the answer has no response")?;
    if response.get("uid").and_then(Value::as_str) != Some(uid) {
        return Err(format!(
            "expected response.uid={uid:?}, got {}",
            bounded(
                &response
                    .get("uid")
                    .map(Value::to_string)
                    .unwrap_or_default()
            )
        ));
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let status = response.get("status").cloned().unwrap_or(Value::Null);
        let code = status
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| (400..600).contains(c))
            .unwrap_or(403);
        let message = status
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        return Ok(Verdict::Denied(code, message));
    }
    let Some(patch) = response.get("patch").and_then(Value::as_str) else {
        return Ok(Verdict::Allowed(obj, false));
    };
    if phase != "mutating" {
        return Err("a validating webhook answered with a patch".to_string());
    }
    match response.get("patchType").and_then(Value::as_str) {
        Some("JSONPatch") => {}
        other => return Err(format!("unsupported patchType {other:?}")),
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    let ops: json_patch::Patch = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the patch is not a JSON Patch: {e}"))?;
    json_patch::patch(&mut obj, &ops).map_err(|e| format!("the patch cannot be applied: {e}"))?;
    Ok(Verdict::Allowed(obj, true))
}

/// Where a webhook is reached: the address to dial, the TLS server name, the path.
enum Endpoint {
    Url {
        host: String,
        port: u16,
        path: String,
    },
    Service {
        svc: ServiceRef,
        path: String,
    },
}

fn endpoint(client: &Value) -> Result<Endpoint, String> {
    if let Some(url) = client.get("url").and_then(Value::as_str) {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("bad clientConfig.url {:?}: {e}", bounded(url)))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("clientConfig.url {:?} is not https", bounded(url)));
        }
        let host = uri.host().ok_or("clientConfig.url has no host")?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let path = uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.to_string());
        return Ok(Endpoint::Url {
            host,
            port: uri.port_u16().unwrap_or(443),
            path,
        });
    }
    let svc = client
        .get("service")
        .ok_or("clientConfig has neither url nor service")?;
    let s = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let port = svc.get("port").and_then(Value::as_u64).unwrap_or(443);
    let port = u16::try_from(port)
        .map_err(|_| format!("clientConfig.service.port {port} is out of range"))?;
    let path = svc
        .get("path")
        .and_then(Value::as_str)
        .unwrap_or("/")
        .to_string();
    Ok(Endpoint::Service {
        svc: ServiceRef {
            namespace: s("namespace"),
            name: s("name"),
            port,
        },
        path,
    })
}

fn tls_config(client: &Value) -> Result<rustls::ClientConfig, String> {
    let bundle = client.get("caBundle").and_then(Value::as_str).unwrap_or("");
    if bundle.is_empty() {
        return Err("clientConfig.caBundle is empty (no system roots in the testkit)".to_string());
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(bundle)
        .map_err(|e| format!("caBundle is not base64: {e}"))?;
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("caBundle holds no certificate".to_string());
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

/// POSTs the review and reads the answer (bounded by [`MAX_ANSWER`]).
async fn post(
    hook: &Value,
    dialer: Option<ServiceDialer>,
    review: &Value,
) -> Result<Value, String> {
    let client = hook
        .get("clientConfig")
        .ok_or("the webhook has no clientConfig")?;
    let config = tls_config(client)?;
    let (tcp, server_name, path) = match endpoint(client)? {
        Endpoint::Url { host, port, path } => {
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
            (tcp, host, path)
        }
        Endpoint::Service { svc, path } => {
            let dialer = dialer.ok_or_else(|| {
                format!(
                    "dial service {}/{}:{}: no service dialer installed",
                    svc.namespace, svc.name, svc.port
                )
            })?;
            let name = format!("{}.{}.svc", svc.name, svc.namespace);
            let tcp = dialer(svc.clone()).await.map_err(|e| {
                format!(
                    "dial service {}/{}:{}: {e}",
                    svc.namespace, svc.name, svc.port
                )
            })?;
            (tcp, name, path)
        }
    };
    let sni = rustls::pki_types::ServerName::try_from(server_name.clone())
        .map_err(|e| format!("bad server name {server_name:?}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(sni, tcp)
        .await
        .map_err(|e| format!("tls: failed to verify certificate for {server_name}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http: {e}"))?;
    let driver = tokio::spawn(conn);
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let req = http::Request::post(path)
        .header(http::header::HOST, server_name)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let answer = async {
        let res = sender
            .send_request(req)
            .await
            .map_err(|e| format!("http: {e}"))?;
        let status = res.status();
        let bytes = Limited::new(res.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("reading the answer (at most {MAX_ANSWER} bytes): {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("the webhook answered HTTP {status}"));
        }
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| format!("the answer is not an AdmissionReview: {e}"))
    }
    .await;
    driver.abort();
    answer
}
