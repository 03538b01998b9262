//! The retry schedule: capped exponential backoff with jitter. Shared by the
//! controller's Kubernetes client and the proxy's control-plane client and
//! endpoint connects; it knows nothing of either.
//!
//! Retry `n` (counting from 0) waits a delay drawn uniformly from
//! `[(1 - jitter) * base(n), base(n)]`, where
//! `base(n) = min(initial * factor^n, max)`. The top of the range is a hard
//! cap (no wait is ever longer than `max`), and the bottom bounds how often a
//! failing API server can be asked: see [`BackoffConfig::max_attempts_within`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::time::Duration;

/// Default first delay (800 ms, as client-go's reflector).
pub const DEFAULT_INITIAL: Duration = Duration::from_millis(800);
/// Default longest delay (30 s).
pub const DEFAULT_MAX: Duration = Duration::from_secs(30);
/// Default growth per failed attempt.
pub const DEFAULT_FACTOR: f64 = 2.0;
/// Default jitter: each delay is drawn from the upper half of its step
/// ("equal jitter").
pub const DEFAULT_JITTER: f64 = 0.5;
/// Default quiet time after which the schedule starts again from `initial`.
pub const DEFAULT_RESET_AFTER: Duration = Duration::from_secs(120);

/// Shortest delay ever used, whatever the configuration says: a zero delay
/// would be a busy loop against the API server.
const MIN_DELAY: Duration = Duration::from_millis(1);

/// How the source waits between failed attempts (per resource kind).
#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    /// Base delay of the first retry. Default [`DEFAULT_INITIAL`] (800 ms).
    pub initial: Duration,
    /// Cap on every delay. Default [`DEFAULT_MAX`] (30 s).
    pub max: Duration,
    /// Growth of the base delay per consecutive failure (at least 1).
    /// Default [`DEFAULT_FACTOR`] (2).
    pub factor: f64,
    /// Fraction of each delay that is random, in `[0, 1]`: the delay is drawn
    /// from `[(1 - jitter) * base, base]`. Default [`DEFAULT_JITTER`] (0.5).
    pub jitter: f64,
    /// The schedule restarts from `initial` after a watch event arrives, or
    /// when the previous failure is older than this. Default
    /// [`DEFAULT_RESET_AFTER`] (120 s).
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: DEFAULT_INITIAL,
            max: DEFAULT_MAX,
            factor: DEFAULT_FACTOR,
            jitter: DEFAULT_JITTER,
            reset_after: DEFAULT_RESET_AFTER,
        }
    }
}

impl BackoffConfig {
    /// The configuration with out-of-range values brought into range:
    /// `initial` and `max` at least 1 ms, `initial <= max`, `factor >= 1`,
    /// `jitter` in `[0, 1]` (non-finite values take the defaults).
    pub fn sanitized(&self) -> Self {
        let max = self.max.max(MIN_DELAY);
        let initial = self.initial.clamp(MIN_DELAY, max);
        let factor = if self.factor.is_finite() {
            self.factor.max(1.0)
        } else {
            DEFAULT_FACTOR
        };
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            DEFAULT_JITTER
        };
        Self {
            initial,
            max,
            factor,
            jitter,
            reset_after: self.reset_after,
        }
    }

    /// The un-jittered delay of retry `step` (0-based): `min(initial *
    /// factor^step, max)`.
    pub fn base(&self, step: u32) -> Duration {
        let c = self.sanitized();
        let secs = c.initial.as_secs_f64() * c.factor.powi(step.min(i32::MAX as u32) as i32);
        if !secs.is_finite() || secs >= c.max.as_secs_f64() {
            c.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The shortest and longest delay of retry `step`.
    pub fn bounds(&self, step: u32) -> (Duration, Duration) {
        let c = self.sanitized();
        let base = c.base(step);
        (base.mul_f64(1.0 - c.jitter).max(MIN_DELAY), base)
    }

    /// The delay of retry `step` for a random draw `r` in `[0, 1]`.
    pub fn delay(&self, step: u32, r: f64) -> Duration {
        let (lo, hi) = self.bounds(step);
        let r = if r.is_finite() {
            r.clamp(0.0, 1.0)
        } else {
            1.0
        };
        lo + (hi - lo).mul_f64(r)
    }

    /// The most attempts (the first one and its retries) that consecutive
    /// failures can make within `window`, when every retry waits its
    /// shortest delay. A bound for tests and capacity planning: against an
    /// API server failing every request, one resource kind sends at most this
    /// many requests in `window`.
    pub fn max_attempts_within(&self, window: Duration) -> u64 {
        let mut attempts = 1u64;
        let mut elapsed = Duration::ZERO;
        let mut step = 0u32;
        loop {
            elapsed += self.bounds(step).0;
            if elapsed > window {
                return attempts;
            }
            attempts += 1;
            step = step.saturating_add(1);
        }
    }
}

/// The state of one schedule: how many failures in a row.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    step: u32,
}

