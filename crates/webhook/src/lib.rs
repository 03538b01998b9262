//! `ballast injector`: the mutating admission webhook that adds Ballast's
//! proxy to pods, with the code `ballast inject` runs (`ballast_inject`).
//!
//! - [`review`]: AdmissionReview v1 in and out (pure).
//! - [`patch`]: RFC 6902 JSON Patch between the pod as sent and as injected.
//! - [`decide`]: one review's answer: namespace annotations, injection,
//!   patch; failures answered per the failure policy.
//! - [`namespaces`]: namespace annotations from the Kubernetes API, in a
//!   bounded cache with a TTL.
//! - [`server`]: HTTPS (TLS 1.3) with bounded connections, handshakes,
//!   heads, bodies and concurrent reviews.
//! - [`tls`]: the serving certificate, re-read from its files.
#![forbid(unsafe_code)]

pub mod decide;
pub mod namespaces;
pub mod patch;
pub mod review;
pub mod server;
pub mod tls;
