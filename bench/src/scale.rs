//! `scale-bench`: one controller replica at the scale of issue 25 (not a
//! test).
//!
//! Generates a cluster as manifests (PODS pods in SERVICES Services, one
//! file per Service holding the Service, its pods and, for ROUTES of them,
//! an HTTPRoute whose parentRef is the Service, with a weighted split over
//! it and a Service of its namespace), starts `ballast destination` on it
//! with its stream limits raised for what the bench opens, and then plays
//! PROXIES proxies, each opening the four streams a proxy holds:
//!
//! - `Get` for its target Service's authority (`NAME.NS.svc.cluster.local:80`);
//! - `GetProfile` for that Service's address (`CLUSTER_IP:80`);
//! - `OutboundPolicies.Watch` for the same address;
//! - `InboundServerPolicies.WatchPort` for its own pod's port 8080 (proxy
//!   `k` is pod `k % PODS`).
//!
//! A share (HOT_SHARE) of the proxies target the hot Service (`svc-0`), the
//! others are spread evenly over the rest. The streams are opened API by API
//! (every proxy's Get, then every GetProfile, ...), PROXIES_PER_CONNECTION
//! proxies to one HTTP/2 connection, so that the controller's memory growth
//! of each phase is that API's cost per stream.
//!
//! Then ROUNDS times, the hot Service's file is rewritten (a pod's IP and
//! the route's weights changed, `--change both`), and the time from the
//! write to the update's arrival on every stream watching the hot Service
//! (its Get and its OutboundPolicies.Watch streams) is recorded; with
//! `--busy N` the rounds run again with N CPU hogs (`sh -c 'while :; do :;
//! done'`) beside the controller and the bench.
//!
//! It fails (exit status 1, the reason on stderr, after printing what it
//! measured) when the controller did not serve: a stream refused or without
//! its first message, a stream that ended, a change that did not reach every
//! stream of its Service within 10 s, a controller that exited, memory not
//! read.

use ballast_bench::{
    allocated, http_get, percentile, rss, start,
    system::{clock_ticks, cpu_ticks, hogs, raise_nofile, wait_for_quiet, ForeignMonitor},
    write_atomic, Controller,
};
use ballast_testkit::ApiServer;
use linkerd2_proxy_api::{
    destination::{destination_client::DestinationClient, update, GetDestination},
    inbound::{inbound_server_policies_client::InboundServerPoliciesClient, PortSpec},
    net::TcpAddress,
    outbound::{outbound_policies_client::OutboundPoliciesClient, traffic_spec, TrafficSpec},
};
use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::transport::Channel;

#[path = "scale/raw.rs"]
mod raw;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "Usage: scale-bench [--ballast PATH] [--pods N] [--services N] \
[--routes N] [--proxies N] [--hot-share F] [--rounds N (0: memory only)] [--busy N] \
[--mix get,profile,outbound,inbound] [--change both|endpoints|route] \
[--proxies-per-connection N] [--servers N] [--memory-limit SIZE|0] \
[--open-concurrency N] [--source manifests|kube] [--round-gap MS] [--client tonic|raw] [--client-tasks per-connection|per-stream] \
[--quiet-wait SECS] \
[--keep DIR]";

/// How long a change round waits for the next stream's update, and a
/// connection for its TCP connect.
const WAIT: Duration = Duration::from_secs(10);
/// How long a phase of opening may go with no stream answered.
const OPEN_STALL: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Get,
    Profile,
    Outbound,
    Inbound,
}

impl Api {
    const ALL: [Api; 4] = [Api::Get, Api::Profile, Api::Outbound, Api::Inbound];

    fn name(self) -> &'static str {
        match self {
            Api::Get => "Get",
            Api::Profile => "GetProfile",
            Api::Outbound => "OutboundPolicies.Watch",
            Api::Inbound => "InboundServerPolicies.WatchPort",
        }
    }

    fn parse(s: &str) -> anyhow::Result<Api> {
        Ok(match s {
            "get" => Api::Get,
            "profile" => Api::Profile,
            "outbound" => Api::Outbound,
            "inbound" => Api::Inbound,
            other => anyhow::bail!(
                "--mix: unknown API {other:?} (get, profile, outbound, inbound)\n{USAGE}"
            ),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// A pod's IP: the hot Service's Get streams.
    Endpoints,
    /// The route's weights: the hot Service's OutboundPolicies.Watch streams.
    Route,
    /// Both in one write.
    Both,
}

/// Where the controller reads the cluster, and where a change is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// A manifests directory; a change rewrites the hot Service's file
    /// (default). The source waits 10 ms (its debounce) for the directory
    /// to be quiet before it reads: part of every figure.
    Manifests,
    /// testkit's API server emulation, in this process; a change applies
    /// the hot Service's changed objects, as a controller in a cluster is
    /// told of them on its watches.
    Kube,
}

/// Which client the bench's streams use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// tonic's generated clients, decoding every message (default).
    Tonic,
    /// HTTP/2 framed by hand, messages split but not decoded (`raw.rs`):
    /// about the least CPU a client can spend per update.
    Raw,
}

/// How the bench's streams run. The bench shares the machine with the
/// controller, so what it spends reading 5,000 updates delays the updates
/// it measures; a proxy reads its few on its own CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientTasks {
    /// A connection's streams are polled together in one task (default):
    /// a runtime wake per connection, not per stream.
    PerConnection,
    /// Each stream is a task of its own (the method before 2026-12-05,
    /// late evening).
    PerStream,
}

