//! The demo: three backends behind one Service, each behind its own proxy,
//! the load client's proxy, the controllers (destination and identity) and
//! viz as real processes, steady traffic through the proxies in mutual TLS,
//! and the destination controller killed while the cluster changes under it.
//!
//! | step | what happens | what must hold |
//! |---|---|---|
//! | 0 | warm-up | traffic reaches all three backends within a deadline |
//! | a | steady traffic | every request succeeded at the asked rate |
//! | b | the controller is killed (SIGKILL) and stays down | every request succeeded |
//! | c | web-c is removed from the manifests; the controller restarts on its old address | it restarted; every request succeeded |
//! | d1 | the proxy hears of the removal | web-c gets no more traffic within the deadline; every request succeeded |
//! | d2 | converged | web-c got nothing new; every answer came from web-a or web-b; every request succeeded |
//! | e | the whole run, from the proxies' own counters | every connection from load to web was mutual TLS with web's identity; web's proxies accepted only mutual TLS, load's among them |
//!
//! No step asks every backend to be served within its own few seconds: the
//! balancer rightly sends a light load to whichever endpoint answers fastest,
//! and one slow answer keeps an endpoint out of favour for seconds (peak-EWMA
//! decays over 10 s). Fairness is tested where the load makes it a property.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::backend::Backend;
use crate::display::{Progress, View, ViewMode};
use crate::identity::{self, Pki, ServiceAccount, CONTROL_NS, TRUST_DOMAIN};
use crate::load::{LoadClient, LoadConfig, Snapshot};
use crate::manifests::{self, LoadPod, Manifests, PodBackend};
use crate::mtls::TlsTally;
use crate::process::{self, Process};

/// How often the demo's viz scrapes the proxy: often enough for a live
/// dashboard over a demo of a minute.
const VIZ_SCRAPE_INTERVAL: &str = "2s";
/// Under the interval, as viz requires; the demo proxy answers at once.
const VIZ_SCRAPE_TIMEOUT: &str = "1s";
/// How long a process may take to start listening and be ready.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long the first requests may take to reach all three backends.
const WARM_UP_DEADLINE: Duration = Duration::from_secs(20);
/// A removed backend that has had no request for this long is taken as drained.
const QUIET_FOR: Duration = Duration::from_secs(1);
/// Steps of at least a second must carry at least this share of the
/// configured rate, so a stalled client cannot pass for a healthy one.
const MIN_VOLUME: f64 = 0.5;
/// How often the live view is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(200);
/// Seconds of the recent window shown.
const RECENT_SECS: u64 = 5;
/// Log lines of each process put in the report of a failed demo.
const REPORT_LOG_LINES: usize = 25;
/// Largest `/metrics` page read from a proxy for the TLS check.
const MAX_METRICS_BYTES: usize = 8 << 20;
/// How long reading one proxy's `/metrics` may take.
const METRICS_DEADLINE: Duration = Duration::from_secs(5);
/// Where the backends listen: their proxies forward inbound connections to
/// 127.0.0.1 at the backend's port, as a pod's proxy does.
const BACKEND_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The backend that is removed.
const REMOVED: &str = "web-c";
/// Each web pod's IP: where its proxy listens (inbound, admin, tap).
const PODS: [(&str, Ipv4Addr); 3] = [
    ("web-a", Ipv4Addr::new(127, 0, 0, 2)),
    ("web-b", Ipv4Addr::new(127, 0, 0, 3)),
    (REMOVED, Ipv4Addr::new(127, 0, 0, 4)),
];

/// How the demo runs.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// The `ballast` executable that runs the controller and the proxy.
    pub ballast: PathBuf,
    /// Requests per second through the proxy.
    pub rps: u32,
    /// Keep-alive connections the load is spread over.
    pub connections: usize,
    /// Length of the steady step (a) and of the converged step (d2).
    pub steady_for: Duration,
    /// How long the controller stays down (b).
    pub down_for: Duration,
    /// Deadline for the removed backend to stop getting traffic after the
    /// controller is back (d1).
    pub converge_within: Duration,
    pub view: ViewMode,
}

impl DemoConfig {
    /// The defaults: 200 rps over 4 connections, 5 s steps, 10 s down, 20 s
    /// to converge.
    pub fn new(ballast: PathBuf) -> Self {
        Self {
            ballast,
            rps: 200,
            connections: 4,
            steady_for: Duration::from_secs(5),
            down_for: Duration::from_secs(10),
            converge_within: Duration::from_secs(20),
            view: ViewMode::Auto,
        }
    }
}

/// One thing a step checked.
#[derive(Clone, Debug)]
pub struct Check {
    pub text: String,
    pub passed: bool,
}

/// What one step saw and whether it held.
#[derive(Clone, Debug)]
pub struct StepReport {
    pub label: String,
    pub title: String,
    pub duration: Duration,
    /// The load client's counts during the step, by `x-backend`.
    pub traffic: Snapshot,
    pub checks: Vec<Check>,
}

