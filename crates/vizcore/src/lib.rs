//! Ballast's mesh view, pure: what the viz collector makes of the proxies'
//! `/metrics` pages, and what the dashboard and CLI are answered. No IO:
//! callers bring the page's bytes and the time.

#![forbid(unsafe_code)]

pub mod api;
pub mod expo;
pub mod mesh;
pub mod targets;
