//! Shedding by what the user stated: a task's deadline (its own, or the
//! service's default), or the service's latency target (`queue.slo`) for
//! tasks without one. A task with neither is never shed by time: it waits
//! until it is served, bounded only by the queue's capacity.
//!
//! Three rules, after Facebook's "Fail at Scale" (adaptive LIFO), DAGOR and
//! Breakwater (queueing time against what is left), each from the task's
//! due time `due`, the queue's send rate while it had a backlog `rate`, and
//! the service's expected latency `latency` (the mean of recent
//! successes):
//!
//! - **Intake**: a task is refused at once when the tasks ahead of it need
//!   longer than it has: `now + ahead / rate + latency > due`.
//! - **Queue**: a waiting task is shed once `now + latency > due`: it can no
//!   longer be served in time, and sending it would spend a backend's time
//!   on an answer nobody waits for.
//! - **Order**: oldest first, unless the queue has stood (not once empty)
//!   for twice as long as the tasks have from submission to due and still grows
//!   (more came than went in the last 25 ms): then every task served
//!   oldest first would wait about all of its time, and the newest are
//!   served first instead (Fail at Scale's adaptive LIFO, with the user's
//!   own time as the interval). Oldest first is what serves the most tasks
//!   in time when all have the same time (the newest only serves them
//!   sooner), so a queue that drains, after a burst, drains in order.
//!   A queue that has stood three times as long stays newest first until
//!   it empties: in order, a lull would serve its oldest tasks, late. For
//!   the order, "empty" means empty for a whole growth period: a turn that
//!   happened to send all that was ready is no end of an overload (the
//!   depth below counts strictly).
//!   A window after newest first began, the queue keeps only what the
//!   backends take in four fifths of one attempt's time
//!   ([`DeadlineControl::depth`]), so its deepest task is still served
//!   within twice an attempt's time: a task deeper than that would be
//!   served only if arrivals paused, late; it is shed at once (only a task
//!   with a stated time: one without waits until it is served; and never
//!   one of the most important of several classes, which goes first and
//!   is shed only by the queue rule above).
//!
//! The rate counts only the time the queue had tasks waiting: when it was
//! empty, sends followed arrivals and say nothing of what the backends can
//! take. Until a backlog has been seen, intake admits.
//!
//! Pure: every method takes `now`.

use tokio::time::{Duration, Instant};

use crate::algo::time;

/// The send rate is an average over periods of at least this much backlog.
const PERIOD: Duration = Duration::from_millis(100);
/// Whether the queue grows is judged over periods this long (short: a
/// queue that starts to drain is served in order at once; a lull of random
/// arrivals that turns a standing queue over for a period finds it kept
/// shallow by [`DeadlineControl::depth`], so no old task is served late).
const GROWTH_PERIOD: Duration = Duration::from_millis(25);
/// Weight of the newest period in the rate.
const GAIN: f64 = 0.3;
/// A queue is standing (served newest first while it grows) once it has not
/// been empty for this many times the tasks' time from submission to due.
/// One would turn a burst of that length newest first, which leaves its
/// oldest tasks to be shed and the queue too young to serve in the lull
/// after it; two keep bursts of up to twice the deadline in order.
const STANDING_WINDOWS: u32 = 2;
/// The share of one attempt's time whose sends the queue keeps while the
/// newest are served first. The deepest task kept waits that long, then
/// its own attempt: with a whole attempt's time, a fixed service time's
/// p99 lands a turn's delay over twice the unloaded one; with half, a
/// noisy service's queue empties at random and serving falls back to in
/// order, late (the shares measured: `bench/results/features.md`).
const DEPTH_SHARE: f64 = 0.8;
/// Newest-first lasts at least this long after the last shed.
const MIN_HOLD: Duration = Duration::from_millis(50);

