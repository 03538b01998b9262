//! Prometheus' standard process metrics, read from `/proc` at each scrape
//! (Linux only; a figure that cannot be read is left out):
//!
//! | metric | type | source |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | utime + stime of `/proc/self/stat`, in clock ticks |
//! | `process_open_fds` | gauge | the size of `/proc/self/fd` (Linux 6.2 and later), else its entries |
//! | `process_max_fds` | gauge | soft "Max open files" of `/proc/self/limits` |
//! | `process_start_time_seconds` | gauge | `btime` of `/proc/stat` + starttime of `/proc/self/stat` |
//!
//! Clock ticks per second come from the `AT_CLKTCK` entry of
//! `/proc/self/auxv` (what `sysconf(_SC_CLK_TCK)` returns, read without
//! `unsafe` or libc); 100, Linux's value on every common architecture, when
//! that cannot be read.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// `AT_CLKTCK` in the ELF auxiliary vector.
const AT_CLKTCK: u64 = 17;
/// `AT_PAGESZ` in the ELF auxiliary vector.
const AT_PAGESZ: u64 = 6;
/// The page size when the auxiliary vector cannot be read (x86-64's, and
/// the common one on arm64).
const DEFAULT_PAGE_SIZE: u64 = 4096;
/// Clock ticks per second when the auxiliary vector cannot be read.
const DEFAULT_CLOCK_TICKS: u64 = 100;

/// Registers the process metrics of the table above; they are read afresh
/// at each scrape. Their names do not overlap the memory metrics
/// ([`register_memory_metrics`](crate::register_memory_metrics)).
pub fn register_process_metrics(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

/// Registers `{component}_build_info{version="..."} 1`, as Linkerd's
/// `proxy_build_info`: which build is running, for dashboards and alerts.
pub fn register_build_info(registry: &mut Registry, component: &str, version: &str) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: version.to_string(),
    })
    .set(1);
    registry.register(
        format!("{component}_build_info"),
        format!("Build of this {component}: 1, labelled with its version"),
        info,
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// One reading of the process's `/proc` figures.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ProcessSample {
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessSample {
    fn read() -> Self {
        let ticks = clock_ticks();
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Stat::parse(&s));
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        ProcessSample {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / ticks as f64),
            open_fds: open_fds(
                std::fs::metadata("/proc/self/fd").map(|m| m.len()).ok(),
                walk_open_fds,
            ),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|s| soft_open_files_limit(&s)),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.starttime as f64 / ticks as f64),
        }
    }
}

/// The number of open files: the size Linux 6.2 and later give
/// `/proc/self/fd` (its count, read in one `stat`), else `walk`'s count of
/// its entries (earlier kernels say 0). The walk is a directory entry per
/// open file: a controller holding 20,000 proxies' connections would spend
/// milliseconds of a runtime worker on it at every scrape.
pub(crate) fn open_fds(dir_size: Option<u64>, walk: impl FnOnce() -> Option<u64>) -> Option<u64> {
    match dir_size {
        Some(n) if n > 0 => Some(n),
        _ => walk(),
    }
}

/// The entries of `/proc/self/fd`, counted one by one.
fn walk_open_fds() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|dir| dir.count() as u64)
}

/// The fields of `/proc/self/stat` these metrics use, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stat {
    pub utime: u64,
    pub stime: u64,
    pub starttime: u64,
}

impl Stat {
    /// Parses `/proc/PID/stat`; the command name may hold spaces and
    /// parentheses, so fields are counted after its last `)`.
    pub(crate) fn parse(text: &str) -> Option<Stat> {
        let (_, after_comm) = text.rsplit_once(')')?;
        // Field 3 (state) is the first after the name: field N is at N - 3.
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
        })
    }
}

/// `btime` of `/proc/stat`: boot time, in seconds since the epoch.
pub(crate) fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of "Max open files" in `/proc/self/limits`; none when unlimited.
pub(crate) fn soft_open_files_limit(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// `AT_CLKTCK` from `/proc/self/auxv` (pairs of native-endian words), else 100.
fn clock_ticks() -> u64 {
    std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|auxv| auxv_value(&auxv, AT_CLKTCK))
        .unwrap_or(DEFAULT_CLOCK_TICKS)
}

