//! Viz collector benchmark (not a test).
//!
//! Serves PODS simulated proxies from this process (cheap fake `/metrics`
//! servers, one per pod at its own loopback IP on port 4191, each page
//! about 108 KB shaped as a real proxy's with three destinations, its
//! counters advancing at every scrape), writes them as meshed pods of
//! DEPLOYMENTS Deployments in a manifests directory, and runs the release
//! `ballast viz --manifests DIR --scrape-interval 10s` on it, and a second
//! one on an empty directory as the baseline, side by side.
//!
//! After SETTLE cycles (95: the history of 90 points full, and with it the
//! latency windows, so memory is at its steady size; a history grows with
//! its points, it is not allocated whole up front), phase 1 (CYCLES scrape
//! cycles): cycle time (viz's
//! `viz_scrape_cycle_duration_seconds`), collector CPU (utime + stime from
//! /proc between cycle ends, % of one core), RSS, jemalloc allocated and
//! `viz_mesh_heap_bytes`, per pod against the empty viz.
//!
//! Phase 2 (CYCLES more): two misbehaving pods join, one that accepts and
//! never answers and one that answers 100 MB. Every other pod must still be
//! scraped each cycle, the 100 MB one counted `too_large` (from when the two
//! were added: their first try may fall before the measured cycles, and the
//! next comes after their backoff), and RSS must stay under baseline +
//! pods x per-pod + concurrency x max page bytes.
//!
//! It fails when viz did not serve: a viz process that exited, no scrape
//! cycle ending, a phase 1 cycle without one page scraped ok, fakes never
//! asked for a page, and the three checks of phase 2 above.

#[path = "viz/cluster.rs"]
mod cluster;
#[path = "viz/fakes.rs"]
mod fakes;
#[path = "viz/page.rs"]
mod page;
use ballast_bench::system;

use ballast_bench::{http_get, is_error_line, rss, spawn_listening, wait_ready, write_atomic};
use cluster::Cluster;
use fakes::{Behaviour, Served};
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};
use tokio::process::{Child, Command};

const USAGE: &str = "Usage: viz-bench [--ballast PATH] [--pods N] [--deployments N] \
[--cycles N] [--settle N] [--interval SECS] [--scrape-concurrency N] [--max-page-mib N] \
[--quiet-wait SECS (600)] [--keep DIR] [-- EXTRA VIZ ARGS]";

struct Opts {
    ballast: PathBuf,
    pods: usize,
    deployments: usize,
    cycles: usize,
    /// Cycles run before phase 1 is measured.
    settle: usize,
    interval_secs: u64,
    /// Used for the memory bound; passed to viz only when given.
    concurrency: Option<usize>,
    max_page_mib: Option<u64>,
    /// How long phase 1 waits for other processes to go quiet.
    quiet_wait: Duration,
    keep: Option<PathBuf>,
    extra: Vec<String>,
}

/// Cycles before phase 1: viz's default history (90 points) and five more.
const DEFAULT_SETTLE: usize = 95;

/// viz's defaults (`ballast viz --help`): what the bound uses when the
/// flags are not given.
const DEFAULT_CONCURRENCY: usize = 64;
const DEFAULT_MAX_PAGE_MIB: u64 = 8;

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        pods: 2_000,
        deployments: 200,
        cycles: 6,
        settle: DEFAULT_SETTLE,
        interval_secs: 10,
        concurrency: None,
        max_page_mib: None,
        quiet_wait: Duration::from_secs(600),
        keep: None,
        extra: Vec::new(),
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--" => o.extra = args.rest(),
            "--ballast" => o.ballast = args.value()?.into(),
            "--pods" => o.pods = args.parse()?,
            "--deployments" => o.deployments = args.parse()?,
            "--cycles" => o.cycles = args.parse()?,
            "--settle" => o.settle = args.parse()?,
            "--interval" => o.interval_secs = args.parse()?,
            "--scrape-concurrency" => o.concurrency = Some(args.parse()?),
            "--max-page-mib" => o.max_page_mib = Some(args.parse()?),
            "--quiet-wait" => o.quiet_wait = Duration::from_secs(args.parse()?),
            "--keep" => o.keep = Some(args.value()?.into()),
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(o.pods >= 1 && o.deployments >= 1 && o.cycles >= 1);
    anyhow::ensure!(o.pods <= 250 * 250 * 100, "at most 6,250,000 pods");
    Ok(o)
}

