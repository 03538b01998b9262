//! Ballast's demo: a steerable HTTP backend, a steady load client, and the
//! scenario `ballast demo` plays (controller outage, endpoint removal,
//! convergence, all in mutual TLS) with a live view of the traffic.

#![forbid(unsafe_code)]

pub mod backend;
pub mod display;
mod identity;
pub mod load;
mod manifests;
mod mtls;
mod process;
pub mod scenario;

pub use backend::Backend;
pub use display::ViewMode;
pub use load::{LoadClient, LoadConfig};
pub use scenario::{run, Check, DemoConfig, DemoOutcome, MutualTls, StepReport};