struct Opts {
    ballast: PathBuf,
    pods: usize,
    services: usize,
    routes: usize,
    proxies: usize,
    hot_share: f64,
    rounds: usize,
    busy: usize,
    mix: Vec<Api>,
    change: Change,
    proxies_per_connection: usize,
    servers: usize,
    memory_limit: String,
    open_concurrency: usize,
    source: Source,
    /// Pause after a round's last update, before the next write (default
    /// 50 ms: what else the write sent arrives, and the manifests source's
    /// rescan is over).
    round_gap: Duration,
    client: Client,
    client_tasks: ClientTasks,
    /// Before each set of rounds, wait up to this long for other processes
    /// to use under 0.3 cores with no compiler running.
    quiet_wait: Duration,
    keep: Option<PathBuf>,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        pods: 10_000,
        services: 2_000,
        routes: 500,
        proxies: 25_000,
        hot_share: 0.1,
        rounds: 50,
        busy: 2,
        mix: Api::ALL.to_vec(),
        change: Change::Both,
        proxies_per_connection: 25,
        servers: 0,
        memory_limit: "1GiB".into(),
        open_concurrency: 2_000,
        source: Source::Manifests,
        round_gap: Duration::from_millis(50),
        client: Client::Tonic,
        client_tasks: ClientTasks::PerConnection,
        quiet_wait: Duration::ZERO,
        keep: None,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--pods" => o.pods = args.parse()?,
            "--services" => o.services = args.parse()?,
            "--routes" => o.routes = args.parse()?,
            "--proxies" => o.proxies = args.parse()?,
            "--hot-share" => o.hot_share = args.parse()?,
            "--rounds" => o.rounds = args.parse()?,
            "--busy" => o.busy = args.parse()?,
            "--mix" => {
                o.mix = args
                    .value()?
                    .split(',')
                    .map(|s| Api::parse(s.trim()))
                    .collect::<anyhow::Result<_>>()?;
                o.mix.sort_by_key(|a| *a as u8);
                o.mix.dedup();
            }
            "--change" => {
                o.change = match args.value()?.as_str() {
                    "both" => Change::Both,
                    "endpoints" => Change::Endpoints,
                    "route" => Change::Route,
                    other => anyhow::bail!("--change {other}: both, endpoints or route\n{USAGE}"),
                }
            }
            "--proxies-per-connection" => o.proxies_per_connection = args.parse()?,
            "--servers" => o.servers = args.parse()?,
            "--memory-limit" => o.memory_limit = args.value()?,
            "--open-concurrency" => o.open_concurrency = args.parse()?,
            "--round-gap" => o.round_gap = Duration::from_millis(args.parse()?),
            "--source" => {
                o.source = match args.value()?.as_str() {
                    "manifests" => Source::Manifests,
                    "kube" => Source::Kube,
                    other => anyhow::bail!("--source {other}: manifests or kube\n{USAGE}"),
                }
            }
            "--client" => {
                o.client = match args.value()?.as_str() {
                    "tonic" => Client::Tonic,
                    "raw" => Client::Raw,
                    other => anyhow::bail!("--client {other}: tonic or raw\n{USAGE}"),
                }
            }
            "--client-tasks" => {
                o.client_tasks = match args.value()?.as_str() {
                    "per-connection" => ClientTasks::PerConnection,
                    "per-stream" => ClientTasks::PerStream,
                    other => anyhow::bail!(
                        "--client-tasks {other}: per-connection or per-stream\n{USAGE}"
                    ),
                }
            }
            "--quiet-wait" => o.quiet_wait = Duration::from_secs(args.parse()?),
            "--keep" => o.keep = Some(args.value()?.into()),
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(o.services >= 2, "--services must be at least 2");
    anyhow::ensure!(
        o.pods >= o.services,
        "--pods must be at least --services (every Service has a pod)"
    );
    anyhow::ensure!(
        o.routes <= o.services && o.servers <= o.services,
        "--routes and --servers: at most one per Service"
    );
    anyhow::ensure!(
        o.proxies >= 1 && !o.mix.is_empty(),
        "nothing to measure: --proxies and --mix must not be empty or 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&o.hot_share),
        "--hot-share is a fraction in 0..=1"
    );
    anyhow::ensure!(
        o.proxies_per_connection >= 1 && o.open_concurrency >= 1,
        "--proxies-per-connection and --open-concurrency must be at least 1"
    );
    if o.change != Change::Endpoints {
        anyhow::ensure!(
            o.routes >= 1,
            "--change {:?} needs a route on the hot Service: --routes must be at least 1",
            o.change
        );
    }
    Ok(o)
}

/// The generated cluster's names and addresses.
struct Cluster {
    services: usize,
    per_service: usize,
    /// Whether each Service has a route.
    routed: Vec<bool>,
    servers: usize,
}

impl Cluster {
    fn new(o: &Opts) -> Self {
        let route_parent: Vec<usize> = (0..o.routes).map(|r| r * o.services / o.routes).collect();
        let mut routed = vec![false; o.services];
        for &s in &route_parent {
            routed[s] = true;
        }
        Cluster {
            services: o.services,
            per_service: o.pods / o.services,
            routed,
            servers: o.servers,
        }
    }

    fn pods(&self) -> usize {
        self.services * self.per_service
    }

    fn name(i: usize) -> String {
        format!("svc-{i}")
    }

    fn namespace(i: usize) -> String {
        format!("ns-{}", i % 10)
    }

    fn cluster_ip(i: usize) -> String {
        format!("10.96.{}.{}", i / 250 % 250, i % 250 + 1)
    }

    fn authority(i: usize) -> String {
        format!(
            "{}.{}.svc.cluster.local:80",
            Self::name(i),
            Self::namespace(i)
        )
    }

    /// Pod `n`: its name and namespace (its Service's).
    fn pod(&self, n: usize) -> (String, String) {
        let s = n / self.per_service;
        (
            format!("{}-6d4cf56db6-p{}", Self::name(s), n % self.per_service),
            Self::namespace(s),
        )
    }

    /// Pod `n`'s IP; the last pod of a Service moves out of the pods' range
    /// at each generation of a change (never onto another pod's address).
    fn pod_ip(n: usize, generation: usize) -> String {
        if generation == 0 {
            format!(
                "10.{}.{}.{}",
                1 + n / 62_500 % 200,
                n / 250 % 250,
                n % 250 + 1
            )
        } else {
            format!("10.250.{}.{}", generation / 250 % 250, generation % 250 + 1)
        }
    }

    /// The backend a route on Service `s` splits to besides `s`: a Service
    /// of the same namespace.
    fn canary_of(&self, s: usize) -> usize {
        (s + 10) % self.services
    }

