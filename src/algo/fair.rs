//! Fair shares between tenants: deficit round robin (Shreedhar and Varghese,
//! SIGCOMM 1995; Kubernetes' API Priority and Fairness) in each class.
//!
//! [`Drr`]: each tenant (a **flow**) has a queue, a weight, and a place in
//! the ring while busy. The head flow gets its weight as *deficit* for its turn,
//! each item served costs one, and a flow whose queue empties leaves the
//! ring with no deficit banked. While flows stay backlogged, flow `f` gets
//! `w_f / Σ w` of the items served to within one turn, whatever the others
//! send; an idle flow's share goes to the busy ones. Push and pop are O(1),
//! a look over the busy flows O(flows in the ring). With one flow the
//! items come in exactly its queue's [`Order`]: a queue whose tasks name no
//! tenant is a plain FIFO/LIFO list.
//!
//! [`FairClasses`] keeps one [`Drr`] per [`Priority`] class, chooses the
//! class by reserved shares (as [`ClassQueues`] does), and counts each
//! flow's live items, for how many items a new one waits behind
//! ([`FairClasses::ahead`]) and which flow is most over its share (the
//! largest backlog relative to its weight: the one to shed from). Pure.
//!
//! [`ClassQueues`]: crate::algo::priority::ClassQueues
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::fair::Drr;
//! use actix_dispatch::algo::priority::Order;
//!
//! // Flow 1 has weight 2: it gets two items per turn to flow 0's one.
//! let mut q = Drr::default();
//! q.set_weight(1, 2);
//! for i in 0..4 {
//!     q.push(0, ("a", i));
//!     q.push(1, ("b", i));
//! }
//! let served: Vec<_> = std::iter::from_fn(|| q.pop(Order::Fifo)).map(|(_, x)| x).collect();
//! assert_eq!(
//!     served,
//!     [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("b", 2), ("b", 3), ("a", 2), ("a", 3)]
//! );
//! # }
//! ```

use std::collections::VecDeque;

use crate::algo::priority::{ClassShares, Order, Priority, PriorityConfig, CLASSES};

/// A flow's number: the tenant's slot in the queue's tenant book.
pub type Flow = u16;

/// Largest weight a flow may have.
pub const MAX_WEIGHT: u32 = 1000;

/// A flow's queue emptied with more room than this is given most of it
/// back, so a tenant that once queued many items does not keep their
/// room while idle.
const KEEP_ROOM: usize = 64;

struct FlowQueue<T> {
    items: VecDeque<T>,
    weight: u32,
    /// Items left to serve in this turn.
    deficit: u32,
    /// Whether the flow is in the ring.
    listed: bool,
}

impl<T> Default for FlowQueue<T> {
    fn default() -> Self {
        FlowQueue {
            items: VecDeque::new(),
            weight: 1,
            deficit: 0,
            listed: false,
        }
    }
}

impl<T> FlowQueue<T> {
    fn take(&mut self, order: Order) -> Option<T> {
        match order {
            Order::Fifo => self.items.pop_front(),
            Order::Lifo => self.items.pop_back(),
        }
    }

    fn served_end(&self, order: Order) -> Option<&T> {
        match order {
            Order::Fifo => self.items.front(),
            Order::Lifo => self.items.back(),
        }
    }

    /// Leaves the ring: no deficit kept, most of the room given back.
    fn unlist(&mut self) {
        self.listed = false;
        self.deficit = 0;
        if self.items.capacity() > KEEP_ROOM {
            self.items.shrink_to(KEEP_ROOM);
        }
    }
}

/// Deficit round robin over flows. See the [module documentation](self).
pub struct Drr<T> {
    flows: Vec<FlowQueue<T>>,
    /// Flows with items (and flows whose items all went, not yet reached).
    ring: VecDeque<Flow>,
    /// Items held, over every flow.
    len: usize,
}

