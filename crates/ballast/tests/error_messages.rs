//! Start-up errors are one line that says its cause once (issue 12: a
//! missing `--manifests` directory, a missing or malformed kubeconfig).

use std::{
    io::Read,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// A failing start must end within this long.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);

struct Outcome {
    code: Option<i32>,
    /// The last stderr line: the error (earlier lines are logs).
    error: String,
}

fn destination(args: &[&str], env: &[(&str, &str)], unset_kubeconfig: bool) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ballast"));
    cmd.arg("destination")
        .args([
            "--addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--policy-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .envs(env.iter().copied())
        .env("BALLAST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if unset_kubeconfig {
        cmd.env_remove("KUBECONFIG");
    }
    // Not in a pod, whatever the machine running the tests is.
    cmd.env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    let mut child = cmd.spawn().expect("ballast starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for ballast") {
            break status;
        }
        if start.elapsed() > EXIT_DEADLINE {
            let _ = child.kill();
            panic!("ballast destination {args:?} did not exit within {EXIT_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .expect("stderr is text");
    let error = stderr.lines().last().unwrap_or_default().to_string();
    Outcome {
        code: status.code(),
        error,
    }
}

/// The error is a `ballast: ` line, exit status 1, and `cause` appears in
/// it exactly once.
fn assert_one_cause(outcome: &Outcome, cause: &str, names: &str) {
    assert_eq!(
        outcome.code,
        Some(1),
        "exit status; error: {}",
        outcome.error
    );
    assert!(
        outcome.error.starts_with("ballast: "),
        "the last line is the error: {:?}",
        outcome.error
    );
    assert_eq!(
        outcome.error.matches(cause).count(),
        1,
        "{cause:?} once in {:?}",
        outcome.error
    );
    assert!(
        outcome.error.contains(names),
        "{names:?} in {:?}",
        outcome.error
    );
}

#[test]
fn a_missing_manifests_directory_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let missing = missing.to_str().unwrap();
    let out = destination(&["--manifests", missing], &[], false);
    assert_one_cause(&out, "No such file or directory", missing);
    assert!(out.error.contains("create it"), "{}", out.error);
}

#[test]
fn a_missing_kubeconfig_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("kubeconfig");
    let missing = missing.to_str().unwrap();
    let out = destination(&["--kubeconfig", missing], &[], false);
    assert_one_cause(&out, "No such file or directory", missing);
}

#[test]
fn a_malformed_kubeconfig_is_said_once_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("kubeconfig");
    std::fs::write(&bad, "clusters: [\n").unwrap();
    let out = destination(&["--kubeconfig", bad.to_str().unwrap()], &[], false);
    assert_one_cause(&out, "unclosed bracket", bad.to_str().unwrap());
    // The parser's drawing of the bad line is not printed.
    assert!(!out.error.contains("-->"), "{}", out.error);
}

#[test]
fn a_kubeconfig_without_a_context_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\nclusters: []\n").unwrap();
    let out = destination(&["--kubeconfig", empty.to_str().unwrap()], &[], false);
    assert_one_cause(&out, "current context", empty.to_str().unwrap());
}

#[test]
fn no_configuration_at_all_names_the_kubeconfig_tried_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let tried = Path::new(&home).join(".kube").join("config");
    let out = destination(&[], &[("HOME", home.to_str().unwrap())], true);
    assert_one_cause(&out, "No such file or directory", tried.to_str().unwrap());
    assert!(
        out.error.contains("no Kubernetes configuration found"),
        "{}",
        out.error
    );
}