/// The deadline control of one queue. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct DeadlineControl {
    /// Sends per second while backlogged, once a period was measured.
    rate: Option<f64>,
    /// The period being measured: backlogged time and sends in it.
    busy: Duration,
    sends: u64,
    /// The last pump, and whether it left tasks waiting.
    last: Option<(Instant, bool)>,
    /// The last shed (or refusal) for time.
    shed_at: Option<Instant>,
    /// Since when tasks have been waiting at every turn's end.
    standing_since: Option<Instant>,
    /// The same, but for moments empty shorter than a growth period (a
    /// turn that happened to send all that was ready): the order follows
    /// this, the depth the strict count.
    busy_since: Option<Instant>,
    /// Since when no task has been waiting at a turn's end.
    empty_since: Option<Instant>,
    /// The time the latest task with a due time had, from submission to due.
    window: Option<Duration>,
    /// Arrivals and sends of the current 25 ms, and since when.
    arrivals: u64,
    period_sends: u64,
    period_start: Option<Instant>,
    /// Arrivals less sends of the last whole period.
    net: i64,
    /// More came than went in the last whole period.
    growing: bool,
}

impl DeadlineControl {
    /// One turn of the queue at `now`: `sent` tasks went out, and `waiting`
    /// says whether tasks were left ready after it.
    pub fn on_turn(&mut self, sent: u64, waiting: bool, now: Instant) {
        if let Some((at, was_waiting)) = self.last {
            if was_waiting {
                self.busy = time::sum(self.busy, now.saturating_duration_since(at));
                self.sends += sent;
            }
        }
        self.last = Some((now, waiting));
        self.period_sends += sent;
        let start = *self.period_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= GROWTH_PERIOD {
            self.net = self.arrivals as i64 - self.period_sends as i64;
            self.growing = self.net > 0;
            self.arrivals = 0;
            self.period_sends = 0;
            self.period_start = Some(now);
        }
        if waiting {
            self.empty_since = None;
            self.standing_since.get_or_insert(now);
            self.busy_since.get_or_insert(now);
        } else {
            self.standing_since = None;
            // Empty for a moment (a turn that sent what was ready) is no
            // end of an overload: only a whole growth period empty is.
            let since = *self.empty_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= GROWTH_PERIOD {
                self.busy_since = None;
            }
        }
        if self.busy >= PERIOD {
            let r = self.sends as f64 / self.busy.as_secs_f64();
            self.rate = Some(self.rate.map_or(r, |old| old + GAIN * (r - old)));
            self.busy = Duration::ZERO;
            self.sends = 0;
        }
    }

    /// A task came in (to the queue or refused).
    pub fn on_arrival(&mut self) {
        self.arrivals += 1;
    }

    /// A task due `window` after its submission came in.
    pub fn on_due(&mut self, window: Duration) {
        self.window = Some(window);
    }

    /// Whether to serve the newest first: the queue has stood at least
    /// twice as long as the latest task's time from submission to due, and
    /// grows; or it has stood three times as long (a lull of random
    /// arrivals in a standing overload, which in order would serve the
    /// tasks that waited longest, late, before the new ones).
    pub fn lifo(&self, now: Instant) -> bool {
        let stood = |windows| Self::stood_since(self.busy_since, self.window, now, windows);
        (self.growing && stood(STANDING_WINDOWS)) || stood(STANDING_WINDOWS + 1)
    }

    /// Whether the queue has stood for `windows` times the tasks' time.
    fn stood(&self, now: Instant, windows: u32) -> bool {
        Self::stood_since(self.standing_since, self.window, now, windows)
    }

    fn stood_since(
        since: Option<Instant>,
        window: Option<Duration>,
        now: Instant,
        windows: u32,
    ) -> bool {
        match (since, window) {
            (Some(since), Some(w)) => {
                now.saturating_duration_since(since) >= w.saturating_mul(windows)
            }
            _ => false,
        }
    }

    /// While the newest are served first, how many tasks the queue keeps:
    /// what the backends take in `DEPTH_SHARE` of one attempt's time
    /// (`latency`) at the measured rate, at least one. A task deeper than
    /// that is served only when arrivals pause, and by then it is late: it
    /// is better refused now, while its caller can still act on it. `None`
    /// when serving in order (every task the queue holds may still be
    /// served in time).
    pub fn depth(&self, latency: Duration, now: Instant) -> Option<usize> {
        // One window after newest first began: a burst that just reached
        // the standing length keeps its backlog for the lull after it.
        if !self.growing || !self.stood(now, STANDING_WINDOWS + 1) {
            return None;
        }
        let rate = self.rate.unwrap_or(0.0);
        let kept = rate * latency.as_secs_f64() * DEPTH_SHARE;
        Some((kept.ceil() as usize).max(1))
    }