impl<T> Default for Drr<T> {
    fn default() -> Self {
        Drr {
            flows: Vec::new(),
            ring: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Drr<T> {
    #[inline]
    fn flow_mut(&mut self, f: Flow) -> &mut FlowQueue<T> {
        let i = usize::from(f);
        if self.flows.len() <= i {
            self.flows.resize_with(i + 1, Default::default);
        }
        &mut self.flows[i]
    }

    /// Sets flow `f`'s weight (clamped to `1..=MAX_WEIGHT`); a turn under
    /// way keeps what it has left.
    pub fn set_weight(&mut self, f: Flow, weight: u32) {
        self.flow_mut(f).weight = weight.clamp(1, MAX_WEIGHT);
    }

    /// Flow `f`'s weight (1 for a flow never set).
    pub fn weight(&self, f: Flow) -> u32 {
        self.flows.get(usize::from(f)).map_or(1, |q| q.weight)
    }

    /// Items held, over every flow.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a flow is in the ring. After [`skip_gone`](Self::skip_gone):
    /// whether a live item waits.
    pub fn waits(&self) -> bool {
        !self.ring.is_empty()
    }

    /// Items held by flow `f`.
    #[cfg(any(test, feature = "internals"))]
    pub fn len_of(&self, f: Flow) -> usize {
        self.flows.get(usize::from(f)).map_or(0, |q| q.items.len())
    }

    /// The flows in the ring, next to be served first.
    pub fn ring(&self) -> impl Iterator<Item = Flow> + '_ {
        self.ring.iter().copied()
    }

    #[inline]
    fn list(&mut self, f: Flow) {
        let q = self.flow_mut(f);
        if !q.listed {
            q.listed = true;
            q.deficit = 0;
            self.ring.push_back(f);
        }
    }

    /// Appends `item` to flow `f`'s queue (the flow joins the ring's back
    /// if it was not in it).
    #[inline]
    pub fn push(&mut self, f: Flow, item: T) {
        self.flow_mut(f).items.push_back(item);
        self.len += 1;
        self.list(f);
    }

    /// Puts `item` at the front of flow `f`'s queue (an item that came
    /// back unserved).
    #[inline]
    pub fn push_front(&mut self, f: Flow, item: T) {
        self.flow_mut(f).items.push_front(item);
        self.len += 1;
        self.list(f);
    }

    /// Takes the next item: from the flow at the head of the ring, at the
    /// end `order` says. `None` only when nothing is held.
    pub fn pop(&mut self, order: Order) -> Option<(Flow, T)> {
        loop {
            let f = *self.ring.front()?;
            let q = &mut self.flows[usize::from(f)];
            let Some(item) = q.take(order) else {
                q.unlist();
                self.ring.pop_front();
                continue;
            };
            self.len -= 1;
            if q.deficit == 0 {
                q.deficit = q.weight;
            }
            q.deficit -= 1;
            if q.items.is_empty() {
                q.unlist();
                self.ring.pop_front();
            } else if q.deficit == 0 && self.ring.len() > 1 {
                // (Alone in the ring, the flow is its own next turn.)
                self.ring.pop_front();
                self.ring.push_back(f);
            }
            return Some((f, item));
        }
    }

    /// Drops, from the end `order` serves of the flows at the head of the
    /// ring, the items `live` says are gone, until the head flow's next
    /// item is live or the ring is empty: then [`waits`](Self::waits) says
    /// whether a live item waits, and [`pop`](Self::pop) takes it.
    pub fn skip_gone(&mut self, order: Order, mut live: impl FnMut(&T) -> bool) {
        while let Some(&f) = self.ring.front() {
            let q = &mut self.flows[usize::from(f)];
            while q.served_end(order).is_some_and(|t| !live(t)) {
                q.take(order);
                self.len -= 1;
            }
            if !q.items.is_empty() {
                return;
            }
            q.unlist();
            self.ring.pop_front();
        }
    }

    /// As [`pop`](Self::pop), skipping the items `live` says are gone.
    #[cfg(any(test, feature = "internals"))]
    pub fn pop_live(&mut self, order: Order, live: impl FnMut(&T) -> bool) -> Option<(Flow, T)> {
        self.skip_gone(order, live);
        self.pop(order)
    }

    /// The oldest live item of flow `f`, left in place (the gone ones
    /// before it are dropped).
    pub fn oldest_of(&mut self, f: Flow, mut live: impl FnMut(&T) -> bool) -> Option<&T> {
        let q = self.flows.get_mut(usize::from(f))?;
        while q.items.front().is_some_and(|t| !live(t)) {
            q.items.pop_front();
            self.len -= 1;
        }
        q.items.front()
    }

    /// The oldest live item of the flows in the ring (by `key`, the least
    /// first; the gone items before each flow's oldest are dropped), and
    /// its flow. With one flow, that flow's front: no key is compared.
    pub fn oldest<K: Ord>(
        &mut self,
        mut live: impl FnMut(&T) -> bool,
        mut key: impl FnMut(&T) -> K,
    ) -> Option<(Flow, &T)> {
        if self.ring.len() == 1 {
            let f = self.ring[0];
            return self.oldest_of(f, live).map(|t| (f, t));
        }
        let mut best: Option<(Flow, K)> = None;
        for i in 0..self.ring.len() {
            let f = self.ring[i];
            let Some(t) = self.oldest_of(f, &mut live) else {
                continue;
            };
            let k = key(t);
            if best.as_ref().is_none_or(|(_, b)| k < *b) {
                best = Some((f, k));
            }
        }
        let (f, _) = best?;
        self.flows[usize::from(f)].items.front().map(|t| (f, t))
    }

    /// Takes the oldest item of flow `f` (a sweep found it waited too long,
    /// or it is shed to make room). The flow stays in the ring until it is
    /// reached, as if its queue had emptied in a turn.
    pub fn pop_oldest_of(&mut self, f: Flow) -> Option<T> {
        let item = self.flows.get_mut(usize::from(f))?.items.pop_front()?;
        self.len -= 1;
        Some(item)
    }

    /// Keeps only the items for which `keep` is true, in every flow.
    pub fn retain(&mut self, mut keep: impl FnMut(Flow, &T) -> bool) {
        let mut len = 0;
        for (f, q) in self.flows.iter_mut().enumerate() {
            let f = f as Flow;
            q.items.retain(|t| keep(f, t));
            len += q.items.len();
        }
        self.len = len;
        let flows = &mut self.flows;
        self.ring.retain(|&f| {
            let q = &mut flows[usize::from(f)];
            if q.items.is_empty() {
                q.unlist();
            }
            q.listed
        });
    }
}

/// One [`Drr`] per [`Priority`] class, the class chosen by reserved shares
/// (as in [`ClassQueues`](crate::algo::priority::ClassQueues)), and the
/// live items of each flow in each class. See the [module
/// documentation](self).
pub struct FairClasses<T> {
    classes: [Drr<T>; CLASSES],
    shares: ClassShares,
    /// Live items per class and flow (kept by the caller, which knows
    /// which listed items are gone).
    live: [Vec<u32>; CLASSES],
    /// Per class: the sum of the weights of the flows with live items.
    busy_weight: [u64; CLASSES],
    /// Per class: the live items (over flows).
    live_total: [usize; CLASSES],
    /// Per class: the flow of the last item pushed at the back.
    last_push: [Option<Flow>; CLASSES],
}

impl<T> FairClasses<T> {
    /// Empty lists with the given class shares.
    ///
    /// # Panics
    ///
    /// If `config` fails [`PriorityConfig::validate`].
    pub fn new(config: &PriorityConfig) -> Self {
        FairClasses {
            classes: Default::default(),
            shares: ClassShares::new(config),
            live: Default::default(),
            busy_weight: [0; CLASSES],
            live_total: [0; CLASSES],
            last_push: [None; CLASSES],
        }
    }

    /// Sets flow `f`'s weight in every class. Only for a flow with no live
    /// item (its share of the busy weights is then not counted).
    pub fn set_weight(&mut self, f: Flow, weight: u32) {
        if self.weight(f) == weight.clamp(1, MAX_WEIGHT) {
            return;
        }
        for d in &mut self.classes {
            d.set_weight(f, weight);
        }
    }

    /// Flow `f`'s weight.
    pub fn weight(&self, f: Flow) -> u32 {
        self.classes[0].weight(f)
    }

    /// Items listed, over classes (gone ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.classes.iter().map(Drr::len).sum()
    }

    /// Whether nothing is listed.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(Drr::is_empty)
    }

