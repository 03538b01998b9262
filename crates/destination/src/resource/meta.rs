use super::InvalidObject;
use serde::Deserialize;
use std::{collections::BTreeMap, fmt, sync::Arc};

/// Namespace and name: how every namespaced object is addressed.
///
/// The strings are shared: the index keeps a key in several maps, and a
/// clone costs a reference count, not a copy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The controlling owner of an object (e.g. the ReplicaSet of a pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ObjectMetaWire {
    pub name: Option<String>,
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub owner_references: Vec<OwnerReferenceWire>,
    pub creation_timestamp: Option<String>,
    pub deletion_timestamp: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct OwnerReferenceWire {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub controller: Option<bool>,
}

impl ObjectMetaWire {
    /// The object's key; objects without a namespace live in `default`, as
    /// `kubectl apply` would put them.
    pub fn key(&self) -> Result<ObjectKey, InvalidObject> {
        let name: Arc<str> = match self.name.as_deref() {
            Some(n) if !n.is_empty() => n.into(),
            _ => return Err(InvalidObject::missing("metadata.name")),
        };
        let namespace: Arc<str> = match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.into(),
            _ => "default".into(),
        };
        Ok(ObjectKey { namespace, name })
    }

    pub fn controller(&self) -> Option<Owner> {
        self.owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .or_else(|| self.owner_references.first())
            .filter(|o| !o.kind.is_empty() && !o.name.is_empty())
            .map(|o| Owner {
                kind: o.kind.clone(),
                name: o.name.clone(),
            })
    }

    /// Keeps only the annotations the index reads; the rest (for instance
    /// `kubectl.kubernetes.io/last-applied-configuration`) can be large and is
    /// never used.
    pub fn take_used_annotations(&mut self) -> Labels {
        let mut all = std::mem::take(&mut self.annotations);
        all.retain(|k, _| super::USED_ANNOTATIONS.contains(&k.as_str()));
        all.into()
    }

    pub fn take_labels(&mut self) -> Labels {
        std::mem::take(&mut self.labels).into()
    }
}

/// A small, immutable string map (labels, annotations, selectors), sorted by
/// key. A pod's handful of labels costs one allocation for the entries
/// instead of a B-tree node sized for eleven.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Does every entry of `self` appear in `other`?
    pub fn is_subset_of(&self, other: &Labels) -> bool {
        self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the slice is sorted.
        Labels(
            map.into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let map: BTreeMap<String, String> = iter
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        map.into()
    }
}