    /// Tasks sent per second while tasks waited, if measured yet.
    #[cfg(any(test, feature = "internals"))]
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// How long `ahead` tasks take to go out at the measured rate (zero
    /// before it is measured, or for none ahead).
    pub fn wait_for(&self, ahead: usize) -> Duration {
        match self.rate {
            Some(r) if r > 0.0 && ahead > 0 => Duration::from_secs_f64(
                (ahead as f64 / r).min(crate::algo::time::MAX_DURATION.as_secs_f64()),
            ),
            Some(_) if ahead > 0 => crate::algo::time::MAX_DURATION,
            _ => Duration::ZERO,
        }
    }

    /// Whether a new task due at `due`, with `ahead` tasks to go before it,
    /// can be served in time when an attempt takes `latency`.
    pub fn admits(&self, ahead: usize, due: Instant, latency: Duration, now: Instant) -> bool {
        let done = time::add(time::add(now, self.wait_for(ahead)), latency);
        done <= due
    }

    /// Whether a task due at `due` can still be served in time.
    pub fn servable(due: Instant, latency: Duration, now: Instant) -> bool {
        time::add(now, latency) <= due
    }

    /// A task was shed or refused for time at `now`. Returns true when this
    /// starts an overload (nothing was shed within `hold` before).
    pub fn on_shed(&mut self, hold: Duration, now: Instant) -> bool {
        let calm = !self.overloaded(hold, now);
        self.shed_at = Some(now);
        calm
    }

    /// Whether tasks were shed for time within `hold` (at least 50 ms)
    /// before `now`: the service is overloaded.
    pub fn overloaded(&self, hold: Duration, now: Instant) -> bool {
        self.shed_at
            .is_some_and(|t| now < time::add(t, hold.max(MIN_HOLD)))
    }

