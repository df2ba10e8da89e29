//! Retry delays: capped exponential backoff with full jitter.
//!
//! When a request fails and is retried, retrying at once (or after a fixed
//! delay) makes every client that saw the same outage come back at the same
//! moment. This module spaces retries out with the "full jitter" scheme of the
//! AWS Architecture Blog post "Exponential Backoff And Jitter" (also the shape
//! of linkerd's exponential backoff): the ceiling for retry `n` (counting from
//! 0) is `min(max, base * 2^n)`, and the delay is drawn uniformly from
//! `[0, ceiling]`.
//!
//! The ceiling arithmetic saturates, so any `u32` retry number is safe, and the
//! random source is passed in by the caller (a seeded one in tests).
//! [`Backoff::without_jitter`] makes the delay exactly the ceiling, for
//! deterministic behaviour.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::backoff::Backoff;
//! use rand::{rngs::SmallRng, SeedableRng};
//! use tokio::time::Duration;
//!
//! let backoff = Backoff::new(Duration::from_millis(25), Duration::from_secs(1));
//! assert_eq!(backoff.ceiling(2), Duration::from_millis(100));
//! let mut rng = SmallRng::seed_from_u64(7);
//! let wait = backoff.delay(2, &mut rng); // somewhere in 0..=100ms
//! assert!(wait <= Duration::from_millis(100));
//! # }
//! ```

use tokio::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Exponential backoff with full jitter (AWS Architecture Blog "Exponential
/// Backoff And Jitter"; linkerd exp-backoff).
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    jitter: bool,
}

impl Backoff {
    /// Backoff starting at `base` and capped at `max`, with full jitter on.
    /// A `max` below `base` caps every ceiling at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            jitter: true,
        }
    }

    /// The same backoff without jitter: every delay is exactly its ceiling.
    /// Deterministic, for tests and for callers that add their own spread.
    #[cfg(any(test, feature = "internals"))]
    pub fn without_jitter(self) -> Self {
        Backoff {
            jitter: false,
            ..self
        }
    }

    /// Ceiling for retry number `retry` (0 for the first retry):
    /// `min(max, base * 2^retry)`, saturating, never overflowing for any `u32`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let base = self.base.as_nanos();
        let max = self.max.as_nanos();
        // A shift by at least the count of leading zeros reaches bit 127,
        // far above any Duration (< 2^94 ns): saturate instead of shifting.
        let scaled = if base == 0 {
            0
        } else if retry >= base.leading_zeros() {
            u128::MAX
        } else {
            base << retry
        };
        from_nanos_u128(scaled.min(max))
    }

    /// The delay before retry number `retry`: uniform in `[0, ceiling]` with
    /// jitter, exactly [`ceiling`](Backoff::ceiling) without.
    pub fn delay<R: rand::Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(retry);
        if !self.jitter {
            return ceiling;
        }
        from_nanos_u128(rng.random_range(0..=ceiling.as_nanos()))
    }
}

/// Converts nanoseconds that are at most some `Duration`'s `as_nanos()`.
fn from_nanos_u128(n: u128) -> Duration {
    // The quotient is at most u64::MAX because `n` came from a Duration.
    let secs = u64::try_from(n / NANOS_PER_SEC).unwrap_or(u64::MAX);
    Duration::new(secs, (n % NANOS_PER_SEC) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn default_backoff() -> Backoff {
        Backoff::new(ms(25), Duration::from_secs(1))
    }

    #[test]
    fn ceilings_double_then_cap() {
        let b = default_backoff();
        let got: Vec<u64> = (0..9).map(|r| b.ceiling(r).as_millis() as u64).collect();
        assert_eq!(got, vec![25, 50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn huge_retry_numbers_saturate() {
        let b = default_backoff();
        for r in [
            31,
            32,
            63,
            64,
            93,
            94,
            127,
            128,
            1000,
            u32::MAX - 1,
            u32::MAX,
        ] {
            assert_eq!(b.ceiling(r), Duration::from_secs(1), "retry {r}");
        }
        let huge = Backoff::new(Duration::MAX, Duration::MAX).without_jitter();
        assert_eq!(huge.ceiling(0), Duration::MAX);
        assert_eq!(huge.ceiling(u32::MAX), Duration::MAX);
        let one_ns = Backoff::new(Duration::from_nanos(1), Duration::MAX);
        assert_eq!(one_ns.ceiling(10), Duration::from_nanos(1024));
        assert_eq!(one_ns.ceiling(u32::MAX), Duration::MAX);
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(huge.delay(u32::MAX, &mut rng) == Duration::MAX);
        assert!(default_backoff().delay(u32::MAX, &mut rng) <= Duration::from_secs(1));
    }

    #[test]
    fn zero_base_and_small_max() {
        let zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.ceiling(0), Duration::ZERO);
        assert_eq!(zero.ceiling(u32::MAX), Duration::ZERO);
        let capped = Backoff::new(ms(100), ms(10));
        assert_eq!(capped.ceiling(0), ms(10));
    }

    #[test]
    fn without_jitter_is_exactly_the_ceiling() {
        let b = default_backoff().without_jitter();
        let mut rng = SmallRng::seed_from_u64(3);
        let got: Vec<u64> = (0..8)
            .map(|r| b.delay(r, &mut rng).as_millis() as u64)
            .collect();
        assert_eq!(got, vec![25, 50, 100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn jittered_delays_stay_in_range_and_vary() {
        let b = default_backoff();
        let mut rng = SmallRng::seed_from_u64(42);
        for retry in 0..10 {
            let ceiling = b.ceiling(retry);
            let samples: Vec<Duration> = (0..1000).map(|_| b.delay(retry, &mut rng)).collect();
            assert!(samples.iter().all(|d| *d <= ceiling));
            let distinct: std::collections::HashSet<_> = samples.iter().collect();
            assert!(distinct.len() > 900, "retry {retry}: {}", distinct.len());
            // Full jitter: the mean is about half the ceiling.
            let mean = samples.iter().map(Duration::as_secs_f64).sum::<f64>() / 1000.0;
            let half = ceiling.as_secs_f64() / 2.0;
            assert!(
                (mean - half).abs() < half * 0.1,
                "retry {retry}: mean {mean}"
            );
        }
    }
}
