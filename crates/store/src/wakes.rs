//! The wake-ups a publication makes, held until the task that applies the
//! sources' changes has applied every change ready for it.
//!
//! Two objects changed together (a pod and a route) reach the controller on
//! two watches and are applied as two store updates. Woken after each, a
//! stream's connection polled between the two (on another worker) writes
//! twice: once per change. Under [`Coalesce`] the wake-ups a change makes
//! wait until the runtime's timer next ticks (at most 1 ms, [`HOLD`]);
//! what arrives meanwhile is applied and held with them, and each
//! connection is woken, polled and written once.
//!
//! Bounded: at most [`MAX_HELD_WAKES`] wake-ups are held (past it they are
//! made at once), each for at most one timer tick and one turn of the
//! applying task.

use std::{
    cell::RefCell,
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

/// The most wake-ups held at once; past it, a publication wakes its readers
/// at once. A turn that reaches more streams than this is a bulk change
/// (a relist), where one write more per connection is nothing.
pub const MAX_HELD_WAKES: usize = 1 << 16;

/// How long a turn's wake-ups are held at least; the runtime's timer fires
/// at its next millisecond tick after it, so they wait at most 1 ms.
pub const HOLD: Duration = Duration::from_micros(1);

thread_local! {
    /// Set while a [`Coalesce`] polls its task on this thread.
    static HELD: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// Wakes `wakers`, or holds them if a [`Coalesce`] is polling on this
/// thread and has room.
pub(crate) fn wake(wakers: Vec<Waker>) {
    let wakers = HELD.with(|held| {
        let mut held = held.borrow_mut();
        match held.as_mut() {
            Some(h) if h.len() + wakers.len() <= MAX_HELD_WAKES => {
                h.extend(wakers);
                None
            }
            _ => Some(wakers),
        }
    });
    wakers.into_iter().flatten().for_each(Waker::wake);
}

/// Runs the future that applies the sources' changes, holding the
/// wake-ups its store updates make until it has nothing more ready: then
/// it waits for the timer's next tick (for a change already on its way),
/// applies what arrived, and makes every held wake-up.
pub struct Coalesce<F: Future> {
    inner: Pin<Box<F>>,
    held: Vec<Waker>,
    /// The hold's timer, made at the first hold and reset for the next.
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `pause` is running.
    pausing: bool,
}

impl<F: Future> Coalesce<F> {
    pub fn new(inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            held: Vec::new(),
            pause: None,
            pausing: false,
        }
    }

    /// Polls the inner future with this thread's publications held in
    /// `self.held`.
    fn poll_holding(&mut self, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Clears the thread's slot even if the poll panics.
        struct Restore<'a>(&'a mut Vec<Waker>);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                if let Some(h) = HELD.with(|held| held.borrow_mut().take()) {
                    *self.0 = h;
                }
            }
        }
        let nested = HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.is_some() {
                return true;
            }
            *held = Some(std::mem::take(&mut self.held));
            false
        });
        if nested {
            return self.inner.as_mut().poll(cx);
        }
        let _restore = Restore(&mut self.held);
        self.inner.as_mut().poll(cx)
    }

    fn flush(&mut self) {
        std::mem::take(&mut self.held)
            .into_iter()
            .for_each(Waker::wake);
    }
}

impl<F: Future> Future for Coalesce<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let resumed = match this.pause.as_mut() {
            Some(pause) if this.pausing => {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pausing = false;
                true
            }
            _ => false,
        };
        let out = this.poll_holding(cx);
        if out.is_ready() || this.held.is_empty() {
            this.flush();
            return out;
        }
        if resumed {
            this.flush();
            return Poll::Pending;
        }
        // Held until the runtime timer's next tick (it rounds a deadline up
        // to its next millisecond): a change whose watch line is on its way
        // (a pod and a route applied together arrive a fraction of a
        // millisecond apart) is applied before anyone is woken.
        let pause = match this.pause.as_mut() {
            Some(pause) => {
                pause.as_mut().reset(tokio::time::Instant::now() + HOLD);
                pause
            }
            None => this.pause.insert(Box::pin(tokio::time::sleep(HOLD))),
        };
        if pause.as_mut().poll(cx).is_ready() {
            this.flush();
            return Poll::Pending;
        }
        this.pausing = true;
        Poll::Pending
    }
}

impl<F: Future> Drop for Coalesce<F> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn outside_a_coalesce_a_wake_is_made_at_once() {
        let (count, waker) = counter();
        wake(vec![waker]);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    fn poll(task: &mut Coalesce<impl Future<Output = ()>>) -> Poll<()> {
        Pin::new(task).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_arriving_within_the_hold_is_woken_with_the_first_once() {
        let (count, waker) = counter();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut task = Coalesce::new(async move {
            wake(vec![waker.clone()]);
            rx.recv().await;
            wake(vec![waker]);
            std::future::pending::<()>().await
        });
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "held");
        assert!(task.pausing);
        // The second change arrives before the tick: applied at the tick,
        // before any wake-up is made.
        tx.send(()).unwrap();
        assert!(poll(&mut task).is_pending());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "still held until the tick"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(poll(&mut task).is_pending());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            2,
            "both made together, after the tick"
        );
        assert!(task.held.is_empty() && !task.pausing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_change_is_woken_at_the_next_tick_and_not_again() {
        let (count, waker) = counter();
        let mut task = Coalesce::new(async move {
            wake(vec![waker]);
            std::future::pending::<()>().await
        });
        let start = tokio::time::Instant::now();
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // Polled early (woken for another reason): still held.
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        while count.0.load(Ordering::SeqCst) == 0 {
            tokio::time::advance(Duration::from_micros(100)).await;
            assert!(poll(&mut task).is_pending());
        }
        assert!(
            start.elapsed() <= Duration::from_millis(1),
            "{:?}",
            start.elapsed()
        );
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "and not again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_change_is_held_again_until_its_own_tick() {
        let (count, waker) = counter();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut task = Coalesce::new(async move {
            while rx.recv().await.is_some() {
                wake(vec![waker.clone()]);
            }
        });
        tx.send(()).unwrap();
        assert!(poll(&mut task).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // Long after the first hold's tick, the timer is set anew: the
        // second change waits for a tick of its own.
        tokio::time::advance(Duration::from_millis(5)).await;
        tx.send(()).unwrap();
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "held again");
        assert!(task.pausing);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(poll(&mut task).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_held_is_made_when_the_task_ends_or_is_dropped() {
        let (count, waker) = counter();
        let w = waker.clone();
        let mut ends = Coalesce::new(async move { wake(vec![w]) });
        assert!(poll(&mut ends).is_ready());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let mut dropped = Coalesce::new(async move {
            wake(vec![waker]);
            std::future::pending::<()>().await
        });
        assert!(poll(&mut dropped).is_pending());
        drop(dropped);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn past_the_bound_wakes_are_made_at_once() {
        let (count, waker) = counter();
        let mut task = Coalesce::new(async move {
            wake(vec![waker.clone(); MAX_HELD_WAKES]);
            wake(vec![waker]);
        });
        HELD.with(|h| assert!(h.borrow().is_none()));
        let noop = Waker::noop();
        let mut cx = Context::from_waker(noop);
        // The first batch fills the bound; the second is made at once.
        let mut first = true;
        let _ = task.poll_holding(&mut cx).map(|()| first = false);
        assert!(!first);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(task.held.len(), MAX_HELD_WAKES);
        task.flush();
        assert_eq!(count.0.load(Ordering::SeqCst), 1 + MAX_HELD_WAKES);
        HELD.with(|h| assert!(h.borrow().is_none(), "the thread's slot cleared"));
    }
}
