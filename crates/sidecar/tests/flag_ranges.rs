//! `ballast-proxy` refuses out-of-range flags at start, as `ballast proxy` does.

#[test]
fn ballast_proxy_refuses_an_overflowing_timeout_naming_the_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .args(["--http-failfast-timeout", "18000000000000000000s"])
        .output()
        .expect("ballast-proxy runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("--http-failfast-timeout"), "{stderr}");
    assert!(stderr.contains("1ms to 1d"), "{stderr}");
}
