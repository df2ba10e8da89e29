//! `InFlight`: a node's slots in use, each held by one guard.
//!
//! A dispatch the node admits takes a slot and gets an [`InFlightGuard`];
//! the slot is free again when the guard is released, by
//! [`InFlightGuard::release`] (which consumes it, so it cannot run twice)
//! or by dropping it. Nothing else writes the count, and the count's gauge
//! is set here, with every change (tower's `ConcurrencyLimit` permit is
//! the model). An attempt, a streamed body and a lease each hold their
//! guard until they end.

use std::cell::Cell;
use std::rc::Rc;

use crate::metrics::NodeMetrics;

/// The node's count of slots in use.
pub(super) struct InFlight {
    count: Rc<Count>,
}

struct Count {
    n: Cell<u32>,
    /// The in-flight gauge (no-op without `metrics`).
    metrics: NodeMetrics,
}

impl Count {
    fn set(&self, n: u32) {
        self.n.set(n);
        self.metrics.in_flight(n);
    }
}

/// One slot in use; freed exactly once, by `release` or on drop.
#[must_use = "dropping the guard frees its slot"]
pub(super) struct InFlightGuard {
    count: Option<Rc<Count>>,
}

impl InFlight {
    pub(super) fn new(metrics: NodeMetrics) -> Self {
        InFlight {
            count: Rc::new(Count {
                n: Cell::new(0),
                metrics,
            }),
        }
    }

    /// Slots in use now.
    pub(super) fn get(&self) -> u32 {
        self.count.n.get()
    }

    /// Takes a slot if fewer than `limit` are in use.
    pub(super) fn try_take(&self, limit: u32) -> Option<InFlightGuard> {
        let n = self.get();
        if n >= limit {
            return None;
        }
        self.count.set(n + 1);
        Some(InFlightGuard {
            count: Some(self.count.clone()),
        })
    }
}

impl InFlightGuard {
    /// Frees the slot; returns the slots in use with it (before it was
    /// freed).
    pub(super) fn release(mut self) -> u32 {
        self.free()
    }

    fn free(&mut self) -> u32 {
        match self.count.take() {
            Some(c) => {
                let n = c.n.get();
                // Every guard counted one, so the count is at least one.
                c.set(n - 1);
                n
            }
            None => 0,
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.free();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_admits_up_to_its_limit_and_a_released_guard_frees_exactly_one_slot() {
        let slots = InFlight::new(NodeMetrics::default());
        let a = slots.try_take(2).expect("first slot");
        let b = slots.try_take(2).expect("second slot");
        assert_eq!(slots.get(), 2);
        assert!(slots.try_take(2).is_none(), "the limit is 2");
        assert_eq!(slots.get(), 2);
        // Release returns the count with the slot, then frees only it.
        assert_eq!(a.release(), 2);
        assert_eq!(slots.get(), 1);
        let c = slots.try_take(2).expect("the freed slot");
        assert_eq!(slots.get(), 2);
        // A dropped guard frees its slot too.
        drop(b);
        assert_eq!(slots.get(), 1);
        drop(c);
        assert_eq!(slots.get(), 0);
        // A lower limit admits nothing while the count is at it.
        let d = slots.try_take(1).expect("one slot");
        assert!(slots.try_take(1).is_none());
        assert_eq!(d.release(), 1);
        assert_eq!(slots.get(), 0);
    }
}
