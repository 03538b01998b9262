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
    store::{self, Store},
};
use ballast_admin::{MemoryBudget, Pressure};
use std::{sync::Arc, time::Duration};
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

/// Every open subscription of both stores, weighed.
pub fn candidates(store: &Store, policy: &PolicyStore) -> Vec<Candidate> {
    let weigh = |base: usize, bytes: usize, streams: usize| base + bytes / streams.max(1);
    let mut all: Vec<Candidate> = store
        .held()
        .into_iter()
        .filter(|h| h.streams > 0)
        .map(
            |store::Held {
                 method,
                 target,
                 bytes,
                 streams,
             }| Candidate {
                per_stream: weigh(DESTINATION_STREAM_BYTES, bytes, streams),
                streams,
                which: Which::Destination(method, target),
            },
        )
        .collect();
    all.extend(policy.held().into_iter().filter(|h| h.streams > 0).map(
        |policy::Held {
             api,
             key,
             bytes,
             streams,
         }| Candidate {
            per_stream: weigh(POLICY_STREAM_BYTES, bytes, streams),
            streams,
            which: Which::Policy(api, key),
        },
    ));
    all
}

/// The subscriptions to close this round: the costliest per stream first,
/// until at least `SHED_PERCENT` of all open streams (one at least) are in.
pub fn choose(mut all: Vec<Candidate>) -> Vec<Candidate> {
    let open: usize = all.iter().map(|c| c.streams).sum();
    let want = (open * SHED_PERCENT / 100).max(1);
    // Ties go to the subscription with fewer streams: as much memory per
    // stream, fewer clients disturbed.
    all.sort_by(|a, b| {
        b.per_stream
            .cmp(&a.per_stream)
            .then(a.streams.cmp(&b.streams))
    });
    let mut chosen = Vec::new();
    let mut closing = 0;
    for c in all {
        if closing >= want {
            break;
        }
        closing += c.streams;
        chosen.push(c);
    }
    chosen
}

/// One round: closes the chosen subscriptions' streams, counting them by
/// API. Returns how many streams were closed.
pub fn round(store: &Store, policy: &PolicyStore, budget: &MemoryBudget) -> usize {
    let mut closed = 0;
    for c in choose(candidates(store, policy)) {
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

    #[test]
    fn the_costliest_per_stream_go_first_until_a_share_of_all_streams() {
        // 100 streams in all: 5% is 5 streams.
        let all = vec![
            candidate("a", 4_000, 60),
            candidate("bb", 40_000, 3),
            candidate("ccc", 12_000, 30),
            candidate("dddd", 12_000, 2),
            candidate("eeeee", 3_500, 5),
        ];
        let chosen: Vec<(usize, usize)> = choose(all)
            .iter()
            .map(|c| (c.per_stream, c.streams))
            .collect();
        // 40 KB x 3, then the 12 KB tie goes to the smaller one: 5 streams.
        assert_eq!(chosen, [(40_000, 3), (12_000, 2)]);
        assert!(choose(Vec::new()).is_empty());
        // One stream at least, however few are open.
        assert_eq!(choose(vec![candidate("a", 1, 1)]).len(), 1);
    }
}
