//! Queue delay control: CoDel's target and interval, with adaptive LIFO
//! (Facebook's "Fail at Scale", ACM Queue 2015; CoDel, RFC 8289).
//!
//! [`Codel`] bounds how long a task waits, not how many wait. **Calm**:
//! FIFO, nothing shed but a task past the optional `max_wait` (HAProxy's
//! `timeout queue`). **Overloaded** once the queue has not been empty for a
//! whole `interval` (100 ms): a task that waited past `target` (5 ms) is
//! shed with a `retry_after` hint, and a standing queue is served newest
//! first ([`Codel::order`]). **Calm again** once an `interval` passed with
//! nothing shed and the queue empty at least once in it. Not CoDel's drop
//! schedule: it relies on TCP senders slowing down; tasks come open-loop.
//!
//! While overloaded, [`Codel::admits_in`] refuses a new task at once when
//! more are ahead of it than the queue sends in half a `target`, or more
//! of its own class than that class is sent in half a target (rates from
//! [`Codel::on_sent_in`]); a refusal counts as a shed. A task is bounded
//! by the `interval` instead of the target ([`Codel::on_dequeue_for`]) when
//! it is sheltered: less important tasks wait too, or its class's queue is
//! not [standing](Codel::standing_in). The queue reports its length with
//! [`Codel::on_queue_len`] (the [`Transition`] to log) and sets timers from
//! [`Codel::next_change`] and [`Codel::expires_at_for`]. Pure: every
//! method takes `now`.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::codel::{Codel, CodelConfig, Order, Transition, Verdict};
//! use tokio::time::{Duration, Instant};
//!
//! let t0 = Instant::now();
//! let ms = |n| t0 + Duration::from_millis(n);
//! let mut codel = Codel::new(CodelConfig::default());
//! assert_eq!(codel.on_queue_len(1, t0), None); // the queue is busy from t0
//! assert_eq!(codel.on_dequeue_for(t0, ms(50), false), Verdict::Serve); // calm: any wait
//! assert_eq!(codel.on_queue_len(3, ms(100)), Some(Transition::Entered));
//! assert_eq!(codel.order(ms(100), 10), Order::Lifo);
//! assert_eq!(codel.on_dequeue_for(ms(96), ms(100), false), Verdict::Serve); // waited 4 ms
//! assert_eq!(codel.on_dequeue_for(ms(90), ms(100), false), Verdict::Shed); // waited 10 ms
//! # }
//! ```

use tokio::time::{Duration, Instant};

pub use crate::algo::priority::Order;
use crate::algo::priority::{Priority, CLASSES};
use crate::algo::time;

/// The `retry_after` hint is at most this many intervals.
const MAX_RETRY_INTERVALS: u32 = 10;

/// Tuning of the queue's delay control (`Codel`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodelConfig {
    /// While overloaded, a task that waited longer than this is shed.
    pub target: Duration,
    /// The queue is overloaded once it has not been empty for this long.
    pub interval: Duration,
    /// Serve the newest task first while overloaded (adaptive LIFO).
    pub lifo: bool,
    /// A task that waited longer than this is shed even when calm (HAProxy's
    /// `timeout queue`). `None`: no bound while calm.
    pub max_wait: Option<Duration>,
}

impl Default for CodelConfig {
    /// `target: 5 ms`, `interval: 100 ms` (the numbers of CoDel and of
    /// "Fail at Scale"), `lifo: true`, `max_wait: None`.
    ///
    /// There is no default calm bound: a task's own deadline bounds its
    /// wait, and a burst that the backends clear within an interval should
    /// not be shed.
    fn default() -> Self {
        CodelConfig {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            lifo: true,
            max_wait: None,
        }
    }
}

impl CodelConfig {
    /// Checks the fields: `target` and `interval` greater than zero and at
    /// most [`time::MAX_DURATION`], `target <= interval`, `max_wait` (when
    /// set) greater than zero and bounded. The error names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, d) in [("target", self.target), ("interval", self.interval)] {
            if d.is_zero() {
                return Err(format!("{name} must be greater than zero"));
            }
            time::bounded(name, d)?;
        }
        if self.target > self.interval {
            return Err(format!(
                "target ({:?}) must not be longer than interval ({:?})",
                self.target, self.interval
            ));
        }
        if let Some(w) = self.max_wait {
            if w.is_zero() {
                return Err("max_wait must be greater than zero".into());
            }
            time::bounded("max_wait", w)?;
        }
        Ok(())
    }
}

