//! Mesh identity and TLS, shared by the proxy and the controller. (The
//! Certify client that fetches a certificate is `ballast-certify`.)
//!
//! - [`name`]: Linkerd's identity names (`SA.NS.serviceaccount.identity.CONTROL_NS.TRUST_DOMAIN`)
//!   and SPIFFE URIs (pure).
//! - [`pem`]: certificates and keys from PEM, as Linkerd writes them.
//! - [`hello`]: the server name of a TLS ClientHello, peeked from the first bytes (pure).
//! - [`header`]: Linkerd's opaque transport header (pure).
//! - [`tls`]: rustls configurations (TLS 1.3, ring, ECDSA P-256), the swappable
//!   certificate store, and the peer identity of a connection.
//! - [`io`]: a connection that is TLS or not; dialling TLS for an identity.
//! - [`server`]: a controller's gRPC port, TLS or plaintext per connection,
//!   with bounded handshakes and connections.

#![forbid(unsafe_code)]

pub mod header;
pub mod hello;
pub mod io;
pub mod name;
pub mod pem;
pub mod server;
pub mod tls;

pub use name::{IdentityName, NameError};
pub use tls::{CertStore, Credentials};
