//! Cluster checks (being written).
#![forbid(unsafe_code)]
