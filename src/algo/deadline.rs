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
//!   longer than it has: `now + ahead / rate + latency > due` (counted as
//!   newest first serves, below, while it does, and while a turn to it
//!   waits for the growth that confirms it).
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
//!   Newest first begins only once a whole growth period after the queue
//!   turned has grown too: a burst that ends as the queue turns keeps its
//!   order, and the lull after it serves its backlog (turned newest first
//!   for the 25 ms a burst's last period still reads as growth, a pool
//!   served its newest and left as many of its oldest to expire: 0.93 of
//!   the oracle's goodput under bimodal bursts). A queue that has stood
//!   three times as long stays newest first until it empties: in order, a
//!   lull would serve its oldest tasks, late. For the order, "empty" means
//!   empty for a whole growth period: a turn that happened to send all
//!   that was ready is no end of an overload (the depth below begins
//!   after three windows counted strictly). A queue that fills again and
//!   grows within a window of newest first is served newest first at
//!   once: counted anew, its two windows of standing would be served in
//!   order, late (the fast stretches of a bimodal service at 2× empty the
//!   shallow queue newest first keeps).
//!   A window after newest first began, the queue keeps only what the
//!   backends take in four fifths of one attempt's time
//!   ([`DeadlineControl::depth`]), so its deepest task is still served
//!   within twice an attempt's time: a task deeper than that would be
//!   served only if arrivals paused, late; it is shed at once (only a task
//!   with a stated time: one without waits until it is served; and never
//!   one of the most important of several classes, which goes first and
//!   is shed only by the queue rule above). The depth begins once the
//!   queue has stood three windows, counted strictly; once it applies, a
//!   turn that sends all the queue holds does not end it (workers that
//!   free together take all of a shallow queue; counted anew, the queue
//!   grew three windows deep and its oldest expired in it), a growth
//!   period that did not grow does.
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
    /// When the last whole growth period began.
    judged_from: Option<Instant>,
    /// When the queue first turned in this busy stretch (stood long
    /// enough to serve the newest first).
    turned_at: Option<Instant>,
    /// Whether the queue grew through a whole period after it turned in
    /// this busy stretch: newest first has begun.
    confirmed: bool,
    /// The last turn's end with newest first in force.
    newest_at: Option<Instant>,
    /// The depth applies: the queue stood three windows (counted
    /// strictly) newest first and grows. A moment empty does not end it,
    /// a period that did not grow or the end of newest first does.
    deep: bool,
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
            self.judged_from = Some(start);
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
        if self.busy_since.is_none() {
            self.turned_at = None;
            self.confirmed = false;
        } else if self.turned(now) {
            // Newest first once a whole period after the turn still grew
            // (a burst that ends as the queue turns is served in order:
            // its backlog is what the lull after it serves), or at once
            // after a moment empty within a window of newest first.
            let at = *self.turned_at.get_or_insert(now);
            let grew = self.growing && self.judged_from.is_some_and(|j| j >= at);
            self.confirmed |= grew || self.recent(now);
        }
        if self.lifo(now) {
            self.newest_at = Some(now);
        }
        // Once the depth applies, a turn that sends all the queue holds is
        // no end of it: the queue is kept shallow, and workers that free
        // together (a fixed service time's answers on one timer tick) take
        // all of it. Counted strictly, each such turn put the depth off
        // for three windows, in which the queue served newest first grew
        // and its oldest expired in it (refusals' p99 229 ms at 2x on real
        // sockets, 18 ms with this). A period that did not grow ends it: a
        // backend that gained workers, or load that fell, empties the
        // queue for good, and a depth from the old send rate would shed
        // what can now be served.
        if !self.confirmed || !self.growing {
            self.deep = false;
        } else if self.stood(now, STANDING_WINDOWS + 1) {
            self.deep = true;
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

    /// Whether to serve the newest first: the queue has turned (stood at
    /// least twice as long as the latest task's time from submission to
    /// due, and grows; or three times as long: a lull of random arrivals
    /// in a standing overload, which in order would serve the tasks that
    /// waited longest, late, before the new ones), and a whole growth
    /// period after the turn grew too (or it turned again within a window
    /// of newest first).
    pub fn lifo(&self, now: Instant) -> bool {
        self.confirmed && self.turned(now)
    }

    /// Whether the queue has turned and waits for a period of growth to
    /// confirm it: served in order meanwhile, but a new task is admitted as
    /// newest first would serve it (it goes before the backlog once the
    /// growth confirms the turn; refused for the backlog's depth, the
    /// fresh tasks of a standing overload were lost for that period).
    pub fn turning(&self, now: Instant) -> bool {
        !self.confirmed && self.turned_at.is_some() && self.turned(now)
    }

    /// Whether the queue has stood long enough to serve the newest first:
    /// twice the tasks' time while it grows, three times in any case, or,
    /// while it grows, tasks wait again within a window of newest first.
    fn turned(&self, now: Instant) -> bool {
        let stood = |windows| Self::stood_since(self.busy_since, self.window, now, windows);
        (self.growing && (stood(STANDING_WINDOWS) || self.recent(now)))
            || stood(STANDING_WINDOWS + 1)
    }

    /// Whether tasks wait and newest first was in force less than a window
    /// (the tasks' time from submission to due) before `now`: a standing
    /// overload whose queue emptied for a moment. Counted anew, its two
    /// windows of standing would be served in order, late (bimodal service
    /// at 2x: its fast stretches empty the shallow queue newest first
    /// keeps).
    fn recent(&self, now: Instant) -> bool {
        self.busy_since.is_some()
            && matches!((self.newest_at, self.window),
                (Some(t), Some(w)) if now.saturating_duration_since(t) < w)
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
        // One window after the turn, and once newest first began: a burst
        // that just reached the standing length keeps its backlog for the
        // lull after it. Then until a period does not grow (`deep`).
        let stood = self.deep || self.stood(now, STANDING_WINDOWS + 1);
        if !self.growing || !stood || !self.confirmed {
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
    fn newest_first_once_the_queue_stood_twice_as_long_as_tasks_have_and_still_grows() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        // Two arrivals for each send, every 10 ms (growth is judged over
        // periods of 25 ms or more: here 0-30, 30-60, ...).
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
        // Stood two windows (250 ms) and grows: turned, but served in
        // order until a whole period after the turn has grown too (the
        // period 240-270 began before it) ...
        // (meanwhile a new task is admitted as newest first would serve it)
        for ms in (250..=290).step_by(10) {
            turn(&mut c, ms, true, 2);
            assert!(!c.lifo(t0 + MS * ms), "{ms}");
            assert!(c.turning(t0 + MS * ms), "{ms}");
        }
        // ... as 270-300 did: newest first.
        turn(&mut c, 300, true, 2);
        assert!(c.lifo(t0 + MS * 300));
        assert!(!c.turning(t0 + MS * 300));
        // Arrivals stop: the queue drains, oldest first, once a whole
        // period has shown it.
        for ms in (310..=370).step_by(10) {
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
        // ... empty for a whole growth period (25 ms): a new busy stretch,
        // but within a window (125 ms) of newest first: newest first again
        // as soon as it grows, without standing two windows anew.
        turn(&mut c, 455, false, 0);
        turn(&mut c, 480, false, 0);
        assert!(!c.lifo(t0 + MS * 480), "empty: in order");
        turn(&mut c, 490, true, 2);
        turn(&mut c, 500, true, 2);
        assert!(!c.lifo(t0 + MS * 500), "no growth judged yet");
        turn(&mut c, 510, true, 2);
        assert!(c.lifo(t0 + MS * 510), "the period 480-510 grew");
        // Empty for longer than a window: the count starts anew.
        for ms in (520..=700).step_by(10) {
            turn(&mut c, ms, false, 0);
        }
        turn(&mut c, 710, true, 2);
        for ms in (720..=950).step_by(10) {
            turn(&mut c, ms, true, 2);
            assert!(!c.lifo(t0 + MS * ms), "{ms}");
        }
        assert_eq!(c.depth(MS * 20, t0 + MS * 950), None);
        // Turned at 960; the period 960-990 grows, newest first at its end.
        for ms in (960..=980).step_by(10) {
            turn(&mut c, ms, true, 2);
            assert!(!c.lifo(t0 + MS * ms), "{ms}");
        }
        turn(&mut c, 990, true, 2);
        assert!(c.lifo(t0 + MS * 990));
        turn(&mut c, 1000, true, 2);
        turn(&mut c, 1010, true, 2);
        // The depth from three windows (1085 ms): about one send per 10
        // ms (100/s, the lull counted); one attempt of 15 ms: a depth of 2.
        assert_eq!(c.depth(MS * 15, t0 + MS * 1010), None);
        assert!((c.rate().unwrap() - 100.0).abs() < 5.0, "{:?}", c.rate());
        assert_eq!(c.depth(MS * 15, t0 + MS * 1085), Some(2));
        assert_eq!(c.depth(MS, t0 + MS * 1085), Some(1));
        // Four fifths of an attempt's time: of 45 ms, 3.6 sends (4.5 whole).
        assert_eq!(c.depth(MS * 45, t0 + MS * 1085), Some(4));
        // Once it applies (the first turn after three windows) ...
        turn(&mut c, 1085, true, 2);
        // ... a moment empty (workers that freed together took all the
        // queue kept) does not end it ...
        turn(&mut c, 1086, false, 2);
        turn(&mut c, 1087, true, 2);
        assert_eq!(c.depth(MS * 15, t0 + MS * 1087), Some(2));
        // ... a period that did not grow does, and the order holds. A
        // period without arrivals: a queue that has stood three windows
        // stays newest first until it empties (a lull in a standing
        // overload serves the newest, not the oldest, which have waited
        // longest).
        for ms in (1090..=1120).step_by(10) {
            turn(&mut c, ms, true, 0);
        }
        assert!(c.lifo(t0 + MS * 1120));
        assert_eq!(c.depth(MS * 15, t0 + MS * 1120), None);
        // Growing again, it applies only once the queue has stood three
        // windows counted strictly (since 1087, to 1462).
        for ms in (1130..=1460).step_by(10) {
            turn(&mut c, ms, true, 2);
            assert_eq!(c.depth(MS * 15, t0 + MS * ms), None, "{ms}");
        }
        turn(&mut c, 1470, true, 2);
        assert_eq!(c.depth(MS * 15, t0 + MS * 1470), Some(2));
        turn(&mut c, 1480, false, 0);
        turn(&mut c, 1505, false, 0);
        assert!(!c.lifo(t0 + MS * 1505), "empty: in order again");
        assert_eq!(c.depth(MS * 15, t0 + MS * 1505), None);
    }

    #[test]
    fn a_burst_that_ends_as_the_queue_turns_is_served_in_order() {
        let t0 = Instant::now();
        let mut c = DeadlineControl::default();
        c.on_due(MS * 125);
        // Two arrivals for each send for 250 ms (two windows), then none.
        let turn = |c: &mut DeadlineControl, ms: u32, arrivals: u64| {
            for _ in 0..arrivals {
                c.on_arrival();
            }
            c.on_turn(1, true, t0 + MS * ms);
        };
        for ms in (0..=250).step_by(10) {
            turn(&mut c, ms, if ms < 250 { 2 } else { 0 });
        }
        // Turned at 250 (the period 210-240 grew), but the burst is over:
        // no period after the turn grows, and the backlog it left is
        // served oldest first through the lull (while growth is still the
        // last period's, to 270, turning: a new task would count as
        // newest first serves it).
        for ms in (260..=370).step_by(10) {
            turn(&mut c, ms, 0);
            assert!(!c.lifo(t0 + MS * ms), "{ms}");
            assert_eq!(c.turning(t0 + MS * ms), ms < 270, "{ms}");
            assert_eq!(c.depth(MS * 15, t0 + MS * ms), None);
        }
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
