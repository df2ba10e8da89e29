//! The queue's task table: every task the queue holds, its state, the
//! lists it waits in and the counts by state, in one type that is the only
//! place a task changes state.
//!
//! A task enters waiting (`Waiting`: no room yet, `on_full: wait`) or
//! `Ready`, goes `InFlight` when it is handed to the balancer, and from
//! there back to `Ready` (a bounce, at the front), to `Backoff` (a retry
//! waiting out its delay, then `Ready` at the front), or out of the table
//! (answered). The counts the queue reports (`queued` = ready + backing off,
//! `in_flight`, `waiting`) change with these transitions and nowhere else,
//! and a property test checks that they always agree with the table and
//! that every task leaves exactly once.
//!
//! Ready tasks wait in one list per [`Priority`] class and tenant
//! ([`FairClasses`]): the next to send is chosen by the classes' reserved
//! shares, then by priority, then among the class's tenants by deficit
//! round robin over their weights ([`crate::algo::fair`]), at the end of
//! the tenant's list the queue's delay control says (oldest first, or
//! newest first under overload). Tasks naming no tenant are one tenant:
//! with no other, the order is exactly a plain list's. The tenants'
//! flows come from a bounded [`TenantBook`] (`tenants.max_tracked`).
//!
//! The lists hold task numbers and are cleaned lazily: a task answered
//! while listed leaves its number behind, skipped when reached and dropped
//! in bulk once stale numbers outnumber the live ones.

use std::collections::VecDeque;

use crate::algo::codel::Order;
use crate::algo::fair::{FairClasses, Flow};
use crate::algo::priority::{Priority, PriorityConfig};
use crate::algo::tenants::{TenantBook, TenantsConfig};

mod slab;
mod state;

use self::slab::Tasks;
pub(in crate::actors) use self::state::{Epoch, Pending, State, TaskNo};
pub(in crate::actors::queue) use self::state::{LastFailure, Race};

/// How many tasks are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::actors) struct Counts {
    /// Ready or backing off: counted against the queue's capacity.
    pub queued: usize,
    /// Ready to send (of `queued`).
    pub ready: usize,
    /// Handed to the balancer, not yet answered.
    pub in_flight: usize,
    /// Waiting for room (`on_full: wait`, `feed`).
    pub waiting: usize,
    /// Of every task held, those whose caller asked to wait (`feed`,
    /// `submit_wait`, a durable stream's entries).
    pub patient: usize,
    /// Ready tasks by class, most important first (of `ready`).
    pub ready_in: [usize; 3],
}

impl Counts {
    /// Ready tasks of `class` and of the classes more important than it:
    /// those a new task of `class` waits behind.
    pub fn ready_from(&self, class: Priority) -> usize {
        self.ready_in[..=class.index()].iter().sum()
    }

    /// Whether ready tasks of a class less important than `class` wait:
    /// under overload they are shed before a task of `class`.
    pub fn shields(&self, class: Priority) -> bool {
        self.ready_in[class.index() + 1..].iter().any(|&n| n > 0)
    }
}

/// Every task of one queue, by number, with its state.
pub(in crate::actors) struct TaskTable {
    tasks: Tasks,
    /// Ready tasks, by class and tenant.
    ready: FairClasses<TaskNo>,
    /// The tenants tracked, their flows and counts.
    book: TenantBook,
    /// Waiting tasks, in arrival order.
    waiting: VecDeque<TaskNo>,
    /// Ready tasks taken off their lists and held back: each had less time
    /// left than an attempt takes on the quickest node with room; first
    /// held first. Still counted ready.
    held: VecDeque<TaskNo>,
    counts: Counts,
    /// The arrival count the next task gets.
    next: u64,
}

impl Default for TaskTable {
    fn default() -> Self {
        TaskTable::new(PriorityConfig::default(), &TenantsConfig::default())
    }
}

