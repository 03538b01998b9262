//! Shared subscriptions by key, the one registry behind both APIs: the
//! Destination API's `Get` and `GetProfile` (`store`) and the policy APIs'
//! `OutboundPolicies.Watch` and `InboundServerPolicies.WatchPort`
//! (`policy`). One entry per key, created by its first watcher and dropped
//! with its last, so that a key's answer and its changes are computed once
//! for all its watchers. Each registry keeps its keys in a [`Reach`]
//! index as entries come and go, so that a change finds the entries it
//! can alter (`crate::reach`) without a visit of every entry.

use std::{collections::HashMap, hash::Hash};

/// An index of a registry's keys, kept in step by [`Shared`]: a key is
/// inserted with its entry's first watcher and removed with its entry.
pub trait Reach<K> {
    fn insert(&mut self, key: &K);
    fn remove(&mut self, key: &K);
}

/// No index.
impl<K> Reach<K> for () {
    fn insert(&mut self, _: &K) {}
    fn remove(&mut self, _: &K) {}
}

/// The entries of one API method, each with how many watchers hold it,
/// and their keys in the index `X`.
pub struct Shared<K, E, X = ()> {
    entries: HashMap<K, Held<E>>,
    reach: X,
    /// Watchers of every entry, kept as they join and leave: the memory
    /// budget's closing step needs the total without a visit of every
    /// entry.
    watchers: usize,
}

struct Held<E> {
    entry: E,
    watchers: usize,
}

impl<K, E, X: Default> Default for Shared<K, E, X> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            reach: X::default(),
            watchers: 0,
        }
    }
}

impl<K: Eq + Hash + Clone, E, X: Reach<K>> Shared<K, E, X> {
    /// One more watcher of `key`; `create` makes its entry if it is the
    /// first. Returns the entry and whether it was created now.
    pub fn join(&mut self, key: &K, create: impl FnOnce() -> E) -> (&mut E, bool) {
        let created = !self.entries.contains_key(key);
        if created {
            self.reach.insert(key);
        }
        let held = self.entries.entry(key.clone()).or_insert_with(|| Held {
            entry: create(),
            watchers: 0,
        });
        held.watchers += 1;
        self.watchers += 1;
        (&mut held.entry, created)
    }

    /// `n` watchers of `key` are gone; returns the entry when it went with
    /// its last watcher.
    pub fn release(&mut self, key: &K, n: usize) -> Option<E> {
        let held = self.entries.get_mut(key)?;
        let gone = n.min(held.watchers);
        held.watchers -= gone;
        self.watchers -= gone;
        if held.watchers > 0 {
            return None;
        }
        self.reach.remove(key);
        self.entries.remove(key).map(|held| held.entry)
    }

    /// Every entry with its key and how many watchers hold it.
    pub fn held(&self) -> impl Iterator<Item = (&K, &E, usize)> {
        self.entries.iter().map(|(k, h)| (k, &h.entry, h.watchers))
    }

    /// Removes `key`'s entry whatever its watchers; returns it and how many
    /// held it (they must not be released again).
    pub fn take(&mut self, key: &K) -> Option<(E, usize)> {
        let held = self.entries.remove(key)?;
        self.reach.remove(key);
        self.watchers -= held.watchers;
        Some((held.entry, held.watchers))
    }

    /// Watchers of every entry together.
    pub fn watchers(&self) -> usize {
        self.watchers
    }

    /// The index of the keys.
    pub fn reach(&self) -> &X {
        &self.reach
    }

    /// How many keys have watchers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get_key_value(&self, key: &K) -> Option<(&K, &E)> {
        self.entries.get_key_value(key).map(|(k, h)| (k, &h.entry))
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut E> {
        self.entries.get_mut(key).map(|h| &mut h.entry)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &E> {
        self.entries.values().map(|h| &h.entry)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut E)> {
        self.entries.iter_mut().map(|(k, h)| (k, &mut h.entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_made_by_its_first_watcher_and_goes_with_its_last() {
        let mut shared: Shared<&str, u32> = Shared::default();
        let mut made = 0;
        let (_, created) = shared.join(&"a", || {
            made += 1;
            7
        });
        assert!(created);
        let (entry, created) = shared.join(&"a", || unreachable!("made once"));
        assert!(!created);
        assert_eq!(*entry, 7);
        shared.join(&"b", || 8);
        assert_eq!(shared.len(), 2);
        assert_eq!(shared.release(&"a", 1), None, "a watcher of a is left");
        assert_eq!(shared.release(&"a", 1), Some(7));
        assert_eq!(shared.release(&"a", 1), None, "already gone");
        // Several at once (a change that cut them), never below zero.
        assert_eq!(shared.release(&"b", 5), Some(8));
        assert!(shared.is_empty());
        assert_eq!(made, 1);
    }

    #[test]
    fn the_watcher_total_is_the_sum_over_entries_whatever_the_order() {
        let mut shared: Shared<u8, ()> = Shared::default();
        // A fixed pseudo-random walk of joins, releases (some of more
        // watchers than held) and takes over a few keys.
        let mut x: u32 = 0x2545_f491;
        let mut most = 0;
        for step in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let key = (x % 7) as u8;
            match (x >> 8) % 4 {
                0 | 1 => {
                    shared.join(&key, || ());
                }
                2 => {
                    shared.release(&key, ((x >> 12) % 4) as usize);
                }
                _ => {
                    shared.take(&key);
                }
            }
            let sum: usize = shared.held().map(|(_, _, n)| n).sum();
            assert_eq!(shared.watchers(), sum, "step {step}");
            most = most.max(sum);
        }
        assert!(most >= 5, "the walk held several watchers at once: {most}");
    }
}
