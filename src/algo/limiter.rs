//! Token bucket rate limiter, implemented as GCRA.
//!
//! A dispatcher must not send more than `rate` requests per second to a
//! backend (or a service), while still allowing a short burst of up to
//! `burst` requests after a quiet spell. [`TokenBucket`] decides, for one call
//! at a given instant, whether it may go now or when it may go.
//!
//! The algorithm is the Generic Cell Rate Algorithm (GCRA, from ATM traffic
//! shaping), the same formulation the `governor` crate uses: instead of a token
//! count refilled by a timer, the bucket keeps one number, the *theoretical
//! arrival time* (TAT) of the next call. With the emission interval
//! `T = round(1e9 / rate)` nanoseconds (at least 1 ns) and the tolerance
//! `tau = T * (burst - 1)`, a call at time `t` is admitted when
//! `t >= TAT - tau`, and then `TAT = max(TAT, t) + T`. Everything is integer
//! nanoseconds relative to the creation instant, so admission is exact: over
//! any interval `[a, a + W]` at most `burst + floor(W / T)` calls are admitted.
//!
//! The module is pure: it reads no clock, every time-dependent method takes
//! `now`. Instants earlier than the creation instant or than a previous call
//! are accepted and saturate; nothing panics on them.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::limiter::TokenBucket;
//! use tokio::time::{Duration, Instant};
//!
//! let t0 = Instant::now();
//! let mut bucket = TokenBucket::new(10.0, 2, t0); // 10/s, bursts of 2
//! assert!(bucket.try_acquire(t0).is_ok());
//! assert!(bucket.try_acquire(t0).is_ok());
//! // Empty: the next token comes one interval (100 ms) later.
//! assert_eq!(bucket.try_acquire(t0), Err(t0 + Duration::from_millis(100)));
//! # }
//! ```

use tokio::time::{Duration, Instant};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A GCRA token bucket: `rate` tokens per second, holding at most `burst`.
///
/// Starts full. See the [module documentation](self) for the algorithm.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    #[cfg(any(test, feature = "internals"))]
    rate: f64,
    burst: u32,
    /// Time zero of all the nanosecond counts below.
    origin: Instant,
    /// Emission interval `T`, in ns.
    interval: u128,
    /// Tolerance `tau = T * (burst - 1)`, in ns.
    tolerance: u128,
    /// Theoretical arrival time, in ns since `origin`.
    tat: u128,
}

