//! Objects, the global resourceVersion counter and the retained change history (pure).
//!
//! Like etcd behind the real API server, every change gets the next revision of one
//! counter shared by all types. The last `history_limit` changes are retained; a
//! revision older than the oldest retained change is "compacted": watches from it and
//! consistent list pages at it are answered 410 Gone. A list page at an older retained
//! revision is rebuilt by undoing the retained changes newer than it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::resources::{self, RESOURCES};

/// `(namespace, name)`, ordered like the keys of etcd's registry.
pub(crate) type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One change, as retained in history and broadcast to watches.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub resource: usize,
    pub key: Key,
    pub kind: ChangeType,
    /// The object after the change; for a delete, its last state at the delete's revision.
    pub object: Arc<Value>,
    /// The object before the change (none for an add).
    pub prev: Option<Arc<Value>>,
}

/// Why a read at a revision cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Older than the retained history (410).
    Expired { requested: u64, oldest: u64 },
    /// Newer than the current revision (504, "Too large resource version").
    TooLarge { requested: u64, current: u64 },
}

/// One page of a list.
pub(crate) struct Page {
    pub items: Vec<Arc<Value>>,
    /// The key of the last item, when more items follow.
    pub next: Option<Key>,
    /// How many matching items follow this page.
    pub remaining: usize,
}

