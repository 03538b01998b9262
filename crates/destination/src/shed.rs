//! The memory budget's closing step: while resident memory is past
//! `ballast_admin::budget::CLOSE_PERCENT` of `--memory-limit`, the streams
//! that cost most are closed first, every [`ROUND`], a [`SHED_PERCENT`]
//! share of the open streams at a time, until the pressure falls. Each
//! closed stream ends with `RESOURCE_EXHAUSTED` and a retry hint.
//!
//! What a stream costs: what every stream of its API holds on its own
//! ([`DESTINATION_STREAM_BYTES`], [`POLICY_STREAM_BYTES`]) plus its share of
//! what its subscription holds (encoded answers and changes, divided by the
//! subscription's streams). A subscription is closed whole: its streams are
//! equally costly, and closing them all frees it.

use crate::{
    policy::{self, PolicyStore},
    store::Store,
};
use ballast_admin::{MemoryBudget, Pressure};
use std::{cmp::Reverse, collections::BinaryHeap, sync::Arc, time::Duration};
use tokio::sync::watch;

/// What one Destination stream holds on its own (hyper's and h2's stream
/// state, the body and its cursor), as measured: bench/RESULTS.md, 3.2 KB
/// allocated per open stream.
pub const DESTINATION_STREAM_BYTES: usize = 3 * 1024;
/// What one policy Watch stream holds on its own (the HTTP/2 stream, its
/// body and its watch of the shared frame), as measured: bench/RESULTS.md,
/// 3.8-4.1 KB allocated per open stream.
pub const POLICY_STREAM_BYTES: usize = 4 * 1024;
/// The share of open streams closed in one round (at least one stream).
pub const SHED_PERCENT: usize = 5;
/// Time between rounds, for freed memory to show in the next reading.
pub const ROUND: Duration = Duration::from_millis(200);

/// One subscription the closing step may close.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub which: Which,
    /// Bytes each of its streams costs.
    pub per_stream: usize,
    pub streams: usize,
}

