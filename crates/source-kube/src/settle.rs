//! Holds a kind's applied objects back for a short time before they reach
//! the store, in arrival order.
//!
//! Each kind has its own watch, and the API server does not order events
//! across watches: an AuthorizationPolicy created before its Server can be
//! read after it. A Server applied without its authorizations denies every
//! client of its port until they arrive, so Servers wait `hold` (default
//! [`DEFAULT_SERVER_SETTLE`]) and authorizations that were already on their
//! way are applied first. The policy a new Server brings takes effect that
//! much later; ports without a Server keep the default policy meanwhile.
//!
//! Deletes are not held, but never overtake an op held before them. A relist
//! (`Reset`) replaces the kind's whole state: held ops are dropped. At most
//! [`MAX_SETTLING`] ops wait; past it the oldest is released early.

use std::collections::VecDeque;
use std::time::Duration;

use ballast_store::store::Op;
use tokio::time::Instant;

/// How long a Server's add or update waits before it is applied.
pub const DEFAULT_SERVER_SETTLE: Duration = Duration::from_secs(1);

/// Most ops held at once per kind.
pub const MAX_SETTLING: usize = 4096;

pub(crate) struct Settle {
    hold: Duration,
    max: usize,
    /// Ops in arrival order, each with the time it may be applied (never
    /// earlier than the one before it is released).
    queue: VecDeque<(Instant, Op)>,
}

impl Settle {
    pub fn new(hold: Duration, max: usize) -> Self {
        Self {
            hold,
            max: max.max(1),
            queue: VecDeque::new(),
        }
    }

    /// Takes one op at `now`; returns the ops to apply now, in order.
    pub fn admit(&mut self, op: Op, now: Instant) -> Vec<Op> {
        match op {
            Op::Reset(..) => {
                self.queue.clear();
                vec![op]
            }
            Op::Apply(_) if !self.hold.is_zero() => {
                self.queue.push_back((now + self.hold, op));
                let mut out = self.take_due(now);
                while self.queue.len() > self.max {
                    out.extend(self.queue.pop_front().map(|(_, op)| op));
                    out.extend(self.take_due(now));
                }
                out
            }
            _ if self.queue.is_empty() => vec![op],
            _ => {
                self.queue.push_back((now, op));
                Vec::new()
            }
        }
    }

    /// When the oldest held op is due; `None` when nothing is held.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.front().map(|(at, _)| *at)
    }

    /// The ops due at `now`: the oldest while it is due, with every op
    /// behind it that is due too (those held for no time come along).
    pub fn take_due(&mut self, now: Instant) -> Vec<Op> {
        let mut out = Vec::new();
        while self.queue.front().is_some_and(|(at, _)| *at <= now) {
            out.extend(self.queue.pop_front().map(|(_, op)| op));
        }
        out
    }

    /// Every held op, in order (the watch failed: nothing more is coming
    /// that they could wait for).
    pub fn take_all(&mut self) -> Vec<Op> {
        self.queue.drain(..).map(|(_, op)| op).collect()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_store::resource::{Kind, Namespace, ObjectKey, Resource};
    use std::sync::Arc;

    fn delete(name: &str) -> Op {
        Op::Delete(Kind::Server, ObjectKey::new("ns", name))
    }

    fn names(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Apply(r) => format!("apply {}", r.key().name),
                Op::Delete(_, k) => format!("delete {}", k.name),
                Op::Reset(_, all) => format!("reset {}", all.len()),
            })
            .collect()
    }

    fn apply(name: &str) -> Op {
        // The queue never looks inside an op: any kind serves.
        Op::Apply(Resource::Namespace(Arc::new(Namespace {
            key: ObjectKey::new("", name),
            default_policy: None,
        })))
    }

    #[tokio::test(start_paused = true)]
    async fn an_applied_object_waits_its_hold_and_a_delete_behind_it_waits_too() {
        let mut s = Settle::new(Duration::from_secs(1), 16);
        let t0 = Instant::now();
        assert!(s.admit(apply("a"), t0).is_empty());
        assert!(
            s.admit(delete("b"), t0).is_empty(),
            "a delete never overtakes"
        );
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(s.take_due(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(names(&s.take_due(Instant::now())), ["apply a", "delete b"]);
        assert_eq!(s.next_due(), None);
        // Nothing held: a delete goes straight through.
        assert_eq!(names(&s.admit(delete("c"), Instant::now())), ["delete c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn later_applies_keep_their_order_and_their_own_hold() {
        let mut s = Settle::new(Duration::from_secs(1), 16);
        assert!(s.admit(apply("a"), Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(s.admit(apply("b"), Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(names(&s.take_due(Instant::now())), ["apply a"]);
        tokio::time::advance(Duration::from_millis(599)).await;
        assert!(s.take_due(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(names(&s.take_due(Instant::now())), ["apply b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_drops_what_is_held_and_the_bound_releases_the_oldest() {
        let mut s = Settle::new(Duration::from_secs(1), 2);
        let now = Instant::now();
        assert!(s.admit(apply("a"), now).is_empty());
        assert!(s.admit(apply("b"), now).is_empty());
        assert_eq!(names(&s.admit(apply("c"), now)), ["apply a"]);
        assert_eq!(s.len(), 2);
        assert_eq!(
            names(&s.admit(Op::Reset(Kind::Server, Vec::new()), now)),
            ["reset 0"]
        );
        assert_eq!(s.len(), 0);
        assert_eq!(s.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn no_hold_passes_everything_through() {
        let mut s = Settle::new(Duration::ZERO, 16);
        let now = Instant::now();
        assert_eq!(names(&s.admit(apply("a"), now)), ["apply a"]);
        assert_eq!(names(&s.admit(delete("a"), now)), ["delete a"]);
        assert_eq!(s.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_releases_everything_held() {
        let mut s = Settle::new(Duration::from_secs(1), 16);
        let now = Instant::now();
        s.admit(apply("a"), now);
        s.admit(delete("a"), now);
        assert_eq!(names(&s.take_all()), ["apply a", "delete a"]);
        assert_eq!(s.next_due(), None);
    }
}
