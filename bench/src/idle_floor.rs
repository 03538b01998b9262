//! `idle-floor`: what a pause costs memory-bound work on this machine (not
//! a test).
//!
//! A change reaches the controller after a pause of any length; the fan-out
//! it starts walks thousands of streams' state (pointer chasing, mostly
//! cache misses). This measures the same kind of work with nothing else in
//! it: a walk of HOPS steps through a random cycle over MIB of memory, and a
//! loop of arithmetic that touches no memory, each timed after sleeping GAP
//! milliseconds, REPEATS times per gap, all in one process. When the walk
//! slows with the gap and the arithmetic does not, the machine loses the
//! process's cached memory while it sleeps (a shared cache, a virtual
//! machine's host), and a controller's first fan-out after a pause pays for
//! it, whatever the controller does.
//!
//! The walk runs twice per pause, side by side: over memory in 4 KiB pages
//! and over memory the kernel was asked to back with huge pages
//! (`MADV_HUGEPAGE`; transparent huge pages in `madvise` or `always` mode).
//! When only the first slows, what the pause cost is address translation
//! (the TLB and page-walk caches), not the data caches.

use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: idle-floor [--mib N] [--hops N] [--gaps MS,MS,...] [--repeats N]

  --mib N          memory walked (default 32)
  --hops N         steps of each walk (default 300000)
  --gaps MS,...    pauses before each measurement, in ms (default
                   0,50,200,1000,3000)
  --repeats N      measurements per gap (default 3)";

struct Opts {
    mib: usize,
    hops: usize,
    gaps: Vec<u64>,
    repeats: usize,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        mib: 32,
        hops: 300_000,
        gaps: vec![0, 50, 200, 1000, 3000],
        repeats: 3,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--mib" => o.mib = args.parse()?,
            "--hops" => o.hops = args.parse()?,
            "--gaps" => {
                o.gaps = args
                    .value()?
                    .split(',')
                    .map(|g| g.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("--gaps: {e}\n{USAGE}"))?
            }
            "--repeats" => o.repeats = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(
        o.mib >= 1 && o.hops >= 1 && o.repeats >= 1 && !o.gaps.is_empty(),
        "--mib, --hops, --repeats must be at least 1 and --gaps not empty\n{USAGE}"
    );
    Ok(o)
}

const HUGE_PAGE: usize = 2 << 20;

/// `n` slots, 2 MiB-aligned, asked to be backed by huge pages when `huge`
/// (before any of their pages is touched); whether the kernel accepted.
fn slots(n: usize, huge: bool) -> (Vec<u32>, usize, bool) {
    let mut v: Vec<u32> = Vec::with_capacity(n + HUGE_PAGE / 4);
    let base = v.as_mut_ptr() as usize;
    let start = (base + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let offset = (start - base) / 4;
    let mut advised = false;
    if huge {
        // SAFETY: [start, start + 4n) lies inside `v`'s allocation (capacity
        // n + HUGE_PAGE / 4 slots from `base`, and start - base < HUGE_PAGE);
        // madvise only advises the kernel about those pages.
        advised =
            unsafe { libc::madvise(start as *mut libc::c_void, n * 4, libc::MADV_HUGEPAGE) } == 0;
    }
    v.resize(offset + n, 0);
    (v, offset, advised)
}

/// A random cycle through `next` (Sattolo's shuffle): following it visits
/// every slot once, in an order no prefetcher guesses.
fn cycle(next: &mut [u32]) {
    for (i, slot) in next.iter_mut().enumerate() {
        *slot = i as u32;
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..next.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        next.swap(i, (x % i as u64) as usize);
    }
}

/// This process's anonymous memory in huge pages, KiB (smaps_rollup).
fn anon_huge_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn walk(next: &[u32], hops: usize) -> (Duration, u32) {
    let t = Instant::now();
    let mut p = 0u32;
    for _ in 0..hops {
        p = next[p as usize];
    }
    (t.elapsed(), p)
}

fn arithmetic() -> (Duration, u64) {
    let t = Instant::now();
    let mut a = 1u64;
    for i in 0..20_000_000u64 {
        a = a.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
    }
    (t.elapsed(), a)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    let n = (o.mib * 1024 * 1024 / 4).max(2);
    let (mut small, small_at, _) = slots(n, false);
    let (mut huge, huge_at, advised) = slots(n, true);
    cycle(&mut small[small_at..]);
    cycle(&mut huge[huge_at..]);
    let (small, huge) = (&small[small_at..], &huge[huge_at..]);
    let hops = o.hops.min(n);
    println!(
        "idle-floor: a walk of {hops} steps through {} MiB (in 4 KiB pages, then in huge \
         pages), and 20M multiply-adds, each after a pause; {} per pause",
        o.mib, o.repeats
    );
    println!(
        "huge pages: {} (AnonHugePages of this process: {})",
        if advised {
            "asked for with MADV_HUGEPAGE"
        } else {
            "refused by the kernel (transparent huge pages off?): both walks use 4 KiB pages"
        },
        anon_huge_kib().map_or("unknown".to_string(), |k| format!("{k} KiB"))
    );
    println!();
    println!(
        "| pause | walk, 4 KiB pages: median (each) | walk, huge pages: median (each) | \
         arithmetic: median | 4 KiB walk vs no pause | huge-page walk vs no pause |"
    );
    println!("|---|---|---|---|---|---|");
    let mut base = None;
    let mut huge_base = None;
    let mut sink = 0u64;
    for &gap in &o.gaps {
        let mut walks = Vec::new();
        let mut huge_walks = Vec::new();
        let mut sums = Vec::new();
        for _ in 0..o.repeats {
            std::thread::sleep(Duration::from_millis(gap));
            let (w, p) = walk(small, hops);
            std::thread::sleep(Duration::from_millis(gap));
            let (h, q) = walk(huge, hops);
            let (a, s) = arithmetic();
            sink ^= u64::from(p) ^ u64::from(q) ^ s;
            walks.push(w);
            huge_walks.push(h);
            sums.push(a);
        }
        let each = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
        let median = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            v[v.len() / 2]
        };
        let (w, h) = (median(&walks), median(&huge_walks));
        let b = *base.get_or_insert(w);
        let hb = *huge_base.get_or_insert(h);
        let ratio = |x: Duration, b: Duration| x.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "| {gap} ms | {} ({}) | {} ({}) | {} | {:.2}x | {:.2}x |",
            ms(w),
            each(&walks),
            ms(h),
            each(&huge_walks),
            ms(median(&sums)),
            ratio(w, b),
            ratio(h, hb)
        );
    }
    // Printed so that the work cannot be optimised away.
    println!();
    println!("(checksum {})", sink & 0xff);
    anyhow::ensure!(
        base.is_some_and(|b| b > Duration::ZERO),
        "a walk measured as zero: the timer or the build is off"
    );
    Ok(())
}
