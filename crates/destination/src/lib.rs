//! Ballast's destination controller.
//!
//! Sources (`source`) feed the pure [`index::Index`]; the [`store::Store`]
//! shares its answers with subscribers; the gRPC server (`server`) streams
//! them to proxies with Linkerd's Destination API.

#![forbid(unsafe_code)]

pub mod authority;
pub mod diagnostics;
pub mod index;
pub mod metrics;
pub mod resource;
pub mod server;
pub mod source;
pub mod store;
