//! The iptables nat rules that send a pod's TCP through its sidecar proxy.
//!
//! Two chains of our own, `BALLAST_INBOUND` (jumped to from PREROUTING) and
//! `BALLAST_OUTBOUND` (from OUTPUT), are flushed and refilled on every run in
//! one `iptables-restore --noflush` transaction; the jumps to them are added
//! only when missing, so running it again leaves exactly one set of rules.
//!
//! [`rules`] decides what to write and does no IO; [`runner`] is the only
//! part that reads or changes the kernel's tables.

#![forbid(unsafe_code)]

pub mod host;
pub mod rules;
pub mod runner;

pub use host::{HostCheck, NetnsFacts};
pub use rules::{PortList, PortRange, Rules, RulesError, Subnet, SubnetList};
pub use runner::{IptablesMode, RunError, Runner};
