//! Test-only fixtures for Ballast.
//!
//! [`ApiServer`] emulates a Kubernetes API server closely enough for the real kube
//! client and `kube::runtime::watcher` to list and watch against it, with faults a test
//! can switch on and off. [`eventually`] is every test's wait for something that
//! happens in the background. No product crate depends on this crate.

#![forbid(unsafe_code)]

pub mod api_server;
pub mod cgroup;
pub mod cluster;
mod eventually;

pub use api_server::{
    serves, AdmissionCall, AdmissionOutcome, ApiError, ApiServer, DeleteOptions, RequestRecord,
    ServiceRef, Settings,
};
pub use eventually::{eventually, eventually_sync, Outcome, POLL};