    /// Service `i`'s file: the Service, its pods (the last one's IP at
    /// `pod_generation`), its HTTPRoute if it has one (weights at
    /// `route_generation`), its Server if it has one.
    fn file(&self, i: usize, pod_generation: usize, route_generation: usize) -> String {
        let (name, ns) = (Self::name(i), Self::namespace(i));
        let mut out = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
             labels: {{app: {name}}}\nspec:\n  clusterIP: {}\n  selector: {{app: {name}}}\n  \
             ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: http\n",
            Self::cluster_ip(i)
        );
        for p in 0..self.per_service {
            let n = i * self.per_service + p;
            let generation = if p == self.per_service - 1 {
                pod_generation
            } else {
                0
            };
            let ip = Self::pod_ip(n, generation);
            let _ = write!(
                out,
                "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-6d4cf56db6-p{p}\n  \
                 namespace: {ns}\n  creationTimestamp: \"2026-11-01T10:00:00Z\"\n  labels:\n    \
                 app: {name}\n    pod-template-hash: 6d4cf56db6\n    linkerd.io/control-plane-ns: linkerd\n  \
                 annotations:\n    linkerd.io/proxy-version: stable\n  ownerReferences:\n  - apiVersion: apps/v1\n    \
                 kind: ReplicaSet\n    name: {name}-6d4cf56db6\n    controller: true\n    uid: 0f6c2a34-1111-2222-3333-{n:012}\n\
                 spec:\n  serviceAccountName: {name}\n  nodeName: node-{}\n  containers:\n  - name: app\n    \
                 image: example/app:1.0\n    ports:\n    - name: http\n      containerPort: 8080\n      protocol: TCP\n  \
                 - name: linkerd-proxy\n    env:\n    - name: LINKERD2_PROXY_INBOUND_LISTEN_ADDR\n      value: 0.0.0.0:4143\n\
                 status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  hostIP: 172.16.0.{}\n  \
                 conditions:\n  - type: Ready\n    status: \"True\"\n  - type: ContainersReady\n    status: \"True\"\n",
                n % 50,
                n % 50 + 1
            );
        }
        if self.routed[i] {
            // policy-bench's route: a path and header match, a weighted
            // split, a timeout; the generation moves the weights.
            let canary = 1 + route_generation % 98;
            let other = Self::name(self.canary_of(i));
            let _ = write!(
                out,
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                 metadata: {{name: {name}-route, namespace: {ns}}}\n\
                 spec:\n  parentRefs: [{{group: core, kind: Service, name: {name}, port: 80}}]\n\
                 \x20 rules:\n  - matches: [{{path: {{type: PathPrefix, value: /api}}, headers: [{{name: x-tenant, value: t{i}}}]}}]\n\
                 \x20   backendRefs: [{{name: {name}, port: 80, weight: {}}}, {{name: {other}, port: 80, weight: {canary}}}]\n\
                 \x20   timeouts: {{request: 2s}}\n",
                100 - canary
            );
        }
        if i < self.servers {
            let _ = write!(
                out,
                "---\napiVersion: policy.linkerd.io/v1beta3\nkind: Server\n\
                 metadata: {{name: {name}-http, namespace: {ns}}}\n\
                 spec: {{podSelector: {{matchLabels: {{app: {name}}}}}, port: http, proxyProtocol: HTTP/1}}\n"
            );
        }
        out
    }
}

/// A generated file's objects, as the API server takes them.
fn documents(yaml: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    serde_saphyr::from_multiple(yaml).map_err(|e| anyhow::anyhow!("a generated file: {e}"))
}

/// Proxy `k`: the Service it targets and its own pod.
#[derive(Clone, Copy)]
struct Proxy {
    target: usize,
    pod: usize,
}

/// The proxies: `hot` of them (spread evenly) target Service 0, the others
/// the other Services in turn.
fn proxies(o: &Opts, cluster: &Cluster) -> (Vec<Proxy>, usize) {
    let hot = ((o.proxies as f64) * o.hot_share).round() as usize;
    let mut out = Vec::with_capacity(o.proxies);
    let mut cold = 0;
    for k in 0..o.proxies {
        // Bresenham: proxy k is hot when k * hot / proxies steps.
        let is_hot = (k + 1) * hot / o.proxies != k * hot / o.proxies;
        let target = if is_hot {
            0
        } else {
            cold += 1;
            1 + (cold - 1) % (o.services - 1)
        };
        out.push(Proxy {
            target,
            pod: k % cluster.pods(),
        });
    }
    (out, hot)
}

/// What a stream's task reports.
enum Event {
    /// Its first message, or why it had none (the gRPC code's name first).
    First(u32, Result<(), String>),
    /// A message after the first (for Get: an `Add`).
    Update(u32, Instant),
    /// It ended (the status or the reason).
    Ended(u32, String),
}

/// Follows an open stream: its first message, then every update.
async fn follow<T>(
    id: u32,
    mut stream: tonic::Streaming<T>,
    counts: fn(&T) -> bool,
    permit: OwnedSemaphorePermit,
    tx: mpsc::UnboundedSender<Event>,
) {
    match stream.message().await {
        Ok(Some(_)) => {
            let _ = tx.send(Event::First(id, Ok(())));
        }
        Ok(None) => {
            let _ = tx.send(Event::First(
                id,
                Err("ended before its first message".into()),
            ));
            return;
        }
        Err(s) => {
            let _ = tx.send(Event::First(id, Err(status_text(&s))));
            return;
        }
    }
    drop(permit);
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if counts(&m) {
                    let _ = tx.send(Event::Update(id, Instant::now()));
                }
            }
            Ok(None) => {
                let _ = tx.send(Event::Ended(id, "ended (OK)".into()));
                return;
            }
            Err(s) => {
                let _ = tx.send(Event::Ended(id, status_text(&s)));
                return;
            }
        }
    }
}

