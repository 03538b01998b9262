//! The token bucket that bounds one tap's event rate. Its clock is tokio's,
//! so its tests run on the paused clock.

#[cfg(test)]
use std::time::Duration;
use tokio::time::Instant;

/// `rate` tokens a second, at most `burst` held; starts full.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(rate.max(1)),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes `n` tokens if there are that many now; else takes none.
    pub fn try_take(&mut self, n: u32, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        let n = f64::from(n);
        if self.tokens + 1e-9 >= n {
            self.tokens = (self.tokens - n).max(0.0);
            true
        } else {
            false
        }
    }

    /// How long until `n` tokens are there (zero if they are).
    #[cfg(test)]
    pub fn wait_for(&self, n: u32) -> Duration {
        let missing = f64::from(n) - self.tokens;
        if missing <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(missing / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let mut b = TokenBucket::new(1_000, 1_000, Instant::now());
        let taken = (0..2_000).filter(|_| b.try_take(3, Instant::now())).count();
        assert_eq!(taken, 333, "a full bucket holds a second's tokens");
        assert!(!b.try_take(3, Instant::now()));

        // Over ten seconds, 1,000 tokens a second: 3,333 requests of three.
        let mut admitted = 0;
        for _ in 0..10_000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            if b.try_take(3, Instant::now()) {
                admitted += 1;
            }
        }
        assert!((3_332..=3_334).contains(&admitted), "{admitted}");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_refills_only_up_to_the_burst() {
        let mut b = TokenBucket::new(10, 10, Instant::now());
        assert!(b.try_take(10, Instant::now()));
        assert!(!b.try_take(1, Instant::now()));
        assert_eq!(b.wait_for(1), Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.try_take(1, Instant::now()));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(b.try_take(10, Instant::now()));
        assert!(
            !b.try_take(1, Instant::now()),
            "an hour idle is still one burst"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_take_larger_than_what_is_held_takes_nothing() {
        let mut b = TokenBucket::new(5, 5, Instant::now());
        assert!(b.try_take(4, Instant::now()));
        assert!(!b.try_take(3, Instant::now()), "one left");
        assert!(b.try_take(1, Instant::now()), "the failed take kept it");
    }
}
