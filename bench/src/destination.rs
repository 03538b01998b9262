//! Destination controller benchmark (not a test).
//!
//! Generates a cluster of PODS pods in SERVICES services as manifests, starts
//! `ballast destination` on it and on an empty directory side by side, and
//! reports: time to ready, RSS (and growth per pod over the empty controller),
//! and the latency from writing one small changed manifest file to the update
//! arriving on every open `Get` stream watching the changed service, in two
//! scenarios run one after the other on the same controller:
//!
//! 1. STREAMS streams on one service (the hot one), ROUNDS changes to it;
//! 2. fan-out: COLD streams more on every service (the hot one included), so
//!    STREAMS + COLD x SERVICES streams are open; ROUNDS changes to the hot
//!    service alternate with ROUNDS changes to a cold one. Streams on services
//!    that did not change must get nothing (counted).
//!
//! Controller memory per open stream is the growth of its RSS and of
//! jemalloc's allocated bytes while the streams of each scenario open.
//!
//! It fails when a controller did not serve: one that exited (before ready
//! or during the run), a `Get` stream refused or without its first
//! message, a change that did not reach every stream of its service,
//! memory not read (a zero RSS or allocated figure).

use ballast_bench::{allocated, memory, percentile, rss, start, write_atomic, Controller, Memory};
use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, update, GetDestination,
};
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const USAGE: &str = "Usage: destination-bench [--ballast PATH] [--pods N] [--services N] \
[--streams N] [--cold-streams N (0: scenario 1 only)] [--rounds N] [--keep DIR]";

struct Opts {
    ballast: PathBuf,
    pods: usize,
    services: usize,
    streams: usize,
    /// Streams per service in the fan-out scenario.
    cold_streams: usize,
    rounds: usize,
    /// Also write the generated cluster here, and keep it.
    keep: Option<PathBuf>,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        pods: 10_000,
        services: 1_000,
        streams: 1_000,
        cold_streams: 10,
        rounds: 50,
        keep: None,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--pods" => o.pods = args.parse()?,
            "--services" => o.services = args.parse()?,
            "--streams" => o.streams = args.parse()?,
            "--cold-streams" => o.cold_streams = args.parse()?,
            "--rounds" => o.rounds = args.parse()?,
            "--keep" => o.keep = Some(args.value()?.into()),
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

/// Service `i` of the generated cluster: name, namespace, cluster IP.
fn service_of(i: usize) -> (String, String) {
    (format!("svc-{i}"), format!("ns-{}", i % 10))
}

/// One file per service: the Service and its pods, roughly as `kubectl get
/// -o yaml` prints them (labels, owners, conditions, a proxy container).
fn service_file(i: usize, pods_per_service: usize, generation: usize) -> String {
    let (name, ns) = service_of(i);
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
         labels: {{app: {name}}}\nspec:\n  clusterIP: 10.96.{}.{}\n  selector: {{app: {name}}}\n  \
         ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: http\n",
        i / 250,
        i % 250 + 1
    );
    for p in 0..pods_per_service {
        let n = i * pods_per_service + p;
        // Generation changes the last pod's IP: a small, real change.
        let shift = if p == pods_per_service - 1 {
            generation
        } else {
            0
        };
        let ip = format!(
            "10.{}.{}.{}",
            1 + (n + shift * 7919) / 62_500 % 200,
            (n + shift * 7919) / 250 % 250,
            (n + shift * 7919) % 250 + 1
        );
        out.push_str(&format!(
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
        ));
    }
    out
}

/// An `Add` seen on a stream after its first message: which service the
/// stream watches, and when it arrived.
struct Arrival {
    service: usize,
    at: Instant,
}

/// Growth per stream, in KB (1,000 bytes), from `before` to `after`.
fn per_stream(before: Memory, after: Memory, streams: usize) -> (f64, f64) {
    let kb =
        |a: u64, b: u64| (b.saturating_sub(a)) as f64 * 1024.0 / 1000.0 / streams.max(1) as f64;
    (
        kb(before.rss, after.rss),
        kb(before.allocated, after.allocated),
    )
}

