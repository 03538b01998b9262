//! The proxy's admin listens where kubelet's probes reach it (issue 12), as
//! Linkerd's does, and its help says what a peer off the host gets.

use std::process::Command;

#[test]
fn the_admin_listens_on_every_interface_by_default_and_says_what_off_host_peers_get() {
    let out = Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .arg("--help")
        .env_remove("BALLAST_PROXY_ADMIN_ADDR")
        .output()
        .expect("ballast-proxy runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let section: String = help
        .split("--admin-addr")
        .nth(1)
        .and_then(|rest| rest.split("\n      --").next())
        .expect("--admin-addr is documented")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(section.contains("[default: 0.0.0.0:4191]"), "{section}");
    assert!(
        section.contains("only /live, /ready and /metrics"),
        "{section}"
    );
}
