//! `ballast diagnostics` as a process (issue 12's rough edges): a URL given
//! for an authority, a server that is not gRPC, the default profile of an
//! unknown service told apart, and ratios printed as written.

use ballast_testsupport as support;

use std::{net::SocketAddr, process::Output};
use support::{
    manifests::{docs, service, PodSpec},
    write_atomic, Controller,
};

fn shop(dir: &std::path::Path) {
    let all = [
        service("shop", "web", "127.0.0.100", 80, 8080),
        PodSpec::new("shop", "web-a", "web", "127.0.1.1", 8080).yaml(),
        service("shop", "api", "127.0.0.102", 80, 8080),
        "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\n\
         metadata: {name: api.shop.svc.cluster.local, namespace: shop}\n\
         spec:\n  routes:\n  - name: GET /api\n    condition: {method: GET, pathRegex: /api/.*}\n\
         \x20 retryBudget: {retryRatio: 0.3, minRetriesPerSecond: 3, ttl: 5s}\n"
            .to_string(),
    ];
    write_atomic(&dir.join("shop.yaml"), &docs(&all));
}

fn diagnostics(destination: SocketAddr, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("diagnostics")
        .args(args)
        .arg("--destination")
        .arg(destination.to_string())
        .args(["--timeout", "5s"])
        .output()
        .expect("ballast runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}, stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(out)).expect("JSON output")
}

#[tokio::test]
async fn a_url_is_refused_with_the_authority_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    shop(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    for (given, authority) in [
        ("http://web.shop:80", "web.shop:80"),
        (
            "https://web.shop.svc.cluster.local:80/path?q",
            "web.shop.svc.cluster.local:80",
        ),
        ("web.shop:80/index.html", "web.shop:80"),
    ] {
        for command in ["endpoints", "profile"] {
            let out = diagnostics(c.grpc, &[command, given]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {given}: {stderr}");
            assert!(
                stderr.contains("not a URL") && stderr.contains(&format!("try `{authority}`")),
                "{command} {given}: {stderr}"
            );
            assert!(!stderr.contains("IPv6"), "{stderr}");
        }
    }
}

#[tokio::test]
async fn a_server_that_is_not_grpc_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    shop(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    // The controller's own admin port: HTTP/1.1.
    for command in ["endpoints", "profile"] {
        let out = diagnostics(c.admin, &[command, "web.shop:80"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("{} did not answer as a gRPC server", c.admin)),
            "{stderr}"
        );
        assert!(!stderr.contains("Unknown: transport error"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
}

#[tokio::test]
async fn profiles_say_whether_they_are_defaults_and_for_an_unknown_service() {
    let dir = tempfile::tempdir().unwrap();
    shop(dir.path());
    let c = Controller::start(dir.path(), &[]).await;

    let unknown = diagnostics(c.grpc, &["profile", "nothere.shop:80"]);
    let table = stdout(&unknown);
    assert!(table.contains("no such service"), "{table}");
    let v = json(&diagnostics(
        c.grpc,
        &["profile", "nothere.shop:80", "-o", "json"],
    ));
    assert_eq!(v["profile"], "unknown-service");

    let known = stdout(&diagnostics(c.grpc, &["profile", "web.shop:80"]));
    assert!(
        known.contains("no ServiceProfile or routes for this service"),
        "{known}"
    );
    assert!(!known.contains("no such service"), "{known}");
    let v = json(&diagnostics(
        c.grpc,
        &["profile", "web.shop:80", "-o", "json"],
    ));
    assert_eq!(v["profile"], "defaults");

    let v = json(&diagnostics(
        c.grpc,
        &["profile", "api.shop:80", "-o", "json"],
    ));
    assert_eq!(v["profile"], "service-profile");
    assert_eq!(v["routes"], 1);

    let v = json(&diagnostics(
        c.grpc,
        &["profile", "127.0.1.1:8080", "-o", "json"],
    ));
    assert_eq!(v["profile"], "endpoint");
}

#[tokio::test]
async fn ratios_are_printed_as_written() {
    let dir = tempfile::tempdir().unwrap();
    shop(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    for (authority, ratio) in [("web.shop:80", "0.2"), ("api.shop:80", "0.3")] {
        let text = stdout(&diagnostics(c.grpc, &["profile", authority, "-o", "json"]));
        let printed = text
            .split("\"retry_ratio\": ")
            .nth(1)
            .and_then(|rest| rest.split([',', '\n']).next());
        assert_eq!(printed, Some(ratio), "{authority}: {text}");
    }
}

/// `diagnostics policy` prints what a proxy is told: a Service's outbound
/// policy and a pod port's inbound policy.
#[tokio::test]
async fn policy_prints_a_services_outbound_and_a_pods_inbound_policy() {
    let dir = tempfile::tempdir().unwrap();
    shop(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    let out = stdout(&diagnostics(
        c.grpc,
        &["policy", "svc/web", "80", "-n", "shop"],
    ));
    assert!(
        out.starts_with("# outbound policy of web.shop.svc.cluster.local:80\n"),
        "{out}"
    );
    // The default route's backend is the Service itself.
    assert!(out.contains("web.shop.svc.cluster.local:80"), "{out}");
    assert!(out.contains("protocol"), "{out}");
    let out = stdout(&diagnostics(
        c.grpc,
        &["policy", "po/web-a", "8080", "-n", "shop"],
    ));
    assert!(
        out.starts_with("# inbound policy of pod shop/web-a port 8080\n"),
        "{out}"
    );
    assert!(out.contains("authorizations"), "{out}");
    // A resource that is neither is a usage error.
    let bad = diagnostics(c.grpc, &["policy", "deploy/web", "80"]);
    assert_eq!(bad.status.code(), Some(2));
}
