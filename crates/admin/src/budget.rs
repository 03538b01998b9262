//! A controller's memory budget (seed 000: a controller the kernel kills
//! for memory). Each of a controller's parts is bounded on its own; the sum
//! is bounded here. A thread reads the heap's resident bytes every
//! [`SAMPLE_INTERVAL`] (the larger of the allocator's count, refreshed
//! every [`ALLOCATOR_READ_EVERY`] readings, and the kernel's anonymous
//! resident memory, which it charges the container for, read at each) and
//! sets the pressure:
//!
//! - under [`REFUSE_PERCENT`] of the limit: normal;
//! - from it: **refusing**: new streams (or scrapes, or certificates) are
//!   refused with a retry hint ([`RETRY_AFTER`]) until resident memory is
//!   back under [`RESUME_PERCENT`];
//! - from [`CLOSE_PERCENT`]: **closing**: the owner closes its costliest
//!   work first, until the pressure falls.
//!
//! Under pressure the allocator hands freed pages back to the kernel at
//! once rather than after its decay time, so that what the owner closes,
//! and what work in flight frees, shows in the next reading.
//!
//! The owner asks [`MemoryBudget::refuse`] before new work and follows
//! [`MemoryBudget::watch`] for the closing step. The limit defaults to
//! [`DEFAULT_LIMIT_PERCENT`] of the container's memory limit (cgroup v2
//! `memory.max`, v1 `memory.limit_in_bytes`); the rest is what the
//! allocator does not count (the binary's pages, thread stacks, the
//! kernel's socket buffers).
//!
//! Readiness does not change with the pressure: the other replicas behind
//! the Service are as likely to be full, and an unready replica keeps every
//! stream it has while new connections pile onto the others. Refusing with
//! a hint spreads the retries instead.

use crate::memory::AllocatorReadings;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use tokio::sync::watch;

/// The default limit, as a percentage of the container's memory limit.
pub const DEFAULT_LIMIT_PERCENT: u64 = 75;
/// Resident memory, as a percentage of the limit, from which new work is
/// refused.
pub const REFUSE_PERCENT: u64 = 85;
/// Resident memory, as a percentage of the limit, under which refused work
/// is taken again (a gap, so that the pressure does not flap).
pub const RESUME_PERCENT: u64 = 80;
/// Resident memory, as a percentage of the limit, from which the costliest
/// work is closed.
pub const CLOSE_PERCENT: u64 = 95;
/// How often resident memory is read: what arrives between two readings is
/// what overshoots a threshold. A reading is one `pread` of
/// `/proc/self/statm` (microseconds), and every [`ALLOCATOR_READ_EVERY`]
/// one jemalloc epoch refresh too.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(10);
/// How long a client refused for memory is told to wait before it retries
/// (gRPC's `grpc-retry-pushback-ms`).
pub const RETRY_AFTER: Duration = Duration::from_secs(5);
/// The metadata key of gRPC's retry hint: milliseconds a client should wait
/// before it tries again.
pub const RETRY_PUSHBACK_KEY: &str = "grpc-retry-pushback-ms";
/// The sampler thread's stack: it reads counters and sets a flag.
const SAMPLER_STACK: usize = 256 * 1024;

/// How close resident memory is to the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    /// Under [`REFUSE_PERCENT`].
    Normal = 0,
    /// New work is refused.
    Refusing = 1,
    /// The costliest work is closed, new work refused.
    Closing = 2,
}

impl Pressure {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Pressure::Normal,
            1 => Pressure::Refusing,
            _ => Pressure::Closing,
        }
    }

    /// The pressure after a reading of `resident` bytes under `limit`, from
    /// `self`.
    pub fn next(self, resident: u64, limit: u64) -> Pressure {
        let at = |percent: u64| (u128::from(limit) * u128::from(percent) / 100) as u64;
        if resident >= at(CLOSE_PERCENT) {
            Pressure::Closing
        } else if resident >= at(REFUSE_PERCENT)
            || (self > Pressure::Normal && resident >= at(RESUME_PERCENT))
        {
            Pressure::Refusing
        } else {
            Pressure::Normal
        }
    }
}