/// `AT_PAGESZ` from `/proc/self/auxv` (what `sysconf(_SC_PAGESIZE)`
/// returns), else 4096.
pub(crate) fn page_size() -> u64 {
    std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|auxv| auxv_value(&auxv, AT_PAGESZ))
        .unwrap_or(DEFAULT_PAGE_SIZE)
}

/// The non-zero value of `key` in an auxiliary vector.
pub(crate) fn auxv_value(auxv: &[u8], wanted: u64) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |b: &[u8]| -> Option<u64> {
        let bytes: [u8; WORD] = b.try_into().ok()?;
        u64::try_from(usize::from_ne_bytes(bytes)).ok()
    };
    auxv.chunks_exact(2 * WORD)
        .filter_map(|entry| Some((word(&entry[..WORD])?, word(&entry[WORD..])?)))
        .find(|&(key, _)| key == wanted)
        .map(|(_, value)| value)
        .filter(|&value| value > 0)
}

#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let sample = ProcessSample::read();
        if let Some(seconds) = sample.cpu_seconds {
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent, in seconds.",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?;
            ConstCounter::new(seconds).encode(metric)?;
        }
        if let Some(open) = sample.open_fds {
            let metric = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(clamp_i64(open)).encode(metric)?;
        }
        if let Some(max) = sample.max_fds {
            let metric = encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit).",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(clamp_i64(max)).encode(metric)?;
        }
        if let Some(start) = sample.start_time_seconds {
            let metric = encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since the Unix epoch, in seconds.",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?;
            ConstGauge::new(start).encode(metric)?;
        }
        Ok(())
    }
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 75 0 0 20 0 3 0 987654 12345678 1500 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                starttime: 987654
            })
        );
        assert_eq!(Stat::parse("4242 (short) S 1 2"), None);
        assert_eq!(Stat::parse("no parenthesis"), None);
    }

    #[test]
    fn boot_time_and_the_soft_fd_limit_are_found_by_name() {
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1764583200\nprocesses 9\n"),
            Some(1764583200)
        );
        assert_eq!(boot_time("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             63457                63457                processes\n\
                      Max open files            1024                 1048576              files\n";
        assert_eq!(soft_open_files_limit(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files_limit(unlimited), None);
    }

    #[test]
    fn clock_ticks_and_the_page_size_come_from_the_auxiliary_vector() {
        let mut auxv = Vec::new();
        for (key, value) in [(6usize, 4096usize), (AT_CLKTCK as usize, 250), (0, 0)] {
            auxv.extend_from_slice(&key.to_ne_bytes());
            auxv.extend_from_slice(&value.to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(4096));
        assert_eq!(auxv_value(&auxv[..8], AT_CLKTCK), None);
        // This process's own vector has both (Linux).
        assert!(clock_ticks() > 0);
        assert!(page_size() >= 4096 && page_size().is_power_of_two());
    }

    #[test]
    fn open_files_are_the_directory_size_when_there_is_one_else_its_entries() {
        assert_eq!(open_fds(Some(20_000), || panic!("walked")), Some(20_000));
        assert_eq!(open_fds(Some(0), || Some(7)), Some(7));
        assert_eq!(open_fds(None, || Some(7)), Some(7));
        assert_eq!(open_fds(None, || None), None);
    }

    #[test]
    fn open_files_read_either_way_agree_and_count_files_held_open() {
        // Other tests in this binary open and close files meanwhile: the
        // two readings are compared with room for them, and both must see
        // the 200 held here.
        let held: Vec<std::fs::File> = (0..200)
            .map(|_| std::fs::File::open("/proc/self/stat"))
            .collect::<Result<_, _>>()
            .expect("open /proc/self/stat");
        let fast = ProcessSample::read().open_fds.expect("open files read");
        let walked = walk_open_fds().expect("/proc/self/fd walked");
        assert!(fast >= 200 && walked >= 200, "{fast} / {walked}");
        assert!(fast.abs_diff(walked) < 100, "{fast} / {walked}");
        drop(held);
    }

    #[test]
    fn this_process_reads_its_own_figures() {
        let sample = ProcessSample::read();
        assert!(sample.cpu_seconds.is_some_and(|s| s >= 0.0), "{sample:?}");
        assert!(sample.open_fds.is_some_and(|n| n >= 3), "{sample:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let start = sample.start_time_seconds.unwrap_or_default();
        assert!(
            start > now - 86_400.0 && start <= now + 60.0,
            "{start} vs {now}"
        );
    }
}
