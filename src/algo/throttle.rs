//! Client-side throttling of one node (optional): the adaptive throttling
//! of Google's SRE book ("Handling Overload"; Envoy's admission control is
//! the same scheme).
//!
//! A backend that rejects cheaply (a 429 or 503 in a millisecond) still
//! pays for every rejection. Over a sliding window the client counts the
//! `requests` it attempted and the `accepts` the backend took, and drops a
//! new request locally with probability
//! `p = max(0, (requests - K * accepts) / (requests + 1))`: nothing while
//! the backend accepts more than `1 / K` of the attempts, then about `K`
//! times what it accepts, enough to see at once when it recovers. Dropped
//! requests count as requests, so `p` rises while it refuses everything.
//!
//! The window is a ring of [`SLOTS`] slots; a slot's counts leave it one
//! `window` after the slot began. Defaults: `K = 2` (the book's),
//! `window = 30 s` (Envoy's). "Accepted" is the caller's to say: the
//! engine records a pushback (429, 503) as not accepted. Pure: every
//! method takes `now`, the draw takes the caller's rng.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::throttle::{Throttle, ThrottleConfig};
//! use rand::{rngs::SmallRng, SeedableRng};
//! use tokio::time::Instant;
//!
//! let now = Instant::now();
//! let mut rng = SmallRng::seed_from_u64(1);
//! let mut t = Throttle::new(ThrottleConfig::default(), now);
//! for _ in 0..10 {
//!     t.record(true, now);
//! }
//! assert_eq!(t.probability(now), 0.0);
//! assert!(!t.should_throttle(&mut rng, now));
//! # }
//! ```

use rand::Rng;
use tokio::time::{Duration, Instant};

use crate::algo::time;

/// Number of slots the window is split into.
pub const SLOTS: u64 = 30;

/// Tuning of the adaptive client-side throttle (`Throttle`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ThrottleConfig {
    /// How many times what the backend accepts the client still sends;
    /// in `[1, 100]`.
    pub k: f64,
    /// Length of the sliding window; greater than zero.
    pub window: Duration,
}

impl Default for ThrottleConfig {
    /// `k: 2.0`, `window: 30 s`; see `docs/reference/config.md`.
    fn default() -> Self {
        ThrottleConfig {
            k: 2.0,
            window: Duration::from_secs(30),
        }
    }
}

impl ThrottleConfig {
    /// Checks the fields; the error names the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(1.0..=100.0).contains(&self.k) {
            return Err(format!("k must be in [1, 100], got {}", self.k));
        }
        if self.window.is_zero() {
            return Err("window must be greater than zero".into());
        }
        time::bounded("window", self.window)?;
        Ok(())
    }
}

/// Counts of one slot of the ring.
#[derive(Debug, Clone, Copy, Default)]
struct ThrottleCounts {
    /// Absolute slot number these counts belong to.
    index: u64,
    requests: u64,
    accepts: u64,
}

/// Adaptive throttling of one node. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Throttle {
    config: ThrottleConfig,
    origin: Instant,
    /// Length of one slot, in ns (at least 1).
    slot_ns: u128,
    /// Latest slot number seen.
    head: u64,
    slots: [ThrottleCounts; SLOTS as usize],
}