impl StepReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

/// How the demo went.
#[derive(Clone, Debug)]
pub struct DemoOutcome {
    pub steps: Vec<StepReport>,
    /// Every step held.
    pub passed: bool,
    /// From the controller's return to web-c's last request, if it drained.
    pub convergence: Option<Duration>,
    /// The backends, in the order they are shown.
    pub backends: Vec<String>,
    /// The last log lines of each process (shown when the demo failed).
    pub logs: Vec<(String, Vec<String>)>,
    /// Where `ballast viz` served the dashboard while the demo ran.
    pub dashboard: Option<SocketAddr>,
    /// The traffic's mutual TLS, when step e found every connection so.
    pub mtls: Option<MutualTls>,
}

/// Load's traffic to web was mutual TLS: who spoke to whom, how often.
#[derive(Clone, Debug)]
pub struct MutualTls {
    /// The load client's proxy's identity.
    pub client: String,
    /// The web pods' proxies' identity.
    pub server: String,
    /// Connections the load client's proxy opened to web, all mutual TLS.
    pub connections: u64,
}

/// Where the proxies and viz get their certificates.
struct Mesh {
    anchors: PathBuf,
    identity: SocketAddr,
}

/// Runs the demo, showing it on stdout, and returns how it went. An error
/// means it could not be set up (a process did not start); a step that did
/// not hold is reported in the outcome.
pub async fn run(config: DemoConfig) -> anyhow::Result<DemoOutcome> {
    anyhow::ensure!(
        (1..=crate::load::MAX_RPS).contains(&config.rps),
        "--rps must be 1 to {}",
        crate::load::MAX_RPS
    );
    let mut view = View::new(config.view);
    let dir = tempfile::Builder::new()
        .prefix("ballast-demo-")
        .tempdir()
        .context("cannot create a directory for the demo's manifests")?;
    // The cluster the controllers and viz read, apart from the key material
    // and token files, which only the processes they belong to read.
    let cluster_dir = dir.path().join("cluster");
    let identity_dir = dir.path().join("identity");
    for d in [&cluster_dir, &identity_dir] {
        std::fs::create_dir(d).with_context(|| format!("cannot create {}", d.display()))?;
    }

    let mut backends = Vec::new();
    for (name, _) in PODS {
        let backend = Backend::start(name, SocketAddr::new(IpAddr::V4(BACKEND_IP), 0))
            .await
            .with_context(|| format!("cannot start backend {name} on {BACKEND_IP}"))?;
        backends.push(backend);
    }

    let pki = Pki::generate(&config.ballast, &identity_dir.join("pki")).await?;
    let load_sa = ServiceAccount::create(
        &identity_dir,
        manifests::NAMESPACE,
        manifests::LOAD_DEPLOYMENT,
    )?;
    let web_sa = ServiceAccount::create(
        &identity_dir,
        manifests::NAMESPACE,
        manifests::WEB_SERVICE_ACCOUNT,
    )?;
    let viz_sa = ServiceAccount::create(
        &identity_dir,
        identity::VIZ_NAMESPACE,
        identity::VIZ_SERVICE_ACCOUNT,
    )?;
    let manifests = Manifests::write(&cluster_dir, &[&load_sa, &web_sa, &viz_sa])?;
    let (identity_ca, identity_addr) = start_identity(&config, &pki, &manifests).await?;
    view.say(&format!(
        "identity controller listening on {identity_addr}; trust anchor and issuer generated in {}",
        pki.dir().display()
    ));
    let mesh = Mesh {
        anchors: pki.anchors(),
        identity: identity_addr,
    };

    let (controller, grpc) =
        start_controller(&config, &manifests, "127.0.0.1:0".parse()?, "controller").await?;
    view.say(&format!(
        "controller listening on {grpc}, reading {}",
        manifests.dir().display()
    ));

    // Each web pod is its backend behind its own proxy, at the pod's IP.
    let mut web_proxies = Vec::new();
    let mut pods = Vec::new();
    for (backend, (name, ip)) in backends.iter().zip(PODS) {
        let proxy =
            start_web_proxy(&config, &mesh, &web_sa, grpc, name, ip, backend.addr()).await?;
        pods.push(PodBackend {
            name: name.to_string(),
            addr: proxy.inbound,
            admin_port: proxy.admin.port(),
            tap_port: proxy.tap.port(),
        });
        web_proxies.push(proxy);
    }
    manifests.set_pods(&pods)?;
    for (pod, backend) in pods.iter().zip(&backends) {
        view.say(&format!(
            "{}: backend on {}, behind its proxy on {} as {}",
            pod.name,
            backend.addr(),
            pod.addr,
            web_sa.identity()
        ));
    }

    let proxy = start_proxy(&config, &mesh, &load_sa, grpc).await?;
    let outbound = proxy.outbound;
    let load_admin = proxy.admin;
    // The proxy is the meshed `load` pod's: viz scrapes and taps it there.
    manifests.set_load(&LoadPod {
        admin: proxy.admin,
        tap: proxy.tap,
    })?;
    let (viz, dashboard) = start_viz(&config, &mesh, &viz_sa, &manifests).await?;
    view.say(&format!("dashboard: http://{dashboard}/"));
    let proxy = proxy.process;
    let authority = manifests::authority();
    view.say(&format!(
        "load proxy (as {}) outbound listening on {outbound}; sending {} rps for {authority} over {} connections, in mutual TLS to web",
        load_sa.identity(),
        config.rps,
        config.connections
    ));

    let mut load_config = LoadConfig::new(outbound, authority);
    load_config.rps = config.rps;
    load_config.connections = config.connections;
    let load = LoadClient::start(load_config)?;

    let mut demo = Demo {
        config,
        view,
        load,
        backends,
        names: pods.iter().map(|p| p.name.clone()).collect(),
        proxy,
        load_admin,
        web_admins: web_proxies.iter().map(|p| p.admin).collect(),
        web_proxies: web_proxies.into_iter().map(|p| p.process).collect(),
        identity: identity_ca,
        identities: (load_sa.identity(), web_sa.identity()),
        controller: Some(controller),
        viz,
        dashboard,
        logs: Vec::new(),
        steps: Vec::new(),
        convergence: None,
        mtls: None,
    };
    demo.play(&manifests, &pods, grpc).await;
    let outcome = demo.finish().await;
    // Removed here, once every process that read it is gone.
    drop(dir);
    Ok(outcome)
}