fn status_text(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// The workload a proxy says it is (policy APIs).
fn workload(p: Proxy, cluster: &Cluster) -> String {
    let (pod, ns) = cluster.pod(p.pod);
    format!(r#"{{"ns":"{ns}","pod":"{pod}"}}"#)
}

/// The address a proxy's target Service is dialled at.
fn target_addr(p: Proxy) -> SocketAddr {
    SocketAddr::new(Cluster::cluster_ip(p.target).parse().expect("an IP"), 80)
}

/// A `Get` (by authority) or `GetProfile` (by address) request.
fn destination_request(api: Api, p: Proxy, cluster: &Cluster) -> GetDestination {
    let (_, ns) = cluster.pod(p.pod);
    GetDestination {
        scheme: "k8s".into(),
        path: if api == Api::Get {
            Cluster::authority(p.target)
        } else {
            target_addr(p).to_string()
        },
        context_token: format!(r#"{{"ns":"{ns}","nodeName":"node-{}"}}"#, p.pod % 50),
    }
}

fn outbound_spec(p: Proxy, cluster: &Cluster) -> TrafficSpec {
    TrafficSpec {
        source_workload: workload(p, cluster),
        target: Some(traffic_spec::Target::Addr(TcpAddress::from(target_addr(p)))),
    }
}

fn inbound_spec(p: Proxy, cluster: &Cluster) -> PortSpec {
    PortSpec {
        workload: workload(p, cluster),
        port: 8080,
    }
}

/// Stream `id` of `api` for proxy `p`, as the raw client opens it.
fn raw_open(
    api: Api,
    id: u32,
    p: Proxy,
    cluster: &Cluster,
    permit: OwnedSemaphorePermit,
) -> raw::Open {
    use prost::Message as _;
    let (path, message) = match api {
        Api::Get => (
            "/io.linkerd.proxy.destination.Destination/Get",
            destination_request(api, p, cluster).encode_to_vec(),
        ),
        Api::Profile => (
            "/io.linkerd.proxy.destination.Destination/GetProfile",
            destination_request(api, p, cluster).encode_to_vec(),
        ),
        Api::Outbound => (
            "/io.linkerd.proxy.outbound.OutboundPolicies/Watch",
            outbound_spec(p, cluster).encode_to_vec(),
        ),
        Api::Inbound => (
            "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort",
            inbound_spec(p, cluster).encode_to_vec(),
        ),
    };
    raw::Open {
        id,
        path,
        message,
        adds_only: api == Api::Get,
        permit,
    }
}

/// Opens stream `id` of `api` for proxy `p` on `ch` and follows it.
async fn stream_task(
    api: Api,
    id: u32,
    ch: Channel,
    p: Proxy,
    cluster: Arc<Cluster>,
    permit: OwnedSemaphorePermit,
    tx: mpsc::UnboundedSender<Event>,
) {
    let refused = |s: tonic::Status| {
        let _ = tx.send(Event::First(id, Err(status_text(&s))));
    };
    match api {
        Api::Get | Api::Profile => {
            let mut client = DestinationClient::new(ch);
            let req = destination_request(api, p, &cluster);
            if api == Api::Get {
                match client.get(req).await {
                    Ok(r) => {
                        let adds = |u: &linkerd2_proxy_api::destination::Update| {
                            matches!(u.update, Some(update::Update::Add(_)))
                        };
                        follow(id, r.into_inner(), adds, permit, tx).await
                    }
                    Err(s) => refused(s),
                }
            } else {
                match client.get_profile(req).await {
                    Ok(r) => follow(id, r.into_inner(), |_| true, permit, tx).await,
                    Err(s) => refused(s),
                }
            }
        }
        Api::Outbound => {
            match OutboundPoliciesClient::new(ch)
                .watch(outbound_spec(p, &cluster))
                .await
            {
                Ok(r) => follow(id, r.into_inner(), |_| true, permit, tx).await,
                Err(s) => refused(s),
            }
        }
        Api::Inbound => {
            match InboundServerPoliciesClient::new(ch)
                .watch_port(inbound_spec(p, &cluster))
                .await
            {
                Ok(r) => follow(id, r.into_inner(), |_| true, permit, tx).await,
                Err(s) => refused(s),
            }
        }
    }
}

type StreamFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A task that polls the stream futures it is sent, all together.
fn driver() -> mpsc::UnboundedSender<StreamFuture> {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let (tx, mut rx) = mpsc::unbounded_channel::<StreamFuture>();
    tokio::spawn(async move {
        let mut streams = FuturesUnordered::new();
        loop {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(f) => streams.push(f),
                    None => break,
                },
                Some(()) = streams.next(), if !streams.is_empty() => {}
            }
        }
        // No more streams come: follow those open to their end.
        while streams.next().await.is_some() {}
    });
    tx
}

/// A stream the bench opened: its API and the Service it watches (for
/// WatchPort: its pod's Service).
#[derive(Clone, Copy)]
struct Opened {
    api: Api,
    service: usize,
}

/// Controller memory at one moment, KiB: VmRSS, VmHWM, jemalloc allocated
/// and resident (from its /metrics).
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss: u64,
    hwm: u64,
    allocated: u64,
    resident: u64,
}

async fn mem(c: &Controller) -> anyhow::Result<Mem> {
    let (rss, hwm) = rss(c.pid());
    let allocated = allocated(&c.admin).await;
    let resident = metric(&c.admin, "process_memory_resident_bytes ")
        .await
        .map(|b| (b / 1024.0) as u64)
        .unwrap_or(0);
    anyhow::ensure!(
        rss > 0 && allocated > 0,
        "controller memory not measured (RSS {rss} KiB, allocated {allocated} KiB): \
         the process is gone or its /metrics did not answer"
    );
    Ok(Mem {
        rss,
        hwm,
        allocated,
        resident,
    })
}

/// The sum of the samples of `prefix` (a family name and, if wanted, the
/// start of its labels) on the controller's /metrics.
async fn metric(admin: &str, prefix: &str) -> Option<f64> {
    let (status, text) = http_get(admin, "/metrics").await;
    if status != 200 {
        return None;
    }
    Some(
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b),
    )
}

/// The bench's state: its connections, the streams it opened, what they said.
struct Bench {
    controller: Controller,
    cluster: Arc<Cluster>,
    channels: Vec<Channel>,
    /// Per connection (with `--client-tasks per-connection`): where its
    /// streams' futures go to be polled in its one task.
    drivers: Vec<mpsc::UnboundedSender<StreamFuture>>,
    client: Client,
    client_tasks: ClientTasks,
    /// With `--source kube`: the API server the controller watches.
    api: Option<ApiServer>,
    /// With `--client raw`: each connection's stream opener.
    raw: Vec<mpsc::UnboundedSender<raw::Open>>,
    streams: Vec<Opened>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    answered: usize,
    /// Streams refused or without a first message: (API, reason).
    refused: Vec<(Api, String)>,
    /// Streams that ended after their first message.
    ended: Vec<(Api, String)>,
    /// Updates on streams while they were opening or outside any round.
    stray_updates: usize,
    opening: Arc<Semaphore>,
}

impl Bench {
    fn handle(&mut self, ev: Event) -> Option<(u32, Instant)> {
        match ev {
            Event::First(_, Ok(())) => self.answered += 1,
            Event::First(id, Err(why)) => {
                self.answered += 1;
                self.refused.push((self.streams[id as usize].api, why));
            }
            Event::Update(id, at) => return Some((id, at)),
            Event::Ended(id, why) => self.ended.push((self.streams[id as usize].api, why)),
        }
        None
    }

