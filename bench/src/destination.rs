//! Destination controller benchmark (not a test).
//!
//! Generates a cluster of PODS pods in SERVICES services as manifests, starts
//! `ballast destination` on it and on an empty directory side by side, and
//! reports: time to ready, RSS (and growth per pod over the empty controller),
//! and the latency from writing one small changed manifest file to the update
//! arriving on STREAMS open `Get` streams watching the changed service.
//!
//! Usage: destination-bench [--ballast PATH] [--pods N] [--services N]
//!        [--streams N] [--rounds N]

use ballast_bench::{allocated, rss, start};
use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, update, GetDestination,
};
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tonic::transport::Channel;

struct Opts {
    ballast: PathBuf,
    pods: usize,
    services: usize,
    streams: usize,
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
        rounds: 50,
        keep: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--ballast" => o.ballast = value.into(),
            "--pods" => o.pods = value.parse()?,
            "--services" => o.services = value.parse()?,
            "--streams" => o.streams = value.parse()?,
            "--rounds" => o.rounds = value.parse()?,
            "--keep" => o.keep = Some(value.into()),
            other => anyhow::bail!("unknown flag {other}"),
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

fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`",
        o.ballast.display()
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
    let (empty_c, empty_ready) = start(&o.ballast, &args(empty.path())).await?;
    let (full_c, full_ready) = start(&o.ballast, &args(cluster.path())).await?;
    // Let the allocator settle after the load, then read both side by side.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty_pid = empty_c.pid();
    let full_pid = full_c.pid();
    let (empty_rss, _) = rss(empty_pid);
    let (full_rss, full_hwm) = rss(full_pid);
    let empty_alloc = allocated(&empty_c.admin).await;
    let full_alloc = allocated(&full_c.admin).await;

    // STREAMS streams on service 0, spread over connections as proxies would be.
    let channels = (o.streams / 100).max(1);
    let mut clients = Vec::new();
    for _ in 0..channels {
        let ch = Channel::from_shared(format!("http://{}", full_c.grpc))?
            .connect()
            .await?;
        clients.push(DestinationClient::new(ch));
    }
    let (name, ns) = service_of(0);
    let path = format!("{name}.{ns}.svc.cluster.local:80");
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let mut ready_streams = 0;
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
    for s in 0..o.streams {
        let mut client = clients[s % channels].clone();
        let req = GetDestination {
            scheme: "k8s".into(),
            path: path.clone(),
            context_token: String::new(),
        };
        let tx = tx.clone();
        let ready_tx = ready_tx.clone();
        tokio::spawn(async move {
            let Ok(resp) = client.get(req).await else {
                return;
            };
            let mut stream = resp.into_inner();
            let _ = stream.message().await; // the initial set
            let _ = ready_tx.send(());
            while let Ok(Some(msg)) = stream.message().await {
                if matches!(msg.update, Some(update::Update::Add(_))) {
                    let _ = tx.send(Instant::now());
                }
            }
        });
    }
    while ready_streams < o.streams {
        ready_rx.recv().await;
        ready_streams += 1;
    }
    let (streams_rss, _) = rss(full_pid);

    let mut per_stream = Vec::new();
    let mut all_streams = Vec::new();
    let file = cluster.path().join("svc-0.yaml");
    for round in 1..=o.rounds {
        let contents = service_file(0, per_service, round);
        let t0 = Instant::now();
        write_atomic(&file, &contents)?;
        let mut last = t0;
        for _ in 0..o.streams {
            let at = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("streams ended"))?;
            per_stream.push(at - t0);
            last = last.max(at);
        }
        all_streams.push(last - t0);
    }
    per_stream.sort();
    all_streams.sort();
    let (_, hwm_after) = rss(full_pid);

    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
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
    println!(
        "manifest write -> update on each of {} streams, {} rounds ({} samples)",
        o.streams,
        o.rounds,
        per_stream.len()
    );
    println!();
    println!("| | p50 | p99 | max |");
    println!("|---|---|---|---|");
    println!(
        "| per stream | {} | {} | {} |",
        ms(percentile(&per_stream, 0.5)),
        ms(percentile(&per_stream, 0.99)),
        ms(percentile(&per_stream, 1.0))
    );
    println!(
        "| until the last of {} streams | {} | {} | {} |",
        o.streams,
        ms(percentile(&all_streams, 0.5)),
        ms(percentile(&all_streams, 0.99)),
        ms(percentile(&all_streams, 1.0))
    );
    drop(empty_c);
    drop(full_c);
    Ok(())
}
