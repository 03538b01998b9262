//! Inbound authorization end to end: the server-side proxy (identity `api`,
//! `--default-inbound-policy deny`) follows a fake `InboundServerPolicies`
//! controller on its control connection; two client proxies (`web` and
//! `db`) reach it over mutual TLS through a relay whose connections come
//! from 127.0.0.2, so that Linkerd's implicit localhost authorization does
//! not admit them. One client is allowed and the other gets 403 (HTTP) or a
//! closed connection (opaque TCP), and both follow live policy changes.

use ballast_testsupport as support;

use futures_util::Stream;
use http::StatusCode;
use hyper::{body::Incoming, service::service_fn, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use linkerd2_proxy_api::{
    inbound::{
        self as api,
        inbound_server_policies_server::{InboundServerPolicies, InboundServerPoliciesServer},
        PortSpec,
    },
    meta, net,
};
use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};
use support::{
    eventually,
    identity::{identity, token_secret, IdentityCa, Pki},
    proxy::{authority, Http1, Proxy, NS},
    write_atomic, Controller,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::watch,
    task::JoinHandle,
};
use tonic::{transport::server::TcpIncoming, Status};

/// A policy controller answering every `WatchPort` with the latest
/// `Server` the test set, and noting what it was asked.
#[derive(Clone)]
struct Policies {
    server: watch::Sender<Option<api::Server>>,
    asked: Arc<Mutex<Vec<PortSpec>>>,
}

type Servers = Pin<Box<dyn Stream<Item = Result<api::Server, Status>> + Send>>;

#[tonic::async_trait]
impl InboundServerPolicies for Policies {
    async fn get_port(
        &self,
        req: tonic::Request<PortSpec>,
    ) -> Result<tonic::Response<api::Server>, Status> {
        self.asked.lock().unwrap().push(req.into_inner());
        self.server
            .borrow()
            .clone()
            .map(tonic::Response::new)
            .ok_or_else(|| Status::unavailable("no policy yet"))
    }

    type WatchPortStream = Servers;

    async fn watch_port(
        &self,
        req: tonic::Request<PortSpec>,
    ) -> Result<tonic::Response<Servers>, Status> {
        self.asked.lock().unwrap().push(req.into_inner());
        let rx = self.server.subscribe();
        let updates = futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            loop {
                let latest = rx.borrow_and_update().clone();
                if let Some(s) = latest {
                    return Some((Ok(s), (rx, false)));
                }
                rx.changed().await.ok()?;
            }
        });
        Ok(tonic::Response::new(Box::pin(updates)))
    }
}

struct FakePolicyController {
    addr: SocketAddr,
    policies: Policies,
    task: JoinHandle<()>,
}

impl FakePolicyController {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let policies = Policies {
            server: watch::Sender::new(None),
            asked: Arc::default(),
        };
        let service = InboundServerPoliciesServer::new(policies.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        Self {
            addr,
            policies,
            task,
        }
    }

    fn set(&self, server: api::Server) {
        self.policies.server.send_replace(Some(server));
    }

    /// No longer listens (streams already open may linger).
    fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for FakePolicyController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server policy admitting mesh clients with exactly these identities
/// from anywhere, as Linkerd's policy controller writes one.
fn allowing(ids: &[&str], opaque: bool) -> api::Server {
    use api::proxy_protocol::Kind;
    let protocol = if opaque {
        Kind::Opaque(Default::default())
    } else {
        Kind::Detect(api::proxy_protocol::Detect {
            timeout: Duration::from_secs(10).try_into().ok(),
            ..Default::default()
        })
    };
    let everywhere = api::Network {
        net: Some(net::IpNetwork {
            ip: Some(net::IpAddress::from(std::net::IpAddr::from(
                Ipv4Addr::UNSPECIFIED,
            ))),
            prefix_len: 0,
        }),
        except: vec![],
    };
    api::Server {
        protocol: Some(api::ProxyProtocol {
            kind: Some(protocol),
        }),
        authorizations: vec![api::Authz {
            networks: vec![everywhere],
            authentication: Some(api::Authn {
                permit: Some(api::authn::Permit::MeshTls(api::authn::PermitMeshTls {
                    clients: Some(api::authn::permit_mesh_tls::Clients::Identities(
                        api::authn::permit_mesh_tls::PermitClientIdentities {
                            identities: ids
                                .iter()
                                .map(|i| api::Identity {
                                    name: i.to_string(),
                                })
                                .collect(),
                            suffixes: vec![],
                        },
                    )),
                })),
            }),
            labels: HashMap::new(),
            metadata: Some(meta::Metadata {
                kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                    group: "policy.linkerd.io".into(),
                    kind: "AuthorizationPolicy".into(),
                    name: "chosen-clients".into(),
                    ..Default::default()
                })),
            }),
        }],
        labels: [
            ("group", "policy.linkerd.io"),
            ("kind", "server"),
            ("name", "api-port"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        server_ips: vec![],
    }
}