    async fn channel(&mut self, i: usize) -> anyhow::Result<Channel> {
        while self.channels.len() <= i {
            let ch = Channel::from_shared(format!("http://{}", self.controller.grpc))?
                .connect_timeout(WAIT)
                .connect()
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "connection {} to the controller: {e} (too few file descriptors? \
                         raise them with `ulimit -n`; or the controller's bound on \
                         connections per listener, 10,000, with its listen backlog full)",
                        self.channels.len() + 1
                    )
                })?;
            self.channels.push(ch);
        }
        Ok(self.channels[i].clone())
    }

    async fn raw_connection(
        &mut self,
        i: usize,
    ) -> anyhow::Result<mpsc::UnboundedSender<raw::Open>> {
        while self.raw.len() <= i {
            let addr: SocketAddr = self.controller.grpc.parse()?;
            let n = self.raw.len() + 1;
            match tokio::time::timeout(WAIT, raw::connect(addr, self.tx.clone())).await {
                Ok(Ok(conn)) => self.raw.push(conn),
                Ok(Err(e)) => anyhow::bail!("connection {n} to the controller: {e}"),
                Err(_) => anyhow::bail!(
                    "connection {n} to the controller: no answer in {} s",
                    WAIT.as_secs()
                ),
            }
        }
        Ok(self.raw[i].clone())
    }

    /// Opens `api`'s stream for every proxy and waits for every first
    /// message (or refusal); the time that took.
    async fn open(
        &mut self,
        api: Api,
        proxies: &[Proxy],
        per_connection: usize,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let target = self.streams.len() + proxies.len();
        for (k, p) in proxies.iter().enumerate() {
            let permit = self.opening.clone().acquire_owned().await?;
            let c = k / per_connection;
            let id = self.streams.len() as u32;
            self.streams.push(Opened {
                api,
                service: if api == Api::Inbound {
                    p.pod / self.cluster.per_service
                } else {
                    p.target
                },
            });
            if self.client == Client::Raw {
                let conn = self.raw_connection(c).await?;
                let open = raw_open(api, id, *p, &self.cluster, permit);
                anyhow::ensure!(conn.send(open).is_ok(), "connection {c} is gone");
                continue;
            }
            let ch = self.channel(c).await?;
            let task = stream_task(
                api,
                id,
                ch,
                *p,
                self.cluster.clone(),
                permit,
                self.tx.clone(),
            );
            match self.client_tasks {
                ClientTasks::PerStream => drop(tokio::spawn(task)),
                ClientTasks::PerConnection => {
                    while self.drivers.len() <= c {
                        self.drivers.push(driver());
                    }
                    anyhow::ensure!(
                        self.drivers[c].send(Box::pin(task)).is_ok(),
                        "connection {c}'s stream driver is gone"
                    );
                }
            }
            while let Ok(ev) = self.rx.try_recv() {
                if self.handle(ev).is_some() {
                    self.stray_updates += 1;
                }
            }
        }
        while self.answered < target {
            let before = self.answered;
            match tokio::time::timeout(OPEN_STALL, self.rx.recv()).await {
                Ok(Some(ev)) => {
                    if self.handle(ev).is_some() {
                        self.stray_updates += 1;
                    }
                }
                Ok(None) => anyhow::bail!("every stream task is gone"),
                Err(_) => {
                    self.controller.running()?;
                    anyhow::bail!(
                        "{}: {} of {} streams answered; none more in {} s",
                        api.name(),
                        before,
                        target,
                        OPEN_STALL.as_secs()
                    )
                }
            }
        }
        Ok(started.elapsed())
    }

    /// Takes the events that are waiting.
    fn drain(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            if self.handle(ev).is_some() {
                self.stray_updates += 1;
            }
        }
    }
}

/// Latencies of one set of change rounds.
#[derive(Default)]
struct Rounds {
    /// Write to the update on each expected stream, by API (Get, Outbound).
    get: Vec<Duration>,
    outbound: Vec<Duration>,
    /// Write to the update on the last expected stream, per round.
    until_last: Vec<Duration>,
    /// `until_last` in round order (ms), for the report's last lines.
    in_order: Vec<u64>,
    /// `first` in round order (ms, one decimal).
    first_in_order: Vec<f64>,
    /// When each round's write happened (UTC, seconds since the epoch), to
    /// lay slow rounds beside the controller's own clock (a trace).
    written_at: Vec<f64>,
    /// Write to the update on the first expected stream, per round: the
    /// source's and the index's part, before the fan-out.
    first: Vec<Duration>,
    /// With `--source kube`, per round: the write until the bench's API
    /// server had stored and broadcast the changes, and until its first watch
    /// handed an event line to its connection (hyper's write follows).
    applied: Vec<Duration>,
    line_out: Vec<Duration>,
    /// With `--source kube`: each expected stream's update timed from that
    /// first watch line instead of the write: the controller's part and the
    /// reader's, without the bench's API server.
    from_line_out: Vec<Duration>,
    /// Updates on streams of other Services or APIs (by API).
    others: [usize; 4],
    /// Second updates on an expected stream within a round.
    repeats: usize,
    /// Load average (1 min) when the set ended.
    load: String,
    /// CPU of other processes (neither this bench's nor the kernel's) during
    /// the set, in cores; whether a compiler ran.
    foreign: (f64, bool),
    /// CPU time per round: the controller's, the bench's (ms).
    cpu: (f64, f64),
    /// With --quiet-wait: whether the machine went quiet before the set.
    quiet: Option<bool>,
}

