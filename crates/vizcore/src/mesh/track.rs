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

/// One cycle of one thing, as decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Point {
    pub requests: u32,
    pub successes: u32,
    /// NaN: no latency known.
    pub p99_ms: f32,
}

/// How a point record gives its p99.
const P99_NONE: u64 = 0;
/// Four bytes (f32, little endian) follow.
const P99_EXPLICIT: u64 = 1;
/// The quantile of the record's own buckets (a record of the latency
/// window whose kept buckets give exactly the p99 of the cycle).
const P99_DERIVED: u64 = 2;

/// How a record's bucket ids are written.
const IDS_DENSE: u64 = 0;
const IDS_MASK: u64 = 1;
const IDS_GAPS: u64 = 2;

/// A thing's points, newest last, aligned with the mesh's cycle times: a
/// track gets a point every cycle from the one it was made in.
///
/// Kept as bytes, a few per point (LEB128 varints), in two rings: the
/// newest `bucket_points` cycles in `recent` with their latency buckets (a
/// point's p99 is then most often not stored but derived from them), older
/// ones in `old` as counts and p99. Both rings and where they are live in
/// one allocation, `[header | old | recent]`, as large as its records (no
/// power-of-two growth, no slot per possible bucket); an empty track
/// allocates nothing.
///
/// A record of `old`: `requests`, `failures << 2 | p99 mode`, the p99
/// (f32) when explicit. A record of `recent`: the same, then its buckets:
/// `n << 2 | ids layout`, the first bound id, the ids (dense: consecutive;
/// mask: span and a bitmap; gaps: each id's distance to the one before),
/// then the `n` counts, in id order.
#[derive(Clone, Debug, Default)]
pub(super) struct Track {
    buf: Box<[u8]>,
}

/// The header's fields (u32, little endian).
const OLD_CAP: usize = 0;
const OLD_HEAD: usize = 1;
const OLD_BYTES: usize = 2;
const OLD_N: usize = 3;
const RECENT_HEAD: usize = 4;
const RECENT_BYTES: usize = 5;
const RECENT_N: usize = 6;
const HEADER: usize = 7 * 4;

