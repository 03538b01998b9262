//! One subscription's answers as its streams send them: each answer and the
//! messages that lead to it are encoded once, when it is published, and
//! shared by every stream.
//!
//! A [`Feed`] keeps its latest answer in a `watch` channel (latest value,
//! never a queue) together with a bounded history of the encoded changes that
//! led to it. A stream remembers only the version it last sent
//! ([`Cursor`]): when it wakes it sends the changes since that version,
//! shared with every other stream; a stream new to the feed sends the whole
//! answer; a stream that fell behind the history sends a reset and the whole
//! answer. Nothing per stream grows with the rate of change.
//!
//! A feed also knows its readers (one small slot each: the version taken
//! and a waker): a response body polls the feed directly
//! ([`Feed::poll_catch_up`]), with no task of its own, and a publication
//! wakes the readers waiting for it. A reader that has not taken a version
//! within [`FeedLimits::send_wait`] of that version's publication does not
//! read: the next publication cuts it ([`Published::cut`]).

use crate::slots::Slots;
use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    task::{Context, Poll, Waker},
    time::Duration,
};
use tokio::{sync::watch, time::Instant};

/// Changes kept per subscription for streams that fall behind; a stream
/// further behind gets a reset and the whole answer instead.
pub const MAX_HISTORY: usize = 32;
/// Encoded bytes of changes kept per subscription: the oldest go first once
/// past it (the latest change is kept whatever its size).
pub const MAX_HISTORY_BYTES: usize = 256 * 1024;

/// How a feed keeps its history and when it cuts a reader.
#[derive(Clone, Copy, Debug)]
pub struct FeedLimits {
    /// Changes kept for readers that fall behind (also bounded by
    /// [`MAX_HISTORY_BYTES`]).
    pub history: usize,
    /// A reader that has not taken a version this long after its
    /// publication is cut at the next publication.
    pub send_wait: Duration,
}

impl Default for FeedLimits {
    fn default() -> Self {
        Self {
            history: MAX_HISTORY,
            send_wait: Duration::from_secs(1),
        }
    }
}

/// Turns a subscription's answers into the messages its streams send, each
/// a whole gRPC message frame, ready for the wire.
pub trait Encode<V>: Send + Sync + 'static {
    /// Everything a stream that holds nothing needs (a new stream's first
    /// messages).
    fn full(&self, cur: &V) -> Vec<Bytes>;
    /// What moves a stream holding `prev` to `cur`.
    fn diff(&self, prev: &V, cur: &V) -> Vec<Bytes>;
    /// What a stream holding some older answer that is no longer known
    /// needs before [`Encode::full`] so that it holds exactly `cur`.
    fn reset(&self, cur: &V) -> Option<Bytes>;
}

/// A subscription's shared state: the latest answer, its messages, and the
/// changes that led to it.
pub struct Feed<V> {
    encoder: Arc<dyn Encode<V>>,
    tx: watch::Sender<Arc<Head<V>>>,
    history_bytes: Gauge,
    limits: FeedLimits,
    readers: Mutex<Readers>,
}

/// The readers of one feed, one slot each.
type Readers = Slots<Slot>;

#[derive(Default)]
struct Slot {
    /// The version last taken; `None` before the first.
    seen: Option<u64>,
    /// Set while the reader waits for a version newer than `seen`.
    waker: Option<Waker>,
    /// When the first version it lacks was published: kept per reader, so
    /// a reader that fell behind the history is still cut in time however
    /// fast versions come.
    lacking_since: Option<Instant>,
    state: SlotState,
}

impl Slot {
    fn mark_taken(&mut self, version: u64) {
        self.seen = Some(version);
        self.lacking_since = None;
    }
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum SlotState {
    #[default]
    Free,
    Open,
    Cut,
    Shed,
}

/// What a publication did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The answer differed from the latest and became a new version.
    pub changed: bool,
    /// Readers cut because they had not taken a version within
    /// [`FeedLimits::send_wait`] of its publication.
    pub cut: usize,
}

/// What a reader's poll found.
pub enum Next<V> {
    /// Messages to send (possibly none, when an answer came and went).
    Up(CatchUp<V>),
    /// The reader was cut for not reading; it sends nothing more.
    Cut,
    /// The reader was closed to relieve memory ([`Feed::shed_all`]); it
    /// sends nothing more.
    Shed,
}

