//! Headroom: the part of a learned limit that only the most important
//! class may take, and where a task goes when every backend worker is busy.
//!
//! A learned limit ([`crate::algo::concurrency`]) keeps about one request
//! waiting inside each backend, so that a worker that ends finds the next
//! request at once. That queue is inside the backend, where no priority of
//! ours reaches: a critical task sent there waits behind a sheddable one
//! for a worker. So a node's limit has two tiers:
//!
//! * its **free limit**: the concurrency the backend serves without
//!   queueing, by the learned estimate (the limit less Vegas's queue
//!   estimate, rounded; the whole limit when it is fixed);
//! * the **headroom** above it, up to the limit: the backend's own queue.
//!
//! Tasks of the *top class*, the most important class that came within
//! [`HOLD`], may fill a node up to its limit; tasks of less important
//! classes only up to its free limit. So under a flood of sheddable work
//! the backends' workers stay busy with it, and a critical task never waits
//! inside a backend behind one: it takes the headroom. When one class comes
//! alone it is the top class and takes the whole limit (no worker waits for
//! the engine's next dispatch between two requests). Fixed limits have no
//! headroom, so this changes nothing for them.
//!
//! The balancer tells the queue, with its credit, the **reserve**: how much
//! of the room the nodes have now is headroom (the sum over nodes of room
//! less room below the free limit). The queue sends a task of a class below
//! the top one only while its credit exceeds the reserve
//! ([`ClassReserve::lowest`]), and spends the reserve on top-class tasks.
//!
//! A task that takes headroom waits inside a backend for a worker. It goes
//! to the node expected to free one first: [`DispatchTimes`] keeps the
//! instants of a node's latest dispatches, and [`DispatchTimes::wait`]
//! estimates, from them and the node's unloaded latency, how long until one
//! of its workers is free. The node whose oldest request is the furthest
//! along frees a worker first.
//!
//! The module is pure: every method takes `now`.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::headroom::{tiers, ClassReserve};
//! use actix_dispatch::algo::priority::Priority;
//! use tokio::time::Instant;
//!
//! // A limit of 5 over a free limit of 4, with 4 in flight: one slot, and
//! // it is headroom.
//! assert_eq!(tiers(5, 4, 4), (1, 0));
//! let now = Instant::now();
//! let mut r = ClassReserve::default();
//! r.seen(Priority::Critical, now);
//! r.seen(Priority::Sheddable, now);
//! // Credit 1, all of it reserve: only critical tasks may go.
//! assert_eq!(r.lowest(1, 1, now), Priority::Critical);
//! // Credit 3 with a reserve of 1: any class.
//! assert_eq!(r.lowest(3, 1, now), Priority::Sheddable);
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

    /// The most important class that came within [`HOLD`] of `now`.
    pub fn top(&self, now: Instant) -> Option<Priority> {
        Priority::ALL
            .into_iter()
            .zip(self.last)
            .find(|(_, t)| t.is_some_and(|t| now < time::add(t, HOLD)))
            .map(|(p, _)| p)
    }

    /// The least important class the next send may serve, holding
    /// `credit` of which `reserve` is headroom: any class while the credit
    /// exceeds the reserve, else only the top class and those above it.
    pub fn lowest(&self, credit: usize, reserve: usize, now: Instant) -> Priority {
        if credit > reserve {
            return Priority::Sheddable;
        }
        self.top(now).unwrap_or(Priority::Sheddable)
    }
}

/// The balancer's side, per node: the instants of its latest dispatches,
/// oldest first, one per attempt in flight.
///
/// Attempts are taken to end in the order they were sent (a backend's
/// workers take their queue in order); when they do not, the instants kept
/// are those of the latest dispatches, which are no earlier than those of
/// the attempts really in flight, so the estimate errs late.
#[derive(Debug, Clone, Default)]
pub struct DispatchTimes {
    sent: VecDeque<Instant>,
}

impl DispatchTimes {
    /// An attempt was sent at `at`.
    pub fn sent(&mut self, at: Instant) {
        self.sent.push_back(at);
    }

    /// `n` attempts ended.
    pub fn ended(&mut self, n: u32) {
        let n = (n as usize).min(self.sent.len());
        self.sent.drain(..n);
    }

    /// Keeps at most the latest `n` instants (the attempts in flight as the
    /// balancer counts them, should the two counts part).
    pub fn keep(&mut self, n: u32) {
        let extra = self.sent.len().saturating_sub(n as usize);
        self.sent.drain(..extra);
    }

