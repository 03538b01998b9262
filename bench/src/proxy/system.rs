//! What the proxy benchmark reads from /proc: CPU time of one process, and
//! the CPU time of everything else on the machine (to tell a disturbed round).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Clock ticks per second of /proc/PID/stat times (`getconf CLK_TCK`).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// One process as /proc/PID/stat shows it.
struct Stat {
    comm: String,
    ppid: u32,
    /// utime + stime, in clock ticks.
    cpu: u64,
    /// Start time after boot, in clock ticks.
    start: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // fields[0] is field 3 of proc(5) (state).
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        comm,
        ppid: u32::try_from(num(1)?).ok()?,
        cpu: num(11)? + num(12)?,
        start: num(19)?,
    })
}

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    stat(pid).map(|s| s.cpu).unwrap_or(0)
}

fn uptime_ticks(tck: f64) -> u64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * tck) as u64)
        .unwrap_or(0)
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CPU used by processes that are neither this benchmark's nor the kernel's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Foreign {
    /// Core-seconds used by foreign processes during the window.
    pub cpu_seconds: f64,
    pub wall: Duration,
    /// A compiler ran during the window (another build on these 2 cores).
    pub rustc: bool,
}

impl Foreign {
    /// Average foreign load in cores.
    pub fn cores(&self) -> f64 {
        self.cpu_seconds / self.wall.as_secs_f64().max(1e-3)
    }
}

/// Samples /proc every 500 ms on its own thread until finished.
pub struct ForeignMonitor {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(u64, bool)>,
    started: Instant,
    tck: f64,
}

impl ForeignMonitor {
    pub fn start(tck: f64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let me = std::process::id();
        let handle = std::thread::spawn(move || sample_until(&flag, me, tck));
        Self {
            stop,
            handle,
            started: Instant::now(),
            tck,
        }
    }

    pub fn finish(self) -> Foreign {
        self.stop.store(true, Ordering::Relaxed);
        let (ticks, rustc) = self.handle.join().unwrap_or((0, false));
        Foreign {
            cpu_seconds: ticks as f64 / self.tck,
            wall: self.started.elapsed(),
            rustc,
        }
    }
}

fn sample_until(stop: &AtomicBool, me: u32, tck: f64) -> (u64, bool) {
    let since = uptime_ticks(tck);
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut total = 0u64;
    let mut rustc = false;
    let mut first = true;
    loop {
        let stats: HashMap<u32, Stat> = all_pids()
            .into_iter()
            .filter_map(|p| Some((p, stat(p)?)))
            .collect();
        let mut now = HashMap::with_capacity(stats.len());
        for (&pid, s) in &stats {
            if pid == 2 || s.ppid == 2 || descends_from(pid, me, &stats) {
                continue;
            }
            rustc |= s.comm == "rustc";
            let used = match last.get(&pid) {
                Some(&before) => s.cpu.saturating_sub(before),
                // Born during the window: all of its time counts.
                None if !first && s.start >= since => s.cpu,
                None => 0,
            };
            total += used;
            now.insert(pid, s.cpu);
        }
        last = now;
        first = false;
        if stop.load(Ordering::Relaxed) {
            return (total, rustc);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn descends_from(mut pid: u32, ancestor: u32, stats: &HashMap<u32, Stat>) -> bool {
    // Bounded walk: a process tree is shallow; a cycle cannot hold us.
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match stats.get(&pid) {
            Some(s) if s.ppid > 1 => pid = s.ppid,
            _ => return false,
        }
    }
    false
}

/// Waits until foreign processes use less than `max_cores` over a 2 s
/// window and no compiler runs, for at most `patience`. Returns the last
/// window seen (quiet or not).
pub fn wait_for_quiet(tck: f64, max_cores: f64, patience: Duration) -> (Foreign, bool) {
    let deadline = Instant::now() + patience;
    let mut announced = false;
    loop {
        let monitor = ForeignMonitor::start(tck);
        std::thread::sleep(Duration::from_secs(2));
        let f = monitor.finish();
        let quiet = f.cores() < max_cores && !f.rustc;
        if quiet || Instant::now() >= deadline {
            return (f, quiet);
        }
        if !announced {
            eprintln!(
                "  waiting for the machine to go quiet (foreign load {:.2} cores{})",
                f.cores(),
                if f.rustc { ", rustc running" } else { "" }
            );
            announced = true;
        }
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// `nproc`, the CPU model and the kernel, for the results.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown")
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    format!(
        "nproc {cores}, {model}, {:.0} GiB, kernel {}",
        mem_kib as f64 / 1024.0 / 1024.0,
        kernel.trim()
    )
}

/// First line of `PROGRAM ARGS` output (stdout or stderr), for versions.
pub fn version(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines().next().map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| format!("{program}: not found"))
}

/// Pins every thread of `pid` to `core` (`taskset -a -p -c`).
pub fn pin(pid: u32, core: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "taskset failed on pid {pid}");
    Ok(())
}

/// RssAnon of a process, in KiB: its private memory, without the clean file
/// pages (program text, libraries) that VmRSS also counts.
pub fn rss_anon(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Raises this process's RLIMIT_NOFILE (soft and hard, which children
/// inherit) to at least `want` with `prlimit`; as root the hard limit can
/// grow too. Returns the soft limit in force afterwards.
pub fn raise_nofile(want: u64) -> u64 {
    let pid = std::process::id().to_string();
    let set = |limit: String| {
        std::process::Command::new("prlimit")
            .args(["--pid", &pid, &format!("--nofile={limit}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !set(format!("{want}:{want}")) {
        // Not allowed to raise the hard limit: the soft one up to it.
        let _ = set(format!("{}:", nofile_limit().1));
    }
    nofile_limit().0
}

/// (soft, hard) RLIMIT_NOFILE of this process.
fn nofile_limit() -> (u64, u64) {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            (
                v.first().copied().unwrap_or(1024),
                v.get(1).copied().unwrap_or(1024),
            )
        })
        .unwrap_or((1024, 1024))
}

/// One unlabelled sample from a Prometheus text page at `admin`/metrics.
pub async fn metric(admin: &str, name: &str) -> Option<f64> {
    let (status, text) = crate::http_get(admin, "/metrics").await;
    if status != 200 {
        return None;
    }
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Makes `cmd`'s child die with the bench: killed when its handle is
/// dropped, and by the kernel when the bench itself dies (a killed bench
/// runs no drop, and a controller or hog left behind would skew every later
/// measurement). The kernel's signal follows the spawning thread, so spawn
/// from the runtime (its threads live as long as the bench), never from a
/// blocking task's thread.
pub fn dies_with_bench(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.kill_on_drop(true);
    // SAFETY: the closure only makes one async-signal-safe call.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd
}

/// CPU hogs: `sh -c 'while :; do :; done'`, dying with the bench.
pub fn hogs(n: usize) -> anyhow::Result<Vec<tokio::process::Child>> {
    (0..n)
        .map(|_| {
            dies_with_bench(tokio::process::Command::new("sh").args(["-c", "while :; do :; done"]))
                .spawn()
                .map_err(|e| anyhow::anyhow!("a CPU hog (sh): {e}"))
        })
        .collect()
}