/// `ballast identity` on the run's issuer, checking tokens against the
/// cluster's token Secrets.
async fn start_identity(
    config: &DemoConfig,
    pki: &Pki,
    manifests: &Manifests,
) -> anyhow::Result<(Process, SocketAddr)> {
    let args = [
        "identity".to_string(),
        "--addr".to_string(),
        "127.0.0.1:0".to_string(),
        "--admin-addr".to_string(),
        "127.0.0.1:0".to_string(),
        "--issuer-dir".to_string(),
        pki.issuer_dir().display().to_string(),
        "--trust-anchors".to_string(),
        pki.anchors().display().to_string(),
        "--manifests".to_string(),
        manifests.dir().display().to_string(),
        "--controller-namespace".to_string(),
        CONTROL_NS.to_string(),
        "--trust-domain".to_string(),
        TRUST_DOMAIN.to_string(),
    ];
    let (process, addrs) = Process::start(
        &config.ballast,
        "identity",
        &args,
        &["identity gRPC listening on ", "admin listening on "],
        START_DEADLINE,
    )
    .await?;
    process::wait_ready(addrs[1], "identity", START_DEADLINE).await?;
    Ok((process, addrs[0]))
}

async fn start_controller(
    config: &DemoConfig,
    manifests: &Manifests,
    addr: SocketAddr,
    label: &str,
) -> anyhow::Result<(Process, SocketAddr)> {
    let args = [
        "destination".to_string(),
        "--manifests".to_string(),
        manifests.dir().display().to_string(),
        "--addr".to_string(),
        addr.to_string(),
        "--admin-addr".to_string(),
        "127.0.0.1:0".to_string(),
        "--policy-addr".to_string(),
        "127.0.0.1:0".to_string(),
        // Pods labelled by this control plane get an identity.
        "--controller-namespace".to_string(),
        CONTROL_NS.to_string(),
        "--identity-trust-domain".to_string(),
        TRUST_DOMAIN.to_string(),
    ];
    let (process, addrs) = Process::start(
        &config.ballast,
        label,
        &args,
        &["destination gRPC listening on ", "admin listening on "],
        START_DEADLINE,
    )
    .await?;
    process::wait_ready(addrs[1], label, START_DEADLINE).await?;
    Ok((process, addrs[0]))
}

/// A proxy of the demo and where it listens.
struct StartedProxy {
    process: Process,
    outbound: SocketAddr,
    inbound: SocketAddr,
    admin: SocketAddr,
    tap: SocketAddr,
}

/// The flags giving a proxy the identity of `account`: a certificate from
/// the demo's identity controller, and viz's identity as its one tapper.
fn identity_flags(mesh: &Mesh, account: &ServiceAccount) -> Vec<String> {
    [
        "--identity-trust-anchors",
        &mesh.anchors.display().to_string(),
        "--identity-addr",
        &mesh.identity.to_string(),
        "--identity-token-file",
        &account.token_file.display().to_string(),
        "--identity-controller-namespace",
        CONTROL_NS,
        "--identity-trust-domain",
        TRUST_DOMAIN,
        "--pod-namespace",
        &account.namespace,
        "--pod-service-account",
        &account.name,
        "--tap-client-identity",
        &identity::name(identity::VIZ_SERVICE_ACCOUNT, identity::VIZ_NAMESPACE),
    ]
    .map(str::to_string)
    .to_vec()
}