impl TokenBucket {
    /// Creates a bucket of `rate` tokens per second (`> 0`) holding at most
    /// `burst` tokens (`>= 1`), full at `now`.
    ///
    /// The emission interval is `round(1e9 / rate)` ns, clamped to at least
    /// 1 ns and at most `u64::MAX` ns (about 584 years).
    ///
    /// # Panics
    ///
    /// If `rate` is not a finite number greater than zero, or `burst` is 0.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        assert!(
            rate.is_finite() && rate > 0.0,
            "TokenBucket rate must be finite and > 0, got {rate}"
        );
        assert!(burst >= 1, "TokenBucket burst must be >= 1");
        // `as` saturates for floats: huge values become u64::MAX.
        let interval = u128::from(((1e9 / rate).round() as u64).max(1));
        TokenBucket {
            #[cfg(any(test, feature = "internals"))]
            rate,
            burst,
            origin: now,
            interval,
            tolerance: interval * u128::from(burst - 1),
            tat: 0,
        }
    }

    /// The configured rate, in tokens per second.
    #[cfg(any(test, feature = "internals"))]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The configured burst: how many tokens a full bucket holds.
    #[cfg(any(test, feature = "internals"))]
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Takes one token at `now`: `Ok(())`, or `Err(at)` where `at` is the
    /// exact instant from which a call would be admitted.
    pub fn try_acquire(&mut self, now: Instant) -> Result<(), Instant> {
        let t = self.elapsed(now);
        self.check_at(t)?;
        self.tat = self.tat.max(t) + self.interval;
        Ok(())
    }

    /// What [`try_acquire`](Self::try_acquire) would answer at `now`, without
    /// taking a token.
    pub fn check(&self, now: Instant) -> Result<(), Instant> {
        self.check_at(self.elapsed(now))
    }

    /// Whole tokens available at `now` (`0..=burst`): how many calls at `now`
    /// in a row would be admitted. For stats.
    pub fn available(&self, now: Instant) -> u32 {
        let t = self.elapsed(now);
        let base = self.tat.max(t);
        let limit = t + self.tolerance;
        if base > limit {
            return 0;
        }
        let n = (limit - base) / self.interval + 1;
        u32::try_from(n).unwrap_or(u32::MAX).min(self.burst)
    }

    fn check_at(&self, t: u128) -> Result<(), Instant> {
        // Admit when t >= TAT - tau, written without a subtraction that could
        // underflow.
        if self.tat <= t + self.tolerance {
            Ok(())
        } else {
            Err(self.instant_at(self.tat - self.tolerance))
        }
    }

    /// Nanoseconds from the creation instant to `now`, 0 if `now` is earlier.
    fn elapsed(&self, now: Instant) -> u128 {
        now.saturating_duration_since(self.origin).as_nanos()
    }

    fn instant_at(&self, ns: u128) -> Instant {
        let secs = u64::try_from(ns / NANOS_PER_SEC).unwrap_or(u64::MAX);
        // The remainder is below 1e9, so it fits a u32.
        let nanos = (ns % NANOS_PER_SEC) as u32;
        let offset = Duration::new(secs, nanos);
        // Only unreachable rates overflow the clock; answer "very late" then,
        // the way tokio's own far-future instant does (30 years).
        self.origin
            .checked_add(offset)
            .unwrap_or_else(|| self.origin + Duration::from_secs(86_400 * 365 * 30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    #[test]
    fn fresh_bucket_admits_exactly_burst_at_one_instant() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 5, t0);
        assert_eq!(b.available(t0), 5);
        for _ in 0..5 {
            assert_eq!(b.try_acquire(t0), Ok(()));
        }
        assert_eq!(b.available(t0), 0);
        // Next token one interval (100 ms) after the start.
        assert_eq!(b.try_acquire(t0), Err(t0 + Duration::from_millis(100)));
        assert_eq!(b.rate(), 10.0);
        assert_eq!(b.burst(), 5);
    }

    #[test]
    fn interval_is_rounded_to_whole_nanoseconds() {
        let t0 = Instant::now();
        assert_eq!(TokenBucket::new(3.0, 1, t0).interval, 333_333_333);
        assert_eq!(TokenBucket::new(1.5, 1, t0).interval, 666_666_667);
        assert_eq!(TokenBucket::new(1e12, 1, t0).interval, 1);
        assert_eq!(
            TokenBucket::new(1e-30, 1, t0).interval,
            u128::from(u64::MAX)
        );
    }

    #[test]
    fn err_instant_is_exactly_when_a_retry_succeeds() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3.0, 2, t0);
        let t1 = t0 + Duration::from_millis(50);
        b.try_acquire(t1).unwrap();
        b.try_acquire(t1).unwrap();
        let at = b.try_acquire(t1).unwrap_err();
        // TAT = 50 ms + 2T, tau = T: the next call may go at 50 ms + T.
        assert_eq!(at, t1 + ns(333_333_333));
        assert_eq!(b.check(at - ns(1)), Err(at));
        assert_eq!(b.try_acquire(at - ns(1)), Err(at));
        assert_eq!(b.check(at), Ok(()));
        assert_eq!(b.try_acquire(at), Ok(()));
        let next = b.try_acquire(at).unwrap_err();
        assert_eq!(next, at + ns(333_333_333));
    }

    #[test]
    fn check_does_not_take_and_available_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000.0, 3, t0); // T = 1 ms
        for _ in 0..10 {
            assert_eq!(b.check(t0), Ok(()));
        }
        assert_eq!(b.available(t0), 3);
        b.try_acquire(t0).unwrap();
        b.try_acquire(t0).unwrap();
        assert_eq!(b.available(t0), 1);
        assert_eq!(b.available(t0 + ns(999_999)), 1);
        assert_eq!(b.available(t0 + Duration::from_millis(1)), 2);
        assert_eq!(b.available(t0 + Duration::from_millis(2)), 3);
        assert_eq!(b.available(t0 + Duration::from_secs(60)), 3);
    }

    #[test]
    fn steady_overload_admits_burst_plus_rate_times_duration() {
        // Arrivals every T/2 (twice the allowed rate) from t0 to t0 + n*T
        // inclusive: exactly burst + n are admitted.
        let t0 = Instant::now();
        let interval = 10_000_000u64; // T = 10 ms, rate 100/s
        for burst in [1u32, 4, 25] {
            let mut b = TokenBucket::new(100.0, burst, t0);
            let n = 1000u64;
            let admitted = (0..=2 * n)
                .filter(|k| b.try_acquire(t0 + ns(k * interval / 2)).is_ok())
                .count() as u64;
            assert_eq!(admitted, u64::from(burst) + n, "burst {burst}");
        }
    }

    #[test]
    fn earlier_instants_saturate_without_panicking() {
        let t0 = Instant::now();
        let start = t0 + Duration::from_secs(1);
        let mut b = TokenBucket::new(1.0, 2, start);
        // Before creation: treated as the creation instant.
        assert_eq!(b.try_acquire(t0), Ok(()));
        assert_eq!(b.available(t0), 1);
        assert_eq!(b.try_acquire(start + Duration::from_secs(5)), Ok(()));
        // Back in time after a later call: just refused, no panic.
        assert_eq!(b.try_acquire(t0), Err(start + Duration::from_secs(5)));
        assert_eq!(b.available(t0), 0);
        assert!(b.check(t0).is_err());
    }

    proptest! {
        /// Over every window [a, a + W], GCRA admits at most burst + floor(W / T).
        #[test]
        fn any_window_admits_at_most_burst_plus_w_over_t(
            rate in 1.0f64..1e6,
            burst in 1u32..8,
            gaps in prop::collection::vec(0u64..3_000_000, 1..200),
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(rate, burst, t0);
            let interval = b.interval;
            let mut t = 0u64;
            let mut admitted = Vec::new();
            for gap in gaps {
                // Gap 0 repeats an instant; scale the rest around T.
                t += gap * (interval as u64) / 1_000_000;
                let ok = b.try_acquire(t0 + ns(t)).is_ok();
                prop_assert!(b.available(t0 + ns(t)) <= burst);
                if ok {
                    admitted.push(u128::from(t));
                }
            }
            for i in 0..admitted.len() {
                for j in i..admitted.len() {
                    let count = (j - i + 1) as u128;
                    let allowed = u128::from(burst) + (admitted[j] - admitted[i]) / interval;
                    prop_assert!(count <= allowed, "{count} admitted in [{}, {}]", admitted[i], admitted[j]);
                }
            }
        }

        /// Unordered instants (also before the origin) never panic, and Err
        /// always names a strictly later instant.
        #[test]
        fn unordered_instants_never_panic(
            offsets in prop::collection::vec(0u64..10_000_000_000, 1..100),
        ) {
            let t0 = Instant::now();
            let start = t0 + Duration::from_secs(1);
            let mut b = TokenBucket::new(2.0, 3, start);
            for off in offsets {
                let now = t0 + ns(off);
                if let Err(at) = b.try_acquire(now) {
                    prop_assert!(at > now);
                    prop_assert_eq!(b.available(now), 0);
                }
            }
        }
    }
}
