//! The snapshot from a cluster: a few LISTs and GETs through the kube client,
//! bounded.
//!
//! What it reads: pods and services in every namespace; Deployments and
//! ServiceAccounts in the control plane namespace; ClusterRoles and
//! ClusterRoleBindings; the control plane Namespace, the trust roots
//! ConfigMap and the issuer Secret (by name: no Secret is listed, and only
//! the issuer's certificate is kept, never its key); the policy CRDs by
//! name; and the API server's clock from `/version`'s `Date` header.
//!
//! Bounds: LISTs are paged ([`ClusterOptions::page_size`]); at most
//! [`ClusterOptions::max_objects`] objects are read in all (more is an
//! error naming the flag); every request has [`ClusterOptions::timeout`],
//! and kube's retries are off, so a run takes at most about one timeout per
//! request.

use crate::control_plane::IDENTITY;
use crate::identity::{PkiObjects, ISSUER_KEYS};
use crate::report::Source;
use crate::snapshot::Snapshot;
use serde_json::Value;
use std::{path::PathBuf, time::Duration};

/// Default objects per LIST page (kube's and client-go's default).
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// Default cap on the objects read in all.
pub const DEFAULT_MAX_OBJECTS: usize = 200_000;
/// Default time each request has to complete, body included.
/// Trust anchors ConfigMaps of meshed pods read by name, at most.
const MAX_MOUNTED_CONFIG_MAPS: usize = 100;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the cluster and how much to read.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// A kubeconfig file; `None` infers (KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// The control plane namespace (a DNS label).
    pub namespace: String,
    /// Objects per LIST page. Default [`DEFAULT_PAGE_SIZE`].
    pub page_size: u32,
    /// Objects read in all. Default [`DEFAULT_MAX_OBJECTS`].
    pub max_objects: usize,
    /// Per request. Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            kubeconfig: None,
            namespace: crate::DEFAULT_NAMESPACE.to_string(),
            page_size: DEFAULT_PAGE_SIZE,
            max_objects: DEFAULT_MAX_OBJECTS,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Why the cluster could not be read. Each is one line, its cause stated once.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot load the kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("no Kubernetes configuration found ({0}); pass --kubeconfig, set KUBECONFIG, or run in a pod with a service account")]
    Infer(String),
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
    #[error("cannot reach the Kubernetes API server at {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("the Kubernetes API server at {server} did not answer {what} within {}s (--timeout)", timeout.as_secs_f64())]
    Timeout {
        server: String,
        what: String,
        timeout: Duration,
    },
    #[error("the Kubernetes API server refused {what}: {reason}")]
    Refused { what: String, reason: String },
    #[error("the cluster holds more than {max} objects of the kinds checked (stopped while listing {what}); raise --max-objects")]
    TooMany { max: usize, what: String },
}

/// An error and its sources, each cause once (kube's errors often repeat
/// their source's text in their own).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

async fn kube_config(opts: &ClusterOptions) -> Result<kube::Config, ClusterError> {
    let mut config = ballast_kubeconfig::load(opts.kubeconfig.as_deref())
        .await
        .map_err(|e| match e {
            ballast_kubeconfig::ConfigError::File { path, reason } => {
                ClusterError::Kubeconfig { path, reason }
            }
            ballast_kubeconfig::ConfigError::Infer { reason } => ClusterError::Infer(reason),
        })?;
    config.connect_timeout = Some(opts.timeout);
    config.read_timeout = Some(opts.timeout);
    config.write_timeout = Some(opts.timeout);
    // Every request is made once: the run's length stays bounded.
    config.default_retry = false;
    Ok(config)
}

/// A kube client and where it points.
struct Api {
    client: kube::Client,
    server: String,
    timeout: Duration,
    page_size: u32,
    max_objects: usize,
    read: usize,
}

