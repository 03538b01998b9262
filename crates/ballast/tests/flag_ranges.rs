//! Defect 7: a configured value can never panic a process later. Every
//! duration and size flag is range-checked at start: an extreme value is
//! refused by the flag parser (exit code 2) with the flag, the value and the
//! allowed range, before anything is bound or started.

use std::process::{Command, Output};

fn ballast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        // A stray setting in the environment must not decide the outcome.
        .env_remove("BALLAST_PROXY_HTTP_FAILFAST_TIMEOUT")
        .output()
        .expect("ballast runs")
}

/// `args` is refused at start with exit code 2 and a message naming `flag`,
/// `value` and `range`, and nothing panicked.
fn assert_refused(args: &[&str], flag: &str, value: &str, range: &str) {
    let out = ballast(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    for needle in [flag, value, range] {
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
}

#[test]
fn an_overflowing_failfast_timeout_is_refused_at_start_not_on_the_first_request() {
    assert_refused(
        &["proxy", "--http-failfast-timeout", "18000000000000000000s"],
        "--http-failfast-timeout",
        "18000000000000000000s",
        "allowed 1ms to 1d",
    );
}

#[test]
fn extreme_sizes_and_durations_of_every_command_are_refused_naming_the_flag() {
    for (args, flag, value, range) in [
        (
            &["proxy", "--memory-limit", "99999999999999999999G"][..],
            "--memory-limit",
            "99999999999999999999G",
            "0 (off) or 1M to 1024G",
        ),
        (
            &["proxy", "--http2-max-frame-bytes", "16M"][..],
            "--http2-max-frame-bytes",
            "16M",
            "16K to 16777215",
        ),
        (
            &["proxy", "--http1-max-header-bytes", "1024"][..],
            "--http1-max-header-bytes",
            "1024",
            "8K to 16M",
        ),
        (
            &["proxy", "--control-backoff-jitter", "NaN"][..],
            "--control-backoff-jitter",
            "NaN",
            "0 to 1",
        ),
        (
            &["destination", "--shutdown-grace", "400d"][..],
            "--shutdown-grace",
            "400d",
            "0s to 1d",
        ),
        (
            &["destination", "--manifests-max-file-bytes", "0"][..],
            "--manifests-max-file-bytes",
            "0",
            "1K to 1G",
        ),
        (
            &[
                "diagnostics",
                "endpoints",
                "web.shop:80",
                "--timeout",
                "0ms",
            ][..],
            "--timeout",
            "0ms",
            "1ms to 1d",
        ),
        (
            &["viz", "--scrape-interval", "0s"][..],
            "--scrape-interval",
            "0s",
            "1s to 1h",
        ),
        (
            &["viz", "--max-page-bytes", "1"][..],
            "--max-page-bytes",
            "1",
            "1K to 1G",
        ),
        (
            &["proxy", "--tap-max-event-bytes", "1"][..],
            "--tap-max-event-bytes",
            "1",
            "256 to 1M",
        ),
        (
            &["demo", "--down-for", "5000h"][..],
            "--down-for",
            "5000h",
            "100ms to 1h",
        ),
    ] {
        assert_refused(args, flag, value, range);
    }
}

/// `args` is refused at start: exit code 2, one `error: invalid value` line
/// naming `flag` (besides clap's usage and hint), nothing panicked.
fn assert_one_error(args: &[&str], flag: &str) {
    let out = ballast(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: one error line: {stderr}");
    assert!(
        errors[0].starts_with("error: invalid value") && errors[0].contains(flag),
        "{args:?}: {flag:?} not in {stderr}"
    );
}

#[test]
fn values_that_used_to_start_silently_are_refused_with_one_line() {
    for (args, flag) in [
        // Issue 12's list.
        (
            &["destination", "--default-opaque-ports", "70000,abc"][..],
            "--default-opaque-ports",
        ),
        (
            &["proxy", "--control-backoff-jitter", "2"][..],
            "--control-backoff-jitter",
        ),
        (
            &["proxy", "--outbound-tcp", "127.0.0.1:25432=http://x"][..],
            "--outbound-tcp",
        ),
        (
            &["destination", "--cluster-domain", ""][..],
            "--cluster-domain",
        ),
        (&["proxy", "--cluster-domain", ""][..], "--cluster-domain"),
        (&["demo", "--connections", "0"][..], "--connections"),
        // The same kinds of value, found across the commands.
        (
            &["destination", "--default-opaque-ports", "http-alt"][..],
            "--default-opaque-ports",
        ),
        (
            &["destination", "--default-opaque-ports", "5432-25"][..],
            "--default-opaque-ports",
        ),
        (
            &["destination", "--controller-namespace", ""][..],
            "--controller-namespace",
        ),
        (
            &["destination", "--namespace", "Ballast"][..],
            "--namespace",
        ),
        (
            &["destination", "--identity-trust-domain", "cluster..local"][..],
            "--identity-trust-domain",
        ),
        (
            &["destination", "--identity-addr", "http://identity:8080"][..],
            "--identity-addr",
        ),
        (
            &["destination", "--service-account", ""][..],
            "--service-account",
        ),
        (
            &["destination", "--identity-server-name", "identity linkerd"][..],
            "--identity-server-name",
        ),
        (&["identity", "--trust-domain", ""][..], "--trust-domain"),
        (
            &["identity", "--controller-namespace", "a.b"][..],
            "--controller-namespace",
        ),
        (
            &["identity", "--service-account", "SA"][..],
            "--service-account",
        ),
        (&["identity", "--client-rate", "NaN"][..], "--client-rate"),
        (
            &["identity", "generate", "--out", "x", "--trust-domain", ""][..],
            "--trust-domain",
        ),
        (
            &["proxy", "--destination-addr", "dst"][..],
            "--destination-addr",
        ),
        (&["proxy", "--pod-namespace", ""][..], "--pod-namespace"),
        (
            &["proxy", "--inbound-opaque-ports", "0"][..],
            "--inbound-opaque-ports",
        ),
        (&["proxy", "--workers", "0"][..], "--workers"),
        (&["backend", "--name", ""][..], "--name"),
        (&["demo", "--rps", "0"][..], "--rps"),
        (
            &["init", "--ports-to-redirect", "70000"][..],
            "--ports-to-redirect",
        ),
        (&["destination", "--log-format", "xml"][..], "--log-format"),
        (&["destination", "--log", "ballast=loud"][..], "--log"),
    ] {
        assert_one_error(args, flag);
    }
}

/// Defects: a minimum above its maximum was accepted, and `viz
/// --scrape-interval 1s` exited 1 because the default timeout did not fit.
/// Pairs that cannot work are usage errors (exit 2) naming both flags; a
/// default that does not fit is lowered.
#[test]
fn flags_that_cannot_work_together_are_usage_errors_naming_both() {
    for (args, words) in [
        (
            &[
                "proxy",
                "--identity-disabled",
                "--control-backoff-min",
                "20s",
                "--control-backoff-max",
                "10s",
            ][..],
            ["--control-backoff-min (20s)", "--control-backoff-max (10s)"],
        ),
        (
            &[
                "proxy",
                "--identity-disabled",
                "--connect-backoff-min",
                "2s",
                "--connect-backoff-max",
                "1s",
            ][..],
            ["--connect-backoff-min (2s)", "--connect-backoff-max (1s)"],
        ),
        (
            &[
                "proxy",
                "--identity-disabled",
                "--snapshot-path",
                "/nonexistent/proxy.snapshot",
                "--snapshot-wait",
                "2s",
                "--profile-timeout",
                "1s",
            ][..],
            ["--snapshot-wait (2s)", "--profile-timeout (1s)"],
        ),
        (
            &[
                "viz",
                "--manifests",
                "/nonexistent",
                "--scrape-interval",
                "2s",
                "--scrape-timeout",
                "3s",
            ][..],
            ["--scrape-timeout (3s)", "--scrape-interval (2s)"],
        ),
    ] {
        let out = ballast(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for w in words {
            assert!(stderr.contains(w), "{args:?}: {w:?} not in {stderr}");
        }
    }
    // A short interval alone is fine: the timeout's default is lowered. (It
    // then fails on the missing directory, which says so: not a usage error.)
    let out = ballast(&[
        "viz",
        "--manifests",
        "/nonexistent",
        "--scrape-interval",
        "1s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("--scrape-timeout"), "{stderr}");
    assert!(stderr.contains("/nonexistent"), "{stderr}");
}
