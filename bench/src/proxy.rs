//! Proxy benchmark (not a test): HTTP/1.1 keep-alive through one and two
//! hops of `ballast proxy` and of haproxy, against the same backend directly.
//!
//! Backend: nginx serving a fixed 1 KB body with keep-alive. The proxies
//! under test run pinned to one core (`--proxy-core`, 1), both proxies of a
//! two-hop path on it; the backend and the load generators share the other
//! (`--load-core`, 0). Each round measures every target in turn, rounds
//! alternate, and the figures are medians over rounds with min-max:
//!
//! - latency (p50, p99, p99.9) from `oha --latency-correction` at fixed rates
//!   over 16 keep-alive connections, as added to the direct path of the
//!   same round;
//! - the maximum rate from `wrk -t1 -c64`;
//! - CPU seconds per 1,000 requests of each proxy process (utime + stime
//!   from /proc/PID/stat), at each rate, and their sum;
//! - RSS idle (after a warm-up), under load (VmRSS halfway through the wrk
//!   run) and peak (VmHWM), per proxy process and summed;
//! - memory per idle keep-alive connection: a fresh proxy, warmed up, then N
//!   connections that have each made one request (`--idle-connections`,
//!   1000 and 10000), settled for `--idle-settle` (15 s): VmRSS growth / N
//!   and, for Ballast, jemalloc's
//!   allocated bytes growth / N (`process_memory_allocated_bytes` on its
//!   admin /metrics). One hop: the outbound listener; two hops: proxy B's
//!   inbound listener, reached directly.
//!
//! Targets:
//! - `direct`: the client to nginx;
//! - `ballast`: explicit mode, the outbound listener with `Host:
//!   backend.bench.svc.cluster.local`, a service whose one endpoint is the
//!   backend, resolved by a `ballast destination --manifests DIR`
//!   controller the benchmark starts (pinned to the load core); as a meshed
//!   pod's requests go, on an HTTPRoute with a request timeout and retries,
//!   with failure accrual on the Service (each Service of the benchmark has
//!   them);
//! - `ballast-2hop`: client -> proxy A outbound (`Host:
//!   hop.bench.svc.cluster.local`, a service whose one endpoint is proxy B's
//!   inbound listener) -> proxy B inbound (`--inbound-forward-port`: the
//!   connection was not redirected, so it goes to the backend's port on
//!   127.0.0.1) -> nginx;
//! - `haproxy` and `haproxy-2hop`: one haproxy, or two chained.
//!
//! If `ballast proxy --help` fails, the benchmark fails (leave the Ballast
//! targets out with `--targets` to measure without them); if it has no
//! `--inbound-forward-port`, `ballast-2hop` is skipped.
//!
//! It fails (exit status 1, after printing what it measured) when a
//! measured process did not serve: a proxy that exited during its
//! measurement, a run in which no request was answered 200, or any request
//! that failed (a non-200 answer or a socket error; wrk's timeouts are
//! counted but do not fail it). Figures that depend on speed fail nothing.
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
//! and `prlimit` (util-linux), and `cargo build --release -p ballast` for
//! the Ballast targets. Run it from the workspace root.
//!
//! Usage: proxy-bench [--ballast PATH] [--proxy PATH] [--oha PATH] [--rounds N]
//!        [--duration SECS] [--rates 1000,5000,20000] [--connections N]
//!        [--wrk-connections N] [--idle-connections 1000,10000]
//!        [--targets direct,ballast,ballast-2hop,haproxy,haproxy-2hop]
//!        [--max-foreign CORES] [--retries N] [--quiet-wait SECS]
//!        [--proxy-core N] [--load-core N] [--keep-awake]

use ballast_bench::{load, servers, system};
#[path = "proxy/report.rs"]
mod report;

use ballast_bench::rss;
use load::{Conn, Fixed, Max, OhaArgs};
use servers::{BallastArgs, Server, HOP_HOST, SERVICE_HOST};
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};
use system::{cpu_ticks, rss_anon, Foreign, ForeignMonitor};

