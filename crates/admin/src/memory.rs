//! Process memory metrics: the allocator's view (jemalloc `stats.allocated`,
//! `stats.resident`) with their high-water marks, and the kernel's view
//! (`VmRSS`, `VmHWM` from `/proc/self/status`, Linux only).
//!
//! The jemalloc figures describe the application's heap only when the binary
//! installs `tikv_jemallocator::Jemalloc` as its `#[global_allocator]`;
//! otherwise they describe jemalloc's own (nearly empty) state. A figure that
//! cannot be read is left out of the scrape; reading never panics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// How often [`spawn_memory_sampler`] samples jemalloc, so that a spike
/// between two scrapes still reaches the high-water marks.
pub const MEMORY_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Highest `stats.allocated` seen since start, in bytes (process-wide).
static ALLOCATED_MAX: AtomicU64 = AtomicU64::new(0);
/// Highest `stats.resident` seen since start, in bytes (process-wide).
static RESIDENT_MAX: AtomicU64 = AtomicU64::new(0);

/// Registers the process memory metrics in `registry`. Each scrape reads them
/// fresh; metric names are (before any prefix of `registry`):
///
/// | name | source |
/// |---|---|
/// | `process_memory_allocated_bytes` | jemalloc `stats.allocated` |
/// | `process_memory_resident_bytes` | jemalloc `stats.resident` |
/// | `process_memory_allocated_max_bytes` | highest `stats.allocated` seen since start |
/// | `process_memory_resident_max_bytes` | highest `stats.resident` seen since start |
/// | `process_resident_memory_bytes` | `VmRSS` of `/proc/self/status` (Linux only) |
/// | `process_resident_memory_max_bytes` | `VmHWM` of `/proc/self/status` (Linux only) |
///
/// The jemalloc high-water marks are sampled at each scrape, and every
/// [`MEMORY_SAMPLE_INTERVAL`] once [`spawn_memory_sampler`] runs. Call this once
/// per registry; registering twice in one registry duplicates the names.
pub fn register_memory_metrics(registry: &mut Registry) {
    registry.register_collector(Box::new(MemoryCollector));
}

/// Starts a task on the current tokio runtime that samples jemalloc every
/// [`MEMORY_SAMPLE_INTERVAL`] to keep the high-water marks of
/// [`register_memory_metrics`] up to date between scrapes, and returns
/// freed pages to the kernel once [`PURGE_DIRTY_BYTES`] of them wait,
/// [`PURGE_INTERVAL`] has passed since it last did, and the process is
/// quiet (fewer than [`BUSY_ARENA_REQUESTS`] requests to jemalloc's arenas
/// since the previous sample). It runs until
/// aborted through the returned handle or until the runtime stops; one is
/// enough per process.
///
/// # Panics
///
/// Panics when called outside a tokio runtime, like [`tokio::spawn`].
pub fn spawn_memory_sampler() -> JoinHandle<()> {
    tokio::spawn(async {
        let mut ticks = tokio::time::interval(MEMORY_SAMPLE_INTERVAL);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        let mut last_purge = tokio::time::Instant::now();
        let mut last_requests = None;
        loop {
            ticks.tick().await;
            match JemallocSample::read() {
                Ok(sample) => {
                    failing = false;
                    let requests_since =
                        last_requests.map(|last| sample.requests.saturating_sub(last));
                    last_requests = Some(sample.requests);
                    // jemalloc decays dirty pages only while the program
                    // allocates: a process that went quiet (thousands of
                    // parked idle connections after a burst) would keep
                    // what it freed resident. A background purging thread
                    // would make every syscall of a one-thread proxy take
                    // glibc's multi-thread path (measured: 1.7% more
                    // instructions per request). A busy process decays on
                    // its own, smoothly; purging everything at once there
                    // stalls the arenas and makes it fault the pages back in.
                    if last_purge.elapsed() >= PURGE_INTERVAL
                        && should_purge(sample.dirty, requests_since)
                    {
                        release_unused_memory();
                        last_purge = tokio::time::Instant::now();
                    }
                }
                Err(error) if !failing => {
                    failing = true;
                    tracing::debug!(%error, "cannot sample jemalloc statistics; memory high-water marks may miss spikes");
                }
                Err(_) => {}
            }
        }
    })
}

