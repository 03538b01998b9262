//! The index behind a lock, and the shared subscriptions that read it.
//!
//! One subscription per target, however many streams watch it: a
//! [`Feed`] holding the latest answer (latest value, never a queue) and the
//! encoded changes that led to it, shared by every stream. A change to the
//! index reaches only the subscriptions it could affect, found through
//! indexes by service and by IP, so its cost follows the affected
//! subscriptions, not all of them; each affected answer and its change are
//! computed once. A [`Subscription`] handle counts as one watcher; when the
//! last handle drops, on whatever path, the entry, its map key and its index
//! keys are removed. A watcher its feed cut for not reading counts as gone
//! from that moment, whether or not its handle is dropped yet.

use crate::{
    feed::{CatchUp, Cursor, Encode, Feed, FeedLimits, Left, Next},
    index::{Changes, EndpointSet, Index, ProfileView, Target},
    metrics::Metrics,
    reach::Targets,
    resource::{Kind, ObjectKey, Resource},
    shared::Shared,
};
use std::{
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
};
use tokio::sync::watch;

/// One change to the index, as a source reports it.
#[derive(Clone, Debug)]
pub enum Op {
    Apply(Resource),
    Delete(Kind, ObjectKey),
    /// Replace every object of a kind (a full relist).
    Reset(Kind, Vec<Resource>),
}

pub struct Store {
    inner: Mutex<Inner>,
    metrics: Metrics,
    ready: watch::Sender<bool>,
    /// Counts bulk loads (the first full state, and every relist).
    bulk_loads: watch::Sender<u64>,
    /// Others that answer from the index (the policy API), told of each
    /// change under the store's lock, after its own subscriptions.
    observers: std::sync::RwLock<Vec<Arc<dyn Observer>>>,
}

/// Recomputes its own answers after each change. Called with the store's
/// lock held, so it never sees a half-applied batch; it must not call back
/// into the store.
pub trait Observer: Send + Sync {
    fn changed(&self, index: &Index, changes: &Changes);
}

struct Inner {
    index: Index,
    get: Subs<EndpointSet>,
    profile: Subs<ProfileView>,
}

/// The subscriptions of one method, and which of them a change may reach.
struct Subs<V> {
    /// The entries, their targets indexed by what a change names.
    entries: Shared<Target, Entry<V>, Targets>,
}

struct Entry<V> {
    feed: Arc<Feed<V>>,
    /// Shared by the entry's watchers (a stream holds no copy of its own).
    target: Arc<Target>,
}

/// A subscription as the memory budget's closing step weighs it.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    /// `Get` or `GetProfile`.
    pub method: &'static str,
    pub target: &'a Target,
    /// Encoded bytes it holds for its streams ([`Feed::held_bytes`]).
    pub bytes: usize,
    pub streams: usize,
}

/// A watcher's handle on a shared subscription.
pub struct Subscription<V> {
    feed: Arc<Feed<V>>,
    cursor: Cursor<V>,
    _guard: Guard,
}

struct Guard {
    store: Arc<Store>,
    target: Arc<Target>,
    method: Method,
    /// Still counted among the entry's watchers (not cut).
    counted: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Method {
    Get,
    Profile,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::Get => "Get",
            Method::Profile => "GetProfile",
        }
    }
}

