//! Mutual TLS between two pods in transparent mode: network namespaces for
//! a node (destination and identity controllers) and two pods joined by a
//! veth pair, `ballast init` in each, each pod's proxy with its own
//! identity. An unmodified client (curl) in pod A reaches a service in pod
//! B; on pod B's wire (tcpdump on its `eth0`) the bytes are TLS and the
//! request is nowhere in clear; proxy A names B's identity as `server_id`
//! and proxy B names A's as `client_id`.
//!
//! Root-only, like `init_two_pods.rs`; also needs `tcpdump`.

use ballast_testsupport as support;

use http::StatusCode;
use std::{os::unix::fs::PermissionsExt, path::Path, process::Stdio};
use support::{
    identity::{identity, token_secret, Pki},
    proxy::{
        netns::{cannot_run, two_pods, NetNs, CLUSTER_IP, NODE_TO_A, NODE_TO_B, POD_B, PROXY_UID},
        Logged, Proxy, NS,
    },
    write_atomic,
};
use tokio::io::{AsyncBufReadExt, BufReader};

fn readable_by_all(path: &Path) {
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The pod's proxy with identity `sa` from the identity controller at `ca`.
async fn proxy(
    ns: &NetNs,
    destination: &str,
    ca: &str,
    sa: &str,
    anchors: &Path,
    token: &Path,
) -> Proxy {
    let (anchors, token) = (anchors.display().to_string(), token.display().to_string());
    let flags = [
        "--pod-service-account",
        sa,
        "--identity-addr",
        ca,
        "--identity-trust-anchors",
        &anchors,
        "--identity-token-file",
        &token,
    ];
    ns.start_proxy(destination, &flags).await
}

#[tokio::test]
async fn pods_talk_mutual_tls_on_the_wire() {
    let has_tcpdump = std::process::Command::new("sh")
        .args(["-c", "command -v tcpdump"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let (node, a, b) = match two_pods() {
        Ok(_) if !has_tcpdump => return cannot_run("mTLS two-pod", "`tcpdump` is not installed"),
        Ok(namespaces) => namespaces,
        Err(why) => return cannot_run("mTLS two-pod", &why),
    };

    // Files the unprivileged proxies read: the anchors and their tokens.
    let tmp = tempfile::tempdir().unwrap();
    readable_by_all(tmp.path());
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    readable_by_all(&pki.dir);
    readable_by_all(&pki.anchors());
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    write_atomic(
        &tokens.join("secrets.yaml"),
        &[
            token_secret(NS, "web-a", "tok-a"),
            token_secret(NS, "web-b", "tok-b"),
            token_secret("linkerd", "linkerd-destination", "tok-dst"),
        ]
        .join("---\n"),
    );
    for (sa, tok) in [("web-a", "tok-a"), ("web-b", "tok-b"), ("dst", "tok-dst")] {
        let path = tmp.path().join(format!("{sa}.token"));
        std::fs::write(&path, tok).unwrap();
        readable_by_all(&path);
    }

    // Pod B's app, and the cluster: web -> pod B, meshed, service account web-b.
    let mut app = {
        let mut cmd = b.command(&b.bin);
        cmd.args(["backend", "--name", "web-b", "--addr", "0.0.0.0:0"]);
        Logged::spawn(cmd)
    };
    let app_port = app.listening("backend web-b listening on ", 1).await[0].port();
    let cluster = tempfile::tempdir().unwrap();
    write_atomic(
        &cluster.path().join("web.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-b\n  namespace: {NS}\n  labels: {{app: web, linkerd.io/control-plane-ns: linkerd}}\n\
             spec:\n  serviceAccountName: web-b\n  containers: [{{name: main, ports: [{{name: http, containerPort: {app_port}}}]}}]\n\
             status: {{phase: Running, podIP: {POD_B}, hostIP: 127.99.0.1}}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {NS}}}\n\
             spec:\n  clusterIP: {CLUSTER_IP}\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n"
        ),
    );

    // The node: both controllers; the destination controller serves TLS as
    // its own identity, from the identity controller (on the node's
    // loopback: plaintext), and the proxies dial it so.
    let mut ca = {
        let mut cmd = node.command(&node.bin);
        cmd.arg("identity")
            .args(["--addr", "0.0.0.0:0", "--admin-addr", "127.0.0.1:0"])
            .arg("--issuer-dir")
            .arg(pki.issuer_dir())
            .arg("--trust-anchors")
            .arg(pki.anchors())
            .arg("--manifests")
            .arg(&tokens);
        Logged::spawn(cmd)
    };
    let ca_port = ca.listening("identity gRPC listening on ", 1).await[0].port();
    let mut controller = {
        let mut cmd = node.command(&node.bin);
        cmd.arg("destination")
            .arg("--manifests")
            .arg(cluster.path())
            .args(["--addr", "0.0.0.0:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--policy-addr", "127.0.0.1:0"])
            .arg("--identity-trust-anchors")
            .arg(pki.anchors())
            .args(["--identity-addr", &format!("127.0.0.1:{ca_port}")])
            .arg("--identity-token-file")
            .arg(tmp.path().join("dst.token"));
        Logged::spawn(cmd)
    };
    let grpc_port = controller
        .listening("destination gRPC listening on ", 1)
        .await[0]
        .port();

    let uid = PROXY_UID.to_string();
    for ns in [&a, &b] {
        let out = ns
            .command(&ns.bin)
            .args(["init", "--proxy-uid", &uid])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "ballast init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let anchors = pki.anchors();
    let proxy_a = proxy(
        &a,
        &format!("{}:{grpc_port}", NODE_TO_A.0),
        &format!("{}:{ca_port}", NODE_TO_A.0),
        "web-a",
        &anchors,
        &tmp.path().join("web-a.token"),
    )
    .await;
    let proxy_b = proxy(
        &b,
        &format!("{}:{grpc_port}", NODE_TO_B.0),
        &format!("{}:{ca_port}", NODE_TO_B.0),
        "web-b",
        &anchors,
        &tmp.path().join("web-b.token"),
    )
    .await;

    // Pod B's wire, from before the first request.
    let capture = tmp.path().join("wire.pcap");
    let mut tcpdump = b
        .command("tcpdump")
        .args([
            "-i",
            "eth0",
            "-U",
            "--immediate-mode",
            "-n",
            "-s",
            "0",
            "-w",
        ])
        .arg(&capture)
        .arg("tcp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run tcpdump");
    let mut lines = BufReader::new(tcpdump.stderr.take().unwrap()).lines();
    tokio::time::timeout(support::DEADLINE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("listening on") {
                return;
            }
        }
    })
    .await
    .expect("tcpdump listening");

    let needle = "secret-path-4c1d";
    let url = format!("http://{CLUSTER_IP}:80/{needle}");
    let started = std::time::Instant::now();
    loop {
        let last = match a.curl(&url).await {
            Ok(answer) if answer.status == StatusCode::OK => break,
            other => format!("{other:?}"),
        };
        assert!(
            started.elapsed() < support::DEADLINE,
            "pod B's app not reached through both proxies; last: {last}\nA:\n{}\nB:\n{}\ndst:\n{}",
            proxy_a.process.log(),
            proxy_b.process.log(),
            controller.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for i in 0..3 {
        let answer = a.curl(&url).await.unwrap_or_else(|e| {
            panic!(
                "request {i}: {e}\nA:\n{}\nB:\n{}",
                proxy_a.process.log(),
                proxy_b.process.log()
            )
        });
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.text(), "web-b\n");
    }
    // tcpdump writes what it has and exits on SIGINT.
    if let Some(pid) = tcpdump.id() {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
    }
    let _ = tokio::time::timeout(support::DEADLINE, tcpdump.wait()).await;

    let wire = std::fs::read(&capture).unwrap();
    assert!(wire.len() > 1000, "tcpdump caught {} bytes", wire.len());
    let has = |n: &[u8]| wire.windows(n.len()).any(|w| w == n);
    assert!(
        has(&[0x17, 0x03, 0x03]),
        "no TLS application data on pod B's wire"
    );
    assert!(
        !has(needle.as_bytes()),
        "the request path crossed the wire in clear"
    );
    assert!(!has(b"web-b\n"), "the response crossed the wire in clear");
    assert!(!has(b"HTTP/1.1"), "HTTP crossed the wire in clear");

    let (web_a, web_b) = (identity("web-a", NS), identity("web-b", NS));
    let m = a.metrics(&proxy_a).await;
    assert!(
        m.sum(
            "tcp_open_total",
            &[
                ("peer", "dst"),
                ("tls", "true"),
                ("server_id", web_b.as_str())
            ]
        ) >= 1.0,
        "{}",
        m.text
    );
    let m = b.metrics(&proxy_b).await;
    assert!(
        m.sum(
            "tcp_open_total",
            &[
                ("direction", "inbound"),
                ("peer", "src"),
                ("tls", "true"),
                ("client_id", web_a.as_str())
            ]
        ) >= 1.0,
        "{}",
        m.text
    );
    drop((proxy_a, proxy_b, controller, ca, app));
}
