//! `tap-bench`: what the Tap API costs the proxy under load.
//!
//! One `ballast proxy` (pinned to `--proxy-core`, 1) in explicit mode in
//! front of nginx (1 KB body); `oha` at a fixed rate (`--rate`, 5,000/s)
//! over 16 HTTP/1.1 keep-alive connections for `--seconds` (30); nginx, the
//! controller, oha and this benchmark's tap clients on `--load-core` (0).
//! Each scenario runs on a fresh proxy, warmed up with 3 s of the same load:
//!
//! - `no tap listener`: the proxy without `--tap-addr`;
//! - `no tap open`: with `--tap-addr`, no tap (the request path's one load);
//! - `tap, read`: one tap matching everything, its events read as they come
//!   (the default `--tap-max-events-per-second` 1,000: a third of a
//!   thousand requests a second are tapped, the rest counted as dropped);
//! - `tap, not read`: the same tap, its stream never read by a client with
//!   HTTP/2's default 64 KiB windows (the queue fills, the rest are dropped
//!   and counted);
//! - `tap, read, every request`: `--tap-max-events-per-second 1000000`, so
//!   all requests are tapped and their events read (15,000 events/s).
//!
//! Taps are opened with `--tap-max-requests-per-tap 1000000` so that one tap
//! lasts the whole run. Figures: proxy CPU seconds (utime + stime from
//! /proc) per 100,000 requests answered 200, RSS at the end and its peak
//! (VmHWM), events the client read and the proxy's tap counters.
//!
//! It fails when a measured process did not serve: a proxy or the
//! controller that exited, a run with no request answered 200, any failed
//! request, a tap scenario whose proxy queued no event, a `read` scenario
//! whose client read none.
//!
//! Needs: `apt-get install -y nginx`, `cargo install --locked oha`,
//! `taskset`, and `cargo build --release -p ballast`. Run from the workspace
//! root: `cargo run --release -p ballast-bench --bin tap-bench`.
//!
//! Usage: tap-bench [--ballast PATH] [--oha PATH] [--rate N] [--seconds N]
//!        [--connections N] [--proxy-core N] [--load-core N]

use ballast_bench::{load, servers, system};

use linkerd2_proxy_api::tap::{
    observe_request::{self, r#match},
    tap_client::TapClient,
    ObserveRequest,
};
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::transport::Channel;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "Usage: tap-bench [--ballast PATH] [--oha PATH] [--rate N (5000)] \
[--seconds N (30)] [--connections N (16)] [--proxy-core N (1)] [--load-core N (0)]\n\n\
Needs: apt-get install -y nginx; cargo install --locked oha; taskset;\n\
cargo build --release -p ballast. Run from the workspace root.";

struct Opts {
    ballast: PathBuf,
    oha: PathBuf,
    rate: u32,
    seconds: u64,
    connections: u32,
    proxy_core: u32,
    load_core: u32,
}

fn opts() -> anyhow::Result<Opts> {
    let oha = match std::env::var_os("HOME") {
        Some(home) if std::path::Path::new(&home).join(".cargo/bin/oha").exists() => {
            PathBuf::from(home).join(".cargo/bin/oha")
        }
        _ => PathBuf::from("oha"),
    };
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        oha,
        rate: 5_000,
        seconds: 30,
        connections: 16,
        proxy_core: 1,
        load_core: 0,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--oha" => o.oha = args.value()?.into(),
            "--rate" => o.rate = args.parse()?,
            "--seconds" => o.seconds = args.parse()?,
            "--connections" => o.connections = args.parse()?,
            "--proxy-core" => o.proxy_core = args.parse()?,
            "--load-core" => o.load_core = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tapping {
    None,
    Read,
    Unread,
}

struct Scenario {
    name: &'static str,
    listener: bool,
    tap: Tapping,
    extra: &'static [&'static str],
}

const SCENARIOS: [Scenario; 5] = [
    Scenario {
        name: "no tap listener",
        listener: false,
        tap: Tapping::None,
        extra: &[],
    },
    Scenario {
        name: "no tap open",
        listener: true,
        tap: Tapping::None,
        extra: &[],
    },
    Scenario {
        name: "tap, read",
        listener: true,
        tap: Tapping::Read,
        extra: &[],
    },
    Scenario {
        name: "tap, not read",
        listener: true,
        tap: Tapping::Unread,
        extra: &[],
    },
    Scenario {
        name: "tap, read, every request",
        listener: true,
        tap: Tapping::Read,
        extra: &["--tap-max-events-per-second", "1000000"],
    },
];

struct Row {
    name: &'static str,
    fixed: load::Fixed,
    cpu_per_100k: f64,
    cpu_share: f64,
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
    read: u64,
    queued: f64,
    dropped_rate: f64,
    dropped_queue: f64,
}

fn everything(limit: u32) -> ObserveRequest {
    ObserveRequest {
        limit,
        r#match: Some(observe_request::Match {
            r#match: Some(r#match::Match::All(r#match::Seq { matches: vec![] })),
        }),
        extract: None,
    }
}

