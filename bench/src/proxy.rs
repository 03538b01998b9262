//! Proxy benchmark (not a test): one hop of HTTP/1.1 keep-alive through
//! `ballast proxy` and through haproxy, against the same backend directly.
//!
//! Backend: nginx serving a fixed 1 KB body with keep-alive. The proxy under
//! test runs pinned to one core (`--proxy-core`, 1); the backend and the load
//! generators share the other (`--load-core`, 0). Each round measures every
//! target in turn (direct, ballast, haproxy), rounds alternate, and the
//! figures are medians over rounds with min-max:
//!
//! - latency (p50, p99, p99.9) from `oha --latency-correction` at fixed rates
//!   over 16 keep-alive connections, as added to the direct path of the
//!   same round;
//! - the maximum rate from `wrk -t1 -c64`;
//! - CPU seconds per 1,000 requests of the proxy process (utime + stime from
//!   /proc/PID/stat), at each rate;
//! - RSS idle (after a warm-up), under load (VmRSS halfway through the wrk
//!   run), peak (VmHWM), and per idle keep-alive connection.
//!
//! Ballast is reached in explicit mode: the outbound listener with
//! `Host: backend.bench.svc.cluster.local`, a service whose one endpoint is
//! the backend, resolved by a `ballast destination --manifests DIR`
//! controller the benchmark starts (pinned to the load core). If
//! `ballast proxy --help` fails, the Ballast target is skipped.
//!
//! A round during which other processes used more than `--max-foreign`
//! cores (or a compiler ran) is measured again, up to `--retries` times;
//! before each round the benchmark waits (up to `--quiet-wait` seconds) for
//! the machine to go quiet.
//!
//! `--keep-awake` runs a SCHED_IDLE busy loop on both cores so that the
//! virtual CPUs never halt: any woken task preempts it at once, and a
//! wake-up then costs no exit to the hypervisor. It separates the proxies'
//! own latency from the VM's wake-up latency (which dominates the tails).
//!
//! Needs installed: `apt-get install -y nginx haproxy wrk` (Debian 12:
//! nginx 1.22, haproxy 2.6, wrk 4.1), `cargo install --locked oha`, `taskset`
//! (util-linux), and `cargo build --release -p ballast` for the Ballast
//! target. Run it from the workspace root.
//!
//! Usage: proxy-bench [--ballast PATH] [--oha PATH] [--rounds N]
//!        [--duration SECS] [--rates 1000,5000,20000] [--connections N]
//!        [--wrk-connections N] [--idle-connections N]
//!        [--targets direct,ballast,haproxy] [--max-foreign CORES]
//!        [--retries N] [--quiet-wait SECS] [--proxy-core N] [--load-core N]
//!        [--keep-awake]

#[path = "proxy/load.rs"]
mod load;
#[path = "proxy/report.rs"]
mod report;
#[path = "proxy/servers.rs"]
mod servers;
#[path = "proxy/system.rs"]
mod system;

use ballast_bench::rss;
use load::{Conn, Fixed, Max, OhaArgs};
use servers::{Server, SERVICE_HOST};
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};
use system::{cpu_ticks, rss_anon, Foreign, ForeignMonitor};

pub struct Opts {
    ballast: PathBuf,
    oha: PathBuf,
    rounds: usize,
    duration: Duration,
    rates: Vec<u32>,
    connections: u32,
    wrk_connections: u32,
    idle_connections: usize,
    targets: Vec<Target>,
    max_foreign: f64,
    retries: usize,
    quiet_wait: Duration,
    proxy_core: u32,
    load_core: u32,
    keep_awake: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Direct,
    Ballast,
    Haproxy,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Ballast => "ballast",
            Target::Haproxy => "haproxy",
        }
    }
}

