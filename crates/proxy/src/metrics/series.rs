//! Metric families whose series live as a Prometheus server expects.
//!
//! A scraper that comes every 10-30 s must see a counter go up, never back
//! down, for as long as the process lives; a series that vanishes between
//! scrapes loses the counts made since the last one. So a series is not
//! tied to the life of whatever made it (a balancer, a connection): its
//! handle is shared, and a series nobody holds stays exported for the
//! retention before it may go. The number of series is bounded all the
//! same (seed 004): at the bound the longest-idle unheld series makes room,
//! and when none can, the new series counts but is not exported. Every
//! series removed is counted, by reason.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{counter::Counter, MetricType, TypedMetric},
};
use std::{
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;

/// How long series live and how many there may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesLimits {
    /// How long a series nobody holds stays exported.
    pub retention: Duration,
    /// Most series exported per family.
    pub max_series: usize,
}

/// Series removed from the exposition, by reason: shared by every family.
#[derive(Clone, Debug, Default)]
pub struct SeriesDrops {
    /// Unheld for longer than the retention.
    pub retention: Counter,
    /// Evicted, or never exported, because a family was at its bound.
    pub limit: Counter,
}

#[derive(Debug)]
struct Entry<M> {
    metric: Arc<M>,
    /// When a sweep first found nobody holding the series; `None` while it
    /// is held or has not been swept since it was last handed out. Counting
    /// from a sweep, never from a guess, means a series is never dropped
    /// before it was unheld for the whole retention.
    idle_since: Option<Instant>,
}

impl<M> Entry<M> {
    fn held(&self) -> bool {
        // The map's own reference is the one that does not count.
        Arc::strong_count(&self.metric) > 1
    }
}

struct Shared<L, M> {
    series: Mutex<HashMap<L, Entry<M>>>,
    limits: SeriesLimits,
    drops: SeriesDrops,
    new_metric: fn() -> M,
}

/// A family of series, one per label set, each handed out as an `Arc`
/// handle that stays the exported series while anyone holds it. Cheap to
/// clone; clones share the series.
pub struct RetainedFamily<L, M> {
    shared: Arc<Shared<L, M>>,
}

impl<L, M> Clone for RetainedFamily<L, M> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L, M> fmt::Debug for RetainedFamily<L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetainedFamily")
            .field("limits", &self.shared.limits)
            .field("series", &self.len())
            .finish()
    }
}

