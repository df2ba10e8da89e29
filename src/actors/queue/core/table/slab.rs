//! The queue's tasks: a slab, every task's entry in one `Vec`, found by
//! its number without hashing.
//!
//! A task's number ([`TaskNo`], the `task` of every
//! [`Seq`](crate::actors::protocol::Seq)) is its slot in
//! the slab (low 32 bits) and the low 32 bits of its arrival count (high 32
//! bits). A slot freed by an answered task is reused by a later one, whose
//! arrival count differs, so a late message about the earlier task finds
//! nothing (as a removed map key did). The arrival count also gives the
//! arrival order the shutdown report and the panic recovery answer in:
//! the older a task, the further its count lies behind the queue's next.
//! (Counts are compared modulo 2^32: a task would have to outlive four
//! billion later arrivals to be misordered, or to be mistaken for one.)
//!
//! A `HashMap<u64, Pending>` entry cost the key, a control byte and the
//! table's spare room (at 100 000 queued tasks about 117 bytes each); a slot
//! costs the entry alone, and lookups cost an index instead of a SipHash.
//! Free slots form a list through the slab (last freed, first reused), so
//! the slab never holds more slots than the most tasks held at once.

use super::state::{Pending, TaskNo};

/// No slot: the end of the free list.
const NONE: u32 = u32::MAX;

enum SlabEntry {
    /// Free; the next free slot.
    Free(u32),
    Taken(Pending),
}

/// Every task the queue holds, by number.
pub(super) struct Tasks {
    slots: Vec<SlabEntry>,
    /// The first free slot.
    free: u32,
    len: usize,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks {
            slots: Vec::new(),
            free: NONE,
            len: 0,
        }
    }
}

/// The slot of task `no`.
fn slot(no: TaskNo) -> usize {
    (no & u64::from(u32::MAX)) as usize
}

/// The low 32 bits of task `no`'s arrival count.
pub(super) fn arrival(no: TaskNo) -> u32 {
    (no >> 32) as u32
}

impl Tasks {
    /// Adds the task that arrived `arrival`-th (counting from 0); returns its number.
    pub fn insert(&mut self, arrival: u64, mut p: Pending) -> TaskNo {
        let count = arrival as u32;
        p.arrival = count;
        let i = if self.free != NONE {
            let i = self.free;
            let next = match self.slots[i as usize] {
                SlabEntry::Free(next) => next,
                SlabEntry::Taken(_) => unreachable!("the free list holds free slots"),
            };
            self.free = next;
            self.slots[i as usize] = SlabEntry::Taken(p);
            i
        } else {
            let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 tasks held");
            self.slots.push(SlabEntry::Taken(p));
            i
        };
        self.len += 1;
        (u64::from(count) << 32) | u64::from(i)
    }

    pub fn get(&self, no: &TaskNo) -> Option<&Pending> {
        match self.slots.get(slot(*no)) {
            Some(SlabEntry::Taken(p)) if p.arrival == arrival(*no) => Some(p),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, no: &TaskNo) -> Option<&mut Pending> {
        match self.slots.get_mut(slot(*no)) {
            Some(SlabEntry::Taken(p)) if p.arrival == arrival(*no) => Some(p),
            _ => None,
        }
    }

    pub fn remove(&mut self, no: &TaskNo) -> Option<Pending> {
        self.get(no)?;
        let i = slot(*no);
        let SlabEntry::Taken(p) = std::mem::replace(&mut self.slots[i], SlabEntry::Free(self.free))
        else {
            unreachable!("checked above");
        };
        self.free = i as u32;
        self.len -= 1;
        Some(p)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every task (their holds drop, closing unanswered slots).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free = NONE;
        self.len = 0;
    }

    /// Every task, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (TaskNo, &Pending)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            SlabEntry::Taken(p) => Some(((u64::from(p.arrival) << 32) | i as u64, p)),
            SlabEntry::Free(_) => None,
        })
    }

    /// Every task's number, oldest first; `next` is the arrival count the
    /// next task will get.
    pub fn in_arrival_order(&self, next: u64) -> Vec<TaskNo> {
        let next = next as u32;
        let mut nos: Vec<TaskNo> = self.iter().map(|(no, _)| no).collect();
        nos.sort_unstable_by_key(|no| std::cmp::Reverse(next.wrapping_sub(arrival(*no))));
        nos
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::State;
    use super::*;
    use crate::task::{ReplyTx, Task};
    use std::sync::Arc;
    use tokio::time::Instant;

    fn pending() -> Pending {
        let job = Arc::new(Task::get("s", "/x").prepare(1, Instant::now()).unwrap());
        let mut p = Pending::new(ReplyTx::new(job), Default::default());
        p.state = State::Ready;
        p
    }

    /// A reused slot does not answer to the number of its earlier task.
    #[test]
    fn a_late_number_finds_nothing_in_a_reused_slot() {
        let mut t = Tasks::default();
        let a = t.insert(0, pending());
        assert!(t.remove(&a).is_some());
        let b = t.insert(1, pending());
        assert_eq!(slot(a), slot(b), "the slot is reused");
        assert!(t.get(&a).is_none() && t.remove(&a).is_none());
        assert!(t.get(&b).is_some());
        assert_eq!(t.len(), 1);
    }

    /// Oldest first, also across the wrap of the 32-bit count.
    #[test]
    fn arrival_order_survives_slot_reuse_and_the_wrap() {
        let mut t = Tasks::default();
        let base = u64::from(u32::MAX) - 2;
        let nos: Vec<TaskNo> = (0..6).map(|k| t.insert(base + k, pending())).collect();
        t.remove(&nos[1]);
        t.remove(&nos[4]);
        let late = t.insert(base + 6, pending());
        assert_eq!(slot(late), slot(nos[4]), "last freed, first reused");
        assert_eq!(
            t.in_arrival_order(base + 7),
            vec![nos[0], nos[2], nos[3], nos[5], late]
        );
        t.clear();
        assert!(t.is_empty() && t.iter().next().is_none());
    }
}
