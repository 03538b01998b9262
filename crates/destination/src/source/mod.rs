//! Where the index's objects come from.

mod documents;
pub mod manifests;
