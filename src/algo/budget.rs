//! Retry budget for one service.
//!
//! Retries (and hedged requests) are what turn a struggling backend into a
//! dead one: when every call fails and every call is retried three times, the
//! backend sees four times the load exactly when it can least take it. A retry
//! *budget* caps retries to a fraction of the original traffic, plus a small
//! floor so that a quiet service can still retry at all.
//!
//! This is the scheme of tower's `retry::budget` and Finagle's `RetryBudget`:
//! over a sliding window, a retry is allowed while
//!
//! ```text
//! retries_in_window + 1 <= percent * requests_in_window + min_per_sec * window_secs
//! ```
//!
//! As in tower, the window is a ring of 10 slots, each `window / 10` long,
//! counted from the creation instant; a slot's counts leave the window
//! exactly `window` after its start. The floor is
//! `F = min_per_sec * window.as_secs_f64()`.
//!
//! **The bound.** A retry stays in the ring at least as long as any request
//! that paid for it, so no request is spent twice; by induction over blocks
//! of 10 slots, over any time `T` from creation with `N` requests,
//! `retries <= percent * N + min_per_sec * (T + window)` (one window of
//! slack: a floor's worth spent at the start and again as it slides out).
//! An instant earlier than a previous call counts in the latest slot seen,
//! so the bound holds in any order of calls, and nothing panics.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::budget::{BudgetConfig, RetryBudget};
//! use tokio::time::Instant;
//!
//! let t0 = Instant::now();
//! let mut budget = RetryBudget::new(BudgetConfig::default(), t0);
//! budget.deposit(t0); // an original request went out
//! assert!(budget.try_withdraw(t0)); // a retry may go
//! # }
//! ```

use tokio::time::{Duration, Instant};

/// Number of slots the window is split into.
const SLOTS: u64 = 10;

/// Tuning of a service's retry budget (`RetryBudget`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BudgetConfig {
    /// Retries allowed per original request in the window (0.2 = one retry
    /// per five requests). Must be finite and `>= 0`.
    pub percent: f64,
    /// Retries allowed per second of window even with no requests at all.
    pub min_per_sec: u32,
    /// Length of the sliding window. Must be greater than zero.
    pub window: Duration,
}

impl Default for BudgetConfig {
    /// `percent: 0.2` (20 % extra load at most), `min_per_sec: 10`,
    /// `window: 10 s`; so a quiet service may still retry 100 times per
    /// window.
    fn default() -> Self {
        BudgetConfig {
            percent: 0.2,
            min_per_sec: 10,
            window: Duration::from_secs(10),
        }
    }
}

/// Counts of one slot of the ring.
#[derive(Debug, Clone, Copy, Default)]
struct BudgetCounts {
    /// Absolute slot number these counts belong to.
    index: u64,
    requests: u64,
    retries: u64,
}

/// A sliding-window retry budget. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct RetryBudget {
    config: BudgetConfig,
    origin: Instant,
    /// Length of one slot, in ns (at least 1).
    slot_ns: u128,
    /// `min_per_sec * window_secs`.
    floor: f64,
    /// Latest slot number seen.
    head: u64,
    /// The last instant counted and its slot number: a queue counts each
    /// turn's dispatches at one instant, so the division is done once per
    /// turn rather than once per task.
    memo: (Instant, u64),
    slots: [BudgetCounts; SLOTS as usize],
}

impl RetryBudget {
    /// Creates an empty budget whose slots are counted from `now`.
    ///
    /// # Panics
    ///
    /// If `config.window` is zero, or `config.percent` is negative or not
    /// finite.
    pub fn new(config: BudgetConfig, now: Instant) -> Self {
        assert!(!config.window.is_zero(), "RetryBudget window must be > 0");
        assert!(
            config.percent.is_finite() && config.percent >= 0.0,
            "RetryBudget percent must be finite and >= 0, got {}",
            config.percent
        );
        let slot_ns = config.window.as_nanos().div_ceil(u128::from(SLOTS));
        let floor = f64::from(config.min_per_sec) * config.window.as_secs_f64();
        RetryBudget {
            config,
            origin: now,
            memo: (now, 0),
            slot_ns,
            floor,
            head: 0,
            slots: [BudgetCounts::default(); SLOTS as usize],
        }
    }

    /// The configuration this budget was made with.
    #[cfg(any(test, feature = "internals"))]
    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// Counts one original request (first attempt) at `now`.
    pub fn deposit(&mut self, now: Instant) {
        let slot = self.slot_mut(now);
        slot.requests = slot.requests.saturating_add(1);
    }