const USAGE: &str = "Usage: proxy-bench [--ballast PATH] [--oha PATH] [--rounds N] \
[--duration SECS] [--rates 1000,5000,20000] [--connections N] [--wrk-connections N] \
[--idle-connections N] [--targets direct,ballast,haproxy] [--max-foreign CORES] \
[--retries N] [--quiet-wait SECS] [--proxy-core N] [--load-core N] [--keep-awake]\n\n\
Needs: apt-get install -y nginx haproxy wrk; cargo install --locked oha; taskset;\n\
cargo build --release -p ballast (for the ballast target). Run from the workspace root.";

fn default_oha() -> PathBuf {
    let on_path = std::process::Command::new("oha")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    match std::env::var_os("HOME") {
        Some(home) if !on_path => PathBuf::from(home).join(".cargo/bin/oha"),
        _ => PathBuf::from("oha"),
    }
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        oha: default_oha(),
        rounds: 3,
        duration: Duration::from_secs(10),
        rates: vec![1_000, 5_000, 20_000],
        connections: 16,
        wrk_connections: 64,
        idle_connections: 1_000,
        targets: vec![Target::Direct, Target::Ballast, Target::Haproxy],
        max_foreign: 0.05,
        retries: 3,
        quiet_wait: Duration::from_secs(1800),
        proxy_core: 1,
        load_core: 0,
        keep_awake: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--keep-awake" {
            o.keep_awake = true;
            continue;
        }
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--ballast" => o.ballast = value.into(),
            "--oha" => o.oha = value.into(),
            "--rounds" => o.rounds = value.parse()?,
            "--duration" => o.duration = Duration::from_secs(value.parse()?),
            "--rates" => {
                o.rates = value
                    .split(',')
                    .map(|r| r.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--connections" => o.connections = value.parse()?,
            "--wrk-connections" => o.wrk_connections = value.parse()?,
            "--idle-connections" => o.idle_connections = value.parse()?,
            "--targets" => {
                o.targets = value
                    .split(',')
                    .map(|t| match t.trim() {
                        "direct" => Ok(Target::Direct),
                        "ballast" => Ok(Target::Ballast),
                        "haproxy" => Ok(Target::Haproxy),
                        other => Err(anyhow::anyhow!("unknown target {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--max-foreign" => o.max_foreign = value.parse()?,
            "--retries" => o.retries = value.parse()?,
            "--quiet-wait" => o.quiet_wait = Duration::from_secs(value.parse()?),
            "--proxy-core" => o.proxy_core = value.parse()?,
            "--load-core" => o.load_core = value.parse()?,
            other => anyhow::bail!("unknown flag {other}\n{USAGE}"),
        }
    }
    anyhow::ensure!(o.rounds > 0 && !o.rates.is_empty(), "nothing to measure");
    Ok(o)
}

/// What one target measured in one round. Process figures are `None` for
/// the direct path (no proxy process).
#[derive(Clone, Debug)]
pub struct Measured {
    pub target: Target,
    /// (rate, oha result, proxy CPU seconds per 1,000 requests)
    pub fixed: Vec<(u32, Fixed, Option<f64>)>,
    pub max: Max,
    pub max_cpu_per_1k: Option<f64>,
    /// Share of its core the proxy used during the wrk run.
    pub max_core_busy: Option<f64>,
    pub rss_idle_kib: Option<u64>,
    pub anon_idle_kib: Option<u64>,
    pub rss_load_kib: Option<u64>,
    pub anon_load_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
    pub hwm_kib: Option<u64>,
    pub idle_conn_bytes: Option<f64>,
    pub foreign: Foreign,
}

/// One accepted round: every target once.
pub struct Round {
    pub measured: Vec<Measured>,
}

struct Env {
    tck: f64,
    backend: String,
    controller: Option<ballast_bench::Controller>,
    dir: PathBuf,
}

async fn start_target(o: &Opts, env: &Env, t: Target) -> anyhow::Result<Option<Server>> {
    Ok(match t {
        Target::Direct => None,
        Target::Haproxy => Some(servers::haproxy(&env.dir, &env.backend, o.proxy_core).await?),
        Target::Ballast => {
            let grpc = env
                .controller
                .as_ref()
                .map(|c| c.grpc.clone())
                .ok_or_else(|| anyhow::anyhow!("no controller"))?;
            Some(servers::ballast(&o.ballast, &grpc, o.proxy_core).await?)
        }
    })
}

fn cpu_seconds_between(env: &Env, pid: Option<u32>, before: u64) -> Option<f64> {
    pid.map(|p| cpu_ticks(p).saturating_sub(before) as f64 / env.tck)
}

async fn measure(o: &Opts, env: &Env, t: Target) -> anyhow::Result<Measured> {
    let monitor = ForeignMonitor::start(env.tck);
    let server = start_target(o, env, t).await?;
    let addr = server
        .as_ref()
        .map(|s| s.addr.clone())
        .unwrap_or_else(|| env.backend.clone());
    let pid = server.as_ref().map(Server::pid);

    // Warm-up: the connection pool to the backend, discovery, lazy state.
    let mut warm = Conn::open(&addr).await?;
    for _ in 0..200 {
        let status = tokio::time::timeout(Duration::from_secs(5), warm.get(SERVICE_HOST)).await??;
        anyhow::ensure!(status == 200, "{}: warm-up status {status}", t.name());
    }
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle_kib = pid.map(|p| rss(p).0);
    let anon_idle_kib = pid.map(rss_anon);

    let mut fixed = Vec::new();
    for &rate in &o.rates {
        let before = pid.map(cpu_ticks).unwrap_or(0);
        let r = load::oha(&OhaArgs {
            oha: &o.oha,
            core: o.load_core,
            addr: &addr,
            host: SERVICE_HOST,
            rate,
            connections: o.connections,
            duration: o.duration,
        })
        .await?;
        let cpu = cpu_seconds_between(env, pid, before);
        let per_1k = cpu.map(|c| c / (r.ok.max(1) as f64 / 1000.0));
        fixed.push((rate, r, per_1k));
    }

    let before = pid.map(cpu_ticks).unwrap_or(0);
    let started = Instant::now();
    let half = o.duration / 2;
    let sample = tokio::spawn(async move {
        tokio::time::sleep(half).await;
        pid.map(|p| (rss(p).0, rss_anon(p)))
    });
    let max = load::wrk(
        o.load_core,
        &addr,
        SERVICE_HOST,
        o.wrk_connections,
        o.duration,
    )
    .await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds_between(env, pid, before);
    let (rss_load_kib, anon_load_kib) = match sample.await.ok().flatten() {
        Some((all, anon)) => (Some(all), Some(anon)),
        None => (None, None),
    };
    let max_cpu_per_1k = cpu.map(|c| c / (max.requests.max(1) as f64 / 1000.0));
    let max_core_busy = cpu.map(|c| c / wall);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after_kib = pid.map(|p| rss(p).0);
    let hwm_kib = pid.map(|p| rss(p).1);

    let idle_conn_bytes = match (pid, o.idle_connections) {
        (Some(p), n) if n > 0 => {
            let before = rss(p).0;
            let conns = load::open_idle(&addr, SERVICE_HOST, n).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let with = rss(p).0;
            drop(conns);
            Some(with.saturating_sub(before) as f64 * 1024.0 / n as f64)
        }
        _ => None,
    };
    drop(server);
    Ok(Measured {
        target: t,
        fixed,
        max,
        max_cpu_per_1k,
        max_core_busy,
        rss_idle_kib,
        anon_idle_kib,
        rss_load_kib,
        anon_load_kib,
        rss_after_kib,
        hwm_kib,
        idle_conn_bytes,
        foreign: monitor.finish(),
    })
}

/// A busy loop at SCHED_IDLE priority on each core: any woken task preempts
/// it at once, but the virtual CPU never halts, so a wake-up costs no exit
/// to the hypervisor. Tells the proxy's latency from the VM's wake-up latency.
fn keep_awake(cores: &[u32]) -> anyhow::Result<Vec<tokio::process::Child>> {
    cores
        .iter()
        .map(|core| {
            tokio::process::Command::new("chrt")
                .args(["--idle", "0", "taskset", "-c", &core.to_string()])
                .args(["sh", "-c", "while :; do :; done"])
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| anyhow::anyhow!("chrt: {e}"))
        })
        .collect()
}

async fn run(o: Opts) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let machine = system::machine();
    // The benchmark itself (its /proc sampling, its own client) stays off
    // the proxy's core.
    system::pin(std::process::id(), o.load_core)?;
    let tck = system::clock_ticks();

    let mut targets = o.targets.clone();
    if targets.contains(&Target::Ballast) && !servers::ballast_has_proxy(&o.ballast).await {
        eprintln!(
            "`{} proxy --help` fails: the ballast target is skipped \
             (build it with `cargo build --release -p ballast`)",
            o.ballast.display()
        );
        targets.retain(|t| *t != Target::Ballast);
    }

    let _spinners = if o.keep_awake {
        keep_awake(&[o.load_core, o.proxy_core])?
    } else {
        Vec::new()
    };
    let tmp = tempfile::tempdir()?;
    let nginx = servers::nginx(tmp.path(), o.load_core).await?;
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let backend_port: u16 = nginx
        .addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("backend address {}", nginx.addr))?;
    servers::write_manifests(&manifests, backend_port)?;
    let controller = if targets.contains(&Target::Ballast) {
        let args = vec!["--manifests".to_string(), manifests.display().to_string()];
        let (c, _) = ballast_bench::start(&o.ballast, &args).await?;
        system::pin(c.pid(), o.load_core)?;
        Some(c)
    } else {
        None
    };
    let env = Env {
        tck,
        backend: nginx.addr.clone(),
        controller,
        dir: tmp.path().to_path_buf(),
    };

    let versions = [
        system::version("nginx", &["-v"]),
        system::version("haproxy", &["-v"]),
        system::version("wrk", &["--version"]),
        system::version(&o.oha.display().to_string(), &["--version"]),
    ];
    println!("machine: {machine}");
    println!("tools: {}", versions.join("; "));
    println!("command: {command}");
    println!(
        "targets: {}; proxy on core {}, backend and load on core {}",
        targets
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", "),
        o.proxy_core,
        o.load_core
    );
    if o.keep_awake {
        println!("keep-awake: SCHED_IDLE busy loops on both cores");
    }

    let mut rounds: Vec<Round> = Vec::new();
    let mut retries_left = o.retries;
    let mut discarded = 0;
    while rounds.len() < o.rounds {
        let (tck_, max_foreign, patience) = (tck, o.max_foreign, o.quiet_wait);
        let (pre, quiet) = tokio::task::spawn_blocking(move || {
            system::wait_for_quiet(tck_, max_foreign, patience)
        })
        .await?;
        if !quiet {
            eprintln!(
                "  machine not quiet after {:?} (foreign load {:.2} cores); measuring anyway",
                o.quiet_wait,
                pre.cores()
            );
        }
        let n = rounds.len() + 1;
        let mut measured = Vec::new();
        for &t in &targets {
            let m = measure(&o, &env, t).await?;
            report::print_line(n, &m);
            measured.push(m);
        }
        let disturbed = measured
            .iter()
            .any(|m| m.foreign.rustc || m.foreign.cores() > o.max_foreign);
        if disturbed && retries_left > 0 {
            retries_left -= 1;
            discarded += 1;
            eprintln!("  round {n} disturbed by other processes: measuring it again");
            continue;
        }
        rounds.push(Round { measured });
    }
    report::print(&o, &targets, &rounds, discarded);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    // Return (and so kill every child, kill_on_drop) on Ctrl-C too.
    tokio::select! {
        r = run(o) => r,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
    }
}
