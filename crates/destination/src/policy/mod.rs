//! Linkerd's policy APIs over the same index as Destination:
//! `OutboundPolicies` (routes and backends per target) and
//! `InboundServerPolicies` (protocol and authorizations per pod port).
//!
//! One subscription per target or pod port, however many streams watch it.
//! On each change the store reaches (as an [`Observer`]), only the
//! subscriptions the change can affect are recomputed; an answer that
//! differs is translated to protobuf once and shared by every stream on it
//! (a stream holds a pointer to the latest message, never a queue).

pub(crate) mod grpc;
mod server;
mod translate;

pub use grpc::{InboundGrpc, OutboundGrpc};
pub use server::{Answers, PolicyService, DEFAULT_MAX_POLICY_STREAMS};
pub use translate::{
    inbound_server, outbound_policy, PolicyConfig, DEFAULT_DETECT_TIMEOUT, DEFAULT_EWMA_DECAY,
    DEFAULT_EWMA_RTT, DEFAULT_FAILFAST_TIMEOUT, DEFAULT_QUEUE_CAPACITY,
};

use crate::server::frame;
use crate::{
    index::{
        policy::{InboundView, OutboundView},
        Changes, Index, Target,
    },
    reach::{PodPorts, Targets},
    resource::ObjectKey,
    shared::{Reach, Shared},
    store::{Observer, Store},
};
use ballast_store::latest::{Latest, LatestReader};
use bytes::Bytes;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    pub api: String,
}

/// The policy server's metrics.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    /// Route objects left out of answers right now, by reason.
    pub invalid_routes: Family<ReasonLabel, Gauge>,
    /// Times a route object was found invalid (each finding once).
    pub route_problems_total: Family<ReasonLabel, Counter>,
    /// Shared subscriptions, by API (`outbound`, `inbound`).
    pub subscriptions: Family<ApiLabel, Gauge>,
    /// Open Watch streams, by API.
    pub streams: Family<ApiLabel, Gauge>,
    /// Streams refused at the stream limit.
    pub streams_refused_total: Counter,
    /// Answers recomputed and translated (once per change per subscription).
    pub answers_total: Family<ApiLabel, Counter>,
}

impl PolicyMetrics {
    pub fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("policy");
        r.register(
            "invalid_routes",
            "Route objects left out of every answer (a parent or backend Service that does not exist)",
            self.invalid_routes.clone(),
        );
        r.register(
            "route_problems",
            "Route objects found invalid, each finding counted once",
            self.route_problems_total.clone(),
        );
        r.register(
            "subscriptions",
            "Shared policy subscriptions, by API",
            self.subscriptions.clone(),
        );
        r.register(
            "streams",
            "Open policy Watch streams, by API",
            self.streams.clone(),
        );
        r.register(
            "streams_refused",
            "Policy streams refused at --max-policy-streams",
            self.streams_refused_total.clone(),
        );
        r.register(
            "answers",
            "Policy answers computed and encoded (once per change per subscription, shared by its streams)",
            self.answers_total.clone(),
        );
    }

    fn api(api: &str) -> ApiLabel {
        ApiLabel {
            api: api.to_string(),
        }
    }
}

/// The shared policy subscriptions.
pub struct PolicyStore {
    store: Arc<Store>,
    config: PolicyConfig,
    metrics: PolicyMetrics,
    inner: Mutex<Subs>,
}

#[derive(Default)]
struct Subs {
    /// Keys indexed by what a change names, so that a change visits the
    /// subscriptions it can reach, not all of them.
    outbound: Shared<Target, Entry<OutboundView>, Targets>,
    inbound: Shared<(ObjectKey, u16), Entry<Option<InboundView>>, PodPorts>,
}

struct Entry<V> {
    view: V,
    /// The answer as one whole gRPC frame, encoded once for every stream;
    /// `None`: the target is not known (the stream ends with NOT_FOUND).
    /// Closed when the memory budget's closing step closes every stream of
    /// this entry ([`PolicyStore::shed`]).
    tx: Arc<Latest<Option<Bytes>>>,
}

impl<V> Entry<V> {
    /// Encoded bytes of its answer, shared by its streams.
    fn answer_bytes(&self) -> usize {
        self.tx.with(|m| m.as_ref().map_or(0, Bytes::len))
    }
}