/// A `ballast viz` process on OS-picked ports.
struct Viz {
    child: Child,
    http: String,
    admin: String,
}

impl Viz {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Starts `ballast viz --manifests DIR ARGS` and waits for `/ready`.
    async fn start(ballast: &Path, dir: &Path, args: &[String]) -> anyhow::Result<Self> {
        let started = Instant::now();
        let (child, [http, admin]) = spawn_listening(
            "ballast viz",
            Command::new(ballast)
                .arg("viz")
                .arg("--manifests")
                .arg(dir)
                .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
                .args(args)
                .env("BALLAST_LOG", "warn,ballast=info"),
            ["viz dashboard listening on ", "admin listening on "],
            is_error_line,
        )
        .await?;
        let mut viz = Viz { child, http, admin };
        wait_ready(
            "ballast viz",
            &viz.admin,
            &mut viz.child,
            started + Duration::from_secs(120),
        )
        .await?;
        Ok(viz)
    }

    /// Fails if this viz has exited.
    fn running(&mut self) -> anyhow::Result<()> {
        ballast_bench::running(&mut self.child, "ballast viz")
    }
}

/// Sum of the samples of `name` (exactly, or with labels) whose labels
/// contain every one of `having`.
fn metric(text: &str, name: &str, having: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter(|l| having.iter().all(|h| l.contains(h)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What viz's admin /metrics and /proc say at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    at: Option<Instant>,
    cycles: f64,
    cycle_secs: f64,
    ok: f64,
    timeout: f64,
    too_large: f64,
    failed: f64,
    pods: f64,
    pods_ok: f64,
    pods_unreachable: f64,
    heap: f64,
    allocated: f64,
    /// jemalloc's resident bytes (its pages in memory, metadata included).
    resident: f64,
    rss_kib: u64,
    hwm_kib: u64,
    /// Of the RSS, the anonymous pages (heap, stacks) and the file-backed
    /// ones (the binary's code and data as far as it ran).
    anon_kib: u64,
    file_kib: u64,
    cpu_ticks: u64,
    bench_ticks: u64,
}

/// `RssAnon` and `RssFile` of `/proc/PID/status`, KiB.
fn rss_kinds(pid: u32) -> (u64, u64) {
    ballast_bench::status_kib(pid, "RssAnon:", "RssFile:")
}

async fn sample(viz: &Viz) -> Sample {
    let (_, text) = http_get(&viz.admin, "/metrics").await;
    let (rss_kib, hwm_kib) = rss(viz.pid());
    let (anon_kib, file_kib) = rss_kinds(viz.pid());
    let scrapes = |r: &str| metric(&text, "viz_scrapes_total", &[&format!("result=\"{r}\"")]);
    Sample {
        at: Some(Instant::now()),
        cycles: metric(&text, "viz_scrape_cycles_total", &[]),
        cycle_secs: metric(&text, "viz_scrape_cycle_duration_seconds", &[]),
        ok: scrapes("ok"),
        timeout: scrapes("timeout"),
        too_large: scrapes("too_large"),
        failed: metric(&text, "viz_scrapes_total", &[]) - scrapes("ok"),
        pods: metric(&text, "viz_pods", &[]),
        pods_ok: metric(&text, "viz_pods", &["state=\"ok\""]),
        pods_unreachable: metric(&text, "viz_pods", &["state=\"unreachable\""]),
        heap: metric(&text, "viz_mesh_heap_bytes", &[]),
        allocated: metric(&text, "process_memory_allocated_bytes", &[]),
        resident: metric(&text, "process_memory_resident_bytes", &[]),
        rss_kib,
        hwm_kib,
        anon_kib,
        file_kib,
        cpu_ticks: system::cpu_ticks(viz.pid()),
        bench_ticks: system::cpu_ticks(std::process::id()),
    }
}

/// One scrape cycle, from the end of the one before to its own end.
#[derive(Clone, Copy, Debug)]
struct Cycle {
    secs: f64,
    /// Wall time from the cycle end before, and viz's CPU seconds in it.
    wall: f64,
    cpu_secs: f64,
    cpu_pct: f64,
    fakes_cpu_pct: f64,
    ok: f64,
    timeout: f64,
    too_large: f64,
    failed: f64,
    /// Pods whose `last_scrape_at` (viz's /api/pods) moved this cycle.
    fresh: Option<usize>,
    /// RSS polled during the cycle (and at its end).
    rss: RssSeen,
    end: Sample,
}

/// RSS as polled (every 200 ms) while waiting for cycle ends: what the
/// process holds between cycles, not only at their ends.
#[derive(Clone, Copy, Debug, Default)]
struct RssSeen {
    min_kib: u64,
    max_kib: u64,
    sum_kib: u64,
    n: u64,
}

impl RssSeen {
    fn add(&mut self, kib: u64) {
        self.min_kib = if self.n == 0 {
            kib
        } else {
            self.min_kib.min(kib)
        };
        self.max_kib = self.max_kib.max(kib);
        self.sum_kib += kib;
        self.n += 1;
    }

    fn merge(&mut self, o: &RssSeen) {
        if o.n == 0 {
            return;
        }
        self.min_kib = if self.n == 0 {
            o.min_kib
        } else {
            self.min_kib.min(o.min_kib)
        };
        self.max_kib = self.max_kib.max(o.max_kib);
        self.sum_kib += o.sum_kib;
        self.n += o.n;
    }

    fn mean_kib(&self) -> u64 {
        self.sum_kib / self.n.max(1)
    }
}

/// Polls viz until a cycle ends (its counter moves), `deadline` at most.
async fn next_cycle_end(viz: &mut Viz, after: f64, deadline: Duration) -> anyhow::Result<Sample> {
    next_cycle_end_seen(viz, after, deadline, &mut RssSeen::default()).await
}

/// [`next_cycle_end`], adding the RSS of every poll to `seen`.
async fn next_cycle_end_seen(
    viz: &mut Viz,
    after: f64,
    deadline: Duration,
    seen: &mut RssSeen,
) -> anyhow::Result<Sample> {
    let started = Instant::now();
    loop {
        viz.running()?;
        let s = sample(viz).await;
        seen.add(s.rss_kib);
        if s.cycles > after {
            return Ok(s);
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "no scrape cycle ended within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The body of an HTTP/1.1 response (de-chunked when chunked).
fn body(response: &str) -> String {
    let Some((head, rest)) = response.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return rest.to_string();
    }
    let mut out = String::new();
    let mut rest = rest;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Each pod's `last_scrape_at` from viz's `/api/pods`; `None` if viz does
/// not answer it.
async fn last_scrapes(viz: &Viz) -> Option<HashMap<String, u64>> {
    let (status, text) = http_get(&viz.http, "/api/pods").await;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body(&text)).ok()?;
    Some(
        v["pods"]
            .as_array()?
            .iter()
            .filter_map(|p| {
                let name = p["pod"]["name"].as_str()?;
                Some((name.to_string(), p["last_scrape_at"].as_u64().unwrap_or(0)))
            })
            .collect(),
    )
}

/// Pods (the generated ones, not the faulty) scraped again since `before`.
fn fresh(before: &HashMap<String, u64>, now: &HashMap<String, u64>) -> usize {
    now.iter()
        .filter(|(name, _)| !name.starts_with("faulty-"))
        .filter(|(name, at)| **at > 0 && before.get(*name).is_none_or(|b| **at > *b))
        .count()
}

async fn cycles(
    viz: &mut Viz,
    n: usize,
    interval: Duration,
    tck: f64,
) -> anyhow::Result<Vec<Cycle>> {
    let deadline = interval * 3 + Duration::from_secs(30);
    let mut prev = next_cycle_end(viz, sample(viz).await.cycles, deadline).await?;
    let mut prev_scrapes = last_scrapes(viz).await;
    let mut out = Vec::new();
    while out.len() < n {
        let mut rss = RssSeen::default();
        let end = next_cycle_end_seen(viz, prev.cycles, deadline, &mut rss).await?;
        let scrapes = last_scrapes(viz).await;
        let wall = end
            .at
            .zip(prev.at)
            .map_or(1.0, |(a, b)| (a - b).as_secs_f64())
            .max(1e-3);
        let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / tck / wall * 100.0;
        let c = Cycle {
            secs: end.cycle_secs,
            wall,
            cpu_secs: end.cpu_ticks.saturating_sub(prev.cpu_ticks) as f64 / tck,
            cpu_pct: pct(end.cpu_ticks, prev.cpu_ticks),
            fakes_cpu_pct: pct(end.bench_ticks, prev.bench_ticks),
            ok: end.ok - prev.ok,
            timeout: end.timeout - prev.timeout,
            too_large: end.too_large - prev.too_large,
            failed: end.failed - prev.failed,
            fresh: prev_scrapes
                .as_ref()
                .zip(scrapes.as_ref())
                .map(|(b, a)| fresh(b, a)),
            rss,
            end,
        };
        eprintln!(
            "  cycle {}: {:.3} s, viz CPU {:.1}%, fakes CPU {:.1}%, ok {}, timeout {}, too_large {}, pods scraped again {:?}, RSS {:.1} MB",
            out.len() + 1,
            c.secs,
            c.cpu_pct,
            c.fakes_cpu_pct,
            c.ok,
            c.timeout,
            c.too_large,
            c.fresh,
            end.rss_kib as f64 / 1024.0
        );
        out.push(c);
        prev = end;
        prev_scrapes = scrapes;
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn span(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn fmt_ms(secs: &[f64]) -> String {
    let ms: Vec<f64> = secs.iter().map(|s| s * 1000.0).collect();
    let (lo, hi) = span(&ms);
    format!("{:.0} ms ({:.0}-{:.0})", median(ms), lo, hi)
}

fn fmt_pct(v: &[f64]) -> String {
    let (lo, hi) = span(v);
    format!("{:.1}% ({:.1}-{:.1})", median(v.to_vec()), lo, hi)
}

fn mb(kib: u64) -> String {
    format!("{:.1} MB", kib as f64 * 1024.0 / 1e6)
}

/// Waits until viz counts `want` meshed pods.
async fn wait_pods(viz: &mut Viz, want: f64, deadline: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        viz.running()?;
        let s = sample(viz).await;
        if s.pods >= want {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "viz sees {} pods, not {want}, after {deadline:?}",
            s.pods
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: cargo build --release -p ballast --bin ballast",
        o.ballast.display()
    );
    let tck = system::clock_ticks();
    // Listeners and their connections here, viz's connections in the child
    // (it inherits the limit).
    let nofile = system::raise_nofile(4 * o.pods as u64 + 4_096);
    anyhow::ensure!(
        nofile as usize > 2 * o.pods + 256,
        "RLIMIT_NOFILE is {nofile}: too low for {} fakes",
        o.pods
    );
    let cluster = Cluster {
        pods: o.pods,
        deployments: o.deployments,
    };

    // The fakes.
    let template = Arc::new(page::Template::compile(&page::proxy_page_text())?);
    let served = Arc::new(Served::default());
    for i in 0..o.pods {
        let p = cluster.pod(i);
        fakes::spawn(
            SocketAddr::new(p.ip, p.admin_port),
            Behaviour::Page {
                template: template.clone(),
                labels: cluster.page_labels(i),
            },
            served.clone(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", p.ip, p.admin_port))?;
    }
    let hang_ip = IpAddr::V4(Ipv4Addr::new(127, 200, 0, 1));
    let huge_ip = IpAddr::V4(Ipv4Addr::new(127, 200, 0, 2));
    let fault_served = Arc::new(Served::default());
    for (ip, b) in [(hang_ip, Behaviour::Hang), (huge_ip, Behaviour::Huge)] {
        fakes::spawn(
            SocketAddr::new(ip, cluster::ADMIN_PORT),
            b,
            fault_served.clone(),
        )
        .await?;
    }
    let mut sample_page = Vec::new();
    template.render(&cluster.page_labels(0), 0, &mut sample_page);

    // The manifests.
    let tmp = tempfile::tempdir()?;
    let dir = o.keep.clone().unwrap_or_else(|| tmp.path().join("cluster"));
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(&empty)?;
    for (file, text) in cluster.files() {
        write_atomic(&dir.join(file), &text)?;
    }

    let interval = Duration::from_secs(o.interval_secs);
    let mut args = vec![
        "--scrape-interval".to_string(),
        format!("{}s", o.interval_secs),
    ];
    if o.interval_secs <= 5 {
        // The timeout (5 s by default) must stay under the interval.
        args.extend([
            "--scrape-timeout".to_string(),
            format!("{}ms", o.interval_secs * 500),
        ]);
    }
    if let Some(c) = o.concurrency {
        args.extend(["--scrape-concurrency".to_string(), c.to_string()]);
    }
    if let Some(m) = o.max_page_mib {
        args.extend(["--max-page-bytes".to_string(), format!("{m}MiB")]);
    }
    args.extend(o.extra.iter().cloned());
    let concurrency = o.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    let max_page_bytes = o.max_page_mib.unwrap_or(DEFAULT_MAX_PAGE_MIB) * 1024 * 1024;

    eprintln!(
        "{} fakes up (page {} bytes); starting ballast viz {args:?}",
        o.pods,
        sample_page.len()
    );
    let mut baseline = Viz::start(&o.ballast, &empty, &args).await?;
    let mut viz = Viz::start(&o.ballast, &dir, &args).await?;
    eprintln!("viz at http://{}/ (admin {})", viz.http, viz.admin);
    wait_pods(&mut viz, o.pods as f64, Duration::from_secs(120)).await?;
    // Settle first: every page seen, and the history (90 points per
    // resource and route, the newest 30 with their latency buckets) full,
    // so memory is at its steady size.
    let settle_deadline = interval * 3 + Duration::from_secs(60);
    let first = sample(&viz).await.cycles;
    let mut at = next_cycle_end(&mut viz, first, settle_deadline).await?;
    for i in 0..o.settle {
        at = next_cycle_end(&mut viz, at.cycles, settle_deadline).await?;
        if (i + 1) % 5 == 0 {
            eprintln!(
                "  settling: {}/{} cycles, RSS {}",
                i + 1,
                o.settle,
                mb(at.rss_kib)
            );
        }
    }

    // Other work on these cores skews CPU and cycle time: wait for quiet
    // (a while at most), and say how busy the machine was meanwhile.
    let quiet_wait = o.quiet_wait;
    let (_, quiet) =
        tokio::task::spawn_blocking(move || system::wait_for_quiet(tck, 0.3, quiet_wait)).await?;
    eprintln!(
        "phase 1: {} pods, {} cycles (machine quiet: {quiet})",
        o.pods, o.cycles
    );
    let monitor = system::ForeignMonitor::start(tck);
    let clean = cycles(&mut viz, o.cycles, interval, tck).await?;
    // Every cycle of phase 1 read pages: a viz that scrapes nothing still
    // ends cycles.
    anyhow::ensure!(
        clean.iter().all(|c| c.ok > 0.0),
        "phase 1: a scrape cycle with no page scraped ok"
    );
    let foreign_clean = monitor.finish();
    let base = sample(&baseline).await;
    let main_end = clean.last().expect("cycles").end;

    eprintln!("phase 2: + a hanging pod and a 100 MB pod");
    let (hang, huge) = cluster::faulty(hang_ip, huge_ip);
    let faulty_yaml = format!(
        "{}---\n{}",
        cluster::pod_yaml(&hang, o.pods),
        cluster::pod_yaml(&huge, o.pods + 1)
    );
    // The faulty pods are first tried in the cycle that finds them, which
    // may end before the measured cycles start, and then only after their
    // backoff: `too_large` is counted from here, not over those cycles.
    let before_faults = sample(&viz).await;
    write_atomic(&dir.join("faulty.yaml"), &faulty_yaml)?;
    wait_pods(&mut viz, o.pods as f64 + 2.0, Duration::from_secs(60)).await?;
    let monitor = system::ForeignMonitor::start(tck);
    let faults = cycles(&mut viz, o.cycles, interval, tck).await?;
    let foreign_faults = monitor.finish();
    let fault_end = faults.last().expect("cycles").end;
    let base_end = sample(&baseline).await;

    // Figures.
    let pods = o.pods as f64;
    let per_pod = |a: f64, b: f64| (a - b) / pods;
    let rss_per_pod = per_pod(
        main_end.rss_kib as f64 * 1024.0,
        base.rss_kib as f64 * 1024.0,
    );
    let alloc_per_pod = per_pod(main_end.allocated, base.allocated);
    let heap_per_pod = main_end.heap / pods;
    let bound_bytes = base_end.rss_kib as f64 * 1024.0
        + pods * rss_per_pod.max(0.0)
        + concurrency as f64 * max_page_bytes as f64;
    let clean_secs: Vec<f64> = clean.iter().map(|c| c.secs).collect();
    let fault_secs: Vec<f64> = faults.iter().map(|c| c.secs).collect();
    let min_ok = |v: &[Cycle]| v.iter().map(|c| c.ok).fold(f64::INFINITY, f64::min);
    let sum = |v: &[Cycle], f: fn(&Cycle) -> f64| v.iter().map(f).sum::<f64>();
    // Every generated pod scraped in every cycle: its last_scrape_at moved
    // (viz's /api/pods); without that API, the ok scrapes of the phase.
    let all_scraped = if faults.iter().all(|c| c.fresh.is_some()) {
        faults.iter().all(|c| c.fresh == Some(o.pods))
    } else {
        sum(&faults, |c| c.ok) >= pods * faults.len() as f64
    };
    let too_large = sum(&faults, |c| c.too_large);
    let too_large_since_added = fault_end.too_large - before_faults.too_large;
    let timeouts = sum(&faults, |c| c.timeout);
    let under_bound = (fault_end.hwm_kib as f64 * 1024.0) < bound_bytes;

    println!(
        "\n`viz-bench --pods {} --deployments {} --cycles {} --settle {} --interval {}` ({}; viz {args:?})\n",
        o.pods,
        o.deployments,
        o.cycles,
        o.settle,
        o.interval_secs,
        system::machine()
    );
    println!(
        "Simulated proxy page: {} bytes, {} sample lines; fakes served {} pages, {} connections.\n",
        sample_page.len(),
        sample_page
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty() && l[0] != b'#')
            .count(),
        served.requests.load(Ordering::Relaxed),
        served.connections.load(Ordering::Relaxed),
    );
    println!(
        "| | empty viz | {} pods | {} pods + a hanging and a 100 MB pod |",
        o.pods, o.pods
    );
    println!("|---|---|---|---|");
    println!(
        "| scrape cycle time, median (min-max) | | {} | {} |",
        fmt_ms(&clean_secs),
        fmt_ms(&fault_secs)
    );
    println!(
        "| collector CPU, % of one core, median (min-max) | | {} | {} |",
        fmt_pct(&clean.iter().map(|c| c.cpu_pct).collect::<Vec<_>>()),
        fmt_pct(&faults.iter().map(|c| c.cpu_pct).collect::<Vec<_>>())
    );
    // A cycle that waits on a timeout ends late and the next window is
    // short, so per-cycle figures swing; the phase's average does not.
    let phase_cpu = |v: &[Cycle]| sum(v, |c| c.cpu_secs) / sum(v, |c| c.wall).max(1e-3) * 100.0;
    println!(
        "| collector CPU over the phase, % of one core | | {:.1}% | {:.1}% |",
        phase_cpu(&clean),
        phase_cpu(&faults)
    );
    println!(
        "| fakes' CPU (this process), % of one core, median | | {:.1}% | {:.1}% |",
        median(clean.iter().map(|c| c.fakes_cpu_pct).collect()),
        median(faults.iter().map(|c| c.fakes_cpu_pct).collect())
    );
    let min_fresh = |v: &[Cycle]| {
        v.iter()
            .map(|c| c.fresh)
            .min()
            .flatten()
            .map_or("-".to_string(), |n| n.to_string())
    };
    println!(
        "| pods scraped again each cycle (/api/pods last_scrape_at), fewest | | {} | {} |",
        min_fresh(&clean),
        min_fresh(&faults)
    );
    println!(
        "| scrapes ok per cycle, fewest | | {} | {} ({}) |",
        min_ok(&clean),
        min_ok(&faults),
        if all_scraped {
            "every pod every cycle"
        } else {
            "SOME PODS MISSED A CYCLE"
        }
    );
    let foreign = |f: &system::Foreign| {
        format!(
            "{:.2} cores{}",
            f.cores(),
            if f.rustc { ", a compiler ran" } else { "" }
        )
    };
    println!(
        "| other processes' CPU meanwhile | | {} | {} |",
        foreign(&foreign_clean),
        foreign(&foreign_faults)
    );
    println!(
        "| meshed pods shown ok / unreachable at the end | | {} / {} | {} / {} |",
        main_end.pods_ok, main_end.pods_unreachable, fault_end.pods_ok, fault_end.pods_unreachable
    );
    println!(
        "| failed scrapes over the cycles | | {} | {} (timeout {timeouts}, too_large {too_large}) |",
        sum(&clean, |c| c.failed),
        sum(&faults, |c| c.failed)
    );
    println!(
        "| too_large since the faulty pods were added (their first try included) | | | {too_large_since_added} |"
    );
    println!(
        "| RSS | {} | {} | {} |",
        mb(base_end.rss_kib),
        mb(main_end.rss_kib),
        mb(fault_end.rss_kib)
    );
    let ends = |v: &[Cycle]| {
        let kib: Vec<f64> = v.iter().map(|c| c.end.rss_kib as f64).collect();
        let (lo, hi) = span(&kib);
        format!(
            "{} ({}-{})",
            mb(median(kib.clone()) as u64),
            mb(lo as u64),
            mb(hi as u64)
        )
    };
    println!(
        "| RSS at each cycle's end, median (min-max) | | {} | {} |",
        ends(&clean),
        ends(&faults)
    );
    let polled = |v: &[Cycle]| {
        let mut all = RssSeen::default();
        for c in v {
            all.merge(&c.rss);
        }
        all
    };
    let (polled_clean, polled_faults) = (polled(&clean), polled(&faults));
    println!(
        "| RSS polled every 200 ms over the phase, mean (min-max) | | {} ({}-{}) | {} ({}-{}) |",
        mb(polled_clean.mean_kib()),
        mb(polled_clean.min_kib),
        mb(polled_clean.max_kib),
        mb(polled_faults.mean_kib()),
        mb(polled_faults.min_kib),
        mb(polled_faults.max_kib)
    );
    println!(
        "| peak RSS (VmHWM) | {} | {} | {} |",
        mb(base_end.hwm_kib),
        mb(main_end.hwm_kib),
        mb(fault_end.hwm_kib)
    );
    println!(
        "| of the RSS: anonymous / file-backed (the binary's pages) | {} / {} | {} / {} | {} / {} |",
        mb(base_end.anon_kib),
        mb(base_end.file_kib),
        mb(main_end.anon_kib),
        mb(main_end.file_kib),
        mb(fault_end.anon_kib),
        mb(fault_end.file_kib)
    );
    println!(
        "| jemalloc allocated | {:.1} MB | {:.1} MB | {:.1} MB |",
        base_end.allocated / 1e6,
        main_end.allocated / 1e6,
        fault_end.allocated / 1e6
    );
    println!(
        "| jemalloc resident | {:.1} MB | {:.1} MB | {:.1} MB |",
        base_end.resident / 1e6,
        main_end.resident / 1e6,
        fault_end.resident / 1e6
    );
    println!(
        "| viz_mesh_heap_bytes | {:.1} MB | {:.1} MB | {:.1} MB |",
        base_end.heap / 1e6,
        main_end.heap / 1e6,
        fault_end.heap / 1e6
    );
    println!(
        "| **per pod**: RSS / allocated / mesh heap | | **{:.1} KB** / {:.1} KB / {:.1} KB | |",
        rss_per_pod / 1e3,
        alloc_per_pod / 1e3,
        heap_per_pod / 1e3
    );
    let base_bytes = base.rss_kib as f64 * 1024.0;
    let median_end = median(clean.iter().map(|c| c.end.rss_kib as f64).collect()) * 1024.0;
    println!(
        "| per pod, RSS: at the median cycle end / polled mean / polled max | | {:.1} KB / {:.1} KB / {:.1} KB | |",
        per_pod(median_end, base_bytes) / 1e3,
        per_pod(polled_clean.mean_kib() as f64 * 1024.0, base_bytes) / 1e3,
        per_pod(polled_clean.max_kib as f64 * 1024.0, base_bytes) / 1e3
    );
    println!(
        "\nMemory bound with the faults: empty RSS {} + {} pods x {:.1} KB + {} scrapes x {} MiB = {:.1} MB; \
         peak RSS measured {} ({}).",
        mb(base_end.rss_kib),
        o.pods,
        rss_per_pod / 1e3,
        concurrency,
        max_page_bytes / 1024 / 1024,
        bound_bytes / 1e6,
        mb(fault_end.hwm_kib),
        if under_bound { "under" } else { "OVER THE BOUND" }
    );
    println!(
        "Growth of peak RSS from phase 1 to phase 2 (the faults): {}.",
        mb(fault_end.hwm_kib.saturating_sub(main_end.hwm_kib))
    );
    println!("\nPer cycle (phase 2):\n");
    println!("| cycle | time | viz CPU | pods scraped again | ok | timeout | too_large | RSS |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, c) in faults.iter().enumerate() {
        println!(
            "| {} | {:.0} ms | {:.1}% | {} | {} | {} | {} | {} |",
            i + 1,
            c.secs * 1000.0,
            c.cpu_pct,
            c.fresh.map_or("-".to_string(), |n| n.to_string()),
            c.ok,
            c.timeout,
            c.too_large,
            mb(c.end.rss_kib)
        );
    }
    viz.running()?;
    baseline.running()?;
    drop(viz);
    drop(baseline);
    anyhow::ensure!(
        served.requests.load(Ordering::Relaxed) > 0,
        "no fake proxy was asked for its page"
    );
    anyhow::ensure!(
        all_scraped,
        "some pods were not scraped in a cycle with the faults"
    );
    anyhow::ensure!(
        too_large_since_added > 0.0,
        "the 100 MB page was never counted too_large"
    );
    anyhow::ensure!(under_bound, "peak RSS over the bound");
    Ok(())
}