impl TaskTable {
    /// An empty table whose ready tasks are served by `shares` between
    /// classes and by `tenants`' weights within a class.
    pub fn new(shares: PriorityConfig, tenants: &TenantsConfig) -> Self {
        let mut ready = FairClasses::new(&shares);
        for f in [
            crate::algo::tenants::UNNAMED,
            crate::algo::tenants::OVERFLOW,
        ] {
            ready.set_weight(f, tenants.default_weight);
        }
        TaskTable {
            tasks: Tasks::default(),
            ready,
            book: TenantBook::new(tenants),
            waiting: VecDeque::new(),
            held: VecDeque::new(),
            counts: Counts::default(),
            next: 0,
        }
    }

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

    /// The flow of tenant `key` (none: the unnamed tasks'), tracking the
    /// tenant if the book has room.
    #[cfg(test)]
    pub fn flow_of(&mut self, key: Option<&str>) -> Flow {
        let (f, weight) = self.book.flow_of(key);
        if let Some(w) = weight {
            // A flow given anew holds no task: no busy weight to move.
            self.ready.set_weight(f, w);
        }
        f
    }

    /// The flow of a task's tenant key (as `flow_of`;
    /// the same key twice in a row is not hashed again).
    pub fn flow_of_shared(&mut self, key: &std::sync::Arc<str>) -> Flow {
        let (f, weight) = self.book.flow_of_shared(key);
        if let Some(w) = weight {
            self.ready.set_weight(f, w);
        }
        f
    }

    /// The tenants tracked and their counts.
    pub fn tenants(&self) -> &TenantBook {
        &self.book
    }

    /// The flow of task `no`'s tenant.
    pub fn flow_of_task(&self, no: TaskNo) -> Option<Flow> {
        self.tasks.get(&no).map(|p| p.tenant)
    }

    /// The counts of flow `f`, to bump.
    pub fn tenant_counts(&mut self, f: Flow) -> Option<&mut crate::algo::tenants::TenantCounts> {
        self.book.counts_mut(f)
    }

    /// A new task enters: waiting, or ready at the back.
    pub fn enter(&mut self, mut p: Pending, waiting: bool) -> TaskNo {
        p.state = if waiting {
            State::Waiting
        } else {
            State::Ready
        };
        p.tenant = match p.job().task.tenant_shared() {
            None => crate::algo::tenants::UNNAMED,
            Some(key) => {
                let key = key.clone();
                self.flow_of_shared(&key)
            }
        };
        self.book.hold(p.tenant);
        self.counts.patient += usize::from(p.patient);
        let no = self.tasks.insert(self.next, p);
        self.next += 1;
        if waiting {
            self.waiting.push_back(no);
            self.counts.waiting += 1;
        } else {
            self.push_ready(no, false);
            self.counts.queued += 1;
        }
        no
    }

    /// Lists ready task `no` in its class (at the front: served next of
    /// its class), counting it ready.
    fn push_ready(&mut self, no: TaskNo, front: bool) {
        let Some((class, flow)) = self.tasks.get(&no).map(|p| (p.job().priority, p.tenant)) else {
            return;
        };
        self.counts.ready += 1;
        self.counts.ready_in[class.index()] += 1;
        self.ready.push(class, flow, no, front);
    }

    /// Counts a ready task of `class` and tenant `flow` no longer ready.
    fn unready(&mut self, class: Priority, flow: Flow) {
        self.counts.ready -= 1;
        self.counts.ready_in[class.index()] -= 1;
        self.ready.unlive(class, flow);
    }

    /// The oldest waiting task joins the ready tasks; its number, or `None`
    /// when none is waiting.
    pub fn admit_waiting(&mut self) -> Option<TaskNo> {
        while let Some(no) = self.waiting.pop_front() {
            if let Some(p) = self
                .tasks
                .get_mut(&no)
                .filter(|p| p.state == State::Waiting)
            {
                p.state = State::Ready;
                self.counts.waiting -= 1;
                self.counts.queued += 1;
                self.push_ready(no, false);
                return Some(no);
            }
        }
        None
    }