/// What to do with a task taken from the queue, from [`Codel::on_dequeue_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Dispatch it.
    Serve,
    /// Answer it at once as overloaded (with [`Codel::retry_after`]).
    Shed,
}

/// A change of state, for the one log line per change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transition {
    /// Calm -> overloaded: the queue has not been empty for an interval.
    Entered,
    /// Overloaded -> calm, after being overloaded this long.
    Left {
        /// How long the overload lasted.
        lasted: Duration,
    },
}

/// Delay control of one queue. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Codel {
    config: CodelConfig,
    /// The queue has not been empty since; `None` while it is empty.
    busy_since: Option<Instant>,
    /// The latest instant the queue was seen empty.
    last_empty: Option<Instant>,
    /// Overloaded since (as last committed by `poll`).
    overloaded: Option<Instant>,
    /// The latest shed.
    last_shed: Option<Instant>,
    /// Sends counted for the intake bound, per priority class.
    sent: [Window; CLASSES],
}

/// Sends counted per `interval`: the current interval's start, its count
/// so far and the previous interval's count.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    start: Option<Instant>,
    current: u64,
    previous: u64,
}

impl Codel {
    /// Creates the control of an empty, calm queue.
    ///
    /// # Panics
    ///
    /// If `config` fails [`CodelConfig::validate`].
    pub fn new(config: CodelConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid CodelConfig: {e}");
        }
        Codel {
            config,
            busy_since: None,
            last_empty: None,
            overloaded: None,
            last_shed: None,
            sent: [Window::default(); CLASSES],
        }
    }

    /// The configuration this control was made with.
    pub fn config(&self) -> &CodelConfig {
        &self.config
    }

    /// Whether the queue is overloaded at `now`, from the recorded history
    /// (what [`poll`](Self::poll) would commit): the cheap question to ask
    /// before any bound.
    pub fn overloaded_at(&self, now: Instant) -> bool {
        self.state_at(now).is_some()
    }

    /// Overloaded since when, as of the last [`poll`](Self::poll) (or
    /// [`on_queue_len`](Self::on_queue_len)); `None` when calm.
    pub fn congested(&self) -> Option<Instant> {
        self.overloaded
    }

    /// Tells the control the ready queue's length after a change (a push, a
    /// pop, a shed) at `now`, and returns the state change to log, if any.
    /// Only the changes between empty and non-empty matter, so calling it on
    /// every change or only on those is the same.
    pub fn on_queue_len(&mut self, len: usize, now: Instant) -> Option<Transition> {
        // The time up to `now` is judged with the old emptiness first, so a
        // queue that drains just after a whole busy interval still counts.
        let before = self.poll(now);
        if len == 0 {
            self.busy_since = None;
            self.last_empty = Some(now);
        } else if self.busy_since.is_none() {
            self.busy_since = Some(now);
        }
        before.or_else(|| self.poll(now))
    }

    /// Commits the state at `now` and returns the change, if any. Call it
    /// when the timer set from [`next_change`](Self::next_change) fires.
    pub fn poll(&mut self, now: Instant) -> Option<Transition> {
        let next = self.state_at(now);
        match (self.overloaded, next) {
            (None, Some(_)) => {
                self.overloaded = next;
                Some(Transition::Entered)
            }
            (Some(since), None) => {
                self.overloaded = None;
                Some(Transition::Left {
                    lasted: now.saturating_duration_since(since),
                })
            }
            _ => None,
        }
    }

    /// When the state would change if nothing else happened: the instant to
    /// call [`poll`](Self::poll) at. `None`: only a change of the queue can
    /// change the state.
    pub fn next_change(&self) -> Option<Instant> {
        match self.overloaded {
            None => self.busy_since.map(|b| time::add(b, self.config.interval)),
            Some(since) => {
                let quiet = self.quiet_from(since);
                self.emptied_since(quiet)
                    .then(|| time::add(quiet, self.config.interval))
            }
        }
    }

    /// Counts `n` tasks of `class` sent at `now`, for the intake bounds of
    /// [`admits_in`](Self::admits_in).
    pub fn on_sent_in(&mut self, class: Priority, n: u64, now: Instant) {
        let w = self.window_at(class, now);
        self.sent[class.index()] = Window {
            current: w.current.saturating_add(n),
            ..w
        };
    }

    /// How many ready tasks a new task may find ahead of it and still join
    /// at `now`: as many as the queue sends in half a `target` (in an
    /// `interval` for a `shielded` task, see
    /// [`on_dequeue_for`](Self::on_dequeue_for)) at the rate of the last
    /// whole interval (or of this one so far, if higher), at least one.
    /// `None` while calm: no bound.
    pub fn intake_bound(&self, now: Instant, shielded: bool) -> Option<usize> {
        self.state_at(now)?;
        let total = Priority::ALL
            .iter()
            .map(|&c| self.per_interval(c, now))
            .fold(0u64, u64::saturating_add);
        Some(self.bound_of(total, shielded))
    }

    /// As [`intake_bound`](Self::intake_bound), for the tasks of
    /// `class` alone, at the rate that class is sent: under strict
    /// priority a less important class gets what the more important ones
    /// leave, and its tasks wait for its own turns.
    pub fn class_bound(&self, class: Priority, now: Instant, shielded: bool) -> Option<usize> {
        self.state_at(now)?;
        Some(self.bound_of(self.per_interval(class, now), shielded))
    }

    /// The most tasks sent in half a target (in an interval if
    /// `shielded`) at `per_interval` sends per interval, at least one.
    fn bound_of(&self, per_interval: u64, shielded: bool) -> usize {
        // Half the target: sends come in bursts (a backend's workers end
        // together), so a task admitted with a target's worth ahead would
        // often wait past it and be shed after all, later.
        let wait = if shielded {
            self.config.interval
        } else {
            self.config.target / 2
        };
        let interval = self.config.interval.as_nanos().max(1);
        let bound = (u128::from(per_interval) * wait.as_nanos()).div_ceil(interval);
        usize::try_from(bound).unwrap_or(usize::MAX).max(1)
    }

    /// Whether a new task of `class` joins the queue at `now`, with
    /// `ahead` ready tasks before it (its class and the more important
    /// ones), `of_class` of them of its own class: while overloaded, only
    /// when `ahead` is within the [intake bound](Self::intake_bound)
    /// and `of_class` within its [class's](Self::class_bound). The first
    /// keeps a task from joining behind more than goes out in half a
    /// target; the second from joining a class that gets fewer turns than
    /// that, the more important ones taking the rest. A refusal is
    /// recorded as a shed.
    pub fn admits_in(
        &mut self,
        class: Priority,
        ahead: usize,
        of_class: usize,
        now: Instant,
        shielded: bool,
    ) -> bool {
        if self.state_at(now).is_none() {
            return true;
        }
        let own = self.per_interval(class, now);
        let total = Priority::ALL
            .iter()
            .map(|&c| {
                if c == class {
                    own
                } else {
                    self.per_interval(c, now)
                }
            })
            .fold(0u64, u64::saturating_add);
        if ahead >= self.bound_of(total, shielded) || of_class >= self.bound_of(own, shielded) {
            self.last_shed = Some(self.last_shed.map_or(now, |s| s.max(now)));
            return false;
        }
        true
    }

    /// The sends of `class` per interval: the last whole interval's, or
    /// this one's so far if higher.
    fn per_interval(&self, class: Priority, now: Instant) -> u64 {
        let w = self.window_at(class, now);
        w.current.max(w.previous)
    }

    /// `class`'s send window holding `now`, moved on from the recorded
    /// one.
    fn window_at(&self, class: Priority, now: Instant) -> Window {
        let interval = self.config.interval;
        let w = self.sent[class.index()];
        let Some(start) = w.start else {
            return Window {
                start: Some(now),
                current: 0,
                previous: 0,
            };
        };
        let next = time::add(start, interval);
        if now < next {
            return w;
        }
        // The previous interval is the one just before `now`'s: empty if a
        // whole interval passed without a count.
        let previous = if now < time::add(next, interval) {
            w.current
        } else {
            0
        };
        let whole = now.saturating_duration_since(start).as_nanos() / interval.as_nanos().max(1);
        let whole = u32::try_from(whole).unwrap_or(u32::MAX);
        Window {
            start: Some(time::add(start, time::mul(interval, whole))),
            current: 0,
            previous,
        }
    }

    /// Whether `queued` ready tasks are a standing queue at `now`: the
    /// queue is overloaded and they are more than the [intake
    /// bound](Self::intake_bound) lets in, more than go out in half a
    /// target. A queue within the bound is short: what waits in it waits
    /// for the next sends, which come in bursts, not behind an excess.
    fn standing(&self, now: Instant, queued: usize) -> bool {
        self.intake_bound(now, false)
            .is_some_and(|bound| queued > bound)
    }

    /// As [`standing`](Self::standing), for `queued` ready tasks of
    /// `class` alone, against its [class's bound](Self::class_bound): what
    /// waits for the class's next turns is a short queue, however many
    /// more important tasks go first.
    pub fn standing_in(&self, class: Priority, now: Instant, queued: usize) -> bool {
        self.class_bound(class, now, false)
            .is_some_and(|bound| queued > bound)
    }

    /// Which end of the queue to serve at `now`, with `ready` tasks
    /// waiting: LIFO while the queue is [standing](Self::standing) (when
    /// `lifo` is on), FIFO otherwise. A standing queue built up before the
    /// overload was seen, or holds tasks that may not be refused: the
    /// newest are served and the oldest shed. A short one sends every task
    /// soon anyway, and oldest first sheds none of them.
    pub fn order(&self, now: Instant, ready: usize) -> Order {
        if self.config.lifo && self.standing(now, ready) {
            Order::Lifo
        } else {
            Order::Fifo
        }
    }

    /// Judges a task enqueued at `enqueued_at`, taken (or looked at) at
    /// `now`: shed when it waited longer than the current
    /// [bound](Self::bound) (`target` while overloaded, the `interval` if
    /// it is `sheltered`; `max_wait` always). A shed is recorded (it keeps
    /// the queue overloaded); `Serve` records nothing. The queue shelters a
    /// task in two cases:
    ///
    /// * less important tasks wait too, and are shed first: a flood of
    ///   unimportant tasks must not get important ones shed, while a
    ///   pile-up of important ones is still bounded;
    /// * the queue is short (not [standing](Self::standing)): as CoDel
    ///   drops nothing while its queue holds less than a packet, a task
    ///   that waits only for the next burst of sends is not shed for it.
    ///   The intake bound keeps the queue short, so under a steady
    ///   overload what is refused is refused at intake, at once, and what
    ///   is admitted is sent, not shed after waiting the target.
    pub fn on_dequeue_for(
        &mut self,
        enqueued_at: Instant,
        now: Instant,
        sheltered: bool,
    ) -> Verdict {
        let waited = now.saturating_duration_since(enqueued_at);
        match self.bound(now, sheltered) {
            Some(bound) if waited > bound => {
                self.last_shed = Some(self.last_shed.map_or(now, |s| s.max(now)));
                Verdict::Shed
            }
            _ => Verdict::Serve,
        }
    }

    /// The longest wait served at `now`: `target` while overloaded (the
    /// `interval` for a `sheltered` task, see
    /// [`on_dequeue_for`](Self::on_dequeue_for); or `max_wait` if shorter),
    /// `max_wait` while calm.
    pub fn bound(&self, now: Instant, sheltered: bool) -> Option<Duration> {
        let calm = self.config.max_wait;
        if self.state_at(now).is_some() {
            let over = if sheltered {
                self.config.interval
            } else {
                self.config.target
            };
            Some(calm.map_or(over, |w| w.min(over)))
        } else {
            calm
        }
    }

    /// The first instant at which a task enqueued at `enqueued_at` would be
    /// shed under the bound of `now` ([`bound`](Self::bound), `sheltered`
    /// or not), for the queue's sweep timer. `None`: no bound applies.
    pub fn expires_at_for(
        &self,
        enqueued_at: Instant,
        now: Instant,
        sheltered: bool,
    ) -> Option<Instant> {
        let bound = self.bound(now, sheltered)?;
        // Shed when the wait is strictly longer than the bound.
        Some(time::add(
            time::add(enqueued_at, bound),
            Duration::from_nanos(1),
        ))
    }

    /// The hint for the `Overloaded { retry_after }` rejection at `now`:
    /// one interval, or as long as the overload has lasted, up to ten
    /// intervals. A long overload is likely to go on, so its callers are
    /// asked to stay away longer.
    pub fn retry_after(&self, now: Instant) -> Duration {
        let interval = self.config.interval;
        let lasted = self
            .state_at(now)
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        lasted.clamp(interval, time::mul(interval, MAX_RETRY_INTERVALS))
    }

    /// Overloaded since when at `now`, from the recorded history; what
    /// [`poll`](Self::poll) would commit.
    fn state_at(&self, now: Instant) -> Option<Instant> {
        let interval = self.config.interval;
        let busy_long = self
            .busy_since
            .map(|b| time::add(b, interval))
            .filter(|&entered| now >= entered);
        match self.overloaded {
            None => busy_long,
            Some(since) => {
                let quiet = self.quiet_from(since);
                let leaves = self.emptied_since(quiet)
                    && now >= time::add(quiet, interval)
                    && busy_long.is_none();
                (!leaves).then_some(since)
            }
        }
    }

    /// The start of the quiet time that ends an overload: its start or its
    /// latest shed.
    fn quiet_from(&self, since: Instant) -> Instant {
        self.last_shed.map_or(since, |s| s.max(since))
    }

    /// Whether the queue has been empty at some instant from `t` on.
    fn emptied_since(&self, t: Instant) -> bool {
        self.busy_since.is_none() || self.last_empty.is_some_and(|e| e >= t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn default_numbers() {
        let c = CodelConfig::default();
        assert_eq!(c.target, Duration::from_millis(5));
        assert_eq!(c.interval, Duration::from_millis(100));
        assert!(c.lifo);
        assert_eq!(c.max_wait, None);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut CodelConfig)| {
            let mut c = CodelConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.target = Duration::ZERO).contains("target"));
        assert!(bad(|c| c.interval = Duration::ZERO).contains("interval"));
        assert!(bad(|c| c.target = Duration::from_secs(1)).contains("target"));
        assert!(bad(|c| c.max_wait = Some(Duration::ZERO)).contains("max_wait"));
        let e = bad(|c| c.max_wait = Some(Duration::MAX));
        assert!(e.contains("max_wait"), "{e}");
        let e = bad(|c| {
            c.interval = Duration::MAX;
            c.target = Duration::from_secs(1);
        });
        assert!(e.contains("interval"), "{e}");
    }

    #[test]
    fn calm_serves_fifo_whatever_the_wait() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        assert_eq!(c.on_queue_len(1, t0), None);
        assert_eq!(c.order(t0, 10), Order::Fifo);
        // A burst drains within the interval: nothing is shed.
        assert_eq!(c.on_dequeue_for(t0, at(t0, 99), false), Verdict::Serve);
        assert_eq!(c.on_queue_len(0, at(t0, 99)), None);
        assert_eq!(c.bound(at(t0, 99), false), None);
        assert_eq!(c.expires_at_for(t0, at(t0, 99), false), None);
        assert_eq!(c.congested(), None);
        // Empty: nothing can change until the queue does.
        assert_eq!(c.next_change(), None);
        assert_eq!(c.poll(at(t0, 10_000)), None);
    }

    #[test]
    fn enters_after_a_busy_interval_exactly() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(4, t0);
        assert_eq!(c.next_change(), Some(at(t0, 100)));
        let almost = at(t0, 100) - Duration::from_nanos(1);
        assert_eq!(c.poll(almost), None);
        assert_eq!(c.order(almost, 10), Order::Fifo);
        assert_eq!(c.on_dequeue_for(t0, almost, false), Verdict::Serve);
        assert_eq!(c.poll(at(t0, 100)), Some(Transition::Entered));
        assert_eq!(c.congested(), Some(at(t0, 100)));
        assert_eq!(c.poll(at(t0, 100)), None);
        assert_eq!(c.order(at(t0, 100), 10), Order::Lifo);
        // Waited exactly the target: served; a nanosecond more: shed.
        let now = at(t0, 110);
        assert_eq!(c.on_dequeue_for(at(t0, 105), now, false), Verdict::Serve);
        let older = at(t0, 105) - Duration::from_nanos(1);
        assert_eq!(c.on_dequeue_for(older, now, false), Verdict::Shed);
        assert_eq!(
            c.expires_at_for(at(t0, 105), now, false),
            Some(at(t0, 110) + Duration::from_nanos(1))
        );
    }

    #[test]
    fn a_queue_that_drains_within_the_interval_stays_calm() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        assert_eq!(c.on_queue_len(1, t0), None);
        assert_eq!(c.on_queue_len(0, at(t0, 50)), None);
        assert_eq!(c.on_queue_len(2, at(t0, 60)), None);
        assert_eq!(c.next_change(), Some(at(t0, 160)));
        assert_eq!(c.poll(at(t0, 150)), None);
        assert_eq!(c.on_queue_len(3, at(t0, 159)), None);
        assert_eq!(c.on_queue_len(2, at(t0, 160)), Some(Transition::Entered));
    }

    #[test]
    fn a_busy_interval_ending_in_the_drain_still_counts() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(1, t0);
        // The call that reports the drain comes late: the busy time before
        // it was a whole interval.
        assert_eq!(c.on_queue_len(0, at(t0, 120)), Some(Transition::Entered));
        assert_eq!(c.congested(), Some(at(t0, 100)));
    }

    #[test]
    fn leaves_after_a_quiet_interval_with_an_empty_queue() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        assert_eq!(c.poll(at(t0, 100)), Some(Transition::Entered));
        assert_eq!(
            c.on_dequeue_for(at(t0, 110), at(t0, 120), false),
            Verdict::Shed
        );
        // Drained at 130, but the last shed was at 120: calm from 220.
        assert_eq!(c.on_queue_len(0, at(t0, 130)), None);
        assert_eq!(c.next_change(), Some(at(t0, 220)));
        assert_eq!(c.poll(at(t0, 219)), None);
        assert_eq!(c.order(at(t0, 219), 10), Order::Lifo);
        assert_eq!(c.order(at(t0, 220), 10), Order::Fifo);
        assert_eq!(
            c.poll(at(t0, 220)),
            Some(Transition::Left {
                lasted: Duration::from_millis(120)
            })
        );
        assert_eq!(c.congested(), None);
        assert_eq!(c.on_dequeue_for(t0, at(t0, 220), false), Verdict::Serve);
    }

    #[test]
    fn a_queue_that_never_drains_stays_overloaded() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        assert_eq!(c.poll(at(t0, 100)), Some(Transition::Entered));
        // No shed, but no drain either: no change is due.
        assert_eq!(c.next_change(), None);
        assert_eq!(c.poll(at(t0, 10_000)), None);
        assert!(c.congested().is_some());
    }

    #[test]
    fn a_drain_ends_it_and_a_new_busy_interval_starts_another() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        c.poll(at(t0, 100));
        assert_eq!(c.on_queue_len(0, at(t0, 150)), None);
        assert_eq!(c.on_queue_len(1, at(t0, 151)), None);
        // Quiet since 100 and drained at 150: calm at 200, although busy
        // again since 151; overloaded again once that lasts an interval.
        assert_eq!(c.next_change(), Some(at(t0, 200)));
        assert_eq!(c.poll(at(t0, 199)), None);
        assert_eq!(
            c.poll(at(t0, 200)),
            Some(Transition::Left {
                lasted: Duration::from_millis(100)
            })
        );
        assert_eq!(c.next_change(), Some(at(t0, 251)));
        assert_eq!(c.poll(at(t0, 251)), Some(Transition::Entered));
        assert_eq!(c.congested(), Some(at(t0, 251)));
    }

    #[test]
    fn a_late_poll_never_leaves_a_queue_busy_for_an_interval() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        c.poll(at(t0, 100));
        c.on_queue_len(0, at(t0, 150));
        c.on_queue_len(1, at(t0, 151));
        // Nobody polled at 200; at 260 the queue has been busy since 151.
        assert_eq!(c.poll(at(t0, 260)), None);
        assert_eq!(c.congested(), Some(at(t0, 100)));
    }

    #[test]
    fn sheds_within_the_quiet_interval_postpone_leaving() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        c.poll(at(t0, 100));
        c.on_queue_len(0, at(t0, 105));
        c.on_queue_len(1, at(t0, 106));
        // A sweep sheds at 180 (served at 150 saw a 3 ms wait: no record).
        assert_eq!(
            c.on_dequeue_for(at(t0, 147), at(t0, 150), false),
            Verdict::Serve
        );
        assert_eq!(
            c.on_dequeue_for(at(t0, 170), at(t0, 180), false),
            Verdict::Shed
        );
        c.on_queue_len(0, at(t0, 190));
        assert_eq!(c.next_change(), Some(at(t0, 280)));
        assert_eq!(c.poll(at(t0, 279)), None);
        assert!(matches!(c.poll(at(t0, 280)), Some(Transition::Left { .. })));
    }

    #[test]
    fn max_wait_bounds_a_calm_queue() {
        let t0 = Instant::now();
        let cfg = CodelConfig {
            max_wait: Some(Duration::from_millis(50)),
            ..CodelConfig::default()
        };
        let mut c = Codel::new(cfg);
        c.on_queue_len(1, t0);
        assert_eq!(c.bound(at(t0, 10), false), Some(Duration::from_millis(50)));
        assert_eq!(c.on_dequeue_for(t0, at(t0, 50), false), Verdict::Serve);
        assert_eq!(
            c.on_dequeue_for(t0, at(t0, 50) + Duration::from_nanos(1), false),
            Verdict::Shed
        );
        // Overloaded: the shorter of target and max_wait.
        c.poll(at(t0, 100));
        assert_eq!(c.bound(at(t0, 100), false), Some(Duration::from_millis(5)));
    }

    #[test]
    fn fifo_only_when_lifo_is_off() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig {
            lifo: false,
            ..CodelConfig::default()
        });
        c.on_queue_len(1, t0);
        c.poll(at(t0, 100));
        assert!(c.congested().is_some());
        assert_eq!(c.order(at(t0, 100), 10), Order::Fifo);
        assert_eq!(
            c.on_dequeue_for(at(t0, 90), at(t0, 100), false),
            Verdict::Shed
        );
    }

    #[test]
    fn retry_after_grows_with_the_overload_up_to_ten_intervals() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        assert_eq!(c.retry_after(t0), Duration::from_millis(100));
        c.on_queue_len(1, t0);
        c.poll(at(t0, 100));
        assert_eq!(c.retry_after(at(t0, 150)), Duration::from_millis(100));
        assert_eq!(c.retry_after(at(t0, 400)), Duration::from_millis(300));
        assert_eq!(c.retry_after(at(t0, 60_000)), Duration::from_secs(1));
    }

    #[test]
    fn intake_is_bounded_only_while_overloaded_by_the_send_rate() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        // Calm: no bound, whatever is ahead.
        assert_eq!(c.intake_bound(at(t0, 50), false), None);
        assert!(c.admits_in(Priority::Default, 1_000_000, 1_000_000, at(t0, 50), false));
        // 200 sent in the first interval: 5 per half a 5 ms target.
        c.on_sent_in(Priority::Default, 200, at(t0, 60));
        assert_eq!(c.poll(at(t0, 100)), Some(Transition::Entered));
        assert_eq!(c.intake_bound(at(t0, 100), false), Some(5));
        assert!(c.admits_in(Priority::Default, 4, 4, at(t0, 100), false));
        assert!(!c.admits_in(Priority::Default, 5, 5, at(t0, 101), false));
        // The refusal counts as a shed: leaving waits a quiet interval
        // from it.
        c.on_queue_len(0, at(t0, 150));
        assert_eq!(c.poll(at(t0, 200)), None);
        assert!(matches!(c.poll(at(t0, 201)), Some(Transition::Left { .. })));
        // A faster current interval raises the bound at once.
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(5, t0);
        c.on_sent_in(Priority::Default, 20, at(t0, 10));
        c.on_sent_in(Priority::Default, 400, at(t0, 120));
        assert_eq!(c.intake_bound(at(t0, 120), false), Some(10));
        // Within the bound the queue is served oldest first; past it,
        // newest first.
        assert_eq!(c.order(at(t0, 120), 10), Order::Fifo);
        assert_eq!(c.order(at(t0, 120), 11), Order::Lifo);
        // A shielded task may find an interval's sends ahead of it.
        assert_eq!(c.intake_bound(at(t0, 120), true), Some(400));
        assert!(c.admits_in(Priority::Default, 399, 399, at(t0, 120), true));
        // A whole interval without a send: the bound falls to one.
        assert_eq!(c.intake_bound(at(t0, 330), false), Some(1));
        assert!(c.admits_in(Priority::Default, 0, 0, at(t0, 330), false));
        assert!(!c.admits_in(Priority::Default, 1, 1, at(t0, 330), false));
    }

    #[test]
    fn only_a_queue_past_the_intake_bound_stands() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(3, t0);
        c.on_sent_in(Priority::Default, 200, at(t0, 60));
        // Calm: nothing stands, whatever waits.
        assert!(!c.standing(at(t0, 60), 1_000));
        // Overloaded, 5 sent per half a target: 5 ready are a short
        // queue, 6 a standing one.
        assert_eq!(c.intake_bound(at(t0, 100), false), Some(5));
        assert!(!c.standing(at(t0, 100), 5));
        assert!(c.standing(at(t0, 100), 6));
        // The queue shelters a task of a short queue: past the target it
        // is still served; past the interval it is shed.
        let now = at(t0, 150);
        assert_eq!(c.on_dequeue_for(at(t0, 140), now, true), Verdict::Serve);
        assert_eq!(c.on_dequeue_for(at(t0, 140), now, false), Verdict::Shed);
        assert_eq!(c.on_dequeue_for(at(t0, 49), now, true), Verdict::Shed);
        // The send rate falls: the same queue now stands.
        assert_eq!(c.intake_bound(at(t0, 330), false), Some(1));
        assert!(c.standing(at(t0, 330), 2));
    }

    #[test]
    fn a_class_sent_less_than_the_others_has_a_bound_of_its_own() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(3, t0);
        assert_eq!(c.class_bound(Priority::Sheddable, at(t0, 50), false), None);
        assert!(c.admits_in(Priority::Sheddable, 1_000, 1_000, at(t0, 50), false));
        // 160 critical and 40 sheddable tasks sent in the first interval.
        c.on_sent_in(Priority::Critical, 160, at(t0, 60));
        c.on_sent_in(Priority::Sheddable, 40, at(t0, 60));
        let now = at(t0, 100);
        assert_eq!(c.intake_bound(now, false), Some(5));
        assert_eq!(c.class_bound(Priority::Critical, now, false), Some(4));
        assert_eq!(c.class_bound(Priority::Sheddable, now, false), Some(1));
        assert_eq!(
            c.class_bound(Priority::Default, now, false),
            Some(1),
            "a class not sent yet: one task may wait"
        );
        assert_eq!(c.class_bound(Priority::Sheddable, now, true), Some(40));
        // One sheddable task ahead is one more than its class is sent in
        // half a target, though the whole queue's bound would let it in.
        assert!(!c.admits_in(Priority::Sheddable, 1, 1, now, false));
        assert!(c.admits_in(Priority::Sheddable, 4, 0, now, false));
        assert!(!c.admits_in(Priority::Sheddable, 5, 0, now, false));
        assert!(c.admits_in(Priority::Critical, 3, 3, now, false));
        assert!(!c.admits_in(Priority::Critical, 4, 4, now, false));
        // A class's queue stands only past its own bound.
        assert!(!c.standing_in(Priority::Sheddable, now, 1));
        assert!(c.standing_in(Priority::Sheddable, now, 2));
        assert!(!c.standing_in(Priority::Critical, now, 4));
        assert!(c.standing(now, 6));
    }

    #[test]
    fn a_shielded_task_is_bounded_by_the_interval() {
        let t0 = Instant::now();
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(3, t0);
        assert_eq!(c.bound(at(t0, 50), true), None, "calm: no bound");
        let now = at(t0, 200);
        assert_eq!(c.bound(now, true), Some(Duration::from_millis(100)));
        assert_eq!(c.on_dequeue_for(at(t0, 150), now, true), Verdict::Serve);
        assert_eq!(c.on_dequeue_for(at(t0, 150), now, false), Verdict::Shed);
        assert_eq!(c.on_dequeue_for(at(t0, 99), now, true), Verdict::Shed);
        assert_eq!(
            c.expires_at_for(at(t0, 150), now, true),
            Some(at(t0, 250) + Duration::from_nanos(1))
        );
        // max_wait, when shorter, still bounds it.
        let mut c = Codel::new(CodelConfig {
            max_wait: Some(Duration::from_millis(30)),
            ..CodelConfig::default()
        });
        c.on_queue_len(3, t0);
        assert_eq!(c.bound(now, true), Some(Duration::from_millis(30)));
    }

    #[test]
    fn instants_out_of_order_do_not_panic() {
        let t0 = at(Instant::now(), 1_000);
        let mut c = Codel::new(CodelConfig::default());
        c.on_queue_len(1, t0);
        c.poll(at(t0, 100));
        // Enqueued "after" now: waited zero.
        assert_eq!(
            c.on_dequeue_for(at(t0, 500), at(t0, 100), false),
            Verdict::Serve
        );
        assert_eq!(c.on_queue_len(0, t0 - Duration::from_millis(900)), None);
        assert_eq!(c.retry_after(t0), Duration::from_millis(100));
    }
}
