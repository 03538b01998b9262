//! What every Ballast server accepts connections with.
//!
//! - [`accept::Acceptor`]: the one accept step. Errors that concern only
//!   the connection being accepted are skipped; others (out of file
//!   descriptors) are counted, logged at most every 10 s and pause
//!   accepting for 100 ms, so that the loop never spins and never ends.
//!   The proxy's listeners, the gRPC servers (`ballast_meshtls::server`)
//!   and the loop below all accept through it.
//! - [`accept::serve_bounded`]: the bounded accept loop of the small
//!   HTTP/1 servers (admin, viz's dashboard, the injector's webhook).
//! - [`GaugeGuard`]: counts something open in a gauge for as long as it lives.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod accept;
mod gauge;

pub use gauge::GaugeGuard;
