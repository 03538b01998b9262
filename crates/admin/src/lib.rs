//! The admin side of every Ballast process: a small HTTP/1.1 server answering
//! `/live`, `/ready` and `/metrics` (and `POST /shutdown` where its owner
//! enables it), the process memory and process metrics it exports, and a
//! controller's memory budget ([`budget`]).
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::sync::Arc;
//!
//! use ballast_admin::{AdminServer, AdminState, Readiness};
//! use prometheus_client::registry::Registry;
//!
//! # async fn run() -> std::io::Result<()> {
//! let mut registry = Registry::default();
//! ballast_admin::register_memory_metrics(&mut registry);
//! let _sampler = ballast_admin::spawn_memory_sampler();
//!
//! let ready = Arc::new(AtomicBool::new(false));
//! let state = AdminState::new(Arc::new(registry), Readiness::from_flag(ready.clone()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:4191").await?;
//! AdminServer::new(state)
//!     .serve(listener, async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await
//! # }
//! ```
//!
//! The server knows nothing of the mesh: it reads a [`Registry`] the caller
//! filled and asks a [`Readiness`] the caller owns.
//!
//! [`Registry`]: prometheus_client::registry::Registry

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod budget;
mod memory;
mod process;
mod readiness;
mod server;

pub use budget::{MemoryBudget, Pressure};
pub use memory::{
    compact_thread_allocations, register_memory_metrics, release_unused_memory,
    spawn_memory_sampler, AllocatorReadings, Statm, MEMORY_SAMPLE_INTERVAL,
};
pub use process::{register_build_info, register_process_metrics};
pub use readiness::Readiness;
pub use server::{
    route, serve, AdminServer, AdminState, Route, ShutdownRequest, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTION_AGE, DEFAULT_SHUTDOWN_GRACE,
    METRICS_CONTENT_TYPE,
};

// The unit tests measure the allocator, so they run on jemalloc as the binary does.
#[cfg(test)]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
