//! Sidecar injection (being written).
#![forbid(unsafe_code)]