/// What leaving a feed found.
#[derive(Debug, PartialEq, Eq)]
pub enum Left {
    Open,
    /// The reader had been cut (or shed), and its place counted as
    /// released then.
    WasCut,
}

/// One published version of a feed; immutable once published.
pub struct Head<V> {
    version: u64,
    answer: Arc<V>,
    /// The changes into this version, oldest first: the last one moves a
    /// stream from `version - 1` to `version`.
    changes: VecDeque<Arc<Change>>,
    /// Sum of the encoded bytes of `changes`.
    changes_bytes: usize,
    /// The whole answer, encoded on first demand (by a new stream or one
    /// that fell behind), then shared.
    full: OnceLock<Arc<[Bytes]>>,
}

struct Change {
    messages: Box<[Bytes]>,
    bytes: usize,
}

impl<V: PartialEq + Send + Sync + 'static> Feed<V> {
    /// A feed whose first answer is `answer`. `history_bytes` counts the
    /// bytes of changes kept, across feeds.
    pub fn new(
        answer: V,
        encoder: Arc<dyn Encode<V>>,
        history_bytes: Gauge,
        limits: FeedLimits,
    ) -> Self {
        Self {
            limits: FeedLimits {
                history: limits.history.max(1),
                ..limits
            },
            readers: Mutex::new(Readers::new()),
            encoder,
            tx: watch::Sender::new(Arc::new(Head {
                version: 0,
                answer: Arc::new(answer),
                changes: VecDeque::new(),
                changes_bytes: 0,
                full: OnceLock::new(),
            })),
            history_bytes,
        }
    }

    /// Publishes `answer` if it differs from the latest one: encodes the
    /// change once, for every stream, wakes the readers waiting for it and
    /// cuts those that did not take an earlier version in time.
    pub fn publish(&self, answer: V) -> Published {
        let head = self.tx.borrow().clone();
        if *head.answer == answer {
            return Published::default();
        }
        let messages = self.encoder.diff(&head.answer, &answer);
        let bytes = messages.iter().map(Bytes::len).sum();
        let mut changes = head.changes.clone();
        let mut changes_bytes = head.changes_bytes + bytes;
        changes.push_back(Arc::new(Change {
            messages: messages.into_boxed_slice(),
            bytes,
        }));
        // The latest change is always kept, whatever its size: every
        // stream that is up to date needs it.
        while changes.len() > 1
            && (changes.len() > self.limits.history || changes_bytes > MAX_HISTORY_BYTES)
        {
            if let Some(old) = changes.pop_front() {
                changes_bytes -= old.bytes;
            }
        }
        self.history_bytes
            .inc_by(changes_bytes as i64 - head.changes_bytes as i64);
        let version = head.version + 1;
        self.tx.send_replace(Arc::new(Head {
            version,
            answer: Arc::new(answer),
            changes,
            changes_bytes,
            full: OnceLock::new(),
        }));
        // After the new head is visible: a reader that registers its waker
        // before this lock saw the old head and is woken here; one after it
        // sees the new head.
        Published {
            changed: true,
            cut: self.wake_readers(version),
        }
    }

    /// Wakes the readers waiting for `version` and cuts those still
    /// lacking a version published more than `send_wait` ago. Returns how
    /// many were cut.
    fn wake_readers(&self, version: u64) -> usize {
        let now = Instant::now();
        let mut cut = 0;
        // Woken once the lock is released: the streams woken first are
        // polled (on another worker) while the rest are woken, and each
        // takes this lock.
        let mut woken = Vec::new();
        {
            let mut readers = self.lock_readers();
            for slot in readers.iter_mut().filter(|s| s.state == SlotState::Open) {
                if let Some(seen) = slot.seen.filter(|seen| *seen < version) {
                    // Its time starts at the first publication it lacks; one
                    // whose take raced a publication starts again at the next
                    // one: a late cut, never an early one.
                    let since = *slot.lacking_since.get_or_insert(now);
                    if seen + 1 < version && now.duration_since(since) > self.limits.send_wait {
                        slot.state = SlotState::Cut;
                        cut += 1;
                    }
                }
                woken.extend(slot.waker.take());
            }
        }
        crate::wakes::wake(woken);
        cut
    }

    /// Closes every open reader to relieve memory: each ends at its next
    /// poll ([`Next::Shed`]), woken now. Returns how many were open; their
    /// places count as released from this moment.
    pub fn shed_all(&self) -> usize {
        let mut shed = 0;
        for slot in self.lock_readers().iter_mut() {
            if slot.state == SlotState::Open {
                slot.state = SlotState::Shed;
                shed += 1;
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
            }
        }
        shed
    }

    /// Bytes the feed holds for its readers: the encoded changes kept and
    /// the encoded whole answer, once a reader asked for it.
    pub fn held_bytes(&self) -> usize {
        let head = self.tx.borrow();
        let full = head
            .full
            .get()
            .map_or(0, |f| f.iter().map(Bytes::len).sum());
        head.changes_bytes + full
    }

    /// Wakes every waiting reader (to notice a shutdown).
    pub fn wake_all(&self) {
        for slot in self.lock_readers().iter_mut() {
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }

    /// The latest answer.
    pub fn answer(&self) -> Arc<V> {
        self.tx.borrow().answer.clone()
    }

    /// A cursor for a new stream: it has seen nothing.
    pub fn cursor(&self) -> Cursor<V> {
        let slot = self.lock_readers().take(Slot {
            state: SlotState::Open,
            ..Slot::default()
        });
        Cursor {
            rx: self.tx.subscribe(),
            seen: None,
            slot,
        }
    }

    /// Takes what is new for `cursor`, or registers `cx`'s waker to be woken
    /// by the next publication (then `Pending`). One acquisition of the
    /// readers' lock either way: every stream of the feed takes it.
    pub fn poll_catch_up(&self, cursor: &mut Cursor<V>, cx: &mut Context<'_>) -> Poll<Next<V>> {
        let head = {
            let mut readers = self.lock_readers();
            let Some(slot) = readers.get_mut(cursor.slot) else {
                return Poll::Ready(Next::Cut);
            };
            match slot.state {
                SlotState::Cut => return Poll::Ready(Next::Cut),
                SlotState::Shed => return Poll::Ready(Next::Shed),
                SlotState::Free | SlotState::Open => {}
            }
            // Read under the lock: a publication after this wakes the
            // waker registered here.
            let head = cursor.rx.borrow_and_update().clone();
            if cursor.seen == Some(head.version) {
                match &slot.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => slot.waker = Some(cx.waker().clone()),
                }
                return Poll::Pending;
            }
            slot.mark_taken(head.version);
            head
        };
        Poll::Ready(Next::Up(self.take(cursor, head)))
    }

    /// The messages that bring a stream from what `cursor` last took to the
    /// latest answer, marking it taken.
    pub fn catch_up(&self, cursor: &mut Cursor<V>) -> CatchUp<V> {
        let head = cursor.rx.borrow_and_update().clone();
        if let Some(slot) = self.lock_readers().get_mut(cursor.slot) {
            slot.mark_taken(head.version);
        }
        self.take(cursor, head)
    }

    /// The messages from what `cursor` last took to `head`, which it takes.
    /// Outside the readers' lock: a new stream's whole answer may be
    /// encoded here.
    fn take(&self, cursor: &mut Cursor<V>, head: Arc<Head<V>>) -> CatchUp<V> {
        let oldest = head.version - head.changes.len() as u64;
        let kind = match cursor.seen {
            Some(seen) if seen == head.version => Kind::Nothing,
            Some(seen) if seen >= oldest => Kind::Changes {
                skip: (seen - oldest) as usize,
            },
            Some(_) => Kind::Reset(self.encoder.reset(&head.answer), self.full(&head)),
            None => Kind::Full(self.full(&head)),
        };
        cursor.seen = Some(head.version);
        CatchUp { head, kind }
    }

    fn full(&self, head: &Head<V>) -> Arc<[Bytes]> {
        head.full
            .get_or_init(|| self.encoder.full(&head.answer).into())
            .clone()
    }
}

