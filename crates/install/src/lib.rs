//! Install manifests (being written).
#![forbid(unsafe_code)]