/// One reading of jemalloc's statistics, in bytes.
#[derive(Debug, Clone, Copy)]
struct JemallocSample {
    allocated: u64,
    resident: u64,
    /// Bytes in pages freed but not yet returned to the kernel.
    dirty: usize,
    /// Requests to the arenas since start (small and large allocations,
    /// thread caches' refills included): how busy the allocator is.
    requests: u64,
}

impl JemallocSample {
    /// Refreshes jemalloc's statistics, reads them, and raises the
    /// high-water marks to what was read.
    fn read() -> Result<Self, tikv_jemalloc_ctl::Error> {
        tikv_jemalloc_ctl::epoch::advance()?;
        let allocated = to_u64(tikv_jemalloc_ctl::stats::allocated::read()?);
        let resident = to_u64(tikv_jemalloc_ctl::stats::resident::read()?);
        ALLOCATED_MAX.fetch_max(allocated, Ordering::Relaxed);
        RESIDENT_MAX.fetch_max(resident, Ordering::Relaxed);
        Ok(Self {
            allocated,
            resident,
            dirty: dirty_bytes()?,
            requests: arena_requests()?,
        })
    }
}

fn to_u64(bytes: usize) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// The kernel's view of this process's memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KernelMemory {
    /// `VmRSS`: resident set size now.
    resident: Option<u64>,
    /// `VmHWM`: peak resident set size.
    resident_max: Option<u64>,
    /// `RssAnon`: anonymous resident memory (the heap, stacks), what the
    /// memory budget holds against its limit.
    pub(crate) anonymous: Option<u64>,
}