impl<V> Feed<V> {
    /// Frees `cursor`'s slot; says whether it had been cut.
    pub fn leave(&self, cursor: &Cursor<V>) -> Left {
        let mut readers = self.lock_readers();
        // Freed once: a cursor left twice finds its place free.
        if readers
            .get_mut(cursor.slot)
            .is_none_or(|slot| slot.state == SlotState::Free)
        {
            return Left::Open;
        }
        match readers
            .free(cursor.slot)
            .map_or(SlotState::Free, |slot| slot.state)
        {
            SlotState::Cut | SlotState::Shed => Left::WasCut,
            _ => Left::Open,
        }
    }

    fn lock_readers(&self) -> MutexGuard<'_, Readers> {
        // Nothing panics while holding it; the slots are still whole.
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V> Drop for Feed<V> {
    fn drop(&mut self) {
        self.history_bytes
            .dec_by(self.tx.borrow().changes_bytes as i64);
    }
}

/// Where one stream is in a feed: the version it last took.
pub struct Cursor<V> {
    rx: watch::Receiver<Arc<Head<V>>>,
    seen: Option<u64>,
    /// Its slot among the feed's readers.
    slot: usize,
}

impl<V> Cursor<V> {
    /// Waits for a version newer than the last one taken. Returns `false`
    /// if the feed is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// The messages that bring one stream up to date, shared with every other
/// stream that needs the same ones.
pub struct CatchUp<V> {
    head: Arc<Head<V>>,
    kind: Kind,
}

enum Kind {
    Nothing,
    /// The head's changes after the first `skip`.
    Changes {
        skip: usize,
    },
    Full(Arc<[Bytes]>),
    Reset(Option<Bytes>, Arc<[Bytes]>),
}

impl<V> CatchUp<V> {
    /// True when the stream had fallen behind the history and is sent the
    /// whole answer again.
    pub fn is_reset(&self) -> bool {
        matches!(self.kind, Kind::Reset(..))
    }

