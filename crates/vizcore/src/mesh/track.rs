//! One thing's figures over time: a ring of compact points (one per cycle)
//! and, for the last few cycles, the latency buckets that answer a window's
//! quantiles.

use std::collections::{HashMap, VecDeque};

use crate::api::{Golden, Spark};

/// Most distinct latency buckets kept per cycle per track (a proxy's
/// `response_latency_ms` has 26); more are dropped.
const MAX_BUCKETS_PER_POINT: usize = u8::MAX as usize;

/// Most distinct bucket bounds the mesh keeps (a proxy's histograms have
/// about 40 together); buckets of others are dropped.
const MAX_BOUNDS: usize = u16::MAX as usize;

/// One latency bucket's count; its bounds are in [`Bounds`]: 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Bucket {
    pub bounds: u16,
    pub count: u32,
}

/// A bucket's bounds, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BucketBounds {
    pub lo: f32,
    pub hi: f32,
}

/// Every pair of bucket bounds seen, mesh-wide, so that a kept bucket
/// names its bounds in two bytes. Never shrinks; at most [`MAX_BOUNDS`].
#[derive(Debug, Default)]
pub(super) struct Bounds {
    pairs: Vec<BucketBounds>,
    index: HashMap<(u32, u32), u16>,
}

impl Bounds {
    /// The id of `lo..hi`; `None` once the table is full.
    pub fn id(&mut self, lo: f32, hi: f32) -> Option<u16> {
        let key = (lo.to_bits(), hi.to_bits());
        if let Some(id) = self.index.get(&key) {
            return Some(*id);
        }
        let id = u16::try_from(self.pairs.len()).ok()?;
        if self.pairs.len() >= MAX_BOUNDS {
            return None;
        }
        self.pairs.push(BucketBounds { lo, hi });
        self.index.insert(key, id);
        Some(id)
    }

    pub fn get(&self, id: u16) -> Option<BucketBounds> {
        self.pairs.get(usize::from(id)).copied()
    }

    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.pairs.capacity() * size_of::<BucketBounds>()
            + self.index.capacity() * (size_of::<(u32, u32)>() + size_of::<u16>() + 1) * 8 / 7
    }
}

/// What one cycle added to one thing, before it becomes a point.
#[derive(Clone, Debug, Default)]
pub(super) struct Acc {
    pub requests: u64,
    pub successes: u64,
    /// (lo, hi, count), one per `hi`.
    pub buckets: Vec<(f32, f32, u64)>,
}

impl Acc {
    pub fn responses(&mut self, n: u64, success: bool) {
        self.requests = self.requests.saturating_add(n);
        if success {
            self.successes = self.successes.saturating_add(n);
        }
    }

    pub fn bucket(&mut self, lo: f32, hi: f32, n: u64) {
        if n == 0 {
            return;
        }
        match self.buckets.iter_mut().find(|b| b.1 == hi) {
            Some(b) => b.2 = b.2.saturating_add(n),
            None => self.buckets.push((lo, hi, n)),
        }
    }

    pub fn merge(&mut self, other: &Acc) {
        self.responses(other.requests, false);
        self.successes = self.successes.saturating_add(other.successes);
        for (lo, hi, n) in &other.buckets {
            self.bucket(*lo, *hi, *n);
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<(f32, f32, u64)>()
    }
}

/// One cycle of one thing: 12 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Point {
    pub requests: u32,
    pub successes: u32,
    /// NaN: no latency known.
    pub p99_ms: f32,
}

/// A thing's points, newest last, aligned with the mesh's cycle times: a
/// track gets a point every cycle from the one it was made in.
#[derive(Clone, Debug, Default)]
pub(super) struct Track {
    points: VecDeque<Point>,
    /// None for a track that keeps no latency.
    latency: Option<Box<Latency>>,
}

/// The latency buckets of a track's newest points.
#[derive(Clone, Debug, Default)]
struct Latency {
    /// Bucket entries of each of the newest `lens.len()` points.
    lens: VecDeque<u8>,
    buckets: VecDeque<Bucket>,
}

/// How long a track keeps what.
#[derive(Clone, Copy, Debug)]
pub(super) struct Keep {
    /// Points (the sparkline's length).
    pub points: usize,
    /// Cycles whose latency buckets are kept (the longest window).
    pub bucket_points: usize,
}