/// The open streams' clients: connections of at most 100 streams each, as
/// proxies would spread them.
struct Streams {
    clients: Vec<DestinationClient<Channel>>,
    next: usize,
    arrivals: mpsc::UnboundedSender<Arrival>,
    /// Each stream's first message, or why it had none.
    ready_tx: mpsc::UnboundedSender<Result<(), String>>,
    ready_rx: mpsc::UnboundedReceiver<Result<(), String>>,
    open: usize,
}

impl Streams {
    /// Opens `n` streams on service `service` and waits for the first
    /// message on each.
    async fn open(&mut self, c: &Controller, service: usize, n: usize) -> anyhow::Result<()> {
        let (name, ns) = service_of(service);
        let path = format!("{name}.{ns}.svc.cluster.local:80");
        for _ in 0..n {
            if self.next.is_multiple_of(100) {
                let ch = Channel::from_shared(format!("http://{}", c.grpc))?
                    .connect()
                    .await?;
                self.clients.push(DestinationClient::new(ch));
            }
            let mut client = self.clients[self.next / 100].clone();
            self.next += 1;
            let req = GetDestination {
                scheme: "k8s".into(),
                path: path.clone(),
                context_token: String::new(),
            };
            let tx = self.arrivals.clone();
            let ready_tx = self.ready_tx.clone();
            tokio::spawn(async move {
                let resp = match client.get(req).await {
                    Ok(resp) => resp,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("Get refused: {e}")));
                        return;
                    }
                };
                let mut stream = resp.into_inner();
                // The initial set.
                match stream.message().await {
                    Ok(Some(_)) => {
                        let _ = ready_tx.send(Ok(()));
                    }
                    other => {
                        let _ = ready_tx.send(Err(format!("no first message: {other:?}")));
                        return;
                    }
                }
                while let Ok(Some(msg)) = stream.message().await {
                    if matches!(msg.update, Some(update::Update::Add(_))) {
                        let _ = tx.send(Arrival {
                            service,
                            at: Instant::now(),
                        });
                    }
                }
            });
        }
        Ok(())
    }

    /// Waits until every stream opened so far has had its first message.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        while self.open < self.next {
            tokio::time::timeout(Duration::from_secs(60), self.ready_rx.recv())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{} of {} Get streams had their first message; none more in 60 s",
                        self.open,
                        self.next
                    )
                })?
                .ok_or_else(|| anyhow::anyhow!("streams ended"))?
                .map_err(|e| anyhow::anyhow!("a Get stream: {e}"))?;
            self.open += 1;
        }
        Ok(())
    }
}

/// Latencies of change rounds.
#[derive(Default)]
struct Latencies {
    /// Manifest write to arrival, every affected stream.
    per_stream: Vec<Duration>,
    /// Manifest write to arrival on the last affected stream, per round.
    until_last: Vec<Duration>,
    /// Adds that arrived on streams of services that did not change.
    strays: usize,
}

impl Latencies {
    fn sort(&mut self) {
        self.per_stream.sort();
        self.until_last.sort();
    }
}

