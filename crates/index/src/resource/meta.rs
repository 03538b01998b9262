use super::InvalidObject;
use serde::{
    de::{self, IgnoredAny, MapAccess, Visitor},
    Deserialize, Deserializer,
};
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

/// An object's metadata as the API writes it, minus what the index never
/// reads: `managedFields`, `finalizers`, `generation` and the like are skipped
/// by the decoder, and only the annotations in [`super::USED_ANNOTATIONS`] are
/// kept (the others' values are skipped, never allocated).
#[derive(Deserialize, Default, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaWire {
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// Read by the Kubernetes source (the watcher resumes from it).
    pub resource_version: Option<String>,
    pub uid: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "used_annotations")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner_references: Vec<OwnerReferenceWire>,
    pub creation_timestamp: Option<String>,
    pub deletion_timestamp: Option<String>,
}

#[derive(Deserialize, Clone, Debug)]
pub struct OwnerReferenceWire {
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

    /// The annotations the index reads (the decoder kept no others).
    pub fn take_used_annotations(&mut self) -> Labels {
        std::mem::take(&mut self.annotations).into()
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

/// `null` reads as the default (empty) value, as the API means it.
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Reads `metadata.annotations` keeping only [`super::USED_ANNOTATIONS`]:
/// other keys are compared in place and their values skipped, so a large
/// annotation (for instance `kubectl.kubernetes.io/last-applied-configuration`)
/// is never allocated.
fn used_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Annotations;

    impl<'de> Visitor<'de> for Annotations {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(UsedKey(key)) = map.next_key()? {
                match key {
                    Some(key) => {
                        let value: String = map.next_value()?;
                        out.insert(key.to_string(), value);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(out)
        }
    }

    d.deserialize_option(Annotations)
}

/// A map key, recognised as one of the used annotations without allocating.
struct UsedKey(Option<&'static str>);

impl<'de> Deserialize<'de> for UsedKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;

        impl Visitor<'_> for Key {
            type Value = UsedKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<UsedKey, E> {
                Ok(UsedKey(
                    super::USED_ANNOTATIONS.iter().copied().find(|k| *k == s),
                ))
            }
        }

        d.deserialize_str(Key)
    }
}