impl Track {
    pub fn new(keep: Keep) -> Self {
        Self {
            points: VecDeque::with_capacity(keep.points),
            latency: (keep.bucket_points > 0).then(|| {
                Box::new(Latency {
                    lens: VecDeque::with_capacity(keep.bucket_points),
                    buckets: VecDeque::new(),
                })
            }),
        }
    }

    /// This cycle's point, from what it added (nothing: a zero point).
    pub fn push(&mut self, acc: Option<&Acc>, keep: Keep, bounds: &mut Bounds) {
        let empty = Acc::default();
        let acc = acc.unwrap_or(&empty);
        let mut buckets = acc.buckets.clone();
        buckets.sort_by(|a, b| a.1.total_cmp(&b.1));
        buckets.truncate(MAX_BUCKETS_PER_POINT);
        let p99 = quantile(&buckets, 0.99).map_or(f32::NAN, |v| v as f32);
        if self.points.len() >= keep.points.max(1) {
            self.points.pop_front();
        }
        self.points.push_back(Point {
            requests: sat32(acc.requests),
            successes: sat32(acc.successes),
            p99_ms: p99,
        });
        let Some(l) = self.latency.as_deref_mut() else {
            return;
        };
        if l.lens.len() >= keep.bucket_points.max(1) {
            let n = l.lens.pop_front().unwrap_or(0);
            l.buckets.drain(..usize::from(n).min(l.buckets.len()));
        }
        let before = l.buckets.len();
        for (lo, hi, count) in &buckets {
            if let Some(id) = bounds.id(*lo, *hi) {
                l.buckets.push_back(Bucket {
                    bounds: id,
                    count: sat32(*count),
                });
            }
        }
        l.lens.push_back((l.buckets.len() - before) as u8);
        // A burst of buckets long gone should not hold its memory.
        if l.buckets.capacity() > 64 && l.buckets.capacity() > 4 * l.buckets.len() {
            l.buckets.shrink_to_fit();
        }
    }

    /// Points kept (cycles since the track was made, at most its keep).
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Adds the newest `n` cycles to `sum`.
    pub fn add_window(&self, n: usize, sum: &mut Window, bounds: &Bounds) {
        for p in self.points.iter().rev().take(n) {
            sum.requests += u64::from(p.requests);
            sum.successes += u64::from(p.successes);
        }
        let Some(l) = self.latency.as_deref() else {
            return;
        };
        let entries: usize = l.lens.iter().rev().take(n).map(|n| usize::from(*n)).sum();
        let skip = l.buckets.len().saturating_sub(entries);
        for b in l.buckets.iter().skip(skip) {
            if let Some(at) = bounds.get(b.bounds) {
                sum.buckets.push((at.lo, at.hi, u64::from(b.count)));
            }
        }
    }

    /// The track as a sparkline over the mesh's cycle `times` (Unix ms; a
    /// track younger than the history is zero before it began).
    pub fn spark(&self, times: &VecDeque<u64>, interval_secs: u64) -> Spark {
        let mut spark = Spark::default();
        let pad = times.len().saturating_sub(self.points.len());
        let skip = self.points.len().saturating_sub(times.len());
        let mut points = self.points.iter().skip(skip);
        for (i, t) in times.iter().enumerate() {
            let secs = cycle_secs(times, i, interval_secs);
            spark.t.push(*t / 1000);
            let p = if i < pad { None } else { points.next() };
            match p {
                Some(p) => {
                    spark.rps.push(f64::from(p.requests) / secs);
                    spark.success_rate.push(
                        (p.requests > 0).then(|| f64::from(p.successes) / f64::from(p.requests)),
                    );
                    spark
                        .p99_ms
                        .push((!p.p99_ms.is_nan()).then_some(f64::from(p.p99_ms)));
                }
                None => {
                    spark.rps.push(0.0);
                    spark.success_rate.push(None);
                    spark.p99_ms.push(None);
                }
            }
        }
        spark
    }

    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.points.capacity() * size_of::<Point>()
            + self.latency.as_ref().map_or(0, |l| {
                size_of::<Latency>()
                    + l.lens.capacity()
                    + l.buckets.capacity() * size_of::<Bucket>()
            })
    }
}