/// Rewrites service `service`'s file (one pod's IP changed, `generation`)
/// and times the update's arrival on the `affected` streams watching it.
async fn round(
    dir: &Path,
    per_service: usize,
    service: usize,
    generation: usize,
    affected: usize,
    arrivals: &mut mpsc::UnboundedReceiver<Arrival>,
    out: &mut Latencies,
) -> anyhow::Result<()> {
    let contents = service_file(service, per_service, generation);
    let t0 = Instant::now();
    write_atomic(&dir.join(format!("svc-{service}.yaml")), &contents)?;
    let mut last = t0;
    let mut got = 0;
    while got < affected {
        let a = tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "svc-{service} changed: {got} of {affected} streams had the update; \
                     none more in 10 s"
                )
            })?
            .ok_or_else(|| anyhow::anyhow!("streams ended"))?;
        if a.service != service {
            out.strays += 1;
            continue;
        }
        got += 1;
        out.per_stream.push(a.at - t0);
        last = last.max(a.at);
    }
    out.until_last.push(last - t0);
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn latency_rows(name: &str, l: &Latencies, streams: usize) {
    println!(
        "| {name}: per stream | {} | {} | {} |",
        ms(percentile(&l.per_stream, 0.5)),
        ms(percentile(&l.per_stream, 0.99)),
        ms(percentile(&l.per_stream, 1.0))
    );
    println!(
        "| {name}: until the last of {streams} streams | {} | {} | {} |",
        ms(percentile(&l.until_last, 0.5)),
        ms(percentile(&l.until_last, 0.99)),
        ms(percentile(&l.until_last, 1.0))
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`",
        o.ballast.display()
    );
    anyhow::ensure!(o.services >= 2, "--services must be at least 2");
    anyhow::ensure!(
        o.pods >= o.services,
        "--pods must be at least --services (a changed service needs a pod)"
    );
    anyhow::ensure!(
        o.streams >= 1 && o.rounds >= 1,
        "nothing to measure: --streams and --rounds must be at least 1"
    );
    let per_service = o.pods / o.services;
    let empty = tempfile::tempdir()?;
    let cluster = tempfile::tempdir()?;
    if let Some(keep) = &o.keep {
        std::fs::create_dir_all(keep)?;
    }
    for i in 0..o.services {
        let text = service_file(i, per_service, 0);
        write_atomic(&cluster.path().join(format!("svc-{i}.yaml")), &text)?;
        if let Some(keep) = &o.keep {
            write_atomic(&keep.join(format!("svc-{i}.yaml")), &text)?;
        }
    }
    let bytes: u64 = std::fs::read_dir(cluster.path())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();

    let args = |dir: &Path| {
        vec![
            "--max-streams".to_string(),
            "100000".to_string(),
            "--manifests".to_string(),
            dir.display().to_string(),
        ]
    };
    let (mut empty_c, empty_ready) = start(&o.ballast, &args(empty.path())).await?;
    let (mut full_c, full_ready) = start(&o.ballast, &args(cluster.path())).await?;
    // Let the allocator settle after the load, then read both side by side.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty_pid = empty_c.pid();
    let full_pid = full_c.pid();
    let (empty_rss, _) = rss(empty_pid);
    let (full_rss, full_hwm) = rss(full_pid);
    let empty_alloc = allocated(&empty_c.admin).await;
    let full_alloc = allocated(&full_c.admin).await;
    let loaded = memory(&full_c).await.measured("the loaded controller")?;
    Memory {
        rss: empty_rss,
        allocated: empty_alloc,
    }
    .measured("the empty controller")?;

    // Scenario 1: STREAMS streams on service 0.
    let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = mpsc::unbounded_channel();
    let mut streams = Streams {
        clients: Vec::new(),
        next: 0,
        arrivals: arrivals_tx,
        ready_tx,
        ready_rx,
        open: 0,
    };
    streams.open(&full_c, 0, o.streams).await?;
    streams.wait_ready().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hot_open = memory(&full_c)
        .await
        .measured("the controller with streams")?;
    let streams_rss = hot_open.rss;

    let mut generation = 0;
    let mut hot = Latencies::default();
    for _ in 0..o.rounds {
        generation += 1;
        round(
            cluster.path(),
            per_service,
            0,
            generation,
            o.streams,
            &mut arrivals,
            &mut hot,
        )
        .await?;
    }
    hot.sort();
    let (_, hwm_after) = rss(full_pid);

    // Scenario 2: COLD streams more on every service.
    let mut fanout = None;
    if o.cold_streams > 0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = memory(&full_c).await.measured("the controller")?;
        for s in 0..o.services {
            streams.open(&full_c, s, o.cold_streams).await?;
        }
        streams.wait_ready().await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = memory(&full_c)
            .await
            .measured("the controller with streams")?;
        let mut hot2 = Latencies::default();
        let mut cold = Latencies::default();
        let mut cold_generation = vec![0; o.services];
        for r in 0..o.rounds {
            generation += 1;
            round(
                cluster.path(),
                per_service,
                0,
                generation,
                o.streams + o.cold_streams,
                &mut arrivals,
                &mut hot2,
            )
            .await?;
            let s = 1 + (r * 37) % (o.services - 1);
            cold_generation[s] += 1;
            round(
                cluster.path(),
                per_service,
                s,
                cold_generation[s],
                o.cold_streams,
                &mut arrivals,
                &mut cold,
            )
            .await?;
        }
        hot2.sort();
        cold.sort();
        let mut all = Latencies {
            per_stream: hot2
                .per_stream
                .iter()
                .chain(&cold.per_stream)
                .copied()
                .collect(),
            ..Default::default()
        };
        all.sort();
        let (_, hwm) = rss(full_pid);
        fanout = Some((before, after, hot2, cold, all, hwm));
    }

    // Both controllers served the whole run: the figures are theirs.
    empty_c.running()?;
    full_c.running()?;

    let mb = |kib: u64| format!("{:.1} MB", kib as f64 / 1024.0);
    println!("destination controller, manifests source: {} pods in {} services ({} files, {:.1} MB of YAML)",
        o.pods, o.services, o.services, bytes as f64 / 1e6);
    println!();
    println!("| | empty controller | {} pods |", o.pods);
    println!("|---|---|---|");
    println!(
        "| time to ready | {} | {} |",
        ms(empty_ready),
        ms(full_ready)
    );
    println!("| RSS after load | {} | {} |", mb(empty_rss), mb(full_rss));
    println!("| peak RSS (VmHWM) during load | | {} |", mb(full_hwm));
    println!(
        "| allocated (jemalloc) after load | {} | {} |",
        mb(empty_alloc),
        mb(full_alloc)
    );
    println!(
        "| allocated growth per pod | | {:.2} KB |",
        (full_alloc.saturating_sub(empty_alloc)) as f64 * 1024.0 / 1000.0 / o.pods as f64
    );
    println!(
        "| RSS growth per pod | | {:.2} KB |",
        (full_rss.saturating_sub(empty_rss)) as f64 * 1024.0 / 1000.0 / o.pods as f64
    );
    println!(
        "| RSS with {} open Get streams | | {} |",
        o.streams,
        mb(streams_rss)
    );
    println!(
        "| peak RSS after {} change rounds | | {} |",
        o.rounds,
        mb(hwm_after)
    );
    println!();
    println!("Controller memory per open Get stream (growth while they opened):");
    println!();
    println!("| streams | RSS per stream | allocated per stream |");
    println!("|---|---|---|");
    let (r, a) = per_stream(loaded, hot_open, o.streams);
    println!(
        "| scenario 1: {} on one service | {r:.2} KB | {a:.2} KB |",
        o.streams
    );
    if let Some((before, after, ..)) = &fanout {
        let n = o.cold_streams * o.services;
        let (r, a) = per_stream(*before, *after, n);
        println!(
            "| fan-out: {n} more ({} on each of {} services) | {r:.2} KB | {a:.2} KB |",
            o.cold_streams, o.services
        );
        let total = n + o.streams;
        println!("| fan-out: all {total} open, RSS {} | | |", mb(after.rss));
    }
    println!();
    println!("Manifest write -> update on each affected stream:");
    println!();
    println!("| | p50 | p99 | max |");
    println!("|---|---|---|---|");
    latency_rows(&format!("scenario 1, {} rounds", o.rounds), &hot, o.streams);
    if let Some((_, _, hot2, cold, all, hwm)) = &fanout {
        let total = o.cold_streams * o.services + o.streams;
        latency_rows(
            &format!("fan-out ({total} open), hot service, {} rounds", o.rounds),
            hot2,
            o.streams + o.cold_streams,
        );
        latency_rows(
            &format!("fan-out ({total} open), cold service, {} rounds", o.rounds),
            cold,
            o.cold_streams,
        );
        println!(
            "| fan-out: per stream, hot and cold rounds together | {} | {} | {} |",
            ms(percentile(&all.per_stream, 0.5)),
            ms(percentile(&all.per_stream, 0.99)),
            ms(percentile(&all.per_stream, 1.0))
        );
        println!();
        println!(
            "updates on streams of unchanged services: {}; peak RSS after the fan-out rounds: {}",
            hot.strays + hot2.strays + cold.strays,
            mb(*hwm)
        );
    }
    drop(empty_c);
    drop(full_c);
    Ok(())
}