/// A watcher's handle on one shared answer; leaving drops the
/// subscription with its last watcher.
pub struct PolicyWatch {
    /// Ends (`None`) once the stream is to close to relieve memory.
    rx: LatestReader<Option<Bytes>>,
    _guard: Guard,
}

/// One policy subscription's key.
#[derive(Clone, Debug)]
pub enum Key {
    Outbound(Target),
    Inbound(ObjectKey, u16),
}

/// A [`Key`] borrowed from the store.
#[derive(Clone, Copy, Debug)]
pub enum KeyRef<'a> {
    Outbound(&'a Target),
    Inbound(&'a ObjectKey, u16),
}

impl KeyRef<'_> {
    pub fn to_key(self) -> Key {
        match self {
            KeyRef::Outbound(target) => Key::Outbound(target.clone()),
            KeyRef::Inbound(pod, port) => Key::Inbound(pod.clone(), port),
        }
    }
}

/// A policy subscription as the memory budget's closing step weighs it.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    /// `OutboundPolicies.Watch` or `InboundServerPolicies.WatchPort`.
    pub api: &'static str,
    pub key: KeyRef<'a>,
    /// Encoded bytes of its answer, shared by its streams.
    pub bytes: usize,
    pub streams: usize,
}

struct Guard {
    policy: Arc<PolicyStore>,
    key: Key,
    /// Closed when the entry was shed: its watchers were released then.
    answer: Arc<Latest<Option<Bytes>>>,
}

impl PolicyStore {
    /// Creates the subscriptions and has the store tell them of changes.
    pub fn new(store: Arc<Store>, config: PolicyConfig, metrics: PolicyMetrics) -> Arc<Self> {
        let policy = Arc::new(Self {
            store: store.clone(),
            config,
            metrics,
            inner: Mutex::new(Subs::default()),
        });
        // Route problems present before the first subscription are counted
        // by the observer as the sources load.
        store.observe(policy.clone());
        policy
    }

    fn lock(&self) -> MutexGuard<'_, Subs> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    pub fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    pub fn watch_outbound(self: &Arc<Self>, target: Target) -> PolicyWatch {
        let answer = self.join(
            |subs| &mut subs.outbound,
            &target,
            |index| index.outbound_policy(&target),
            |view| self.encode_outbound(view),
        );
        self.watch(answer, Key::Outbound(target))
    }

    pub fn watch_inbound(self: &Arc<Self>, pod: ObjectKey, port: u16) -> PolicyWatch {
        let key = (pod, port);
        let answer = self.join(
            |subs| &mut subs.inbound,
            &key,
            |index| index.inbound_policy(&key.0, key.1),
            |view| self.encode_inbound(view),
        );
        self.watch(answer, Key::Inbound(key.0, key.1))
    }

    /// Joins the shared answer of `key` in the registry `pick` chooses,
    /// computing and encoding it if this is its first watcher.
    fn join<K: Eq + Hash + Clone, V, X: Reach<K>>(
        &self,
        pick: impl FnOnce(&mut Subs) -> &mut Shared<K, Entry<V>, X>,
        key: &K,
        view_of: impl FnOnce(&Index) -> V,
        encode: impl FnOnce(&V) -> Option<Bytes>,
    ) -> Arc<Latest<Option<Bytes>>> {
        // Lock order: the store's, then ours (as in `Observer::changed`).
        self.store.with_index(|index| {
            let mut subs = self.lock();
            let (entry, _) = pick(&mut subs).join(key, || {
                let view = view_of(index);
                let msg = encode(&view);
                Entry {
                    view,
                    tx: Latest::new(msg),
                }
            });
            let joined = entry.tx.clone();
            self.count(&subs);
            joined
        })
    }

    fn watch(self: &Arc<Self>, answer: Arc<Latest<Option<Bytes>>>, key: Key) -> PolicyWatch {
        PolicyWatch {
            rx: answer.reader(),
            _guard: Guard {
                policy: self.clone(),
                key,
                answer,
            },
        }
    }

    /// Shows `f` each subscription as the memory budget's closing step
    /// weighs it, under the store's lock: nothing is copied, so that the
    /// step allocates little when memory is scarce.
    pub fn for_each_held(&self, mut f: impl FnMut(Held<'_>)) {
        let subs = self.lock();
        for (target, e, streams) in subs.outbound.held() {
            f(Held {
                api: "OutboundPolicies.Watch",
                key: KeyRef::Outbound(target),
                bytes: e.answer_bytes(),
                streams,
            });
        }
        for ((pod, port), e, streams) in subs.inbound.held() {
            f(Held {
                api: "InboundServerPolicies.WatchPort",
                key: KeyRef::Inbound(pod, *port),
                bytes: e.answer_bytes(),
                streams,
            });
        }
    }

    /// Open streams of both policy APIs together, from the counts kept as
    /// streams join and leave (no visit of the subscriptions).
    pub fn open_streams(&self) -> usize {
        let subs = self.lock();
        subs.outbound.watchers() + subs.inbound.watchers()
    }

    /// Closes every stream of one subscription to relieve memory: each
    /// ends with `RESOURCE_EXHAUSTED`, and the subscription is gone now (a
    /// new watcher makes a new one). Returns how many streams it had.
    pub fn shed(&self, key: &Key) -> usize {
        let mut subs = self.lock();
        let closed = match key {
            Key::Outbound(t) => subs.outbound.take(t).map(|(e, n)| {
                e.tx.close();
                n
            }),
            Key::Inbound(pod, port) => subs.inbound.take(&(pod.clone(), *port)).map(|(e, n)| {
                e.tx.close();
                n
            }),
        };
        self.count(&subs);
        closed.unwrap_or(0)
    }

    fn encode_outbound(&self, view: &OutboundView) -> Option<Bytes> {
        self.metrics
            .answers_total
            .get_or_create(&PolicyMetrics::api("outbound"))
            .inc();
        outbound_policy(view, &self.config).map(|m| frame(&m))
    }

    fn encode_inbound(&self, view: &Option<InboundView>) -> Option<Bytes> {
        self.metrics
            .answers_total
            .get_or_create(&PolicyMetrics::api("inbound"))
            .inc();
        view.as_ref()
            .map(|v| frame(&inbound_server(v, &self.config)))
    }

    fn count(&self, subs: &Subs) {
        for (api, n) in [
            ("outbound", subs.outbound.len()),
            ("inbound", subs.inbound.len()),
        ] {
            self.metrics
                .subscriptions
                .get_or_create(&PolicyMetrics::api(api))
                .set(n as i64);
        }
    }
}

