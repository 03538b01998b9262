//! `ballast init` in network namespaces: two "pods", each a namespace with
//! its app and its proxy, joined by a veth pair, and a "node" namespace
//! holding the destination controller. After `ballast init` in each pod, an
//! unmodified client (curl) in pod A reaching a service's cluster IP is
//! answered by pod B's app, through pod A's proxy (outbound) and pod B's
//! (inbound). Also: a second run leaves the same rules, `--dry-run` changes
//! nothing, and missing privileges or iptables are refused clearly.
//!
//! Root-only parts need `ip`, `iptables`, `setpriv` and `curl`; elsewhere
//! they say why and are skipped (CI, which runs as root, must run them).

use ballast_testsupport as support;

use http::StatusCode;
use std::{net::SocketAddr, process::Output};
use support::{
    eventually,
    proxy::{
        netns::{
            cannot_run, preflight, two_pods, NetNs, CLUSTER_IP, NODE_TO_A, NODE_TO_B, POD_B,
            PROXY_UID,
        },
        Cluster, Logged, Proxy,
    },
};

/// Runs `ballast ARGS` in `ns` to completion (in this process's namespace
/// when `ns` is None), with `env` added.
async fn ballast(ns: Option<&NetNs>, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = match ns {
        // Through env(1): a changed PATH must not hide `ip` itself.
        Some(ns) => {
            let mut cmd = ns.command("env");
            cmd.args(env.iter().map(|(k, v)| format!("{k}={v}")))
                .arg(&ns.bin);
            cmd
        }
        None => {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_ballast"));
            cmd.envs(env.iter().copied());
            cmd
        }
    };
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(support::DEADLINE, cmd.output())
        .await
        .expect("ballast finishes in time")
        .expect("run ballast")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `ballast init ARGS` in `ns`, which must succeed.
async fn init(ns: &NetNs, args: &[&str]) {
    let mut all = vec!["init"];
    all.extend_from_slice(args);
    let out = ballast(Some(ns), &[], &all).await;
    assert!(
        out.status.success(),
        "ballast init {args:?} failed ({}):\n{}",
        out.status,
        text(&out.stderr)
    );
}

/// Starts `ballast backend` in `ns` on all its addresses (OS-picked port).
async fn app(ns: &NetNs, name: &str) -> (Logged, u16) {
    let mut cmd = ns.command(&ns.bin);
    cmd.args(["backend", "--name", name, "--addr", "0.0.0.0:0"]);
    let mut process = Logged::spawn(cmd);
    let addr = process
        .listening(&format!("backend {name} listening on "), 1)
        .await[0];
    (process, addr.port())
}

/// Starts the pod's proxy (no identity).
async fn proxy(ns: &NetNs, destination: SocketAddr) -> Proxy {
    ns.start_proxy(&destination.to_string(), &["--identity-disabled"])
        .await
}

#[tokio::test]
async fn a_client_in_pod_a_reaches_a_service_in_pod_b_through_both_proxies() {
    let (node, a, b) = match two_pods() {
        Ok(namespaces) => namespaces,
        Err(why) => return cannot_run("ballast init two-pod", &why),
    };
    // Everything below is dropped (killed) before the namespaces are removed.

    let (_app_b, app_port) = app(&b, "web-b").await;
    let cluster = Cluster::new();
    let pod_b: SocketAddr = format!("{POD_B}:{app_port}").parse().unwrap();
    cluster.pods("web", &[("web-b", pod_b)]);
    cluster.service("web", "web", CLUSTER_IP, 80);
    let mut controller = {
        let mut cmd = node.command(&node.bin);
        cmd.arg("destination")
            .arg("--manifests")
            .arg(cluster.path())
            .args(["--addr", "0.0.0.0:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--policy-addr", "127.0.0.1:0"]);
        Logged::spawn(cmd)
    };
    let grpc_port = controller
        .listening("destination gRPC listening on ", 1)
        .await[0]
        .port();

    // The proxies run as PROXY_UID: init must leave that uid alone.
    let uid = PROXY_UID.to_string();
    init(&a, &["--proxy-uid", &uid]).await;
    init(&b, &["--proxy-uid", &uid]).await;

    let proxy_a = proxy(&a, format!("{}:{grpc_port}", NODE_TO_A.0).parse().unwrap()).await;
    let proxy_b = proxy(&b, format!("{}:{grpc_port}", NODE_TO_B.0).parse().unwrap()).await;

    let url = format!("http://{CLUSTER_IP}:80/");
    eventually(
        "pod B's app answering the service's cluster IP in pod A",
        || async {
            let answer = a.curl(&url).await.ok()?;
            (answer.status == StatusCode::OK).then_some(())
        },
    )
    .await;
    const REQUESTS: usize = 5;
    for i in 0..REQUESTS {
        let answer = a.curl(&url).await.unwrap_or_else(|e| {
            panic!(
                "request {i}: {e}\nproxy A log:\n{}\nproxy B log:\n{}",
                proxy_a.process.log(),
                proxy_b.process.log()
            )
        });
        assert_eq!(answer.status, StatusCode::OK, "request {i}: {answer:?}");
        assert_eq!(
            answer.text(),
            "web-b\n",
            "request {i} answered by pod B's app"
        );
    }

    // Proxy A carried them out, by service...
    let m = a.metrics(&proxy_a).await;
    let outbound = m.sum(
        "request_total",
        &[("direction", "outbound"), ("dst_service", "web")],
    );
    assert!(
        outbound >= REQUESTS as f64,
        "proxy A counted {outbound} outbound requests to web; metrics:\n{}",
        m.text
    );
    // ...and proxy B took them in (the app's port on 127.0.0.1 only gets
    // there through it; curl's connections are all in pod A).
    let m = b.metrics(&proxy_b).await;
    let connections = m.sum(
        "tcp_open_total",
        &[("direction", "inbound"), ("peer", "src")],
    );
    assert!(
        connections >= 1.0,
        "proxy B accepted no inbound connection; metrics:\n{}\nproxy B log:\n{}",
        m.text,
        proxy_b.process.log()
    );
    let inbound = m.sum("request_total", &[("direction", "inbound")]);
    assert!(
        inbound >= REQUESTS as f64,
        "proxy B counted {inbound} inbound requests ({connections} inbound connections); \
         metrics:\n{}",
        m.text
    );
}

/// The jumps and chain rules in a saved nat table that are Ballast's.
fn ballast_lines(table: &str) -> Vec<&str> {
    table.lines().filter(|l| l.contains("BALLAST_")).collect()
}

#[tokio::test]
async fn a_second_run_leaves_exactly_the_same_rules() {
    let ns = match NetNs::empty() {
        Ok(ns) => ns,
        Err(why) => return cannot_run("ballast init idempotence", &why),
    };
    let before = ns.nat_table().unwrap();
    assert!(ballast_lines(&before).is_empty(), "{before}");

    init(&ns, &[]).await;
    let first = ns.nat_table().unwrap();
    init(&ns, &[]).await;
    let second = ns.nat_table().unwrap();
    assert_eq!(first, second, "a second run changed the nat table");

    let ours = ballast_lines(&second);
    let count = |needle: &str| ours.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("-A PREROUTING"), 1, "{second}");
    assert_eq!(count("-A OUTPUT"), 1, "{second}");
    assert_eq!(count("REDIRECT --to-ports 4143"), 1, "{second}");
    assert_eq!(count("REDIRECT --to-ports 4140"), 1, "{second}");
    assert_eq!(count("--uid-owner 2102"), 1, "{second}");
    let mut sorted = ours.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ours.len(), "duplicate rules:\n{second}");

    // Other flags replace the rules rather than add to them.
    init(&ns, &["--outgoing-proxy-port", "5140", "--proxy-uid", "7"]).await;
    let third = ns.nat_table().unwrap();
    let ours = ballast_lines(&third);
    assert!(
        ours.iter().any(|l| l.contains("REDIRECT --to-ports 5140"))
            && !ours.iter().any(|l| l.contains("--to-ports 4140"))
            && !ours.iter().any(|l| l.contains("--uid-owner 2102")),
        "{third}"
    );
    assert_eq!(ours.len(), ballast_lines(&second).len(), "{third}");
}