impl KernelMemory {
    #[cfg(target_os = "linux")]
    pub(crate) fn read() -> Self {
        match std::fs::read_to_string("/proc/self/status") {
            Ok(status) => Self::parse(&status),
            Err(error) => {
                tracing::debug!(%error, "cannot read /proc/self/status; resident memory metrics are left out");
                Self::default()
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn read() -> Self {
        Self::default()
    }

    /// Parses the `VmRSS:`, `VmHWM:` and `RssAnon:` lines of `/proc/PID/status`
    /// (`VmRSS:\t    1234 kB`). Lines that do not parse are ignored.
    #[cfg_attr(not(any(target_os = "linux", test)), allow(dead_code))]
    fn parse(status: &str) -> Self {
        let mut memory = Self::default();
        for line in status.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let slot = match key {
                "VmRSS" => &mut memory.resident,
                "VmHWM" => &mut memory.resident_max,
                "RssAnon" => &mut memory.anonymous,
                _ => continue,
            };
            let mut words = value.split_whitespace();
            let bytes = match (words.next(), words.next(), words.next()) {
                (Some(n), Some("kB"), None) => {
                    n.parse::<u64>().ok().and_then(|kib| kib.checked_mul(1024))
                }
                _ => None,
            };
            if bytes.is_some() {
                *slot = bytes;
            }
        }
        memory
    }
}

/// `/proc/self/statm`, kept open: the memory budget's sampler (and the
/// proxy's memory limit) read the process's anonymous resident memory from
/// it every 10 ms with one `pread` (no path lookup, no allocation). It
/// holds what `RssAnon` of `/proc/self/status` says: the kernel counts
/// `resident` as file, shared and anonymous pages, and `shared` as the
/// first two.
#[derive(Debug)]
pub struct Statm {
    file: std::fs::File,
    page_size: u64,
}

impl Statm {
    /// Opens `/proc/self/statm`; `None` where there is none.
    pub fn open() -> Option<Self> {
        let file = std::fs::File::open("/proc/self/statm").ok()?;
        Some(Statm {
            file,
            page_size: crate::process::page_size(),
        })
    }

    /// Anonymous resident memory now, in bytes.
    pub fn anonymous(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        // Seven numbers of at most 20 digits each and their separators.
        let mut buf = [0u8; 192];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        if n == buf.len() {
            return None;
        }
        anonymous_in_statm(std::str::from_utf8(&buf[..n]).ok()?, self.page_size)
    }
}

/// Anonymous resident bytes from a `statm` line: `resident - shared` pages.
pub(crate) fn anonymous_in_statm(statm: &str, page_size: u64) -> Option<u64> {
    let mut fields = statm.split_ascii_whitespace().skip(1);
    let resident: u64 = fields.next()?.parse().ok()?;
    let shared: u64 = fields.next()?.parse().ok()?;
    resident.checked_sub(shared)?.checked_mul(page_size)
}

/// When a sampler that reads the kernel's count at every tick ([`Statm`])
/// also refreshes the allocator's statistics, which is what costs (a
/// jemalloc epoch merges every arena's: 30-100 µs, where the `pread` takes
/// microseconds): every `every` readings (the first included), at once when
/// the kernel's count moved [`AllocatorReadings::or_when_moved`] bytes either
/// way since the last refresh, and at every reading where the kernel's count
/// cannot be read. The controllers' budget and the proxy's memory limit
/// share this schedule; each compares what it reads its own way.
#[derive(Debug)]
pub struct AllocatorReadings {
    every: u32,
    moved: Option<u64>,
    /// The allocator's figure at the last refresh.
    last: Option<u64>,
    /// The kernel's count at the last refresh.
    kernel_then: Option<u64>,
    /// Readings since the last refresh.
    since: u32,
}

impl AllocatorReadings {
    /// Refreshes every `every` readings (at least every one).
    pub const fn every(every: u32) -> Self {
        AllocatorReadings {
            every: if every == 0 { 1 } else { every },
            moved: None,
            last: None,
            kernel_then: None,
            since: 0,
        }
    }

    /// Also refreshes at the reading where the kernel's count has moved
    /// `bytes` either way since the last refresh (small moves add up).
    pub const fn or_when_moved(mut self, bytes: u64) -> Self {
        self.moved = Some(bytes);
        self
    }

    /// One reading, given the kernel's count now and how to refresh the
    /// allocator's: the allocator's figure as last refreshed, or `None`
    /// while it cannot tell (it is asked again at the next reading).
    pub fn read(
        &mut self,
        kernel: Option<u64>,
        refresh: impl FnOnce() -> Option<u64>,
    ) -> Option<u64> {
        let moved = match (kernel, self.kernel_then) {
            (Some(now), Some(then)) => self.moved.is_some_and(|m| now.abs_diff(then) >= m),
            _ => true,
        };
        if moved || self.last.is_none() || self.since + 1 >= self.every {
            self.last = refresh();
            self.kernel_then = kernel;
            self.since = 0;
        } else {
            self.since += 1;
        }
        self.last
    }
}

/// Reads the memory figures afresh at each scrape.
#[derive(Debug)]
struct MemoryCollector;

impl Collector for MemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        match JemallocSample::read() {
            Ok(sample) => {
                encode_bytes(
                    &mut encoder,
                    "process_memory_allocated",
                    "Bytes allocated by the application, as counted by jemalloc.",
                    sample.allocated,
                )?;
                encode_bytes(
                    &mut encoder,
                    "process_memory_resident",
                    "Bytes in physically resident pages mapped by jemalloc.",
                    sample.resident,
                )?;
                encode_bytes(
                    &mut encoder,
                    "process_memory_allocated_max",
                    "Highest process_memory_allocated_bytes seen since the process started.",
                    ALLOCATED_MAX.load(Ordering::Relaxed).max(sample.allocated),
                )?;
                encode_bytes(
                    &mut encoder,
                    "process_memory_resident_max",
                    "Highest process_memory_resident_bytes seen since the process started.",
                    RESIDENT_MAX.load(Ordering::Relaxed).max(sample.resident),
                )?;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read jemalloc statistics; allocator memory metrics are left out");
            }
        }

        let kernel = KernelMemory::read();
        if let Some(bytes) = kernel.resident {
            encode_bytes(
                &mut encoder,
                "process_resident_memory",
                "Resident set size of the process (VmRSS).",
                bytes,
            )?;
        }
        if let Some(bytes) = kernel.resident_max {
            encode_bytes(
                &mut encoder,
                "process_resident_memory_max",
                "Peak resident set size of the process (VmHWM).",
                bytes,
            )?;
        }
        Ok(())
    }
}

