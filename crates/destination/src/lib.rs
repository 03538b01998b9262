//! Ballast's destination controller.
//!
//! Sources (`source`) feed the pure [`index::Index`]; the [`store::Store`]
//! shares its answers with subscribers; the gRPC server (`server`) streams
//! them to proxies with Linkerd's Destination API.

#![forbid(unsafe_code)]

pub mod index;
pub mod resource;
pub mod metrics;
pub mod store;
