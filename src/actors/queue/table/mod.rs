//! The queue's task table: every task the queue holds, its state, the
//! lists it waits in and the counts by state, in one type that is the only
//! place a task changes state.
//!
//! A task enters parked (`Waiting`: no room yet, `on_full: wait`) or
//! `Ready`, goes `InFlight` when it is handed to the balancer, and from
//! there back to `Ready` (a bounce, at the front), to `Backoff` (a retry
//! waiting out its delay, then `Ready` at the front), or out of the table
//! (answered). The counts the queue reports (`queued` = ready + backing off,
//! `in_flight`, `parked`) change with these transitions and nowhere else,
//! and a property test checks that they always agree with the table and
//! that every task leaves exactly once.
//!
//! The lists hold task numbers and are cleaned lazily: a task answered
//! while listed leaves its number behind, skipped when reached and dropped
//! in bulk once stale numbers outnumber the live ones.

use std::collections::VecDeque;

mod slab;
mod state;

use self::slab::Tasks;
pub(in crate::actors) use self::state::{Counters, Epoch, Pending, State, TaskNo};

/// How many tasks are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::actors) struct Counts {
    /// Ready or backing off: counted against the queue's capacity.
    pub queued: usize,
    /// Ready to send (of `queued`).
    pub ready: usize,
    /// Handed to the balancer, not yet answered.
    pub in_flight: usize,
    /// Parked for room (`on_full: wait`, `feed`).
    pub parked: usize,
    /// Of every task held, those whose caller asked to wait (`feed`,
    /// `submit_wait`, a durable stream's entries).
    pub patient: usize,
}

/// Every task of one queue, by number, with its state.
#[derive(Default)]
pub(in crate::actors) struct TaskTable {
    tasks: Tasks,
    /// Ready tasks, the next to send first.
    ready: VecDeque<TaskNo>,
    /// Parked tasks, in arrival order.
    waiting: VecDeque<TaskNo>,
    counts: Counts,
    /// The arrival count the next task gets.
    next: u64,
}

impl TaskTable {
    pub fn counts(&self) -> Counts {
        self.counts
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn get(&self, no: &TaskNo) -> Option<&Pending> {
        self.tasks.get(no)
    }

    pub fn get_mut(&mut self, no: &TaskNo) -> Option<&mut Pending> {
        self.tasks.get_mut(no)
    }

    /// Every task, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (TaskNo, &Pending)> {
        self.tasks.iter()
    }

    /// Every task's number, oldest first.
    pub fn in_arrival_order(&self) -> Vec<TaskNo> {
        self.tasks.in_arrival_order(self.next)
    }

    /// Ready tasks listed (stale numbers included).
    pub fn ready_listed(&self) -> usize {
        self.ready.len()
    }

    /// A new task enters: parked, or ready at the back.
    pub fn enter(&mut self, mut p: Pending, parked: bool) -> TaskNo {
        p.state = if parked { State::Waiting } else { State::Ready };
        self.counts.patient += usize::from(p.patient);
        let no = self.tasks.insert(self.next, p);
        self.next += 1;
        if parked {
            self.waiting.push_back(no);
            self.counts.parked += 1;
        } else {
            self.ready.push_back(no);
            self.counts.queued += 1;
            self.counts.ready += 1;
        }
        no
    }

    /// The oldest parked task joins the ready tasks; its number, or `None`
    /// when none is parked.
    pub fn admit_parked(&mut self) -> Option<TaskNo> {
        while let Some(no) = self.waiting.pop_front() {
            if let Some(p) = self
                .tasks
                .get_mut(&no)
                .filter(|p| p.state == State::Waiting)
            {
                p.state = State::Ready;
                self.counts.parked -= 1;
                self.counts.queued += 1;
                self.counts.ready += 1;
                self.ready.push_back(no);
                return Some(no);
            }
        }
        None
    }

    /// The oldest parked task, taken off the wait list (still parked: the
    /// caller answers it).
    pub fn next_parked(&mut self) -> Option<TaskNo> {
        while let Some(no) = self.waiting.pop_front() {
            if self
                .tasks
                .get(&no)
                .is_some_and(|p| p.state == State::Waiting)
            {
                return Some(no);
            }
        }
        None
    }