/// Replaces an entry's answer when its view changed.
fn refresh<V: PartialEq>(entry: &mut Entry<V>, view: V, encode: impl FnOnce(&V) -> Option<Bytes>) {
    if entry.view == view {
        return;
    }
    let msg = encode(&view);
    entry.view = view;
    entry.tx.send_replace(msg);
}

impl Observer for PolicyStore {
    fn changed(&self, index: &Index, changes: &Changes) {
        for p in &changes.route_problems {
            self.metrics
                .route_problems_total
                .get_or_create(&ReasonLabel {
                    reason: p.reason.to_string(),
                })
                .inc();
            tracing::warn!(route = %p.route, problem = %p.detail, "Route left out of policy answers");
        }
        let mut by_reason: HashMap<&str, i64> = HashMap::new();
        for p in index.policy().problems() {
            *by_reason.entry(p.reason).or_default() += 1;
        }
        for reason in ["parent_not_found", "backend_not_found"] {
            self.metrics
                .invalid_routes
                .get_or_create(&ReasonLabel {
                    reason: reason.to_string(),
                })
                .set(by_reason.get(reason).copied().unwrap_or(0));
        }

        let mut subs = self.lock();
        let Subs { outbound, inbound } = &mut *subs;
        let outbound_changed = |target: &Target, entry: &mut Entry<OutboundView>| {
            if changes.affects_outbound(target, index) {
                refresh(entry, index.outbound_policy(target), |v| {
                    self.encode_outbound(v)
                });
            }
        };
        if changes.all {
            for (target, entry) in outbound.iter_mut() {
                outbound_changed(target, entry);
            }
        } else {
            let services = changes.services.iter().chain(&changes.outbound_services);
            let reached: Vec<Target> = outbound
                .reach()
                .reached(services, &changes.ips, index)
                .into_iter()
                .cloned()
                .collect();
            for target in &reached {
                if let Some(entry) = outbound.get_mut(target) {
                    outbound_changed(target, entry);
                }
            }
        }
        let inbound_changed = |(pod, port): &(ObjectKey, u16), entry: &mut Entry<_>| {
            if changes.affects_inbound(pod) {
                refresh(entry, index.inbound_policy(pod, *port), |v| {
                    self.encode_inbound(v)
                });
            }
        };
        if changes.all || changes.inbound_all {
            for (key, entry) in inbound.iter_mut() {
                inbound_changed(key, entry);
            }
        } else {
            let reached = inbound
                .reach()
                .reached(&changes.pods, &changes.policy_namespaces);
            for key in reached {
                if let Some(entry) = inbound.get_mut(&key) {
                    inbound_changed(&key, entry);
                }
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut subs = self.policy.lock();
        // Checked under the lock the shedding took: a shed entry's watchers
        // were released with it, and its key may hold a new entry now.
        if self.answer.is_closed() {
            return;
        }
        match &self.key {
            Key::Outbound(t) => drop(subs.outbound.release(t, 1)),
            Key::Inbound(pod, port) => drop(subs.inbound.release(&(pod.clone(), *port), 1)),
        }
        self.policy.count(&subs);
    }
}

impl PolicyWatch {
    /// The current answer as a gRPC frame, marking it seen; `None` if the
    /// target is unknown.
    pub fn current(&mut self) -> Option<Bytes> {
        self.rx.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{index::IndexConfig, metrics::Metrics, resource::Resource, store::Op};
    use serde_json::{json, Value};

    fn apply(v: Value) -> Op {
        Op::Apply(Resource::from_value(v).unwrap().unwrap())
    }

    fn service(ns: &str, name: &str, ip: &str) -> Op {
        apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": ns, "name": name},
            "spec": {"clusterIP": ip, "selector": {"app": name},
                     "ports": [{"port": 80, "targetPort": 8080}]},
        }))
    }

