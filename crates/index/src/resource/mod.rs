//! The slim projections of the Kubernetes objects the index reads.
//!
//! Each kind has a *wire* type shaped like the API's JSON (unknown fields are
//! ignored, so they are never allocated) and a *domain* type holding only what
//! the index uses. Conversion checks required fields and names the one missing.

mod endpoint_slice;
mod meta;
mod pod;
mod service;

pub use endpoint_slice::{EndpointSlice, SliceEndpoint, SlicePort};
pub use meta::{Labels, ObjectKey, Owner};
pub use pod::{ContainerPort, Phase, Pod};
pub use service::{Service, ServicePort, ServiceType, TargetPort};

pub use endpoint_slice::EndpointSliceWire;
pub use meta::ObjectMetaWire;
pub use pod::PodWire;
pub use service::ServiceWire;

use std::sync::Arc;

/// Annotation listing ports that carry opaque (non-HTTP) traffic.
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.linkerd.io/opaque-ports";
/// Annotation listing ports on which a pod's proxy is bypassed.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.linkerd.io/skip-inbound-ports";
/// The annotations the index reads; all others are dropped when decoding.
pub const USED_ANNOTATIONS: &[&str] = &[OPAQUE_PORTS_ANNOTATION, SKIP_INBOUND_PORTS_ANNOTATION];
/// Label set by Linkerd's proxy injector on meshed pods.
pub const CONTROL_PLANE_NS_LABEL: &str = "linkerd.io/control-plane-ns";

/// A Kubernetes object the index understands.
///
/// Objects are shared, not copied: a source that keeps the last good state of
/// a file and the index that serves it hold the same allocation.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    Pod(Arc<Pod>),
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
}

/// The kinds of object the index holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    Service,
    EndpointSlice,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
        }
    }
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Pod(_) => Kind::Pod,
            Resource::Service(_) => Kind::Service,
            Resource::EndpointSlice(_) => Kind::EndpointSlice,
        }
    }

    pub fn key(&self) -> &ObjectKey {
        match self {
            Resource::Pod(p) => &p.key,
            Resource::Service(s) => &s.key,
            Resource::EndpointSlice(e) => &e.key,
        }
    }

    /// Converts one decoded object (any JSON-shaped value) into a resource.
    ///
    /// `Ok(None)` means the object is of a kind the index does not use.
    pub fn from_value(value: serde_json::Value) -> Result<Option<Resource>, InvalidObject> {
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        match (api_version, kind) {
            ("v1", "Pod") => decode::<PodWire>(value).map(Some),
            ("v1", "Service") => decode::<ServiceWire>(value).map(Some),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                decode::<EndpointSliceWire>(value).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// One kind's wire type: the API's JSON decoded slim, then converted to the
/// domain object the index holds. Both sources decode through it.
pub trait Wire:
    serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
    const KIND: Kind;

    fn metadata(&self) -> &ObjectMetaWire;

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire;

    /// Checks the object and converts it; the error names the field.
    fn into_resource(self) -> Result<Resource, InvalidObject>;
}

impl Wire for PodWire {
    const KIND: Kind = Kind::Pod;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::Pod(Arc::new(Pod::try_from(self)?)))
    }
}

impl Wire for ServiceWire {
    const KIND: Kind = Kind::Service;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::Service(Arc::new(Service::try_from(self)?)))
    }
}

impl Wire for EndpointSliceWire {
    const KIND: Kind = Kind::EndpointSlice;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::EndpointSlice(Arc::new(EndpointSlice::try_from(
            self,
        )?)))
    }
}

/// Why an object could not be used: the field that is wrong, and how.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct InvalidObject {
    /// Dotted path of the offending field, e.g. `spec.ports[0].port`.
    pub field: String,
    pub reason: String,
}

impl InvalidObject {
    pub fn missing(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "required but missing".into(),
        }
    }

    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

fn decode<W: Wire>(value: serde_json::Value) -> Result<Resource, InvalidObject> {
    let wire: W = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        // serde's messages can quote whole input values; keep the reason short.
        let mut reason = e.into_inner().to_string();
        truncate(&mut reason, 160);
        InvalidObject { field, reason }
    })?;
    wire.into_resource()
}

/// Shortens `s` to at most `max` bytes on a char boundary, marking the cut.
pub fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}
