//! What the load client saw, per backend: cumulative counts, and a ring of
//! one-second slots for "the last few seconds". Memory is fixed: at most
//! [`MAX_BACKENDS`] names, each with one histogram per slot plus the total.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::histogram::Histogram;

/// Distinct backend names kept; answers naming further ones are counted
/// under [`OTHER_BACKENDS`].
pub const MAX_BACKENDS: usize = 32;
/// Where answers without an `x-backend` header (proxy errors, failed
/// connections) are counted.
pub const NO_BACKEND: &str = "(none)";
/// Where answers from backends past [`MAX_BACKENDS`] are counted.
pub const OTHER_BACKENDS: &str = "(other)";
/// Longest backend name kept; longer ones are cut (the name comes from a peer).
const MAX_NAME_LEN: usize = 64;
/// Longest error text kept.
const MAX_ERROR_LEN: usize = 200;

/// Width of one slot of the rolling window.
pub const SLOT: Duration = Duration::from_secs(1);
/// Slots kept: the longest window that can be asked for, in seconds.
pub const SLOTS: usize = 10;

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx answer without `l5d-proxy-error`.
    Success,
    /// An answer with another status and no `l5d-proxy-error`.
    Status(u16),
    /// An answer the proxy made itself (it carries `l5d-proxy-error`).
    ProxyError(u16),
    /// Connecting, sending or reading failed.
    Transport,
    /// No complete answer within the request timeout.
    Timeout,
}

/// Failures by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failures {
    pub status: u64,
    pub proxy_error: u64,
    pub transport: u64,
    pub timeout: u64,
}

impl Failures {
    pub fn total(&self) -> u64 {
        self.status + self.proxy_error + self.transport + self.timeout
    }

    fn add(&mut self, other: &Failures) {
        self.status += other.status;
        self.proxy_error += other.proxy_error;
        self.transport += other.transport;
        self.timeout += other.timeout;
    }

    fn since(&self, earlier: &Failures) -> Failures {
        Failures {
            status: self.status.saturating_sub(earlier.status),
            proxy_error: self.proxy_error.saturating_sub(earlier.proxy_error),
            transport: self.transport.saturating_sub(earlier.transport),
            timeout: self.timeout.saturating_sub(earlier.timeout),
        }
    }
}

/// Requests, successes, failures and latency of answers (any status).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub successes: u64,
    pub failures: Failures,
    pub latency: Histogram,
}

impl Counts {
    fn record(&mut self, outcome: Outcome, latency: Option<Duration>) {
        self.requests += 1;
        match outcome {
            Outcome::Success => self.successes += 1,
            Outcome::Status(_) => self.failures.status += 1,
            Outcome::ProxyError(_) => self.failures.proxy_error += 1,
            Outcome::Transport => self.failures.transport += 1,
            Outcome::Timeout => self.failures.timeout += 1,
        }
        if let Some(latency) = latency {
            self.latency.record(latency);
        }
    }

    pub fn merge(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.successes += other.successes;
        self.failures.add(&other.failures);
        self.latency.merge(&other.latency);
    }

    /// What was counted after `earlier`, a copy taken before.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            requests: self.requests.saturating_sub(earlier.requests),
            successes: self.successes.saturating_sub(earlier.successes),
            failures: self.failures.since(&earlier.failures),
            latency: self.latency.since(&earlier.latency),
        }
    }

    /// Successes over requests, `None` before the first request.
    pub fn success_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.successes as f64 / self.requests as f64)
    }
}

/// Counts per backend name, at one moment or over a span.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub backends: BTreeMap<String, Counts>,
}

impl Snapshot {
    /// What was counted after `earlier`, a snapshot taken before. Backends
    /// with nothing new are left out.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let backends = self
            .backends
            .iter()
            .filter_map(|(name, now)| {
                let delta = match earlier.backends.get(name) {
                    Some(then) => now.since(then),
                    None => now.clone(),
                };
                (delta.requests > 0).then(|| (name.clone(), delta))
            })
            .collect();
        Snapshot { backends }
    }

    /// All backends together.
    pub fn total(&self) -> Counts {
        let mut total = Counts::default();
        for counts in self.backends.values() {
            total.merge(counts);
        }
        total
    }

    /// Requests answered by `backend` (zero if it never answered).
    pub fn requests(&self, backend: &str) -> u64 {
        self.backends.get(backend).map_or(0, |c| c.requests)
    }
}