    /// When the current overload ends if nothing more is shed.
    #[cfg(any(test, feature = "internals"))]
    pub fn calm_at(&self, hold: Duration) -> Option<Instant> {
        self.shed_at.map(|t| time::add(t, hold.max(MIN_HOLD)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rate_counts_only_backlogged_time() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        // Idle turns: no backlog, no rate.
        for i in 1..=100 {
            c.on_turn(1, false, t0 + MS * i);
        }
        assert_eq!(c.rate(), None);
        assert_eq!(c.wait_for(10), Duration::ZERO);
        // Backlogged: 2 sends per ms for 100 ms: 2000/s.
        let t1 = t0 + MS * 200;
        c.on_turn(0, true, t1);
        for i in 1..=100 {
            c.on_turn(2, true, t1 + MS * i);
        }
        assert_eq!(c.rate(), Some(2000.0));
        assert_eq!(c.wait_for(200), MS * 100);
        // A slower period moves it by 30 %: 1000/s measured, 1700/s.
        for i in 101..=200 {
            c.on_turn(1, true, t1 + MS * i);
        }
        assert!((c.rate().unwrap() - 1700.0).abs() < 1e-6);
    }

    #[test]
    fn intake_admits_what_can_finish_in_time() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        let due = t0 + MS * 250;
        // Before any rate: only the latency counts.
        assert!(c.admits(1000, due, MS * 250, t0));
        assert!(!c.admits(0, due, MS * 251, t0));
        c.on_turn(0, true, t0);
        c.on_turn(100, true, t0 + MS * 100); // 1000/s
                                             // 200 ahead: 200 ms, plus 50 ms of latency: just in time.
        assert!(c.admits(200, due, MS * 50, t0));
        assert!(!c.admits(201, due, MS * 50, t0));
        assert!(DeadlineControl::servable(due, MS * 250, t0));
        assert!(!DeadlineControl::servable(due, MS * 250, t0 + MS));
    }

    #[test]
    fn newest_first_once_the_queue_stood_twice_as_long_as_tasks_have() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        // Two arrivals for each send, every 10 ms.
        let turn = |c: &mut DeadlineControl, ms: u32, waiting: bool, arrivals: u64| {
            for _ in 0..arrivals {
                c.on_arrival();
            }
            c.on_turn(1, waiting, t0 + MS * ms);
        };
        turn(&mut c, 0, true, 2);
        for ms in (10..=240).step_by(10) {
            turn(&mut c, ms, true, 2);
        }
        assert!(!c.lifo(t0 + MS * 240), "no task with a due time seen");
        c.on_due(MS * 125);
        turn(&mut c, 249, true, 2);
        assert!(!c.lifo(t0 + MS * 249));
        assert!(c.lifo(t0 + MS * 250));
        // Arrivals stop: the queue drains, oldest first, once a whole
        // period has shown it.
        for ms in (260..=370).step_by(10) {
            turn(&mut c, ms, true, 0);
        }
        assert!(!c.lifo(t0 + MS * 370));
        // Standing three windows (375 ms), it is newest first again, grown
        // or not.
        assert!(c.lifo(t0 + MS * 375));
        for ms in (380..=440).step_by(10) {
            turn(&mut c, ms, true, 0);
        }
        // Empty for a moment (a turn that sent all that was ready): the
        // order holds ...
        turn(&mut c, 445, false, 0);
        turn(&mut c, 450, true, 0);
        assert!(c.lifo(t0 + MS * 450));
        // ... empty for a whole growth period (25 ms): the count starts anew.
        turn(&mut c, 455, false, 0);
        turn(&mut c, 480, false, 2);
        for ms in (490..=710).step_by(10) {
            turn(&mut c, ms, true, 2);
        }
        turn(&mut c, 730, true, 2);
        assert!(!c.lifo(t0 + MS * 739));
        assert_eq!(c.depth(MS * 20, t0 + MS * 739), None);
        assert!(c.lifo(t0 + MS * 740));
        // The depth one window later: about one send per 10 ms (100/s, the
        // lull counted); one attempt of 15 ms: a depth of 2.
        assert_eq!(c.depth(MS * 15, t0 + MS * 740), None);
        assert!((c.rate().unwrap() - 100.0).abs() < 5.0, "{:?}", c.rate());
        assert_eq!(c.depth(MS * 15, t0 + MS * 865), Some(2));
        assert_eq!(c.depth(MS, t0 + MS * 865), Some(1));
        // Four fifths of an attempt's time: of 45 ms, 3.6 sends (4.5 whole).
        assert_eq!(c.depth(MS * 45, t0 + MS * 865), Some(4));
        // A moment empty ends the depth (its count is strict) ...
        turn(&mut c, 866, false, 2);
        turn(&mut c, 867, true, 2);
        assert_eq!(c.depth(MS * 15, t0 + MS * 867), None);
        // ... not the order. A period without arrivals: a queue that has
        // stood three windows stays newest first until it empties (a lull
        // in a standing overload serves the newest, not the oldest, which
        // have waited longest).
        for ms in (870..=900).step_by(10) {
            turn(&mut c, ms, true, 0);
        }
        assert!(c.lifo(t0 + MS * 900));
        turn(&mut c, 910, false, 0);
        turn(&mut c, 935, false, 0);
        assert!(!c.lifo(t0 + MS * 935), "empty: in order again");
    }

    #[test]
    fn overload_holds_after_a_shed() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        assert!(!c.overloaded(MS * 20, t0));
        assert!(c.on_shed(MS * 20, t0), "the first shed starts an overload");
        assert!(!c.on_shed(MS * 20, t0 + MS * 10));
        // The hold is at least 50 ms.
        assert!(c.overloaded(MS * 20, t0 + MS * 59));
        assert!(!c.overloaded(MS * 20, t0 + MS * 60));
        assert_eq!(c.calm_at(MS * 80), Some(t0 + MS * 90));
    }
}
