//! Headroom: the part of a learned limit that only the most important
//! class may take, and the node a task goes to when every worker is busy.
//!
//! A learned limit ([`crate::algo::concurrency`]) keeps about one request
//! waiting inside each backend, where no priority of ours reaches. So a
//! node's limit has two tiers ([`tiers`]): its **free limit**, the
//! concurrency the backend serves without queueing (the limit less Vegas's
//! queue estimate; the whole limit when it is fixed), and the **headroom**
//! above it, the backend's own queue.
//!
//! Less important classes fill a node only up to its free limit. The *top
//! class* (the most important one seen within [`HOLD`]) goes first in the
//! queue, and takes headroom only while nothing below it waits
//! ([`ClassReserve::may_take_headroom`]): waiting in the queue for the first
//! worker that frees anywhere is shorter than waiting inside one backend
//! behind an estimate (`bench/results/headroom.md`). A class that comes
//! alone takes the whole limit. The balancer tells the queue the
//! **reserve**, the headroom part of the nodes' room; the queue sends the
//! reserve only to the top class ([`ClassReserve::lowest`]).
//!
//! A task that takes headroom goes to the node expected to free a worker
//! first: [`DispatchTimes`] keeps when each attempt in flight is due to
//! end, and [`DispatchTimes::frees_at`] says when the next worker frees.
//! Pure: every method takes `now`.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::headroom::{tiers, ClassReserve};
//! use actix_dispatch::algo::priority::Priority;
//! let now = tokio::time::Instant::now();
//! assert_eq!(tiers(5, 4, 4), (1, 0)); // limit 5, free limit 4, 4 in flight
//! let mut r = ClassReserve::default();
//! r.seen(Priority::Critical, now);
//! r.seen(Priority::Sheddable, now);
//! // Credit 1, all reserve: only critical, and only while nothing below waits.
//! assert_eq!(r.lowest(1, 1, |_| false, now), Some(Priority::Critical));
//! assert_eq!(r.lowest(1, 1, |_| true, now), None);
//! assert_eq!(r.lowest(3, 1, |_| true, now), Some(Priority::Sheddable));
//! # }
//! ```

use std::collections::VecDeque;

use tokio::time::{Duration, Instant};

use crate::algo::priority::{Priority, CLASSES};
use crate::algo::time;

/// How long a class counts as coming after its last task: the top class
/// keeps the headroom this long. A second: a critical task every second
/// keeps it, and a class that stopped coming gives it back within one.
pub const HOLD: Duration = Duration::from_secs(1);

/// A node's room in tiers: `(room, below)`, where `room` is what the limit
/// leaves (`limit - in_flight`) and `below` the part of it under the free
/// limit (`free - in_flight`), which any class may take.
#[cfg(any(test, feature = "internals"))]
pub fn tiers(limit: u32, free: u32, in_flight: u32) -> (u32, u32) {
    let room = limit.saturating_sub(in_flight);
    (room, free.min(limit).saturating_sub(in_flight).min(room))
}

/// The queue's side: which classes came lately, and which classes the next
/// send may serve.
#[derive(Debug, Clone, Default)]
pub struct ClassReserve {
    /// When each class last came, most important first.
    last: [Option<Instant>; CLASSES],
}

impl ClassReserve {
    /// A task of `class` came at `now`.
    pub fn seen(&mut self, class: Priority, now: Instant) {
        let slot = &mut self.last[class.index()];
        if slot.is_none_or(|t| t < now) {
            *slot = Some(now);
        }
    }

    /// The classes that came within [`HOLD`] of `now`, most important first.
    fn lately(&self, now: Instant) -> impl Iterator<Item = Priority> + '_ {
        Priority::ALL
            .into_iter()
            .zip(self.last)
            .filter(move |(_, t)| t.is_some_and(|t| now < time::add(t, HOLD)))
            .map(|(p, _)| p)
    }

    /// The most important class that came within [`HOLD`] of `now`, when
    /// a less important one came within it too (`None` when one class
    /// comes alone).
    pub fn top_of_several(&self, now: Instant) -> Option<Priority> {
        let mut lately = self.lately(now);
        let top = lately.next()?;
        lately.next().map(|_| top)
    }

    /// The most important class that came within [`HOLD`] of `now`.
    pub fn top(&self, now: Instant) -> Option<Priority> {
        self.lately(now).next()
    }

    /// Whether a task of `class` may take headroom at `now`, where
    /// `waits_below(top)` says whether a task of a class less important
    /// than the top class is ready: only a task of the top class (or one
    /// above it), and only while no such task waits.
    ///
    /// While lower classes wait, the top class does not take headroom
    /// inside a backend: it waits in the queue for the first worker that
    /// frees on any node, which the queue gives it ahead of every lower
    /// class. That is the shortest wait there is, where an estimate of
    /// which backend frees a worker first errs; the headroom is for a top
    /// class alone, whose next request should be inside the backend when a
    /// worker ends.
    pub fn may_take_headroom(
        &self,
        class: Priority,
        waits_below: impl FnOnce(Priority) -> bool,
        now: Instant,
    ) -> bool {
        let top = self.top(now).unwrap_or(Priority::Sheddable);
        class.index() <= top.index() && !waits_below(top)
    }

    /// The least important class the next send may serve, holding
    /// `credit` of which `reserve` is headroom: any class while the credit
    /// exceeds the reserve; else the top class and those above it, if they
    /// may take headroom ([`may_take_headroom`](Self::may_take_headroom));
    /// else none (`None`: the reserve is kept).
    pub fn lowest(
        &self,
        credit: usize,
        reserve: usize,
        waits_below: impl FnOnce(Priority) -> bool,
        now: Instant,
    ) -> Option<Priority> {
        if credit > reserve {
            return Some(Priority::Sheddable);
        }
        let top = self.top(now).unwrap_or(Priority::Sheddable);
        self.may_take_headroom(top, waits_below, now).then_some(top)
    }
}

