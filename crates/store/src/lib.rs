//! The controller's core, between the sources and the gRPC servers: the
//! [`store::Store`] that sources (Kubernetes, a manifests directory) apply
//! [`store::Op`]s to, holding the pure [`index::Index`] (crate
//! `ballast-index`, re-exported here as `index` and `resource`); the
//! bounded per-subscriber [`feed`]s it answers through (and [`latest`]
//! values where every message is a whole answer), both keeping their
//! readers' places in [`slots`]; the subscription
//! registry both APIs share ([`shared`]) and which of its entries a change
//! reaches ([`reach`]); and the controller's
//! [`metrics`]. It knows neither Kubernetes' client nor gRPC: the sources
//! and the servers depend on it, never the other way.

#![forbid(unsafe_code)]

pub mod feed;
pub mod latest;
pub mod metrics;
pub mod reach;
pub mod shared;
mod slots;
pub mod store;
pub mod wakes;

pub use ballast_index as index;
pub use ballast_index::resource;
