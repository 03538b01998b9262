//! Ballast's viz: see the mesh with nothing else installed. The collector
//! scrapes every meshed proxy's `/metrics` (or reads an existing
//! Prometheus), `ballast_vizcore::mesh` turns the pages into golden metrics
//! with a bounded history, and the server answers the dashboard (assets
//! embedded in the binary) and the JSON API that `ballast stat`, `edges`,
//! `routes`, `tap` and `top` read. Tap requests fan out to the proxies' Tap
//! API.

#![forbid(unsafe_code)]

use std::sync::Arc;

use ballast_vizcore::targets::Snapshot;

pub mod assets;
pub mod cli;
pub mod collector;
pub mod forward;
pub mod metrics;
pub mod names;
pub mod prometheus;
pub mod scrape;
pub mod server;
pub mod tap;

/// The meshed pods now: read from the destination's index on each call.
pub type Targets = Arc<dyn Fn() -> Snapshot + Send + Sync>;