/// Starts `ballast proxy` with `args` and waits until it is ready (which,
/// with an identity, means it holds its certificate).
async fn start_proxy_process(
    config: &DemoConfig,
    label: &str,
    args: &[String],
) -> anyhow::Result<StartedProxy> {
    let (process, addrs) = Process::start(
        &config.ballast,
        label,
        args,
        &[
            "outbound listening on ",
            "inbound listening on ",
            "admin listening on ",
            "tap listening on ",
        ],
        START_DEADLINE,
    )
    .await?;
    process::wait_ready(addrs[2], label, START_DEADLINE).await?;
    Ok(StartedProxy {
        process,
        outbound: addrs[0],
        inbound: addrs[1],
        admin: addrs[2],
        tap: addrs[3],
    })
}

/// The load client's proxy (the `load` pod's), as `account`.
async fn start_proxy(
    config: &DemoConfig,
    mesh: &Mesh,
    account: &ServiceAccount,
    destination: SocketAddr,
) -> anyhow::Result<StartedProxy> {
    let mut args = [
        "proxy",
        "--destination-addr",
        &destination.to_string(),
        "--outbound-addr",
        "127.0.0.1:0",
        "--inbound-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        // Viz taps it as the `load` pod's proxy (mutual TLS as viz).
        "--tap-addr",
        "127.0.0.1:0",
        "--control-backoff-max",
        "2s",
        "--pod-name",
        manifests::LOAD_POD,
        "--pod-owner",
        &format!("deployment/{}", manifests::LOAD_DEPLOYMENT),
        "--pod-template-hash",
        manifests::LOAD_HASH,
    ]
    .map(str::to_string)
    .to_vec();
    args.extend(identity_flags(mesh, account));
    start_proxy_process(config, "proxy", &args).await
}

/// The proxy of web pod `name` at `ip`: inbound (mutual TLS as `account`),
/// admin and tap on the pod's IP, forwarding to its backend at `backend`.
async fn start_web_proxy(
    config: &DemoConfig,
    mesh: &Mesh,
    account: &ServiceAccount,
    destination: SocketAddr,
    name: &str,
    ip: Ipv4Addr,
    backend: SocketAddr,
) -> anyhow::Result<StartedProxy> {
    let on_pod = SocketAddr::new(IpAddr::V4(ip), 0).to_string();
    let mut args = [
        "proxy",
        // Its inbound policy comes from the controller, as a pod's does.
        "--destination-addr",
        &destination.to_string(),
        // Unused (the backend calls nothing), but a port of its own.
        "--outbound-addr",
        "127.0.0.1:0",
        "--inbound-addr",
        &on_pod,
        "--inbound-forward-port",
        &backend.port().to_string(),
        "--admin-addr",
        &on_pod,
        "--tap-addr",
        &on_pod,
        "--control-backoff-max",
        "2s",
        "--pod-name",
        name,
        "--pod-owner",
        &format!("deployment/{}", manifests::SERVICE),
        "--pod-template-hash",
        manifests::WEB_HASH,
    ]
    .map(str::to_string)
    .to_vec();
    args.extend(identity_flags(mesh, account));
    start_proxy_process(config, &format!("proxy of {name}"), &args).await
}

/// `ballast viz` on the demo's manifests: the dashboard and API address.
/// It reads the cluster itself, so the controller's outage leaves it up.
async fn start_viz(
    config: &DemoConfig,
    mesh: &Mesh,
    account: &ServiceAccount,
    manifests: &Manifests,
) -> anyhow::Result<(Process, SocketAddr)> {
    let mut args = vec![
        "viz".to_string(),
        "--manifests".to_string(),
        manifests.dir().display().to_string(),
        "--addr".to_string(),
        "127.0.0.1:0".to_string(),
        "--admin-addr".to_string(),
        "127.0.0.1:0".to_string(),
        "--scrape-interval".to_string(),
        VIZ_SCRAPE_INTERVAL.to_string(),
        "--scrape-timeout".to_string(),
        VIZ_SCRAPE_TIMEOUT.to_string(),
        "--controller-namespace".to_string(),
        CONTROL_NS.to_string(),
        "--identity-trust-domain".to_string(),
        TRUST_DOMAIN.to_string(),
    ];
    // Taps are mutual TLS as viz's own identity, the one the proxies admit.
    args.extend(
        [
            "--identity-trust-anchors",
            &mesh.anchors.display().to_string(),
            "--identity-addr",
            &mesh.identity.to_string(),
            "--identity-token-file",
            &account.token_file.display().to_string(),
            "--service-account",
            &account.name,
            "--namespace",
            &account.namespace,
        ]
        .map(str::to_string),
    );
    let (process, addrs) = Process::start(
        &config.ballast,
        "viz",
        &args,
        &["viz dashboard listening on http://", "admin listening on "],
        START_DEADLINE,
    )
    .await?;
    process::wait_ready(addrs[1], "viz", START_DEADLINE).await?;
    Ok((process, addrs[0]))
}