/// Which subscription, in which store.
#[derive(Clone, Debug)]
pub enum Which {
    /// `Get` or `GetProfile`, by method.
    Destination(&'static str, crate::index::Target),
    Policy(&'static str, policy::Key),
}

impl Which {
    /// The API, as metrics label it.
    pub fn api(&self) -> &'static str {
        match self {
            Which::Destination(method, _) | Which::Policy(method, _) => method,
        }
    }
}

/// What a stream of a subscription costs: its API's own share plus its
/// part of what the subscription holds.
fn weigh(base: usize, bytes: usize, streams: usize) -> usize {
    base + bytes / streams.max(1)
}

/// The subscriptions to close this round, costliest per stream first: as
/// they are offered one by one, it holds only those that would be chosen
/// so far, at most about `SHED_PERCENT` of the subscriptions, and builds a
/// subscription's key only when taking it. Memory is scarce when it runs.
pub struct Choice {
    want: usize,
    /// Streams of the subscriptions held.
    covered: usize,
    /// The least costly on top: the first to give up.
    held: BinaryHeap<Ranked>,
}

/// A candidate ordered so that the greater is the less worth closing:
/// cheaper per stream, then (a tie) more streams to disturb.
struct Ranked(Candidate);

impl Ranked {
    fn rank(&self) -> (Reverse<usize>, usize) {
        rank(self.0.per_stream, self.0.streams)
    }
}

fn rank(per_stream: usize, streams: usize) -> (Reverse<usize>, usize) {
    (Reverse(per_stream), streams)
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl Choice {
    /// A choice among subscriptions holding `open` streams in all: at least
    /// `SHED_PERCENT` of them (one at least).
    pub fn new(open: usize) -> Self {
        Self {
            want: (open.saturating_mul(SHED_PERCENT) / 100).max(1),
            covered: 0,
            held: BinaryHeap::new(),
        }
    }

    /// Offers a subscription of `streams` streams costing `per_stream`
    /// each; `which` names it, called only if it is taken.
    pub fn offer(&mut self, per_stream: usize, streams: usize, which: impl FnOnce() -> Which) {
        if streams == 0 {
            return;
        }
        if self.covered >= self.want
            && self
                .held
                .peek()
                .is_some_and(|least| rank(per_stream, streams) >= least.rank())
        {
            return;
        }
        self.covered += streams;
        self.held.push(Ranked(Candidate {
            which: which(),
            per_stream,
            streams,
        }));
        // Give up the least costly while the rest still cover the share.
        while let Some(least) = self.held.peek() {
            if self.covered - least.0.streams < self.want {
                break;
            }
            self.covered -= least.0.streams;
            self.held.pop();
        }
    }

    /// The chosen subscriptions, costliest per stream first.
    pub fn chosen(self) -> Vec<Candidate> {
        self.held
            .into_sorted_vec()
            .into_iter()
            .map(|Ranked(c)| c)
            .collect()
    }
}

/// Chooses among the open subscriptions of both stores.
pub fn choose(store: &Store, policy: &PolicyStore) -> Vec<Candidate> {
    let mut choice = Choice::new(store.open_streams() + policy.open_streams());
    store.for_each_held(|h| {
        choice.offer(
            weigh(DESTINATION_STREAM_BYTES, h.bytes, h.streams),
            h.streams,
            || Which::Destination(h.method, h.target.clone()),
        );
    });
    policy.for_each_held(|h| {
        choice.offer(
            weigh(POLICY_STREAM_BYTES, h.bytes, h.streams),
            h.streams,
            || Which::Policy(h.api, h.key.to_key()),
        );
    });
    choice.chosen()
}

/// One round: closes the chosen subscriptions' streams, counting them by
/// API. Returns how many streams were closed.
pub fn round(store: &Store, policy: &PolicyStore, budget: &MemoryBudget) -> usize {
    let mut closed = 0;
    for c in choose(store, policy) {
        let n = match &c.which {
            Which::Destination(method, target) => store.shed(method, target),
            Which::Policy(_, key) => policy.shed(key),
        };
        budget.closed(c.which.api(), n as u64);
        closed += n;
    }
    closed
}

/// Runs the closing step for as long as `stop` is false: idle until the
/// budget reports [`Pressure::Closing`], then a round every [`ROUND`]
/// while it does.
pub async fn run(
    budget: MemoryBudget,
    store: Arc<Store>,
    policy: Arc<PolicyStore>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pressure = budget.watch();
    loop {
        tokio::select! {
            changed = pressure.wait_for(|p| *p == Pressure::Closing) => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
        while budget.pressure() == Pressure::Closing && !*stop.borrow() {
            let closed = round(&store, &policy, &budget);
            tracing::warn!(
                closed,
                "memory at its limit: closed the costliest streams (RESOURCE_EXHAUSTED with a retry hint)"
            );
            tokio::time::sleep(ROUND).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Target;

    fn candidate(name: &str, per_stream: usize, streams: usize) -> Candidate {
        Candidate {
            which: Which::Destination(
                "Get",
                Target::Addr(format!("10.0.0.{}:80", name.len()).parse().expect("addr")),
            ),
            per_stream,
            streams,
        }
    }

    /// The choice made the plain way: all sorted, the costliest first,
    /// until the share is covered.
    fn sorted_choice(mut all: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
        all.retain(|&(_, streams)| streams > 0);
        let open: usize = all.iter().map(|c| c.1).sum();
        let want = (open * SHED_PERCENT / 100).max(1);
        all.sort_by_key(|&(per_stream, streams)| rank(per_stream, streams));
        let mut covered = 0;
        all.into_iter()
            .take_while(|c| {
                let take = covered < want;
                covered += c.1;
                take
            })
            .collect()
    }

    fn choose_offered(all: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let mut choice = Choice::new(all.iter().map(|c| c.1).sum());
        for (i, &(per_stream, streams)) in all.iter().enumerate() {
            choice.offer(per_stream, streams, || {
                candidate(&"x".repeat(i % 200 + 1), 0, 0).which
            });
        }
        choice
            .chosen()
            .iter()
            .map(|c| (c.per_stream, c.streams))
            .collect()
    }

    #[test]
    fn the_costliest_per_stream_go_first_until_a_share_of_all_streams() {
        // 100 streams in all: 5% is 5 streams.
        let all = [
            (4_000, 60),
            (40_000, 3),
            (12_000, 30),
            (12_000, 2),
            (3_500, 5),
        ];
        // 40 KB x 3, then the 12 KB tie goes to the smaller one: 5 streams.
        assert_eq!(choose_offered(&all), [(40_000, 3), (12_000, 2)]);
        assert!(choose_offered(&[]).is_empty());
        // One stream at least, however few are open.
        assert_eq!(choose_offered(&[(1, 1)]).len(), 1);
        assert!(choose_offered(&[(9, 0)]).is_empty());
    }

    #[test]
    fn offered_one_by_one_it_chooses_as_sorting_all_would_and_holds_few() {
        // A small generator of its own: the same cases on every run.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            usize::try_from(seed % below).expect("small")
        };
        for case in 0..300 {
            let n = next(400);
            let all: Vec<(usize, usize)> =
                (0..n).map(|_| (3_000 + next(8) * 1_000, next(6))).collect();
            let want = sorted_choice(all.clone());
            let got = choose_offered(&all);
            // Ties (same cost, same streams) may be any of them: compare
            // what is closed, not which.
            assert_eq!(got, want, "case {case}: {all:?}");
        }
        // Held while offering: the covering prefix, not every subscription.
        let mut choice = Choice::new(10_000);
        for i in 0..10_000 {
            choice.offer(3_000 + i % 7, 1, || candidate("a", 0, 0).which);
            assert!(choice.held.len() <= 10_000 * SHED_PERCENT / 100, "{i}");
        }
        assert_eq!(choice.chosen().len(), 500);
    }
}