/// Encodes one gauge in bytes; `name` is given without the `_bytes` unit suffix.
fn encode_bytes(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    bytes: u64,
) -> fmt::Result {
    let unit = Unit::Bytes;
    let metric = encoder.encode_descriptor(name, help, Some(&unit), MetricType::Gauge)?;
    ConstGauge::new(bytes).encode(metric)
}

/// Dirty pages (freed, still resident) past which the sampler returns them.
pub const PURGE_DIRTY_BYTES: usize = 1024 * 1024;
/// Least time between two returns of dirty pages by the sampler: jemalloc's
/// own decay time, so that a busy process purges no more often than it
/// would on its own.
pub const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// Requests to jemalloc's arenas between two samples from which the process
/// counts as busy: jemalloc then decays its dirty pages itself (its decay
/// runs as the program allocates), and the sampler leaves them to it.
pub const BUSY_ARENA_REQUESTS: u64 = 10_000;

/// Whether `dirty` bytes of freed pages are worth a purge, given the arena
/// requests since the previous sample (`None`: no previous sample).
fn should_purge(dirty: usize, requests_since: Option<u64>) -> bool {
    dirty >= PURGE_DIRTY_BYTES && requests_since.is_some_and(|n| n < BUSY_ARENA_REQUESTS)
}

/// Requests to the arenas since start: small and large `nmalloc`, all
/// arenas, as of the last epoch advance.
fn arena_requests() -> Result<u64, tikv_jemalloc_ctl::Error> {
    use tikv_jemalloc_ctl::{Access, AsName};
    let small = Access::<u64>::read(b"stats.arenas.4096.small.nmalloc\0".name())?;
    let large = Access::<u64>::read(b"stats.arenas.4096.large.nmalloc\0".name())?;
    Ok(small.saturating_add(large))
}

/// Bytes in pages jemalloc holds freed but not yet returned, all arenas, as
/// of the last epoch advance.
fn dirty_bytes() -> Result<usize, tikv_jemalloc_ctl::Error> {
    use tikv_jemalloc_ctl::{Access, AsName};
    // 4096 is MALLCTL_ARENAS_ALL: the sum over arenas.
    let pages = Access::<usize>::read(b"stats.arenas.4096.pdirty\0".name())?;
    let page = Access::<usize>::read(b"arenas.page\0".name())?;
    Ok(pages.saturating_mul(page))
}

/// Serializes changes to the arenas' decay times: a purge sets them to 0
/// and back, and must not put back a time [`return_freed_memory_at_once`]
/// changed meanwhile (an arena would keep the wrong time for good).
static DECAY: std::sync::Mutex<ReturnFreed> = std::sync::Mutex::new(ReturnFreed::AfterDecay);

/// When freed pages go back to the kernel, as [`return_freed_memory_at_once`]
/// last set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReturnFreed {
    /// After jemalloc's configured decay time (`opt.dirty_decay_ms`).
    AfterDecay,
    /// When freed (decay time 0).
    AtOnce,
}

impl ReturnFreed {
    /// The decay time in milliseconds, or `None` if it cannot be read.
    fn decay_ms(self) -> Option<isize> {
        use tikv_jemalloc_ctl::{Access, AsName};
        match self {
            Self::AtOnce => Some(0),
            Self::AfterDecay => Access::<isize>::read(b"opt.dirty_decay_ms\0".name()).ok(),
        }
    }
}

fn lock_decay() -> std::sync::MutexGuard<'static, ReturnFreed> {
    DECAY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sets the dirty decay time of every arena there is, and of those made
/// from now on. Setting 0 purges what is dirty. Failures are ignored.
fn set_every_arena_decay(ms: isize) {
    use tikv_jemalloc_ctl::{arenas, Access, AsName};
    let _ = Access::<isize>::write(b"arenas.dirty_decay_ms\0".name(), ms);
    let Ok(n) = arenas::narenas::read() else {
        return;
    };
    for i in 0..n {
        let key = format!("arena.{i}.dirty_decay_ms\0");
        let _ = Access::<isize>::write(key.as_bytes().name(), ms);
    }
}