#[derive(Default)]
struct Slot {
    /// Which second since the start this slot holds now.
    second: u64,
    counts: Counts,
}

#[derive(Default)]
struct BackendStats {
    total: Counts,
    slots: [Slot; SLOTS],
}

/// The load client's record of everything it saw.
pub struct LoadStats {
    origin: Instant,
    backends: BTreeMap<String, BackendStats>,
    last_error: Option<String>,
}

impl LoadStats {
    /// Starts counting; `origin` is second zero of the rolling window.
    pub fn new(origin: Instant) -> Self {
        Self {
            origin,
            backends: BTreeMap::new(),
            last_error: None,
        }
    }

    /// Counts one request that ended at `now`, answered by `backend` if an
    /// answer named one.
    pub fn record(
        &mut self,
        now: Instant,
        backend: Option<&str>,
        outcome: Outcome,
        latency: Option<Duration>,
    ) {
        let key = self.key(backend);
        let second = self.second(now);
        let stats = self.backends.entry(key).or_default();
        stats.total.record(outcome, latency);
        let slot = &mut stats.slots[(second % SLOTS as u64) as usize];
        if slot.second != second {
            *slot = Slot {
                second,
                counts: Counts::default(),
            };
        }
        slot.counts.record(outcome, latency);
    }

    /// Remembers the latest error text (cut to a bounded length).
    pub fn note_error(&mut self, error: &str) {
        let mut text: String = error.chars().take(MAX_ERROR_LEN).collect();
        if text.len() < error.len() {
            text.push('…');
        }
        self.last_error = Some(text);
    }

    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Everything counted so far.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            backends: self
                .backends
                .iter()
                .map(|(name, stats)| (name.clone(), stats.total.clone()))
                .collect(),
        }
    }

    /// What was counted in the last `span` up to `now` (whole seconds, the
    /// current one included, at most [`SLOTS`]).
    pub fn window(&self, now: Instant, span: Duration) -> Snapshot {
        let current = self.second(now);
        let seconds = span.as_secs().clamp(1, SLOTS as u64);
        let first = (current + 1).saturating_sub(seconds);
        let mut backends = BTreeMap::new();
        for (name, stats) in &self.backends {
            let mut counts = Counts::default();
            for slot in &stats.slots {
                if slot.second >= first && slot.second <= current {
                    counts.merge(&slot.counts);
                }
            }
            if counts.requests > 0 {
                backends.insert(name.clone(), counts);
            }
        }
        Snapshot { backends }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs() / SLOT.as_secs().max(1)
    }

    fn key(&self, backend: Option<&str>) -> String {
        let Some(name) = backend else {
            return NO_BACKEND.to_string();
        };
        let name: String = name.chars().take(MAX_NAME_LEN).collect();
        // Room is kept for the two catch-all names.
        if self.backends.contains_key(&name) || self.backends.len() < MAX_BACKENDS - 2 {
            name
        } else {
            OTHER_BACKENDS.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn counts_by_backend_and_outcome() {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        stats.record(t0, Some("a"), Outcome::Success, Some(2 * MS));
        stats.record(t0, Some("a"), Outcome::Status(500), Some(3 * MS));
        stats.record(t0, Some("b"), Outcome::Success, Some(4 * MS));
        stats.record(t0, None, Outcome::ProxyError(503), Some(MS));
        stats.record(t0, None, Outcome::Transport, None);
        stats.record(t0, None, Outcome::Timeout, None);

        let snap = stats.snapshot();
        let a = &snap.backends["a"];
        assert_eq!((a.requests, a.successes, a.failures.status), (2, 1, 1));
        assert_eq!(a.latency.count(), 2);
        assert_eq!(a.success_rate(), Some(0.5));
        let none = &snap.backends[NO_BACKEND];
        assert_eq!(
            none.failures,
            Failures {
                status: 0,
                proxy_error: 1,
                transport: 1,
                timeout: 1
            }
        );
        assert_eq!(none.latency.count(), 1, "only answers have a latency");
        let total = snap.total();
        assert_eq!((total.requests, total.successes), (6, 2));
        assert_eq!(total.failures.total(), 4);
        assert_eq!(snap.requests("b"), 1);
        assert_eq!(snap.requests("c"), 0);
    }

    #[test]
    fn since_gives_what_happened_between_snapshots() {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        for _ in 0..5 {
            stats.record(t0, Some("a"), Outcome::Success, Some(MS));
            stats.record(t0, Some("c"), Outcome::Success, Some(MS));
        }
        let before = stats.snapshot();
        for _ in 0..3 {
            stats.record(t0, Some("a"), Outcome::Success, Some(100 * MS));
        }
        stats.record(t0, Some("b"), Outcome::Status(502), Some(MS));
        let delta = stats.snapshot().since(&before);
        assert_eq!(delta.requests("a"), 3);
        assert_eq!(delta.requests("b"), 1);
        assert!(!delta.backends.contains_key("c"), "c had nothing new");
        let a = &delta.backends["a"];
        let p50 = a.latency.quantile(0.5).expect("latency");
        assert!(p50 > 90 * MS, "only the new, slow answers: {p50:?}");
        assert_eq!(delta.total().failures.status, 1);
    }

    #[test]
    fn window_holds_only_recent_seconds() {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        let at = |s: u64| t0 + Duration::from_millis(s * 1000 + 500);
        // One request per second for 30 s, from "a" until 20 s, then from "b".
        for s in 0..30 {
            let name = if s < 20 { "a" } else { "b" };
            stats.record(at(s), Some(name), Outcome::Success, Some(MS));
        }
        let window = stats.window(at(29), Duration::from_secs(5));
        assert_eq!(window.requests("b"), 5);
        assert_eq!(window.requests("a"), 0);
        assert!(!window.backends.contains_key("a"));
        // Seconds 15..=24: a's last five and b's first five, although b's
        // later seconds 25..=29 now sit in the ring beside them.
        let window = stats.window(at(24), Duration::from_secs(10));
        assert_eq!(window.requests("a"), 5);
        assert_eq!(window.requests("b"), 5);
        // Asking past the end of recording: nothing recent.
        let later = stats.window(at(100), Duration::from_secs(10));
        assert_eq!(later.total().requests, 0);
        // Totals never forget.
        assert_eq!(stats.snapshot().requests("a"), 20);
        assert_eq!(stats.snapshot().requests("b"), 10);
    }

    #[test]
    fn window_is_capped_at_the_ring_size() {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        for s in 0..20 {
            stats.record(
                t0 + Duration::from_secs(s),
                Some("a"),
                Outcome::Success,
                Some(MS),
            );
        }
        let window = stats.window(t0 + Duration::from_secs(19), Duration::from_secs(3600));
        assert_eq!(window.requests("a"), SLOTS as u64);
    }

    #[test]
    fn backend_names_are_bounded() {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        for i in 0..100 {
            let name = format!("backend-{i}");
            stats.record(t0, Some(&name), Outcome::Success, Some(MS));
        }
        stats.record(t0, None, Outcome::Transport, None);
        let long = "x".repeat(10_000);
        stats.record(t0, Some(&long), Outcome::Success, Some(MS));
        let snap = stats.snapshot();
        assert!(snap.backends.len() <= MAX_BACKENDS);
        assert_eq!(snap.total().requests, 102);
        assert!(snap.requests(OTHER_BACKENDS) >= 70);
        assert_eq!(snap.requests(NO_BACKEND), 1);
        assert!(snap.backends.keys().all(|k| k.len() <= MAX_NAME_LEN));
    }

    #[test]
    fn error_text_is_bounded() {
        let mut stats = LoadStats::new(Instant::now());
        stats.note_error(&"e".repeat(5000));
        assert!(stats.last_error().expect("noted").chars().count() <= MAX_ERROR_LEN + 1);
    }
}