/// The counters at the start of a step.
struct Mark {
    at: Instant,
    traffic: Snapshot,
    served: Vec<u64>,
}

/// What a step is called and how long it is planned to take.
struct Step<'a> {
    label: &'a str,
    title: &'a str,
    planned: Duration,
}

struct Demo {
    config: DemoConfig,
    view: View,
    load: LoadClient,
    backends: Vec<Backend>,
    names: Vec<String>,
    /// The load client's proxy, and its admin address.
    proxy: Process,
    load_admin: SocketAddr,
    /// The web pods' proxies (in the order of `names`), and their admin
    /// addresses.
    web_proxies: Vec<Process>,
    web_admins: Vec<SocketAddr>,
    /// `ballast identity`: up for the whole demo.
    identity: Process,
    /// The identities of load's and of web's proxies.
    identities: (String, String),
    controller: Option<Process>,
    /// `ballast viz`: up for the whole demo, stopped at its end.
    viz: Process,
    dashboard: SocketAddr,
    /// Logs of processes already gone (the killed controller).
    logs: Vec<(String, Vec<String>)>,
    steps: Vec<StepReport>,
    convergence: Option<Duration>,
    mtls: Option<MutualTls>,
}

impl Demo {
    async fn play(&mut self, manifests: &Manifests, pods: &[PodBackend], grpc: SocketAddr) {
        if !self.warm_up().await {
            return;
        }
        let run = self.mark();
        self.steady().await;
        self.controller_down().await;
        if let Some(restarted_at) = self.restart_without_web_c(manifests, pods, grpc).await {
            if self.converge(restarted_at).await {
                self.converged().await;
            }
        }
        // Whatever came before, how the traffic crossed the wire is checked.
        self.mutual_tls(&run).await;
    }

    /// e: from the proxies' own counters, every connection from load to
    /// web was mutual TLS, each end proving the identity the other expects.
    async fn mutual_tls(&mut self, run: &Mark) {
        let step = Step {
            label: "e",
            title: "load -> web mutual TLS (whole run)",
            planned: Duration::ZERO,
        };
        let (load_id, web_id) = self.identities.clone();
        let mut checks = Vec::new();

        let mut outbound = TlsTally::default();
        match read_metrics(self.load_admin).await {
            Ok(page) => {
                outbound.add_page(&page, "outbound", "dst");
                checks.push(Check {
                    text: format!(
                        "the load proxy's connections to web were mutual TLS with {web_id} ({})",
                        outbound.describe()
                    ),
                    passed: outbound.all_mtls_with(&web_id),
                });
            }
            Err(error) => checks.push(Check {
                text: format!("cannot read the load proxy's /metrics: {error}"),
                passed: false,
            }),
        }

        // Viz may tap a web proxy too (as its own identity): load's must be
        // among the clients, and no connection may be without TLS.
        let mut inbound = TlsTally::default();
        let mut unread = Vec::new();
        for (name, admin) in self.names.iter().zip(&self.web_admins) {
            match read_metrics(*admin).await {
                Ok(page) => inbound.add_page(&page, "inbound", "src"),
                Err(error) => unread.push(format!("{name}: {error}")),
            }
        }
        checks.push(Check {
            text: if unread.is_empty() {
                format!(
                    "web's proxies accepted only mutual TLS, {load_id} among the clients ({})",
                    inbound.describe()
                )
            } else {
                format!(
                    "cannot read the /metrics of web's proxies: {}",
                    unread.join("; ")
                )
            },
            passed: unread.is_empty()
                && inbound.unsecured() == 0.0
                && inbound.mtls.contains_key(&load_id),
        });
        if checks.iter().all(|c| c.passed) {
            self.mtls = Some(MutualTls {
                client: load_id,
                server: web_id,
                connections: outbound.secured() as u64,
            });
        }
        self.report(&step, run, checks);
    }

    /// Waits until traffic reaches all three backends through the proxy.
    /// Not a step of its own unless it fails: resolving takes a moment.
    async fn warm_up(&mut self) -> bool {
        let step = Step {
            label: "0",
            title: "traffic reaches all three backends",
            planned: WARM_UP_DEADLINE,
        };
        let mark = self.mark();
        let note = "waiting for the proxy to resolve web.demo and answer from every backend";
        let reached = self
            .wait_until(&step, note, |demo| {
                demo.backends.iter().all(|b| b.requests() > 0)
                    && demo.load.snapshot().total().successes > 0
            })
            .await;
        if reached {
            let took = mark.at.elapsed();
            let failed = self
                .load
                .snapshot()
                .since(&mark.traffic)
                .total()
                .failures
                .total();
            self.view.say(&format!(
                "traffic reached all three backends after {:.1} s ({failed} failed on the way)",
                took.as_secs_f64()
            ));
            return true;
        }
        let served = self.served_since(&mark);
        let checks = vec![Check {
            text: format!(
                "traffic reached all three backends within {:.0} s (served: {})",
                WARM_UP_DEADLINE.as_secs_f64(),
                served
            ),
            passed: false,
        }];
        self.report(&step, &mark, checks);
        false
    }

