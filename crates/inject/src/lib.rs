//! Sidecar injection: adds (and removes) Ballast's proxy and init
//! containers in workload manifests. The core is pure (JSON values and text
//! in, the same out): `ballast inject` and the injector webhook share it.
//!
//! - [`inject_pod`] / [`uninject_pod`]: one Pod-shaped object (a Pod, or a
//!   workload's `spec.template`).
//! - [`inject_documents`]: YAML or JSON text holding any manifests.
#![forbid(unsafe_code)]

pub mod config;
pub mod documents;
pub mod pod;
pub mod values;

pub use config::Config;
pub use documents::{convert, inject_documents, Action, Format, ObjectReport, Report, Rewritten};
pub use pod::{inject_pod, inject_pod_owned, uninject_pod, Mode, Outcome, Owner, SkipReason};
pub use values::InvalidValue;

/// Why a pod or a document could not be injected. Each names what was
/// wrong once (no cause chain repeating it).
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// A Linkerd annotation (on the pod or its namespace) has a bad value.
    #[error("annotation {annotation}: {value:?} is invalid: {reason}")]
    InvalidAnnotation {
        annotation: String,
        value: String,
        reason: InvalidValue,
    },
    /// A field of the [`Config`] has a bad value.
    #[error("configuration {field}: {reason}")]
    InvalidConfig { field: String, reason: InvalidValue },
    /// The proxy's request of a resource would exceed its limit.
    #[error(
        "the proxy's {resource} request {request} is more than its limit {limit} \
         (config.linkerd.io/proxy-{resource}-request, -limit)"
    )]
    RequestOverLimit {
        resource: &'static str,
        request: String,
        limit: String,
    },
    /// The object is not a pod (template) that can be injected.
    #[error("not an injectable pod: {0}")]
    NotAPod(String),
    /// A document of the input cannot be read (or written back).
    #[error("{source_name}: document {document}: {message}")]
    Malformed {
        source_name: String,
        document: usize,
        message: String,
    },
    /// An object of the input cannot be injected.
    #[error("{source_name}: document {document}: {object}: {error}")]
    InObject {
        source_name: String,
        document: usize,
        object: String,
        error: Box<InjectError>,
    },
}
