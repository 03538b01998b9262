//! The memory limit: while the allocator reports at least `--memory-limit`
//! bytes allocated, new connections are closed at accept and new requests
//! get 503, so that the proxy sheds load instead of growing until the kernel
//! kills it (seed 004). Work already admitted carries on; it is what frees
//! the memory. Allocated bytes are refreshed every 100 ms, and at the next
//! 10 ms reading whenever the kernel's count of the process's anonymous
//! memory moved by a MiB: an idle proxy's sampler costs about half of what
//! a refresh at every reading did (the rest is mostly its 100 wake-ups a
//! second).

use crate::metrics::Metrics;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

/// How often the sampler reads while a limit is set. What a burst admits
/// between two readings of allocated bytes is what overshoots the limit. A
/// reading is one `pread` of `/proc/self/statm` (microseconds); allocated
/// bytes are read afresh only when that moved (see [`ALLOCATED_READ_EVERY`]).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(10);

/// Allocated bytes are refreshed every this many readings (100 ms), and at
/// once at a reading where the kernel's count of the process's anonymous
/// resident memory moved by [`MOVED_BYTES`] since the last refresh. Their
/// refresh (a jemalloc epoch) merges every arena's statistics, about 30 µs
/// in a proxy: at every reading that was half the sampler's CPU, idle. A
/// burst that allocates touches its pages, and the kernel's count follows
/// every page touched: a burst is still read every [`SAMPLE_INTERVAL`].
/// One that reuses pages an earlier burst freed (still resident, so the
/// kernel's count does not move) is seen at the next scheduled refresh, at
/// most 100 ms later; those pages are charged to the container already.
pub const ALLOCATED_READ_EVERY: u32 = 10;

/// How far the kernel's anonymous resident memory moves (either way) before
/// allocated bytes are read at the next reading rather than on schedule.
pub const MOVED_BYTES: u64 = 1024 * 1024;

/// The sampler thread's stack: it reads a counter and sets a flag.
const SAMPLER_STACK: usize = 256 * 1024;

/// Whether the proxy is over its memory limit; cheap to check per request.
#[derive(Clone, Debug)]
pub struct MemoryLimit {
    over: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl MemoryLimit {
    /// Starts sampling when `limit` is set; without one, never sheds.
    pub fn start(limit: Option<u64>, metrics: Arc<Metrics>) -> Self {
        let over = Arc::new(AtomicBool::new(false));
        metrics
            .memory
            .memory_limit_bytes
            .set(limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        if let Some(limit) = limit {
            // Its own thread, not a task: under a burst the runtime's queue
            // is full of the very connections that allocate, and a sample
            // that waited behind them would see the limit late.
            let (weak, metrics) = (Arc::downgrade(&over), metrics.clone());
            let spawned = std::thread::Builder::new()
                .name("memory-limit".into())
                .stack_size(SAMPLER_STACK)
                .spawn(move || sample(limit, weak, metrics));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the memory sampler; --memory-limit is not enforced");
            }
        }
        Self { over, metrics }
    }

    /// True when new work of `kind` (`connection` or `request`) must be
    /// refused; counts the refusal.
    pub fn shed(&self, kind: &'static str) -> bool {
        if !self.over.load(Ordering::Relaxed) {
            return false;
        }
        self.metrics
            .memory
            .memory_shed_total
            .get_or_create(&ShedLabels { kind })
            .inc();
        true
    }
}

/// Bytes the allocator has handed out, refreshed, or `None` where it cannot
/// tell.
fn allocated() -> Option<u64> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    let bytes = tikv_jemalloc_ctl::stats::allocated::read().ok()?;
    u64::try_from(bytes).ok()
}

/// Samples every [`SAMPLE_INTERVAL`] until the [`MemoryLimit`] is dropped.
fn sample(limit: u64, over: std::sync::Weak<AtomicBool>, metrics: Arc<Metrics>) {
    let statm = ballast_admin::Statm::open();
    let mut readings =
        ballast_admin::AllocatorReadings::every(ALLOCATED_READ_EVERY).or_when_moved(MOVED_BYTES);
    loop {
        std::thread::sleep(SAMPLE_INTERVAL);
        let Some(over) = over.upgrade() else { return };
        let kernel = statm.as_ref().and_then(ballast_admin::Statm::anonymous);
        let Some(bytes) = readings.read(kernel, allocated) else {
            tracing::warn!(
                "the allocator does not report allocated bytes; --memory-limit is not enforced"
            );
            return;
        };
        let now_over = bytes >= limit;
        if over.swap(now_over, Ordering::Relaxed) != now_over {
            metrics.memory.memory_shedding.set(i64::from(now_over));
            if now_over {
                tracing::warn!(
                    allocated = bytes,
                    limit,
                    "memory limit reached: refusing new connections and requests until it falls"
                );
            } else {
                tracing::info!(allocated = bytes, limit, "memory back under the limit");
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    /// `connection` or `request`.
    pub kind: &'static str,
}

/// The memory limit's metrics: the limit, whether it sheds, what it shed.
#[derive(Debug, Default)]
pub struct MemoryMetrics {
    /// Connections and requests refused because memory was at the limit.
    pub memory_shed_total: Family<ShedLabels, Counter>,
    /// The memory limit (0 when there is none).
    pub memory_limit_bytes: Gauge,
    /// 1 while allocated memory is at or over the limit.
    pub memory_shedding: Gauge,
}

impl MemoryMetrics {
    /// Registers the families under the proxy's registry (Linkerd's names).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "memory_shed",
            "Connections and requests refused because allocated memory was at --memory-limit",
            self.memory_shed_total.clone(),
        );
        r.register(
            "memory_limit_bytes",
            "The --memory-limit (0: none)",
            self.memory_limit_bytes.clone(),
        );
        r.register(
            "memory_shedding",
            "1 while allocated memory is at or over --memory-limit",
            self.memory_shedding.clone(),
        );
    }
}