impl<L, M> RetainedFamily<L, M> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<L, Entry<M>>> {
        self.shared.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Series exported now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<L: Clone + Hash + Eq, M> RetainedFamily<L, M> {
    pub fn new(limits: SeriesLimits, drops: SeriesDrops, new_metric: fn() -> M) -> Self {
        Self {
            shared: Arc::new(Shared {
                series: Mutex::new(HashMap::new()),
                limits,
                drops,
                new_metric,
            }),
        }
    }

    /// The series of `labels`, made if there is none. While the handle (or
    /// a clone) is held, it is the series exported for `labels`. At the
    /// bound, with no unheld series to make room, the handle counts into a
    /// series that is not exported (counted as a `limit` drop).
    pub fn get(&self, labels: &L) -> Arc<M> {
        let mut series = self.lock();
        if let Some(e) = series.get_mut(labels) {
            e.idle_since = None;
            return e.metric.clone();
        }
        let metric = Arc::new((self.shared.new_metric)());
        if series.len() >= self.shared.limits.max_series {
            // Longest idle first; an unheld series not swept yet is the
            // least idle of the unheld.
            let victim = series
                .iter()
                .filter(|(_, e)| !e.held())
                .min_by_key(|(_, e)| (e.idle_since.is_none(), e.idle_since))
                .map(|(l, _)| l.clone());
            self.shared.drops.limit.inc();
            match victim {
                Some(l) => {
                    series.remove(&l);
                }
                None => return metric,
            }
        }
        series.insert(
            labels.clone(),
            Entry {
                metric: metric.clone(),
                idle_since: None,
            },
        );
        metric
    }

    /// Removes the series nobody has held for the retention. Call it
    /// periodically; a series is dropped at most one period after its
    /// retention ends.
    pub fn sweep(&self, now: Instant) {
        let retention = self.shared.limits.retention;
        let mut dropped = 0;
        self.lock().retain(|_, e| {
            if e.held() {
                e.idle_since = None;
                return true;
            }
            match e.idle_since {
                None => {
                    e.idle_since = Some(now);
                    true
                }
                Some(since) if now.saturating_duration_since(since) >= retention => {
                    dropped += 1;
                    false
                }
                Some(_) => true,
            }
        });
        self.shared.drops.retention.inc_by(dropped);
    }
}

impl<L, M: TypedMetric> TypedMetric for RetainedFamily<L, M> {
    const TYPE: MetricType = M::TYPE;
}

impl<L, M> EncodeMetric for RetainedFamily<L, M>
where
    L: EncodeLabelSet,
    M: EncodeMetric + TypedMetric,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (labels, e) in self.lock().iter() {
            e.metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        RetainedFamily::is_empty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::{encoding::text::encode, registry::Registry};

    const RETENTION: Duration = Duration::from_secs(600);

    fn family(max_series: usize) -> (RetainedFamily<Vec<(String, String)>, Counter>, SeriesDrops) {
        let drops = SeriesDrops::default();
        let f = RetainedFamily::new(
            SeriesLimits {
                retention: RETENTION,
                max_series,
            },
            drops.clone(),
            Counter::default,
        );
        (f, drops)
    }

    fn labels(target: &str) -> Vec<(String, String)> {
        vec![("target".to_string(), target.to_string())]
    }

    fn exported(f: &RetainedFamily<Vec<(String, String)>, Counter>) -> String {
        let mut registry = Registry::default();
        registry.register("requests", "", f.clone());
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        text
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_outlives_its_holder_for_the_retention_and_goes_after_it() {
        let (f, drops) = family(10);
        let held = f.get(&labels("web"));
        held.inc();
        // Held for longer than the retention: never dropped.
        for _ in 0..3 {
            tokio::time::advance(RETENTION).await;
            f.sweep(Instant::now());
        }
        assert_eq!(f.len(), 1);
        drop(held);
        f.sweep(Instant::now());
        tokio::time::advance(RETENTION - Duration::from_secs(1)).await;
        f.sweep(Instant::now());
        assert!(exported(&f).contains("requests_total{target=\"web\"} 1"));
        tokio::time::advance(Duration::from_secs(1)).await;
        f.sweep(Instant::now());
        assert_eq!(f.len(), 0, "{}", exported(&f));
        assert_eq!(drops.retention.get(), 1);
        assert_eq!(drops.limit.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reacquired_series_continues_its_count() {
        let (f, _) = family(10);
        f.get(&labels("web")).inc_by(5);
        f.sweep(Instant::now());
        tokio::time::advance(RETENTION / 2).await;
        f.sweep(Instant::now());
        // Handed out again before the retention ended: the same series, and
        // its idle time starts over.
        let again = f.get(&labels("web"));
        again.inc();
        assert_eq!(again.get(), 6);
        drop(again);
        f.sweep(Instant::now());
        tokio::time::advance(RETENTION / 2 + Duration::from_secs(1)).await;
        f.sweep(Instant::now());
        assert!(exported(&f).contains("requests_total{target=\"web\"} 6"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_handle_still_held_is_the_exported_series_whatever_its_age() {
        let (f, _) = family(10);
        let a = f.get(&labels("web"));
        let b = f.get(&labels("web"));
        assert!(Arc::ptr_eq(&a, &b));
        drop(b);
        tokio::time::advance(RETENTION * 10).await;
        f.sweep(Instant::now());
        a.inc();
        assert!(exported(&f).contains("requests_total{target=\"web\"} 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_bound_the_longest_idle_unheld_series_makes_room() {
        let (f, drops) = family(3);
        f.get(&labels("old")).inc();
        f.sweep(Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        f.get(&labels("newer")).inc();
        f.sweep(Instant::now());
        let _held = f.get(&labels("held"));
        tokio::time::advance(Duration::from_secs(1)).await;

        let fresh = f.get(&labels("fresh"));
        fresh.inc();
        assert_eq!(f.len(), 3);
        let text = exported(&f);
        assert!(!text.contains("\"old\""), "{text}");
        assert!(
            text.contains("\"newer\"") && text.contains("\"fresh\""),
            "{text}"
        );
        assert_eq!(drops.limit.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_series_is_held_a_new_one_counts_but_is_not_exported() {
        let (f, drops) = family(2);
        let _a = f.get(&labels("a"));
        let _b = f.get(&labels("b"));
        let c = f.get(&labels("c"));
        c.inc();
        assert_eq!(c.get(), 1, "the handle still counts");
        assert_eq!(f.len(), 2, "the bound holds");
        assert!(!exported(&f).contains("\"c\""));
        assert_eq!(drops.limit.get(), 1);
        // Once a series is unheld, the next new one takes its place.
        drop(_a);
        let d = f.get(&labels("d"));
        assert_eq!(f.len(), 2);
        assert!(exported(&f).contains("\"d\""));
        assert_eq!(drops.limit.get(), 2);
        drop(d);
    }
}
