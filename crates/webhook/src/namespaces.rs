//! Namespace annotations (`linkerd.io/inject`, `config.linkerd.io/*`), read
//! from the Kubernetes API with a GET per namespace and cached: bounded in
//! entries, each kept for a TTL, so that a burst of pods in one namespace
//! costs one request and an annotation change is seen within the TTL.
//! Lookups of a namespace that is not cached share one read in flight
//! (single-flight), so a burst that arrives before the first answer also
//! costs one request, and a failing API server sees one read per burst.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde_json::{Map, Value};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;

/// Namespaces cached at most (the least recently fetched goes first).
pub const DEFAULT_MAX_ENTRIES: usize = 1024;
/// How long a namespace's annotations are reused.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// One lookup's time limit (within the API server's webhook timeout, 10 s by default).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Namespaces read at once with their lookups shared. Each review looks up
/// one namespace, so --max-concurrent-reviews (8 by default) keeps this far
/// lower in practice; a lookup that finds the table full reads the namespace
/// alone rather than wait for room.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

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
    let config = ballast_kubeconfig::load(kubeconfig)
        .await
        .map_err(|e| match e {
            ballast_kubeconfig::ConfigError::File { path, reason } => {
                ClientError::Kubeconfig { path, reason }
            }
            ballast_kubeconfig::ConfigError::Infer { reason } => ClientError::Infer(reason),
        })?;
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
    /// `hit` (cached), `miss` (this lookup read the API), `shared` (it waited
    /// for another lookup's read of the same namespace, whatever its result)
    /// or `error` (this lookup's own read failed).
    pub result: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct CacheMetrics {
    pub lookups: Family<LookupLabels, Counter>,
    pub entries: Gauge,
    pub in_flight: Gauge,
}

