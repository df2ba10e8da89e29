//! A node's idle HTTP/1 connections, as plain data: which one the next
//! request takes, and which are too old to take (no I/O here; the caller
//! passes `now` and a liveness check).
//!
//! - **Last in, first out.** The connection idle the shortest time goes
//!   first: it is the least likely to have been closed by the server, and
//!   under a light load the others age out instead of each being kept
//!   barely alive.
//! - **Idle longer than `keep_alive`**, or **older than `max_age`**: closed,
//!   never lent. Connections are kept in the order they went idle, so those
//!   idle too long are always at the front and are pruned there on every
//!   take, whether or not the request goes that far.
//! - **`keep_alive` zero**: nothing is kept.
//! - **No cap on the count**: a node's `max_concurrent` bounds how many of
//!   its requests, and so its connections, are in flight.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The idle connections `C`, each to the backend named by its key `K`.
pub(super) struct IdleList<K, C> {
    conns: VecDeque<Idle<K, C>>,
    keep_alive: Duration,
    max_age: Duration,
}

struct Idle<K, C> {
    key: K,
    conn: C,
    /// When the connection was made.
    created: Instant,
    /// When it went idle.
    since: Instant,
}

impl<K: PartialEq, C> IdleList<K, C> {
    /// Keeps connections idle up to `keep_alive`, and none past `max_age`.
    pub(super) fn new(keep_alive: Duration, max_age: Duration) -> Self {
        Self {
            conns: VecDeque::new(),
            keep_alive,
            max_age,
        }
    }

    /// Keeps `conn` (made at `created`) idle from `now`; false when it may
    /// not be reused (`keep_alive` zero, or past its age), and then it is
    /// dropped.
    pub(super) fn put(&mut self, key: K, conn: C, created: Instant, now: Instant) -> bool {
        if self.keep_alive.is_zero() || self.too_old(created, now) {
            return false;
        }
        self.conns.push_back(Idle {
            key,
            conn,
            created,
            since: now,
        });
        true
    }

    /// The connection to `key` that went idle last, with when it was made,
    /// among those for which `live` holds; drops on the way those idle too
    /// long, too old, or not live.
    pub(super) fn take(
        &mut self,
        key: &K,
        now: Instant,
        mut live: impl FnMut(&mut C) -> bool,
    ) -> Option<(C, Instant)> {
        while self
            .conns
            .front()
            .is_some_and(|c| self.idle_too_long(c.since, now))
        {
            self.conns.pop_front();
        }
        let mut i = self.conns.len();
        while i > 0 {
            i -= 1;
            if self.conns[i].key != *key {
                continue;
            }
            let Some(mut c) = self.conns.remove(i) else {
                break;
            };
            if !self.too_old(c.created, now) && live(&mut c.conn) {
                return Some((c.conn, c.created));
            }
        }
        None
    }

    /// How many connections are idle.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.conns.len()
    }

    fn idle_too_long(&self, since: Instant, now: Instant) -> bool {
        now.saturating_duration_since(since) >= self.keep_alive
    }

    fn too_old(&self, created: Instant, now: Instant) -> bool {
        now.saturating_duration_since(created) >= self.max_age
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn list() -> (IdleList<&'static str, u32>, Instant) {
        (IdleList::new(100 * MS, 1000 * MS), Instant::now())
    }

    #[test]
    fn the_last_connection_to_go_idle_is_taken_first() {
        let (mut l, t0) = list();
        for (n, at) in [(1, 0), (2, 1), (3, 2)] {
            assert!(l.put("a", n, t0, t0 + at * MS));
        }
        let all = |_: &mut u32| true;
        assert_eq!(l.take(&"a", t0 + 3 * MS, all), Some((3, t0)));
        assert_eq!(l.take(&"a", t0 + 3 * MS, all), Some((2, t0)));
        assert!(l.put("a", 3, t0, t0 + 4 * MS));
        assert_eq!(l.take(&"a", t0 + 5 * MS, all), Some((3, t0)));
        assert_eq!(l.take(&"a", t0 + 5 * MS, all), Some((1, t0)));
        assert_eq!(l.take(&"a", t0 + 5 * MS, all), None);
    }

    #[test]
    fn a_connection_idle_for_keep_alive_is_dropped_not_taken() {
        let (mut l, t0) = list();
        assert!(l.put("a", 1, t0, t0));
        assert!(l.put("a", 2, t0, t0 + 50 * MS));
        // At 100 ms, 1 has been idle 100 ms: gone, though 2 is taken.
        assert_eq!(l.take(&"a", t0 + 100 * MS, |_| true), Some((2, t0)));
        assert_eq!(l.len(), 0);
        assert!(l.put("a", 3, t0, t0 + 100 * MS));
        assert_eq!(l.take(&"a", t0 + 199 * MS, |_| true), Some((3, t0)));
        assert!(l.put("a", 3, t0, t0 + 200 * MS));
        assert_eq!(l.take(&"a", t0 + 300 * MS, |_| true), None);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn a_connection_past_max_age_is_neither_kept_nor_taken() {
        let (mut l, t0) = list();
        let made = t0 - 990 * MS;
        assert!(l.put("a", 1, made, t0));
        assert_eq!(l.take(&"a", t0 + 10 * MS, |_| true), None);
        assert!(!l.put("a", 1, made, t0 + 10 * MS), "too old to keep");
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn keep_alive_zero_keeps_nothing() {
        let mut l = IdleList::new(Duration::ZERO, Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(!l.put("a", 1_u32, t0, t0));
        assert_eq!(l.take(&"a", t0, |_| true), None);
    }

    #[test]
    fn a_dead_connection_is_dropped_and_the_next_one_tried() {
        let (mut l, t0) = list();
        for n in 1..=3 {
            assert!(l.put("a", n, t0, t0));
        }
        let mut checked = Vec::new();
        let live = |c: &mut u32| {
            checked.push(*c);
            *c == 1
        };
        assert_eq!(l.take(&"a", t0, live), Some((1, t0)));
        assert_eq!(checked, [3, 2, 1]);
        assert_eq!(l.len(), 0, "the dead ones are gone");
    }

    #[test]
    fn another_backends_connections_are_skipped_but_kept() {
        let (mut l, t0) = list();
        assert!(l.put("a", 1, t0, t0));
        assert!(l.put("b", 2, t0, t0));
        assert_eq!(l.take(&"a", t0, |_| true), Some((1, t0)));
        assert_eq!(l.take(&"a", t0, |_| true), None);
        assert_eq!(l.take(&"b", t0, |_| true), Some((2, t0)));
    }
}
