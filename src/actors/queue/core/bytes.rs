//! The queue's bound in bytes: the bodies of the tasks it holds.
//!
//! `queue.capacity` counts tasks, and 10 000 tasks of 2 MiB bodies are
//! 20 GB: a burst of large bodies (a task file, a stream, a gateway under
//! upload) would take the process's memory long before the count binds.
//! So the queue also counts the bodies of every task it holds (ready,
//! parked, backing off or in flight: a body stays until its task is
//! answered, for retries), and refuses a new task `QueueFull` when its
//! body would take the sum past `queue.max_bytes` (default 256 MiB). A
//! task whose body alone is larger is always refused.

/// Bytes of bodies held, against the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueBytes {
    held: usize,
    max: usize,
}

impl QueueBytes {
    /// None held, at most `max`.
    pub fn new(max: usize) -> QueueBytes {
        QueueBytes { held: 0, max }
    }

    /// Whether a body of `len` bytes fits.
    pub fn admits(&self, len: usize) -> bool {
        self.held.saturating_add(len) <= self.max
    }

    /// A task of `len` bytes of body entered.
    pub fn add(&mut self, len: usize) {
        self.held = self.held.saturating_add(len);
    }

    /// A task of `len` bytes of body left (answered).
    pub fn remove(&mut self, len: usize) {
        self.held = self.held.saturating_sub(len);
    }

    /// Every task left at once.
    pub fn clear(&mut self) {
        self.held = 0;
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_admitted_up_to_the_bound_and_freed_when_answered() {
        let mut b = QueueBytes::new(10);
        assert!(b.admits(10));
        assert!(!b.admits(11), "a body larger than the bound alone");
        b.add(6);
        assert!(b.admits(4));
        assert!(!b.admits(5));
        b.add(4);
        assert!(b.admits(0), "an empty body always fits while within");
        b.remove(6);
        assert_eq!(b.held(), 4);
        assert!(b.admits(6));
        b.remove(100);
        assert_eq!(b.held(), 0, "never below zero");
        b.add(usize::MAX);
        b.add(1);
        assert!(!b.admits(1), "saturates, never wraps");
        b.clear();
        assert_eq!(b.held(), 0);
    }
}