/// A controller's memory budget; cheap to clone and to ask.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: Option<u64>,
    pressure: AtomicU8,
    changes: watch::Sender<Pressure>,
    metrics: BudgetMetrics,
}

impl MemoryBudget {
    /// Starts reading resident memory against `limit`; without one the
    /// budget never refuses.
    pub fn start(limit: Option<u64>) -> Self {
        let budget = Self::unstarted(limit);
        if let Some(limit) = limit {
            // Its own thread, not a task: under a burst the runtime's queue
            // is full of the very work that allocates.
            let weak = Arc::downgrade(&budget.inner);
            let spawned = std::thread::Builder::new()
                .name("memory-budget".into())
                .stack_size(SAMPLER_STACK)
                .spawn(move || sample(limit, weak));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the memory sampler; --memory-limit is not enforced");
            }
        }
        budget
    }

    /// A budget whose pressure only [`MemoryBudget::set`] changes (tests).
    pub fn unstarted(limit: Option<u64>) -> Self {
        let metrics = BudgetMetrics::default();
        metrics
            .limit_bytes
            .set(limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        Self {
            inner: Arc::new(Inner {
                limit,
                pressure: AtomicU8::new(Pressure::Normal as u8),
                changes: watch::channel(Pressure::Normal).0,
                metrics,
            }),
        }
    }

    /// The limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.inner.limit
    }

    /// The pressure now.
    pub fn pressure(&self) -> Pressure {
        Pressure::from_u8(self.inner.pressure.load(Ordering::Relaxed))
    }

    /// Sets the pressure (the sampler does; tests may).
    pub fn set(&self, pressure: Pressure) {
        self.inner.set(pressure);
    }

    /// True when new work of `api` must be refused; counts the refusal.
    pub fn refuse(&self, api: &'static str) -> bool {
        if self.pressure() == Pressure::Normal {
            return false;
        }
        self.inner
            .metrics
            .refused_total
            .get_or_create(&ApiLabels { api })
            .inc();
        true
    }

    /// Counts `n` pieces of new work of `api` refused (for owners that
    /// refuse in batches, reading [`MemoryBudget::pressure`] once).
    pub fn refused(&self, api: &'static str, n: u64) {
        if n > 0 {
            self.inner
                .metrics
                .refused_total
                .get_or_create(&ApiLabels { api })
                .inc_by(n);
        }
    }

    /// Counts work of `api` closed to relieve memory.
    pub fn closed(&self, api: &'static str, n: u64) {
        self.inner
            .metrics
            .closed_total
            .get_or_create(&ApiLabels { api })
            .inc_by(n);
    }

    /// Follows the pressure's changes (for the closing step).
    pub fn watch(&self) -> watch::Receiver<Pressure> {
        self.inner.changes.subscribe()
    }

    /// Registers the budget's families (`memory_limit_bytes`,
    /// `memory_pressure`, `memory_refused`, `memory_closed`).
    pub fn register(&self, r: &mut Registry) {
        let m = &self.inner.metrics;
        r.register(
            "memory_limit_bytes",
            "The --memory-limit on resident memory (0: none)",
            m.limit_bytes.clone(),
        );
        r.register(
            "memory_pressure",
            "0 normal; 1 refusing new work (resident memory past 85% of --memory-limit, until under 80%); 2 closing the costliest work too (past 95%)",
            m.pressure.clone(),
        );
        r.register(
            "memory_refused",
            "New work (streams, scrapes, certificates) refused because memory was near --memory-limit, by API",
            m.refused_total.clone(),
        );
        r.register(
            "memory_closed",
            "Open work (streams) closed, costliest first, because memory was past 95% of --memory-limit, by API",
            m.closed_total.clone(),
        );
    }
}