    /// Asks for one retry (or hedge) at `now`: `true`, and counted, if the
    /// budget allows it; `false` if it is spent.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        if self.remaining(now) == 0 {
            return false;
        }
        let slot = self.slot_mut(now);
        slot.retries = slot.retries.saturating_add(1);
        true
    }

    /// Retries still allowed at `now` (rounded down), for stats.
    pub fn remaining(&self, now: Instant) -> u32 {
        let current = self.current(now);
        let (requests, retries) = self
            .slots
            .iter()
            .filter(|s| current - s.index < SLOTS)
            .fold((0u64, 0u64), |(q, r), s| (q + s.requests, r + s.retries));
        // retries + 1 <= allowance  <=>  retries < floor(allowance).
        let allowance = (self.config.percent * requests as f64 + self.floor).floor();
        // Float to int `as` saturates (and maps NaN to 0).
        let allowance = allowance as u64;
        u32::try_from(allowance.saturating_sub(retries)).unwrap_or(u32::MAX)
    }

    /// BudgetCounts number of `now`, never before the latest one seen.
    fn current(&self, now: Instant) -> u64 {
        self.slot_of(now).max(self.head)
    }

    /// BudgetCounts number of `now` counted from the origin.
    fn slot_of(&self, now: Instant) -> u64 {
        if now == self.memo.0 {
            return self.memo.1;
        }
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.slot_ns).unwrap_or(u64::MAX)
    }

    /// The slot of `now`, emptied first if it last held an older slot's counts.
    fn slot_mut(&mut self, now: Instant) -> &mut BudgetCounts {
        let slot = self.slot_of(now);
        self.memo = (now, slot);
        let index = slot.max(self.head);
        self.head = index;
        let slot = &mut self.slots[(index % SLOTS) as usize];
        if slot.index != index {
            *slot = BudgetCounts {
                index,
                ..BudgetCounts::default()
            };
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(percent: f64, min_per_sec: u32, window_secs: u64) -> BudgetConfig {
        BudgetConfig {
            percent,
            min_per_sec,
            window: Duration::from_secs(window_secs),
        }
    }

    fn drain(b: &mut RetryBudget, now: Instant) -> u64 {
        let mut n = 0;
        while b.try_withdraw(now) {
            n += 1;
        }
        n
    }

    #[test]
    fn a_repeated_instant_finds_the_slot_a_fresh_budget_finds() {
        // The slot of the last instant is kept; any other instant, earlier
        // or later, is computed again.
        let t0 = Instant::now();
        let cfg = config(0.2, 1, 10);
        let mut b = RetryBudget::new(cfg.clone(), t0);
        let times = [2_500u64, 2_500, 900, 2_500, 7_000, 7_000, 100];
        for ms in times {
            let t = t0 + Duration::from_millis(ms);
            b.deposit(t);
            let fresh = RetryBudget::new(cfg.clone(), t0);
            assert_eq!(b.slot_of(t), fresh.slot_of(t), "at {ms} ms");
        }
        // Seven requests in the window: allowance 0.2 * 7 + 10 floors to 11.
        assert_eq!(b.remaining(t0 + Duration::from_millis(7_000)), 11);
    }

    #[test]
    fn default_numbers() {
        assert_eq!(BudgetConfig::default(), config(0.2, 10, 10));
    }

    #[test]
    fn floor_alone_allows_min_per_sec_times_window() {
        let t0 = Instant::now();
        let mut b = RetryBudget::new(BudgetConfig::default(), t0);
        assert_eq!(b.remaining(t0), 100);
        assert_eq!(drain(&mut b, t0), 100);
        assert_eq!(b.remaining(t0), 0);
        // Still spent until the first slot leaves the window, exactly 10 s on.
        let almost = t0 + Duration::from_secs(10) - Duration::from_nanos(1);
        assert!(!b.try_withdraw(almost));
        assert_eq!(drain(&mut b, t0 + Duration::from_secs(10)), 100);
    }

    #[test]
    fn percent_of_requests_without_floor() {
        let t0 = Instant::now();
        let mut b = RetryBudget::new(config(0.2, 0, 10), t0);
        assert!(!b.try_withdraw(t0));
        for _ in 0..1000 {
            b.deposit(t0);
        }
        assert_eq!(b.remaining(t0), 200);
        assert_eq!(drain(&mut b, t0), 200);
    }

    #[test]
    fn slots_expire_as_time_advances() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let mut b = RetryBudget::new(config(0.5, 0, 10), t0);
        for _ in 0..10 {
            b.deposit(t0);
        }
        assert_eq!(drain(&mut b, secs(1)), 5);
        for _ in 0..20 {
            b.deposit(secs(5));
        }
        assert_eq!(b.remaining(secs(5)), 10);
        assert_eq!(b.remaining(secs(9)), 10);
        // At 10 s the t0 slot (10 requests) leaves; the 1 s retries stay.
        assert_eq!(b.remaining(secs(10)), 5);
        assert_eq!(drain(&mut b, secs(10)), 5);
        // At 11 s the 1 s slot (5 retries) leaves.
        assert_eq!(b.remaining(secs(11)), 5);
        // At 15 s the 5 s slot (20 requests) leaves; the 10 s retries stay.
        assert_eq!(b.remaining(secs(15)), 0);
        b.deposit(secs(15));
        b.deposit(secs(15));
        assert_eq!(b.remaining(secs(19)), 0); // 1 allowed, 5 counted
        assert_eq!(b.remaining(secs(20)), 1); // the 10 s retries left
        assert_eq!(b.remaining(secs(25)), 0);
    }

    #[test]
    fn fractional_window_and_floor() {
        let t0 = Instant::now();
        let cfg = BudgetConfig {
            percent: 0.0,
            min_per_sec: 3,
            window: Duration::from_millis(1500),
        };
        let mut b = RetryBudget::new(cfg, t0);
        assert_eq!(b.slot_ns, 150_000_000);
        assert_eq!(drain(&mut b, t0), 4); // floor(3 * 1.5)
        assert_eq!(drain(&mut b, t0 + Duration::from_millis(1499)), 0);
        assert_eq!(drain(&mut b, t0 + Duration::from_millis(1500)), 4);
    }

    #[test]
    fn earlier_instants_count_in_the_latest_slot() {
        let t0 = Instant::now();
        let start = t0 + Duration::from_secs(3);
        let mut b = RetryBudget::new(config(1.0, 0, 10), start);
        b.deposit(t0); // before creation: slot 0
        b.deposit(start + Duration::from_secs(20));
        b.deposit(start); // late report: counts in slot 20 too
        assert_eq!(b.remaining(start + Duration::from_secs(20)), 2);
        assert_eq!(b.remaining(t0), 2);
        assert!(b.try_withdraw(t0));
        assert_eq!(b.remaining(start + Duration::from_secs(29)), 1);
        assert_eq!(b.remaining(start + Duration::from_secs(30)), 0);
    }

    #[test]
    #[should_panic(expected = "window")]
    fn zero_window_panics() {
        RetryBudget::new(config(0.2, 10, 0), Instant::now());
    }

    proptest! {
        /// Total outage: every request fails and is retried as often as the
        /// budget allows, immediately and at random later instants. Checks
        /// the documented bound exactly, and its simpler time form.
        #[test]
        fn outage_retries_stay_within_documented_bound(
            percent in prop_oneof![Just(0.0), Just(0.2), Just(1.0), 0.0f64..2.0],
            min_per_sec in 0u32..20,
            window_ms in prop_oneof![Just(1000u64), Just(10_000), 1u64..15_000],
            events in prop::collection::vec((0u64..60_000, any::<bool>()), 1..400),
        ) {
            let t0 = Instant::now();
            let cfg = BudgetConfig { percent, min_per_sec, window: Duration::from_millis(window_ms) };
            let mut b = RetryBudget::new(cfg, t0);
            let mut events = events;
            events.sort_unstable();
            let (mut requests, mut retries) = (0u64, 0u64);
            for &(at_ms, is_request) in &events {
                let now = t0 + Duration::from_millis(at_ms);
                if is_request {
                    b.deposit(now);
                    requests += 1;
                }
                retries += drain(&mut b, now);
                prop_assert_eq!(b.remaining(now), 0);
            }
            let t_ns = u128::from(events.last().unwrap().0) * 1_000_000;
            let k = (t_ns / b.slot_ns + 1) as f64;
            let exact = percent * requests as f64 + b.floor * (k / SLOTS as f64).ceil();
            prop_assert!(retries as f64 <= exact + 1e-6, "{} > {}", retries, exact);
            let t_secs = t_ns as f64 / 1e9;
            let simple = percent * requests as f64
                + f64::from(min_per_sec) * (t_secs + window_ms as f64 / 1000.0);
            prop_assert!(retries as f64 <= simple + 1e-6, "{} > {}", retries, simple);
        }
    }
}
