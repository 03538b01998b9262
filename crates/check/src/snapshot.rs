//! The objects the checks read, from a cluster or a manifests directory, and
//! the accessors they share. Objects stay JSON values: the checks read a few
//! fields of many kinds, and a missing or mistyped field reads as absent.

use crate::report::{ObjectRef, Source};
use serde_json::Value;
use std::{collections::BTreeMap, time::SystemTime};

/// Everything the checks look at.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub source: Source,
    /// Objects with `apiVersion` and `kind` set.
    pub objects: Vec<Value>,
    /// The API server's clock (its `Date` header), cluster source only.
    pub server_time: Option<SystemTime>,
}

impl Snapshot {
    pub fn new(source: Source, objects: Vec<Value>) -> Snapshot {
        Snapshot {
            source,
            objects,
            server_time: None,
        }
    }

    /// Every object of this kind (`Pod`, `Service`...).
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(move |o| text(o, "/kind") == kind)
    }

    /// One object by kind, namespace (`""` for cluster-scoped) and name.
    pub fn find<'a>(&'a self, kind: &'a str, namespace: &str, name: &str) -> Option<&'a Value> {
        self.of_kind(kind)
            .find(|o| self::namespace(o) == namespace && self::name(o) == name)
    }
}

/// The string at a JSON pointer, `""` when absent or not a string.
pub fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The array at a JSON pointer, empty when absent or not an array.
pub fn array<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn name(v: &Value) -> &str {
    text(v, "/metadata/name")
}

pub fn namespace(v: &Value) -> &str {
    text(v, "/metadata/namespace")
}

/// The string map at a JSON pointer (labels, selectors), empty when absent.
pub fn string_map<'a>(v: &'a Value, pointer: &str) -> BTreeMap<&'a str, &'a str> {
    v.pointer(pointer)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                .collect()
        })
        .unwrap_or_default()
}

pub fn labels(v: &Value) -> BTreeMap<&str, &str> {
    string_map(v, "/metadata/labels")
}

/// Does `selector` (equality on every key) select `labels`? An empty
/// selector selects nothing, as a Service's does.
pub fn selects(selector: &BTreeMap<&str, &str>, labels: &BTreeMap<&str, &str>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The object's reference for findings.
pub fn object_ref(v: &Value) -> ObjectRef {
    ObjectRef::new(text(v, "/kind"), Some(namespace(v)), name(v))
}

/// `shop/web-1`, or `web-1` for cluster-scoped objects.
pub fn key(v: &Value) -> String {
    match namespace(v) {
        "" => name(v).to_string(),
        ns => format!("{ns}/{}", name(v)),
    }
}

/// The first `max` references, for findings about many objects.
pub fn refs<'a>(objects: impl IntoIterator<Item = &'a Value>, max: usize) -> Vec<ObjectRef> {
    objects.into_iter().take(max).map(object_ref).collect()
}