impl Store {
    pub fn new(index: Index, metrics: Metrics) -> Arc<Self> {
        let store = Arc::new(Self {
            inner: Mutex::new(Inner {
                index,
                get: Subs::default(),
                profile: Subs::default(),
            }),
            metrics,
            ready: watch::Sender::new(false),
            bulk_loads: watch::Sender::new(0),
            observers: Default::default(),
        });
        store.record_sizes(&store.lock().index);
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug in the index; the
        // state it left is still the best answer there is.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// True once a source has loaded its first full state.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once a source has loaded its first full state.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// Changes after each bulk load (the first full state, a relist): the
    /// moments when much memory was briefly in use and can be handed back.
    pub fn bulk_loads(&self) -> watch::Receiver<u64> {
        self.bulk_loads.subscribe()
    }

    pub fn set_ready(&self) {
        if !self.ready.send_replace(true) {
            self.bulk_loads.send_modify(|n| *n += 1);
        }
    }

    /// Applies a batch of changes and pushes new answers to the subscriptions
    /// they affect.
    pub fn update(&self, ops: Vec<Op>) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut changes = Changes::default();
        let bulk = ops.iter().any(|op| matches!(op, Op::Reset(..)));
        for op in ops {
            changes.merge(match op {
                Op::Apply(r) => inner.index.apply(r),
                Op::Delete(kind, key) => inner.index.delete(kind, &key),
                Op::Reset(kind, objects) => inner.index.reset(kind, objects),
            });
        }
        for c in &changes.new_conflicts {
            self.metrics.ip_conflicts_seen_total.inc();
            let claimants: Vec<String> = c.pods.iter().map(|k| k.to_string()).collect();
            tracing::warn!(
                address = %c.key,
                pods = ?claimants,
                chosen = %c.chosen,
                "Several live pods claim one address; resolving to the chosen one"
            );
        }
        for c in &changes.new_cluster_ip_conflicts {
            self.metrics.ip_conflicts_seen_total.inc();
            let claimants: Vec<String> = c.services.iter().map(|k| k.to_string()).collect();
            tracing::warn!(
                "Services {} both claim clusterIP {}; answering for that IP with {} (first by namespace, \
                 then name). Kubernetes gives each clusterIP to one Service: change or remove the others",
                claimants.join(" and "),
                c.ip,
                c.chosen
            );
        }
        self.record_sizes(&inner.index);
        if bulk && self.is_ready() {
            self.bulk_loads.send_modify(|n| *n += 1);
        }
        if changes.is_empty() {
            return;
        }
        let index = &inner.index;
        let mut cut_get = Vec::new();
        for (target, entry) in inner.get.affected(&changes, index) {
            let published = entry.feed.publish(index.endpoints(target));
            if published.cut > 0 {
                cut_get.push((target.clone(), published.cut));
            }
        }
        let mut cut_profile = Vec::new();
        for (target, entry) in inner.profile.affected(&changes, index) {
            let published = entry.feed.publish(index.profile(target));
            if published.cut > 0 {
                cut_profile.push((target.clone(), published.cut));
            }
        }
        // Cut watchers are gone now, not when their bodies are dropped (a
        // client that does not read may never be polled again).
        if !cut_get.is_empty() {
            let overflows = self
                .metrics
                .stream_overflows_total
                .get_or_create(&Metrics::method(Method::Get.label()));
            for (target, n) in &cut_get {
                overflows.inc_by(*n as u64);
                inner.get.release(target, *n);
            }
            self.count_subscriptions(Method::Get, inner.get.entries.len());
        }
        if !cut_profile.is_empty() {
            let overflows = self
                .metrics
                .stream_overflows_total
                .get_or_create(&Metrics::method(Method::Profile.label()));
            for (target, n) in &cut_profile {
                overflows.inc_by(*n as u64);
                inner.profile.release(target, *n);
            }
            self.count_subscriptions(Method::Profile, inner.profile.entries.len());
        }
        let index = &inner.index;
        for o in self
            .observers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            o.changed(index, &changes);
        }
    }

    /// Shows `f` each `Get` and `GetProfile` subscription as the memory
    /// budget's closing step weighs it (method, target, bytes held,
    /// streams), under the store's lock: nothing is copied, so that the
    /// step allocates little when memory is scarce.
    pub fn for_each_held(&self, mut f: impl FnMut(Held<'_>)) {
        fn show<V: PartialEq + Send + Sync + 'static>(
            method: Method,
            subs: &Subs<V>,
            f: &mut impl FnMut(Held<'_>),
        ) {
            for (target, e, streams) in subs.entries.held() {
                f(Held {
                    method: method.label(),
                    target,
                    bytes: e.feed.held_bytes(),
                    streams,
                });
            }
        }
        let inner = self.lock();
        show(Method::Get, &inner.get, &mut f);
        show(Method::Profile, &inner.profile, &mut f);
    }

    /// Open `Get` and `GetProfile` streams together, from the counts kept
    /// as streams join and leave (no visit of the subscriptions).
    pub fn open_streams(&self) -> usize {
        let inner = self.lock();
        inner.get.entries.watchers() + inner.profile.entries.watchers()
    }

    /// Closes every stream of one subscription to relieve memory; each
    /// ends with `RESOURCE_EXHAUSTED` at its next poll, and the
    /// subscription goes with the last. Returns how many were closed.
    pub fn shed(&self, method: &str, target: &Target) -> usize {
        fn shed_in<V: PartialEq + Send + Sync + 'static>(
            subs: &mut Subs<V>,
            target: &Target,
        ) -> usize {
            let closed = match subs.entries.get_key_value(target) {
                Some((_, e)) => e.feed.shed_all(),
                None => return 0,
            };
            // Released now, as a cut is: a shed stream may never be polled
            // again.
            subs.release(target, closed);
            closed
        }
        let mut inner = self.lock();
        let (method, closed, left) = if method == Method::Get.label() {
            let closed = shed_in(&mut inner.get, target);
            (Method::Get, closed, inner.get.entries.len())
        } else {
            let closed = shed_in(&mut inner.profile, target);
            (Method::Profile, closed, inner.profile.entries.len())
        };
        self.count_subscriptions(method, left);
        closed
    }

    /// Wakes every waiting `Get` and `GetProfile` reader (so that each
    /// notices a shutdown).
    pub fn wake_readers(&self) {
        let inner = self.lock();
        for e in inner.get.entries.values() {
            e.feed.wake_all();
        }
        for e in inner.profile.entries.values() {
            e.feed.wake_all();
        }
    }

    /// Adds an observer of every change from now on.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        self.observers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    fn record_sizes(&self, index: &Index) {
        let sizes = index.sizes();
        for (kind, n) in [
            (Kind::Pod, sizes.pods),
            (Kind::Service, sizes.services),
            (Kind::EndpointSlice, sizes.endpoint_slices),
        ] {
            self.metrics
                .index_objects
                .get_or_create(&crate::metrics::KindLabel {
                    kind: kind.as_str().to_string(),
                })
                .set(n as i64);
        }
        self.metrics
            .index_endpoints
            .set(sizes.slice_endpoints as i64);
        self.metrics.ip_conflicts.set(sizes.conflicts as i64);
    }

    /// Reads the index directly (for checks that need no subscription).
    pub fn with_index<T>(&self, f: impl FnOnce(&Index) -> T) -> T {
        f(&self.lock().index)
    }

    /// Joins the `Get` subscription of `target`, creating it if it is the
    /// first. A new subscription encodes with `encoder` for as long as it
    /// lives (every server over one store encodes alike).
    pub fn subscribe_endpoints(
        self: &Arc<Self>,
        target: Target,
        encoder: &Arc<dyn Encode<EndpointSet>>,
        limits: FeedLimits,
    ) -> Subscription<EndpointSet> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let (feed, target) = inner.get.join(&target, || {
            Feed::new(
                inner.index.endpoints(&target),
                encoder.clone(),
                self.metrics.subscription_history_bytes.clone(),
                limits,
            )
        });
        self.count_subscriptions(Method::Get, inner.get.entries.len());
        self.subscription(feed, target, Method::Get)
    }

    /// Joins the `GetProfile` subscription of `target`, as
    /// [`Store::subscribe_endpoints`] does.
    pub fn subscribe_profile(
        self: &Arc<Self>,
        target: Target,
        encoder: &Arc<dyn Encode<ProfileView>>,
        limits: FeedLimits,
    ) -> Subscription<ProfileView> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let (feed, target) = inner.profile.join(&target, || {
            Feed::new(
                inner.index.profile(&target),
                encoder.clone(),
                self.metrics.subscription_history_bytes.clone(),
                limits,
            )
        });
        self.count_subscriptions(Method::Profile, inner.profile.entries.len());
        self.subscription(feed, target, Method::Profile)
    }

    fn subscription<V: PartialEq + Send + Sync + 'static>(
        self: &Arc<Self>,
        feed: Arc<Feed<V>>,
        target: Arc<Target>,
        method: Method,
    ) -> Subscription<V> {
        Subscription {
            cursor: feed.cursor(),
            feed,
            _guard: Guard {
                store: self.clone(),
                target,
                method,
                counted: true,
            },
        }
    }

    fn count_subscriptions(&self, method: Method, n: usize) {
        self.metrics
            .subscriptions
            .get_or_create(&Metrics::method(method.label()))
            .set(n as i64);
    }
}