    /// The `i`th message (from 0), if there is one.
    pub fn message(&self, mut i: usize) -> Option<&Bytes> {
        match &self.kind {
            Kind::Nothing => None,
            Kind::Changes { skip } => {
                for c in self.head.changes.iter().skip(*skip) {
                    if let Some(m) = c.messages.get(i) {
                        return Some(m);
                    }
                    i -= c.messages.len();
                }
                None
            }
            Kind::Full(full) => full.get(i),
            Kind::Reset(Some(reset), full) => match i.checked_sub(1) {
                None => Some(reset),
                Some(i) => full.get(i),
            },
            Kind::Reset(None, full) => full.get(i),
        }
    }

    /// The messages, in order; cloning one shares its bytes.
    pub fn messages(&self) -> Box<dyn Iterator<Item = &Bytes> + Send + '_> {
        match &self.kind {
            Kind::Nothing => Box::new(std::iter::empty()),
            Kind::Changes { skip } => Box::new(
                self.head
                    .changes
                    .iter()
                    .skip(*skip)
                    .flat_map(|c| c.messages.iter()),
            ),
            Kind::Full(full) => Box::new(full.iter()),
            Kind::Reset(reset, full) => Box::new(reset.iter().chain(full.iter())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::task::Waker;

    /// Sets of numbers, as messages a test can apply: `+n`, `-n`, `reset`.
    struct Sets;

    fn msg(s: String) -> Bytes {
        Bytes::from(s)
    }

    impl Encode<BTreeSet<u32>> for Sets {
        fn full(&self, cur: &BTreeSet<u32>) -> Vec<Bytes> {
            cur.iter().map(|n| msg(format!("+{n}"))).collect()
        }
        fn diff(&self, prev: &BTreeSet<u32>, cur: &BTreeSet<u32>) -> Vec<Bytes> {
            let gone = prev.difference(cur).map(|n| msg(format!("-{n}")));
            let new = cur.difference(prev).map(|n| msg(format!("+{n}")));
            gone.chain(new).collect()
        }
        fn reset(&self, _: &BTreeSet<u32>) -> Option<Bytes> {
            Some(msg("reset".into()))
        }
    }

    fn feed(first: &[u32]) -> Feed<BTreeSet<u32>> {
        Feed::new(
            first.iter().copied().collect(),
            Arc::new(Sets),
            Gauge::default(),
            FeedLimits::default(),
        )
    }

    fn set(ns: &[u32]) -> BTreeSet<u32> {
        ns.iter().copied().collect()
    }

    /// Applies messages to what a client holds; returns how many there were.
    fn apply(held: &mut BTreeSet<u32>, up: &CatchUp<BTreeSet<u32>>) -> usize {
        let mut n = 0;
        for m in up.messages() {
            n += 1;
            let text = std::str::from_utf8(m).unwrap();
            match text.split_at(1) {
                ("+", v) => {
                    held.insert(v.parse().unwrap());
                }
                ("-", v) => {
                    held.remove(&v.parse().unwrap());
                }
                _ => held.clear(),
            }
        }
        n
    }

    #[test]
    fn a_new_stream_gets_the_whole_answer_then_changes() {
        let f = feed(&[1, 2]);
        let mut c = f.cursor();
        let mut held = set(&[7]);
        let up = f.catch_up(&mut c);
        assert!(!up.is_reset());
        apply(&mut held, &up);
        // A first answer is added to what a client held before (its own
        // rule replaces the set on a new stream); here it holds 7 still.
        assert_eq!(held, set(&[1, 2, 7]));
        let mut held = set(&[1, 2]);
        assert_eq!(apply(&mut held, &f.catch_up(&mut c)), 0, "nothing new");

        assert!(f.publish(set(&[2, 3])).changed);
        assert!(
            !f.publish(set(&[2, 3])).changed,
            "an equal answer is no change"
        );
        let up = f.catch_up(&mut c);
        assert_eq!(apply(&mut held, &up), 2);
        assert_eq!(held, set(&[2, 3]));
    }

    #[test]
    fn every_stream_shares_the_messages_of_one_change() {
        let f = feed(&[1]);
        let mut a = f.cursor();
        let mut b = f.cursor();
        let _ = f.catch_up(&mut a);
        let _ = f.catch_up(&mut b);
        f.publish(set(&[1, 2]));
        let (ua, ub) = (f.catch_up(&mut a), f.catch_up(&mut b));
        let ma: Vec<&Bytes> = ua.messages().collect();
        let mb: Vec<&Bytes> = ub.messages().collect();
        assert_eq!(ma.len(), 1);
        assert_eq!(
            ma[0].as_ptr(),
            mb[0].as_ptr(),
            "encoded once, the same bytes for both"
        );
        // A new stream's whole answer is encoded once per version, too.
        let (mut c, mut d) = (f.cursor(), f.cursor());
        let (uc, ud) = (f.catch_up(&mut c), f.catch_up(&mut d));
        let first = |u: &CatchUp<BTreeSet<u32>>| u.messages().next().unwrap().as_ptr();
        assert_eq!(first(&uc), first(&ud));
    }

    #[test]
    fn a_slow_reader_catches_up_from_the_history() {
        let f = feed(&[]);
        let mut slow = f.cursor();
        let mut held = BTreeSet::new();
        apply(&mut held, &f.catch_up(&mut slow));
        for n in 1..=MAX_HISTORY as u32 {
            f.publish((0..n).collect());
        }
        let up = f.catch_up(&mut slow);
        assert!(!up.is_reset());
        assert_eq!(apply(&mut held, &up), MAX_HISTORY);
        assert_eq!(held, (0..MAX_HISTORY as u32).collect());
    }

    #[test]
    fn a_reader_behind_the_history_gets_a_reset_and_the_whole_answer() {
        let f = feed(&[1, 2, 3]);
        let mut slow = f.cursor();
        let mut held = BTreeSet::new();
        apply(&mut held, &f.catch_up(&mut slow));
        // Many more changes than the history keeps.
        for n in 0..(10 * MAX_HISTORY as u32) {
            f.publish(set(&[n % 7, 100 + n]));
        }
        let up = f.catch_up(&mut slow);
        assert!(up.is_reset());
        // Bounded by the answer, not by how many changes were missed.
        assert_eq!(apply(&mut held, &up), 3);
        assert_eq!(held, *f.answer());
    }

    #[test]
    fn the_history_is_bounded_in_bytes_and_counted() {
        let gauge = Gauge::default();
        let f = Feed::new(
            BTreeSet::new(),
            Arc::new(Sets),
            gauge.clone(),
            FeedLimits::default(),
        );
        let mut c = f.cursor();
        let _ = f.catch_up(&mut c);
        // Each change adds 10,000 numbers: ~60 KB of messages.
        for round in 0..8u32 {
            f.publish((0..10_000 * (round + 1)).collect());
        }
        let kept = gauge.get() as usize;
        assert!(kept > 0 && kept <= MAX_HISTORY_BYTES, "{kept}");
        let up = f.catch_up(&mut c);
        assert!(up.is_reset(), "the first changes were dropped for size");
        drop(f);
        assert_eq!(gauge.get(), 0, "a dropped feed releases its count");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cursor_wakes_on_a_new_version_and_ends_with_the_feed() {
        let f = feed(&[1]);
        let mut c = f.cursor();
        let _ = f.catch_up(&mut c);
        let waiting = tokio::time::timeout(std::time::Duration::from_secs(1), c.changed()).await;
        assert!(waiting.is_err(), "no new version, no wake-up");
        f.publish(set(&[2]));
        assert!(c.changed().await);
        let _ = f.catch_up(&mut c);
        drop(f);
        assert!(!c.changed().await, "the feed is gone");
    }

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn poll(
        f: &Feed<BTreeSet<u32>>,
        c: &mut Cursor<BTreeSet<u32>>,
        w: &Arc<Wakes>,
    ) -> Poll<Vec<Bytes>> {
        let waker = Waker::from(w.clone());
        match f.poll_catch_up(c, &mut Context::from_waker(&waker)) {
            Poll::Ready(Next::Up(up)) => {
                let by_index: Vec<Bytes> = (0..).map_while(|i| up.message(i).cloned()).collect();
                let all: Vec<Bytes> = up.messages().cloned().collect();
                assert_eq!(by_index, all, "message(i) is the i-th of messages()");
                Poll::Ready(all)
            }
            Poll::Ready(Next::Cut) => Poll::Ready(vec![Bytes::from_static(b"cut")]),
            Poll::Ready(Next::Shed) => Poll::Ready(vec![Bytes::from_static(b"shed")]),
            Poll::Pending => Poll::Pending,
        }
    }

    #[test]
    fn shedding_ends_every_open_reader_once_and_wakes_the_waiting() {
        let f = feed(&[1, 2]);
        assert_eq!(f.held_bytes(), 0, "nothing encoded before a reader asks");
        let (mut waiting, mut behind) = (f.cursor(), f.cursor());
        let w = Arc::new(Wakes::default());
        let _ = poll(&f, &mut waiting, &w);
        assert!(f.held_bytes() > 0, "the whole answer, encoded for readers");
        assert_eq!(poll(&f, &mut waiting, &w), Poll::Pending);
        assert_eq!(f.shed_all(), 2);
        assert_eq!(w.count(), 1, "the waiting reader was woken");
        assert_eq!(f.shed_all(), 0, "shed once");
        for c in [&mut waiting, &mut behind] {
            assert_eq!(
                poll(&f, c, &w),
                Poll::Ready(vec![Bytes::from_static(b"shed")])
            );
        }
        // Released when shed: leaving does not release them again.
        assert_eq!(f.leave(&waiting), Left::WasCut);
        assert_eq!(f.leave(&behind), Left::WasCut);
    }

    #[test]
    fn a_polling_reader_takes_what_is_new_or_waits_for_the_next_publication() {
        let f = feed(&[1, 2]);
        let mut c = f.cursor();
        let w = Arc::new(Wakes::default());
        assert_eq!(
            poll(&f, &mut c, &w),
            Poll::Ready(vec![msg("+1".into()), msg("+2".into())])
        );
        assert_eq!(poll(&f, &mut c, &w), Poll::Pending);
        assert_eq!(
            poll(&f, &mut c, &w),
            Poll::Pending,
            "polled twice, one waker kept"
        );
        assert_eq!(w.count(), 0);
        f.publish(set(&[2, 3]));
        assert_eq!(w.count(), 1, "woken once by the publication");
        f.publish(set(&[3]));
        assert_eq!(w.count(), 1, "not woken again until it waits again");
        assert_eq!(
            poll(&f, &mut c, &w),
            Poll::Ready(vec![msg("-1".into()), msg("+3".into()), msg("-2".into())])
        );
        // Behind the history: the reset comes first, by index as well.
        for n in 0..(3 * MAX_HISTORY as u32) {
            f.publish(set(&[n]));
        }
        let last = 3 * MAX_HISTORY as u32 - 1;
        assert_eq!(
            poll(&f, &mut c, &w),
            Poll::Ready(vec![msg("reset".into()), msg(format!("+{last}"))])
        );
        assert_eq!(f.leave(&c), Left::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_does_not_take_a_version_in_time_is_cut_at_the_next_publication() {
        let wait = Duration::from_secs(1);
        let f = Feed::new(
            set(&[1]),
            Arc::new(Sets),
            Gauge::default(),
            FeedLimits {
                history: MAX_HISTORY,
                send_wait: wait,
            },
        );
        let (mut reader, mut idle) = (f.cursor(), f.cursor());
        let w = Arc::new(Wakes::default());
        let _ = (poll(&f, &mut reader, &w), poll(&f, &mut idle, &w));

        assert_eq!(f.publish(set(&[2])).cut, 0);
        let _ = poll(&f, &mut reader, &w);
        tokio::time::advance(wait / 2).await;
        assert_eq!(f.publish(set(&[3])).cut, 0, "within the wait");
        let _ = poll(&f, &mut reader, &w);
        tokio::time::advance(wait).await;
        // `idle` lacks the version published 1.5 s ago; `reader` lacks
        // nothing older than this publication.
        assert_eq!(f.publish(set(&[4])).cut, 1);
        assert_eq!(f.publish(set(&[5])).cut, 0, "cut once");
        assert_eq!(
            poll(&f, &mut idle, &w),
            Poll::Ready(vec![msg("cut".into())])
        );
        assert_eq!(
            poll(&f, &mut reader, &w),
            Poll::Ready(vec![
                msg("-3".into()),
                msg("+4".into()),
                msg("-4".into()),
                msg("+5".into())
            ])
        );
        assert_eq!(f.leave(&idle), Left::WasCut);
        assert_eq!(f.leave(&reader), Left::Open);
        assert!(!f.lock_readers().holds_memory(), "slots given back");

        // A reader that has never been polled is not cut (its connection polls a new
        // body at once); nor is one that takes every version, however late.
        let fresh = f.cursor();
        tokio::time::advance(10 * wait).await;
        assert_eq!(f.publish(set(&[6])).cut, 0);
        assert_eq!(f.leave(&fresh), Left::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_behind_a_short_history_is_still_cut_when_versions_come_fast() {
        let wait = Duration::from_secs(1);
        let f = Feed::new(
            set(&[0]),
            Arc::new(Sets),
            Gauge::default(),
            FeedLimits {
                history: 2,
                send_wait: wait,
            },
        );
        let (mut reader, mut idle) = (f.cursor(), f.cursor());
        let w = Arc::new(Wakes::default());
        let _ = (poll(&f, &mut reader, &w), poll(&f, &mut idle, &w));
        // A version every 300 ms: the history spans less than the wait, so
        // only the time the reader itself fell behind can cut it.
        let step = Duration::from_millis(300);
        let mut cut_at = None;
        for n in 1..20u32 {
            tokio::time::advance(step).await;
            let published = f.publish(set(&[n]));
            let _ = poll(&f, &mut reader, &w);
            if published.cut > 0 {
                assert_eq!(published.cut, 1, "only the idle reader");
                cut_at = Some(n);
                break;
            }
        }
        // Lacking version 1 since its publication: past the wait at the
        // fifth (1.2 s later), not before.
        assert_eq!(cut_at, Some(5));
        assert_eq!(
            poll(&f, &mut idle, &w),
            Poll::Ready(vec![msg("cut".into())])
        );
        assert_eq!(f.leave(&idle), Left::WasCut);
        assert_eq!(f.leave(&reader), Left::Open);
    }
}
