//! The injection webhook (being written).
#![forbid(unsafe_code)]
