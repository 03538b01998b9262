//! A latest value shared by many readers, each told when it changes: what a
//! subscription whose every message is its whole answer needs (the policy
//! APIs'), without a history.
//!
//! Like a `watch` channel, a reader sees only the latest value, never a
//! queue. Unlike one, its readers wait in slots of one vector (a waker
//! each) rather than in a list threaded through each waiting future: a
//! change walks that vector once and wakes the readers after releasing the
//! lock, and a reader's poll is one lock acquisition with no future of its
//! own. A change reaching hundreds of streams spends less on the wake-ups
//! than on the streams.
//!
//! Bounded by its readers: one slot each, freed when the reader drops (and
//! the vector with the last of them). What holds readers bounds them (the
//! policy API's stream limit).

use crate::slots::Slots;
use std::{
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
};

/// The shared value and its readers.
pub struct Latest<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    value: T,
    /// Bumped by each change.
    version: u64,
    /// Once set, readers get nothing more ([`LatestReader::poll_changed`]
    /// answers `None`).
    closed: bool,
    /// Set in a reader's place while it waits for a version it has not
    /// seen.
    wakers: Slots<Option<Waker>>,
}

/// One reader's place: the version it saw last.
pub struct LatestReader<T> {
    latest: Arc<Latest<T>>,
    slot: usize,
    seen: u64,
}

impl<T: Clone> Latest<T> {
    pub fn new(value: T) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                value,
                version: 0,
                closed: false,
                wakers: Slots::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics while holding it; the state is whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new reader that has seen the current value.
    pub fn reader(self: &Arc<Self>) -> LatestReader<T> {
        let mut s = self.lock();
        let slot = s.wakers.take(None);
        LatestReader {
            latest: self.clone(),
            slot,
            seen: s.version,
        }
    }

    /// Replaces the value and wakes the readers waiting for a change.
    pub fn send_replace(&self, value: T) {
        self.change(|s| {
            s.value = value;
            s.version += 1;
        });
    }

    /// Ends every reader: each is woken and gets `None` from then on.
    pub fn close(&self) {
        self.change(|s| s.closed = true);
    }

    fn change(&self, f: impl FnOnce(&mut State<T>)) {
        // Woken once the lock is released: the readers woken first are
        // polled (on another worker) while the rest are woken, and each
        // takes this lock.
        let woken: Vec<Waker> = {
            let mut s = self.lock();
            f(&mut s);
            s.wakers.iter_mut().filter_map(Option::take).collect()
        };
        crate::wakes::wake(woken);
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Reads the current value in place.
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock().value)
    }

    /// Readers holding a slot.
    pub fn readers(&self) -> usize {
        self.lock().wakers.taken()
    }
}

impl<T: Clone> LatestReader<T> {
    /// The current value, marked seen.
    pub fn current(&mut self) -> T {
        let s = self.latest.lock();
        self.seen = s.version;
        s.value.clone()
    }

    /// Whether a value this reader has not seen is there (or it was closed).
    pub fn has_changed(&self) -> bool {
        let s = self.latest.lock();
        s.closed || s.version != self.seen
    }

    pub fn is_closed(&self) -> bool {
        self.latest.is_closed()
    }

    /// The value once it changed since this reader last saw one; `None`
    /// once closed (whatever it has not seen).
    pub fn poll_changed(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.latest.lock();
        if s.closed {
            return Poll::Ready(None);
        }
        if s.version != self.seen {
            self.seen = s.version;
            return Poll::Ready(Some(s.value.clone()));
        }
        let Some(waker) = s.wakers.get_mut(self.slot) else {
            return Poll::Pending;
        };
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> Drop for LatestReader<T> {
    fn drop(&mut self) {
        let mut s = self.latest.state.lock().unwrap_or_else(|e| e.into_inner());
        s.wakers.free(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        task::Wake,
    };

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll<T: Clone>(r: &mut LatestReader<T>, w: &Arc<Count>) -> Poll<Option<T>> {
        let waker = Waker::from(w.clone());
        r.poll_changed(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_reader_sees_only_the_latest_value_and_is_woken_once_per_wait() {
        let latest = Latest::new(0);
        let mut r = latest.reader();
        let w = Arc::new(Count::default());
        assert_eq!(poll(&mut r, &w), Poll::Pending, "it saw the first value");
        latest.send_replace(1);
        latest.send_replace(2);
        assert_eq!(
            w.0.load(Ordering::SeqCst),
            1,
            "woken by the first change only"
        );
        assert_eq!(
            poll(&mut r, &w),
            Poll::Ready(Some(2)),
            "the latest, not a queue"
        );
        assert_eq!(poll(&mut r, &w), Poll::Pending);
        assert!(!r.has_changed());
        latest.send_replace(3);
        assert!(r.has_changed());
        assert_eq!(w.0.load(Ordering::SeqCst), 2);
        assert_eq!(r.current(), 3);
        assert!(!r.has_changed(), "current marks the value seen");
    }

    #[test]
    fn closing_wakes_every_reader_and_ends_them_before_an_unseen_value() {
        let latest = Latest::new("a");
        let (mut r1, mut r2) = (latest.reader(), latest.reader());
        let w = Arc::new(Count::default());
        assert!(poll(&mut r1, &w).is_pending());
        assert!(poll(&mut r2, &w).is_pending());
        latest.send_replace("b");
        assert!(poll(&mut r1, &w).is_ready());
        assert!(poll(&mut r1, &w).is_pending());
        latest.close();
        assert_eq!(
            w.0.load(Ordering::SeqCst),
            3,
            "r1 and r2 by the change, r1 by the close"
        );
        assert_eq!(poll(&mut r1, &w), Poll::Ready(None));
        assert_eq!(
            poll(&mut r2, &w),
            Poll::Ready(None),
            "closed wins over \"b\""
        );
        assert!(r2.is_closed() && r2.has_changed());
    }

    #[test]
    fn slots_are_reused_and_given_back_with_the_last_reader() {
        let latest = Latest::new(());
        let readers: Vec<_> = (0..4).map(|_| latest.reader()).collect();
        assert_eq!(latest.readers(), 4);
        let mut readers = readers.into_iter();
        drop(readers.next());
        let again = latest.reader();
        assert_eq!(again.slot, 0, "the freed slot");
        assert_eq!(latest.lock().wakers.iter_mut().count(), 4, "no new slot");
        drop(readers);
        drop(again);
        assert_eq!(latest.readers(), 0);
        assert!(
            !latest.lock().wakers.holds_memory(),
            "the vector went with the last"
        );
    }

    #[test]
    fn a_dropped_reader_is_not_woken() {
        let latest = Latest::new(0);
        let w = Arc::new(Count::default());
        let mut r = latest.reader();
        assert!(poll(&mut r, &w).is_pending());
        drop(r);
        latest.send_replace(1);
        assert_eq!(w.0.load(Ordering::SeqCst), 0);
    }
}