    /// Lists `item` of flow `f` at the back of `class` (or at its flow's
    /// front, when `front`), and counts it live.
    #[inline]
    pub fn push(&mut self, class: Priority, f: Flow, item: T, front: bool) {
        let c = class.index();
        match front {
            true => self.classes[c].push_front(f, item),
            false => {
                self.classes[c].push(f, item);
                self.last_push[c] = Some(f);
            }
        }
        let i = usize::from(f);
        if self.live[c].len() <= i {
            self.live[c].resize(i + 1, 0);
        }
        if self.live[c][i] == 0 {
            self.busy_weight[c] += u64::from(self.classes[c].weight(f));
        }
        self.live[c][i] += 1;
        self.live_total[c] += 1;
    }

    /// An item of flow `f` in `class` is no longer live (sent, answered):
    /// its entry, if still listed, is dropped when reached.
    #[inline]
    pub fn unlive(&mut self, class: Priority, f: Flow) {
        let c = class.index();
        let Some(n) = self.live[c].get_mut(usize::from(f)).filter(|n| **n > 0) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.busy_weight[c] -= u64::from(self.classes[c].weight(f));
        }
        self.live_total[c] -= 1;
    }

    /// Live items of flow `f` in `class`.
    pub fn backlog(&self, class: Priority, f: Flow) -> usize {
        self.live[class.index()]
            .get(usize::from(f))
            .map_or(0, |&n| n as usize)
    }

    /// Takes the next item among `lowest` and the classes above it: the
    /// class by reserved shares, the flow by deficit round robin, the end
    /// of its queue `order` says; gone items (by `live`) are skipped.
    pub fn pop_live_within(
        &mut self,
        order: Order,
        lowest: Priority,
        mut live: impl FnMut(&T) -> bool,
    ) -> Option<(Priority, Flow, T)> {
        for d in &mut self.classes[..=lowest.index()] {
            d.skip_gone(order, &mut live);
        }
        let classes = &self.classes;
        let c = self.shares.pick(|c| classes[c].waits(), lowest)?;
        let (f, item) = self.classes[c].pop(order)?;
        if self.classes[c].is_empty() {
            self.shares.idle(c);
        }
        Some((Priority::ALL[c], f, item))
    }

    /// The oldest live item of `class` over its flows (least `key` first),
    /// left in place, and its flow.
    pub fn oldest<K: Ord>(
        &mut self,
        class: Priority,
        live: impl FnMut(&T) -> bool,
        key: impl FnMut(&T) -> K,
    ) -> Option<(Flow, &T)> {
        let c = class.index();
        let f = self.classes[c].oldest(live, key).map(|(f, _)| f);
        if self.classes[c].is_empty() {
            self.shares.idle(c);
        }
        let f = f?;
        self.classes[c].flows[usize::from(f)]
            .items
            .front()
            .map(|t| (f, t))
    }

    /// The oldest live item of the flow most over its share in `class`
    /// ([`most_over`](Self::most_over)), left in place, and its flow: what
    /// a queue too deep to meet its deadlines sheds first, so that the
    /// flood of one tenant does not push the others' items out. Among
    /// equally over flows, the one that pushed an item last. With one
    /// flow, its oldest, as [`oldest`](Self::oldest) gives.
    pub fn oldest_of_most_over(
        &mut self,
        class: Priority,
        live: impl FnMut(&T) -> bool,
    ) -> Option<(Flow, &T)> {
        let c = class.index();
        let Some(mut f) = self.most_over(class) else {
            if self.classes[c].is_empty() {
                self.shares.idle(c);
            }
            return None;
        };
        // Among equals, the flow that pushed last: at a shallow depth the
        // backlogs are a few items each, and the flood pushes far more
        // often than a quiet flow whose burst ties with it.
        if let Some(l) = self.last_push[c].filter(|&l| l != f) {
            let (bl, wl) = (self.backlog(class, l) as u64, u64::from(self.weight(l)));
            let (bf, wf) = (self.backlog(class, f) as u64, u64::from(self.weight(f)));
            if bl > 0 && bl * wf == bf * wl {
                f = l;
            }
        }
        self.classes[c].oldest_of(f, live).map(|t| (f, t))
    }

    /// The oldest live item of flow `f` in `class`, left in place.
    pub fn oldest_of(
        &mut self,
        class: Priority,
        f: Flow,
        live: impl FnMut(&T) -> bool,
    ) -> Option<&T> {
        self.classes[class.index()].oldest_of(f, live)
    }

    /// Takes the oldest listed item of flow `f` in `class`.
    pub fn pop_oldest_of(&mut self, class: Priority, f: Flow) -> Option<T> {
        let c = class.index();
        let item = self.classes[c].pop_oldest_of(f);
        if self.classes[c].is_empty() {
            self.shares.idle(c);
        }
        item
    }

    /// Keeps only the items for which `keep` is true (the live counts are
    /// the caller's to keep right).
    pub fn retain(&mut self, mut keep: impl FnMut(Priority, Flow, &T) -> bool) {
        for (c, d) in self.classes.iter_mut().enumerate() {
            d.retain(|f, t| keep(Priority::ALL[c], f, t));
        }
    }

    /// Forgets every item and count.
    pub fn clear(&mut self) {
        for d in &mut self.classes {
            d.retain(|_, _| false);
        }
        for (c, l) in self.live.iter_mut().enumerate() {
            l.clear();
            self.busy_weight[c] = 0;
            self.live_total[c] = 0;
            self.shares.idle(c);
        }
    }

    /// About how many live items of `class` a new item of flow `f` waits
    /// behind, if served in `order` (the classes above are the caller's
    /// to add).
    ///
    /// Oldest first, the flow's own `b` items go first, and each other busy
    /// flow `g` serves at most `(b + 1) · w_g / w_f` items meanwhile (its
    /// turns while `f` takes `b + 1` items); the estimate sums those
    /// weights at once, bounded by what the others hold. Newest first,
    /// only one turn of the others. With one flow this is the class's live
    /// count (FIFO) or zero (LIFO), as in a plain list.
    pub fn ahead(&self, class: Priority, f: Flow, order: Order) -> usize {
        let c = class.index();
        let own = self.backlog(class, f);
        let others = self.live_total[c] - own;
        let w = u64::from(self.weight(f));
        let own_weight = if own > 0 { w } else { 0 };
        let others_weight = self.busy_weight[c] - own_weight;
        let rounds = match order {
            Order::Fifo => own as u64 + 1,
            Order::Lifo => 1,
        };
        let theirs = (rounds.saturating_mul(others_weight)).div_ceil(w);
        let theirs = usize::try_from(theirs).unwrap_or(usize::MAX).min(others);
        match order {
            Order::Fifo => own + theirs,
            Order::Lifo => theirs,
        }
    }

    /// Of the flows in `class`'s ring with live items, the one with the
    /// largest backlog relative to its weight (the first in ring order
    /// among equals): the most over its fair share. O(flows in the ring).
    pub fn most_over(&self, class: Priority) -> Option<Flow> {
        let c = class.index();
        let mut best: Option<(Flow, u64, u64)> = None;
        for f in self.classes[c].ring() {
            let b = self.backlog(class, f) as u64;
            if b == 0 {
                continue;
            }
            let w = u64::from(self.weight(f));
            // b / w > bb / bw, without division.
            if best.is_none_or(|(_, bb, bw)| b * bw > bb * w) {
                best = Some((f, b, w));
            }
        }
        best.map(|(f, _, _)| f)
    }

    /// Whether flow `f`, with one more item in `class`, would be strictly
    /// less over its share than flow `than`.
    pub fn less_over(&self, class: Priority, f: Flow, than: Flow) -> bool {
        let b = self.backlog(class, f) as u64 + 1;
        let w = u64::from(self.weight(f));
        let bb = self.backlog(class, than) as u64;
        let bw = u64::from(self.weight(than));
        b * bw < bb * w
    }
}

#[cfg(test)]
mod tests;