impl CacheMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "injector_namespace_lookups",
            "Namespace annotation lookups, by result: hit (cached), miss (read from the API), \
             shared (waited for another lookup's read), error",
            self.lookups.clone(),
        );
        r.register(
            "injector_namespace_cache_entries",
            "Namespaces cached (bounded by --namespace-cache-size, 1024 by default)",
            self.entries.clone(),
        );
        r.register(
            "injector_namespace_reads_in_flight",
            "Namespace reads in flight that later lookups can share (at most 256; \
             beyond it a lookup reads alone)",
            self.in_flight.clone(),
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

type Fetched = Result<Option<Annotations>, LookupError>;

/// One read of a namespace, awaited by every lookup that joins it.
struct InFlight {
    /// Tells this read from a later one of the same namespace.
    id: u64,
    started: Instant,
    read: Shared<BoxFuture<'static, Fetched>>,
}

/// Both maps under one lock, so that a read leaves `in_flight` and enters
/// `entries` at once (a lookup in between would read again).
struct State {
    entries: HashMap<String, Entry>,
    in_flight: HashMap<String, InFlight>,
    next_id: u64,
}

enum Role {
    Lead {
        id: u64,
        read: Shared<BoxFuture<'static, Fetched>>,
    },
    Join {
        id: u64,
        read: Shared<BoxFuture<'static, Fetched>>,
    },
    /// The in-flight table is full.
    Alone,
}

/// A bounded, expiring cache in front of a [`Lookup`], with concurrent
/// lookups of one namespace sharing a read. Errors are shared by the lookups
/// waiting for that read but not cached.
pub struct NamespaceCache {
    lookup: Arc<dyn Lookup>,
    state: Mutex<State>,
    ttl: Duration,
    max_entries: usize,
    max_in_flight: usize,
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
            lookup: Arc::new(lookup),
            state: Mutex::new(State {
                entries: HashMap::new(),
                in_flight: HashMap::new(),
                next_id: 0,
            }),
            ttl,
            max_entries: max_entries.max(1),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            timeout,
            metrics,
        }
    }

    /// Shared reads in flight at most ([`DEFAULT_MAX_IN_FLIGHT`] unless set;
    /// 0 turns sharing off).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One read, bounded by the lookup timeout; owns what it needs so that
    /// any of its waiters can drive it if the one that started it goes away.
    fn read(&self, namespace: &str) -> BoxFuture<'static, Fetched> {
        let lookup = self.lookup.clone();
        let namespace = namespace.to_string();
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, lookup.annotations(&namespace)).await {
                Ok(r) => r,
                Err(_) => Err(LookupError {
                    namespace,
                    reason: format!("no answer within {timeout:?}"),
                }),
            }
        })
    }

    /// The namespace's annotations (`None`: no such namespace).
    pub async fn annotations(&self, namespace: &str) -> Result<Option<Annotations>, LookupError> {
        let role = {
            let now = Instant::now();
            let mut state = self.state();
            if let Some(e) = state.entries.get(namespace) {
                if now.duration_since(e.fetched) < self.ttl {
                    self.metrics.count("hit");
                    return Ok(e.annotations.clone());
                }
            }
            self.join_or_lead(&mut state, namespace, now)
        };
        let (fetched, id) = match role {
            Role::Lead { id, read } => (read.await, Some(id)),
            Role::Join { id, read } => {
                self.metrics.count("shared");
                let fetched = read.await;
                self.file(namespace, Some(id), &fetched);
                return fetched;
            }
            Role::Alone => (self.read(namespace).await, None),
        };
        self.metrics
            .count(if fetched.is_ok() { "miss" } else { "error" });
        self.file(namespace, id, &fetched);
        fetched
    }

    /// Joins the namespace's read in flight, or starts one and lists it for
    /// others to join, or (table full) reads alone.
    fn join_or_lead(&self, state: &mut State, namespace: &str, now: Instant) -> Role {
        // A read older than the timeout has answered (or was abandoned by all
        // its waiters, and its deadline may have passed unseen): not joined.
        let live = |f: &InFlight| now.duration_since(f.started) < self.timeout;
        match state.in_flight.get(namespace) {
            Some(f) if live(f) => {
                return Role::Join {
                    id: f.id,
                    read: f.read.clone(),
                }
            }
            Some(_) => {
                state.in_flight.remove(namespace);
            }
            None => {}
        }
        if state.in_flight.len() >= self.max_in_flight {
            state.in_flight.retain(|_, f| live(f));
        }
        let role = if state.in_flight.len() >= self.max_in_flight {
            Role::Alone
        } else {
            let id = state.next_id;
            state.next_id = state.next_id.wrapping_add(1);
            let read = self.read(namespace).shared();
            state.in_flight.insert(
                namespace.to_string(),
                InFlight {
                    id,
                    started: now,
                    read: read.clone(),
                },
            );
            Role::Lead { id, read }
        };
        self.metrics.in_flight.set(state.in_flight.len() as i64);
        role
    }

    /// Takes a finished read off the in-flight table and caches its answer.
    /// The first of its waiters to get here does it (the one that started it
    /// may have gone away); the others find it gone, or replaced by a newer
    /// read, and leave things be. A read of no one's (`id` None) is cached
    /// as is.
    fn file(&self, namespace: &str, id: Option<u64>, fetched: &Fetched) {
        let mut state = self.state();
        if let Some(id) = id {
            if state.in_flight.get(namespace).is_none_or(|f| f.id != id) {
                return;
            }
            state.in_flight.remove(namespace);
            self.metrics.in_flight.set(state.in_flight.len() as i64);
        }
        if let Ok(annotations) = fetched {
            self.insert(&mut state.entries, namespace, annotations.clone());
        }
    }

    fn insert(
        &self,
        entries: &mut HashMap<String, Entry>,
        namespace: &str,
        annotations: Option<Annotations>,
    ) {
        let now = Instant::now();
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
                annotations,
            },
        );
        self.metrics.entries.set(entries.len() as i64);
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

    /// Counts reads; each takes `delay`, then answers
    /// `{"n": CALLS, "ns": NAME}`, or fails for `bad`.
    struct Slow {
        calls: Arc<AtomicUsize>,
        delay: Duration,
    }

    impl Lookup for Slow {
        fn annotations<'a>(
            &'a self,
            namespace: &'a str,
        ) -> BoxFuture<'a, Result<Option<Annotations>, LookupError>> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(self.delay).await;
                if namespace == "bad" {
                    return Err(LookupError {
                        namespace: namespace.into(),
                        reason: "refused".into(),
                    });
                }
                Ok(Some(
                    json!({"n": n, "ns": namespace})
                        .as_object()
                        .unwrap()
                        .clone(),
                ))
            })
        }
    }

    fn slow_cache(max_in_flight: usize) -> (Arc<NamespaceCache>, Arc<AtomicUsize>, CacheMetrics) {
        let calls = Arc::new(AtomicUsize::new(0));
        let metrics = CacheMetrics::default();
        let c = NamespaceCache::new(
            Slow {
                calls: calls.clone(),
                delay: Duration::from_millis(100),
            },
            Duration::from_secs(10),
            8,
            Duration::from_secs(3),
            metrics.clone(),
        )
        .with_max_in_flight(max_in_flight);
        (Arc::new(c), calls, metrics)
    }

    /// Starts `n` lookups of each namespace at once; their answers in order.
    async fn burst(c: &Arc<NamespaceCache>, namespaces: &[&str], n: usize) -> Vec<Fetched> {
        let tasks: Vec<_> = namespaces
            .iter()
            .flat_map(|ns| std::iter::repeat_n(ns.to_string(), n))
            .map(|ns| {
                let c = c.clone();
                tokio::spawn(async move { c.annotations(&ns).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    fn count(metrics: &CacheMetrics, result: &'static str) -> u64 {
        metrics
            .lookups
            .get_or_create(&LookupLabels { result })
            .get()
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_share_one_read() {
        let (c, calls, metrics) = slow_cache(DEFAULT_MAX_IN_FLIGHT);
        let answers = burst(&c, &["ns1"], 20).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(answers.len(), 20);
        for a in answers {
            let a = a.unwrap().unwrap();
            assert_eq!((a["n"].clone(), a["ns"].clone()), (json!(1), json!("ns1")));
        }
        assert_eq!(count(&metrics, "miss"), 1);
        assert_eq!(count(&metrics, "shared"), 19);
        assert_eq!(metrics.in_flight.get(), 0);
        // And the answer was cached.
        c.annotations("ns1").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(count(&metrics, "hit"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_shared_by_its_waiters_but_not_cached() {
        let (c, calls, metrics) = slow_cache(DEFAULT_MAX_IN_FLIGHT);
        let answers = burst(&c, &["bad"], 5).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        for a in answers {
            assert_eq!(a.unwrap_err().reason, "refused");
        }
        assert_eq!(
            (count(&metrics, "error"), count(&metrics, "shared")),
            (1, 4)
        );
        assert_eq!(metrics.in_flight.get(), 0);
        // The next lookup reads again.
        assert!(c.annotations("bad").await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(metrics.entries.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn different_namespaces_are_read_independently() {
        let (c, calls, _) = slow_cache(DEFAULT_MAX_IN_FLIGHT);
        let start = Instant::now();
        let answers = burst(&c, &["ns1", "ns2", "ns3"], 4).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        for (i, a) in answers.into_iter().enumerate() {
            let want = ["ns1", "ns2", "ns3"][i / 4];
            assert_eq!(a.unwrap().unwrap()["ns"], want);
        }
        // At once, not one after another (the clock is paused: exact).
        assert!(start.elapsed() < Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_entry_is_read_again_once() {
        let (c, calls, _) = slow_cache(DEFAULT_MAX_IN_FLIGHT);
        assert_eq!(c.annotations("ns1").await.unwrap().unwrap()["n"], 1);
        tokio::time::advance(Duration::from_secs(11)).await;
        let answers = burst(&c, &["ns1"], 20).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        for a in answers {
            assert_eq!(a.unwrap().unwrap()["n"], 2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_in_flight_table_full_lookups_read_alone() {
        let (c, calls, metrics) = slow_cache(1);
        let lead = {
            let c = c.clone();
            tokio::spawn(async move { c.annotations("ns1").await })
        };
        tokio::task::yield_now().await;
        assert_eq!(metrics.in_flight.get(), 1);
        // ns1 holds the only slot: three lookups of ns2 read each alone.
        let answers = burst(&c, &["ns2"], 3).await;
        assert!(answers.into_iter().all(|a| a.is_ok()));
        lead.await.unwrap().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(count(&metrics, "shared"), 0);
        assert_eq!(metrics.in_flight.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_outlives_the_lookup_that_started_it() {
        let (c, calls, metrics) = slow_cache(DEFAULT_MAX_IN_FLIGHT);
        let lead = {
            let c = c.clone();
            tokio::spawn(async move { c.annotations("ns1").await })
        };
        tokio::task::yield_now().await;
        let join = {
            let c = c.clone();
            tokio::spawn(async move { c.annotations("ns1").await })
        };
        tokio::task::yield_now().await;
        lead.abort();
        assert_eq!(join.await.unwrap().unwrap().unwrap()["n"], 1);
        // The joiner filed the answer in the cache.
        c.annotations("ns1").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!((count(&metrics, "hit"), metrics.in_flight.get()), (1, 0));
    }
}