pub(crate) struct Store {
    rv: u64,
    objects: Vec<BTreeMap<Key, Arc<Value>>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Every change with a revision above this one is in `history`.
    compacted: u64,
    uid_seed: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Store {
        let uid_seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Store {
            // Start above 1 so that "0" (any) and real revisions never collide.
            rv: 1,
            objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
            history: VecDeque::new(),
            history_limit,
            compacted: 1,
            uid_seed,
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The oldest revision still readable.
    #[cfg(test)]
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn len(&self, resource: usize) -> usize {
        self.objects.get(resource).map_or(0, BTreeMap::len)
    }

    /// How many objects of every type are stored.
    pub fn total(&self) -> usize {
        self.objects.iter().map(BTreeMap::len).sum()
    }

    pub fn get(&self, resource: usize, key: &Key) -> Option<Arc<Value>> {
        self.objects.get(resource)?.get(key).cloned()
    }

    /// Creates or replaces an object. Returns the stored object and the change it made
    /// (none when the object was stored already exactly so).
    pub fn apply(&mut self, mut obj: Value) -> Result<(Arc<Value>, Option<Arc<Change>>), String> {
        let text = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (api_version, kind) = (text("apiVersion"), text("kind"));
        let Some(resource) = resources::by_kind(&api_version, &kind) else {
            return Err(format!(
                "apply: apiVersion {api_version:?} kind {kind:?} is not served (see ballast_testkit::ApiServer for the served types)"
            ));
        };
        let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(format!("apply: {kind} has no metadata object"));
        };
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => return Err(format!("apply: {kind} has no metadata.name")),
        };
        // Cluster-scoped objects have no namespace (the API server drops one given).
        let namespace = if !RESOURCES[resource].namespaced {
            meta.remove("namespace");
            String::new()
        } else {
            let namespace = match meta.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() => ns.to_string(),
                _ => "default".to_string(),
            };
            meta.insert("namespace".into(), Value::String(namespace.clone()));
            namespace
        };
        let key = (namespace, name);
        let prev = self.objects[resource].get(&key).cloned();
        if let Some(prev) = &prev {
            for field in ["uid", "creationTimestamp"] {
                if !meta.contains_key(field) {
                    if let Some(v) = prev.pointer(&format!("/metadata/{field}")) {
                        meta.insert(field.into(), v.clone());
                    }
                }
            }
            if let Some(v) = prev.pointer("/metadata/resourceVersion") {
                meta.insert("resourceVersion".into(), v.clone());
            }
            if obj == **prev {
                return Ok((prev.clone(), None));
            }
        }
        self.rv += 1;
        let rv = self.rv;
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            if !meta.contains_key("uid") {
                meta.insert("uid".into(), Value::String(self.uid(rv)));
            }
            if !meta.contains_key("creationTimestamp") {
                meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
            }
        }
        let object = Arc::new(obj);
        self.objects[resource].insert(key.clone(), object.clone());
        let kind = if prev.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        let change = self.record(Change {
            rv,
            resource,
            key,
            kind,
            object: object.clone(),
            prev,
        });
        Ok((object, Some(change)))
    }

    /// Deletes an object; the change carries its last state at the delete's revision.
    pub fn delete(&mut self, resource: usize, key: &Key) -> Option<Arc<Change>> {
        let prev = self.objects.get_mut(resource)?.remove(key)?;
        self.rv += 1;
        let rv = self.rv;
        let mut last = (*prev).clone();
        if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        Some(self.record(Change {
            rv,
            resource,
            key: key.clone(),
            kind: ChangeType::Deleted,
            object: Arc::new(last),
            prev: Some(prev),
        }))
    }

    fn record(&mut self, change: Change) -> Arc<Change> {
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        self.trim();
        change
    }

    fn trim(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Forgets all history: only the current revision stays readable.
    pub fn expire_history(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim();
    }

    /// Checks that a revision can be read.
    pub fn check(&self, rv: u64) -> Result<(), ReadError> {
        if rv < self.compacted {
            Err(ReadError::Expired {
                requested: rv,
                oldest: self.compacted,
            })
        } else if rv > self.rv {
            Err(ReadError::TooLarge {
                requested: rv,
                current: self.rv,
            })
        } else {
            Ok(())
        }
    }

    /// The retained changes after `rv` (which must pass [`Store::check`]).
    pub fn changes_after(&self, rv: u64) -> Vec<Arc<Change>> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history.iter().skip(start).cloned().collect()
    }

    /// One page of a type's objects as they were at revision `at`, in key order: those
    /// in `namespace` (all when none) after `after`, that `select` accepts; at most
    /// `limit` (all when zero).
    pub fn page(
        &self,
        resource: usize,
        at: u64,
        namespace: Option<&str>,
        after: Option<&Key>,
        limit: usize,
        select: impl Fn(&Value) -> bool,
    ) -> Result<Page, ReadError> {
        self.check(at)?;
        let Some(current) = self.objects.get(resource) else {
            return Ok(Page {
                items: Vec::new(),
                next: None,
                remaining: 0,
            });
        };
        let rebuilt;
        let state = if at == self.rv {
            current
        } else {
            let mut state = current.clone();
            for c in self.history.iter().rev().take_while(|c| c.rv > at) {
                if c.resource != resource {
                    continue;
                }
                match (&c.kind, &c.prev) {
                    (ChangeType::Added, _) | (_, None) => {
                        state.remove(&c.key);
                    }
                    (ChangeType::Modified | ChangeType::Deleted, Some(prev)) => {
                        state.insert(c.key.clone(), prev.clone());
                    }
                }
            }
            rebuilt = state;
            &rebuilt
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = 0;
        let candidates = state
            .iter()
            .filter(|(k, _)| after.is_none_or(|a| *k > a))
            .filter(|(k, _)| namespace.is_none_or(|ns| k.0 == ns))
            .filter(|(_, v)| select(v));
        for (key, obj) in candidates {
            if limit > 0 && items.len() == limit {
                remaining += 1;
                continue;
            }
            items.push(obj.clone());
            next = Some(key.clone());
        }
        if remaining == 0 {
            next = None;
        }
        Ok(Page {
            items,
            next,
            remaining,
        })
    }

    fn uid(&self, rv: u64) -> String {
        let s = self.uid_seed;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (s >> 32) as u32,
            (s >> 16) as u16,
            (s as u16) & 0xfff,
            ((rv >> 48) as u16) & 0xfff,
            rv & 0xffff_ffff_ffff
        )
    }
}

