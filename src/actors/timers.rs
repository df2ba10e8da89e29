//! The queue's timer store: every task timer (backoff over, deadline, hedge)
//! in one min-heap, served by a single actix timer for the earliest entry.
//!
//! One actix timer per task would make the queue's context re-scan
//! thousands of spawned futures on every wake-up (see the actix notes), so
//! the queue keeps one. Entries are not removed when their task ends (a
//! binary heap cannot remove from the middle); instead they are dropped
//! lazily: when popped, and in bulk when the heap holds more than twice the
//! entries that can still be live plus a small slack. `compact` is O(n) and
//! runs at most once per n pushes, so the cost per timer stays O(log n) and
//! memory stays proportional to what is live: a million finished tasks with
//! hour-long deadlines leave nothing behind.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokio::time::Instant;

/// Entries kept beyond twice the live bound before a compaction.
const SLACK: usize = 1024;

/// A min-heap of `(when, key, kind)` with bounded lazy deletion.
#[derive(Debug)]
pub(crate) struct TimerStore<K: Ord + Copy, T: Ord + Copy> {
    heap: BinaryHeap<Reverse<(Instant, K, T)>>,
}

impl<K: Ord + Copy, T: Ord + Copy> Default for TimerStore<K, T> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
        }
    }
}

impl<K: Ord + Copy, T: Ord + Copy> TimerStore<K, T> {
    /// Adds a timer; returns true when it is now the earliest.
    pub fn push(&mut self, at: Instant, key: K, kind: T) -> bool {
        let earliest = self.next().is_none_or(|t| at < t);
        self.heap.push(Reverse((at, key, kind)));
        earliest
    }

    /// When the earliest timer is due.
    pub fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Takes the earliest timer if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(K, T)> {
        match self.heap.peek() {
            Some(Reverse((t, _, _))) if *t <= now => {
                self.heap.pop().map(|Reverse((_, k, kind))| (k, kind))
            }
            _ => None,
        }
    }

    /// Entries held (live or not).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Drops the entries `live` says are dead once the heap holds more than
    /// twice `max_live` (the most entries that can still be live) plus a
    /// slack, so that memory follows what is live at O(1) amortised cost.
    pub fn compact_if_needed(&mut self, max_live: usize, live: impl FnMut(&K, &T) -> bool) {
        if self.heap.len() > max_live.saturating_mul(2).saturating_add(SLACK) {
            self.compact(live);
        }
    }

    /// Drops every entry `live` says is dead.
    pub fn compact(&mut self, mut live: impl FnMut(&K, &T) -> bool) {
        self.heap.retain(|Reverse((_, k, t))| live(k, t));
        self.heap
            .shrink_to(self.heap.len().saturating_mul(2).max(SLACK));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pops_in_time_order_and_only_when_due() {
        let now = Instant::now();
        let mut s: TimerStore<u64, u8> = TimerStore::default();
        assert!(s.push(now + Duration::from_millis(20), 1, 0));
        assert!(s.push(now + Duration::from_millis(10), 2, 0));
        assert!(!s.push(now + Duration::from_millis(30), 3, 0));
        assert_eq!(s.pop_due(now), None);
        assert_eq!(s.next(), Some(now + Duration::from_millis(10)));
        let later = now + Duration::from_millis(25);
        assert_eq!(s.pop_due(later), Some((2, 0)));
        assert_eq!(s.pop_due(later), Some((1, 0)));
        assert_eq!(s.pop_due(later), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn memory_follows_what_is_live() {
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        let mut s: TimerStore<u64, u8> = TimerStore::default();
        // A million tasks with hour-long deadlines, each finished long before
        // its deadline: at most 10 are live at any time.
        let mut peak = 0;
        for k in 0..1_000_000u64 {
            s.push(now + hour, k, 0);
            s.compact_if_needed(10, |key, _| *key + 10 > k);
            peak = peak.max(s.len());
        }
        assert!(peak <= 2 * 10 + SLACK + 1, "peak {peak}");
    }
}
