//! `vcpu-stalls`: how long this machine stops running a thread that wants
//! the CPU, with nothing else running (not a test).
//!
//! The fan-out benchmarks measure a busy machine by adding CPU hogs. On a
//! virtual machine whose host caps the guest's CPU time, a guest that uses
//! all its vCPUs exhausts the cap and a vCPU is stopped for the rest of
//! the host's accounting period: every thread on it, the controller's
//! included, waits that long, whatever it does. This measures exactly that
//! with nothing but spinning threads: each spins for SECONDS, reading the
//! monotonic clock, and records every gap of at least GAP_MS between two
//! readings (time it was not run). With fewer spinners than vCPUs the
//! guest's scheduler has an idle vCPU to run a spinner on, so a gap there is
//! the host's. Sets run one after the other, side by side in one run:
//! 1 spinner, then 2, ... up to SPINNERS.
//!
//! It also reads the guest's `steal` time (`/proc/stat`) over each set, and
//! whether the long gaps (50 ms or more) start on a grid (the host's
//! period): how many of them start, modulo GRID_MS, within 2 ms of the
//! first one's start.

use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: vcpu-stalls [--spinners N] [--seconds S] [--gap-ms MS] [--grid-ms MS]

  --spinners N   sets from 1 spinning thread up to N (default: the number
                 of CPUs)
  --seconds S    how long each set spins (default 20)
  --gap-ms MS    the least gap counted as a stall (default 2)
  --grid-ms MS   the period the gaps' starts are checked against (default
                 100: the Linux CFS bandwidth period)";

/// Gaps recorded per spinner at most; more are counted, not kept.
const MAX_GAPS: usize = 100_000;

struct Opts {
    spinners: usize,
    seconds: f64,
    gap: Duration,
    grid: Duration,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        spinners: std::thread::available_parallelism().map_or(2, |n| n.get()),
        seconds: 20.0,
        gap: Duration::from_millis(2),
        grid: Duration::from_millis(100),
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--spinners" => o.spinners = args.parse()?,
            "--seconds" => o.seconds = args.parse()?,
            "--gap-ms" => o.gap = Duration::from_millis(args.parse()?),
            "--grid-ms" => o.grid = Duration::from_millis(args.parse()?),
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(
        o.spinners >= 1 && o.seconds > 0.0 && !o.gap.is_zero() && !o.grid.is_zero(),
        "--spinners, --seconds, --gap-ms and --grid-ms must be positive\n{USAGE}"
    );
    Ok(o)
}

/// What one spinner saw: its gaps (start since the set began, length),
/// how many more were not kept, and how many clock readings it made.
struct Spun {
    gaps: Vec<(Duration, Duration)>,
    dropped: usize,
    readings: u64,
}

fn spin(start: Instant, until: Duration, least: Duration) -> Spun {
    let mut spun = Spun {
        gaps: Vec::new(),
        dropped: 0,
        readings: 0,
    };
    let mut last = Instant::now();
    loop {
        let now = Instant::now();
        spun.readings += 1;
        let gap = now - last;
        if gap >= least {
            if spun.gaps.len() < MAX_GAPS {
                spun.gaps.push((last - start, gap));
            } else {
                spun.dropped += 1;
            }
        }
        last = now;
        if now - start >= until {
            return spun;
        }
    }
}

/// The guest's total and steal time so far, in clock ticks (`/proc/stat`).
fn steal_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    Some((ticks.iter().sum(), *ticks.get(7)?))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "vcpu-stalls: 1 to {} threads spinning {} s each on {cpus} CPUs; a stall is a gap of \
         at least {} ms between two clock readings",
        o.spinners,
        o.seconds,
        ms(o.gap)
    );
    println!();
    println!(
        "| spinners | stalls per spinner (each) | 2-10 / 10-50 / 50-150 / over 150 ms | \
         longest | time lost per spinner | stalls of 50 ms or more starting on one {} ms grid | \
         guest steal |",
        ms(o.grid)
    );
    println!("|---|---|---|---|---|---|---|");
    let until = Duration::from_secs_f64(o.seconds);
    let mut any_readings = 0u64;
    for n in 1..=o.spinners {
        let before = steal_ticks();
        let start = Instant::now();
        let spun: Vec<Spun> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| s.spawn(|| spin(start, until, o.gap)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a spinner"))
                .collect()
        });
        let after = steal_ticks();
        any_readings += spun.iter().map(|s| s.readings).min().unwrap_or(0);
        let counts: Vec<usize> = spun.iter().map(|s| s.gaps.len() + s.dropped).collect();
        let gaps: Vec<(Duration, Duration)> =
            spun.iter().flat_map(|s| s.gaps.iter().copied()).collect();
        let bucket = |lo: f64, hi: f64| {
            gaps.iter()
                .filter(|(_, g)| (lo..hi).contains(&ms(*g)))
                .count()
        };
        let lost = gaps.iter().fold(0.0, |sum, (_, g)| sum + ms(*g)) / n as f64;
        let longest = gaps.iter().map(|(_, g)| ms(*g)).fold(0.0, f64::max);
        // The host's stops are the long gaps; the short ones are mostly the
        // guest's own scheduling.
        let long: Vec<Duration> = gaps
            .iter()
            .filter(|(_, g)| ms(*g) >= 50.0)
            .map(|(at, _)| *at)
            .collect();
        let grid = o.grid.as_nanos() as i128;
        let on_grid = long.first().map(|first| {
            let phase = |d: &Duration| d.as_nanos() as i128 % grid;
            let first = phase(first);
            let near = long
                .iter()
                .filter(|at| {
                    let d = (phase(at) - first).rem_euclid(grid);
                    d.min(grid - d) <= 2_000_000
                })
                .count();
            format!("{near} of {}", long.len())
        });
        let steal = match (before, after) {
            (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => {
                format!("{:.1}%", (s1 - s0) as f64 * 100.0 / (t1 - t0) as f64)
            }
            _ => "unknown".into(),
        };
        println!(
            "| {n} | {} ({}) | {} / {} / {} / {} | {:.1} ms | {:.0} ms ({:.1}%) | {} | {steal} |",
            counts.iter().sum::<usize>() as f64 / n as f64,
            counts
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            bucket(2.0, 10.0),
            bucket(10.0, 50.0),
            bucket(50.0, 150.0),
            bucket(150.0, f64::INFINITY),
            longest,
            lost,
            lost * 100.0 / (o.seconds * 1e3),
            on_grid.unwrap_or_else(|| "no stall of 50 ms".into()),
        );
    }
    // A spinner that never read the clock measured nothing.
    anyhow::ensure!(any_readings > 0, "a spinner made no clock readings");
    Ok(())
}