impl Throttle {
    /// An empty throttle whose slots are counted from `now`.
    ///
    /// # Panics
    ///
    /// If `config` fails [`ThrottleConfig::validate`].
    pub fn new(config: ThrottleConfig, now: Instant) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid ThrottleConfig: {e}");
        }
        let slot_ns = config.window.as_nanos().div_ceil(u128::from(SLOTS)).max(1);
        Throttle {
            config,
            origin: now,
            slot_ns,
            head: 0,
            slots: [ThrottleCounts::default(); SLOTS as usize],
        }
    }

    /// The configuration this throttle was made with.
    #[cfg(any(test, feature = "internals"))]
    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// Whether to drop a request about to be sent at `now`: `true` with
    /// probability [`probability`](Self::probability). A dropped request
    /// counts as a request (not accepted); one that goes is counted by
    /// [`record`](Self::record) when it ends.
    pub fn should_throttle<R: Rng + ?Sized>(&mut self, rng: &mut R, now: Instant) -> bool {
        let p = self.probability(now);
        // No draw when p is 0, so an unthrottled node costs no randomness.
        let drop = p > 0.0 && rng.random::<f64>() < p;
        if drop {
            let slot = self.slot_mut(now);
            slot.requests = slot.requests.saturating_add(1);
        }
        drop
    }

    /// Counts a request that was sent and has ended at `now`, accepted by
    /// the backend or not.
    pub fn record(&mut self, accepted: bool, now: Instant) {
        let slot = self.slot_mut(now);
        slot.requests = slot.requests.saturating_add(1);
        slot.accepts = slot.accepts.saturating_add(u64::from(accepted));
    }

    /// `max(0, (requests - K * accepts) / (requests + 1))` over the window
    /// at `now`.
    pub fn probability(&self, now: Instant) -> f64 {
        let (requests, accepts) = self.counts(now);
        let requests = requests as f64;
        ((requests - self.config.k * accepts as f64) / (requests + 1.0)).max(0.0)
    }

    /// Requests and accepts in the window at `now`, for stats.
    pub fn counts(&self, now: Instant) -> (u64, u64) {
        let current = self.slot_of(now).max(self.head);
        self.slots
            .iter()
            .filter(|s| current - s.index < SLOTS)
            .fold((0, 0), |(q, a), s| {
                (q.saturating_add(s.requests), a.saturating_add(s.accepts))
            })
    }

    /// ThrottleCounts number of `now` counted from the origin.
    fn slot_of(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.slot_ns).unwrap_or(u64::MAX)
    }

    /// The slot of `now` (never before the latest seen), emptied first if it
    /// last held an older slot's counts.
    fn slot_mut(&mut self, now: Instant) -> &mut ThrottleCounts {
        let index = self.slot_of(now).max(self.head);
        self.head = index;
        let slot = &mut self.slots[(index % SLOTS) as usize];
        if slot.index != index {
            *slot = ThrottleCounts {
                index,
                ..ThrottleCounts::default()
            };
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn default_numbers_and_validation() {
        let c = ThrottleConfig::default();
        assert_eq!((c.k, c.window), (2.0, Duration::from_secs(30)));
        assert_eq!(c.validate(), Ok(()));
        let bad = |k: f64, window: Duration| ThrottleConfig { k, window }.validate().unwrap_err();
        assert!(bad(0.5, c.window).contains("k"));
        assert!(bad(f64::NAN, c.window).contains("k"));
        assert!(bad(2.0, Duration::ZERO).contains("window"));
        assert!(bad(2.0, Duration::MAX).contains("window"));
    }

    #[test]
    fn probability_follows_the_formula_exactly() {
        let t0 = Instant::now();
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        assert_eq!(t.probability(t0), 0.0);
        // 10 requests, 5 accepted: 10 - 2 * 5 = 0.
        for i in 0..10 {
            t.record(i % 2 == 0, t0);
        }
        assert_eq!(t.counts(t0), (10, 5));
        assert_eq!(t.probability(t0), 0.0);
        // 20 requests, 5 accepted: (20 - 10) / 21.
        for _ in 0..10 {
            t.record(false, t0);
        }
        assert_eq!(t.probability(t0), 10.0 / 21.0);
        // K = 1.1 throttles earlier: (20 - 5.5) / 21.
        let mut t = Throttle::new(
            ThrottleConfig {
                k: 1.1,
                ..ThrottleConfig::default()
            },
            t0,
        );
        for i in 0..20 {
            t.record(i < 5, t0);
        }
        assert_eq!(t.probability(t0), (20.0 - 1.1 * 5.0) / 21.0);
    }

    #[test]
    fn seeded_draws_and_dropped_requests_count() {
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        // The backend refuses everything: p = 10 / 11 and rising, as each
        // local drop counts as a request too.
        for _ in 0..10 {
            t.record(false, t0);
        }
        let drops: String = (0..20)
            .map(|_| {
                if t.should_throttle(&mut rng, t0) {
                    'x'
                } else {
                    '.'
                }
            })
            .collect();
        let dropped = drops.matches('x').count() as u64;
        assert_eq!(t.counts(t0), (10 + dropped, 0));
        // Same seed, same sequence.
        let mut rng2 = SmallRng::seed_from_u64(7);
        let mut t2 = Throttle::new(ThrottleConfig::default(), t0);
        for _ in 0..10 {
            t2.record(false, t0);
        }
        let again: String = (0..20)
            .map(|_| {
                if t2.should_throttle(&mut rng2, t0) {
                    'x'
                } else {
                    '.'
                }
            })
            .collect();
        assert_eq!(drops, again);
        assert_eq!(drops, "xxxx.xxx.xxxxxxxxxxx");
        assert_eq!(t.probability(t0), 28.0 / 29.0);
    }

    #[test]
    fn a_healthy_node_is_never_throttled_and_draws_nothing() {
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut probe = rng.clone();
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        for i in 0..1000 {
            // Two in three accepted: 1000 - 2 * 667 < 0.
            t.record(i % 3 != 2, t0);
            assert!(!t.should_throttle(&mut rng, t0));
        }
        // The rng was never drawn from.
        assert_eq!(rng.random::<u64>(), probe.random::<u64>());
    }

    #[test]
    fn counts_slide_out_of_the_window() {
        let t0 = Instant::now();
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        for _ in 0..10 {
            t.record(false, t0);
        }
        for _ in 0..4 {
            t.record(true, secs(t0, 15));
        }
        // (14 - 8) / 15 until the t0 slot leaves, exactly 30 s on.
        let almost = secs(t0, 30) - Duration::from_nanos(1);
        assert_eq!(t.probability(almost), 6.0 / 15.0);
        assert_eq!(t.counts(secs(t0, 30)), (4, 4));
        assert_eq!(t.probability(secs(t0, 30)), 0.0);
        assert_eq!(t.counts(secs(t0, 45)), (0, 0));
        // An instant before the latest recorded counts in the latest slot.
        t.record(false, secs(t0, 45));
        t.record(false, t0);
        assert_eq!(t.counts(secs(t0, 45)), (2, 0));
        assert_eq!(t.counts(secs(t0, 74)), (2, 0));
        assert_eq!(t.counts(secs(t0, 75)), (0, 0));
    }

    #[test]
    fn throttling_sends_about_k_times_the_accepts() {
        // A backend that accepts 10 requests per second and rejects the
        // rest, offered 100 per second for 10 min: the client sends about K
        // times what is accepted, about 20 of the 100. A band: the draws
        // are random (seeded).
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(42);
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        let (mut sent, mut accepted, mut total) = (0u64, 0u64, 0u64);
        let mut this_second = 0u64;
        for i in 0..60_000u64 {
            if i % 100 == 0 {
                this_second = 0;
            }
            let now = t0 + Duration::from_millis(i * 10);
            total += 1;
            if t.should_throttle(&mut rng, now) {
                continue;
            }
            sent += 1;
            let ok = this_second < 10;
            this_second += u64::from(ok);
            accepted += u64::from(ok);
            t.record(ok, now);
        }
        let ratio = sent as f64 / accepted as f64;
        assert!(
            (1.8..=2.6).contains(&ratio),
            "sent {sent}, accepted {accepted}"
        );
        assert!(sent * 100 <= total * 30, "sent {sent} of {total}");
        assert!(accepted * 100 >= 6_000 * 95, "accepted {accepted}");
    }
}
