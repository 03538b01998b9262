//! Peak-EWMA latency: an estimate that jumps up to a slow sample at once and
//! decays back over `DECAY`, so one slow response steers traffic away
//! immediately and the endpoint is tried again once it has been quiet.
//!
//! An endpoint not yet measured has no estimate of its own; the balancer
//! gives it the latency last seen on its target (see `Balancer`), so that it
//! is neither starved (Linkerd starts new endpoints at 30 ms, which keeps a
//! lightly loaded target on its first endpoint for tens of seconds) nor
//! flooded (as an estimate of zero would).

use std::time::{Duration, Instant};

/// Linkerd's decay window for the estimate.
pub const DECAY: Duration = Duration::from_secs(10);
#[derive(Debug)]
pub struct PeakEwma {
    estimate_ns: Option<f64>,
    stamp: Instant,
}

impl PeakEwma {
    pub fn new(now: Instant) -> Self {
        Self {
            estimate_ns: None,
            stamp: now,
        }
    }

    fn decayed(&self, now: Instant) -> Option<f64> {
        let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
        Some(self.estimate_ns? * (-elapsed / DECAY.as_secs_f64()).exp())
    }

    /// Records one observed latency.
    pub fn observe(&mut self, rtt: Duration, now: Instant) {
        let rtt = rtt.as_nanos() as f64;
        let Some(current) = self.decayed(now) else {
            self.estimate_ns = Some(rtt);
            self.stamp = now;
            return;
        };
        self.estimate_ns = Some(if rtt > current {
            rtt
        } else {
            let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
            let w = (-elapsed / DECAY.as_secs_f64()).exp();
            current * w + rtt * (1.0 - w)
        });
        self.stamp = now;
    }

    /// The estimate now, in nanoseconds; `None` before the first sample.
    pub fn estimate(&self, now: Instant) -> Option<f64> {
        self.decayed(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_sample_raises_the_estimate_at_once_and_it_decays() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0);
        assert_eq!(e.estimate(t0), None);
        e.observe(Duration::from_millis(1), t0 + Duration::from_millis(10));
        let low = e
            .estimate(t0 + Duration::from_millis(10))
            .expect("measured");
        assert!(
            (low - 1e6).abs() < 1.0,
            "the first sample is the estimate: {low}"
        );
        e.observe(Duration::from_millis(200), t0 + Duration::from_millis(20));
        let peak = e
            .estimate(t0 + Duration::from_millis(20))
            .expect("measured");
        assert!(peak >= 199e6, "peak {peak}");
        assert!(peak > low * 10.0);
        let later = e.estimate(t0 + Duration::from_secs(20)).expect("measured");
        assert!(later < peak / 5.0, "later {later}");
    }

    #[test]
    fn fast_samples_pull_the_estimate_down_gradually() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0);
        e.observe(Duration::from_millis(100), t0);
        e.observe(Duration::from_millis(1), t0 + Duration::from_millis(1));
        let after_one = e.estimate(t0 + Duration::from_millis(1)).expect("measured");
        assert!(
            after_one > 90e6,
            "one fast sample must not erase a peak: {after_one}"
        );
    }
}