/// A workload that answers with the `l5d-client-id` it was given.
async fn whoami() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let id = req
                        .headers()
                        .get("l5d-client-id")
                        .map(|v| v.to_str().unwrap_or("?").to_string())
                        .unwrap_or_else(|| "none".into());
                    Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                        hyper::body::Bytes::from(format!("client={id}")),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A relay to `to` whose connections come from 127.0.0.2: not localhost to
/// the proxy behind it.
async fn relay(to: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let socket = TcpSocket::new_v4().unwrap();
                socket
                    .bind(SocketAddr::new(Ipv4Addr::new(127, 0, 0, 2).into(), 0))
                    .unwrap();
                let Ok(mut server) = socket.connect(to).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    addr
}

fn api_pod(dir: &Path, addr: SocketAddr) {
    write_atomic(
        &dir.join("api.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: api-1\n  namespace: {NS}\n  labels: {{app: api, linkerd.io/control-plane-ns: linkerd}}\n\
             spec:\n  serviceAccountName: api\n  containers: [{{name: main, ports: [{{name: http, containerPort: {port}}}]}}]\n\
             status: {{phase: Running, podIP: {ip}, hostIP: 127.99.0.1}}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: {NS}}}\n\
             spec:\n  clusterIP: 127.0.0.100\n  selector: {{app: api}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n",
            port = addr.port(),
            ip = addr.ip(),
        ),
    );
}

/// Where the server proxy's inbound policy comes from.
enum PolicyFrom {
    /// The fake controller, starting with this policy.
    Fake(Box<api::Server>),
    /// `ballast destination` itself, from manifests: `--default-inbound-policy
    /// deny`, a Server on the api pod's port and an AuthorizationPolicy
    /// admitting the identities of one MeshTLSAuthentication (`clients`).
    Controller,
}

struct World {
    _tmp: tempfile::TempDir,
    _ca: IdentityCa,
    controller: Option<Controller>,
    controller_addr: SocketAddr,
    /// Each proxy's flags, to start it again.
    server_args: Vec<String>,
    web_args: Vec<String>,
    db_args: Vec<String>,
    /// Where each proxy's snapshot is kept (`Snapshots::Kept`).
    snapshots: std::path::PathBuf,
    policy: FakePolicyController,
    server: Proxy,
    web: Proxy,
    db: Proxy,
    app: SocketAddr,
    /// Each client's `--outbound-tcp` listener to the api service.
    web_tcp: SocketAddr,
    db_tcp: SocketAddr,
}

/// Whether the proxies keep snapshots. With them, the server's default
/// policy admits everyone: only its snapshot keeps db out once it restarts
/// without a controller.
#[derive(Clone, Copy, PartialEq)]
enum Snapshots {
    None,
    Kept,
}

async fn world(from: PolicyFrom) -> World {
    world_with(from, Snapshots::None).await
}