/// The balancer's side, per node: when each attempt in flight is expected
/// to end, in the order they were sent.
///
/// The backend is taken to serve its queue in order with `free` workers,
/// each request for `service`: a request sent at `at` starts at once if a
/// worker is idle, else when the request ahead of it that frees a worker
/// ends, and is due `service` after it starts. Attempts are taken to end in
/// the order they were sent; when they do not, the entries kept are those
/// of the latest dispatches, so the estimate errs late.
#[derive(Debug, Clone, Default)]
pub struct DispatchTimes {
    due: VecDeque<Instant>,
}

impl DispatchTimes {
    /// An attempt was sent at `at` to a backend of `free` workers, each
    /// request taking `service`.
    pub fn sent(&mut self, at: Instant, free: u32, service: Duration) {
        let start = self.ahead(free).map_or(at, |t| t.max(at));
        self.due.push_back(time::add(start, service));
    }

    /// `n` attempts ended at `now`. The requests that now hold the freed
    /// workers (the first `free` in flight) started no later than `now`,
    /// so none is due later than `now + service`: those that waited inside
    /// the backend for a worker freed earlier than expected move up.
    pub fn ended(&mut self, n: u32, free: u32, service: Duration, now: Instant) {
        let n = (n as usize).min(self.due.len());
        self.due.drain(..n);
        let bound = time::add(now, service);
        let holding = self.due.len().min(free.max(1) as usize);
        // Nondecreasing while `service` holds still: the latest go first.
        for d in self.due.range_mut(..holding).rev() {
            if *d <= bound {
                break;
            }
            *d = bound;
        }
    }

    /// Keeps at most the latest `n` entries (the attempts in flight as the
    /// balancer counts them, should the two counts part).
    pub fn keep(&mut self, n: u32) {
        let extra = self.due.len().saturating_sub(n as usize);
        self.due.drain(..extra);
    }

    /// Attempts in flight by this count.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether nothing is in flight by this count.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// When the request whose end frees a worker for the next one is due:
    /// with `n` in flight, the `(n - free + 1)`-th to end (those already
    /// waiting inside go first). `None` while a worker is idle.
    fn ahead(&self, free: u32) -> Option<Instant> {
        let free = free.max(1) as usize;
        let n = self.due.len();
        (n >= free).then(|| self.due[n - free])
    }

