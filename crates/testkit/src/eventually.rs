//! Waiting in tests for something that happens in the background: one
//! polling loop for every test of the workspace.

use std::time::Duration;

/// How often a condition is checked again.
pub const POLL: Duration = Duration::from_millis(20);

/// What a check answers: done (with a value) or not yet. `bool` is done
/// when true; `Option<T>` is done with `T` when `Some`.
pub trait Outcome {
    type Value;
    fn done(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn done(self) -> Option<T> {
        self
    }
}

/// Runs `check` every [`POLL`] until it is done (`true`, or `Some(value)`,
/// which is returned); panics with "timed out waiting for {what}" once
/// `deadline` has passed. The deadline is on tokio's clock, so it holds
/// under a paused clock (`start_paused`) too.
///
/// `check` is an async closure (`async || ...`, or `|| async { ... }`); it
/// may borrow mutably what it reads. For a plain closure, see
/// [`eventually_sync`].
pub async fn eventually<R: Outcome>(
    what: &str,
    deadline: Duration,
    mut check: impl AsyncFnMut() -> R,
) -> R::Value {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = check().await.done() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what} ({deadline:?})"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a plain (not async) closure.
pub async fn eventually_sync<R: Outcome>(
    what: &str,
    deadline: Duration,
    mut check: impl FnMut() -> R,
) -> R::Value {
    eventually(what, deadline, async || check()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_done() {
        let mut n = 0;
        let got = eventually_sync("three", Duration::from_secs(1), || {
            n += 1;
            (n == 3).then_some(n * 10)
        })
        .await;
        assert_eq!(got, 30);
        let mut calls = 0;
        eventually("a bool", Duration::from_secs(1), async || {
            calls += 1;
            calls > 1
        })
        .await;
        assert_eq!(calls, 2);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out waiting for nothing")]
    async fn panics_naming_what_after_the_deadline() {
        eventually_sync("nothing", Duration::from_secs(1), || false).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_on_tokios_clock() {
        use futures_util::FutureExt;
        let start = tokio::time::Instant::now();
        let never = eventually_sync("never", Duration::from_secs(10), || false);
        let outcome = std::panic::AssertUnwindSafe(never).catch_unwind().await;
        assert!(outcome.is_err(), "it panicked");
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(10) + 2 * POLL,
            "{waited:?}"
        );
    }
}
