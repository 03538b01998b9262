//! A fixed-size latency histogram: log-linear buckets over microseconds,
//! eight per power of two (each bucket at most 12.5% wide), from 1 µs to
//! about 19 hours. 272 counters, whatever the number of samples.

use std::time::Duration;

/// Buckets per power of two, as a bit count (2^3 = 8).
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Largest exponent kept; larger samples land in the last bucket.
const MAX_EXP: u32 = 35;
const BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS + 1) as usize * SUB;
const MAX_MICROS: u64 = (1 << (MAX_EXP + 1)) - 1;

/// Counts of latencies by bucket. Additive: merging and subtracting
/// histograms of the same samples are exact, so a window or a step is the
/// difference of two cumulative histograms.
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    buckets: Box<[u64; BUCKETS]>,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: Box::new([0; BUCKETS]),
            count: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[index(micros)] += 1;
        self.count += 1;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The latency at quantile `q` (0..=1): the middle of the bucket holding
    /// that rank, so within about 6% of the true value. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        // The rank of the sample at q, from 1.
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, high) = bounds(i);
                return Some(Duration::from_micros(low + (high - low) / 2));
            }
        }
        None
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine += theirs;
        }
        self.count += other.count;
    }

    /// What was recorded after `earlier`, a copy of this histogram taken before.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let mut delta = Histogram::default();
        for ((d, now), then) in delta
            .buckets
            .iter_mut()
            .zip(self.buckets.iter())
            .zip(earlier.buckets.iter())
        {
            *d = now.saturating_sub(*then);
        }
        delta.count = self.count.saturating_sub(earlier.count);
        delta
    }
}

/// The bucket of a sample in microseconds.
fn index(micros: u64) -> usize {
    let v = micros.min(MAX_MICROS);
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let sub = ((v >> (exp - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The smallest and largest microsecond values of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, i as u64);
    }
    let exp = ((i - SUB) / SUB) as u32 + SUB_BITS;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (exp - SUB_BITS);
    let low = (SUB as u64 + sub) * width;
    (low, low + width - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (low, high) = bounds(i);
            assert_eq!(low, next, "bucket {i} starts where the previous ended");
            assert!(high >= low);
            assert_eq!(index(low), i);
            assert_eq!(index(high), i);
            // No bucket wider than 1/8 of its lower bound.
            assert!(
                (high - low + 1) * 8 <= low.max(8),
                "bucket {i}: {low}..={high}"
            );
            next = high + 1;
        }
        assert_eq!(next, MAX_MICROS + 1);
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut h = Histogram::default();
        // 1..=1000 ms, one sample each.
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        for (q, exact_ms) in [(0.5, 500.0), (0.99, 990.0), (0.0, 1.0), (1.0, 1000.0)] {
            let got = h.quantile(q).expect("samples").as_secs_f64() * 1000.0;
            assert!(
                (got - exact_ms).abs() <= exact_ms * 0.07,
                "q{q}: {got} ms, expected about {exact_ms} ms"
            );
        }
    }

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn since_undoes_merge() {
        let mut a = Histogram::default();
        for us in [3, 70, 900, 12_000] {
            a.record(Duration::from_micros(us));
        }
        let before = a.clone();
        let mut b = Histogram::default();
        for us in [5_000_000, 5_000_000, 40] {
            b.record(Duration::from_micros(us));
        }
        a.merge(&b);
        assert_eq!(a.count(), 7);
        assert_eq!(a.since(&before), b);
        assert_eq!(
            a.since(&before).quantile(0.5).map(|d| d.as_secs()),
            Some(4),
            "the median of the delta is one of the 5 s samples (bucket middle)"
        );
    }

    #[test]
    fn huge_samples_are_clamped_not_lost() {
        let mut h = Histogram::default();
        h.record(Duration::from_secs(10 * 86_400));
        assert_eq!(h.count(), 1);
        assert!(h.quantile(1.0).expect("sample") > Duration::from_secs(60 * 60));
    }
}
