//! The retry decision: what becomes of a task whose last attempt failed.
//!
//! One pure policy, asked whenever a task's last outstanding attempt ends
//! without a success (an answer, a hedge's bounce, the watchdog, a cancel),
//! in the shape of tower's retry `Policy`. The rules, in order:
//! 0. an attempt cut by the task's own deadline fails it (`DeadlineExceeded`);
//! 1. the failure must be retryable ([`AttemptOutcome::is_retryable`]);
//! 2. at most `max_retries` retries;
//! 3. the delay is exponential backoff with full jitter, raised to the
//!    backend's `Retry-After`, capped by `max_retry_after`;
//! 4. a retry that could not start before the deadline fails the task now;
//! 5. the retry budget pays for it, or the task fails (`BudgetExhausted`).
//!
//! All time arithmetic saturates: no `Retry-After` or deadline can panic it.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use std::time::Duration;
//! use actix_dispatch::algo::policy::{Decision, Ended, RetryPolicy};
//! use actix_dispatch::algo::budget::BudgetConfig;
//! use actix_dispatch::{AttemptOutcome, FailReason, Instant};
//! use rand::SeedableRng;
//!
//! let now = Instant::now();
//! let mut policy = RetryPolicy::new(2, Duration::from_millis(25), Duration::from_secs(1),
//!     Duration::from_secs(10), BudgetConfig::default(), now);
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
//! let ended = Ended { last: AttemptOutcome::Status(503), retry_after: Some(Duration::MAX),
//!     retries: 0, idempotent: false, deadline: None };
//! // A hostile Retry-After is capped at max_retry_after.
//! assert_eq!(policy.decide(&ended, now, &mut rng), Decision::Retry { after: Duration::from_secs(10) });
//! let ended = Ended { last: AttemptOutcome::Status(404), ..ended };
//! assert_eq!(policy.decide(&ended, now, &mut rng), Decision::Fail(FailReason::NotRetryable));
//! # }
//! ```

use std::time::Duration;

use tokio::time::Instant;

use super::backoff::Backoff;
use super::budget::{BudgetConfig, RetryBudget};
use super::time;
use crate::outcome::{AttemptOutcome, ErrorKind, FailReason};

/// How a task's last outstanding attempt ended (it did not succeed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ended {
    /// The last failed attempt's outcome.
    pub last: AttemptOutcome,
    /// The backend's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
    /// Retries made so far.
    pub retries: u32,
    /// Whether the task may be retried after an ambiguous error.
    pub idempotent: bool,
    /// The task's deadline, if any.
    pub deadline: Option<Instant>,
}

/// What to do with the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send it again after this delay (the budget has paid for it).
    Retry {
        /// Time to wait before the retry is ready.
        after: Duration,
    },
    /// Answer it with a failure.
    Fail(FailReason),
}

/// The retry policy of one service: rules, backoff and the retry budget.
#[derive(Debug)]
pub struct RetryPolicy {
    max_retries: u32,
    max_retry_after: Duration,
    backoff: Backoff,
    budget: RetryBudget,
}

impl RetryPolicy {
    /// A policy with `max_retries`, backoff from `base` doubling to `max`,
    /// `Retry-After` capped at `max_retry_after`, and a retry budget.
    pub fn new(
        max_retries: u32,
        base: Duration,
        max: Duration,
        max_retry_after: Duration,
        budget: BudgetConfig,
        now: Instant,
    ) -> Self {
        Self {
            max_retries,
            max_retry_after,
            backoff: Backoff::new(base, max),
            budget: RetryBudget::new(budget, now),
        }
    }

    /// A first attempt was sent (the budget earns a share of it).
    pub fn sent(&mut self, now: Instant) {
        self.budget.deposit(now);
    }

    /// Pays for a hedge from the budget; `false` if it cannot.
    pub fn pay_hedge(&mut self, now: Instant) -> bool {
        self.budget.try_withdraw(now)
    }

    /// Retries the budget allows right now.
    pub fn budget_left(&self, now: Instant) -> u32 {
        self.budget.remaining(now)
    }