    /// The oldest waiting task, taken off the wait list (still waiting: the
    /// caller answers it).
    pub fn next_waiting(&mut self) -> Option<TaskNo> {
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

    /// The next ready task, taken off the ready lists (still ready: the
    /// caller sends it with [`send`](Self::send) or answers it): of the
    /// class the shares choose, at the end `order` says.
    pub fn next_ready(&mut self, order: Order) -> Option<TaskNo> {
        self.next_ready_within(order, Priority::Sheddable)
    }

    /// As [`next_ready`](Self::next_ready), among `lowest` and the classes
    /// more important than it.
    pub fn next_ready_within(&mut self, order: Order, lowest: Priority) -> Option<TaskNo> {
        let tasks = &self.tasks;
        let live = |no: &TaskNo| tasks.get(no).is_some_and(|p| p.state == State::Ready);
        self.ready
            .pop_live_within(order, lowest, live)
            .map(|(_, _, no)| no)
    }

    /// The oldest ready task of `class` (over its tenants, the earliest
    /// `sent_at` of their oldest), left on its list, and its tenant's flow.
    fn oldest_ready_of(&mut self, class: Priority) -> Option<(Flow, TaskNo)> {
        let tasks = &self.tasks;
        let live = |no: &TaskNo| tasks.get(no).is_some_and(|p| p.state == State::Ready);
        let sent = |no: &TaskNo| tasks.get(no).map(|p| p.sent_at);
        self.ready.oldest(class, live, sent).map(|(f, no)| (f, *no))
    }

    /// The oldest ready task of `class`, left on its list.
    pub fn oldest_ready_in(&mut self, class: Priority) -> Option<TaskNo> {
        self.oldest_ready_of(class).map(|(_, no)| no)
    }

    /// The ready task that has waited longest (the earliest `sent_at` of
    /// the classes' oldest), left on its list.
    pub fn oldest_ready(&mut self) -> Option<TaskNo> {
        let fronts = Priority::ALL.map(|c| self.oldest_ready_in(c));
        fronts
            .into_iter()
            .flatten()
            .min_by_key(|no| self.tasks.get(no).map(|p| p.sent_at))
    }

    /// Takes the oldest ready task of `class` off its list (still ready:
    /// the caller answers it).
    pub fn take_oldest_ready_in(&mut self, class: Priority) -> Option<TaskNo> {
        let (flow, no) = self.oldest_ready_of(class)?;
        self.ready.pop_oldest_of(class, flow);
        Some(no)
    }

    /// The ready task of `class` a queue too deep for its deadlines sheds
    /// first: the oldest of its tenant most over its share (with one
    /// tenant, the oldest), left on its list, and that tenant's flow.
    pub fn sheddable_in(&mut self, class: Priority) -> Option<(Flow, TaskNo)> {
        let tasks = &self.tasks;
        let live = |no: &TaskNo| tasks.get(no).is_some_and(|p| p.state == State::Ready);
        self.ready
            .oldest_of_most_over(class, live)
            .map(|(f, no)| (f, *no))
    }

    /// Takes task `no` of tenant `flow`, found by
    /// [`sheddable_in`](Self::sheddable_in), off its list (still ready:
    /// the caller answers it).
    pub fn take_sheddable(&mut self, class: Priority, flow: Flow) {
        self.ready.pop_oldest_of(class, flow);
    }

    /// The ready task that a new task of `class` and tenant `flow` may
    /// displace from a full queue, not one whose caller asked to wait: of
    /// the least important class below `class` that has one, the oldest of
    /// its tenant most over its share; else, of `class` itself, the oldest
    /// of the tenant most over its share, if `flow` (with the new task)
    /// would be less over its own. With one tenant: the oldest of the
    /// least important class below `class`, as without tenants.
    pub fn displaceable(&mut self, class: Priority, flow: Flow) -> Option<TaskNo> {
        for lower in Priority::ALL.into_iter().rev() {
            if lower.index() < class.index() {
                return None;
            }
            let Some(over) = self.ready.most_over(lower) else {
                continue;
            };
            if lower == class && (over == flow || !self.ready.less_over(class, flow, over)) {
                return None;
            }
            let tasks = &self.tasks;
            let live = |no: &TaskNo| tasks.get(no).is_some_and(|p| p.state == State::Ready);
            // A class whose only ready tasks are held back has none listed.
            let Some(&no) = self.ready.oldest_of(lower, over, live) else {
                continue;
            };
            return self.tasks.get(&no).filter(|p| !p.patient).map(|_| no);
        }
        None
    }

    /// About how many ready tasks of `class` a new task of tenant `flow`
    /// waits behind, served in `order` (see `FairClasses::ahead`): with one
    /// tenant, every ready task of the class oldest first and none newest
    /// first.
    pub fn ahead_in_class(&self, class: Priority, flow: Flow, order: Order) -> usize {
        self.ready.ahead(class, flow, order)
    }

    /// A ready task taken by [`next_ready`](Self::next_ready) goes to the
    /// balancer.
    pub fn send(&mut self, no: TaskNo) -> Option<&mut Pending> {
        let p = self
            .tasks
            .get_mut(&no)
            .filter(|p| p.state == State::Ready)?;
        p.state = State::InFlight;
        let (class, flow, first) = (p.job().priority, p.tenant, p.round == 0);
        self.counts.queued -= 1;
        self.counts.in_flight += 1;
        self.unready(class, flow);
        if first {
            if let Some(c) = self.book.counts_mut(flow) {
                c.served += 1;
            }
        }
        self.tasks.get_mut(&no)
    }

    /// Holds back ready task `no`, taken off its list and not sent, behind
    /// the tasks held before it.
    pub fn hold(&mut self, no: TaskNo) {
        if self.tasks.get(&no).is_some_and(|p| p.state == State::Ready) {
            self.held.push_back(no);
        }
    }

    /// The task held first, left held (those no longer ready are dropped
    /// from the front on the way).
    pub fn held_front(&mut self) -> Option<TaskNo> {
        while let Some(&no) = self.held.front() {
            if self.tasks.get(&no).is_some_and(|p| p.state == State::Ready) {
                return Some(no);
            }
            self.held.pop_front();
        }
        None
    }

    /// Takes the task held first off the held ones (still ready: the
    /// caller sends or answers it).
    pub fn take_held(&mut self) -> Option<TaskNo> {
        let no = self.held_front()?;
        self.held.pop_front();
        Some(no)
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
            self.push_ready(no, true);
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
                self.push_ready(no, true);
                true
            }
            None => false,
        }
    }

    /// The task leaves the table (it is answered), whatever its state.
    pub fn remove(&mut self, no: TaskNo) -> Option<Pending> {
        let p = self.tasks.remove(&no)?;
        self.counts.patient -= usize::from(p.patient);
        self.book.release(p.tenant);
        match p.state {
            State::Waiting => self.counts.waiting -= 1,
            State::Ready => {
                self.counts.queued -= 1;
                self.unready(p.job().priority, p.tenant);
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
        self.book.release_all();
        self.waiting.clear();
        self.held.clear();
        self.counts = Counts::default();
    }

    /// Drops the stale numbers of the lists once they outnumber the live
    /// ones.
    pub fn compact(&mut self) {
        let tasks = &self.tasks;
        let c = self.counts;
        if self.ready.len() > c.ready.saturating_mul(2).saturating_add(1024) {
            self.ready
                .retain(|_, _, no| tasks.get(no).is_some_and(|p| p.state == State::Ready));
        }
        if c.waiting == 0 {
            self.waiting.clear();
        } else {
            retain_if_bloated(&mut self.waiting, c.waiting, |no| {
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
