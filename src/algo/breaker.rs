//! Circuit breaker for one backend node: [`Breaker`], three states.
//!
//! * **Closed**: traffic flows. Trips to Open after `consecutive_failures`
//!   in a row (Finagle's failure accrual, Envoy's consecutive 5xx) or when
//!   the failure rate over the last `window` calls reaches `failure_rate`,
//!   once `min_calls` are in it (resilience4j).
//! * **Open** until an instant: everything is rejected. The period starts
//!   at `open_for` and doubles on each successive trip up to `max_open_for`
//!   (Envoy's ejection back-off), back to `open_for` after `reset_after`
//!   of clean Closed time.
//! * **HalfOpen**: up to `half_open_probes` probes go. All succeed: Closed.
//!   One fails, or they have not all reported within `probe_timeout` of the
//!   first: Open again, for a doubled period.
//!
//! Every state change bumps a generation carried by each [`Permit`]: a late
//! answer of an older generation is ignored. What counts as a failure is
//! the caller's decision; only `slow_call` is judged here. Pure: every
//! method takes `now`; [`Breaker::next_change`] says when to set a timer.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::breaker::{Breaker, BreakerConfig, CallOutcome};
//! use tokio::time::{Duration, Instant};
//!
//! let mut breaker = Breaker::new(BreakerConfig::default());
//! let now = Instant::now();
//! match breaker.admit(now) {
//!     Ok(permit) => {
//!         // ... send the call, then:
//!         let latency = Duration::from_millis(12);
//!         if let Some(t) = breaker.record(permit, CallOutcome::Failure, latency, now + latency) {
//!             log::warn!("breaker {:?} -> {:?}: {}", t.from, t.to, t.reason);
//!         }
//!     }
//!     Err(until) => { /* pick another node; this one is closed until `until` */ }
//! }
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;

use tokio::time::{Duration, Instant};

/// Tuning of a node's circuit breaker (`Breaker`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Closed -> Open after this many failures in a row; 0 disables the rule.
    pub consecutive_failures: u32,
    /// Closed -> Open when failures / calls over the window reaches this (and
    /// at least one call failed). Above 1.0 disables the rule.
    pub failure_rate: f64,
    /// Size of the sliding window: the last `window` calls. 0 disables the
    /// rate rule.
    pub window: u32,
    /// The rate rule applies only once this many calls are in the window.
    pub min_calls: u32,
    /// A call slower than this (strictly) counts as a failure. `None`: latency
    /// is not judged.
    pub slow_call: Option<Duration>,
    /// The first open period.
    pub open_for: Duration,
    /// Cap of the doubling open period (it caps `open_for` too).
    pub max_open_for: Duration,
    /// After this long Closed without a trip, the open period is back to
    /// `open_for`.
    pub reset_after: Duration,
    /// Probes admitted in HalfOpen; all must succeed to close. 0 acts as 1.
    pub half_open_probes: u32,
    /// HalfOpen -> Open when the probes have not all reported within this,
    /// counted from the first probe handed out, so a breaker is never stuck.
    pub probe_timeout: Duration,
}

impl Default for BreakerConfig {
    /// 5 consecutive failures, or a failure rate of 0.5 over the last 20 calls
    /// once 10 are in; no slow-call rule; open 5 s, doubling up to 60 s, back
    /// to 5 s after 60 s of clean Closed time; 1 probe, reporting within 10 s.
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            window: 20,
            min_calls: 10,
            slow_call: None,
            open_for: Duration::from_secs(5),
            max_open_for: Duration::from_secs(60),
            reset_after: Duration::from_secs(60),
            half_open_probes: 1,
            probe_timeout: Duration::from_secs(10),
        }
    }
}

/// State of a [`Breaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows.
    Closed,
    /// Everything is rejected until `until`.
    Open {
        /// When the breaker goes HalfOpen.
        until: Instant,
    },
    /// A limited number of probes are let through.
    HalfOpen,
}

/// Leave to send one call, from [`Breaker::admit`]; hand it back to
/// [`Breaker::record`] with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    generation: u64,
    probe: bool,
}

impl Permit {
    /// Whether this call is a HalfOpen probe.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

/// Outcome of a call, as judged by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The call succeeded (it may still count as a failure if slow).
    Success,
    /// The call failed.
    Failure,
}