pub struct Opts {
    ballast: PathBuf,
    /// The proxy's binary: `ballast` (as `ballast proxy`) or `ballast-proxy`.
    proxy: Option<PathBuf>,
    oha: PathBuf,
    rounds: usize,
    duration: Duration,
    rates: Vec<u32>,
    connections: u32,
    wrk_connections: u32,
    idle_connections: Vec<usize>,
    /// How long idle connections settle before memory is read.
    idle_settle: Duration,
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
    Ballast2,
    Haproxy,
    Haproxy2,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Ballast => "ballast",
            Target::Ballast2 => "ballast-2hop",
            Target::Haproxy => "haproxy",
            Target::Haproxy2 => "haproxy-2hop",
        }
    }

    fn parse(name: &str) -> anyhow::Result<Self> {
        [
            Target::Direct,
            Target::Ballast,
            Target::Ballast2,
            Target::Haproxy,
            Target::Haproxy2,
        ]
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| anyhow::anyhow!("unknown target {name}"))
    }

    pub fn is_ballast(self) -> bool {
        matches!(self, Target::Ballast | Target::Ballast2)
    }

    /// Proxy processes on the path.
    pub fn hops(self) -> usize {
        match self {
            Target::Direct => 0,
            Target::Ballast | Target::Haproxy => 1,
            Target::Ballast2 | Target::Haproxy2 => 2,
        }
    }
}

const USAGE: &str =
    "Usage: proxy-bench [--ballast PATH] [--proxy PATH (ballast-proxy)] [--oha PATH] [--rounds N] \
[--duration SECS] [--rates 1000,5000,20000] [--connections N] [--wrk-connections N] \
[--idle-connections 1000,10000] [--idle-settle SECS (15)] [--targets direct,ballast,ballast-2hop,haproxy,haproxy-2hop] \
[--max-foreign CORES] [--retries N] [--quiet-wait SECS] [--proxy-core N] [--load-core N] \
[--keep-awake]\n\n\
Needs: apt-get install -y nginx haproxy wrk; cargo install --locked oha; taskset, prlimit;\n\
cargo build --release -p ballast (for the ballast targets). Run from the workspace root.";

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

fn list<T: std::str::FromStr>(value: &str) -> Result<Vec<T>, T::Err> {
    value
        .split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| v.trim().parse())
        .collect()
}

impl Opts {
    fn proxy_binary(&self) -> &std::path::Path {
        self.proxy.as_deref().unwrap_or(&self.ballast)
    }
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        proxy: None,
        oha: default_oha(),
        rounds: 3,
        duration: Duration::from_secs(10),
        rates: vec![1_000, 5_000, 20_000],
        connections: 16,
        wrk_connections: 64,
        idle_connections: vec![1_000, 10_000],
        idle_settle: Duration::from_secs(15),
        targets: vec![
            Target::Direct,
            Target::Ballast,
            Target::Ballast2,
            Target::Haproxy,
            Target::Haproxy2,
        ],
        max_foreign: 0.05,
        retries: 3,
        quiet_wait: Duration::from_secs(1800),
        proxy_core: 1,
        load_core: 0,
        keep_awake: false,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--keep-awake" => o.keep_awake = true,
            "--ballast" => o.ballast = args.value()?.into(),
            "--proxy" => o.proxy = Some(args.value()?.into()),
            "--oha" => o.oha = args.value()?.into(),
            "--rounds" => o.rounds = args.parse()?,
            "--duration" => o.duration = Duration::from_secs(args.parse()?),
            "--rates" => o.rates = list(&args.value()?)?,
            "--connections" => o.connections = args.parse()?,
            "--wrk-connections" => o.wrk_connections = args.parse()?,
            "--idle-settle" => o.idle_settle = Duration::from_secs(args.parse()?),
            "--idle-connections" => {
                o.idle_connections = list(&args.value()?)?;
                o.idle_connections.retain(|n| *n > 0);
            }
            "--targets" => {
                o.targets = args
                    .value()?
                    .split(',')
                    .map(|t| Target::parse(t.trim()))
                    .collect::<Result<_, _>>()?
            }
            "--max-foreign" => o.max_foreign = args.parse()?,
            "--retries" => o.retries = args.parse()?,
            "--quiet-wait" => o.quiet_wait = Duration::from_secs(args.parse()?),
            "--proxy-core" => o.proxy_core = args.parse()?,
            "--load-core" => o.load_core = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(o.rounds > 0 && !o.rates.is_empty(), "nothing to measure");
    Ok(o)
}

