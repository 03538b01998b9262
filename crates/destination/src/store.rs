//! The index behind a lock, and the shared subscriptions that read it.
//!
//! One subscription per target, however many streams watch it: it holds the
//! latest answer in a `watch` channel (latest value, never a queue) and is
//! recomputed only when a change could affect it. A [`Subscription`] handle
//! counts as one watcher; when the last handle drops, on whatever path, the
//! entry and its map key are removed.

use crate::{
    index::{Changes, EndpointSet, Index, ProfileView, Target},
    metrics::Metrics,
    resource::{Kind, ObjectKey, Resource},
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
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
}

struct Inner {
    index: Index,
    get: Subs<EndpointSet>,
    profile: Subs<ProfileView>,
}

type Subs<V> = HashMap<Target, Entry<V>>;

struct Entry<V> {
    tx: watch::Sender<Arc<V>>,
    watchers: usize,
}

/// A watcher's handle on a shared subscription.
pub struct Subscription<V> {
    rx: watch::Receiver<Arc<V>>,
    _guard: Guard,
}

struct Guard {
    store: Arc<Store>,
    target: Target,
    method: Method,
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
                get: HashMap::new(),
                profile: HashMap::new(),
            }),
            metrics,
            ready: watch::Sender::new(false),
            bulk_loads: watch::Sender::new(0),
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
            self.metrics.ip_conflicts_total.inc();
            let claimants: Vec<String> = c.pods.iter().map(|k| k.to_string()).collect();
            tracing::warn!(
                address = %c.key,
                pods = ?claimants,
                chosen = %c.chosen,
                "Several live pods claim one address; resolving to the chosen one"
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
        for (target, entry) in inner.get.iter() {
            if changes.affects(target, index) {
                publish(&entry.tx, index.endpoints(target));
            }
        }
        for (target, entry) in inner.profile.iter() {
            if changes.affects(target, index) {
                publish(&entry.tx, index.profile(target));
            }
        }
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

    pub fn subscribe_endpoints(self: &Arc<Self>, target: Target) -> Subscription<EndpointSet> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let rx = join(&mut inner.get, &target, || inner.index.endpoints(&target));
        self.count_subscriptions(Method::Get, inner.get.len());
        self.subscription(rx, target, Method::Get)
    }

    pub fn subscribe_profile(self: &Arc<Self>, target: Target) -> Subscription<ProfileView> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let rx = join(&mut inner.profile, &target, || inner.index.profile(&target));
        self.count_subscriptions(Method::Profile, inner.profile.len());
        self.subscription(rx, target, Method::Profile)
    }

    fn subscription<V>(
        self: &Arc<Self>,
        rx: watch::Receiver<Arc<V>>,
        target: Target,
        method: Method,
    ) -> Subscription<V> {
        Subscription {
            rx,
            _guard: Guard {
                store: self.clone(),
                target,
                method,
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

fn join<V>(
    subs: &mut Subs<V>,
    target: &Target,
    compute: impl FnOnce() -> V,
) -> watch::Receiver<Arc<V>> {
    let entry = subs.entry(target.clone()).or_insert_with(|| Entry {
        tx: watch::Sender::new(Arc::new(compute())),
        watchers: 0,
    });
    entry.watchers += 1;
    entry.tx.subscribe()
}

fn leave<V>(subs: &mut Subs<V>, target: &Target) {
    if let Some(entry) = subs.get_mut(target) {
        entry.watchers -= 1;
        if entry.watchers == 0 {
            subs.remove(target);
        }
    }
}

fn publish<V: PartialEq>(tx: &watch::Sender<Arc<V>>, new: V) {
    tx.send_if_modified(|cur| {
        if **cur == new {
            false
        } else {
            *cur = Arc::new(new);
            true
        }
    });
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut inner = self.store.lock();
        let n = match self.method {
            Method::Get => {
                leave(&mut inner.get, &self.target);
                inner.get.len()
            }
            Method::Profile => {
                leave(&mut inner.profile, &self.target);
                inner.profile.len()
            }
        };
        drop(inner);
        self.store.count_subscriptions(self.method, n);
    }
}

impl<V> Subscription<V> {
    /// The current answer, marking it seen.
    pub fn current(&mut self) -> Arc<V> {
        self.rx.borrow_and_update().clone()
    }

    /// Waits until the answer differs from the last one seen. Returns `None`
    /// if the store is gone.
    pub async fn changed(&mut self) -> Option<Arc<V>> {
        self.rx.changed().await.ok()?;
        Some(self.current())
    }
}
