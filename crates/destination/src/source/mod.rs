//! Where the index's objects come from.

mod documents;
pub mod kube;
pub mod manifests;
