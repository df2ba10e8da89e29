//! The queue's bound in bytes: the bodies of the tasks it holds.
//!
//! `queue.capacity` counts tasks, and 10 000 tasks of 2 MiB bodies are
//! 20 GB: a burst of large bodies (a task file, a stream, a gateway under
//! upload) would take the process's memory long before the count binds.
//! So the queue also counts the bodies of every task it holds (waiting,
//! ready, backing off or in flight: a body stays until its task is
//! answered, for retries), and refuses a new task `QueueFull` when its
//! body would take the sum past `queue.max_bytes` (default 256 MiB). A
//! task whose body alone is larger is always refused.
//!
//! Each task held keeps its body's bytes as a [`HeldBytes`] guard, which
//! gives them back exactly once, when it drops (with its task's entry, or
//! with the whole table): nothing else writes the sum, so it is always the
//! sum of the guards alive and cannot go below zero (tower's
//! `ConcurrencyLimit` permit is the model, as for a node's slots).

use std::cell::Cell;
use std::rc::Rc;

/// Bytes of bodies held, against the bound.
#[derive(Debug)]
pub(crate) struct QueueBytes {
    /// The sum of the live guards' lengths. A `u128`: a sum of `usize`
    /// lengths, one per task held, cannot overflow it, so every guard
    /// takes back exactly what it added.
    held: Rc<Cell<u128>>,
    max: usize,
}

/// The bytes of one task's body, held until the guard drops.
#[derive(Debug)]
#[must_use = "dropping the guard gives its bytes back"]
pub(crate) struct HeldBytes {
    held: Rc<Cell<u128>>,
    len: usize,
}

impl QueueBytes {
    /// None held, at most `max`.
    pub fn new(max: usize) -> QueueBytes {
        QueueBytes {
            held: Rc::new(Cell::new(0)),
            max,
        }
    }

    /// Whether a body of `len` bytes fits.
    pub fn admits(&self, len: usize) -> bool {
        self.held.get() + len as u128 <= self.max as u128
    }

    /// A task of `len` bytes of body entered: held until the guard drops
    /// (whether or not it fit: a task taken in at shutdown is held too).
    pub fn hold(&self, len: usize) -> HeldBytes {
        self.held.set(self.held.get() + len as u128);
        HeldBytes {
            held: self.held.clone(),
            len,
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> u128 {
        self.held.get()
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        // This guard added `len` and nothing else took it back: the sum
        // holds it.
        self.held.set(self.held.get() - self.len as u128);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_admitted_up_to_the_bound_and_freed_when_answered() {
        let b = QueueBytes::new(10);
        assert!(b.admits(10));
        assert!(!b.admits(11), "a body larger than the bound alone");
        let six = b.hold(6);
        assert!(b.admits(4));
        assert!(!b.admits(5));
        let four = b.hold(4);
        assert!(b.admits(0), "an empty body always fits while within");
        drop(six);
        assert_eq!(b.held(), 4);
        assert!(b.admits(6));
        drop(four);
        assert_eq!(b.held(), 0, "each guard gives back exactly its own");
        let huge = b.hold(usize::MAX);
        let one = b.hold(1);
        assert!(!b.admits(1), "never wraps");
        drop((huge, one));
        assert_eq!(b.held(), 0);
    }
}