impl Api {
    fn failed(&self, what: &str, e: kube::Error) -> ClusterError {
        match e {
            kube::Error::Api(s) => ClusterError::Refused {
                what: what.to_string(),
                reason: format!("{} {}: {}", s.code, s.reason, s.message),
            },
            other => ClusterError::Unreachable {
                server: self.server.clone(),
                reason: chain(&other),
            },
        }
    }

    async fn request(&self, what: &str, path: &str) -> Result<Option<Value>, ClusterError> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| ClusterError::Client(e.to_string()))?;
        let answer = tokio::time::timeout(self.timeout, self.client.request::<Value>(req)).await;
        match answer {
            Err(_) => Err(ClusterError::Timeout {
                server: self.server.clone(),
                what: what.to_string(),
                timeout: self.timeout,
            }),
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(None),
            Ok(Err(e)) => Err(self.failed(what, e)),
        }
    }

    /// One object, `None` when it does not exist.
    async fn get(
        &mut self,
        api_version: &str,
        kind: &str,
        path: &str,
    ) -> Result<Option<Value>, ClusterError> {
        let what = format!("get {path}");
        let Some(mut obj) = self.request(&what, path).await? else {
            return Ok(None);
        };
        self.count(&what, 1)?;
        typed(&mut obj, api_version, kind);
        Ok(Some(obj))
    }

    /// Every object of a collection, page by page.
    async fn list(
        &mut self,
        api_version: &str,
        kind: &str,
        path: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        let what = format!("list {path}");
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!("{path}?limit={}", self.page_size.max(1));
            if let Some(t) = &token {
                url.push_str("&continue=");
                url.push_str(&percent_encode(t));
            }
            // A collection that is not served (404) has no objects.
            let Some(page) = self.request(&what, &url).await? else {
                return Ok(items);
            };
            let page_items = page
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            self.count(&what, page_items.len())?;
            for mut item in page_items {
                typed(&mut item, api_version, kind);
                items.push(item);
            }
            token = page
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return Ok(items);
            }
        }
    }

    fn count(&mut self, what: &str, n: usize) -> Result<(), ClusterError> {
        self.read += n;
        if self.read > self.max_objects {
            return Err(ClusterError::TooMany {
                max: self.max_objects,
                what: what.trim_start_matches("list ").to_string(),
            });
        }
        Ok(())
    }

    /// The server's clock, from `/version`'s `Date` header; this is also
    /// the reachability probe, so its failure is the run's one-line error.
    async fn server_time(&self) -> Result<Option<std::time::SystemTime>, ClusterError> {
        let req = http::Request::get("/version")
            .body(kube::client::Body::empty())
            .map_err(|e| ClusterError::Client(e.to_string()))?;
        let what = "GET /version";
        let res = match tokio::time::timeout(self.timeout, self.client.send(req)).await {
            Err(_) => {
                return Err(ClusterError::Timeout {
                    server: self.server.clone(),
                    what: what.into(),
                    timeout: self.timeout,
                })
            }
            Ok(Err(e)) => return Err(self.failed(what, e)),
            Ok(Ok(res)) => res,
        };
        if !res.status().is_success() {
            return Err(ClusterError::Refused {
                what: what.into(),
                reason: res.status().to_string(),
            });
        }
        Ok(res
            .headers()
            .get(http::header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok()))
    }
}

/// Sets what list items lack, and drops what no check reads.
fn typed(obj: &mut Value, api_version: &str, kind: &str) {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.into()));
        m.insert("kind".into(), Value::String(kind.into()));
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
}

