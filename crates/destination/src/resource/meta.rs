use super::InvalidObject;
use serde::Deserialize;
use std::{collections::BTreeMap, fmt};

/// Namespace and name: how every namespaced object is addressed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
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
        let name = match self.name.as_deref() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => return Err(InvalidObject::missing("metadata.name")),
        };
        let namespace = match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_string(),
            _ => "default".to_string(),
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

    /// Keeps only the annotations Linkerd defines; the rest (for instance
    /// `kubectl.kubernetes.io/last-applied-configuration`) can be large and is
    /// never read.
    pub fn take_linkerd_annotations(&mut self) -> BTreeMap<String, String> {
        let mut all = std::mem::take(&mut self.annotations);
        all.retain(|k, _| is_linkerd_key(k));
        all
    }
}

pub(super) fn is_linkerd_key(k: &str) -> bool {
    k.starts_with("linkerd.io/")
        || k.starts_with("config.linkerd.io/")
        || k.contains(".linkerd.io/")
}
