//! `ballast-proxy` refuses out-of-range flags at start, as `ballast proxy` does.

use std::process::Command;

/// `args` is refused at start: exit code 2, one `error:` line naming `flag`,
/// nothing panicked.
fn assert_refused(args: &[&str], flag: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ballast-proxy"))
        .args(args)
        .env_remove("BALLAST_LOG")
        .env_remove("BALLAST_LOG_FORMAT")
        .output()
        .expect("ballast-proxy runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    // Besides clap's usage and its hint to try --help.
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line: {stderr}");
    assert!(
        lines[0].starts_with("error: invalid value"),
        "{args:?}: {stderr}"
    );
    assert!(lines[0].contains(flag), "{args:?}: {flag} not in {stderr}");
    stderr
}

#[test]
fn ballast_proxy_refuses_an_overflowing_timeout_naming_the_flag() {
    let stderr = assert_refused(
        &["--http-failfast-timeout", "18000000000000000000s"],
        "--http-failfast-timeout",
    );
    assert!(stderr.contains("1ms to 1d"), "{stderr}");
}

#[test]
fn ballast_proxy_refuses_values_that_would_start_silently_wrong() {
    for (args, flag) in [
        (
            &["--control-backoff-jitter", "2"][..],
            "--control-backoff-jitter",
        ),
        (
            &["--outbound-tcp", "127.0.0.1:25432=http://x"][..],
            "--outbound-tcp",
        ),
        (
            &["--outbound-tcp", "127.0.0.1:25432=db.shop"][..],
            "--outbound-tcp",
        ),
        (
            &["--outbound-tcp", "localhost:25432=db:5432"][..],
            "--outbound-tcp",
        ),
        (&["--cluster-domain", ""][..], "--cluster-domain"),
        (
            &["--cluster-domain", "cluster..local"][..],
            "--cluster-domain",
        ),
        (
            &["--destination-addr", "http://x:8086"][..],
            "--destination-addr",
        ),
        (&["--destination-addr", ""][..], "--destination-addr"),
        (&["--identity-addr", "identity:0"][..], "--identity-addr"),
        (&["--pod-namespace", ""][..], "--pod-namespace"),
        (&["--pod-namespace", "Shop"][..], "--pod-namespace"),
        (&["--pod-name", "web 1"][..], "--pod-name"),
        (&["--pod-owner", "deployment/Web"][..], "--pod-owner"),
        (
            &["--identity-trust-domain", ""][..],
            "--identity-trust-domain",
        ),
        (
            &["--identity-controller-namespace", "a.b"][..],
            "--identity-controller-namespace",
        ),
        (&["--identity-local-name", ""][..], "--identity-local-name"),
        (
            &["--identity-server-name=-bad.example"][..],
            "--identity-server-name",
        ),
        (
            &["--inbound-opaque-ports", "70000,abc"][..],
            "--inbound-opaque-ports",
        ),
        (&["--cluster-networks", ""][..], "--cluster-networks"),
        (
            &["--snapshot-max-bytes", "1KiB"][..],
            "--snapshot-max-bytes",
        ),
        (&["--snapshot-interval", "0s"][..], "--snapshot-interval"),
        (&["--snapshot-wait", "2d"][..], "--snapshot-wait"),
        (&["--log-format", "xml"][..], "--log-format"),
        (&["--log", "ballast=loud"][..], "--log"),
        (
            &["init", "--ports-to-redirect", "70000"][..],
            "--ports-to-redirect",
        ),
    ] {
        assert_refused(args, flag);
    }
}