/// The current time as the API server writes timestamps (`2024-01-02T03:04:05Z`).
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// The time `secs` seconds from now, as the API server writes timestamps.
pub(crate) fn rfc3339_after(secs: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(now.saturating_add_signed(secs))
}

fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ns"},
               "status": {"phase": phase}})
    }

    fn names(page: &Page) -> Vec<String> {
        page.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn revisions_advance_and_unchanged_applies_are_no_ops() {
        let mut s = Store::new(10);
        let (a, c) = s.apply(pod("a", "Pending")).expect("apply");
        assert_eq!(c.map(|c| c.kind), Some(ChangeType::Added));
        assert_eq!(a["metadata"]["resourceVersion"], "2");
        let uid = a["metadata"]["uid"].clone();
        let (_, c) = s.apply(pod("a", "Pending")).expect("apply");
        assert!(c.is_none());
        let (a2, c) = s.apply(pod("a", "Running")).expect("apply");
        assert_eq!(c.map(|c| c.kind), Some(ChangeType::Modified));
        assert_eq!(a2["metadata"]["uid"], uid);
        assert_eq!(a2["metadata"]["resourceVersion"], "3");
        let key = ("ns".to_string(), "a".to_string());
        let p = resources::by_plural("pods").unwrap_or(0);
        let d = s.delete(p, &key).expect("deleted");
        assert_eq!(d.object["metadata"]["resourceVersion"], "4");
        assert!(s.delete(p, &key).is_none());
        assert!(s.apply(json!({"apiVersion": "v1", "kind": "Pod"})).is_err());
        assert!(s
            .apply(json!({"apiVersion": "v2", "kind": "Pod", "metadata": {"name": "x"}}))
            .is_err());
    }

    #[test]
    fn pages_at_an_old_revision_are_rebuilt_from_history() {
        let mut s = Store::new(100);
        let p = resources::by_plural("pods").unwrap_or(0);
        for n in ["a", "b", "c"] {
            s.apply(pod(n, "Pending")).expect("apply");
        }
        let at = s.rv();
        let first = s.page(p, at, None, None, 2, |_| true).expect("page");
        assert_eq!(names(&first), ["a", "b"]);
        assert_eq!(first.remaining, 1);
        // Changes after the snapshot are invisible to its later pages.
        s.apply(pod("bb", "Pending")).expect("apply");
        s.apply(pod("c", "Running")).expect("apply");
        s.delete(p, &("ns".into(), "a".into()));
        let second = s
            .page(p, at, None, first.next.as_ref(), 2, |_| true)
            .expect("page");
        assert_eq!(names(&second), ["c"]);
        assert_eq!(second.items[0]["status"]["phase"], "Pending");
        assert!(second.next.is_none());
        let now = s.page(p, s.rv(), None, None, 0, |_| true).expect("page");
        assert_eq!(names(&now), ["b", "bb", "c"]);
        s.expire_history();
        assert!(matches!(
            s.page(p, at, None, first.next.as_ref(), 2, |_| true),
            Err(ReadError::Expired { .. })
        ));
        assert!(matches!(
            s.check(s.rv() + 1),
            Err(ReadError::TooLarge { .. })
        ));
    }

    #[test]
    fn history_limit_compacts() {
        let mut s = Store::new(2);
        for n in ["a", "b", "c", "d"] {
            s.apply(pod(n, "Pending")).expect("apply");
        }
        // Revisions 2..=5; 4 and 5 retained.
        assert_eq!(s.compacted(), 3);
        assert!(s.check(2).is_err());
        assert_eq!(s.changes_after(3).len(), 2);
        assert_eq!(s.changes_after(4).len(), 1);
        s.set_history_limit(0);
        assert_eq!(s.compacted(), 5);
        assert!(s.changes_after(5).is_empty());
    }
}