/// Returns the allocator's unused dirty pages to the kernel now, instead of
/// after jemalloc's decay time (10 s by default). Call it after a large,
/// transient allocation, such as loading a whole cluster, so that RSS shows
/// what is kept rather than what was briefly needed. Failures (another
/// allocator in use) are ignored: this only affects how soon memory is
/// returned.
pub fn release_unused_memory() {
    let mode = lock_decay();
    if *mode == ReturnFreed::AtOnce {
        // Every arena's decay time is 0 already: freed pages went back as
        // they were freed, and nothing is left to purge.
        return;
    }
    // A decay time of zero purges at once (jemalloc's `arena.<i>.purge`
    // takes no value, which the safe mallctl wrapper cannot pass); then put
    // back the time the switch below wants, not the one read before.
    set_every_arena_decay(0);
    if let Some(ms) = mode.decay_ms() {
        set_every_arena_decay(ms);
    }
}

/// While `on`, pages the allocator frees go back to the kernel at once
/// (every arena's dirty decay time 0, which also purges what is dirty
/// now); off, back to the configured decay time (`opt.dirty_decay_ms`, 10 s
/// by default). For a process near its memory limit: memory it frees
/// must leave its resident set before the next reading, not 10 s later.
/// Costs a `madvise` per freed extent while on. Failures (another
/// allocator in use) are ignored: only how soon memory is returned changes.
pub fn return_freed_memory_at_once(on: bool) {
    let mut mode = lock_decay();
    let wanted = if on {
        ReturnFreed::AtOnce
    } else {
        ReturnFreed::AfterDecay
    };
    if let Some(ms) = wanted.decay_ms() {
        *mode = wanted;
        set_every_arena_decay(ms);
    }
}