    /// a: steady traffic.
    async fn steady(&mut self) {
        let step = Step {
            label: "a",
            title: "steady traffic",
            planned: self.config.steady_for,
        };
        let mark = self.mark();
        self.hold(
            &step,
            "traffic through the proxy, balanced over web-a, web-b and web-c",
        )
        .await;
        let checks = self.traffic_checks(&step, &mark);
        self.report(&step, &mark, checks);
    }

    /// b: the controller is killed and stays down.
    async fn controller_down(&mut self) {
        let step = Step {
            label: "b",
            title: "controller killed (SIGKILL)",
            planned: self.config.down_for,
        };
        if let Some(controller) = self.controller.as_mut() {
            controller.kill().await;
            let status = controller
                .exit_status()
                .map_or("still running".to_string(), |s| s.to_string());
            self.view
                .say(&format!("controller killed with SIGKILL ({status})"));
        }
        let mark = self.mark();
        self.hold(
            &step,
            "no controller: the proxy keeps routing on the endpoints it last knew",
        )
        .await;
        let mut checks = self.traffic_checks(&step, &mark);
        let killed = self
            .controller
            .as_mut()
            .is_some_and(|c| c.exit_status().is_some());
        checks.push(Check {
            text: "the controller was down for the whole step".to_string(),
            passed: killed,
        });
        self.report(&step, &mark, checks);
    }

    /// c: web-c leaves the manifests while the controller is down, then
    /// the controller comes back on its old address. Returns when it was back.
    async fn restart_without_web_c(
        &mut self,
        manifests: &Manifests,
        pods: &[PodBackend],
        grpc: SocketAddr,
    ) -> Option<Instant> {
        let step = Step {
            label: "c",
            title: "web-c removed, controller back",
            planned: START_DEADLINE,
        };
        let mark = self.mark();
        let remaining: Vec<PodBackend> =
            pods.iter().filter(|p| p.name != REMOVED).cloned().collect();
        let mut checks = Vec::new();
        let rewritten = manifests.set_pods(&remaining);
        checks.push(Check {
            text: match &rewritten {
                Ok(()) => {
                    format!("{REMOVED} removed from the manifests while the controller was down")
                }
                Err(e) => format!("{REMOVED} could not be removed from the manifests: {e:#}"),
            },
            passed: rewritten.is_ok(),
        });
        if let Some(old) = self.controller.take() {
            self.logs.push((
                "controller (killed)".to_string(),
                old.log_tail(REPORT_LOG_LINES),
            ));
        }
        let config = self.config.clone();
        let restart = start_controller(&config, manifests, grpc, "controller (restarted)");
        let restarted = self
            .while_showing(
                &step,
                "starting the controller again on its old address",
                restart,
            )
            .await;
        let restarted_at = Instant::now();
        match restarted {
            Ok((process, addr)) => {
                checks.push(Check {
                    text: format!(
                        "the controller restarted on its old address {addr} in {:.1} s",
                        mark.at.elapsed().as_secs_f64()
                    ),
                    passed: addr == grpc,
                });
                self.controller = Some(process);
                self.view
                    .say(&format!("controller back on {addr}, without {REMOVED}"));
            }
            Err(error) => {
                checks.push(Check {
                    text: format!("the controller could not restart on {grpc}: {error:#}"),
                    passed: false,
                });
            }
        }
        checks.extend(self.traffic_checks(&step, &mark));
        let back = self.controller.is_some();
        self.report(&step, &mark, checks);
        back.then_some(restarted_at)
    }

    /// d1: waits for web-c to stop getting traffic. True once it has.
    async fn converge(&mut self, restarted_at: Instant) -> bool {
        let step = Step {
            label: "d1",
            title: "proxy drops web-c",
            planned: self.config.converge_within + QUIET_FOR,
        };
        let mark = self.mark();
        let removed = self.names.iter().position(|n| n == REMOVED).unwrap_or(0);
        let mut last_count = self.backends[removed].requests();
        let mut last_change = restarted_at;
        let note = format!("waiting for the proxy to stop sending to {REMOVED}");
        let deadline = restarted_at + self.config.converge_within;
        let drained = self
            .wait_until(&step, &note, |demo| {
                let now = Instant::now();
                let count = demo.backends[removed].requests();
                if count != last_count {
                    last_count = count;
                    last_change = now;
                }
                // Quiet long enough, and the last request came before the deadline.
                now.duration_since(last_change) >= QUIET_FOR && last_change <= deadline
            })
            .await;
        let mut checks = Vec::new();
        if drained {
            let took = last_change.saturating_duration_since(restarted_at);
            self.convergence = Some(took);
            checks.push(Check {
                text: format!(
                    "{REMOVED} got its last request {:.1} s after the controller came back (deadline {:.0} s)",
                    took.as_secs_f64(),
                    self.config.converge_within.as_secs_f64()
                ),
                passed: true,
            });
        } else {
            checks.push(Check {
                text: format!(
                    "{REMOVED} still got traffic {:.0} s after the controller came back",
                    self.config.converge_within.as_secs_f64()
                ),
                passed: false,
            });
        }
        checks.extend(self.traffic_checks(&step, &mark));
        self.report(&step, &mark, checks);
        drained
    }

