//! `ballast identity`: a certificate authority speaking Linkerd's Identity
//! API.
//!
//! - [`issuer`]: the issuer certificate and key and the trust anchors, from
//!   Linkerd's files; validity and chain checks; signing leaves.
//! - [`csr`]: what a certificate signing request must be (pure).
//! - [`token`]: proving a service account: Kubernetes TokenReview, or the
//!   service-account token Secrets of a manifests directory.
//! - [`service`]: the Certify gRPC service, its limits and metrics.
//! - [`generate`]: a fresh trust anchor and issuer for local runs and tests.

#![forbid(unsafe_code)]

pub mod csr;
pub mod generate;
pub mod issuer;
pub mod metrics;
pub mod service;
pub mod token;