/// Makes the calling thread allocate from arena 0 and without a thread
/// cache. For a process that keeps a large, long-lived state made by many
/// threads between short bursts of work (viz's scrape cycles): with an
/// arena per thread and objects parked in each thread's cache, the freed
/// memory of a burst stays spread over half-used pages that are never
/// returned; with one arena and no cache, it refills the same pages. Costs
/// a lock per allocation, negligible at such a rate. Failures (another
/// allocator in use) are ignored: only memory use changes.
pub fn compact_thread_allocations() {
    use tikv_jemalloc_ctl::{Access, AsName};
    let _ = Access::<u32>::write(b"thread.arena\0".name(), 0);
    let _ = Access::<bool>::write(b"thread.tcache.enabled\0".name(), false);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Serializes the crate's tests that read jemalloc or change its decay
    /// times (a started memory budget switches them), so that only the
    /// sampler can raise the high-water mark while the spike test runs and
    /// no other test switches the decay under one that checks it.
    static JEMALLOC_READERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    pub(crate) fn exclusive_jemalloc() -> std::sync::MutexGuard<'static, ()> {
        JEMALLOC_READERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    const MIB: u64 = 1024 * 1024;

    /// Feeds `kernel` readings to `schedule`; returns at which readings the
    /// allocator was asked, and what each reading said.
    fn run(
        mut schedule: AllocatorReadings,
        kernel: &[Option<u64>],
    ) -> (Vec<usize>, Vec<Option<u64>>) {
        let mut refreshed = Vec::new();
        let mut said = Vec::new();
        for (i, k) in kernel.iter().enumerate() {
            let hit = std::cell::Cell::new(false);
            said.push(schedule.read(*k, || {
                hit.set(true);
                Some(i as u64)
            }));
            if hit.get() {
                refreshed.push(i);
            }
        }
        (refreshed, said)
    }

    fn moving() -> AllocatorReadings {
        AllocatorReadings::every(10).or_when_moved(MIB)
    }

    #[test]
    fn a_still_kernel_count_refreshes_the_allocator_every_tenth_reading() {
        for schedule in [AllocatorReadings::every(10), moving()] {
            let (refreshed, said) = run(schedule, &[Some(8 * MIB); 25]);
            assert_eq!(refreshed, vec![0, 10, 20]);
            // Between refreshes, the last refresh's figure.
            assert_eq!(said[9], Some(0));
            assert_eq!(said[10], Some(10));
            assert_eq!(said[24], Some(20));
        }
        let (refreshed, _) = run(AllocatorReadings::every(0), &[Some(MIB); 3]);
        assert_eq!(refreshed, vec![0, 1, 2]);
    }

    #[test]
    fn a_moving_kernel_count_refreshes_at_the_next_reading_either_way() {
        // Small moves add up from the last refresh, not from the last reading.
        let mut kernel = vec![Some(8 * MIB); 12];
        kernel[3] = Some(8 * MIB + MIB / 2);
        kernel[4] = Some(9 * MIB);
        kernel[5] = Some(9 * MIB);
        kernel[6] = Some(8 * MIB - MIB / 2);
        for k in &mut kernel[7..] {
            *k = Some(7 * MIB);
        }
        let (refreshed, said) = run(moving(), &kernel);
        assert_eq!(refreshed, vec![0, 4, 6]);
        assert_eq!(said[5], Some(4));
        assert_eq!(said[11], Some(6));
        // Without the moved trigger, on schedule only.
        let (refreshed, _) = run(AllocatorReadings::every(10), &kernel);
        assert_eq!(refreshed, vec![0, 10]);
    }

    #[test]
    fn without_the_kernel_count_the_allocator_is_refreshed_at_every_reading() {
        let mut kernel = vec![Some(8 * MIB); 6];
        kernel[2] = None;
        kernel[3] = None;
        for schedule in [AllocatorReadings::every(10), moving()] {
            // Once the kernel's count is back, the schedule starts from there.
            let (refreshed, _) = run(schedule, &kernel);
            assert_eq!(refreshed, vec![0, 2, 3, 4]);
        }
        let (refreshed, _) = run(moving(), &[None; 4]);
        assert_eq!(refreshed, vec![0, 1, 2, 3]);
    }

    #[test]
    fn an_allocator_that_cannot_tell_is_asked_again_at_the_next_reading() {
        let mut a = moving();
        assert_eq!(a.read(Some(MIB), || None), None);
        assert_eq!(a.read(Some(MIB), || Some(5)), Some(5));
        assert_eq!(a.read(Some(MIB), || Some(6)), Some(5));
    }

    #[test]
    fn a_compact_thread_allocates_from_arena_zero_without_a_cache() {
        use tikv_jemalloc_ctl::{Access, AsName};
        std::thread::spawn(|| {
            compact_thread_allocations();
            let arena = Access::<u32>::read(b"thread.arena\0".name()).expect("thread.arena");
            let cached =
                Access::<bool>::read(b"thread.tcache.enabled\0".name()).expect("thread.tcache");
            assert_eq!((arena, cached), (0, false));
            let v = vec![1u8; 100_000];
            assert_eq!(v.iter().map(|b| usize::from(*b)).sum::<usize>(), 100_000);
        })
        .join()
        .expect("the thread");
    }

    #[test]
    fn parses_proc_status() {
        let cases = [
            (
                "Name:\tballast\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nRssAnon:\t     512 kB\nThreads:\t4\n",
                KernelMemory {
                    resident: Some(1024 * 1024),
                    resident_max: Some(2048 * 1024),
                    anonymous: Some(512 * 1024),
                },
            ),
            ("", KernelMemory::default()),
            ("VmRSS:\tlots kB\nVmHWM: 12 MB\n", KernelMemory::default()),
            ("RssAnon:\t lots kB\n", KernelMemory::default()),
            ("VmRSS:\t18446744073709551615 kB\n", KernelMemory::default()),
            (
                "VmRSS 12 kB\nVmRSS:\t7 kB\n",
                KernelMemory {
                    resident: Some(7 * 1024),
                    resident_max: None,
                    anonymous: None,
                },
            ),
        ];
        for (status, want) in cases {
            assert_eq!(KernelMemory::parse(status), want, "parsing {status:?}");
        }
    }

    #[test]
    fn encodes_all_memory_metrics() {
        let _exclusive = exclusive_jemalloc();
        let mut registry = Registry::default();
        register_memory_metrics(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let mut names = vec![
            "process_memory_allocated_bytes",
            "process_memory_resident_bytes",
            "process_memory_allocated_max_bytes",
            "process_memory_resident_max_bytes",
        ];
        if cfg!(target_os = "linux") {
            names.extend([
                "process_resident_memory_bytes",
                "process_resident_memory_max_bytes",
            ]);
        }
        for name in names {
            assert!(
                text.contains(&format!("\n{name} ")),
                "{name} missing from:\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {name} gauge\n")),
                "{name} has no gauge TYPE in:\n{text}"
            );
        }
        let sample = JemallocSample::read().expect("jemalloc statistics");
        assert!(sample.allocated > 0, "jemalloc is this test's allocator");
    }

    // The guard only keeps other test threads out; nothing on this runtime takes it.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn sampler_catches_a_spike_between_scrapes() {
        const SPIKE: usize = 64 << 20;
        let _exclusive = exclusive_jemalloc();
        let sampler = spawn_memory_sampler();
        assert!(
            ALLOCATED_MAX.load(Ordering::Relaxed) < to_u64(SPIKE),
            "no {SPIKE}-byte high-water mark before the spike"
        );
        let spike = std::hint::black_box(vec![1u8; SPIKE]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        // Only the sampler reads jemalloc here: nothing scrapes.
        while ALLOCATED_MAX.load(Ordering::Relaxed) < to_u64(SPIKE) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the sampler did not record a {SPIKE}-byte allocation within 10s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(spike);
        sampler.abort();
    }

    #[test]
    fn freed_memory_goes_back_at_once_while_switched_on() {
        use tikv_jemalloc_ctl::{Access, AsName};
        let _exclusive = exclusive_jemalloc();
        let decay = |arena: &str| {
            Access::<isize>::read(format!("{arena}.dirty_decay_ms\0").as_bytes().name())
                .expect("decay time")
        };
        let configured =
            Access::<isize>::read(b"opt.dirty_decay_ms\0".name()).expect("opt.dirty_decay_ms");
        assert_ne!(configured, 0, "jemalloc keeps freed pages by default");
        return_freed_memory_at_once(true);
        assert_eq!((decay("arena.0"), decay("arenas")), (0, 0));
        // Large blocks, each its own extent: freed, their pages are dirty at
        // once unless returned.
        let blocks: Vec<Vec<u8>> = (0..16).map(|_| vec![1u8; 1 << 20]).collect();
        drop(std::hint::black_box(blocks));
        tikv_jemalloc_ctl::epoch::advance().expect("epoch");
        let dirty_on = dirty_bytes().expect("dirty bytes");
        return_freed_memory_at_once(false);
        assert_eq!(
            (decay("arena.0"), decay("arenas")),
            (configured, configured)
        );
        let blocks: Vec<Vec<u8>> = (0..16).map(|_| vec![1u8; 1 << 20]).collect();
        drop(std::hint::black_box(blocks));
        tikv_jemalloc_ctl::epoch::advance().expect("epoch");
        let dirty_off = dirty_bytes().expect("dirty bytes");
        assert!(
            dirty_on < 1 << 20 && dirty_off >= 8 << 20,
            "dirty after freeing 16 MiB: {dirty_on} bytes switched on, {dirty_off} off"
        );
        release_unused_memory();
    }

    #[test]
    fn a_purge_puts_back_the_decay_time_the_switch_last_set() {
        use tikv_jemalloc_ctl::{arenas, Access, AsName};
        let _exclusive = exclusive_jemalloc();
        let decays = || {
            let n = arenas::narenas::read().expect("narenas");
            let mut all: Vec<isize> = (0..n)
                // Arenas not made yet cannot be read; they take arenas.dirty_decay_ms.
                .filter_map(|i| {
                    Access::<isize>::read(format!("arena.{i}.dirty_decay_ms\0").as_bytes().name())
                        .ok()
                })
                .collect();
            all.push(Access::<isize>::read(b"arenas.dirty_decay_ms\0".name()).expect("decay"));
            all.dedup();
            all
        };
        let configured =
            Access::<isize>::read(b"opt.dirty_decay_ms\0".name()).expect("opt.dirty_decay_ms");
        return_freed_memory_at_once(true);
        release_unused_memory();
        assert_eq!(decays(), [0], "a purge while switched on");
        return_freed_memory_at_once(false);
        release_unused_memory();
        assert_eq!(decays(), [configured], "a purge while switched off");
        // The switch and a purge on another thread, interleaved many times:
        // whatever the order, the arenas end with the time the switch last
        // set (a purge that put back the time it read would leave a stale
        // one). Read under the decay lock, as every writer takes it.
        let mut on = false;
        for round in 0..500 {
            let purging = std::thread::spawn(release_unused_memory);
            while !purging.is_finished() {
                on = !on;
                return_freed_memory_at_once(on);
            }
            purging.join().expect("the purging thread");
            let (mode, times) = {
                let mode = lock_decay();
                (*mode, decays())
            };
            assert_eq!(
                mode,
                if on {
                    ReturnFreed::AtOnce
                } else {
                    ReturnFreed::AfterDecay
                },
                "round {round}"
            );
            let want = if on { 0 } else { configured };
            assert_eq!(times, [want], "round {round}");
        }
        return_freed_memory_at_once(false);
        assert_eq!(decays(), [configured]);
    }

    #[test]
    fn a_busy_allocator_is_left_to_decay_on_its_own() {
        let dirty = PURGE_DIRTY_BYTES * 8;
        assert!(should_purge(dirty, Some(BUSY_ARENA_REQUESTS - 1)));
        assert!(!should_purge(dirty, Some(BUSY_ARENA_REQUESTS)));
        // The first sample has nothing to compare with: it waits for a second.
        assert!(!should_purge(dirty, None));
        assert!(!should_purge(PURGE_DIRTY_BYTES - 1, Some(0)));
    }

    #[test]
    fn arena_requests_count_allocations() {
        let _exclusive = exclusive_jemalloc();
        let before = JemallocSample::read()
            .expect("jemalloc statistics")
            .requests;
        // Larger than any thread cache's size class: each one reaches an arena.
        let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 << 10]).collect();
        let after = JemallocSample::read()
            .expect("jemalloc statistics")
            .requests;
        drop(std::hint::black_box(blocks));
        assert!(
            after >= before + 64,
            "{before} -> {after} arena requests after 64 large allocations"
        );
    }

    // The guard only keeps other test threads out; nothing on this runtime takes it.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(start_paused = true)]
    async fn sampler_returns_the_pages_a_quiet_process_freed() {
        const FREED: usize = 32 << 20;
        let _exclusive = exclusive_jemalloc();
        // Small allocations, as connections make: they live in slabs whose
        // pages stay dirty once freed.
        let chunks: Vec<Vec<u8>> = (0..FREED / 4096).map(|_| vec![1u8; 4096]).collect();
        drop(std::hint::black_box(chunks));
        let dirty = JemallocSample::read().expect("jemalloc statistics").dirty;
        assert!(
            dirty >= FREED / 2,
            "{dirty} dirty bytes after freeing {FREED}"
        );
        assert!(should_purge(dirty, Some(0)) && !should_purge(PURGE_DIRTY_BYTES - 1, Some(0)));
        let sampler = spawn_memory_sampler();
        // jemalloc's own clock does not move with tokio's paused one: only
        // the sampler can return these pages within this test.
        let mut waited = Duration::ZERO;
        while JemallocSample::read().expect("jemalloc statistics").dirty >= FREED / 2 {
            assert!(
                waited <= PURGE_INTERVAL + 2 * MEMORY_SAMPLE_INTERVAL,
                "freed pages still dirty {waited:?} after the sampler started"
            );
            tokio::time::sleep(MEMORY_SAMPLE_INTERVAL).await;
            waited += MEMORY_SAMPLE_INTERVAL;
        }
        sampler.abort();
    }
}