/// A tap client; `small_windows`: HTTP/2's default 64 KiB windows (a client
/// that does not read then stops the stream sooner), else tonic's.
async fn tap_client(addr: &str, small_windows: bool) -> anyhow::Result<TapClient<Channel>> {
    let mut endpoint = Channel::from_shared(format!("http://{addr}"))?;
    if small_windows {
        endpoint = endpoint
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535);
    }
    Ok(TapClient::new(endpoint.connect().await?))
}

/// Reads taps matching everything until `stop`, opening a new one when one
/// ends; counts the events.
fn reader(addr: String, read: Arc<AtomicU64>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut client) = tap_client(&addr, false).await else {
            eprintln!("  tap client: cannot connect to {addr}");
            return;
        };
        loop {
            let opened = tokio::select! {
                r = client.observe(everything(1_000_000)) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let mut stream = match opened {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    eprintln!("  tap refused: {e}");
                    return;
                }
            };
            loop {
                tokio::select! {
                    m = stream.message() => match m {
                        Ok(Some(_)) => {
                            read.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => break,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    })
}

/// One labelled sample (`name{reason="R"}`), or an unlabelled one.
async fn sample(admin: &str, name: &str, reason: Option<&str>) -> f64 {
    let (_, text) = ballast_bench::http_get(admin, "/metrics").await;
    let prefix = match reason {
        Some(r) => format!("{name}{{reason=\"{r}\"}} "),
        None => format!("{name} "),
    };
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn scenario(o: &Opts, s: &Scenario, destination: &str, tck: f64) -> anyhow::Result<Row> {
    let tap_port = servers::free_port()?;
    let tap_addr = format!("127.0.0.1:{tap_port}");
    let mut extra: Vec<String> = Vec::new();
    if s.listener {
        extra.extend(["--tap-addr".into(), tap_addr.clone()]);
        extra.extend([
            "--tap-max-requests-per-tap".to_string(),
            "1000000".to_string(),
        ]);
    }
    extra.extend(s.extra.iter().map(|x| x.to_string()));
    let mut proxy = servers::ballast(&servers::BallastArgs {
        ballast: &o.ballast,
        destination,
        core: o.proxy_core,
        inbound: "127.0.0.1:0".into(),
        forward_port: None,
        max_connections: 10_000,
        extra: &extra,
    })
    .await?;
    servers::wait_ok(
        &proxy.addr,
        servers::SERVICE_HOST,
        &mut proxy.child,
        Duration::from_secs(30),
    )
    .await?;
    let admin = proxy.admin.clone().unwrap_or_default();
    let load = |seconds: u64| load::OhaArgs {
        oha: &o.oha,
        core: o.load_core,
        addr: &proxy.addr,
        host: servers::SERVICE_HOST,
        rate: o.rate,
        connections: o.connections,
        duration: Duration::from_secs(seconds),
    };
    load::oha(&load(3)).await?;

    let read = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut reading = None;
    let mut _unread = None;
    match s.tap {
        Tapping::None => {}
        Tapping::Read => {
            reading = Some(reader(tap_addr.clone(), read.clone(), stop_rx));
        }
        Tapping::Unread => {
            let mut c = tap_client(&tap_addr, true).await?;
            _unread = Some((c.observe(everything(1_000_000)).await?, c));
        }
    }
    if s.tap != Tapping::None {
        let started = std::time::Instant::now();
        while sample(&admin, "tap_observations_open", None).await < 1.0 {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(10),
                "the tap did not open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let pid = proxy.pid();
    let before = system::cpu_ticks(pid);
    let fixed = load::oha(&load(o.seconds)).await?;
    let after = system::cpu_ticks(pid);
    ballast_bench::running(&mut proxy.child, "ballast proxy")?;
    let cpu = (after - before) as f64 / tck;
    let (rss_kib, hwm_kib, anon_kib) = (
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:"),
        system::rss_anon(pid),
    );
    let queued = sample(&admin, "tap_events_total", None).await;
    let dropped_rate = sample(&admin, "tap_events_dropped_total", Some("rate")).await;
    let dropped_queue = sample(&admin, "tap_events_dropped_total", Some("queue")).await;
    let _ = stop_tx.send(true);
    if let Some(r) = reading {
        let _ = r.await;
    }
    drop(_unread);
    drop(proxy);
    let read = read.load(Ordering::Relaxed);
    if s.tap != Tapping::None {
        anyhow::ensure!(
            queued > 0.0,
            "the proxy queued no tap event (tap_events_total 0)"
        );
    }
    if s.tap == Tapping::Read {
        anyhow::ensure!(read > 0, "the tap client read no event");
    }
    Ok(Row {
        name: s.name,
        cpu_per_100k: cpu / fixed.ok.max(1) as f64 * 100_000.0,
        cpu_share: cpu / o.seconds as f64,
        fixed,
        rss_kib,
        hwm_kib,
        anon_kib,
        read,
        queued,
        dropped_rate,
        dropped_queue,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`\n{USAGE}",
        o.ballast.display()
    );
    let help = servers::ballast_proxy_help(&o.ballast)
        .await
        .ok_or_else(|| anyhow::anyhow!("`{} proxy --help` failed", o.ballast.display()))?;
    anyhow::ensure!(
        help.contains("--tap-addr"),
        "this ballast has no --tap-addr (built without the proxy's `tap` feature?)"
    );
    system::pin(std::process::id(), o.load_core)?;
    let tck = system::clock_ticks();
    let tmp = tempfile::tempdir()?;
    let nginx = servers::nginx(tmp.path(), o.load_core, 1024).await?;
    let manifests = tmp.path().join("cluster");
    std::fs::create_dir_all(&manifests)?;
    let backend_port: u16 = nginx.addr.rsplit(':').next().unwrap_or("0").parse()?;
    servers::write_manifests(&manifests, backend_port, backend_port, false)?;
    let (mut controller, _) = ballast_bench::start(
        &o.ballast,
        &["--manifests".to_string(), manifests.display().to_string()],
    )
    .await?;
    system::pin(controller.pid(), o.load_core)?;

    let mut rows = Vec::new();
    for s in &SCENARIOS {
        eprintln!("tap-bench: {} ...", s.name);
        let row = scenario(&o, s, &controller.grpc, tck).await;
        if row.is_err() {
            // A controller that exited is the cause, not the proxy's symptom.
            controller.running()?;
        }
        rows.push(row.map_err(|e| e.context(format!("scenario \"{}\"", s.name)))?);
    }

    println!("## Tap under load");
    println!();
    println!(
        "{}; `ballast proxy` on core {} in explicit mode to nginx (1 KB body); oha at {} \
         requests/s over {} keep-alive HTTP/1.1 connections for {} s per scenario (after 3 s \
         of warm-up on a fresh proxy); nginx, the controller, oha and the tap client on core {}. \
         A tap matches every request; `read` scenarios read its events as they come.",
        system::machine(),
        o.proxy_core,
        o.rate,
        o.connections,
        o.seconds,
        o.load_core
    );
    println!();
    println!(
        "| scenario | requests/s | failed | proxy CPU s / 100k req | CPU (share of a core) | \
         RSS end | RSS peak | RssAnon | p50 | p99 | events read | events queued | dropped (rate) | dropped (queue) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |kib: u64| kib as f64 / 1024.0;
    for r in &rows {
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.1}% | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.0} µs | {:.0} µs | {} | {:.0} | {:.0} | {:.0} |",
            r.name,
            r.fixed.achieved_rps,
            r.fixed.failed,
            r.cpu_per_100k,
            r.cpu_share * 100.0,
            mib(r.rss_kib),
            mib(r.hwm_kib),
            mib(r.anon_kib),
            r.fixed.p50_us,
            r.fixed.p99_us,
            r.read,
            r.queued,
            r.dropped_rate,
            r.dropped_queue,
        );
    }
    controller.running()?;
    drop((controller, nginx));
    let failed: u64 = rows.iter().map(|r| r.fixed.failed).sum();
    anyhow::ensure!(
        failed == 0,
        "{failed} requests failed (non-200 answers or errors): see the table"
    );
    Ok(())
}