#[tokio::test]
async fn dry_run_prints_valid_rules_and_changes_nothing() {
    // Printing needs neither root nor iptables.
    let out = ballast(None, &[("PATH", "/nonexistent")], &["init", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    for needle in [
        "*nat",
        ":BALLAST_INBOUND - [0:0]",
        "-j REDIRECT --to-ports 4143",
        "-A BALLAST_OUTBOUND -m owner --uid-owner 2102 -m comment",
        "-j REDIRECT --to-ports 4140",
        "-A OUTPUT -p tcp -j BALLAST_OUTBOUND",
        "COMMIT",
    ] {
        assert!(printed.contains(needle), "no {needle:?} in:\n{printed}");
    }

    let ns = match NetNs::empty() {
        Ok(ns) => ns,
        Err(why) => return cannot_run("ballast init --dry-run in a namespace", &why),
    };
    let before = ns.nat_table().unwrap();
    let out = ballast(Some(&ns), &[], &["init", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        printed,
        "the same rules whatever the place"
    );
    assert_eq!(
        ns.nat_table().unwrap(),
        before,
        "--dry-run changed the table"
    );

    // What it prints is what iptables-restore takes (parsed, not committed).
    let mut check = ns.command("iptables-restore");
    check
        .args(["--noflush", "--test"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = check.spawn().unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(printed.as_bytes()).await.unwrap();
    drop(stdin);
    let checked = child.wait_with_output().await.unwrap();
    assert!(
        checked.status.success(),
        "iptables-restore --test refused the printed rules: {}",
        text(&checked.stderr)
    );
    assert_eq!(ns.nat_table().unwrap(), before);
}

#[tokio::test]
async fn without_the_capability_it_refuses_and_says_why() {
    let ns = match preflight() {
        Ok(()) => Some(NetNs::empty().expect("make a network namespace")),
        // Not root: this process itself lacks the capability.
        Err(_) => None,
    };
    let out = match &ns {
        Some(ns) => {
            let mut cmd = ns.command_as_proxy_user(&ns.bin);
            cmd.arg("init")
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            cmd.output().await.unwrap()
        }
        None => ballast(None, &[], &["init"]).await,
    };
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "init succeeded unprivileged: {stderr}"
    );
    assert!(
        stderr.contains("needs CAP_NET_ADMIN / root"),
        "unclear refusal: {stderr}"
    );
    if let Some(ns) = &ns {
        assert!(ballast_lines(&ns.nat_table().unwrap()).is_empty());
    }
}

#[tokio::test]
async fn without_iptables_it_refuses_and_says_what_to_install() {
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    // As root, inside a namespace of its own, so nothing could touch the host.
    let ns = preflight()
        .ok()
        .map(|()| NetNs::empty().expect("namespace"));
    let out = ballast(ns.as_ref(), &[("PATH", path)], &["init"]).await;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "init succeeded without iptables");
    assert!(
        stderr.contains("iptables not found on PATH") && stderr.contains("install"),
        "unclear refusal: {stderr}"
    );
}

#[tokio::test]
async fn in_a_namespace_that_looks_like_a_host_it_refuses_and_changes_nothing() {
    use ballast_init::{HostCheck, NetnsFacts};
    // The decision is table-tested in ballast-init; here the refusal as a
    // process, where this test's own namespace looks like a host's (a
    // machine or VM with hardware devices). Elsewhere (a container whose
    // namespace looks like a pod's) running it would change the tables.
    let evidence = match HostCheck::judge(&NetnsFacts::gather()) {
        HostCheck::LooksLikeHost { evidence } => evidence,
        HostCheck::Proceed => {
            eprintln!(
                "SKIPPED: this namespace does not look like a host's (or cannot be changed); \
                 `ballast init` here would not be refused"
            );
            return;
        }
    };
    let nat = || {
        std::process::Command::new("iptables-save")
            .args(["-t", "nat"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| text(&o.stdout))
    };
    let before = nat();
    let out = ballast(None, &[], &["init"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("looks like a host's") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&evidence[0]),
        "names {:?}: {stderr}",
        evidence[0]
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    if let Some(before) = before {
        let after = nat().expect("iptables-save works again");
        assert_eq!(
            ballast_lines(&after),
            ballast_lines(&before),
            "the nat table changed"
        );
    }

    // --dry-run changes nothing, so it is never refused.
    let out = ballast(None, &[("PATH", "/nonexistent")], &["init", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}