    /// The next ready task, taken off the ready list (still ready: the
    /// caller sends it with [`send`](Self::send) or answers it).
    pub fn next_ready(&mut self) -> Option<TaskNo> {
        while let Some(no) = self.ready.pop_front() {
            if self.tasks.get(&no).is_some_and(|p| p.state == State::Ready) {
                return Some(no);
            }
        }
        None
    }

    /// The newest ready task, taken off the ready list (served first under
    /// adaptive LIFO).
    pub fn next_ready_newest(&mut self) -> Option<TaskNo> {
        while let Some(no) = self.ready.pop_back() {
            if self.tasks.get(&no).is_some_and(|p| p.state == State::Ready) {
                return Some(no);
            }
        }
        None
    }

    /// The oldest ready task, left on the list (stale numbers before it
    /// are dropped).
    pub fn oldest_ready(&mut self) -> Option<TaskNo> {
        while let Some(&no) = self.ready.front() {
            if self.tasks.get(&no).is_some_and(|p| p.state == State::Ready) {
                return Some(no);
            }
            self.ready.pop_front();
        }
        None
    }

    /// A ready task taken by [`next_ready`](Self::next_ready) goes to the
    /// balancer.
    pub fn send(&mut self, no: TaskNo) -> Option<&mut Pending> {
        let p = self
            .tasks
            .get_mut(&no)
            .filter(|p| p.state == State::Ready)?;
        p.state = State::InFlight;
        self.counts.queued -= 1;
        self.counts.ready -= 1;
        self.counts.in_flight += 1;
        Some(p)
    }

    /// A task in flight comes back unsent (bounced): ready, at the front.
    pub fn bounce(&mut self, no: TaskNo) {
        if let Some(p) = self
            .tasks
            .get_mut(&no)
            .filter(|p| p.state == State::InFlight)
        {
            p.state = State::Ready;
            self.counts.in_flight -= 1;
            self.counts.queued += 1;
            self.counts.ready += 1;
            self.ready.push_front(no);
        }
    }

    /// A task in flight waits out a retry's backoff.
    pub fn back_off(&mut self, no: TaskNo) {
        if let Some(p) = self
            .tasks
            .get_mut(&no)
            .filter(|p| p.state == State::InFlight)
        {
            p.state = State::Backoff;
            self.counts.in_flight -= 1;
            self.counts.queued += 1;
        }
    }

    /// A backoff is over: the task is ready, at the front. False if it was
    /// not backing off.
    pub fn backoff_over(&mut self, no: TaskNo) -> bool {
        match self
            .tasks
            .get_mut(&no)
            .filter(|p| p.state == State::Backoff)
        {
            Some(p) => {
                p.state = State::Ready;
                self.counts.ready += 1;
                self.ready.push_front(no);
                true
            }
            None => false,
        }
    }

    /// The task leaves the table (it is answered), whatever its state.
    pub fn remove(&mut self, no: TaskNo) -> Option<Pending> {
        let p = self.tasks.remove(&no)?;
        self.counts.patient -= usize::from(p.patient);
        match p.state {
            State::Waiting => self.counts.parked -= 1,
            State::Ready => {
                self.counts.queued -= 1;
                self.counts.ready -= 1;
            }
            State::Backoff => self.counts.queued -= 1,
            State::InFlight => self.counts.in_flight -= 1,
        }
        Some(p)
    }

    /// Forgets every task (their holds drop, closing unanswered slots).
    pub fn clear(&mut self) {
        self.tasks.clear();
        self.ready.clear();
        self.waiting.clear();
        self.counts = Counts::default();
    }

    /// Drops the stale numbers of the lists once they outnumber the live
    /// ones.
    pub fn compact(&mut self) {
        let tasks = &self.tasks;
        let c = self.counts;
        retain_if_bloated(&mut self.ready, c.queued, |no| {
            tasks.get(no).is_some_and(|p| p.state == State::Ready)
        });
        if c.parked == 0 {
            self.waiting.clear();
        } else {
            retain_if_bloated(&mut self.waiting, c.parked, |no| {
                tasks.get(no).is_some_and(|p| p.state == State::Waiting)
            });
        }
    }
}

fn retain_if_bloated(list: &mut VecDeque<TaskNo>, live: usize, keep: impl FnMut(&TaskNo) -> bool) {
    if list.len() > live.saturating_mul(2).saturating_add(1024) {
        list.retain(keep);
        list.shrink_to(list.len().saturating_mul(2));
    }
}

#[cfg(test)]
mod tests;