/// Memory per idle keep-alive connection at one N.
#[derive(Clone, Debug)]
pub struct Idle {
    pub n: usize,
    /// VmRSS growth / N, in bytes.
    pub rss_bytes: f64,
    /// jemalloc allocated growth / N, in bytes (Ballast only).
    pub allocated_bytes: Option<f64>,
}

/// What one target measured in one round. Process figures have one entry
/// per proxy process on the path, in path order (none for the direct path).
#[derive(Clone, Debug)]
pub struct Measured {
    pub target: Target,
    /// (rate, oha result, each proxy's CPU seconds per 1,000 requests)
    pub fixed: Vec<(u32, Fixed, Vec<f64>)>,
    pub max: Max,
    pub max_cpu_per_1k: Vec<f64>,
    /// Share of a core each proxy used during the wrk run.
    pub max_core_busy: Vec<f64>,
    pub rss_idle_kib: Vec<u64>,
    pub anon_idle_kib: Vec<u64>,
    pub rss_load_kib: Vec<u64>,
    pub anon_load_kib: Vec<u64>,
    pub rss_after_kib: Vec<u64>,
    pub hwm_kib: Vec<u64>,
    pub idle: Vec<Idle>,
    pub foreign: Foreign,
}

/// One accepted round: every target once.
pub struct Round {
    pub measured: Vec<Measured>,
}

struct Env {
    tck: f64,
    backend: String,
    backend_port: u16,
    /// Proxy B's inbound port: the endpoint of the `hop` service.
    hop_port: u16,
    controller: Option<ballast_bench::Controller>,
    dir: PathBuf,
    max_connections: usize,
    /// Flags every Ballast proxy of the benchmark gets.
    ballast_extra: Vec<String>,
    /// haproxy's maxconn: it asks for two descriptors per connection.
    haproxy_max: usize,
}

impl Env {
    /// `r`, or the controller's exit when it has exited: the proxies'
    /// errors are then its symptoms.
    fn cause<T>(&mut self, r: anyhow::Result<T>) -> anyhow::Result<T> {
        if r.is_err() {
            if let Some(c) = self.controller.as_mut() {
                c.running()?;
            }
        }
        r
    }
}

/// A target's processes, in path order, and where its clients connect.
struct Running {
    procs: Vec<Server>,
    addr: String,
    host: &'static str,
}

impl Running {
    fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Server::pid).collect()
    }

    /// Fails if one of the target's processes has exited.
    fn running(&mut self, t: Target) -> anyhow::Result<()> {
        for (i, p) in self.procs.iter_mut().enumerate() {
            ballast_bench::running(&mut p.child, &format!("{} (process {})", t.name(), i + 1))?;
        }
        Ok(())
    }

    /// Kills the processes and waits for them to exit, so that the next
    /// proxy B can bind the same inbound port.
    async fn stop(mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill().await;
        }
    }
}

async fn start_ballast(
    o: &Opts,
    env: &Env,
    inbound: String,
    forward_port: Option<u16>,
) -> anyhow::Result<Server> {
    let grpc = env
        .controller
        .as_ref()
        .map(|c| c.grpc.clone())
        .ok_or_else(|| anyhow::anyhow!("no controller"))?;
    servers::ballast(&BallastArgs {
        ballast: o.proxy_binary(),
        destination: &grpc,
        core: o.proxy_core,
        inbound,
        forward_port,
        max_connections: env.max_connections,
        extra: &env.ballast_extra,
    })
    .await
}