impl Inner {
    fn set(&self, pressure: Pressure) {
        let before = Pressure::from_u8(self.pressure.swap(pressure as u8, Ordering::Relaxed));
        if before == pressure {
            return;
        }
        self.metrics.pressure.set(pressure as i64);
        self.changes.send_replace(pressure);
        match pressure {
            Pressure::Normal => tracing::info!("memory back under the limit: taking new work"),
            Pressure::Refusing if before == Pressure::Normal => {
                tracing::warn!(limit = ?self.limit, "memory near the limit: refusing new work until it falls")
            }
            Pressure::Refusing => {}
            Pressure::Closing => tracing::warn!(
                limit = ?self.limit,
                "memory at the limit: closing the costliest work"
            ),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    api: &'static str,
}

#[derive(Debug, Default)]
struct BudgetMetrics {
    limit_bytes: Gauge,
    pressure: Gauge,
    refused_total: Family<ApiLabels, Counter>,
    closed_total: Family<ApiLabels, Counter>,
}

/// How many sampler readings share one reading of jemalloc's count: it is
/// refreshed every tenth (100 ms). Its refresh merges every arena's
/// statistics (about 100 µs, nine tenths of an idle controller's sampling
/// CPU when done at every tick); the kernel's count, read at every tick, is
/// what follows pages as they are touched.
pub const ALLOCATOR_READ_EVERY: u32 = 10;

/// jemalloc's count of its resident pages, refreshed.
fn heap_resident() -> Option<u64> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    u64::try_from(tikv_jemalloc_ctl::stats::resident::read().ok()?).ok()
}

/// Readings of the heap's resident bytes: the larger of what jemalloc
/// counts and the process's anonymous resident memory, or `None` where the
/// allocator cannot tell. The kernel charges the container for the latter:
/// more than jemalloc counts when its pages are huge (a 2 MiB page is
/// charged whole from its first touch; `ballast install
/// --controller-huge-pages`), and by thread stacks and memory allocated
/// outside jemalloc. The kernel's count is read at each reading, the
/// allocator's on [`AllocatorReadings`]' schedule: every
/// [`ALLOCATOR_READ_EVERY`] (at each when the kernel's cannot be read). A
/// move of the kernel's count needs no early refresh here: the kernel's
/// count is in the figure.
struct Resident {
    heap: AllocatorReadings,
}

impl Default for Resident {
    fn default() -> Self {
        Resident {
            heap: AllocatorReadings::every(ALLOCATOR_READ_EVERY),
        }
    }
}

impl Resident {
    /// One reading, given the kernel's count now and how to read the heap's.
    fn read(&mut self, kernel: Option<u64>, heap: impl FnOnce() -> Option<u64>) -> Option<u64> {
        let heap = self.heap.read(kernel, heap)?;
        Some(kernel.map_or(heap, |anon| anon.max(heap)))
    }
}

/// Reads every [`SAMPLE_INTERVAL`] until the budget is dropped.
fn sample(limit: u64, budget: Weak<Inner>) {
    let statm = crate::memory::Statm::open();
    let mut resident = Resident::default();
    loop {
        std::thread::sleep(SAMPLE_INTERVAL);
        let Some(inner) = budget.upgrade() else {
            return;
        };
        let kernel = statm.as_ref().and_then(crate::memory::Statm::anonymous);
        let Some(bytes) = resident.read(kernel, heap_resident) else {
            tracing::warn!(
                "the allocator does not report resident bytes; --memory-limit is not enforced"
            );
            return;
        };
        let before = Pressure::from_u8(inner.pressure.load(Ordering::Relaxed));
        let now = before.next(bytes, limit);
        // Under pressure, what is freed (closed work, a buffer grown into a
        // larger one) leaves resident memory at once, so that the reading
        // falls with it; jemalloc would keep it for 10 s.
        if (before == Pressure::Normal) != (now == Pressure::Normal) {
            crate::memory::return_freed_memory_at_once(now > Pressure::Normal);
        }
        inner.set(now);
    }
}

/// The limit a controller takes when `--memory-limit` is not given: a
/// [`DEFAULT_LIMIT_PERCENT`] share of the container's memory limit, if it
/// has one.
pub fn default_limit() -> Option<u64> {
    container_limit().map(|l| (u128::from(l) * u128::from(DEFAULT_LIMIT_PERCENT) / 100) as u64)
}

/// This process's memory cgroup limit (v2 `memory.max`, v1
/// `memory.limit_in_bytes` and the hierarchy's), or `None` when there is
/// none or it cannot be read.
pub fn container_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_files(&cgroups, Path::new("/sys/fs/cgroup"))
        .into_iter()
        .filter_map(|(path, read)| Some(read(&std::fs::read_to_string(path).ok()?)))
        .flatten()
        .min()
}

