//! The sidecar's two commands, `proxy` and `init`: their clap flags and how
//! they wire the libraries (`ballast-proxy`, `ballast-init`,
//! `ballast-admin`), and nothing else. Both binaries use them: `ballast`
//! (as `ballast proxy` and `ballast init`) and the sidecar image's
//! `ballast-proxy`, which leaves the controller out of its dependency tree.

#![forbid(unsafe_code)]

pub mod init;
pub mod logging;
pub mod proxy;
pub mod ready;
pub mod signal;