    /// Attempts in flight by this count.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether nothing is in flight by this count.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// How long a request sent at `now` would wait for one of the
    /// backend's `free` workers, each request taking `service` unloaded:
    /// zero while a worker is idle; else until the request ahead of it
    /// that frees its worker (the oldest in flight, or behind the ones
    /// already waiting) is done. A node running behind that estimate is
    /// no better than average: it counts `service / free`, the mean gap
    /// between two of its workers freeing.
    pub fn wait(&self, free: u32, service: Duration, now: Instant) -> Duration {
        let free = free.max(1) as usize;
        let n = self.sent.len();
        if n < free {
            return Duration::ZERO;
        }
        // The requests already waiting inside go first: the one that frees
        // our worker is the (n - free + 1)-th to end.
        let ahead = self.sent.get(n - free).copied();
        match ahead.map(|t| time::add(t, service)) {
            Some(due) if due >= now => due - now,
            _ => service / free as u32,
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
    fn lower_classes_go_only_while_credit_exceeds_the_reserve() {
        let t0 = Instant::now();
        let mut r = ClassReserve::default();
        // Nothing seen: any class.
        assert_eq!(r.lowest(0, 3, t0), Priority::Sheddable);
        r.seen(Priority::Default, t0);
        r.seen(Priority::Sheddable, t0);
        assert_eq!(r.lowest(4, 3, t0), Priority::Sheddable);
        assert_eq!(r.lowest(3, 3, t0), Priority::Default);
        assert_eq!(r.lowest(1, 3, t0), Priority::Default);
        r.seen(Priority::Critical, t0);
        assert_eq!(r.lowest(3, 3, t0), Priority::Critical);
        assert_eq!(r.lowest(3, 0, t0), Priority::Sheddable);
        // The critical class stopped coming: default is top again.
        assert_eq!(r.lowest(3, 3, t0 + HOLD), Priority::Sheddable);
        r.seen(Priority::Default, t0 + HOLD);
        assert_eq!(r.lowest(3, 3, t0 + HOLD), Priority::Default);
    }

    #[test]
    fn the_wait_is_for_the_request_that_frees_a_worker() {
        let t0 = Instant::now();
        let service = 20 * MS;
        let mut d = DispatchTimes::default();
        // Idle workers: no wait.
        assert_eq!(d.wait(4, service, t0), Duration::ZERO);
        for k in 0..3 {
            d.sent(t0 + k * 5 * MS);
        }
        assert_eq!(d.wait(4, service, t0 + 10 * MS), Duration::ZERO);
        // Four workers busy since 0, 5, 10 and 15 ms: at 16 ms the first
        // frees its worker at 20.
        d.sent(t0 + 15 * MS);
        assert_eq!(d.len(), 4);
        assert_eq!(d.wait(4, service, t0 + 16 * MS), 4 * MS);
        // One more waits inside: a request now waits for the second to end.
        d.sent(t0 + 16 * MS);
        assert_eq!(d.wait(4, service, t0 + 16 * MS), 9 * MS);
        // The first two ended.
        d.ended(2);
        assert_eq!(d.len(), 3);
        assert_eq!(d.wait(4, service, t0 + 26 * MS), Duration::ZERO);
        d.keep(2);
        assert_eq!(d.len(), 2);
        // The latest two are kept, 15 and 16 ms: with one worker, the
        // second is taken to end at 36 ms.
        assert_eq!(d.wait(1, service, t0 + 26 * MS), 10 * MS);
        d.ended(10);
        assert!(d.is_empty());
    }

    #[test]
    fn a_node_running_late_counts_the_mean_gap() {
        let t0 = Instant::now();
        let mut d = DispatchTimes::default();
        d.sent(t0);
        d.sent(t0 + MS);
        // Both workers busy, the oldest due at 20 ms: at 30 ms it is late.
        assert_eq!(d.wait(2, 20 * MS, t0 + 30 * MS), 10 * MS);
        // A free limit of 0 counts as 1.
        assert_eq!(d.wait(0, 20 * MS, t0 + 30 * MS), 20 * MS);
    }

    #[test]
    fn the_node_furthest_along_frees_a_worker_first() {
        let t0 = Instant::now();
        let service = 20 * MS;
        let (mut a, mut b) = (DispatchTimes::default(), DispatchTimes::default());
        for k in [0, 4, 8, 12] {
            a.sent(t0 + k * MS);
        }
        for k in [2, 6, 10, 14] {
            b.sent(t0 + k * MS);
        }
        let now = t0 + 15 * MS;
        assert!(a.wait(4, service, now) < b.wait(4, service, now));
        assert_eq!(a.wait(4, service, now), 5 * MS);
        assert_eq!(b.wait(4, service, now), 7 * MS);
    }
}
