//! Namespace annotations (`linkerd.io/inject`, `config.linkerd.io/*`), read
//! from the Kubernetes API with a GET per namespace and cached: bounded in
//! entries, each kept for a TTL, so that a burst of pods in one namespace
//! costs one request and an annotation change is seen within the TTL.

use futures_util::future::BoxFuture;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde_json::{Map, Value};
use std::{collections::HashMap, sync::Mutex, time::Duration};
use tokio::time::Instant;

/// Namespaces cached at most (the least recently fetched goes first).
pub const DEFAULT_MAX_ENTRIES: usize = 1024;
/// How long a namespace's annotations are reused.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// One lookup's time limit (within the API server's webhook timeout, 10 s by default).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

pub type Annotations = Map<String, Value>;

#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot read namespace {namespace}: {reason}")]
pub struct LookupError {
    pub namespace: String,
    pub reason: String,
}

/// Where annotations come from. `Ok(None)`: no such namespace.
pub trait Lookup: Send + Sync + 'static {
    fn annotations<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Annotations>, LookupError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("no Kubernetes client configuration (pass --kubeconfig): {0}")]
    Infer(String),
    #[error("cannot make the Kubernetes client: {0}")]
    Client(String),
}

/// The Kubernetes client, from `kubeconfig` or the usual places (KUBECONFIG,
/// ~/.kube/config, in-cluster).
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |reason: String| ClientError::Kubeconfig {
                path: path.display().to_string(),
                reason,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Infer(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}

/// GET /api/v1/namespaces/NAME.
pub struct KubeLookup {
    pub client: kube::Client,
}

impl Lookup for KubeLookup {
    fn annotations<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Annotations>, LookupError>> {
        Box::pin(async move {
            let err = |reason: String| LookupError {
                namespace: namespace.to_string(),
                reason,
            };
            // A namespace name is a DNS label; anything else would be a
            // different path.
            if namespace.is_empty()
                || !namespace
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(err("not a namespace name".into()));
            }
            let request = http::Request::get(format!("/api/v1/namespaces/{namespace}"))
                .body(Vec::new())
                .map_err(|e| err(e.to_string()))?;
            match self.client.request::<Value>(request).await {
                Ok(ns) => Ok(Some(match &ns["metadata"]["annotations"] {
                    Value::Object(m) => m.clone(),
                    _ => Map::new(),
                })),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
                Err(e) => Err(err(e.to_string())),
            }
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LookupLabels {
    /// `hit`, `miss` (fetched) or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct CacheMetrics {
    pub lookups: Family<LookupLabels, Counter>,
    pub entries: Gauge,
}

impl CacheMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "injector_namespace_lookups",
            "Namespace annotation lookups, by result: hit (cached), miss (read from the API), error",
            self.lookups.clone(),
        );
        r.register(
            "injector_namespace_cache_entries",
            "Namespaces cached (bounded by --namespace-cache-size, 1024 by default)",
            self.entries.clone(),
        );
    }
    fn count(&self, result: &'static str) {
        self.lookups.get_or_create(&LookupLabels { result }).inc();
    }
}

struct Entry {
    fetched: Instant,
    annotations: Option<Annotations>,
}

/// A bounded, expiring cache in front of a [`Lookup`]. Errors are not cached.
pub struct NamespaceCache {
    lookup: Box<dyn Lookup>,
    entries: Mutex<HashMap<String, Entry>>,
    ttl: Duration,
    max_entries: usize,
    timeout: Duration,
    metrics: CacheMetrics,
}

impl NamespaceCache {
    pub fn new(
        lookup: impl Lookup,
        ttl: Duration,
        max_entries: usize,
        timeout: Duration,
        metrics: CacheMetrics,
    ) -> Self {
        Self {
            lookup: Box::new(lookup),
            entries: Mutex::new(HashMap::new()),
            ttl,
            max_entries: max_entries.max(1),
            timeout,
            metrics,
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The namespace's annotations (`None`: no such namespace).
    pub async fn annotations(&self, namespace: &str) -> Result<Option<Annotations>, LookupError> {
        let now = Instant::now();
        if let Some(e) = self.entries().get(namespace) {
            if now.duration_since(e.fetched) < self.ttl {
                self.metrics.count("hit");
                return Ok(e.annotations.clone());
            }
        }
        let fetched =
            match tokio::time::timeout(self.timeout, self.lookup.annotations(namespace)).await {
                Ok(r) => r,
                Err(_) => Err(LookupError {
                    namespace: namespace.to_string(),
                    reason: format!("no answer within {:?}", self.timeout),
                }),
            };
        let annotations = match fetched {
            Ok(a) => a,
            Err(e) => {
                self.metrics.count("error");
                return Err(e);
            }
        };
        self.metrics.count("miss");
        let now = Instant::now();
        let mut entries = self.entries();
        if entries.len() >= self.max_entries && !entries.contains_key(namespace) {
            entries.retain(|_, e| now.duration_since(e.fetched) < self.ttl);
            if entries.len() >= self.max_entries {
                if let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.fetched)
                    .map(|(k, _)| k.clone())
                {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert(
            namespace.to_string(),
            Entry {
                fetched: now,
                annotations: annotations.clone(),
            },
        );
        self.metrics.entries.set(entries.len() as i64);
        Ok(annotations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    /// Answers `{"n": CALLS}` for namespaces starting with `ns`, none for
    /// `gone`, an error for `bad`, and never for `slow`.
    struct Counting(Arc<AtomicUsize>);

    impl Lookup for Counting {
        fn annotations<'a>(
            &'a self,
            namespace: &'a str,
        ) -> BoxFuture<'a, Result<Option<Annotations>, LookupError>> {
            Box::pin(async move {
                let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
                match namespace {
                    "gone" => Ok(None),
                    "bad" => Err(LookupError {
                        namespace: namespace.into(),
                        reason: "refused".into(),
                    }),
                    "slow" => std::future::pending().await,
                    _ => Ok(Some(json!({"n": n}).as_object().unwrap().clone())),
                }
            })
        }
    }

    fn cache(max: usize) -> (NamespaceCache, Arc<AtomicUsize>, CacheMetrics) {
        let calls = Arc::new(AtomicUsize::new(0));
        let metrics = CacheMetrics::default();
        let c = NamespaceCache::new(
            Counting(calls.clone()),
            Duration::from_secs(10),
            max,
            Duration::from_secs(3),
            metrics.clone(),
        );
        (c, calls, metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn annotations_are_reused_for_the_ttl_then_read_again() {
        let (c, calls, metrics) = cache(8);
        let first = c.annotations("ns1").await.unwrap().unwrap();
        assert_eq!(first["n"], 1);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(c.annotations("ns1").await.unwrap().unwrap()["n"], 1);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.annotations("ns1").await.unwrap().unwrap()["n"], 2);
        assert_eq!(
            metrics
                .lookups
                .get_or_create(&LookupLabels { result: "hit" })
                .get(),
            1
        );
        // A missing namespace is cached as missing; errors are not cached.
        assert!(c.annotations("gone").await.unwrap().is_none());
        assert!(c.annotations("gone").await.unwrap().is_none());
        assert!(c.annotations("bad").await.is_err());
        assert!(c.annotations("bad").await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded() {
        let (c, calls, metrics) = cache(2);
        for ns in ["ns1", "ns2", "ns3"] {
            c.annotations(ns).await.unwrap();
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.entries.get(), 2);
        // ns1, the oldest, was evicted: it is read again; ns3 is cached.
        c.annotations("ns3").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        c.annotations("ns1").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(metrics.entries.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_times_out() {
        let (c, _, _) = cache(2);
        let e = c.annotations("slow").await.unwrap_err();
        assert!(e.reason.contains("no answer"), "{e}");
    }
}