    /// d2: converged: web-c gets nothing, the others carry the traffic.
    async fn converged(&mut self) {
        let step = Step {
            label: "d2",
            title: "converged without web-c",
            planned: self.config.steady_for,
        };
        let mark = self.mark();
        self.hold(
            &step,
            "web-a and web-b carry all the traffic; web-c gets none",
        )
        .await;
        let mut checks = self.traffic_checks(&step, &mark);
        let removed = self.names.iter().position(|n| n == REMOVED).unwrap_or(0);
        let new_requests = self.backends[removed]
            .requests()
            .saturating_sub(mark.served[removed]);
        checks.push(Check {
            text: format!("{REMOVED} got {new_requests} new requests (expected 0)"),
            passed: new_requests == 0,
        });
        let others: Vec<String> = self
            .names
            .iter()
            .filter(|n| *n != REMOVED)
            .cloned()
            .collect();
        checks.push(self.answered_only_by(&mark, &others));
        self.report(&step, &mark, checks);
    }

    /// Stops everything and puts the outcome together.
    async fn finish(mut self) -> DemoOutcome {
        let passed = !self.steps.is_empty() && self.steps.iter().all(StepReport::passed);
        self.proxy.kill().await;
        for proxy in &mut self.web_proxies {
            proxy.kill().await;
        }
        if let Some(mut controller) = self.controller.take() {
            controller.kill().await;
            self.logs.push((
                controller.label().to_string(),
                controller.log_tail(REPORT_LOG_LINES),
            ));
        }
        self.logs
            .push(("proxy".to_string(), self.proxy.log_tail(REPORT_LOG_LINES)));
        for proxy in &self.web_proxies {
            self.logs
                .push((proxy.label().to_string(), proxy.log_tail(REPORT_LOG_LINES)));
        }
        self.viz.kill().await;
        self.logs
            .push(("viz".to_string(), self.viz.log_tail(REPORT_LOG_LINES)));
        self.identity.kill().await;
        self.logs.push((
            "identity".to_string(),
            self.identity.log_tail(REPORT_LOG_LINES),
        ));
        let outcome = DemoOutcome {
            steps: self.steps,
            passed,
            convergence: self.convergence,
            backends: self.names,
            logs: self.logs,
            dashboard: Some(self.dashboard),
            mtls: self.mtls,
        };
        self.view.summary(&outcome);
        outcome
    }

    fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            traffic: self.load.snapshot(),
            served: self.backends.iter().map(Backend::requests).collect(),
        }
    }

    /// "web-a 12, web-b 0, ..." requests each backend served since `mark`.
    fn served_since(&self, mark: &Mark) -> String {
        self.backends
            .iter()
            .zip(&mark.served)
            .map(|(b, then)| format!("{} {}", b.name(), b.requests().saturating_sub(*then)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every request succeeded, enough of them were sent, the proxy is up.
    fn traffic_checks(&mut self, step: &Step<'_>, mark: &Mark) -> Vec<Check> {
        let traffic = self.load.snapshot().since(&mark.traffic);
        let total = traffic.total();
        let mut checks = Vec::new();
        let failures = total.failures;
        let mut failed_text = format!(
            "every request succeeded ({} of {})",
            total.successes, total.requests
        );
        if failures.total() > 0 {
            failed_text = format!(
                "{} of {} requests failed ({} with an error status, {} proxy errors, {} connection errors, {} timeouts){}",
                failures.total(),
                total.requests,
                failures.status,
                failures.proxy_error,
                failures.transport,
                failures.timeout,
                self.load
                    .last_error()
                    .map_or(String::new(), |e| format!("; last error: {e}")),
            );
        }
        checks.push(Check {
            text: failed_text,
            passed: failures.total() == 0,
        });
        let elapsed = mark.at.elapsed();
        if step.planned >= Duration::from_secs(1) && elapsed >= Duration::from_secs(1) {
            let expected = f64::from(self.config.rps) * elapsed.as_secs_f64();
            checks.push(Check {
                text: format!(
                    "{} requests in {:.1} s ({:.0} rps of {} asked)",
                    total.requests,
                    elapsed.as_secs_f64(),
                    total.requests as f64 / elapsed.as_secs_f64(),
                    self.config.rps
                ),
                passed: total.requests as f64 >= expected * MIN_VOLUME,
            });
        }
        if let Some(status) = self.proxy.exit_status() {
            checks.push(Check {
                text: format!("the proxy exited ({status})"),
                passed: false,
            });
        }
        for proxy in &mut self.web_proxies {
            if let Some(status) = proxy.exit_status() {
                checks.push(Check {
                    text: format!("the {} exited ({status})", proxy.label()),
                    passed: false,
                });
            }
        }
        if let Some(status) = self.identity.exit_status() {
            checks.push(Check {
                text: format!("the identity controller exited ({status})"),
                passed: false,
            });
        }
        // The dashboard has its own index: the controller's outage must
        // not take it down.
        if let Some(status) = self.viz.exit_status() {
            checks.push(Check {
                text: format!("the viz dashboard exited ({status})"),
                passed: false,
            });
        }
        checks
    }

    /// Every successful answer since `mark` named one of `names` (the
    /// client's view; the backends' own counters are checked separately).
    fn answered_only_by(&self, mark: &Mark, names: &[String]) -> Check {
        let traffic = self.load.snapshot().since(&mark.traffic);
        let list = traffic
            .backends
            .iter()
            .filter(|(_, c)| c.successes > 0)
            .map(|(n, c)| format!("{n} {}", c.successes))
            .collect::<Vec<_>>()
            .join(", ");
        let strays = traffic
            .backends
            .iter()
            .any(|(n, c)| c.successes > 0 && !names.contains(n));
        Check {
            text: format!("every answer came from {} ({list})", names.join(" or ")),
            passed: traffic.total().successes > 0 && !strays,
        }
    }

    fn report(&mut self, step: &Step<'_>, mark: &Mark, checks: Vec<Check>) {
        let report = StepReport {
            label: step.label.to_string(),
            title: step.title.to_string(),
            duration: mark.at.elapsed(),
            traffic: self.load.snapshot().since(&mark.traffic),
            checks,
        };
        let verdict = if report.passed() { "held" } else { "FAILED" };
        let failed: Vec<&str> = report
            .checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.text.as_str())
            .collect();
        let mut message = format!("step {} ({}) {verdict}", report.label, report.title);
        if !failed.is_empty() {
            message.push_str(": ");
            message.push_str(&failed.join("; "));
        }
        self.view.say(&message);
        self.steps.push(report);
    }

    /// Shows progress for the step's planned length (stopping early if the
    /// proxy exits).
    async fn hold(&mut self, step: &Step<'_>, note: &str) {
        self.wait_until(step, note, |_| false).await;
    }

    /// Shows progress until `done` says so or the step's planned time is up;
    /// true if `done` said so. Stops early, false, if the proxy exits.
    async fn wait_until(
        &mut self,
        step: &Step<'_>,
        note: &str,
        mut done: impl FnMut(&Demo) -> bool,
    ) -> bool {
        let start = Instant::now();
        let mut redraw = tokio::time::interval(REDRAW_EVERY);
        loop {
            redraw.tick().await;
            if done(self) {
                return true;
            }
            self.show(step, note, start.elapsed());
            if start.elapsed() >= step.planned || self.proxy.exit_status().is_some() {
                return false;
            }
        }
    }

    /// Shows progress while `work` runs; returns its result.
    async fn while_showing<T>(
        &mut self,
        step: &Step<'_>,
        note: &str,
        work: impl Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let mut work = std::pin::pin!(work);
        let mut redraw = tokio::time::interval(REDRAW_EVERY);
        loop {
            tokio::select! {
                result = &mut work => return result,
                _ = redraw.tick() => self.show(step, note, start.elapsed()),
            }
        }
    }

    fn show(&mut self, step: &Step<'_>, note: &str, elapsed: Duration) {
        let total = self.load.snapshot();
        let recent = self.load.window(Duration::from_secs(RECENT_SECS));
        // The window holds whole seconds, the current one partly elapsed.
        let running = self.load.started().elapsed().as_secs_f64();
        let recent_secs = running.min((RECENT_SECS - 1) as f64 + running.fract());
        let last_error = self.load.last_error();
        let names = self.names.clone();
        self.view.show(&Progress {
            step: step.label,
            title: step.title,
            note,
            elapsed,
            planned: step.planned,
            backends: &names,
            total: &total,
            recent: &recent,
            recent_secs,
            last_error: last_error.as_deref(),
        });
    }
}

/// A proxy's `/metrics` page.
async fn read_metrics(admin: SocketAddr) -> Result<String, String> {
    match process::http_get(admin, "/metrics", MAX_METRICS_BYTES, METRICS_DEADLINE).await? {
        (200, page) => Ok(page),
        (status, _) => Err(format!("{admin}/metrics answered {status}")),
    }
}