impl Backoff {
    /// A schedule at its first step.
    pub fn new(config: &BackoffConfig) -> Self {
        Self {
            config: config.sanitized(),
            step: 0,
        }
    }

    /// The delay before the next retry; advances the schedule.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.config.delay(self.step, rand::random::<f64>());
        self.step = self.step.saturating_add(1);
        delay
    }

    /// Starts again from `initial`.
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// Failures since the last reset.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// The sanitized configuration this schedule follows.
    pub fn config(&self) -> &BackoffConfig {
        &self.config
    }
}

/// gRPC's retry hint: a server that refuses for load says how long to stay
/// away, in whole milliseconds (Ballast's controllers send it when they
/// refuse for memory).
pub const RETRY_PUSHBACK_KEY: &str = "grpc-retry-pushback-ms";

/// The longest hint honoured: a server asking for more is waited on this
/// long.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(60);

/// The wait before the next attempt: the schedule's `step`, or the server's
/// `hint` (the value of [`RETRY_PUSHBACK_KEY`]) when that is longer, at most
/// [`MAX_PUSHBACK`]. A hint that is not a whole number of milliseconds is
/// ignored.
pub fn with_pushback(step: Duration, hint: Option<&str>) -> Duration {
    let hint = hint
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms).min(MAX_PUSHBACK));
    hint.map_or(step, |hint| hint.max(step))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn default_schedule_doubles_from_800ms_to_30s() {
        let c = BackoffConfig::default();
        let bases: Vec<_> = (0..8).map(|n| c.base(n)).collect();
        assert_eq!(
            bases,
            [
                ms(800),
                ms(1600),
                ms(3200),
                ms(6400),
                ms(12800),
                ms(25600),
                ms(30000),
                ms(30000)
            ]
        );
        assert_eq!(c.base(u32::MAX), ms(30000));
    }

    #[test]
    fn jittered_delays_stay_within_bounds() {
        let c = BackoffConfig::default();
        assert_eq!(c.bounds(0), (ms(400), ms(800)));
        assert_eq!(c.bounds(10), (ms(15000), ms(30000)));
        assert_eq!(c.delay(0, 0.0), ms(400));
        assert_eq!(c.delay(0, 1.0), ms(800));
        assert_eq!(c.delay(1, 0.5), ms(1200));
        let mut b = Backoff::new(&c);
        for step in 0..40 {
            let d = b.next_delay();
            let (lo, hi) = c.bounds(step);
            assert!(
                lo <= d && d <= hi,
                "step {step}: {d:?} not in [{lo:?}, {hi:?}]"
            );
        }
        b.reset();
        assert_eq!(b.step(), 0);
        assert!(b.next_delay() <= ms(800));
    }

    #[test]
    fn no_jitter_is_exact_and_full_jitter_has_a_floor() {
        let exact = BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        };
        assert_eq!(exact.bounds(2), (ms(3200), ms(3200)));
        let full = BackoffConfig {
            jitter: 1.0,
            ..BackoffConfig::default()
        };
        assert_eq!(full.bounds(0), (MIN_DELAY, ms(800)));
    }

    #[test]
    fn bad_values_are_brought_into_range() {
        let c = BackoffConfig {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            factor: 0.5,
            jitter: 7.0,
            reset_after: Duration::ZERO,
        }
        .sanitized();
        assert_eq!(
            (c.initial, c.max, c.factor, c.jitter),
            (MIN_DELAY, MIN_DELAY, 1.0, 1.0)
        );
        let c = BackoffConfig {
            initial: Duration::from_secs(60),
            factor: f64::NAN,
            jitter: f64::INFINITY,
            ..BackoffConfig::default()
        }
        .sanitized();
        assert_eq!((c.initial, c.factor, c.jitter), (ms(30000), 2.0, 0.5));
    }

    #[test]
    fn attempts_within_a_window_follow_the_shortest_delays() {
        let c = BackoffConfig::default();
        // Shortest delays: 0.4, 0.8, 1.6, 3.2, 6.4 (sum 12.4), 12.8 (25.2),
        // 15 (40.2): six retries fit in 30 s, plus the first attempt.
        assert_eq!(c.max_attempts_within(Duration::from_secs(30)), 7);
        assert_eq!(c.max_attempts_within(Duration::ZERO), 1);
        assert_eq!(c.max_attempts_within(ms(400)), 2);
    }
}
