//! A bounded map of shared values that are dropped once unused for a while.
//! A value some connection still holds (its `Arc` is shared) is never
//! dropped, however old.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

/// Calls `sweep` on `owner` every `period` until the owner is gone (or the
/// returned task is aborted).
pub fn spawn_sweeper<T, F>(
    owner: Weak<T>,
    period: Duration,
    sweep: F,
) -> tokio::task::JoinHandle<()>
where
    T: Send + Sync + 'static,
    F: Fn(&T) + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(o) = owner.upgrade() else { return };
            sweep(&o);
        }
    })
}

/// How often to sweep a cache whose entries go after `idle`: a few times
/// per idle period, within 100 ms to 1 s.
pub fn sweep_period(idle: Duration) -> Duration {
    (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

#[derive(Debug, thiserror::Error)]
#[error("too many targets in use (at most {0})")]
pub struct CacheFull(pub usize);

#[derive(Debug)]
pub struct IdleCache<K, V> {
    entries: Mutex<HashMap<K, (Arc<V>, Instant)>>,
    max: usize,
    idle: Duration,
}

impl<K: Hash + Eq + Clone, V> IdleCache<K, V> {
    pub fn new(max: usize, idle: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            max,
            idle,
        }
    }

    /// The value for `key`, made by `make` when absent.
    pub fn get_or_insert_with(
        &self,
        key: &K,
        make: impl FnOnce() -> V,
    ) -> Result<Arc<V>, CacheFull> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, used)) = entries.get_mut(key) {
            *used = now;
            return Ok(v.clone());
        }
        if entries.len() >= self.max {
            Self::evict(&mut entries, self.idle, now);
            if entries.len() >= self.max {
                return Err(CacheFull(self.max));
            }
        }
        let v = Arc::new(make());
        entries.insert(key.clone(), (v.clone(), now));
        Ok(v)
    }

    fn evict(entries: &mut HashMap<K, (Arc<V>, Instant)>, idle: Duration, now: Instant) {
        entries.retain(|_, (v, used)| Arc::strong_count(v) > 1 || now.duration_since(*used) < idle);
    }

    /// Drops the values nobody holds that went unused for the idle timeout.
    pub fn sweep(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        Self::evict(&mut entries, self.idle, Instant::now());
    }

    /// The values now (the map's lock is not held while the caller uses them).
    pub fn values(&self) -> Vec<Arc<V>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.values().map(|(v, _)| v.clone()).collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_values_go_after_the_idle_timeout_and_held_ones_stay() {
        let cache = IdleCache::new(10, Duration::from_millis(20));
        let held = cache.get_or_insert_with(&"a", || 1).expect("room");
        let _ = cache.get_or_insert_with(&"b", || 2).expect("room");
        std::thread::sleep(Duration::from_millis(30));
        cache.sweep();
        assert_eq!(cache.len(), 1);
        assert_eq!(*cache.get_or_insert_with(&"a", || 9).expect("room"), 1);
        drop(held);
    }

    #[test]
    fn the_map_is_bounded() {
        let cache = IdleCache::new(2, Duration::from_secs(60));
        let _a = cache.get_or_insert_with(&1, || ()).expect("room");
        let _b = cache.get_or_insert_with(&2, || ()).expect("room");
        assert!(cache.get_or_insert_with(&3, || ()).is_err());
        // A known key is still served.
        assert!(cache.get_or_insert_with(&1, || ()).is_ok());
    }
}