impl<V> Default for Subs<V> {
    fn default() -> Self {
        Self {
            entries: Shared::default(),
        }
    }
}

impl<V> Subs<V> {
    fn join(
        &mut self,
        target: &Target,
        create: impl FnOnce() -> Feed<V>,
    ) -> (Arc<Feed<V>>, Arc<Target>) {
        let (entry, _) = self.entries.join(target, || Entry {
            feed: Arc::new(create()),
            target: Arc::new(target.clone()),
        });
        (entry.feed.clone(), entry.target.clone())
    }

    /// `n` watchers of `target` are gone.
    fn release(&mut self, target: &Target, n: usize) {
        self.entries.release(target, n);
    }

    /// The subscriptions whose answer `changes` could alter: found through
    /// the indexes (work follows what changed, not how many subscriptions
    /// there are), then checked with [`Changes::affects`].
    fn affected<'a>(
        &'a self,
        changes: &Changes,
        index: &Index,
    ) -> impl Iterator<Item = (&'a Target, &'a Entry<V>)> + 'a {
        let targets: Vec<&'a Target> = if changes.all {
            self.entries.keys().collect()
        } else {
            self.entries
                .reach()
                .reached(&changes.services, &changes.ips, index)
                .into_iter()
                .filter(|t| changes.affects(t, index))
                .collect()
        };
        targets
            .into_iter()
            .filter_map(|t| self.entries.get_key_value(t))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut inner = self.store.lock();
        let n = match self.method {
            Method::Get => {
                inner.get.release(&self.target, 1);
                inner.get.entries.len()
            }
            Method::Profile => {
                inner.profile.release(&self.target, 1);
                inner.profile.entries.len()
            }
        };
        // Set under the lock: two watchers leaving at once on two threads
        // must not leave the gauge at the count the first one saw.
        self.store.count_subscriptions(self.method, n);
        drop(inner);
    }
}

