//! Ballast's demo: a steerable HTTP backend, a steady load client, and the
//! scenario `ballast demo` plays (controller outage, endpoint removal,
//! convergence) with a live view of the traffic.

#![forbid(unsafe_code)]

pub mod backend;
pub mod display;
pub mod load;
mod manifests;
mod process;
pub mod scenario;

pub use backend::Backend;
pub use display::ViewMode;
pub use load::{LoadClient, LoadConfig};
pub use scenario::{run, Check, DemoConfig, DemoOutcome, StepReport};