/// Which of a track's rings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Old,
    Recent,
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
    pub fn new(_keep: Keep) -> Self {
        Self::default()
    }

    fn field(&self, i: usize) -> usize {
        self.buf
            .get(i * 4..i * 4 + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn set_field(&mut self, i: usize, v: usize) {
        if let Some(b) = self.buf.get_mut(i * 4..i * 4 + 4) {
            b.copy_from_slice(&(v as u32).to_le_bytes());
        }
    }

    fn old_len(&self) -> usize {
        self.field(OLD_N)
    }

    fn recent_len(&self) -> usize {
        self.field(RECENT_N)
    }

    /// A ring's region, head, bytes and records.
    fn ring(&self, side: Side) -> (&[u8], usize, usize) {
        if self.buf.len() < HEADER {
            return (&[], 0, 0);
        }
        let old_cap = self.field(OLD_CAP);
        let (old, recent) = self.buf[HEADER..].split_at(old_cap);
        match side {
            Side::Old => (old, self.field(OLD_HEAD), self.field(OLD_BYTES)),
            Side::Recent => (recent, self.field(RECENT_HEAD), self.field(RECENT_BYTES)),
        }
    }

    fn reader(&self, side: Side) -> Reader<'_> {
        let (region, head, len) = self.ring(side);
        let (a, b) = ring_slices(region, head, len);
        Reader { a, b, pos: 0 }
    }

    /// Appends a record to a ring: its number `records` (from 1) of the
    /// `expected` it will hold. When it must grow, it grows to hold that
    /// many records the size of those so far, and the allocation to the
    /// allocator's size class (the rest left to `recent`): a history is
    /// made in a few allocations, none later given back for a slightly
    /// smaller one (which would leave holes among the long-lived ones).
    fn push_record(&mut self, side: Side, bytes: &[u8], records: usize, expected: usize) {
        let (region, _, len) = self.ring(side);
        let (cap, need) = (region.len(), len + bytes.len());
        if need > cap {
            let want = need.max(need.div_ceil(records.max(1)) * expected);
            self.rebuild(side, want);
        }
        let base = HEADER
            + if side == Side::Old {
                0
            } else {
                self.field(OLD_CAP)
            };
        let (region, head, _) = self.ring(side);
        let cap = region.len();
        let mut at = (head + len) % cap.max(1);
        for b in bytes {
            self.buf[base + at] = *b;
            at += 1;
            if at == cap {
                at = 0;
            }
        }
        let (bytes_field, n_field) = match side {
            Side::Old => (OLD_BYTES, OLD_N),
            Side::Recent => (RECENT_BYTES, RECENT_N),
        };
        self.set_field(bytes_field, need);
        self.set_field(n_field, self.field(n_field) + 1);
    }

    /// Drops the oldest record of a ring.
    fn pop_record(&mut self, side: Side) {
        let mut r = self.reader(side);
        read_point(&mut r, None, side == Side::Recent);
        let n = r.pos;
        let (region, head, len) = self.ring(side);
        let cap = region.len().max(1);
        let n = n.min(len);
        let (head_field, bytes_field, n_field) = match side {
            Side::Old => (OLD_HEAD, OLD_BYTES, OLD_N),
            Side::Recent => (RECENT_HEAD, RECENT_BYTES, RECENT_N),
        };
        self.set_field(head_field, if n == len { 0 } else { (head + n) % cap });
        self.set_field(bytes_field, len - n);
        self.set_field(n_field, self.field(n_field).saturating_sub(1));
    }

    /// Lays the rings out anew, each at the start of its region: `side`
    /// with room for `want` bytes, the other with what it holds (and an
    /// eighth more). What the allocator's size class adds goes to `side`.
    /// The allocation is kept when its size does not change.
    fn rebuild(&mut self, side: Side, want: usize) {
        let (old_bytes, recent_bytes) = (self.field(OLD_BYTES), self.field(RECENT_BYTES));
        let snug = |bytes: usize| bytes + bytes / 8;
        let (old_cap, recent_cap) = match side {
            Side::Old => (want.max(old_bytes), snug(recent_bytes)),
            Side::Recent => (snug(old_bytes), want.max(recent_bytes)),
        };
        let total = size_class(HEADER + old_cap + recent_cap);
        let old_cap = match side {
            Side::Old => total - HEADER - recent_cap,
            Side::Recent => old_cap,
        };
        let mut buf = Vec::with_capacity(total);
        buf.resize(HEADER, 0);
        for side in [Side::Old, Side::Recent] {
            let (region, head, len) = self.ring(side);
            let (a, b) = ring_slices(region, head, len);
            buf.extend_from_slice(a);
            buf.extend_from_slice(b);
            if side == Side::Old {
                buf.resize(HEADER + old_cap, 0);
            }
        }
        buf.resize(total, 0);
        let (old_n, recent_n) = (self.old_len(), self.recent_len());
        if self.buf.len() == total {
            self.buf.copy_from_slice(&buf);
        } else {
            self.buf = buf.into_boxed_slice();
        }
        for (field, v) in [
            (OLD_CAP, old_cap),
            (OLD_HEAD, 0),
            (OLD_BYTES, old_bytes),
            (OLD_N, old_n),
            (RECENT_HEAD, 0),
            (RECENT_BYTES, recent_bytes),
            (RECENT_N, recent_n),
        ] {
            self.set_field(field, v);
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
        let point = Point {
            requests: sat32(acc.requests),
            successes: sat32(acc.successes),
            p99_ms: p99,
        };
        let points = keep.points.max(1);
        let mut record = Vec::with_capacity(16);
        if keep.bucket_points == 0 {
            write_point(&mut record, &point, false);
            self.push_record(Side::Old, &record, self.old_len() + 1, points);
        } else {
            let mut kept: Vec<(u16, u32)> = buckets
                .iter()
                .filter_map(|(lo, hi, count)| Some((bounds.id(*lo, *hi)?, sat32(*count))))
                .collect();
            kept.sort_unstable_by_key(|b| b.0);
            let derived = derived_p99(kept.iter().copied(), bounds, &mut Vec::new()).to_bits()
                == p99.to_bits();
            write_point(&mut record, &point, derived);
            write_buckets(&mut record, &kept);
            let n = self.recent_len() + 1;
            self.push_record(Side::Recent, &record, n, keep.bucket_points);
        }
        // Past the history, the oldest go; past the latency window, the
        // oldest of `recent` move to `old` (or go, when still past it).
        while self.len() > points && self.old_len() > 0 {
            self.pop_record(Side::Old);
        }
        while self.recent_len() > keep.bucket_points || self.len() > points {
            if self.recent_len() == 0 {
                break;
            }
            if self.len() > points {
                self.pop_record(Side::Recent);
            } else {
                self.age_out(keep, bounds);
            }
        }
        // A burst long gone does not keep its memory (once the track holds
        // all it is to hold: before, its room is for what is coming).
        let (old_bytes, recent_bytes) = (self.field(OLD_BYTES), self.field(RECENT_BYTES));
        if self.len() >= points && self.buf.len() > 2 * (HEADER + old_bytes + recent_bytes) + 64 {
            self.rebuild(Side::Recent, recent_bytes);
        }
    }

    /// Moves the oldest record of `recent` to `old`, its p99 made explicit.
    fn age_out(&mut self, keep: Keep, bounds: &Bounds) {
        let point = read_point(
            &mut self.reader(Side::Recent),
            Some((bounds, &mut Vec::new())),
            true,
        );
        self.pop_record(Side::Recent);
        let mut record = Vec::with_capacity(12);
        write_point(&mut record, &point, false);
        let expected = keep.points.saturating_sub(keep.bucket_points);
        self.push_record(Side::Old, &record, self.old_len() + 1, expected);
    }

    /// Points kept (cycles since the track was made, at most its keep).
    pub fn len(&self) -> usize {
        self.old_len() + self.recent_len()
    }

    /// Adds the newest `n` cycles to `sum`.
    pub fn add_window(&self, n: usize, sum: &mut Window, bounds: &Bounds) {
        let n = n.min(self.len());
        let (old, recent) = (self.old_len(), self.recent_len());
        let from_recent = n.min(recent);
        let from_old = n - from_recent;
        if from_old > 0 {
            let mut r = self.reader(Side::Old);
            for i in 0..old {
                let p = read_point(&mut r, None, false);
                if i >= old - from_old {
                    sum.requests += u64::from(p.requests);
                    sum.successes += u64::from(p.successes);
                }
            }
        }
        let mut r = self.reader(Side::Recent);
        for i in 0..recent {
            let wanted = i >= recent - from_recent;
            // Counts here, its buckets just below.
            let p = read_point(&mut r, None, false);
            if wanted {
                sum.requests += u64::from(p.requests);
                sum.successes += u64::from(p.successes);
            }
            read_buckets(&mut r, |id, count| {
                if let (true, Some(at)) = (wanted, bounds.get(id)) {
                    sum.buckets.push((at.lo, at.hi, u64::from(count)));
                }
            });
        }
    }

    /// Every point, oldest first.
    fn points(&self, bounds: &Bounds) -> Vec<Point> {
        let mut out = Vec::with_capacity(self.len());
        let mut scratch = Vec::new();
        let mut r = self.reader(Side::Old);
        for _ in 0..self.old_len() {
            out.push(read_point(&mut r, None, false));
        }
        let mut r = self.reader(Side::Recent);
        for _ in 0..self.recent_len() {
            out.push(read_point(&mut r, Some((bounds, &mut scratch)), true));
        }
        out
    }

    /// The track as a sparkline over the mesh's cycle `times` (Unix ms; a
    /// track younger than the history is zero before it began).
    pub fn spark(&self, times: &VecDeque<u64>, interval_secs: u64, bounds: &Bounds) -> Spark {
        let n = times.len();
        let mut spark = Spark {
            t: Vec::with_capacity(n),
            rps: Vec::with_capacity(n),
            success_rate: Vec::with_capacity(n),
            p99_ms: Vec::with_capacity(n),
        };
        let all = self.points(bounds);
        let pad = times.len().saturating_sub(all.len());
        let skip = all.len().saturating_sub(times.len());
        let mut points = all.iter().skip(skip);
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

    /// Bytes of its allocation (the struct itself is its holder's).
    pub fn heap_bytes(&self) -> usize {
        self.buf.len()
    }
}

/// What the queries read of a history: [`Track`], or [`Counts`].
pub(super) trait History: Default {
    /// This cycle's point, from what it added (nothing: a zero point).
    fn push(&mut self, acc: Option<&Acc>, keep: Keep, bounds: &mut Bounds);
    /// Points kept.
    fn len(&self) -> usize;
    /// Adds the newest `n` cycles to `sum`.
    fn add_window(&self, n: usize, sum: &mut Window, bounds: &Bounds);
    /// Bytes of its buffers.
    fn heap_bytes(&self) -> usize;
}

impl History for Track {
    fn push(&mut self, acc: Option<&Acc>, keep: Keep, bounds: &mut Bounds) {
        Track::push(self, acc, keep, bounds);
    }

    fn len(&self) -> usize {
        Track::len(self)
    }

    fn add_window(&self, n: usize, sum: &mut Window, bounds: &Bounds) {
        Track::add_window(self, n, sum, bounds);
    }

    fn heap_bytes(&self) -> usize {
        Track::heap_bytes(self)
    }
}

/// Requests and successes per cycle, no latency (a pod-to-pod edge's
/// history): two varints a point, 32 bytes besides.
#[derive(Clone, Debug, Default)]
pub(super) struct Counts {
    ring: Ring,
    len: u32,
}

impl History for Counts {
    fn push(&mut self, acc: Option<&Acc>, keep: Keep, _bounds: &mut Bounds) {
        let (requests, successes) = acc.map_or((0, 0), |a| (sat32(a.requests), sat32(a.successes)));
        let mut record = Vec::with_capacity(6);
        put_varint(&mut record, u64::from(requests));
        put_varint(&mut record, u64::from(requests.wrapping_sub(successes)));
        self.len += 1;
        self.ring.push(&record, self.len as usize, keep.points);
        while self.len as usize > keep.points.max(1) {
            let mut r = self.ring.reader();
            r.varint();
            r.varint();
            self.ring.pop_front(r.pos);
            self.len -= 1;
        }
        self.ring.shrink();
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    fn add_window(&self, n: usize, sum: &mut Window, _bounds: &Bounds) {
        let skip = (self.len as usize).saturating_sub(n);
        let mut r = self.ring.reader();
        for i in 0..self.len as usize {
            let requests = r.varint() as u32;
            let successes = requests.wrapping_sub(r.varint() as u32);
            if i >= skip {
                sum.requests += u64::from(requests);
                sum.successes += u64::from(successes);
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.ring.capacity()
    }
}

/// The p99 of kept buckets, as [`Track::push`] computes a cycle's (NaN:
/// none), in `scratch` (reused: a spark derives one per point of its
/// latency window).
fn derived_p99(
    kept: impl Iterator<Item = (u16, u32)>,
    bounds: &Bounds,
    scratch: &mut Vec<(f32, f32, u64)>,
) -> f32 {
    scratch.clear();
    scratch.extend(kept.filter_map(|(id, count)| {
        let b = bounds.get(id)?;
        Some((b.lo, b.hi, u64::from(count)))
    }));
    // Ids come in a histogram's order: mostly sorted by bound already.
    if !scratch.is_sorted_by(|a, b| a.1 <= b.1) {
        scratch.sort_by(|a, b| a.1.total_cmp(&b.1));
    }
    quantile(scratch, 0.99).map_or(f32::NAN, |v| v as f32)
}

fn write_point(out: &mut Vec<u8>, p: &Point, derived: bool) {
    put_varint(out, u64::from(p.requests));
    // Wrapping: exact whatever the two counts are.
    let failures = u64::from(p.requests.wrapping_sub(p.successes));
    let mode = if p.p99_ms.is_nan() {
        P99_NONE
    } else if derived {
        P99_DERIVED
    } else {
        P99_EXPLICIT
    };
    put_varint(out, failures << 2 | mode);
    if mode == P99_EXPLICIT {
        out.extend_from_slice(&p.p99_ms.to_le_bytes());
    }
}

/// What a derived p99 is read with: the bounds, and a scratch vector.
type Derive<'a> = Option<(&'a Bounds, &'a mut Vec<(f32, f32, u64)>)>;

/// Reads a point record (and, for `recent`, its buckets). A derived p99
/// needs `bounds` (and a scratch vector); without them it reads as NaN
/// (for counts only).
fn read_point(r: &mut Reader<'_>, derive: Derive<'_>, with_buckets: bool) -> Point {
    let requests = r.varint() as u32;
    let tag = r.varint();
    let successes = requests.wrapping_sub((tag >> 2) as u32);
    let mode = tag & 3;
    let mut p99_ms = match mode {
        P99_EXPLICIT => r.f32(),
        _ => f32::NAN,
    };
    if with_buckets {
        match (mode, derive) {
            (P99_DERIVED, Some((bounds, scratch))) => {
                scratch.clear();
                read_buckets(r, |id, count| {
                    if let Some(b) = bounds.get(id) {
                        scratch.push((b.lo, b.hi, u64::from(count)));
                    }
                });
                if !scratch.is_sorted_by(|a, b| a.1 <= b.1) {
                    scratch.sort_by(|a, b| a.1.total_cmp(&b.1));
                }
                p99_ms = quantile(scratch, 0.99).map_or(f32::NAN, |v| v as f32);
            }
            _ => read_buckets(r, |_, _| {}),
        }
    }
    Point {
        requests,
        successes,
        p99_ms,
    }
}

/// Writes `kept` (sorted by id, ids distinct) in the smallest of the three
/// layouts.
fn write_buckets(out: &mut Vec<u8>, kept: &[(u16, u32)]) {
    let n = kept.len() as u64;
    let (Some(first), Some(last)) = (kept.first(), kept.last()) else {
        put_varint(out, 0);
        return;
    };
    let (first, last) = (u64::from(first.0), u64::from(last.0));
    let span = last - first + 1;
    if span == n {
        put_varint(out, n << 2 | IDS_DENSE);
        put_varint(out, first);
    } else {
        let mask_bytes = varint_len(span) + span.div_ceil(8) as usize;
        let gap_bytes: usize = kept
            .windows(2)
            .map(|w| varint_len(u64::from(w[1].0 - w[0].0 - 1)))
            .sum();
        if mask_bytes <= gap_bytes {
            put_varint(out, n << 2 | IDS_MASK);
            put_varint(out, first);
            put_varint(out, span);
            let at = out.len();
            out.resize(at + span.div_ceil(8) as usize, 0);
            for (id, _) in kept {
                let bit = u64::from(*id) - first;
                out[at + (bit / 8) as usize] |= 1 << (bit % 8);
            }
        } else {
            put_varint(out, n << 2 | IDS_GAPS);
            put_varint(out, first);
            for w in kept.windows(2) {
                put_varint(out, u64::from(w[1].0 - w[0].0 - 1));
            }
        }
    }
    for (_, count) in kept {
        put_varint(out, u64::from(*count));
    }
}

/// Reads a record's buckets, calling `each(id, count)` in id order.
/// Bytes that are not a record written here read as some record, never
/// a panic nor a long loop: counts and spans are capped at what a record
/// can hold, ids wrap.
fn read_buckets(r: &mut Reader<'_>, mut each: impl FnMut(u16, u32)) {
    let head = r.varint();
    let n = (head >> 2).min(MAX_BUCKETS_PER_POINT as u64);
    if n == 0 {
        return;
    }
    let first = r.varint();
    // The ids come before the counts: a second cursor walks them.
    match head & 3 {
        IDS_DENSE => {
            for i in 0..n {
                each(first.wrapping_add(i) as u16, r.varint() as u32);
            }
        }
        IDS_MASK => {
            // Ids are u16: a span is at most 2^16.
            let span = r.varint().min(1 << 16);
            let mut bits = r.clone();
            r.pos = r.pos.saturating_add(span.div_ceil(8) as usize);
            let mut found = 0;
            for byte in 0..span.div_ceil(8) {
                let b = bits.byte();
                for bit in 0..8 {
                    if b & (1 << bit) != 0 && found < n {
                        each(first.wrapping_add(byte * 8 + bit) as u16, r.varint() as u32);
                        found += 1;
                    }
                }
            }
        }
        _ => {
            let mut gaps = r.clone();
            for _ in 1..n {
                r.varint();
            }
            let mut id = first;
            each(id as u16, r.varint() as u32);
            for _ in 1..n {
                id = id.wrapping_add(gaps.varint()).wrapping_add(1);
                each(id as u16, r.varint() as u32);
            }
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes in a ring: appended at the back, dropped at the front; the buffer
/// grows to what a push needs (rounded up to 16 bytes), and shrinks when
/// it holds less than half of it.
#[derive(Clone, Debug, Default)]
pub(super) struct Ring {
    buf: Box<[u8]>,
    head: u32,
    len: u32,
}

impl Ring {
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    pub fn reader(&self) -> Reader<'_> {
        let (a, b) = ring_slices(&self.buf, self.head as usize, self.len as usize);
        Reader { a, b, pos: 0 }
    }

    /// Appends `bytes`, the ring's record number `records` (from 1) of the
    /// `expected` it will hold. When it must grow, it grows to hold that
    /// many records the size of those so far, rounded up to the
    /// allocator's size class: a history is made in a few allocations,
    /// none of them later given back for a slightly smaller one (which
    /// would leave holes among the long-lived ones).
    pub fn push(&mut self, bytes: &[u8], records: usize, expected: usize) {
        let need = self.len() + bytes.len();
        if need > self.capacity() {
            let estimate = need.div_ceil(records.max(1)) * expected;
            self.resize(size_class(need.max(estimate)));
        }
        let cap = self.capacity();
        if cap == 0 {
            return;
        }
        let mut at = (self.head as usize + self.len()) % cap;
        for b in bytes {
            self.buf[at] = *b;
            at += 1;
            if at == cap {
                at = 0;
            }
        }
        self.len = need as u32;
    }

    pub fn pop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == self.len() {
            (self.head, self.len) = (0, 0);
            return;
        }
        self.head = ((self.head as usize + n) % self.capacity()) as u32;
        self.len -= n as u32;
    }

    /// Gives back what a burst long gone left.
    pub fn shrink(&mut self) {
        if self.capacity() > 2 * self.len() + 64 {
            self.resize(size_class(self.len()));
        }
    }

    /// Makes the buffer `cap` bytes, the ring at its start: in place when
    /// the allocator can (a reallocation within its size class).
    fn resize(&mut self, cap: usize) {
        let mut buf = std::mem::take(&mut self.buf).into_vec();
        buf.rotate_left(self.head as usize);
        buf.truncate(self.len());
        buf.resize(cap.max(self.len()), 0);
        self.buf = buf.into_boxed_slice();
        self.head = 0;
    }
}

/// The `len` bytes of a ring in `region` from `head`, in order.
fn ring_slices(region: &[u8], head: usize, len: usize) -> (&[u8], &[u8]) {
    let cap = region.len();
    if len == 0 || head >= cap {
        (&[], &[])
    } else if head + len <= cap {
        (&region[head..head + len], &[])
    } else {
        (&region[head..], &region[..(head + len - cap).min(head)])
    }
}

/// `n` rounded up to jemalloc's size class (16-byte steps to 128, then four
/// classes per doubling): what an allocation of `n` bytes takes anyway.
pub(super) fn size_class(n: usize) -> usize {
    if n <= 128 {
        return n.next_multiple_of(16);
    }
    let step = n.next_power_of_two() / 8;
    n.next_multiple_of(step)
}

/// Reads a ring's bytes from its front (zeros past its end: a record is
/// never cut, but reading stays total).
#[derive(Clone)]
pub(super) struct Reader<'a> {
    a: &'a [u8],
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let at = self.pos;
        self.pos = self.pos.saturating_add(1);
        match self.a.get(at) {
            Some(b) => *b,
            None => self.b.get(at - self.a.len()).copied().unwrap_or(0),
        }
    }

    fn varint(&mut self) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte();
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }

    fn f32(&mut self) -> f32 {
        f32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
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
        let s = t.spark(&times, 10, &bounds);
        assert_eq!(s.t.len(), 8);
        assert_eq!(s.rps[..3], [0.0, 0.0, 0.0]);
        assert_eq!(s.rps[7], 0.9);
        assert_eq!(s.success_rate[7], Some(1.0));
    }

    #[test]
    fn a_ring_wraps_grows_to_what_it_holds_and_gives_back_a_burst() {
        let mut ring = Ring::default();
        assert_eq!(ring.capacity(), 0);
        let mut expect: VecDeque<u8> = VecDeque::new();
        let mut next = 0u8;
        for step in 0..200 {
            // Records of 3 to 9 bytes, the oldest dropped past 40 bytes.
            let n = 3 + step % 7;
            let record: Vec<u8> = (0..n)
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            ring.push(&record, 1, 1);
            expect.extend(&record);
            while ring.len() > 40 {
                ring.pop_front(5);
                expect.drain(..5);
            }
            let mut r = ring.reader();
            let got: Vec<u8> = (0..ring.len()).map(|_| r.byte()).collect();
            assert_eq!(got, Vec::from(expect.clone()), "step {step}");
            // Never more than a push past what it holds.
            assert!(ring.capacity() <= 48 + 16, "{}", ring.capacity());
        }
        // A burst grows it; once gone, the ring shrinks back.
        ring.push(&[7; 1000], 1, 1);
        assert!(ring.capacity() >= 1000);
        ring.pop_front(1000);
        ring.shrink();
        assert!(
            ring.capacity() <= 2 * ring.len() + 64,
            "{}",
            ring.capacity()
        );
        let mut r = ring.reader();
        let got: Vec<u8> = (0..ring.len()).map(|_| r.byte()).collect();
        expect.extend([7; 1000]);
        expect.drain(..1000);
        assert_eq!(got, Vec::from(expect));
    }

    #[test]
    fn a_track_is_one_allocation_about_the_size_of_its_records() {
        let keep = Keep {
            points: 90,
            bucket_points: 30,
        };
        let mut bounds = Bounds::default();
        let mut t = Track::new(keep);
        assert_eq!(t.heap_bytes(), 0);
        let mut moves = 0;
        for cycle in 0..200u64 {
            let mut acc = Acc::default();
            acc.responses(100 + cycle % 7, true);
            acc.responses(cycle % 3, false);
            for (i, hi) in [1.0, 2.0, 5.0, 10.0, 20.0, 50.0].into_iter().enumerate() {
                acc.bucket(0.0, hi, 5 + (cycle + i as u64) % 11);
            }
            let before = t.buf.as_ptr();
            t.push(Some(&acc), keep, &mut bounds);
            moves += usize::from(t.buf.as_ptr() != before);
        }
        assert_eq!(t.len(), 90);
        let used = HEADER + t.field(OLD_BYTES) + t.field(RECENT_BYTES);
        assert!(
            t.heap_bytes() <= size_class(used + used / 4),
            "{} bytes for {used}",
            t.heap_bytes()
        );
        // Grown in a few steps, then never moved again.
        assert!(moves <= 3, "{moves} moves");
    }

    #[test]
    fn sizes_round_up_to_the_allocators_classes() {
        let classes: Vec<usize> = [1, 16, 17, 128, 129, 160, 161, 300, 513, 1000, 1025, 5000]
            .iter()
            .map(|n| size_class(*n))
            .collect();
        assert_eq!(
            classes,
            [16, 16, 32, 128, 160, 160, 192, 320, 640, 1024, 1280, 5120]
        );
    }

    #[test]
    fn a_ring_grows_for_the_records_it_expects_in_a_few_steps() {
        let mut ring = Ring::default();
        let mut grew = 0;
        for n in 1..=90 {
            let before = ring.capacity();
            ring.push(&[n as u8; 10], n, 90);
            grew += usize::from(ring.capacity() != before);
        }
        assert_eq!(grew, 1);
        assert_eq!(ring.len(), 900);
        assert_eq!(ring.capacity(), size_class(900));
        // Records larger than the first: a step more, still for 90.
        let mut ring = Ring::default();
        let mut grew = 0;
        for n in 1..=90 {
            let before = ring.capacity();
            ring.push(&vec![0; 4 + n / 10], n, 90);
            grew += usize::from(ring.capacity() != before);
        }
        assert!(grew <= 6, "{grew} steps");
    }

    /// Xorshift: the same bytes on every run.
    fn noise(seed: &mut u64) -> u8 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed >> 24) as u8
    }

    /// Bytes that were never written as a record read as some record:
    /// no panic (overflow included), no loop past a record's bounds.
    #[test]
    fn any_bytes_read_as_some_record_without_a_panic() {
        let mut bounds = Bounds::default();
        for hi in 1..30 {
            bounds.id(0.0, hi as f32);
        }
        let varint = |v: u64| {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            out
        };
        let mut inputs: Vec<Vec<u8>> = vec![
            Vec::new(),
            // Varints that never end.
            vec![0xFF; 64],
            // Huge counts, ids, spans and gaps in each layout.
            [varint(!3 | IDS_DENSE), varint(u64::MAX)].concat(),
            [
                varint(1000 << 2 | IDS_MASK),
                varint(u64::MAX),
                varint(u64::MAX),
                vec![0xFF; 40],
            ]
            .concat(),
            [
                varint(300 << 2 | IDS_GAPS),
                varint(u64::MAX - 1),
                varint(u64::MAX),
                varint(u64::MAX),
            ]
            .concat(),
            // A point whose buckets are all of that.
            [varint(u64::MAX), varint(u64::MAX), vec![0xFF; 30]].concat(),
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15;
        for len in [1, 2, 5, 17, 100, 1000] {
            for _ in 0..200 {
                inputs.push((0..len).map(|_| noise(&mut seed)).collect());
            }
        }
        for bytes in &inputs {
            for split in [0, bytes.len() / 2, bytes.len()] {
                let (a, b) = bytes.split_at(split);
                for with_buckets in [false, true] {
                    let mut r = Reader { a, b, pos: 0 };
                    read_point(&mut r, Some((&bounds, &mut Vec::new())), with_buckets);
                }
                let mut r = Reader { a, b, pos: 0 };
                let mut n = 0;
                read_buckets(&mut r, |_, _| n += 1);
                assert!(n <= MAX_BUCKETS_PER_POINT, "{n} buckets");
            }
        }
    }

    #[test]
    fn counts_read_back_at_their_bounds() {
        let keep = Keep {
            points: 3,
            bucket_points: 0,
        };
        let mut c = Counts::default();
        let mut bounds = Bounds::default();
        for (requests, successes) in [(0, 0), (u32::MAX as u64, 0), (u64::MAX, u64::MAX), (5, 7)] {
            let acc = Acc {
                requests,
                successes,
                buckets: Vec::new(),
            };
            c.push(Some(&acc), keep, &mut bounds);
        }
        assert_eq!(c.len(), 3);
        let mut w = Window::default();
        c.add_window(3, &mut w, &bounds);
        // Saturated at u32, and more successes than requests as written.
        let max = u64::from(u32::MAX);
        assert_eq!((w.requests, w.successes), (max + max + 5, max + 7));
    }

    #[test]
    fn buckets_are_written_in_the_smallest_layout_and_read_back() {
        let cases: [(&[u16], u64); 5] = [
            // Consecutive ids: first id and counts only.
            (&[3, 4, 5, 6, 7, 8], IDS_DENSE),
            // A few holes: a bitmap.
            (&[10, 11, 13, 14, 15, 17, 18, 20], IDS_MASK),
            // Far apart: each id's distance.
            (&[1, 900, 40_000, 65_534], IDS_GAPS),
            (&[0], IDS_DENSE),
            (&[], IDS_DENSE),
        ];
        for (ids, layout) in cases {
            let kept: Vec<(u16, u32)> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, [1, 127, 128, 70_000, u32::MAX][i % 5]))
                .collect();
            let mut out = Vec::new();
            write_buckets(&mut out, &kept);
            let mut ring = Ring::default();
            ring.push(&out, 1, 1);
            ring.push(&[0xAA], 2, 2);
            let mut r = ring.reader();
            let mut back = Vec::new();
            read_buckets(&mut r, |id, count| back.push((id, count)));
            assert_eq!(back, kept, "{ids:?}");
            assert_eq!(r.pos, out.len(), "the record's length");
            assert_eq!(r.byte(), 0xAA);
            if !ids.is_empty() {
                assert_eq!(out[0] as u64 & 3, layout, "{ids:?}");
            }
        }
    }

    /// A track as plain vectors: what [`Track`] must answer.
    #[derive(Default)]
    struct Reference {
        points: VecDeque<Point>,
        buckets: VecDeque<Vec<(f32, f32, u64)>>,
    }

    impl Reference {
        fn push(&mut self, acc: &Acc, keep: Keep, bounds: &mut Bounds) {
            let mut buckets = acc.buckets.clone();
            buckets.sort_by(|a, b| a.1.total_cmp(&b.1));
            buckets.truncate(MAX_BUCKETS_PER_POINT);
            let p99 = quantile(&buckets, 0.99).map_or(f32::NAN, |v| v as f32);
            self.points.push_back(Point {
                requests: sat32(acc.requests),
                successes: sat32(acc.successes),
                p99_ms: p99,
            });
            let kept = buckets
                .iter()
                .filter(|(lo, hi, _)| bounds.id(*lo, *hi).is_some())
                .map(|(lo, hi, n)| (*lo, *hi, u64::from(sat32(*n))))
                .collect();
            self.buckets.push_back(kept);
            while self.points.len() > keep.points {
                self.points.pop_front();
            }
            while self.buckets.len() > keep.bucket_points {
                self.buckets.pop_front();
            }
        }

        fn window(&self, n: usize) -> (u64, u64, Vec<(f32, f32, u64)>) {
            let p = self.points.iter().rev().take(n);
            let (mut r, mut s) = (0, 0);
            for p in p {
                r += u64::from(p.requests);
                s += u64::from(p.successes);
            }
            let skip = self.buckets.len().saturating_sub(n);
            let b = self.buckets.iter().skip(skip).flatten().copied().collect();
            (r, s, b)
        }
    }

    #[test]
    fn a_track_answers_what_its_points_and_buckets_were() {
        let mut bounds = Bounds::default();
        // Fill the bounds table but for two: buckets past it are not kept,
        // and the p99 of such a cycle is then written out.
        for i in 0..(MAX_BOUNDS - 2) {
            bounds.id(-(i as f32) - 10.0, -(i as f32) - 9.0);
        }
        for keep in [
            Keep {
                points: 9,
                bucket_points: 4,
            },
            Keep {
                points: 5,
                bucket_points: 5,
            },
            Keep {
                points: 6,
                bucket_points: 0,
            },
        ] {
            let mut track = Track::new(keep);
            let mut reference = Reference::default();
            for cycle in 0..40u64 {
                let mut acc = Acc::default();
                match cycle % 5 {
                    // Nothing.
                    0 => {}
                    // Counts past u32 (saturated, and the p99 written out).
                    1 => {
                        acc.responses(6_000_000_000, true);
                        acc.bucket(0.0, 1.0, 6_000_000_000);
                        acc.bucket(1.0, 2.0, 1_000_000_000);
                    }
                    // More successes than requests reads back as written.
                    2 => {
                        acc.requests = 3;
                        acc.successes = 5;
                    }
                    // A bound the full table has no room for.
                    3 if cycle > 20 => {
                        acc.responses(10, false);
                        acc.bucket(0.0, 1.0, 5);
                        acc.bucket(7.5 + cycle as f32, 9.0 + cycle as f32, 5);
                    }
                    _ => {
                        acc.responses(100 + cycle, true);
                        acc.responses(cycle % 3, false);
                        for (i, hi) in [1.0, 2.0, 5.0, 10.0, 50.0, f32::INFINITY]
                            .into_iter()
                            .enumerate()
                        {
                            if !(i as u64 + cycle).is_multiple_of(4) {
                                acc.bucket(if i == 0 { 0.0 } else { 0.5 }, hi, cycle * i as u64);
                            }
                        }
                    }
                }
                track.push(Some(&acc), keep, &mut bounds);
                reference.push(&acc, keep, &mut bounds);
                assert_eq!(track.len(), reference.points.len());
                let times: VecDeque<u64> = (0..=cycle).map(|c| 1_000 + c * 10_000).collect();
                let spark = track.spark(&times, 10, &bounds);
                let want: Vec<Option<u32>> = reference
                    .points
                    .iter()
                    .map(|p| (!p.p99_ms.is_nan()).then_some(p.p99_ms.to_bits()))
                    .collect();
                let got: Vec<Option<u32>> = spark
                    .p99_ms
                    .iter()
                    .skip(spark.p99_ms.len() - want.len())
                    .map(|p| p.map(|p| (p as f32).to_bits()))
                    .collect();
                assert_eq!(got, want, "cycle {cycle}, {keep:?}");
                for n in 1..=keep.points + 1 {
                    let mut w = Window::default();
                    track.add_window(n, &mut w, &bounds);
                    let (r, s, b) = reference.window(n);
                    assert_eq!((w.requests, w.successes), (r, s), "cycle {cycle}, n {n}");
                    let mut got = w.buckets.clone();
                    let mut want = b;
                    got.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)));
                    want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)));
                    assert_eq!(got, want, "cycle {cycle}, n {n}");
                }
            }
        }
    }
}