impl<V: PartialEq + Send + Sync + 'static> Subscription<V> {
    /// The messages that bring this watcher from what it last took to the
    /// latest answer (the whole answer, the first time), marking it taken.
    pub fn catch_up(&mut self) -> CatchUp<V> {
        self.feed.catch_up(&mut self.cursor)
    }

    /// The latest answer.
    pub fn answer(&self) -> Arc<V> {
        self.feed.answer()
    }

    /// Waits for an answer newer than the last one taken. Returns `false`
    /// if the subscription is gone.
    pub async fn changed(&mut self) -> bool {
        self.cursor.changed().await
    }

    /// Takes what is new, or registers `cx` to be woken when there is
    /// something (see [`Feed::poll_catch_up`]).
    pub fn poll_catch_up(&mut self, cx: &mut Context<'_>) -> Poll<Next<V>> {
        self.feed.poll_catch_up(&mut self.cursor, cx)
    }
}

impl<V> Drop for Subscription<V> {
    fn drop(&mut self) {
        if self.feed.leave(&self.cursor) == Left::WasCut {
            // Released when it was cut.
            self._guard.counted = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexConfig;
    use bytes::Bytes;
    use serde_json::json;
    use std::net::SocketAddr;

    /// Encodes a whole set as one message naming its addresses, and a
    /// change as one message: enough to see who was sent what.
    struct Addrs;

    impl Encode<EndpointSet> for Addrs {
        fn full(&self, cur: &EndpointSet) -> Vec<Bytes> {
            vec![Bytes::from(format!("{:?}", cur.endpoints.keys()))]
        }
        fn diff(&self, _: &EndpointSet, cur: &EndpointSet) -> Vec<Bytes> {
            self.full(cur)
        }
        fn reset(&self, _: &EndpointSet) -> Option<Bytes> {
            None
        }
    }

    fn resource(v: serde_json::Value) -> Resource {
        Resource::from_value(v).unwrap().unwrap()
    }

    fn service(name: &str, cluster_ip: &str) -> Op {
        Op::Apply(resource(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterIP": cluster_ip, "selector": {"app": name},
                     "ports": [{"port": 80, "targetPort": 8080}]},
        })))
    }

    fn pod(app: &str, name: &str, ip: &str) -> Op {
        Op::Apply(resource(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })))
    }

    fn svc(name: &str) -> Target {
        Target::Service {
            service: ObjectKey::new("ns", name),
            port: 80,
        }
    }

    fn addr(a: &str) -> Target {
        Target::Addr(a.parse::<SocketAddr>().unwrap())
    }

    fn store() -> Arc<Store> {
        let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
        store.update(vec![
            service("a", "10.96.0.1"),
            service("b", "10.96.0.2"),
            pod("a", "a-1", "10.0.0.1"),
            pod("b", "b-1", "10.0.1.1"),
        ]);
        store
    }

    fn encoder() -> Arc<dyn Encode<EndpointSet>> {
        Arc::new(Addrs)
    }

    fn messages(sub: &mut Subscription<EndpointSet>) -> usize {
        sub.catch_up().messages().count()
    }

    fn live(store: &Store) -> i64 {
        store
            .metrics
            .subscriptions
            .get_or_create(&Metrics::method("Get"))
            .get()
    }

    #[test]
    fn one_subscription_per_target_freed_with_its_last_watcher() {
        let store = store();
        let enc = encoder();
        let first = store.subscribe_endpoints(svc("a"), &enc, FeedLimits::default());
        let second = store.subscribe_endpoints(svc("a"), &enc, FeedLimits::default());
        let by_ip = store.subscribe_endpoints(addr("10.0.1.1:8080"), &enc, FeedLimits::default());
        assert_eq!(live(&store), 2);
        drop(first);
        assert_eq!(live(&store), 2, "a watcher is left");
        drop(second);
        drop(by_ip);
        assert_eq!(live(&store), 0);
        let inner = store.lock();
        assert!(inner.get.entries.is_empty());
        assert!(inner.get.entries.reach().is_empty());
    }

    #[test]
    fn a_change_reaches_only_the_subscriptions_it_affects() {
        let store = store();
        let enc = encoder();
        let mut a = store.subscribe_endpoints(svc("a"), &enc, FeedLimits::default());
        let mut b = store.subscribe_endpoints(svc("b"), &enc, FeedLimits::default());
        let mut a_cluster_ip =
            store.subscribe_endpoints(addr("10.96.0.1:80"), &enc, FeedLimits::default());
        let mut b_pod =
            store.subscribe_endpoints(addr("10.0.1.1:8080"), &enc, FeedLimits::default());
        for sub in [&mut a, &mut b, &mut a_cluster_ip, &mut b_pod] {
            assert_eq!(messages(sub), 1, "the first answer");
        }
        // Many unrelated address subscriptions: a change must not visit them.
        let others: Vec<_> = (0..1_000)
            .map(|i| {
                store.subscribe_endpoints(
                    addr(&format!("10.9.{}.{}:80", i / 250, i % 250)),
                    &enc,
                    FeedLimits::default(),
                )
            })
            .collect();

        store.update(vec![pod("a", "a-2", "10.0.0.2")]);
        assert_eq!(messages(&mut a), 1);
        assert_eq!(messages(&mut a_cluster_ip), 1, "follows its service");
        assert_eq!(messages(&mut b), 0);
        assert_eq!(messages(&mut b_pod), 0);

        let inner = store.lock();
        let mut changes = Changes::default();
        changes.services.insert(ObjectKey::new("ns", "a"));
        changes.ips.insert("10.0.0.2".parse().unwrap());
        let reached: Vec<&Target> = inner
            .get
            .affected(&changes, &inner.index)
            .map(|(t, _)| t)
            .collect();
        assert_eq!(reached.len(), 2, "{reached:?}");
        drop(inner);
        drop(others);
    }

    #[test]
    fn a_target_s_answer_and_change_are_computed_once_for_all_watchers() {
        let store = store();
        let enc = encoder();
        let mut subs: Vec<_> = (0..3)
            .map(|_| store.subscribe_endpoints(svc("a"), &enc, FeedLimits::default()))
            .collect();
        for s in &mut subs {
            let _ = s.catch_up();
        }
        store.update(vec![pod("a", "a-2", "10.0.0.2")]);
        let ups: Vec<CatchUp<EndpointSet>> = subs.iter_mut().map(|s| s.catch_up()).collect();
        let ptrs: Vec<*const u8> = ups
            .iter()
            .map(|u| u.messages().next().unwrap().as_ptr())
            .collect();
        assert!(ptrs.iter().all(|p| *p == ptrs[0]), "one shared encoding");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_wakes_only_for_its_own_target() {
        let store = store();
        let enc = encoder();
        let mut a = store.subscribe_endpoints(svc("a"), &enc, FeedLimits::default());
        let mut b = store.subscribe_endpoints(svc("b"), &enc, FeedLimits::default());
        let _ = (a.catch_up(), b.catch_up());
        store.update(vec![pod("a", "a-2", "10.0.0.2")]);
        assert!(a.changed().await);
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(5), b.changed()).await;
        assert!(quiet.is_err(), "b's answer did not change");
    }
}