async fn ready(server: &mut Server, addr: &str, host: &str, what: &str) -> anyhow::Result<()> {
    servers::wait_ok(addr, host, &mut server.child, Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

async fn start_target(o: &Opts, env: &Env, t: Target) -> anyhow::Result<Running> {
    let haproxy_max = env.haproxy_max;
    Ok(match t {
        Target::Direct => Running {
            procs: Vec::new(),
            addr: env.backend.clone(),
            host: SERVICE_HOST,
        },
        Target::Haproxy => {
            let a = servers::haproxy(&env.dir, "haproxy", &env.backend, o.proxy_core, haproxy_max)
                .await?;
            Running {
                addr: a.addr.clone(),
                procs: vec![a],
                host: SERVICE_HOST,
            }
        }
        Target::Haproxy2 => {
            let b = servers::haproxy(
                &env.dir,
                "haproxy-b",
                &env.backend,
                o.proxy_core,
                haproxy_max,
            )
            .await?;
            let a =
                servers::haproxy(&env.dir, "haproxy-a", &b.addr, o.proxy_core, haproxy_max).await?;
            Running {
                addr: a.addr.clone(),
                procs: vec![a, b],
                host: SERVICE_HOST,
            }
        }
        Target::Ballast => {
            let mut a = start_ballast(o, env, "127.0.0.1:0".into(), None).await?;
            let addr = a.addr.clone();
            ready(&mut a, &addr, SERVICE_HOST, "ballast proxy").await?;
            Running {
                procs: vec![a],
                addr,
                host: SERVICE_HOST,
            }
        }
        Target::Ballast2 => {
            let inbound = format!("127.0.0.1:{}", env.hop_port);
            let mut b = start_ballast(o, env, inbound.clone(), Some(env.backend_port)).await?;
            ready(&mut b, &inbound, SERVICE_HOST, "ballast proxy B (inbound)").await?;
            let mut a = start_ballast(o, env, "127.0.0.1:0".into(), None).await?;
            let addr = a.addr.clone();
            ready(&mut a, &addr, HOP_HOST, "ballast proxy A (outbound)").await?;
            Running {
                procs: vec![a, b],
                addr,
                host: HOP_HOST,
            }
        }
    })
}

fn cpu_seconds(env: &Env, pids: &[u32], before: &[u64]) -> Vec<f64> {
    pids.iter()
        .zip(before)
        .map(|(&p, &b)| cpu_ticks(p).saturating_sub(b) as f64 / env.tck)
        .collect()
}

/// 200 requests on one connection (pools, discovery, lazy state), then a
/// second of rest.
async fn warm_up(addr: &str, host: &str, t: Target) -> anyhow::Result<()> {
    let mut warm = Conn::open(addr).await?;
    for _ in 0..200 {
        let status = tokio::time::timeout(Duration::from_secs(5), warm.get(host)).await??;
        anyhow::ensure!(status == 200, "{}: warm-up status {status}", t.name());
    }
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

async fn measure(o: &Opts, env: &Env, t: Target) -> anyhow::Result<Measured> {
    let monitor = ForeignMonitor::start(env.tck);
    let mut running = start_target(o, env, t).await?;
    let (addr, host) = (running.addr.clone(), running.host);
    let pids = running.pids();

    // Warm-up: the connection pools, discovery, lazy state.
    warm_up(&addr, host, t).await?;
    let rss_idle_kib = pids.iter().map(|&p| rss(p).0).collect();
    let anon_idle_kib = pids.iter().map(|&p| rss_anon(p)).collect();

    let mut fixed = Vec::new();
    for &rate in &o.rates {
        let before: Vec<u64> = pids.iter().map(|&p| cpu_ticks(p)).collect();
        let r = load::oha(&OhaArgs {
            oha: &o.oha,
            core: o.load_core,
            addr: &addr,
            host,
            rate,
            connections: o.connections,
            duration: o.duration,
        })
        .await?;
        let per_1k = cpu_seconds(env, &pids, &before)
            .into_iter()
            .map(|c| c / (r.ok.max(1) as f64 / 1000.0))
            .collect();
        fixed.push((rate, r, per_1k));
    }

    let before: Vec<u64> = pids.iter().map(|&p| cpu_ticks(p)).collect();
    let started = Instant::now();
    let half = o.duration / 2;
    let sampled = pids.clone();
    let sample = tokio::spawn(async move {
        tokio::time::sleep(half).await;
        sampled
            .iter()
            .map(|&p| (rss(p).0, rss_anon(p)))
            .collect::<Vec<_>>()
    });
    let max = load::wrk(o.load_core, &addr, host, o.wrk_connections, o.duration).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(env, &pids, &before);
    let at_half = sample.await.unwrap_or_default();
    let max_cpu_per_1k = cpu
        .iter()
        .map(|c| c / (max.requests.max(1) as f64 / 1000.0))
        .collect();
    let max_core_busy = cpu.iter().map(|c| c / wall).collect();

    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after_kib = pids.iter().map(|&p| rss(p).0).collect();
    let hwm_kib = pids.iter().map(|&p| rss(p).1).collect();
    // The figures above are the processes' own only if they served to the end.
    running.running(t)?;
    running.stop().await;
    Ok(Measured {
        target: t,
        fixed,
        max,
        max_cpu_per_1k,
        max_core_busy,
        rss_idle_kib,
        anon_idle_kib,
        rss_load_kib: at_half.iter().map(|(all, _)| *all).collect(),
        anon_load_kib: at_half.iter().map(|(_, anon)| *anon).collect(),
        rss_after_kib,
        hwm_kib,
        idle: Vec::new(),
        foreign: monitor.finish(),
    })
}

/// Memory per idle connection on a fresh proxy: one hop's outbound
/// listener, or proxy B's inbound listener of two hops. `None` for targets
/// it is not measured on.
async fn measure_idle(o: &Opts, env: &Env, t: Target, n: usize) -> anyhow::Result<Option<Idle>> {
    let which = match t {
        Target::Haproxy if n + 100 > env.haproxy_max => {
            eprintln!(
                "  haproxy: {n} idle connections need more file descriptors than \
                 RLIMIT_NOFILE allows; not measured"
            );
            return Ok(None);
        }
        Target::Ballast | Target::Haproxy => 0,
        Target::Ballast2 => 1,
        Target::Direct | Target::Haproxy2 => return Ok(None),
    };
    let mut running = start_target(o, env, t).await?;
    let proxy = &running.procs[which];
    let (addr, host) = if which == 0 {
        (running.addr.clone(), running.host)
    } else {
        (proxy.inbound.clone().unwrap_or_default(), SERVICE_HOST)
    };
    let pid = proxy.pid();
    let allocated = || async {
        match &proxy.admin {
            Some(admin) => system::metric(admin, "process_memory_allocated_bytes").await,
            None => None,
        }
    };
    warm_up(&addr, host, t).await?;
    let (rss_before, alloc_before) = (rss(pid).0, allocated().await);
    let conns = load::open_idle(&addr, host, n).await?;
    // Let the proxy settle every connection into its idle state: Ballast
    // parks an idle HTTP/1 connection within 2 s (--http1-park-after 1s),
    // and jemalloc returns the pages freed then within its 10 s decay.
    tokio::time::sleep(o.idle_settle).await;
    let (rss_with, alloc_with) = (rss(pid).0, allocated().await);
    drop(conns);
    running.running(t)?;
    if t.is_ballast() {
        anyhow::ensure!(
            alloc_before.is_some() && alloc_with.is_some(),
            "{}: process_memory_allocated_bytes not read from the proxy's /metrics",
            t.name()
        );
    }
    running.stop().await;
    Ok(Some(Idle {
        n,
        rss_bytes: (rss_with as f64 - rss_before as f64) * 1024.0 / n as f64,
        allocated_bytes: alloc_before
            .zip(alloc_with)
            .map(|(b, w)| (w - b) / n as f64),
    }))
}

/// A busy loop at SCHED_IDLE priority on each core: any woken task preempts
/// it at once, but the virtual CPU never halts, so a wake-up costs no exit
/// to the hypervisor. Tells the proxy's latency from the VM's wake-up latency.
fn keep_awake(cores: &[u32]) -> anyhow::Result<Vec<tokio::process::Child>> {
    cores
        .iter()
        .map(|core| {
            system::dies_with_bench(
                tokio::process::Command::new("chrt")
                    .args(["--idle", "0", "taskset", "-c", &core.to_string()])
                    .args(["sh", "-c", "while :; do :; done"]),
            )
            .spawn()
            .map_err(|e| anyhow::anyhow!("chrt: {e}"))
        })
        .collect()
}

fn port_of(addr: &str) -> anyhow::Result<u16> {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("address without a port: {addr}"))
}

async fn run(o: Opts) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let machine = system::machine();
    // The benchmark itself (its /proc sampling, its own client) stays off
    // the proxy's core.
    system::pin(std::process::id(), o.load_core)?;
    let tck = system::clock_ticks();
    // Idle connections: the client's sockets here, the proxy's (and, for a
    // proxy without pooling, the backend's) on the other side.
    let most_idle = o.idle_connections.iter().copied().max().unwrap_or(0);
    let max_connections = (most_idle + 1_000).max(10_000);
    let nofile = system::raise_nofile(2 * max_connections as u64 + 4_096);
    anyhow::ensure!(
        nofile as usize > most_idle + 1_024,
        "RLIMIT_NOFILE is {nofile}: too low for {most_idle} idle connections"
    );

    let mut targets = o.targets.clone();
    let mut ballast_extra = Vec::new();
    if targets.iter().any(|t| t.is_ballast()) {
        let help = servers::ballast_proxy_help(o.proxy_binary()).await;
        // The header read timeout also ends idle keep-alive connections
        // (10 s by default); opening 10,000 of them can take longer. A
        // longer timeout arms the same timer, so costs the same memory.
        if help
            .as_deref()
            .is_some_and(|h| h.contains("--http1-header-read-timeout"))
        {
            ballast_extra.extend(["--http1-header-read-timeout".into(), "3600s".into()]);
        }
        match help {
            None => anyhow::bail!(
                "`{} {}--help` fails: build it with `cargo build --release -p ballast`, \
                 or leave the ballast targets out (--targets)",
                o.proxy_binary().display(),
                servers::proxy_subcommand(o.proxy_binary())
                    .iter()
                    .map(|a| format!("{a} "))
                    .collect::<String>()
            ),
            Some(help) if !help.contains("--inbound-forward-port") => {
                eprintln!(
                    "`{}` has no --inbound-forward-port: ballast-2hop is skipped",
                    o.proxy_binary().display()
                );
                targets.retain(|t| *t != Target::Ballast2);
            }
            Some(_) => {}
        }
    }

    let _spinners = if o.keep_awake {
        keep_awake(&[o.load_core, o.proxy_core])?
    } else {
        Vec::new()
    };
    let tmp = tempfile::tempdir()?;
    let nginx = servers::nginx(tmp.path(), o.load_core, max_connections).await?;
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let backend_port = port_of(&nginx.addr)?;
    let hop_port = servers::free_port()?;
    servers::write_manifests(&manifests, backend_port, hop_port, true)?;
    let controller = if targets.iter().any(|t| t.is_ballast()) {
        let args = vec!["--manifests".to_string(), manifests.display().to_string()];
        let (c, _) = ballast_bench::start(&o.ballast, &args).await?;
        system::pin(c.pid(), o.load_core)?;
        Some(c)
    } else {
        None
    };
    let mut env = Env {
        tck,
        backend: nginx.addr.clone(),
        backend_port,
        hop_port,
        controller,
        dir: tmp.path().to_path_buf(),
        max_connections,
        ballast_extra,
        haproxy_max: max_connections.min((nofile as usize).saturating_sub(200) / 2),
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
        "targets: {}; proxies on core {}, backend and load on core {}; RLIMIT_NOFILE {nofile}",
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
            let m = measure(&o, &env, t).await;
            let m = env.cause(m)?;
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
        // Memory per idle connection does not depend on other processes'
        // CPU: measured once per accepted round.
        for m in &mut measured {
            for &count in &o.idle_connections {
                let idle = measure_idle(&o, &env, m.target, count).await;
                if let Some(idle) = env.cause(idle)? {
                    report::print_idle(n, m.target, &idle);
                    m.idle.push(idle);
                }
            }
        }
        rounds.push(Round { measured });
    }
    report::print(&o, &targets, &rounds, discarded);
    if let Some(c) = env.controller.as_mut() {
        c.running()?;
    }
    // Every request answered: a proxy that fails requests measures as fast.
    let measured = || rounds.iter().flat_map(|r| &r.measured);
    let failed: u64 = measured()
        .map(|m| m.fixed.iter().map(|(_, f, _)| f.failed).sum::<u64>() + m.max.errors())
        .sum();
    anyhow::ensure!(
        failed == 0,
        "{failed} requests failed (non-200 answers or socket errors, wrk's timeouts not \
         counted): see the lines above"
    );
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
