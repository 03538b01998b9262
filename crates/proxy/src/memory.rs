//! The memory limit: while the allocator reports at least `--memory-limit`
//! bytes allocated, new connections are closed at accept and new requests
//! get 503, so that the proxy sheds load instead of growing until the kernel
//! kills it (seed 004). Work already admitted carries on; it is what frees
//! the memory.

use crate::metrics::{Metrics, ShedLabels};
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

/// How often allocated bytes are read while a limit is set and memory is
/// within half of it: cheap (one jemalloc epoch refresh) and rare enough not
/// to keep an idle sidecar's CPU awake.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// How often once memory is past half the limit: a burst of admitted work
/// between two readings is what overshoots the limit.
pub const SAMPLE_INTERVAL_NEAR_LIMIT: Duration = Duration::from_millis(5);

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
            .memory_limit_bytes
            .set(limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        if let Some(limit) = limit {
            tokio::spawn(sample(limit, Arc::downgrade(&over), metrics.clone()));
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
            .memory_shed_total
            .get_or_create(&ShedLabels { kind })
            .inc();
        true
    }
}

/// Bytes the allocator has handed out, or `None` where it cannot tell.
fn allocated() -> Option<u64> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    let bytes = tikv_jemalloc_ctl::stats::allocated::read().ok()?;
    u64::try_from(bytes).ok()
}

async fn sample(limit: u64, over: std::sync::Weak<AtomicBool>, metrics: Arc<Metrics>) {
    let mut next = SAMPLE_INTERVAL;
    loop {
        tokio::time::sleep(next).await;
        let Some(over) = over.upgrade() else { return };
        let Some(bytes) = allocated() else {
            tracing::warn!(
                "the allocator does not report allocated bytes; --memory-limit is not enforced"
            );
            return;
        };
        let now_over = bytes >= limit;
        next = if bytes >= limit / 2 {
            SAMPLE_INTERVAL_NEAR_LIMIT
        } else {
            SAMPLE_INTERVAL
        };
        if over.swap(now_over, Ordering::Relaxed) != now_over {
            metrics.memory_shedding.set(i64::from(now_over));
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