/// A continue token in a query (they are base64, which has `+`, `/`, `=`).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Reads the cluster. `namespace` must be a DNS label (the flag checks).
pub async fn gather(opts: &ClusterOptions) -> Result<Snapshot, ClusterError> {
    let config = kube_config(opts).await?;
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| ClusterError::Client(chain(&e)))?;
    let mut api = Api {
        client,
        server: server.trim_end_matches('/').to_string(),
        timeout: opts.timeout,
        page_size: opts.page_size,
        max_objects: opts.max_objects,
        read: 0,
    };
    let server_time = api.server_time().await?;
    let ns = opts.namespace.as_str();
    let mut objects = Vec::new();
    objects.extend(
        api.get("v1", "Namespace", &format!("/api/v1/namespaces/{ns}"))
            .await?,
    );
    let deployments = api
        .list(
            "apps/v1",
            "Deployment",
            &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        )
        .await?;
    let pki = PkiObjects::of(
        deployments
            .iter()
            .find(|d| crate::snapshot::name(d) == IDENTITY),
    );
    objects.extend(deployments);
    objects.extend(
        api.list(
            "v1",
            "ServiceAccount",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        )
        .await?,
    );
    objects.extend(
        api.get(
            "v1",
            "ConfigMap",
            &format!(
                "/api/v1/namespaces/{ns}/configmaps/{}",
                pki.trust_roots_configmap
            ),
        )
        .await?,
    );
    if let Some(mut secret) = api
        .get(
            "v1",
            "Secret",
            &format!("/api/v1/namespaces/{ns}/secrets/{}", pki.issuer_secret),
        )
        .await?
    {
        keep_certificates_only(&mut secret);
        objects.push(secret);
    }
    let rbac = "rbac.authorization.k8s.io/v1";
    objects.extend(
        api.list(
            rbac,
            "ClusterRole",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        )
        .await?,
    );
    objects.extend(
        api.list(
            rbac,
            "ClusterRoleBinding",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        )
        .await?,
    );
    let mut crds: Vec<String> = ballast_controlplane::WATCHED_RESOURCES
        .iter()
        .filter(|(g, _, _)| !g.is_empty() && *g != "discovery.k8s.io")
        .map(|(g, _, p)| format!("{p}.{g}"))
        .collect();
    crds.sort();
    crds.dedup();
    for crd in crds {
        objects.extend(
            api.get(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                &format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"),
            )
            .await?,
        );
    }
    objects.extend(api.list("v1", "Service", "/api/v1/services").await?);
    let pods = api.list("v1", "Pod", "/api/v1/pods").await?;
    // The trust anchors ConfigMaps meshed pods mount, by name (no
    // ConfigMap is listed): a missing one keeps its pods from starting.
    let mut mounted: Vec<(String, String)> = pods
        .iter()
        .flat_map(|p| {
            crate::agreement::trust_anchor_config_maps(p)
                .into_iter()
                .map(|cm| (crate::snapshot::namespace(p).to_string(), cm.to_string()))
        })
        .collect();
    mounted.sort();
    mounted.dedup();
    for (pod_ns, cm) in mounted.into_iter().take(MAX_MOUNTED_CONFIG_MAPS) {
        if pod_ns == ns && cm == pki.trust_roots_configmap {
            continue;
        }
        objects.extend(
            api.get(
                "v1",
                "ConfigMap",
                &format!("/api/v1/namespaces/{pod_ns}/configmaps/{cm}"),
            )
            .await?,
        );
    }
    objects.extend(pods);
    let mut snap = Snapshot::new(Source::Cluster, objects);
    snap.server_time = server_time;
    Ok(snap)
}

/// The issuer Secret holds the issuer's private key: keep only the
/// certificate keys the checks read.
fn keep_certificates_only(secret: &mut Value) {
    for field in ["data", "stringData"] {
        if let Some(m) = secret.get_mut(field).and_then(Value::as_object_mut) {
            m.retain(|k, _| ISSUER_KEYS.contains(&k.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_issuer_key_is_dropped_and_tokens_are_encoded() {
        let mut s = json!({"data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}, "stringData": {"key.pem": "k"}});
        keep_certificates_only(&mut s);
        assert_eq!(
            s,
            json!({"data": {"tls.crt": "Y2VydA=="}, "stringData": {}})
        );
        assert_eq!(percent_encode("a+b/c=="), "a%2Bb%2Fc%3D%3D");
        let mut item = json!({"metadata": {"name": "x", "managedFields": [1]}});
        typed(&mut item, "v1", "Pod");
        assert_eq!(
            item,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
        );
    }
}