impl Rounds {
    fn all(&self) -> Vec<Duration> {
        let mut v: Vec<Duration> = self.get.iter().chain(&self.outbound).copied().collect();
        v.sort();
        v
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// `rounds` changes to the hot Service, each timed to its last expected
/// stream. `generation` counts changes across sets.
async fn rounds(
    b: &mut Bench,
    dir: &Path,
    o: &Opts,
    generation: &mut usize,
) -> anyhow::Result<Rounds> {
    let mut out = Rounds::default();
    let tck = clock_ticks();
    if !o.quiet_wait.is_zero() {
        let patience = o.quiet_wait;
        let (_, quiet) =
            tokio::task::spawn_blocking(move || wait_for_quiet(tck, 0.3, patience)).await?;
        out.quiet = Some(quiet);
    }
    let monitor = ForeignMonitor::start(tck);
    let cpu_before = (cpu_ticks(b.controller.pid()), cpu_ticks(std::process::id()));
    let endpoints = matches!(o.change, Change::Endpoints | Change::Both);
    let route = matches!(o.change, Change::Route | Change::Both);
    let expected: Vec<bool> = b
        .streams
        .iter()
        .map(|s| {
            s.service == 0
                && ((s.api == Api::Get && endpoints) || (s.api == Api::Outbound && route))
        })
        .collect();
    let want = expected.iter().filter(|e| **e).count();
    anyhow::ensure!(
        want > 0,
        "no stream watches what --change {:?} changes (--mix, --hot-share)",
        o.change
    );
    let path = dir.join(format!("{}.yaml", Cluster::name(0)));
    // With the API server: the objects of the Service's file as applied
    // last, to apply only what a change changed.
    let mut applied = match b.api {
        None => Vec::new(),
        Some(_) => documents(&b.cluster.file(0, 0, 0))?,
    };
    for r in 0..o.rounds {
        *generation += 1;
        let g = *generation;
        let text = b
            .cluster
            .file(0, if endpoints { g } else { 0 }, if route { g } else { 0 });
        let changed: Vec<serde_json::Value> = match b.api {
            None => Vec::new(),
            Some(_) => {
                let docs = documents(&text)?;
                let changed = docs
                    .iter()
                    .filter(|d| !applied.contains(d))
                    .cloned()
                    .collect();
                applied = docs;
                changed
            }
        };
        b.drain();
        let mut seen = vec![false; b.streams.len()];
        let t0 = Instant::now();
        out.written_at.push(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        );
        match &b.api {
            None => write_atomic(&path, &text)?,
            Some(api) => {
                api.mark_watch_lines();
                for doc in changed {
                    api.try_apply(doc).map_err(anyhow::Error::msg)?;
                }
                out.applied.push(t0.elapsed());
            }
        }
        let mut arrivals = Vec::with_capacity(want);
        let mut got = 0;
        let mut last = t0;
        let mut first = None;
        while got < want {
            let ev = match tokio::time::timeout(WAIT, b.rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => anyhow::bail!("every stream task is gone"),
                Err(_) => {
                    b.controller.running()?;
                    anyhow::bail!(
                        "change {} (round {}): {got} of {want} streams of the hot Service had \
                         the update; none more in {} s",
                        g,
                        r + 1,
                        WAIT.as_secs()
                    )
                }
            };
            let Some((id, at)) = b.handle(ev) else {
                anyhow::ensure!(
                    b.ended.is_empty(),
                    "a stream ended during change {g}: {:?}",
                    b.ended[0]
                );
                continue;
            };
            let id = id as usize;
            if !expected[id] {
                out.others[b.streams[id].api as usize] += 1;
            } else if seen[id] {
                out.repeats += 1;
            } else {
                seen[id] = true;
                got += 1;
                let took = at - t0;
                arrivals.push(at);
                match b.streams[id].api {
                    Api::Get => out.get.push(took),
                    _ => out.outbound.push(took),
                }
                last = last.max(at);
                first = Some(first.unwrap_or(at).min(at));
            }
        }
        if let Some(line) = b
            .api
            .as_ref()
            .and_then(|api| api.first_watch_line_since_mark())
        {
            out.line_out.push(line.saturating_duration_since(t0));
            out.from_line_out
                .extend(arrivals.iter().map(|at| at.saturating_duration_since(line)));
        }
        out.until_last.push(last - t0);
        out.in_order.push((last - t0).as_millis() as u64);
        out.first.push(first.unwrap_or(t0) - t0);
        out.first_in_order
            .push(((first.unwrap_or(t0) - t0).as_secs_f64() * 1e4).round() / 10.0);
        // What else this write sent arrives now; then the source's rescan
        // is over before the next write.
        tokio::time::sleep(o.round_gap).await;
        while let Ok(ev) = b.rx.try_recv() {
            if let Some((id, _)) = b.handle(ev) {
                let id = id as usize;
                if expected[id] {
                    out.repeats += 1;
                } else {
                    out.others[b.streams[id].api as usize] += 1;
                }
            }
        }
    }
    out.get.sort();
    out.outbound.sort();
    out.until_last.sort();
    out.first.sort();
    out.applied.sort();
    out.line_out.sort();
    out.from_line_out.sort();
    let per_round = |ticks: u64| ticks as f64 / tck * 1e3 / o.rounds as f64;
    out.cpu = (
        per_round(cpu_ticks(b.controller.pid()).saturating_sub(cpu_before.0)),
        per_round(cpu_ticks(std::process::id()).saturating_sub(cpu_before.1)),
    );
    let foreign = monitor.finish();
    out.foreign = (foreign.cores(), foreign.rustc);
    out.load = loadavg();
    Ok(out)
}

/// The soft limit on this process's open files, from /proc.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Growth from `a` to `b` per stream, in KB (1,000 bytes).
fn per(a: u64, b: u64, n: usize) -> String {
    format!(
        "{:.2} KB",
        b.saturating_sub(a) as f64 * 1.024 / n.max(1) as f64
    )
}

/// What the run measured, printed whether it ended well or not.
#[derive(Default)]
struct Report {
    header: Vec<String>,
    ready: Option<Duration>,
    loaded: Option<Mem>,
    /// Per API phase: streams, time to open, memory after.
    phases: Vec<(Api, usize, Duration, Mem)>,
    sets: Vec<(String, Rounds, Mem)>,
    client: (u64, u64),
    counters: Vec<(String, f64)>,
    refused: Vec<(Api, String)>,
    ended: Vec<(Api, String)>,
    stray_updates: usize,
    connections: usize,
}

impl Report {
    fn print(&self) {
        for l in &self.header {
            println!("{l}");
        }
        println!();
        let Some(loaded) = self.loaded else {
            return;
        };
        println!("| | figure |");
        println!("|---|---|");
        if let Some(ready) = self.ready {
            println!("| time to ready | {} |", ms(ready));
        }
        println!(
            "| after load: RSS / VmHWM / allocated / jemalloc resident | {} / {} / {} / {} |",
            mib(loaded.rss),
            mib(loaded.hwm),
            mib(loaded.allocated),
            mib(loaded.resident)
        );
        let total: usize = self.phases.iter().map(|p| p.1).sum();
        if let Some(&(_, _, _, last)) = self.phases.last() {
            let took: Duration = self.phases.iter().map(|p| p.2).sum();
            println!(
                "| streams open | {total} over {} HTTP/2 connections |",
                self.connections
            );
            println!("| time to open them all (phases added) | {} |", ms(took));
            println!(
                "| **with every stream open: RSS / VmHWM / allocated / jemalloc resident** | **{}** / {} / {} / {} |",
                mib(last.rss),
                mib(last.hwm),
                mib(last.allocated),
                mib(last.resident)
            );
            println!(
                "| per open stream (growth over the loaded controller): RSS / allocated | {} / {} |",
                per(loaded.rss, last.rss, total),
                per(loaded.allocated, last.allocated, total)
            );
        }
        for (name, _, m) in &self.sets {
            println!("| VmHWM after the rounds {name} | {} |", mib(m.hwm));
        }
        println!(
            "| the bench client itself: RSS / VmHWM | {} / {} |",
            mib(self.client.0),
            mib(self.client.1)
        );
        println!();
        if !self.phases.is_empty() {
            println!("Opening, API by API (each proxy's stream of that API):");
            println!();
            println!("| API | streams open | time to open | RSS after | allocated after | RSS per stream | allocated per stream |");
            println!("|---|---|---|---|---|---|---|");
            let mut before = loaded;
            for &(api, n, took, m) in &self.phases {
                println!(
                    "| {} | {n} | {} | {} | {} | {} | {} |",
                    api.name(),
                    ms(took),
                    mib(m.rss),
                    mib(m.allocated),
                    per(before.rss, m.rss, n),
                    per(before.allocated, m.allocated, n)
                );
                before = m;
            }
            println!();
        }
        if !self.sets.is_empty() {
            println!("Write of the hot Service's file -> update on each of its streams:");
            println!();
            println!("| rounds | streams per round | per stream p50 | **p99** | max | Get p99 | OutboundPolicies.Watch p99 | until the first stream, p50 | until the last, p50 / p99 |");
            println!("|---|---|---|---|---|---|---|---|---|");
            let p99 = |v: &[Duration]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    ms(percentile(v, 0.99))
                }
            };
            for (name, r, _) in &self.sets {
                let all = r.all();
                let n = all.len() / r.until_last.len().max(1);
                println!(
                    "| {name} | {n} | {} | **{}** | {} | {} | {} | {} | {} / {} |",
                    ms(percentile(&all, 0.5)),
                    ms(percentile(&all, 0.99)),
                    ms(percentile(&all, 1.0)),
                    p99(&r.get),
                    p99(&r.outbound),
                    ms(percentile(&r.first, 0.5)),
                    ms(percentile(&r.until_last, 0.5)),
                    ms(percentile(&r.until_last, 0.99)),
                );
            }
            println!();
            if self.sets.iter().any(|(_, r, _)| !r.line_out.is_empty()) {
                println!("The same rounds timed from the bench's API server (the write above is the bench applying the changed objects; a stream's update is timed here from the first watch event line the API server handed to its connection, whatever stream it was for):");
                println!();
                println!("| rounds | the apply itself, p50 / p99 | write to the first watch line, p50 / p99 | first watch line to each stream's update: p50 | **p99** | max |");
                println!("|---|---|---|---|---|---|");
                for (name, r, _) in &self.sets {
                    if r.line_out.is_empty() {
                        continue;
                    }
                    println!(
                        "| {name} | {} / {} | {} / {} | {} | **{}** | {} |",
                        ms(percentile(&r.applied, 0.5)),
                        ms(percentile(&r.applied, 0.99)),
                        ms(percentile(&r.line_out, 0.5)),
                        ms(percentile(&r.line_out, 0.99)),
                        ms(percentile(&r.from_line_out, 0.5)),
                        ms(percentile(&r.from_line_out, 0.99)),
                        ms(percentile(&r.from_line_out, 1.0)),
                    );
                }
                println!();
            }
            println!("| rounds | other processes' CPU (cores) | load avg after | CPU per round: controller / bench | controller CPU per stream updated |");
            println!("|---|---|---|---|---|");
            for (name, r, _) in &self.sets {
                let n = r.all().len() / r.until_last.len().max(1);
                println!(
                    "| {name} | {:.2}{} | {} | {:.0} / {:.0} ms | {:.1} µs |",
                    r.foreign.0,
                    match (r.foreign.1, r.quiet) {
                        (true, Some(false)) => " (a compiler ran; never quiet before)",
                        (true, _) => " (a compiler ran)",
                        (false, Some(false)) => " (never quiet before)",
                        (false, _) => "",
                    },
                    r.load,
                    r.cpu.0,
                    r.cpu.1,
                    r.cpu.0 * 1e3 / n.max(1) as f64,
                );
            }
            println!();
            for (name, r, _) in &self.sets {
                println!(
                    "rounds {name}: updates on other streams, by API (Get, GetProfile, \
                     Outbound, Inbound): {:?}; second updates on a hot stream: {}",
                    r.others, r.repeats
                );
                println!(
                    "  until the last stream, round by round (ms): {:?}",
                    r.in_order
                );
                println!(
                    "  until the first stream, round by round (ms): {:?}",
                    r.first_in_order
                );
                let mut slow: Vec<usize> = (0..r.in_order.len()).collect();
                slow.sort_by_key(|i| std::cmp::Reverse(r.in_order[*i]));
                let slow: Vec<String> = slow
                    .iter()
                    .take(3)
                    .map(|&i| {
                        let t = r.written_at[i];
                        format!(
                            "round {} ({} ms) written at {:02}:{:02}:{:06.3} UTC",
                            i + 1,
                            r.in_order[i],
                            (t / 3600.0) as u64 % 24,
                            (t / 60.0) as u64 % 60,
                            t % 60.0
                        )
                    })
                    .collect();
                println!("  slowest: {}", slow.join("; "));
            }
        }
        println!(
            "updates while opening or between rounds: {}",
            self.stray_updates
        );
        println!(
            "streams refused or unanswered: {}; streams ended: {}",
            self.refused.len(),
            self.ended.len()
        );
        for (what, list) in [("refused", &self.refused), ("ended", &self.ended)] {
            for api in Api::ALL {
                let of: Vec<&String> = list
                    .iter()
                    .filter(|(a, _)| *a == api)
                    .map(|(_, w)| w)
                    .collect();
                if let Some(first) = of.first() {
                    println!("  {what} {}: {} (first: {first})", api.name(), of.len());
                }
            }
        }
        if !self.counters.is_empty() {
            println!();
            println!("controller counters at the end:");
            for (name, v) in &self.counters {
                println!("  {name} {v}");
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`",
        o.ballast.display()
    );
    let mut report = Report::default();
    let result = run(&o, &mut report).await;
    report.client = rss(std::process::id());
    report.print();
    result
}

async fn run(o: &Opts, report: &mut Report) -> anyhow::Result<()> {
    let cluster = Arc::new(Cluster::new(o));
    let (proxies, hot) = proxies(o, &cluster);
    let connections = o.proxies.div_ceil(o.proxies_per_connection);
    let per_connection = o.proxies_per_connection * o.mix.len();
    // Each connection is a descriptor here and one in the controller (a
    // child: it has this process's limits).
    if open_files_limit().is_some_and(|l| l < connections as u64 + 512) {
        raise_nofile(connections as u64 + 1024);
    }
    if let Some(limit) = open_files_limit() {
        anyhow::ensure!(
            limit >= connections as u64 + 512,
            "{connections} connections need more open files than the limit ({limit}): \
             raise it with `ulimit -Hn {0}; ulimit -n {0}` (or --proxies-per-connection)",
            connections + 1024
        );
    }

    let dir = tempfile::tempdir()?;
    if let Some(keep) = &o.keep {
        std::fs::create_dir_all(keep)?;
    }
    // The cluster goes where the controller reads it: files, or objects in
    // the API server.
    let api = match o.source {
        Source::Manifests => None,
        Source::Kube => Some(ApiServer::start().await),
    };
    let mut bytes = 0;
    for i in 0..o.services {
        let text = cluster.file(i, 0, 0);
        bytes += text.len();
        match &api {
            None => write_atomic(
                &dir.path().join(format!("{}.yaml", Cluster::name(i))),
                &text,
            )?,
            Some(api) => {
                for doc in documents(&text)? {
                    api.try_apply(doc).map_err(anyhow::Error::msg)?;
                }
            }
        }
        if let Some(keep) = &o.keep {
            write_atomic(&keep.join(format!("{}.yaml", Cluster::name(i))), &text)?;
        }
    }
    let count = |api: Api| {
        if o.mix.contains(&api) {
            o.proxies
        } else {
            0
        }
    };
    let destination_streams = count(Api::Get) + count(Api::Profile);
    let policy_streams = count(Api::Outbound) + count(Api::Inbound);
    let mut args = match &api {
        None => vec!["--manifests".to_string(), dir.path().display().to_string()],
        Some(api) => vec![
            "--kubeconfig".to_string(),
            api.write_kubeconfig(dir.path()).display().to_string(),
        ],
    };
    args.extend(["--memory-limit".to_string(), o.memory_limit.clone()]);
    // The defaults (20,000 each, 1,000 per connection) raised only where
    // the bench needs more.
    if destination_streams > 20_000 {
        args.extend(["--max-streams".into(), destination_streams.to_string()]);
    }
    if policy_streams > 20_000 {
        args.extend(["--max-policy-streams".into(), policy_streams.to_string()]);
    }
    if per_connection > 1_000 {
        args.extend([
            "--http2-max-concurrent-streams".into(),
            per_connection.to_string(),
        ]);
    }
    report.header.push(format!(
        "scale-bench: {} pods in {} Services ({} per Service), {} HTTPRoutes, {} Servers \
         ({} files, {:.1} MB of YAML); {} proxies ({hot} on the hot Service, {:.0}%), \
         each opening {}: {} streams over {connections} HTTP/2 connections ({} proxies, \
         {per_connection} streams each; the bench's streams polled {})",
        cluster.pods(),
        o.services,
        cluster.per_service,
        o.routes,
        o.servers,
        o.services,
        bytes as f64 / 1e6,
        o.proxies,
        o.hot_share * 100.0,
        o.mix
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", "),
        o.proxies * o.mix.len(),
        o.proxies_per_connection,
        match (o.client, o.client_tasks) {
            (Client::Raw, _) => "by the raw HTTP/2 client, one task per connection",
            (Client::Tonic, ClientTasks::PerConnection) => "by tonic, in one task per connection",
            (Client::Tonic, ClientTasks::PerStream) => "by tonic, each in a task of its own",
        },
    ));
    report.header.push(format!(
        "controller: {} destination {} (cluster read from {})",
        o.ballast.display(),
        args[2..].join(" "),
        match o.source {
            Source::Manifests => "a manifests directory; a change is a file rewritten",
            Source::Kube => "testkit's API server; a change is the changed objects applied",
        }
    ));
    let (controller, ready) = start(&o.ballast, &args).await?;
    report.ready = Some(ready);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let loaded = mem(&controller).await?;
    report.loaded = Some(loaded);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut b = Bench {
        controller,
        cluster: cluster.clone(),
        channels: Vec::new(),
        drivers: Vec::new(),
        client: o.client,
        client_tasks: o.client_tasks,
        raw: Vec::new(),
        api,
        streams: Vec::with_capacity(o.proxies * o.mix.len()),
        tx,
        rx,
        answered: 0,
        refused: Vec::new(),
        ended: Vec::new(),
        stray_updates: 0,
        opening: Arc::new(Semaphore::new(o.open_concurrency)),
    };
    let result = measure(o, &mut b, &proxies, dir.path(), report).await;
    b.drain();
    report.connections = b.channels.len().max(b.raw.len());
    report.refused = std::mem::take(&mut b.refused);
    report.ended = std::mem::take(&mut b.ended);
    report.stray_updates = b.stray_updates;
    for prefix in [
        "destination_streams{",
        "policy_streams{",
        "destination_subscriptions{",
        "policy_subscriptions{",
        "destination_streams_refused_total",
        "policy_streams_refused_total",
        "destination_stream_overflows_total",
        "memory_refused_total",
        "memory_closed_total",
        "memory_pressure",
        "memory_limit_bytes",
        "policy_invalid_routes",
    ] {
        if let Some(v) = metric(&b.controller.admin, prefix).await {
            report
                .counters
                .push((prefix.trim_end_matches('{').into(), v));
        }
    }
    let alive = b.controller.running();
    result?;
    alive?;
    anyhow::ensure!(
        report.refused.is_empty() && report.ended.is_empty(),
        "the controller did not serve every stream: {} refused or unanswered, {} ended \
         (see above)",
        report.refused.len(),
        report.ended.len()
    );
    Ok(())
}

async fn measure(
    o: &Opts,
    b: &mut Bench,
    proxies: &[Proxy],
    dir: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    for &api in &o.mix {
        let refused = b.refused.len();
        let took = b.open(api, proxies, o.proxies_per_connection).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let m = mem(&b.controller).await?;
        // The streams of this phase that were served.
        let served = proxies.len() - (b.refused.len() - refused);
        report.phases.push((api, served, took, m));
        b.controller.running()?;
        anyhow::ensure!(
            b.refused.is_empty() && b.ended.is_empty(),
            "{}: {} streams refused or unanswered, {} ended (first: {:?})",
            api.name(),
            b.refused.len(),
            b.ended.len(),
            b.refused.first().or(b.ended.first())
        );
    }
    if o.rounds == 0 {
        return b.controller.running();
    }
    let mut generation = 0;
    let quiet = rounds(b, dir, o, &mut generation).await?;
    let m = mem(&b.controller).await?;
    report
        .sets
        .push((format!("{}, no CPU hog", o.rounds), quiet, m));
    if o.busy > 0 {
        let mut hogs = hogs(o.busy)?;
        // Let the hogs take their share of the cores first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy = rounds(b, dir, o, &mut generation).await;
        for h in &mut hogs {
            let _ = h.kill().await;
        }
        let busy = busy?;
        let m = mem(&b.controller).await?;
        report
            .sets
            .push((format!("{}, {} CPU hogs", o.rounds, o.busy), busy, m));
    }
    b.controller.running()?;
    Ok(())
}