/// A state change, for logs and stats.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// State before.
    pub from: BreakerState,
    /// State after.
    pub to: BreakerState,
    /// Why.
    pub reason: TransitionReason,
}

/// Why a [`Transition`] happened.
#[derive(Debug, Clone, PartialEq)]
pub enum TransitionReason {
    /// Closed -> Open: this many failures in a row.
    ConsecutiveFailures(u32),
    /// Closed -> Open: the failure rate over the window reached the threshold.
    FailureRate {
        /// Failures in the window.
        failures: u32,
        /// Calls in the window.
        calls: u32,
    },
    /// Open -> HalfOpen: the open period is over.
    OpenElapsed,
    /// HalfOpen -> Closed: all probes succeeded.
    ProbesSucceeded,
    /// HalfOpen -> Open: a probe failed.
    ProbeFailed,
    /// HalfOpen -> Open: the probes did not all report within `probe_timeout`.
    ProbeTimeout,
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConsecutiveFailures(n) => write!(f, "{n} consecutive failures"),
            Self::FailureRate { failures, calls } => {
                let rate = f64::from(*failures) / f64::from((*calls).max(1));
                write!(f, "failure rate {failures}/{calls} = {rate:.2}")
            }
            Self::OpenElapsed => f.write_str("open period elapsed"),
            Self::ProbesSucceeded => f.write_str("probes succeeded"),
            Self::ProbeFailed => f.write_str("probe failed"),
            Self::ProbeTimeout => f.write_str("probes did not report within the probe timeout"),
        }
    }
}

/// A circuit breaker for one node. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
    generation: u64,
    /// Closed: outcomes of the last calls, oldest first, `true` = failure.
    window: VecDeque<bool>,
    window_failures: u32,
    consecutive: u32,
    /// Period of the latest trip; `None` when the next trip uses `open_for`.
    last_period: Option<Duration>,
    /// When the breaker last entered Closed from HalfOpen.
    closed_at: Option<Instant>,
    /// HalfOpen: probes handed out, probes succeeded, report deadline.
    probes_issued: u32,
    probes_ok: u32,
    probe_deadline: Option<Instant>,
    trips: u64,
}