/// Seconds the cycle at `times[i]` (Unix ms) covered: since the cycle
/// before, at millisecond resolution (the first covers one interval).
pub(super) fn cycle_secs(times: &VecDeque<u64>, i: usize, interval_secs: u64) -> f64 {
    match i.checked_sub(1).and_then(|j| times.get(j)) {
        Some(prev) => times[i].saturating_sub(*prev).max(1) as f64 / 1000.0,
        None => interval_secs.max(1) as f64,
    }
}

/// What a window of one or more tracks adds up to.
#[derive(Clone, Debug, Default)]
pub(super) struct Window {
    pub requests: u64,
    pub successes: u64,
    pub buckets: Vec<(f32, f32, u64)>,
}

impl Window {
    pub fn golden(mut self, secs: f64) -> Golden {
        self.buckets.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut merged: Vec<(f32, f32, u64)> = Vec::with_capacity(self.buckets.len());
        for (lo, hi, n) in self.buckets {
            match merged.last_mut() {
                Some(last) if last.1 == hi => last.2 = last.2.saturating_add(n),
                _ => merged.push((lo, hi, n)),
            }
        }
        let known = self.requests > 0;
        Golden {
            requests: self.requests,
            successes: self.successes,
            rps: self.requests as f64 / secs.max(1.0),
            success_rate: known.then(|| self.successes as f64 / self.requests as f64),
            p50_ms: quantile(&merged, 0.50),
            p95_ms: quantile(&merged, 0.95),
            p99_ms: quantile(&merged, 0.99),
        }
    }
}

/// Prometheus's `histogram_quantile` over per-bucket counts sorted by upper
/// bound, one per bound: the bucket the rank falls in, linear inside it; in
/// the `+Inf` bucket, the highest finite bound.
pub(super) fn quantile(buckets: &[(f32, f32, u64)], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().map(|b| b.2).sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0.0f64;
    let mut highest_finite = None;
    for (lo, hi, n) in buckets {
        let (lo, hi, n) = (f64::from(*lo), f64::from(*hi), *n as f64);
        if hi.is_finite() {
            highest_finite = Some(hi);
        }
        if n > 0.0 && below + n >= rank {
            if !hi.is_finite() {
                return (lo.is_finite() && lo > 0.0).then_some(lo);
            }
            let lo = lo.min(hi);
            return Some(lo + (hi - lo) * ((rank - below) / n).clamp(0.0, 1.0));
        }
        below += n;
    }
    highest_finite
}

fn sat32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket_like_prometheus() {
        // 100 in (0,10], 100 in (10,20]: the median is at 10, p95 at 19.
        let b = [(0.0, 10.0, 100), (10.0, 20.0, 100)];
        assert_eq!(quantile(&b, 0.5), Some(10.0));
        assert!((quantile(&b, 0.95).unwrap() - 19.0).abs() < 1e-9);
        assert!((quantile(&b, 0.25).unwrap() - 5.0).abs() < 1e-9);
        // In +Inf: the highest finite bound.
        let b = [(0.0, 10.0, 1), (10.0, f32::INFINITY, 99)];
        assert_eq!(quantile(&b, 0.99), Some(10.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[(0.0, 5.0, 0)], 0.5), None);
    }

    #[test]
    fn a_track_keeps_its_bounds_and_sums_its_window() {
        let keep = Keep {
            points: 5,
            bucket_points: 2,
        };
        let mut t = Track::new(keep);
        let mut bounds = Bounds::default();
        for i in 0..10u64 {
            let mut acc = Acc::default();
            acc.responses(i, true);
            acc.bucket(0.0, 1.0, i);
            t.push(Some(&acc), keep, &mut bounds);
        }
        assert_eq!(t.len(), 5);
        let mut w = Window::default();
        t.add_window(3, &mut w, &bounds);
        assert_eq!(w.requests, 9 + 8 + 7);
        // Buckets only for the last two cycles.
        assert_eq!(w.buckets.iter().map(|b| b.2).sum::<u64>(), 9 + 8);
        let times: VecDeque<u64> = (0..8).map(|i| (100 + i * 10) * 1000).collect();
        let s = t.spark(&times, 10);
        assert_eq!(s.t.len(), 8);
        assert_eq!(s.rps[..3], [0.0, 0.0, 0.0]);
        assert_eq!(s.rps[7], 0.9);
        assert_eq!(s.success_rate[7], Some(1.0));
    }
}
