//! Peak-EWMA latency, lock-free: an estimate that jumps up to a slow sample
//! at once and decays back, so one slow response steers traffic away
//! immediately and the endpoint is tried again once it has been quiet.
//!
//! How fast a peak is forgotten scales with the target's typical latency
//! ([`decay_for`]): Linkerd's fixed 10 s window starves a sub-millisecond
//! endpoint for half a minute after one scheduling hiccup (measured in
//! `balance::tests`), while for a service answering in tens of
//! milliseconds the window stays Linkerd's.
//!
//! The estimate and its timestamp share one atomic word (an `f32` of
//! nanoseconds and a wrapping millisecond stamp), so requests update it with
//! no lock and no torn pair.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};
use tokio::time::Instant;

/// Linkerd's decay window: the longest a peak takes to be forgotten.
pub const MAX_DECAY: Duration = Duration::from_secs(10);
/// The shortest decay window, however fast the target.
pub const MIN_DECAY: Duration = Duration::from_millis(100);
/// A peak is forgotten over about this many typical round trips.
pub const DECAY_ROUND_TRIPS: f64 = 500.0;

/// The decay window for a target whose typical latency is `typical_ns`.
pub fn decay_for(typical_ns: f64) -> Duration {
    let secs = (typical_ns * DECAY_ROUND_TRIPS / 1e9)
        .max(MIN_DECAY.as_secs_f64())
        .min(MAX_DECAY.as_secs_f64());
    Duration::from_secs_f64(secs)
}

/// The clock origin of one target's estimates.
#[derive(Clone, Copy, Debug)]
pub struct Epoch(Instant);

impl Epoch {
    pub fn now() -> Self {
        Self(Instant::now())
    }

    pub fn instant(&self) -> Instant {
        self.0
    }

    fn ms(&self, at: Instant) -> u32 {
        // Wraps after 49 days; elapsed times are taken with wrapping
        // arithmetic, so only an endpoint idle that long reads wrongly.
        at.saturating_duration_since(self.0).as_millis() as u32
    }
}

const NONE: u64 = u64::MAX;

/// One endpoint's latency estimate.
#[derive(Debug)]
pub struct PeakEwma {
    /// High 32 bits: estimate in ns (`f32` bits); low 32: stamp in ms.
    packed: AtomicU64,
}

fn pack(estimate_ns: f64, stamp_ms: u32) -> u64 {
    (u64::from((estimate_ns as f32).to_bits()) << 32) | u64::from(stamp_ms)
}

fn unpack(word: u64) -> Option<(f64, u32)> {
    (word != NONE).then(|| (f64::from(f32::from_bits((word >> 32) as u32)), word as u32))
}

fn weight(elapsed_ms: u32, decay: Duration) -> f64 {
    (-(f64::from(elapsed_ms) / 1000.0) / decay.as_secs_f64()).exp()
}

impl Default for PeakEwma {
    fn default() -> Self {
        Self {
            packed: AtomicU64::new(NONE),
        }
    }
}

impl PeakEwma {
    /// Records one observed latency.
    pub fn observe(&self, rtt: Duration, now: Instant, epoch: Epoch, decay: Duration) {
        let rtt = rtt.as_nanos() as f64;
        let now_ms = epoch.ms(now);
        // A lost race drops one sample, which an estimate can afford.
        let _ = self
            .packed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                let next = match unpack(word) {
                    None => rtt,
                    Some((estimate, stamp)) => {
                        let w = weight(now_ms.wrapping_sub(stamp), decay);
                        let current = estimate * w;
                        if rtt > current {
                            rtt
                        } else {
                            current * w + rtt * (1.0 - w)
                        }
                    }
                };
                Some(pack(next, now_ms))
            });
    }

    /// The estimate now, in nanoseconds; `None` before the first sample.
    pub fn estimate(&self, now: Instant, epoch: Epoch, decay: Duration) -> Option<f64> {
        let (estimate, stamp) = unpack(self.packed.load(Ordering::Relaxed))?;
        Some(estimate * weight(epoch.ms(now).wrapping_sub(stamp), decay))
    }
}

/// A target's typical latency: a plain moving average over every sample of
/// every endpoint (no peaks), which sets the decay window and stands in for
/// endpoints not measured yet.
#[derive(Debug)]
pub struct Typical(AtomicU64);

impl Default for Typical {
    fn default() -> Self {
        Self(AtomicU64::new(0f64.to_bits()))
    }
}

impl Typical {
    /// Each sample moves the average by 1/16 of the difference.
    pub fn observe(&self, rtt: Duration) {
        let rtt = rtt.as_nanos() as f64;
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let current = f64::from_bits(bits);
                let next = if current == 0.0 {
                    rtt
                } else {
                    current + (rtt - current) / 16.0
                };
                Some(next.to_bits())
            });
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECAY: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_slow_sample_raises_the_estimate_at_once_and_it_decays() {
        let epoch = Epoch::now();
        let t0 = Instant::now();
        let e = PeakEwma::default();
        assert_eq!(e.estimate(t0, epoch, DECAY), None);
        let t1 = t0 + Duration::from_millis(10);
        e.observe(Duration::from_millis(1), t1, epoch, DECAY);
        let low = e.estimate(t1, epoch, DECAY).expect("measured");
        assert!(
            (low - 1e6).abs() < 1.0,
            "the first sample is the estimate: {low}"
        );
        let t2 = t0 + Duration::from_millis(20);
        e.observe(Duration::from_millis(200), t2, epoch, DECAY);
        let peak = e.estimate(t2, epoch, DECAY).expect("measured");
        assert!(peak >= 199e6, "peak {peak}");
        let later = e
            .estimate(t0 + Duration::from_secs(20), epoch, DECAY)
            .expect("measured");
        assert!(later < peak / 5.0, "later {later}");
    }

    #[tokio::test(start_paused = true)]
    async fn fast_samples_pull_the_estimate_down_gradually() {
        let epoch = Epoch::now();
        let t0 = Instant::now();
        let e = PeakEwma::default();
        e.observe(Duration::from_millis(100), t0, epoch, DECAY);
        let t1 = t0 + Duration::from_millis(1);
        e.observe(Duration::from_millis(1), t1, epoch, DECAY);
        let after_one = e.estimate(t1, epoch, DECAY).expect("measured");
        assert!(
            after_one > 90e6,
            "one fast sample must not erase a peak: {after_one}"
        );
    }

    #[test]
    fn the_decay_window_follows_the_typical_latency_within_bounds() {
        assert_eq!(decay_for(0.0), MIN_DECAY);
        assert_eq!(decay_for(300e3), Duration::from_millis(150));
        assert_eq!(decay_for(50e6), MAX_DECAY);
        assert_eq!(decay_for(f64::NAN), MIN_DECAY);
    }

    #[test]
    fn the_typical_latency_is_a_plain_average() {
        let t = Typical::default();
        t.observe(Duration::from_micros(300));
        assert_eq!(t.get(), 300e3);
        t.observe(Duration::from_micros(1900));
        assert_eq!(t.get(), 400e3);
    }
}