type LimitReader = fn(&str) -> Option<u64>;

/// The files that may hold this process's memory limit, given
/// `/proc/self/cgroup` and where cgroups are mounted, each with how to read
/// it. A container sees its own cgroup as the root; a process in a cgroup
/// of a host sees its path.
fn limit_files(proc_cgroup: &str, root: &Path) -> Vec<(PathBuf, LimitReader)> {
    let mut files: Vec<(PathBuf, LimitReader)> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            for dir in [root.join("memory").join(relative), root.join("memory")] {
                files.push((dir.join("memory.limit_in_bytes"), read_limit));
                files.push((dir.join("memory.stat"), read_hierarchical_limit));
            }
        } else if id == "0" && controllers.is_empty() {
            for dir in [root.join(relative), root.to_path_buf()] {
                files.push((dir.join("memory.max"), read_limit));
            }
        }
    }
    files
}

/// A limit file's value: bytes, or `max` (v2) or a number near 2^63 (v1)
/// for none.
fn read_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < 1 << 60).then_some(bytes)
}

/// v1 `memory.stat`'s `hierarchical_memory_limit`: the least limit of the
/// cgroup and its parents.
fn read_hierarchical_limit(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
        .and_then(read_limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn anonymous_resident_memory_is_read_from_proc_statm_as_status_says() {
        let _serial = crate::memory::tests::exclusive_jemalloc();
        let statm = crate::memory::Statm::open().expect("/proc/self/statm");
        let fast = statm.anonymous().expect("statm read");
        assert!(Resident::default()
            .read(Some(fast), heap_resident)
            .is_some_and(|b| b > 0));
        let status = crate::memory::KernelMemory::read()
            .anonymous
            .expect("RssAnon read");
        // Read one after the other while other tests may allocate: close,
        // not equal. Read twice from the one open file: it is read afresh.
        assert!(fast.abs_diff(status) < 8 * MIB, "{fast} / {status}");
        let held = std::hint::black_box(vec![1u8; 32 * MIB as usize]);
        let grown = statm.anonymous().expect("statm read again");
        assert!(grown >= fast + 24 * MIB, "{fast} then {grown}");
        drop(held);
    }

    #[test]
    fn the_allocator_is_read_every_tenth_reading_and_the_larger_count_wins() {
        let heap_reads = std::cell::Cell::new(0u64);
        let heap = || {
            heap_reads.set(heap_reads.get() + 1);
            Some(100 * heap_reads.get())
        };
        // The kernel's count swings around the heap's.
        let mut r = Resident::default();
        let readings: Vec<u64> = (1..=25u64)
            .map(|n| {
                let kernel = if n.is_multiple_of(2) { 1_000 } else { 1 };
                r.read(Some(kernel), heap).expect("a figure")
            })
            .collect();
        // Readings 1, 11 and 21 read the heap (100, 200, 300).
        assert_eq!(heap_reads.get(), 3);
        assert_eq!(&readings[..3], &[100, 1_000, 100]);
        assert_eq!(&readings[9..13], &[1_000, 200, 1_000, 200]);
        assert_eq!(&readings[19..23], &[1_000, 300, 1_000, 300]);

        // Where the kernel cannot tell, the heap is read at every reading.
        let reads = std::cell::Cell::new(0u64);
        let mut r = Resident::default();
        let readings: Vec<u64> = (0..12)
            .map(|_| {
                r.read(None, || {
                    reads.set(reads.get() + 1);
                    Some(reads.get())
                })
                .expect("a figure")
            })
            .collect();
        assert_eq!(readings, (1..=12).collect::<Vec<_>>());
        // No heap figure at all: none, as where jemalloc cannot tell.
        let mut r = Resident::default();
        assert_eq!(r.read(Some(7), || None), None);
    }

    #[test]
    fn pressure_rises_by_thresholds_and_falls_with_a_gap() {
        let limit = 100 * MIB;
        let p = Pressure::Normal;
        assert_eq!(p.next(84 * MIB, limit), Pressure::Normal);
        assert_eq!(p.next(85 * MIB, limit), Pressure::Refusing);
        assert_eq!(p.next(95 * MIB, limit), Pressure::Closing);
        // Down from closing: refusing until under the resume mark.
        assert_eq!(Pressure::Closing.next(90 * MIB, limit), Pressure::Refusing);
        assert_eq!(Pressure::Refusing.next(81 * MIB, limit), Pressure::Refusing);
        assert_eq!(Pressure::Refusing.next(79 * MIB, limit), Pressure::Normal);
        // No overflow near u64::MAX.
        assert_eq!(Pressure::Normal.next(u64::MAX, u64::MAX), Pressure::Closing);
    }

    #[test]
    fn refusals_and_closures_are_counted_and_changes_seen() {
        let budget = MemoryBudget::unstarted(Some(64 * MIB));
        let mut changes = budget.watch();
        assert!(!budget.refuse("Get"));
        budget.set(Pressure::Refusing);
        assert!(changes.has_changed().expect("sender alive"));
        assert_eq!(*changes.borrow_and_update(), Pressure::Refusing);
        assert!(budget.refuse("Get"));
        assert!(budget.refuse("Get"));
        budget.closed("OutboundPolicies.Watch", 3);
        let mut registry = Registry::default();
        budget.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            "memory_limit_bytes 67108864",
            "memory_pressure 1",
            "memory_refused_total{api=\"Get\"} 2",
            "memory_closed_total{api=\"OutboundPolicies.Watch\"} 3",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        budget.set(Pressure::Normal);
        assert!(!budget.refuse("Get"));
    }

    #[test]
    fn a_started_budget_without_a_limit_never_refuses() {
        let budget = MemoryBudget::start(None);
        assert_eq!(budget.limit(), None);
        assert!(!budget.refuse("Get"));
    }

    #[test]
    fn a_limit_below_resident_memory_refuses_within_a_few_samples() {
        // Its sampler switches the allocator to returning freed pages at
        // once: not while another test checks the decay times.
        let _exclusive = crate::memory::tests::exclusive_jemalloc();
        // One byte: whatever this process holds is over it.
        let budget = MemoryBudget::start(Some(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while budget.pressure() != Pressure::Closing {
            assert!(
                std::time::Instant::now() < deadline,
                "the sampler never read the limit"
            );
            std::thread::sleep(SAMPLE_INTERVAL);
        }
        assert!(budget.refuse("Get"));
        // The switch came before the pressure was set, and the pressure
        // stays past a one-byte limit: no other switch follows. Undo it.
        drop(budget);
        crate::memory::return_freed_memory_at_once(false);
    }

    #[test]
    fn cgroup_limits_are_found_for_v1_v2_and_none() {
        let root = Path::new("/cg");
        let v1 = "4:memory:/pods/a\n3:cpu,cpuacct:/pods/a\n0::/\n";
        let files: Vec<PathBuf> = limit_files(v1, root).into_iter().map(|f| f.0).collect();
        assert_eq!(
            files[..4],
            [
                PathBuf::from("/cg/memory/pods/a/memory.limit_in_bytes"),
                PathBuf::from("/cg/memory/pods/a/memory.stat"),
                PathBuf::from("/cg/memory/memory.limit_in_bytes"),
                PathBuf::from("/cg/memory/memory.stat"),
            ]
        );
        let v2 = "0::/kubepods/pod1/c\n";
        let files: Vec<PathBuf> = limit_files(v2, root).into_iter().map(|f| f.0).collect();
        assert_eq!(
            files,
            [
                PathBuf::from("/cg/kubepods/pod1/c/memory.max"),
                PathBuf::from("/cg/memory.max"),
            ]
        );
        assert!(limit_files("garbage\n\n", root).is_empty());
        assert_eq!(read_limit("268435456\n"), Some(256 * MIB));
        assert_eq!(read_limit("max\n"), None);
        assert_eq!(read_limit("9223372036854771712\n"), None);
        assert_eq!(read_limit("-1"), None);
        assert_eq!(
            read_hierarchical_limit("cache 0\nhierarchical_memory_limit 67108864\nrss 1\n"),
            Some(64 * MIB)
        );
        assert_eq!(read_hierarchical_limit("cache 0\n"), None);
    }
}
