//! Ballast's destination controller.
//!
//! Sources (`source`) feed the pure [`index::Index`] (crate `ballast-index`,
//! re-exported here as `index` and `resource`); the [`store::Store`]
//! shares its answers with subscribers; the gRPC server (`server`) streams
//! them to proxies with Linkerd's Destination API.

#![forbid(unsafe_code)]

pub mod authority;
pub mod feed;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod shared;
pub mod source;
pub mod store;

pub use ballast_index as index;
pub use ballast_index::resource;