    /// Decides the fate of a task whose last attempt ended as `ended`.
    pub fn decide<R: rand::Rng + ?Sized>(
        &mut self,
        ended: &Ended,
        now: Instant,
        rng: &mut R,
    ) -> Decision {
        if ended.last == AttemptOutcome::Error(ErrorKind::Deadline) {
            return Decision::Fail(FailReason::DeadlineExceeded);
        }
        if !ended.last.is_retryable(ended.idempotent) {
            return Decision::Fail(FailReason::NotRetryable);
        }
        if ended.retries >= self.max_retries {
            return Decision::Fail(FailReason::RetriesExhausted);
        }
        let mut after = self.backoff.delay(ended.retries, rng);
        if let Some(ra) = ended.retry_after {
            after = after.max(ra.min(self.max_retry_after));
        }
        if ended.deadline.is_some_and(|d| time::add(now, after) >= d) {
            return Decision::Fail(FailReason::DeadlineExceeded);
        }
        if !self.budget.try_withdraw(now) {
            return Decision::Fail(FailReason::BudgetExhausted);
        }
        Decision::Retry { after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy(now: Instant) -> RetryPolicy {
        RetryPolicy::new(
            3,
            ms(100),
            ms(100),
            Duration::from_secs(10),
            BudgetConfig::default(),
            now,
        )
    }

    fn ended(last: AttemptOutcome) -> Ended {
        Ended {
            last,
            retry_after: None,
            retries: 0,
            idempotent: true,
            deadline: None,
        }
    }

    #[test]
    fn retryable_outcomes_by_idempotency() {
        let now = Instant::now();
        let mut p = policy(now);
        let mut rng = SmallRng::seed_from_u64(7);
        let retry = |p: &mut RetryPolicy, rng: &mut SmallRng, last, idempotent| {
            let e = Ended {
                idempotent,
                ..ended(last)
            };
            matches!(p.decide(&e, now, rng), Decision::Retry { .. })
        };
        use AttemptOutcome::{Error, Status};
        for idem in [false, true] {
            assert!(retry(&mut p, &mut rng, Status(503), idem));
            assert!(retry(&mut p, &mut rng, Status(429), idem));
            assert!(retry(&mut p, &mut rng, Error(ErrorKind::Connect), idem));
            assert!(!retry(&mut p, &mut rng, Status(404), idem));
            assert!(!retry(&mut p, &mut rng, Error(ErrorKind::Body), idem));
            assert!(!retry(&mut p, &mut rng, Error(ErrorKind::Invalid), idem));
            for k in [
                ErrorKind::Timeout,
                ErrorKind::Reset,
                ErrorKind::Lost,
                ErrorKind::Panicked,
            ] {
                assert_eq!(retry(&mut p, &mut rng, Error(k), idem), idem, "{k:?}");
            }
        }
    }

    #[test]
    fn an_attempt_cut_by_the_tasks_deadline_fails_the_task_at_once() {
        let now = Instant::now();
        let mut p = policy(now);
        let mut rng = SmallRng::seed_from_u64(7);
        let e = ended(AttemptOutcome::Error(ErrorKind::Deadline));
        assert_eq!(
            p.decide(&e, now, &mut rng),
            Decision::Fail(FailReason::DeadlineExceeded)
        );
        // No retry was paid for it.
        assert_eq!(p.budget_left(now), policy(now).budget_left(now));
    }

    #[test]
    fn stops_at_max_retries() {
        let now = Instant::now();
        let mut p = policy(now);
        let mut rng = SmallRng::seed_from_u64(7);
        let e = Ended {
            retries: 3,
            ..ended(AttemptOutcome::Status(500))
        };
        assert_eq!(
            p.decide(&e, now, &mut rng),
            Decision::Fail(FailReason::RetriesExhausted)
        );
    }

    #[test]
    fn retry_after_is_always_capped_and_never_panics() {
        let now = Instant::now();
        let mut p = policy(now);
        let mut rng = SmallRng::seed_from_u64(7);
        let e = Ended {
            retry_after: Some(Duration::from_secs(u64::MAX)),
            ..ended(AttemptOutcome::Status(429))
        };
        assert_eq!(
            p.decide(&e, now, &mut rng),
            Decision::Retry {
                after: Duration::from_secs(10)
            }
        );
        // With a deadline far away the cap still holds; with one near, the
        // capped wait passes it and the task fails now.
        let far = Ended {
            deadline: Some(now + Duration::from_secs(3600)),
            ..e
        };
        assert_eq!(
            p.decide(&far, now, &mut rng),
            Decision::Retry {
                after: Duration::from_secs(10)
            }
        );
        let near = Ended {
            deadline: Some(now + Duration::from_secs(5)),
            ..e
        };
        assert_eq!(
            p.decide(&near, now, &mut rng),
            Decision::Fail(FailReason::DeadlineExceeded)
        );
        // Extreme backoff settings saturate instead of panicking.
        let mut huge = RetryPolicy::new(
            u32::MAX,
            Duration::MAX,
            Duration::MAX,
            Duration::MAX,
            BudgetConfig::default(),
            now,
        );
        let e = Ended {
            retries: u32::MAX - 1,
            retry_after: Some(Duration::MAX),
            deadline: Some(now + Duration::from_secs(1)),
            ..ended(AttemptOutcome::Status(503))
        };
        assert_eq!(
            huge.decide(&e, now, &mut rng),
            Decision::Fail(FailReason::DeadlineExceeded)
        );
    }

    #[test]
    fn the_budget_pays_for_retries() {
        let now = Instant::now();
        let cfg = BudgetConfig {
            min_per_sec: 0,
            percent: 0.0,
            ..BudgetConfig::default()
        };
        let mut p = RetryPolicy::new(3, ms(1), ms(1), ms(1), cfg, now);
        let mut rng = SmallRng::seed_from_u64(7);
        assert_eq!(
            p.decide(&ended(AttemptOutcome::Status(500)), now, &mut rng),
            Decision::Fail(FailReason::BudgetExhausted)
        );
    }

    #[test]
    fn first_attempts_earn_the_budget_that_hedges_and_retries_spend() {
        let now = Instant::now();
        let budget = BudgetConfig {
            percent: 0.5,
            min_per_sec: 0,
            window: Duration::from_secs(10),
        };
        let mut p = RetryPolicy::new(3, ms(1), ms(1), Duration::from_secs(10), budget, now);
        let mut rng = SmallRng::seed_from_u64(7);
        let e = ended(AttemptOutcome::Status(503));
        // Nothing sent yet: nothing to spend.
        assert_eq!(p.budget_left(now), 0);
        assert!(!p.pay_hedge(now));
        assert_eq!(
            p.decide(&e, now, &mut rng),
            Decision::Fail(FailReason::BudgetExhausted)
        );
        // Four first attempts earn two: one hedge, one retry.
        for _ in 0..4 {
            p.sent(now);
        }
        assert_eq!(p.budget_left(now), 2);
        assert!(p.pay_hedge(now));
        assert_eq!(p.budget_left(now), 1);
        assert!(matches!(
            p.decide(&e, now, &mut rng),
            Decision::Retry { .. }
        ));
        assert_eq!(p.budget_left(now), 0);
        assert!(!p.pay_hedge(now));
    }
}
