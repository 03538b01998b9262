//! Which route and rule of a policy a request takes: the matcher is the
//! pure `ballast-route` crate; what is here turns the policies' protobuf
//! into its types.

pub use ballast_route::*;

pub mod wire;
