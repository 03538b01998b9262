//! `ballast proxy` in transparent mode: in a network namespace of its own,
//! iptables redirects an unmodified client's connections to the proxy, which
//! routes each by its original destination (a service's cluster IP, a pod IP,
//! or anything else, forwarded as it was).
//!
//! Needs root, `ip`, `iptables`, `setpriv` and `curl`; elsewhere it says why
//! and is skipped (CI, which runs as root, installs them and must run it).

use ballast_testsupport as support;

use http::StatusCode;
use std::net::SocketAddr;
use support::{
    eventually,
    proxy::{
        netns::{cannot_run, NetNs, PROXY_UID},
        Cluster, Logged, Metrics, Proxy,
    },
};

const CLUSTER_IP: &str = "10.96.0.10";
const POD_A: &str = "10.244.0.2";
const POD_B: &str = "10.244.0.3";
/// Neither a service nor a pod: the proxy must forward to it as addressed.
const OUTSIDE: &str = "10.250.0.7";

/// Starts `ballast backend` in the namespace on `ip` (OS-picked port).
async fn backend(ns: &NetNs, name: &str, ip: &str) -> (Logged, SocketAddr) {
    let mut cmd = ns.command(&ns.bin);
    cmd.args(["backend", "--name", name, "--addr", &format!("{ip}:0")]);
    let mut process = Logged::spawn(cmd);
    let addr = process
        .listening(&format!("backend {name} listening on "), 1)
        .await[0];
    (process, addr)
}

fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[tokio::test]
async fn redirected_connections_are_routed_by_their_original_destination() {
    let ns = match NetNs::create(&[CLUSTER_IP, POD_A, POD_B, OUTSIDE]) {
        Ok(ns) => ns,
        Err(why) => return cannot_run("transparent-mode proxy", &why),
    };
    // Everything below is dropped (killed) before `ns` is removed.
    let (_a, addr_a) = backend(&ns, "web-a", POD_A).await;
    let (_b, addr_b) = backend(&ns, "web-b", POD_B).await;
    let (_outside, addr_outside) = backend(&ns, "outside", OUTSIDE).await;

    let cluster = Cluster::new();
    cluster.pods("web", &[("web-a", addr_a), ("web-b", addr_b)]);
    cluster.service("web", "web", CLUSTER_IP, 80);
    let mut _controller = {
        let mut cmd = ns.command(&ns.bin);
        cmd.arg("destination")
            .arg("--manifests")
            .arg(cluster.path())
            .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--policy-addr", "127.0.0.1:0"]);
        Logged::spawn(cmd)
    };
    let grpc = _controller
        .listening("destination gRPC listening on ", 1)
        .await[0];

    let proxy = {
        let mut cmd = ns.command_as_proxy_user(&ns.bin);
        cmd.arg("proxy")
            .args(["--destination-addr", &grpc.to_string()])
            .arg("--identity-disabled")
            .args(["--outbound-addr", "127.0.0.1:0"])
            .args(["--inbound-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"]);
        Proxy::from_command(cmd, 0).await
    };
    assert_eq!(
        uid_of(proxy.pid()),
        Some(PROXY_UID),
        "the proxy runs unprivileged"
    );
    ns.wait_for_200(&format!("http://{}/ready", proxy.admin))
        .await;
    for addr in [addr_a, addr_b, addr_outside] {
        ns.wait_for_200(&format!("http://{addr}/")).await;
    }

    ns.redirect_outbound_to(proxy.outbound.port()).unwrap();

    // The service's cluster IP: balanced over its pods.
    let url = format!("http://{CLUSTER_IP}:80/");
    for i in 0..10 {
        let a = ns
            .curl(&url)
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}\nproxy log:\n{}", proxy.process.log()));
        assert_eq!(
            a.status,
            StatusCode::OK,
            "request {i} to {url}: {a:?}\nproxy log:\n{}",
            proxy.process.log()
        );
        let body = a.text();
        let name = body.trim_end();
        assert!(
            ["web-a", "web-b"].contains(&name),
            "answered by {name:?}, not a web pod"
        );
        assert_eq!(a.backend(), Some(name));
    }
    // The proxy carried them (curl alone cannot reach the cluster IP: no
    // process listens there).
    let metrics_url = format!("http://{}/metrics", proxy.admin);
    eventually(
        "10 outbound requests to web in the proxy's metrics",
        || async {
            let a = ns.curl(&metrics_url).await.ok()?;
            let m = Metrics::parse(&a.text());
            let n = m.sum(
                "request_total",
                &[("direction", "outbound"), ("dst_service", "web")],
            );
            (n >= 10.0).then_some(())
        },
    )
    .await;

    // A pod IP: that pod, and no other.
    for _ in 0..3 {
        let a = ns.curl(&format!("http://{addr_b}/")).await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.text(), "web-b\n");
    }

    // Neither service nor pod: forwarded to the original address.
    let a = ns.curl(&format!("http://{addr_outside}/")).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.text(), "outside\n");

    // Those went through the proxy too (redirected, not made directly): it
    // counted them by original destination.
    let a = ns.curl(&metrics_url).await.unwrap();
    let m = Metrics::parse(&a.text());
    let b = addr_b.to_string();
    let to_pod = m.sum(
        "request_total",
        &[
            ("direction", "outbound"),
            ("authority", &b),
            ("dst_pod", "web-b"),
        ],
    );
    let outside = addr_outside.to_string();
    let to_outside = m.sum("request_total", &[("authority", &outside)]);
    let opened = m.sum(
        "tcp_open_total",
        &[("direction", "outbound"), ("peer", "src")],
    );
    assert!(
        to_pod >= 3.0 && to_outside >= 1.0 && opened >= 14.0,
        "requests to the pod {to_pod}, to the outside address {to_outside}, \
         connections {opened}; metrics:\n{}",
        m.text
    );
}
