//! Ballast's destination controller's gRPC servers: Linkerd's Destination
//! API (`server`) and its outbound and inbound policy APIs (`policy`),
//! answering from the store (crate `ballast-store`) that the sources
//! (`ballast-source-kube`, `ballast-source-manifests`) fill. It depends on
//! the core alone: no Kubernetes client, no file watching.

#![forbid(unsafe_code)]

pub mod authority;
pub mod h2;
pub mod policy;
pub mod server;
pub mod shed;

// The core's modules under the names this crate has always used.
use ballast_store::{feed, index, metrics, reach, resource, shared, store};