impl Breaker {
    /// A Closed breaker with an empty window.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: BreakerState::Closed,
            generation: 0,
            window: VecDeque::new(),
            window_failures: 0,
            consecutive: 0,
            last_period: None,
            closed_at: None,
            probes_issued: 0,
            probes_ok: 0,
            probe_deadline: None,
            trips: 0,
        }
    }

    /// The configuration.
    #[cfg(any(test, feature = "internals"))]
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Advances time-based transitions (Open -> HalfOpen when `until` has
    /// passed; HalfOpen -> Open on probe timeout) and returns the transition if
    /// one happened. Also forgets the doubling after `reset_after` of Closed.
    pub fn poll(&mut self, now: Instant) -> Option<Transition> {
        if self.state == BreakerState::Closed {
            if let (Some(_), Some(closed_at)) = (self.last_period, self.closed_at) {
                if now.saturating_duration_since(closed_at) >= self.config.reset_after {
                    self.last_period = None;
                }
            }
        }
        match self.pending(now)? {
            TransitionReason::OpenElapsed => {
                Some(self.enter(BreakerState::HalfOpen, TransitionReason::OpenElapsed, now))
            }
            reason => Some(self.trip(reason, now)),
        }
    }

    /// What [`admit`](Self::admit) would answer at `now`, without changing
    /// anything: `Ok(is_probe)` or `Err(closed to traffic until)`.
    #[cfg(any(test, feature = "internals"))]
    pub fn peek(&self, now: Instant) -> Result<bool, Instant> {
        match (self.pending(now), self.state) {
            (Some(TransitionReason::OpenElapsed), _) => Ok(true),
            (Some(_), _) => Err(super::time::add(now, self.next_period())),
            (None, BreakerState::Closed) => Ok(false),
            (None, BreakerState::Open { until }) => Err(until),
            (None, BreakerState::HalfOpen) if self.probes_issued < self.probes() => Ok(true),
            (None, BreakerState::HalfOpen) => Err(self.probe_deadline.unwrap_or(now)),
        }
    }

    /// Asks to send one call at `now`; calls [`poll`](Self::poll) first.
    /// Closed: `Ok(permit)`. Open: `Err(until)`. HalfOpen: `Ok(probe permit)`
    /// while fewer than `half_open_probes` probes were handed out in this
    /// half-open period, else `Err(when the probe timeout ends)`.
    pub fn admit(&mut self, now: Instant) -> Result<Permit, Instant> {
        self.poll(now);
        let permit = |probe| Permit {
            generation: self.generation,
            probe,
        };
        match self.state {
            BreakerState::Closed => Ok(permit(false)),
            BreakerState::Open { until } => Err(until),
            BreakerState::HalfOpen if self.probes_issued < self.probes() => {
                let permit = permit(true);
                self.probes_issued += 1;
                if self.probe_deadline.is_none() {
                    self.probe_deadline = Some(super::time::add(now, self.config.probe_timeout));
                }
                Ok(permit)
            }
            BreakerState::HalfOpen => Err(self.probe_deadline.unwrap_or(now)),
        }
    }

    /// Records the outcome of a call admitted with `permit`; calls
    /// [`poll`](Self::poll) first. Outcomes of permits from an older
    /// generation (issued before the last state change) are ignored. A call
    /// slower than `slow_call` counts as a failure. Returns the transition if
    /// one happened.
    pub fn record(
        &mut self,
        permit: Permit,
        outcome: CallOutcome,
        latency: Duration,
        now: Instant,
    ) -> Option<Transition> {
        let polled = self.poll(now);
        if permit.generation != self.generation {
            return polled; // a poll transition also makes the permit stale
        }
        let failed = outcome == CallOutcome::Failure
            || self.config.slow_call.is_some_and(|slow| latency > slow);
        match self.state {
            BreakerState::Closed if !permit.probe => self.record_closed(failed, now),
            BreakerState::HalfOpen if permit.probe && failed => {
                Some(self.trip(TransitionReason::ProbeFailed, now))
            }
            BreakerState::HalfOpen if permit.probe => {
                self.probes_ok += 1;
                (self.probes_ok >= self.probes()).then(|| {
                    self.enter(BreakerState::Closed, TransitionReason::ProbesSucceeded, now)
                })
            }
            _ => None,
        }
    }

    /// The state as of the last `poll`, `admit` or `record`.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// How many times the breaker went to Open (from Closed or HalfOpen).
    /// A lifetime counter: [`reset`](Self::reset) keeps it.
    pub fn trips(&self) -> u64 {
        self.trips
    }

    /// While Open, the current open period; otherwise the period the next
    /// trip will use (as of the last `poll`, `admit` or `record`).
    #[cfg(any(test, feature = "internals"))]
    pub fn current_open_for(&self) -> Duration {
        match (self.state, self.last_period) {
            (BreakerState::Open { .. }, Some(period)) => period,
            _ => self.next_period(),
        }
    }

    /// The next instant at which time alone changes the state (Open's
    /// `until`, or the probe deadline), for an actor to set one timer.
    #[cfg(any(test, feature = "internals"))]
    pub fn next_change(&self) -> Option<Instant> {
        match self.state {
            BreakerState::Closed => None,
            BreakerState::Open { until } => Some(until),
            BreakerState::HalfOpen => self.probe_deadline,
        }
    }

    /// Forgets everything: back to Closed, window empty, doubling reset. All
    /// permits handed out so far become stale.
    #[cfg(any(test, feature = "internals"))]
    pub fn reset(&mut self) {
        *self = Breaker {
            generation: self.generation + 1,
            trips: self.trips,
            ..Breaker::new(self.config.clone())
        };
    }

    fn probes(&self) -> u32 {
        self.config.half_open_probes.max(1)
    }

    fn next_period(&self) -> Duration {
        let max = self.config.max_open_for;
        match self.last_period {
            None => self.config.open_for.min(max),
            Some(period) => period.checked_mul(2).unwrap_or(max).min(max),
        }
    }

    /// The time-based transition due at `now`, if any.
    fn pending(&self, now: Instant) -> Option<TransitionReason> {
        match (self.state, self.probe_deadline) {
            (BreakerState::Open { until }, _) if now >= until => {
                Some(TransitionReason::OpenElapsed)
            }
            (BreakerState::HalfOpen, Some(deadline)) if now >= deadline => {
                Some(TransitionReason::ProbeTimeout)
            }
            _ => None,
        }
    }

    fn record_closed(&mut self, failed: bool, now: Instant) -> Option<Transition> {
        let config = &self.config;
        if config.window > 0 {
            if self.window.len() >= config.window as usize && self.window.pop_front() == Some(true)
            {
                self.window_failures -= 1;
            }
            self.window.push_back(failed);
            self.window_failures += u32::from(failed);
        }
        self.consecutive = if failed {
            self.consecutive.saturating_add(1)
        } else {
            0
        };
        let calls = self.window.len() as u32;
        let failures = self.window_failures;
        if config.consecutive_failures > 0 && self.consecutive >= config.consecutive_failures {
            let reason = TransitionReason::ConsecutiveFailures(self.consecutive);
            Some(self.trip(reason, now))
        } else if failures > 0
            && calls >= config.min_calls
            && f64::from(failures) / f64::from(calls) >= config.failure_rate
        {
            Some(self.trip(TransitionReason::FailureRate { failures, calls }, now))
        } else {
            None
        }
    }

    fn trip(&mut self, reason: TransitionReason, now: Instant) -> Transition {
        let period = self.next_period();
        self.last_period = Some(period);
        self.trips += 1;
        let until = super::time::add(now, period);
        self.enter(BreakerState::Open { until }, reason, now)
    }

    fn enter(&mut self, to: BreakerState, reason: TransitionReason, now: Instant) -> Transition {
        let from = self.state;
        self.state = to;
        self.generation += 1;
        self.probes_issued = 0;
        self.probes_ok = 0;
        self.probe_deadline = None;
        if to == BreakerState::Closed {
            self.window.clear();
            self.window_failures = 0;
            self.consecutive = 0;
            self.closed_at = Some(now);
        }
        Transition { from, to, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use BreakerState::{Closed, HalfOpen, Open};
    use CallOutcome::{Failure, Success};
    use TransitionReason as R;

    const MS: Duration = Duration::from_millis(1);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn open(until: Instant) -> BreakerState {
        Open { until }
    }

    fn breaker(f: impl FnOnce(&mut BreakerConfig)) -> Breaker {
        let mut config = BreakerConfig::default();
        f(&mut config);
        Breaker::new(config)
    }

    fn call(b: &mut Breaker, outcome: CallOutcome, now: Instant) -> Option<Transition> {
        let permit = b.admit(now).expect("admitted");
        b.record(permit, outcome, MS, now)
    }

    #[test]
    fn consecutive_rule() {
        let t0 = Instant::now();
        let mut b = breaker(|c| c.failure_rate = 2.0);
        for _ in 0..4 {
            assert_eq!(call(&mut b, Failure, t0), None);
        }
        assert_eq!(call(&mut b, Success, t0), None); // resets the count
        for _ in 0..4 {
            assert_eq!(call(&mut b, Failure, t0), None);
        }
        let t = call(&mut b, Failure, t0).unwrap();
        let open = Open {
            until: t0 + secs(5),
        };
        assert_eq!((t.from, t.to), (Closed, open));
        assert_eq!(t.reason, R::ConsecutiveFailures(5));
        assert_eq!(t.reason.to_string(), "5 consecutive failures");
        assert_eq!(
            (b.state(), b.trips(), b.next_change()),
            (open, 1, Some(t0 + secs(5)))
        );
    }

    #[test]
    fn rate_rule_waits_for_min_calls_then_trips_at_threshold() {
        let t0 = Instant::now();
        let mut b = breaker(|c| c.consecutive_failures = 0);
        for i in 0..9 {
            let outcome = if i % 2 == 0 { Failure } else { Success };
            assert_eq!(call(&mut b, outcome, t0), None); // 5/9 but < min_calls
        }
        let t = call(&mut b, Success, t0).unwrap();
        assert_eq!(
            t.reason,
            R::FailureRate {
                failures: 5,
                calls: 10
            }
        );
        assert_eq!(t.reason.to_string(), "failure rate 5/10 = 0.50");
    }

    #[test]
    fn window_slides() {
        let t0 = Instant::now();
        let mut b = breaker(|c| {
            c.consecutive_failures = 0;
            (c.window, c.min_calls, c.failure_rate) = (4, 4, 0.75);
        });
        for outcome in [Failure, Failure, Success, Success, Success, Success] {
            assert_eq!(call(&mut b, outcome, t0), None);
        }
        assert_eq!((b.window.len(), b.window_failures), (4, 0)); // old failures left
        assert_eq!(call(&mut b, Failure, t0), None);
        assert_eq!(call(&mut b, Failure, t0), None); // 2/4
        let t = call(&mut b, Failure, t0).unwrap(); // 3/4; cumulative 5/9 would not
        assert_eq!(
            t.reason,
            R::FailureRate {
                failures: 3,
                calls: 4
            }
        );
    }

    #[test]
    fn a_window_of_zero_turns_the_rate_rule_off() {
        // Only the consecutive rule is left: a failure every other call
        // never trips, however few calls the rate rule would ask for.
        let t0 = Instant::now();
        let mut b = breaker(|c| (c.window, c.min_calls, c.consecutive_failures) = (0, 1, 3));
        for _ in 0..20 {
            assert_eq!(call(&mut b, Failure, t0), None);
            assert_eq!(call(&mut b, Success, t0), None);
        }
        assert_eq!(b.state(), Closed);
        assert_eq!(call(&mut b, Failure, t0), None);
        assert_eq!(call(&mut b, Failure, t0), None);
        let t = call(&mut b, Failure, t0).unwrap();
        assert_eq!(t.reason, R::ConsecutiveFailures(3));
    }

    #[test]
    fn a_rate_of_zero_still_needs_one_failure() {
        // failure_rate 0.0: any failure in a full enough window trips, but
        // a window of successes is a rate of 0, not a reason to open.
        let t0 = Instant::now();
        let mut b = breaker(|c| {
            (
                c.window,
                c.min_calls,
                c.failure_rate,
                c.consecutive_failures,
            ) = (4, 2, 0.0, 0)
        });
        for _ in 0..10 {
            assert_eq!(call(&mut b, Success, t0), None);
        }
        assert_eq!(b.state(), Closed);
        let t = call(&mut b, Failure, t0).unwrap();
        assert_eq!(
            t.reason,
            R::FailureRate {
                failures: 1,
                calls: 4
            }
        );
    }

    #[test]
    fn slow_calls_count_as_failures_when_configured() {
        let t0 = Instant::now();
        let mut plain = breaker(|c| c.consecutive_failures = 2);
        let mut b = breaker(|c| {
            c.consecutive_failures = 2;
            c.slow_call = Some(100 * MS);
        });
        for b in [&mut plain, &mut b] {
            let p = b.admit(t0).unwrap();
            assert_eq!(b.record(p, Success, 100 * MS, t0), None); // not slower
            let p = b.admit(t0).unwrap();
            assert_eq!(b.record(p, Success, 101 * MS, t0), None);
        }
        let p = b.admit(t0).unwrap();
        let t = b.record(p, Success, 101 * MS, t0).unwrap();
        assert_eq!(t.reason, R::ConsecutiveFailures(2));
        let p = plain.admit(t0).unwrap();
        assert_eq!(plain.record(p, Success, secs(30), t0), None);
    }

    #[test]
    fn open_rejects_then_half_open_admits_exact_probes_which_close_it() {
        let t0 = Instant::now();
        let mut b = breaker(|c| (c.consecutive_failures, c.half_open_probes) = (1, 3));
        let late = b.admit(t0).unwrap();
        call(&mut b, Failure, t0).unwrap();
        let until = t0 + secs(5);
        let before = until - Duration::from_nanos(1);
        assert_eq!(b.peek(before), Err(until));
        assert_eq!(b.admit(before), Err(until));
        assert_eq!(b.poll(before), None);
        assert_eq!(b.peek(until), Ok(true));
        assert_eq!(b.state(), Open { until }); // peek changed nothing
        let t = b.poll(until).unwrap();
        assert_eq!(
            (t.from, t.to, t.reason),
            (Open { until }, HalfOpen, R::OpenElapsed)
        );
        assert_eq!(b.next_change(), None); // no deadline before the first probe
        let probe_at = until + secs(30);
        let probes: Vec<_> = (0..3).map(|_| b.admit(probe_at).unwrap()).collect();
        assert!(probes.iter().all(Permit::is_probe));
        let deadline = probe_at + secs(10);
        assert_eq!(b.admit(probe_at), Err(deadline));
        assert_eq!(b.peek(probe_at), Err(deadline));
        assert_eq!(b.next_change(), Some(deadline));
        assert_eq!(b.record(late, Failure, MS, probe_at), None); // old generation
        assert_eq!(b.record(probes[0], Success, MS, probe_at), None);
        assert_eq!(b.record(probes[1], Success, MS, probe_at), None);
        let t = b.record(probes[2], Success, MS, probe_at).unwrap();
        assert_eq!(
            (t.from, t.to, t.reason),
            (HalfOpen, Closed, R::ProbesSucceeded)
        );
        assert!(!b.admit(probe_at).unwrap().is_probe());
        assert_eq!(
            (b.window.len(), b.consecutive, b.next_change()),
            (0, 0, None)
        );
    }

    #[test]
    fn probe_failures_double_the_open_period_up_to_the_cap() {
        let (mut now, mut periods) = (Instant::now(), vec![]);
        let mut b = breaker(|c| c.consecutive_failures = 1);
        assert_eq!(b.current_open_for(), secs(5));
        call(&mut b, Failure, now).unwrap();
        while let Open { until } = b.state() {
            periods.push((until - now).as_secs());
            assert_eq!(b.current_open_for(), until - now);
            now = until;
            let t = call(&mut b, Failure, now).unwrap(); // the probe fails
            assert_eq!((t.from, t.reason), (HalfOpen, R::ProbeFailed));
            if periods.len() == 6 {
                break;
            }
        }
        assert_eq!(periods, [5, 10, 20, 40, 60, 60]);
        assert_eq!(b.trips(), 7);
        assert_eq!(R::ProbeFailed.to_string(), "probe failed");
    }

    #[test]
    fn stuck_half_open_times_out_to_a_longer_open() {
        let t0 = Instant::now();
        let mut b = breaker(|c| c.consecutive_failures = 1);
        call(&mut b, Failure, t0).unwrap();
        let t1 = t0 + secs(5);
        let probe = b.admit(t1).unwrap();
        let deadline = t1 + secs(10);
        assert_eq!(b.poll(deadline - Duration::from_nanos(1)), None);
        assert_eq!(b.peek(deadline), Err(deadline + secs(10)));
        let t = b.poll(deadline).unwrap();
        let open = Open {
            until: deadline + secs(10),
        };
        assert_eq!((t.from, t.to, t.reason), (HalfOpen, open, R::ProbeTimeout));
        assert_eq!(b.record(probe, Success, secs(10), deadline), None); // too late
        assert_eq!(b.state(), open);
        // record polls too: a stuck probe reported after the deadline trips.
        let mut b2 = breaker(|c| c.consecutive_failures = 1);
        call(&mut b2, Failure, t0).unwrap();
        let probe = b2.admit(t1).unwrap();
        let t = b2.record(probe, Success, secs(11), t1 + secs(11)).unwrap();
        assert_eq!(t.reason, R::ProbeTimeout);
    }

    #[test]
    fn old_generation_permits_are_ignored() {
        let t0 = Instant::now();
        let mut b = breaker(|c| c.consecutive_failures = 2);
        let old = b.admit(t0).unwrap();
        call(&mut b, Failure, t0);
        call(&mut b, Failure, t0).unwrap();
        assert_eq!(b.record(old, Failure, MS, t0), None);
        let probe = b.admit(t0 + secs(5)).unwrap();
        b.record(probe, Success, MS, t0 + secs(5)).unwrap();
        assert_eq!(b.record(old, Failure, MS, t0 + secs(6)), None); // Closed again
        assert_eq!(b.window.len(), 0);
        let before_reset = b.admit(t0 + secs(6)).unwrap();
        b.reset();
        assert_eq!(b.record(before_reset, Failure, MS, t0 + secs(6)), None);
        assert_eq!((b.consecutive, b.trips()), (0, 1));
    }

    #[test]
    fn a_reset_makes_a_permit_of_the_first_generation_stale() {
        // Permits of generation 0 (a new breaker) and a reset: the count
        // moves on, never back to a generation a permit may still carry.
        let t0 = Instant::now();
        let mut b = breaker(|c| c.consecutive_failures = 1);
        let first = b.admit(t0).unwrap();
        b.reset();
        assert_eq!(b.record(first, Failure, MS, t0), None);
        assert_eq!((b.state(), b.trips()), (Closed, 0));
    }

    #[test]
    fn clean_closed_time_counts_from_the_close_not_the_half_open() {
        let t0 = Instant::now();
        let mut b = breaker(|c| {
            c.consecutive_failures = 1;
            (c.open_for, c.reset_after) = (secs(1), secs(10));
        });
        call(&mut b, Failure, t0).unwrap();
        // Half-open at 1 s; the probe answers 2 s later, closing it at 3 s.
        let probe = b.admit(t0 + secs(1)).unwrap();
        assert_eq!(b.state(), HalfOpen);
        b.record(probe, Success, secs(2), t0 + secs(3)).unwrap();
        assert_eq!(b.state(), Closed);
        // 10.5 s after the half-open, 8.5 s after the close: the doubling
        // is still remembered.
        let t = t0 + Duration::from_millis(11_500);
        call(&mut b, Failure, t).unwrap();
        assert_eq!(b.state(), open(t + secs(2)));
    }

    #[test]
    fn reset_after_forgets_the_doubling() {
        let t0 = Instant::now();
        let mut b = breaker(|c| c.consecutive_failures = 1);
        // Trip (5 s), close by a probe at c1; trip again 59 s later: doubled.
        call(&mut b, Failure, t0).unwrap();
        let c1 = t0 + secs(5);
        call(&mut b, Success, c1).unwrap();
        assert_eq!((b.state(), b.current_open_for()), (Closed, secs(10)));
        call(&mut b, Failure, c1 + secs(59)).unwrap();
        assert_eq!(b.state(), open(c1 + secs(69)));
        // Close at c2; after 60 s of clean Closed time, back to 5 s.
        let c2 = c1 + secs(69);
        call(&mut b, Success, c2).unwrap();
        assert_eq!(b.poll(c2 + secs(60) - MS), None);
        assert_eq!(b.current_open_for(), secs(20));
        assert_eq!(b.poll(c2 + secs(60)), None);
        assert_eq!(b.current_open_for(), secs(5));
        call(&mut b, Failure, c2 + secs(60)).unwrap();
        assert_eq!(b.state(), open(c2 + secs(65)));
        b.reset();
        assert_eq!(
            (b.state(), b.current_open_for(), b.trips()),
            (Closed, secs(5), 3)
        );
    }

    #[test]
    fn display_texts() {
        use R::*;
        assert_eq!(OpenElapsed.to_string(), "open period elapsed");
        assert_eq!(ProbesSucceeded.to_string(), "probes succeeded");
        let timeout = "probes did not report within the probe timeout";
        assert_eq!(ProbeTimeout.to_string(), timeout);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Advance(u64),
        Admit,
        Record(usize, bool, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..8_000).prop_map(Op::Advance),
            Just(Op::Admit),
            (any::<usize>(), any::<bool>(), 0u64..300).prop_map(|(i, ok, l)| Op::Record(i, ok, l)),
        ]
    }

    proptest! {
        #[test]
        fn state_machine_invariants(
            probes in 1u32..4,
            consecutive in 0u32..4,
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let t0 = Instant::now();
            let mut b = breaker(|c| {
                (c.half_open_probes, c.consecutive_failures) = (probes, consecutive);
                (c.window, c.min_calls, c.slow_call) = (6, 3, Some(200 * MS));
                (c.probe_timeout, c.reset_after) = (secs(3), secs(20));
            });
            let mut now = t0;
            let mut permits = Vec::new();
            let mut probes_per_trip = std::collections::HashMap::<u64, u32>::new();
            for op in ops {
                match op {
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                    Op::Admit => {
                        let before = b.state();
                        let peeked = b.peek(now);
                        let admitted = b.admit(now);
                        prop_assert_eq!(peeked, admitted.map(|p| p.is_probe()));
                        match admitted {
                            Ok(permit) => {
                                if let Open { until } = before {
                                    prop_assert!(now >= until, "Open admitted before until");
                                }
                                if permit.is_probe() {
                                    let n = probes_per_trip.entry(b.trips()).or_default();
                                    *n += 1;
                                    prop_assert!(*n <= probes);
                                }
                                permits.push(permit);
                            }
                            Err(at) => prop_assert!(at > now),
                        }
                    }
                    Op::Record(i, ok, latency) if !permits.is_empty() => {
                        let permit = permits[i % permits.len()];
                        let outcome = if ok { Success } else { Failure };
                        b.record(permit, outcome, Duration::from_millis(latency), now);
                    }
                    Op::Record(..) => {}
                }
                prop_assert!(b.current_open_for() <= secs(60));
                if let Some(at) = b.next_change() {
                    prop_assert!(at > now || b.poll(now).is_some());
                }
            }
        }
    }
}