    /// When a request sent at `now` would get one of the backend's `free`
    /// workers, each request taking `service`: `None` while a worker is
    /// idle (the best a node can offer); else when the request ahead of it
    /// is due.
    ///
    /// The service time is the least latency seen, so most requests end a
    /// little after they are due: one late by up to a quarter of `service`
    /// is about to end, and keeps its instant (the earlier it was due,
    /// the nearer its end). One later than that is held up by something the estimate
    /// does not know, and counts as no better than average: `now` plus
    /// `service / free`, the mean gap between two of its workers freeing.
    pub fn frees_at(&self, free: u32, service: Duration, now: Instant) -> Option<Instant> {
        let due = self.ahead(free)?;
        if time::add(due, service / 4) >= now {
            Some(due)
        } else {
            Some(time::add(now, service / free.max(1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn tiers_split_the_room_at_the_free_limit() {
        assert_eq!(tiers(5, 4, 0), (5, 4));
        assert_eq!(tiers(5, 4, 3), (2, 1));
        assert_eq!(tiers(5, 4, 4), (1, 0));
        assert_eq!(tiers(5, 4, 5), (0, 0));
        assert_eq!(tiers(5, 4, 7), (0, 0));
        // A fixed limit: no headroom.
        assert_eq!(tiers(4, 4, 2), (2, 2));
        // A free limit above the limit (a probe lowered the limit) is the
        // limit.
        assert_eq!(tiers(3, 4, 1), (2, 2));
    }

    #[test]
    fn the_top_class_is_the_most_important_within_the_hold() {
        let t0 = Instant::now();
        let mut r = ClassReserve::default();
        assert_eq!(r.top(t0), None);
        r.seen(Priority::Sheddable, t0);
        assert_eq!(r.top(t0), Some(Priority::Sheddable));
        r.seen(Priority::Critical, t0 + 10 * MS);
        assert_eq!(r.top(t0 + 10 * MS), Some(Priority::Critical));
        // The critical class is held for HOLD after its last task...
        let end = t0 + 10 * MS + HOLD;
        assert_eq!(r.top(end - MS), Some(Priority::Critical));
        // ...and then gives way to the sheddable one, if it still comes.
        r.seen(Priority::Sheddable, end - MS);
        assert_eq!(r.top(end), Some(Priority::Sheddable));
        assert_eq!(r.top(end + HOLD), None);
        // An instant older than the one kept does not move it back.
        r.seen(Priority::Critical, t0);
        assert_eq!(r.top(end), Some(Priority::Sheddable));
    }

    #[test]
    fn the_top_of_several_needs_a_less_important_class_within_the_hold() {
        let t0 = Instant::now();
        let mut r = ClassReserve::default();
        assert_eq!(r.top_of_several(t0), None);
        // One class alone is no top of several.
        r.seen(Priority::Critical, t0);
        assert_eq!(r.top_of_several(t0), None);
        r.seen(Priority::Sheddable, t0 + 10 * MS);
        assert_eq!(r.top_of_several(t0 + 10 * MS), Some(Priority::Critical));
        r.seen(Priority::Default, t0 + 10 * MS);
        assert_eq!(r.top_of_several(t0 + 10 * MS), Some(Priority::Critical));
        // The critical class gone for HOLD: the default one tops the rest.
        assert_eq!(r.top_of_several(t0 + HOLD), Some(Priority::Default));
        // Every class gone but one.
        r.seen(Priority::Sheddable, t0 + HOLD);
        assert_eq!(r.top_of_several(t0 + 10 * MS + HOLD), None);
    }

    #[test]
    fn lower_classes_go_only_while_credit_exceeds_the_reserve() {
        let t0 = Instant::now();
        let none = |_| false;
        let mut r = ClassReserve::default();
        // Nothing seen: any class.
        assert_eq!(r.lowest(0, 3, none, t0), Some(Priority::Sheddable));
        r.seen(Priority::Default, t0);
        r.seen(Priority::Sheddable, t0);
        assert_eq!(r.lowest(4, 3, none, t0), Some(Priority::Sheddable));
        assert_eq!(r.lowest(3, 3, none, t0), Some(Priority::Default));
        assert_eq!(r.lowest(1, 3, none, t0), Some(Priority::Default));
        r.seen(Priority::Critical, t0);
        assert_eq!(r.lowest(3, 3, none, t0), Some(Priority::Critical));
        assert_eq!(r.lowest(3, 0, none, t0), Some(Priority::Sheddable));
        // The critical class stopped coming: default is top again.
        assert_eq!(r.lowest(3, 3, none, t0 + HOLD), Some(Priority::Sheddable));
        r.seen(Priority::Default, t0 + HOLD);
        assert_eq!(r.lowest(3, 3, none, t0 + HOLD), Some(Priority::Default));
    }

    #[test]
    fn the_top_class_keeps_off_the_headroom_while_a_lower_class_waits() {
        let t0 = Instant::now();
        let mut r = ClassReserve::default();
        r.seen(Priority::Critical, t0);
        r.seen(Priority::Sheddable, t0);
        // Sheddable tasks wait below the critical top class.
        let mut asked = None;
        let waits = |top| {
            asked = Some(top);
            true
        };
        // Only headroom in hand: nothing goes; the critical task waits for
        // the next worker that frees anywhere.
        assert_eq!(r.lowest(2, 2, waits, t0), None);
        assert_eq!(asked, Some(Priority::Critical));
        // Room below the free limits serves any class (the queue takes the
        // most important first).
        assert_eq!(r.lowest(3, 2, |_| true, t0), Some(Priority::Sheddable));
        // Nothing below waits: the critical class takes the headroom.
        assert_eq!(r.lowest(2, 2, |_| false, t0), Some(Priority::Critical));
        assert!(r.may_take_headroom(Priority::Critical, |_| false, t0));
        assert!(!r.may_take_headroom(Priority::Critical, |_| true, t0));
        // A class below the top never takes it.
        assert!(!r.may_take_headroom(Priority::Default, |_| false, t0));
        // Alone, the sheddable class is the top one and takes it.
        let t1 = t0 + HOLD;
        r.seen(Priority::Sheddable, t1);
        assert!(r.may_take_headroom(Priority::Sheddable, |_| false, t1));
        assert_eq!(r.lowest(2, 2, |_| false, t1), Some(Priority::Sheddable));
    }

    #[test]
    fn a_worker_frees_when_the_request_ahead_is_due() {
        let t0 = Instant::now();
        let s = 20 * MS;
        let mut d = DispatchTimes::default();
        // Idle workers: a worker now.
        assert_eq!(d.frees_at(4, s, t0), None);
        for k in 0..3 {
            d.sent(t0 + k * 5 * MS, 4, s);
        }
        assert_eq!(d.frees_at(4, s, t0 + 10 * MS), None);
        // Four workers busy since 0, 5, 10 and 15 ms: the first frees its
        // worker at 20.
        d.sent(t0 + 15 * MS, 4, s);
        assert_eq!(d.len(), 4);
        assert_eq!(d.frees_at(4, s, t0 + 16 * MS), Some(t0 + 20 * MS));
        // One more, sent at 16, waits inside for that worker: it starts at
        // 20 and is due at 40. A request now waits for the second to end.
        d.sent(t0 + 16 * MS, 4, s);
        assert_eq!(d.frees_at(4, s, t0 + 16 * MS), Some(t0 + 25 * MS));
        // With one more, all four busy ones are ahead: the waiting one's
        // worker frees at 40.
        d.sent(t0 + 17 * MS, 4, s);
        assert_eq!(d.frees_at(4, s, t0 + 17 * MS), Some(t0 + 30 * MS));
        d.sent(t0 + 17 * MS, 4, s);
        d.sent(t0 + 17 * MS, 4, s);
        assert_eq!(d.frees_at(4, s, t0 + 17 * MS), Some(t0 + 40 * MS));
        d.keep(2);
        assert_eq!(d.len(), 2);
        d.ended(10, 4, s, t0 + 50 * MS);
        assert!(d.is_empty());
    }

    #[test]
    fn a_request_that_waited_starts_when_a_worker_frees() {
        let t0 = Instant::now();
        let s = 20 * MS;
        let mut d = DispatchTimes::default();
        // Two workers busy since 0 and 1 ms; one more waits, due at 40.
        d.sent(t0, 2, s);
        d.sent(t0 + MS, 2, s);
        d.sent(t0 + 2 * MS, 2, s);
        assert_eq!(d.frees_at(2, s, t0 + 2 * MS), Some(t0 + 21 * MS));
        // The first ends early, at 12: the waiting one started then, due at
        // 32, not 40; the one busy since 1 ms is still due at 21.
        d.ended(1, 2, s, t0 + 12 * MS);
        assert_eq!(d.frees_at(2, s, t0 + 12 * MS), Some(t0 + 21 * MS));
        d.sent(t0 + 12 * MS, 2, s);
        // The new one waits for the one due at 21; the next frees at 32.
        assert_eq!(d.frees_at(2, s, t0 + 12 * MS), Some(t0 + 32 * MS));
    }

    #[test]
    fn a_node_running_late_counts_the_mean_gap() {
        let t0 = Instant::now();
        let mut d = DispatchTimes::default();
        d.sent(t0, 2, 20 * MS);
        d.sent(t0 + MS, 2, 20 * MS);
        // Both workers busy, the oldest due at 20 ms. Up to a quarter of
        // the service time late, it is about to end.
        assert_eq!(d.frees_at(2, 20 * MS, t0 + 25 * MS), Some(t0 + 20 * MS));
        // Later than that, something holds it up: the mean gap from now.
        assert_eq!(d.frees_at(2, 20 * MS, t0 + 30 * MS), Some(t0 + 40 * MS));
        // A free limit of 0 counts as 1.
        assert_eq!(d.frees_at(0, 20 * MS, t0 + 50 * MS), Some(t0 + 70 * MS));
    }

    #[test]
    fn the_node_furthest_along_frees_a_worker_first() {
        let t0 = Instant::now();
        let s = 20 * MS;
        let (mut a, mut b) = (DispatchTimes::default(), DispatchTimes::default());
        for k in [0, 4, 8, 12] {
            a.sent(t0 + k * MS, 4, s);
        }
        for k in [2, 6, 10, 14] {
            b.sent(t0 + k * MS, 4, s);
        }
        let now = t0 + 15 * MS;
        assert_eq!(a.frees_at(4, s, now), Some(t0 + 20 * MS));
        assert_eq!(b.frees_at(4, s, now), Some(t0 + 22 * MS));
        // At 21 ms a is a little late and b not yet due: a still goes first.
        let now = t0 + 21 * MS;
        assert!(a.frees_at(4, s, now) < b.frees_at(4, s, now));
    }
}
