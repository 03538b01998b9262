//! Where the index's objects come from.

// Public for the fuzz targets only.
#[doc(hidden)]
pub mod documents;
pub mod kube;
pub mod manifests;