    fn pod(ns: &str, name: &str, app: &str, ip: &str) -> Op {
        apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": ns, "name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
    }

    /// A watcher for each of six subscriptions, named.
    fn watches(policy: &Arc<PolicyStore>) -> Vec<(&'static str, PolicyWatch)> {
        let inbound = |ns: &str, pod: &str| policy.watch_inbound(ObjectKey::new(ns, pod), 8080);
        let addr = |a: &str| policy.watch_outbound(Target::Addr(a.parse().unwrap()));
        vec![
            ("web-0", inbound("a", "web-0")),
            ("web-1", inbound("a", "web-1")),
            ("db-0", inbound("b", "db-0")),
            (
                "web",
                policy.watch_outbound(Target::Service {
                    service: ObjectKey::new("a", "web"),
                    port: 80,
                }),
            ),
            ("web-ip", addr("10.96.0.1:80")),
            ("db", addr("10.96.0.2:80")),
        ]
    }

    fn changed(watches: &[(&str, PolicyWatch)]) -> Vec<String> {
        watches
            .iter()
            .filter(|(_, w)| w.rx.has_changed())
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Each change reaches the subscriptions it can alter, found through
    /// what it names, and no others: the namespace of a Server, the pod
    /// whose labels changed, the Service a route is attached to (by name
    /// and by cluster IP).
    #[test]
    fn a_change_reaches_the_subscriptions_it_names_and_no_others() {
        let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
        store.update(vec![
            service("a", "web", "10.96.0.1"),
            service("b", "db", "10.96.0.2"),
            pod("a", "web-0", "web", "10.0.0.1"),
            pod("a", "web-1", "web", "10.0.0.2"),
            pod("b", "db-0", "db", "10.0.1.1"),
        ]);
        let policy = PolicyStore::new(
            store.clone(),
            PolicyConfig::default(),
            PolicyMetrics::default(),
        );

        let w = watches(&policy);
        assert!(changed(&w).is_empty(), "nothing changed yet");
        store.update(vec![apply(json!({
            "apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
            "metadata": {"name": "web-http", "namespace": "a"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080},
        }))]);
        assert_eq!(changed(&w), ["web-0", "web-1"], "the Server's namespace");

        // Fresh watchers see only what comes next.
        drop(w);
        let w = watches(&policy);
        store.update(vec![pod("a", "web-1", "other", "10.0.0.2")]);
        assert_eq!(changed(&w), ["web-1"], "the pod that left the Server");

        drop(w);
        let w = watches(&policy);
        store.update(vec![apply(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web-route", "namespace": "a"},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]},
        }))]);
        assert_eq!(
            changed(&w),
            ["web", "web-ip"],
            "the route's Service, by name and IP"
        );

        // With the last watcher of each key gone, nothing is left to reach.
        drop(w);
        assert!(policy.lock().outbound.reach().is_empty());
        assert!(policy.lock().inbound.reach().is_empty());
    }
}
