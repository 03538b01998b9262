//! What the controller last said of every target resolved, kept after the
//! target's stream closes: a target used again while the controller is
//! unreachable starts from its last-known endpoints instead of failing
//! (seed 002). Bounded in count (`--max-targets`, the least recently heard
//! goes first) and in age (`--stale-endpoints-grace`).

use super::{EndpointSet, SetState};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;

#[derive(Debug)]
struct Entry {
    set: Arc<EndpointSet>,
    /// When the controller last confirmed it (a message, or a sweep while
    /// connected and the target's stream was open).
    heard: Instant,
    /// Open resolutions of the target.
    in_use: usize,
}

#[derive(Debug)]
pub struct LastKnown {
    entries: Mutex<HashMap<Arc<str>, Entry>>,
    max: usize,
    grace: Duration,
}

impl LastKnown {
    pub fn new(max: usize, grace: Duration) -> Self {
        Self {
            entries: Mutex::default(),
            max: max.max(1),
            grace,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A resolution of `authority` opens: the set it starts from, if one is
    /// known and within the grace.
    pub fn open(&self, authority: &Arc<str>) -> Option<Arc<EndpointSet>> {
        let now = Instant::now();
        let mut entries = self.lock();
        if !entries.contains_key(authority) && entries.len() >= self.max {
            Self::evict_one(&mut entries);
        }
        let entry = entries.entry(authority.clone()).or_insert_with(|| Entry {
            set: Arc::new(EndpointSet::pending()),
            heard: now,
            in_use: 0,
        });
        entry.in_use += 1;
        let fresh = now.saturating_duration_since(entry.heard) <= self.grace;
        (fresh && entry.set.state == SetState::Known).then(|| entry.set.clone())
    }

    /// A resolution of `authority` closed.
    pub fn close(&self, authority: &str) {
        if let Some(e) = self.lock().get_mut(authority) {
            e.in_use = e.in_use.saturating_sub(1);
        }
    }

    /// The controller sent a message for `authority`; `set` is the set now
    /// when it changed.
    pub fn heard(&self, authority: &str, set: Option<Arc<EndpointSet>>) {
        if let Some(e) = self.lock().get_mut(authority) {
            e.heard = Instant::now();
            if let Some(set) = set {
                e.set = set;
            }
        }
    }

    /// `authority` is served `set` from the snapshot file, which the
    /// controller last confirmed `age` ago: its staleness counts from then.
    pub fn restored(&self, authority: &str, set: Arc<EndpointSet>, age: Duration) {
        if let Some(e) = self.lock().get_mut(authority) {
            let then = Instant::now().checked_sub(age).unwrap_or(e.heard);
            e.heard = e.heard.min(then);
            e.set = set;
        }
    }

    fn evict_one(entries: &mut HashMap<Arc<str>, Entry>) {
        let oldest = entries
            .iter()
            .filter(|(_, e)| e.in_use == 0)
            .min_by_key(|(_, e)| e.heard)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            entries.remove(&k);
        }
    }

    /// Drops what is past the grace and not in use; while the controller is
    /// connected, the sets in use are current. Returns how old the oldest
    /// data in use is.
    pub fn sweep(&self, connected: bool) -> Duration {
        let now = Instant::now();
        let mut entries = self.lock();
        entries.retain(|_, e| e.in_use > 0 || now.saturating_duration_since(e.heard) <= self.grace);
        let mut oldest = Duration::ZERO;
        for e in entries.values_mut().filter(|e| e.in_use > 0) {
            if connected {
                e.heard = now;
            }
            oldest = oldest.max(now.saturating_duration_since(e.heard));
        }
        oldest
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Endpoint;

    fn known(port: u16) -> Arc<EndpointSet> {
        Arc::new(EndpointSet {
            state: SetState::Known,
            endpoints: vec![Endpoint::bare(([10, 0, 0, 1], port).into())],
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_set_served_from_the_snapshot_is_as_stale_as_the_snapshot() {
        let memory = LastKnown::new(10, Duration::from_secs(3600));
        let web: Arc<str> = Arc::from("web.shop.svc.cluster.local:80");
        // Some uptime, so that the snapshot's age reaches back before this
        // process started resolving.
        tokio::time::advance(Duration::from_secs(900)).await;
        assert_eq!(memory.open(&web), None);
        memory.restored(&web, known(80), Duration::from_secs(600));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(memory.sweep(false), Duration::from_secs(605));
        // A second resolution of it starts from that set, within the grace.
        assert_eq!(memory.open(&web), Some(known(80)));
        // The controller answers: current again.
        memory.heard(&web, None);
        assert_eq!(memory.sweep(false), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_used_again_within_the_grace_starts_from_its_last_set() {
        let memory = LastKnown::new(10, Duration::from_secs(3600));
        let web: Arc<str> = Arc::from("web.shop.svc.cluster.local:80");
        assert_eq!(memory.open(&web), None, "nothing known yet");
        memory.heard(&web, Some(known(80)));
        memory.close(&web);
        // The controller goes away; the stream closed long ago.
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(memory.sweep(false), Duration::ZERO, "nothing in use");
        assert_eq!(memory.open(&web), Some(known(80)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            memory.sweep(false),
            Duration::from_secs(605),
            "age of the data in use"
        );
        assert_eq!(
            memory.sweep(true),
            Duration::ZERO,
            "confirmed while connected"
        );
        memory.close(&web);
        tokio::time::advance(Duration::from_secs(3601)).await;
        memory.sweep(false);
        assert_eq!(memory.len(), 0, "past the grace and unused");
        assert_eq!(memory.open(&web), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_is_bounded_and_keeps_targets_in_use() {
        let memory = LastKnown::new(2, Duration::from_secs(3600));
        let names: Vec<Arc<str>> = (0..3).map(|i| Arc::from(format!("s{i}.ns:80"))).collect();
        memory.open(&names[0]);
        memory.heard(&names[0], Some(known(1)));
        memory.open(&names[1]);
        memory.heard(&names[1], Some(known(2)));
        memory.close(&names[1]);
        memory.open(&names[2]);
        assert_eq!(memory.len(), 2);
        memory.close(&names[2]);
        memory.close(&names[0]);
        assert_eq!(memory.open(&names[0]), Some(known(1)), "in use, so kept");
    }
}