async fn world_with(from: PolicyFrom, snapshots: Snapshots) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let snapshot_dir = tmp.path().join("snapshots");
    std::fs::create_dir_all(&snapshot_dir).unwrap();
    let snapshot_flags = |name: &str| -> Vec<String> {
        if snapshots == Snapshots::None {
            return Vec::new();
        }
        vec![
            "--snapshot-path".into(),
            snapshot_dir
                .join(format!("{name}.snapshot"))
                .display()
                .to_string(),
            "--snapshot-interval".into(),
            "200ms".into(),
        ]
    };
    let pki = Pki::generate(&tmp.path().join("pki")).await;
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    let sas = ["web", "api", "db"];
    write_atomic(
        &tokens.join("secrets.yaml"),
        &sas.iter()
            .map(|sa| token_secret(NS, sa, &format!("tok-{sa}")))
            .collect::<Vec<_>>()
            .join("---\n"),
    );
    for sa in sas {
        std::fs::write(tmp.path().join(format!("{sa}.token")), format!("tok-{sa}")).unwrap();
    }
    let ca = IdentityCa::start(&pki, &tokens, &[]).await;
    let flags = |sa: &str| -> Vec<String> {
        [
            "--identity-trust-anchors",
            &pki.anchors().display().to_string(),
            "--identity-addr",
            &ca.grpc.to_string(),
            "--identity-token-file",
            &tmp.path().join(format!("{sa}.token")).display().to_string(),
            "--pod-namespace",
            NS,
            "--pod-service-account",
            sa,
            "--control-backoff-max",
            "500ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    let app = whoami().await;
    let policy = FakePolicyController::start().await;
    let cluster = tmp.path().join("cluster");
    std::fs::create_dir_all(&cluster).unwrap();
    let (policy_addr, controller) = match from {
        PolicyFrom::Fake(initial) => {
            policy.set(*initial);
            (policy.addr, None)
        }
        PolicyFrom::Controller => {
            write_atomic(
                &cluster.join("policy.yaml"),
                &format!(
                    "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\n\
                     metadata: {{name: api-port, namespace: {NS}}}\n\
                     spec: {{podSelector: {{matchLabels: {{app: api}}}}, port: {port}}}\n---\n\
                     apiVersion: policy.linkerd.io/v1alpha1\nkind: AuthorizationPolicy\n\
                     metadata: {{name: chosen-clients, namespace: {NS}}}\n\
                     spec:\n  targetRef: {{group: policy.linkerd.io, kind: Server, name: api-port}}\n\
                     \x20 requiredAuthenticationRefs: [{{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: clients}}]\n",
                    port = app.port()
                ),
            );
            clients_file(&cluster, identity("web", NS).as_str());
            let c = Controller::start(&cluster, &["--default-inbound-policy", "deny"]).await;
            (c.grpc, Some(c))
        }
    };
    let mut server_flags = flags("api");
    let port = app.port().to_string();
    server_flags.extend(snapshot_flags("api"));
    server_flags.extend(
        [
            "--inbound-forward-port",
            &port,
            "--pod-name",
            "api-1",
            "--default-inbound-policy",
            match snapshots {
                Snapshots::None => "deny",
                Snapshots::Kept => "all-unauthenticated",
            },
            // A busy machine may be slow to answer the first watch.
            "--profile-timeout",
            "5s",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = server_flags.iter().map(String::as_str).collect();
    let server = Proxy::start(policy_addr, &args).await;
    let front = relay(server.inbound).await;

    api_pod(&cluster, front);
    let controller = match controller {
        Some(c) => c,
        None => Controller::start(&cluster, &[]).await,
    };
    let client_args = |sa: &'static str| {
        let mut f = flags(sa);
        f.extend(snapshot_flags(sa));
        f.extend([
            "--outbound-tcp".to_string(),
            format!("127.0.0.1:0={}", authority("api", 80)),
        ]);
        f
    };
    let (web_args, db_args) = (client_args("web"), client_args("db"));
    let web = start_with(controller.grpc, &web_args).await;
    let db = start_with(controller.grpc, &db_args).await;
    World {
        web_tcp: web.tcp_routes[0],
        db_tcp: db.tcp_routes[0],
        _tmp: tmp,
        _ca: ca,
        controller_addr: controller.grpc,
        controller: Some(controller),
        server_args: server_flags,
        web_args,
        db_args,
        snapshots: snapshot_dir,
        policy,
        server,
        web,
        db,
        app,
    }
}

async fn start_with(destination: SocketAddr, args: &[String]) -> Proxy {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proxy::start(destination, &args).await
}

/// The MeshTLSAuthentication the controller-backed world's policy requires.
fn clients_file(cluster: &Path, id: &str) {
    write_atomic(
        &cluster.join("clients.yaml"),
        &format!(
            "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\n\
             metadata: {{name: clients, namespace: {NS}}}\nspec: {{identities: [{id}]}}\n"
        ),
    );
}

async fn get(proxy: &Proxy) -> Option<support::proxy::Answer> {
    let mut c = Http1::connect(proxy.outbound).await.ok()?;
    c.get(&authority("api", 80), "/").await.ok()
}

/// The status a client gets, once the mesh has settled on `want`.
async fn settles(proxy: &Proxy, what: &str, want: StatusCode) -> support::proxy::Answer {
    eventually(what, || async {
        get(proxy).await.filter(|a| a.status == want)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_authorized_by_client_identity_and_follow_policy_changes() {
    let web_id = identity("web", NS);
    let db_id = identity("db", NS);
    let w = world(PolicyFrom::Fake(Box::new(allowing(
        &[web_id.as_str()],
        false,
    ))))
    .await;

    let ok = settles(&w.web, "web allowed", StatusCode::OK).await;
    assert_eq!(ok.text(), format!("client={web_id}"));
    let denied = settles(&w.db, "db denied", StatusCode::FORBIDDEN).await;
    assert_eq!(
        denied.header("l5d-proxy-error"),
        Some("unauthorized"),
        "{denied:?}"
    );

    // The proxy asked for its own port, naming its pod as Linkerd does.
    let asked = w.policy.policies.asked.lock().unwrap().clone();
    assert!(
        asked.iter().any(|s| s.port == u32::from(w.app.port())
            && s.workload == format!("{{\"ns\":\"{NS}\",\"pod\":\"api-1\"}}")),
        "{asked:?}"
    );

    let m = w.server.metrics().await;
    let srv = [
        ("srv_group", "policy.linkerd.io"),
        ("srv_kind", "server"),
        ("srv_name", "api-port"),
    ];
    let allow: Vec<(&str, &str)> = srv
        .iter()
        .copied()
        .chain([
            ("route_name", "default"),
            ("authz_kind", "AuthorizationPolicy"),
            ("authz_name", "chosen-clients"),
            ("tls", "true"),
            ("client_id", web_id.as_str()),
        ])
        .collect();
    assert!(
        m.sum("inbound_http_authz_allow_total", &allow) >= 1.0,
        "{}",
        m.text
    );
    let deny: Vec<(&str, &str)> = srv
        .iter()
        .copied()
        .chain([("client_id", db_id.as_str())])
        .collect();
    assert!(
        m.sum("inbound_http_authz_deny_total", &deny) >= 1.0,
        "{}",
        m.text
    );
    if let Some(page) = support::openmetrics::check_page(w.server.admin, "proxy").await {
        page.assert_has("inbound_http_authz_allow", "counter");
        page.assert_has("inbound_http_authz_deny", "counter");
    }
    assert_eq!(
        m.sum(
            "inbound_http_authz_allow_total",
            &[("client_id", db_id.as_str())]
        ),
        0.0,
        "{}",
        m.text
    );

    // Live change: now only db. Requests on the clients' existing
    // connections are judged by the new policy.
    w.policy.set(allowing(&[db_id.as_str()], false));
    let ok = settles(&w.db, "db allowed after the change", StatusCode::OK).await;
    assert_eq!(ok.text(), format!("client={db_id}"));
    settles(&w.web, "web denied after the change", StatusCode::FORBIDDEN).await;
}

/// Sends an HTTP/1 request over a raw TCP connection (opaque to the
/// proxies) and reads until the answer names a client; `None` when the
/// connection is closed first.
async fn raw_exchange(conn: &mut TcpStream) -> Option<String> {
    conn.write_all(b"GET / HTTP/1.1\r\nhost: api\r\n\r\n")
        .await
        .ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen).to_string();
        if text.contains("client=") {
            return Some(text);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_connections_are_closed_when_denied_and_when_a_change_denies_them() {
    let web_id = identity("web", NS);
    let db_id = identity("db", NS);
    let w = world(PolicyFrom::Fake(Box::new(allowing(
        &[web_id.as_str()],
        true,
    ))))
    .await;

    let mut kept = eventually("web's opaque connection served", || async {
        let mut c = TcpStream::connect(w.web_tcp).await.ok()?;
        raw_exchange(&mut c).await.map(|_| c)
    })
    .await;
    // db's connections are closed without an answer (once its proxy has
    // resolved the service, the server proxy counts the denial).
    let m = eventually("db's opaque connection denied", || async {
        let mut c = TcpStream::connect(w.db_tcp).await.ok()?;
        let answer = raw_exchange(&mut c).await;
        assert_eq!(answer, None, "db was served");
        let m = w.server.metrics().await;
        (m.sum(
            "inbound_tcp_authz_deny_total",
            &[("srv_name", "api-port"), ("client_id", db_id.as_str())],
        ) >= 1.0)
            .then_some(m)
    })
    .await;
    assert!(
        m.sum(
            "inbound_tcp_authz_allow_total",
            &[
                ("authz_name", "chosen-clients"),
                ("client_id", web_id.as_str())
            ]
        ) >= 1.0,
        "{}",
        m.text
    );

    // The policy changes to db only: web's open connection is closed.
    w.policy.set(allowing(&[db_id.as_str()], true));
    eventually("web's connection terminated", || async {
        let m = w.server.metrics().await;
        (m.sum(
            "inbound_tcp_authz_terminate_total",
            &[("client_id", web_id.as_str())],
        ) >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(
        raw_exchange(&mut kept).await,
        None,
        "the connection was closed"
    );
    eventually("db's opaque connection served", || async {
        let mut c = TcpStream::connect(w.db_tcp).await.ok()?;
        raw_exchange(&mut c).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_denies_by_default_and_admits_the_identity_a_policy_names() {
    let web_id = identity("web", NS);
    let db_id = identity("db", NS);
    let w = world(PolicyFrom::Controller).await;

    let ok = settles(&w.web, "web allowed", StatusCode::OK).await;
    assert_eq!(ok.text(), format!("client={web_id}"));
    let denied = settles(&w.db, "db denied", StatusCode::FORBIDDEN).await;
    assert_eq!(denied.header("l5d-proxy-error"), Some("unauthorized"));
    let m = w.server.metrics().await;
    assert!(
        m.sum(
            "inbound_http_authz_allow_total",
            &[
                ("srv_name", "api-port"),
                ("authz_name", "chosen-clients"),
                ("client_id", web_id.as_str())
            ]
        ) >= 1.0,
        "{}",
        m.text
    );

    // The MeshTLSAuthentication now names db: the answers swap.
    clients_file(&w._tmp.path().join("cluster"), db_id.as_str());
    let ok = settles(&w.db, "db allowed after the change", StatusCode::OK).await;
    assert_eq!(ok.text(), format!("client={db_id}"));
    settles(&w.web, "web denied after the change", StatusCode::FORBIDDEN).await;
}

/// Whether the file at `path` holds `needle` (a snapshot's keys and
/// messages are stored as the controller sent them).
fn holds(path: &Path, needle: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

fn kill(proxy: &Proxy) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &proxy.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "SIGKILL the proxy");
}

/// Issue 25's third part at process level: every proxy killed and started
/// again while no controller answers. The clients still reach api over
/// mutual TLS from their snapshots (without them: no endpoints, 503), and
/// the server still refuses db from its snapshot, although its default
/// policy would admit it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_restarted_while_the_controller_is_down_route_and_deny_from_their_snapshots() {
    let web_id = identity("web", NS);
    let mut w = world_with(
        PolicyFrom::Fake(Box::new(allowing(&[web_id.as_str()], false))),
        Snapshots::Kept,
    )
    .await;
    settles(&w.web, "web allowed", StatusCode::OK).await;
    settles(&w.db, "db denied", StatusCode::FORBIDDEN).await;
    let api = identity("api", NS);
    let target = authority("api", 80);
    let files = |name: &str| w.snapshots.join(format!("{name}.snapshot"));
    // The target's name is in its policy's entry, the identity only in its
    // endpoints'.
    eventually("every proxy's snapshot holds what it uses", || async {
        (holds(&files("web"), &target)
            && holds(&files("web"), api.as_str())
            && holds(&files("db"), &target)
            && holds(&files("db"), api.as_str())
            && holds(&files("api"), "chosen-clients"))
        .then_some(())
    })
    .await;

    // The controllers go away, then every proxy dies without a chance to
    // write anything more.
    w.policy.stop();
    drop(w.controller.take());
    for p in [&w.server, &w.web, &w.db] {
        kill(p);
    }
    let server_args: Vec<&str> = w.server_args.iter().map(String::as_str).collect();
    w.server = Proxy::start_on(w.policy.addr, w.server.inbound, &server_args).await;
    let control = w.controller_addr;
    w.web = start_with(control, &w.web_args).await;
    w.db = start_with(control, &w.db_args).await;

    let ok = settles(&w.web, "web served from its snapshot", StatusCode::OK).await;
    assert_eq!(ok.text(), format!("client={web_id}"), "mutual TLS as api");
    // db is never admitted: until the server's snapshot answers, its
    // connections wait for the policy; then it denies.
    let denied = eventually("db denied from the server's snapshot", || async {
        let answer = get(&w.db).await?;
        assert_ne!(answer.status, StatusCode::OK, "db admitted: {answer:?}");
        (answer.status == StatusCode::FORBIDDEN).then_some(answer)
    })
    .await;
    assert_eq!(denied.header("l5d-proxy-error"), Some("unauthorized"));
    for _ in 0..5 {
        let again = get(&w.db).await.expect("an answer");
        assert_eq!(again.status, StatusCode::FORBIDDEN, "{again:?}");
    }

    let served = |m: &support::metrics::Metrics, kind: &str| {
        m.sum("discovery_snapshot_served_total", &[("kind", kind)])
    };
    let server = w.server.metrics().await;
    assert!(served(&server, "inbound_policy") >= 1.0, "{}", server.text);
    let web = w.web.metrics().await;
    assert!(served(&web, "endpoints") >= 1.0, "{}", web.text);
    assert!(
        web.sum("discovery_snapshot_serving", &[]) >= 1.0,
        "{}",
        web.text
    );
    let ready = support::proxy::get(w.web.admin, "admin", "/ready")
        .await
        .expect("/ready");
    assert_eq!(ready.status, StatusCode::OK);
    assert!(ready.text().contains("snapshot"), "{}", ready.text());
}
