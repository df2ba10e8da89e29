//! Priority classes, and the class queues the fair queues
//! ([`crate::algo::fair`]) are tested and benchmarked against.
//!
//! Three classes, [`Priority`]: `critical`, `default` and `sheddable`, the
//! criticalities of Google's SRE book ("Handling Overload"; its
//! `CRITICAL_PLUS` folded into `critical`, `SHEDDABLE_PLUS` into `default`).
//! [`ClassQueues`] holds one ready queue per class and picks the class of
//! the next dispatch:
//!
//! * **Reserved shares**: a class with tasks waiting earns its share of
//!   every dispatch (parts per million) and is served when owed a whole
//!   one, so a flood of `critical` cannot starve `default`.
//! * **Priority for the rest**: else the most important class waiting.
//! * **Work-conserving**: a class with nothing waiting earns nothing.
//! * **Shedding from the bottom**: [`ClassQueues::shed`] and
//!   [`ClassQueues::admit`] take the oldest task of the least important
//!   class with tasks.
//!
//! Each pop takes an [`Order`] from the delay control
//! ([`crate::algo::codel`]): oldest first when calm, newest when overloaded.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::codel::Order;
//! use actix_dispatch::algo::priority::{ClassQueues, Priority, PriorityConfig};
//!
//! let mut q = ClassQueues::new(PriorityConfig::default());
//! q.push(Priority::Sheddable, 1);
//! q.push(Priority::Critical, 2);
//! q.push(Priority::Critical, 3);
//! assert_eq!(q.pop(Order::Fifo), Some((Priority::Critical, 2)));
//! assert_eq!(q.shed(), Some((Priority::Sheddable, 1)));
//! assert_eq!("critical".parse::<Priority>(), Ok(Priority::Critical));
//! # }
//! ```

#[cfg(any(test, feature = "internals"))]
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which end of a queue to serve: the delay control's choice
/// ([`Codel::order`](crate::algo::codel::Codel::order)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Oldest first.
    Fifo,
    /// Newest first.
    Lifo,
}

/// Number of classes.
pub(crate) const CLASSES: usize = 3;
/// One whole dispatch, in parts per million.
const WHOLE: u64 = 1_000_000;

/// How important a task is; under overload the least important goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Priority {
    /// Served first, shed last: what a user is waiting on.
    Critical,
    /// Everything not marked otherwise.
    #[default]
    Default,
    /// Shed first: prefetches, batch work, retries of best-effort calls.
    Sheddable,
}

impl Priority {
    /// All classes, most important first.
    pub const ALL: [Priority; CLASSES] =
        [Priority::Critical, Priority::Default, Priority::Sheddable];

    /// The name used in task lines, headers and config: `critical`,
    /// `default` or `sheddable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Default => "default",
            Priority::Sheddable => "sheddable",
        }
    }

    /// 0 for the most important class, 2 for the least.
    pub(crate) fn index(self) -> usize {
        match self {
            Priority::Critical => 0,
            Priority::Default => 1,
            Priority::Sheddable => 2,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is none of the classes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority `{0}`: expected critical, default or sheddable")]
pub struct ParsePriorityError(String);

impl FromStr for Priority {
    type Err = ParsePriorityError;

    /// Parses a class name, ignoring ASCII case and surrounding spaces (a
    /// header value may carry either). The error quotes at most 64
    /// characters of the input.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Priority::ALL
            .into_iter()
            .find(|p| t.eq_ignore_ascii_case(p.as_str()))
            .ok_or_else(|| ParsePriorityError(t.chars().take(64).collect()))
    }
}

/// Reserved shares of the dispatches, per class.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PriorityConfig {
    /// Least share of the dispatches `critical` gets while it has tasks.
    pub critical: f64,
    /// Least share `default` gets while it has tasks.
    pub default: f64,
    /// Least share `sheddable` gets while it has tasks.
    pub sheddable: f64,
}

impl Default for PriorityConfig {
    /// `critical: 0.5`, `default: 0.2`, `sheddable: 0.05`; the other 25 %
    /// go by priority.
    ///
    /// `critical` is served first anyway; its half matters only against
    /// reservations of the others that a config raises. `default` keeps a
    /// fifth so that a caller marking everything critical cannot starve
    /// ordinary traffic. `sheddable` keeps 5 %, enough that it is never
    /// starved forever while small enough that under overload it is nearly
    /// all shed.
    fn default() -> Self {
        PriorityConfig {
            critical: 0.5,
            default: 0.2,
            sheddable: 0.05,
        }
    }
}

impl PriorityConfig {
    /// Checks that each share is a number in `[0, 1]` and that they add up
    /// to at most 1; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("critical", self.critical),
            ("default", self.default),
            ("sheddable", self.sheddable),
        ];
        for (name, v) in fields {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} share must be in [0, 1], got {v}"));
            }
        }
        let sum = self.critical + self.default + self.sheddable;
        // A little slack for shares written as decimals (0.7 + 0.2 + 0.1).
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "critical + default + sheddable shares must be at most 1, got {sum}"
            ));
        }
        Ok(())
    }

    /// Shares in parts per million, most important first.
    fn ppm(&self) -> [u64; CLASSES] {
        // In [0, 1] once validated, so the `as` conversion is exact enough.
        [self.critical, self.default, self.sheddable].map(|s| (s * WHOLE as f64).round() as u64)
    }
}

/// What [`ClassQueues::admit`] did.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit<T> {
    /// Queued; there was room.
    Queued,
    /// Queued, after shedding this less important item to make room.
    Displaced(Priority, T),
    /// Not queued: the queue is full of items at least as important.
    Refused(T),
}

/// The reserved-share accounting of the classes, apart from what holds
/// their items: which class the next dispatch serves (see the [module
/// documentation](self)). [`ClassQueues`] and the tenants' fair lists
/// ([`crate::algo::fair::FairClasses`]) share it.
#[derive(Debug, Clone)]
pub(crate) struct ClassShares {
    /// Reserved share per class, in parts per million.
    shares: [u64; CLASSES],
    /// Dispatches owed to each class, in parts per million.
    owed: [u64; CLASSES],
}

impl ClassShares {
    /// # Panics
    ///
    /// If `config` fails [`PriorityConfig::validate`].
    pub(crate) fn new(config: &PriorityConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid PriorityConfig: {e}");
        }
        ClassShares {
            shares: config.ppm(),
            owed: [0; CLASSES],
        }
    }

    /// The class (index) the next dispatch serves among `lowest` and the
    /// classes above it, given which have items waiting: classes with
    /// items earn their share, the most important one owed a whole
    /// dispatch pays it back and is served, else the most important with
    /// items. `None` when none waits.
    pub(crate) fn pick(
        &mut self,
        waits: impl Fn(usize) -> bool,
        lowest: Priority,
    ) -> Option<usize> {
        let n = lowest.index() + 1;
        let first = (0..n).find(|&c| waits(c))?;
        for c in 0..n {
            if waits(c) {
                self.owed[c] = self.owed[c].saturating_add(self.shares[c]);
            } else {
                self.owed[c] = 0;
            }
        }
        let c = (0..n)
            .find(|&c| waits(c) && self.owed[c] >= WHOLE)
            .unwrap_or(first);
        self.owed[c] = self.owed[c].saturating_sub(WHOLE);
        Some(c)
    }

    /// Class `c` has nothing waiting: it banks nothing.
    pub(crate) fn idle(&mut self, c: usize) {
        self.owed[c] = 0;
    }
}

/// One ready queue per [`Priority`]. See the [module documentation](self).
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone)]
pub struct ClassQueues<T> {
    queues: [VecDeque<T>; CLASSES],
    shares: ClassShares,
}

#[cfg(any(test, feature = "internals"))]
impl<T> ClassQueues<T> {
    /// Empty queues with the given reserved shares.
    ///
    /// # Panics
    ///
    /// If `config` fails [`PriorityConfig::validate`].
    pub fn new(config: PriorityConfig) -> Self {
        ClassQueues {
            queues: Default::default(),
            shares: ClassShares::new(&config),
        }
    }

    /// Items waiting, over all classes.
    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Items waiting in `class`.
    pub fn len_of(&self, class: Priority) -> usize {
        self.queues[class.index()].len()
    }

    /// Appends `item` to its class's queue.
    pub fn push(&mut self, class: Priority, item: T) {
        self.queues[class.index()].push_back(item);
    }

    /// Appends `item` if fewer than `capacity` items wait; otherwise sheds
    /// the oldest item of the least important class with items, if that
    /// class is less important than `class`, to make room; otherwise hands
    /// `item` back.
    pub fn admit(&mut self, class: Priority, item: T, capacity: usize) -> Admit<T> {
        if self.len() < capacity {
            self.push(class, item);
            return Admit::Queued;
        }
        match self.shed_candidate() {
            Some((lowest, _)) if lowest.index() > class.index() => {
                let (p, old) = self.shed().expect("a candidate exists");
                self.push(class, item);
                Admit::Displaced(p, old)
            }
            _ => Admit::Refused(item),
        }
    }

    /// Puts `item` back at the front of its class's queue: the next of its
    /// class to be served oldest first (a task that came back unsent).
    pub fn push_front(&mut self, class: Priority, item: T) {
        self.queues[class.index()].push_front(item);
    }

    /// Takes the next item to dispatch, from the class chosen by reserved
    /// shares and then priority, at the end `order` says: `None` only when
    /// nothing waits.
    pub fn pop(&mut self, order: Order) -> Option<(Priority, T)> {
        self.pop_within(order, Priority::Sheddable)
    }

    /// As [`pop`](Self::pop), among `lowest` and the classes more important
    /// than it (the others neither earn nor pay: they are not asked).
    pub fn pop_within(&mut self, order: Order, lowest: Priority) -> Option<(Priority, T)> {
        let queues = &self.queues;
        let c = self.shares.pick(|c| !queues[c].is_empty(), lowest)?;
        let item = match order {
            Order::Fifo => self.queues[c].pop_front(),
            Order::Lifo => self.queues[c].pop_back(),
        }?;
        if self.queues[c].is_empty() {
            self.shares.idle(c);
        }
        Some((Priority::ALL[c], item))
    }

    /// As [`pop`](Self::pop), for queues that leave items behind when they
    /// go (a task answered while listed): first drops, from the end `order`
    /// serves, the items `live` says are gone, so that a class holding only
    /// such items neither counts as waiting nor earns a share.
    pub fn pop_live(
        &mut self,
        order: Order,
        live: impl FnMut(&T) -> bool,
    ) -> Option<(Priority, T)> {
        self.pop_live_within(order, Priority::Sheddable, live)
    }

    /// As [`pop_live`](Self::pop_live), among `lowest` and the classes more
    /// important than it.
    pub fn pop_live_within(
        &mut self,
        order: Order,
        lowest: Priority,
        mut live: impl FnMut(&T) -> bool,
    ) -> Option<(Priority, T)> {
        for q in &mut self.queues[..=lowest.index()] {
            match order {
                Order::Fifo => {
                    while q.front().is_some_and(|t| !live(t)) {
                        q.pop_front();
                    }
                }
                Order::Lifo => {
                    while q.back().is_some_and(|t| !live(t)) {
                        q.pop_back();
                    }
                }
            }
        }
        self.pop_within(order, lowest)
    }

    /// The oldest item of `class` that `live` accepts, left in place (the
    /// gone ones before it are dropped).
    pub fn oldest_live(&mut self, class: Priority, mut live: impl FnMut(&T) -> bool) -> Option<&T> {
        let c = class.index();
        while self.queues[c].front().is_some_and(|t| !live(t)) {
            self.queues[c].pop_front();
        }
        if self.queues[c].is_empty() {
            self.shares.idle(c);
        }
        self.queues[c].front()
    }

    /// The item [`shed`](Self::shed) would take: the oldest of the least
    /// important class with items.
    pub fn shed_candidate(&self) -> Option<(Priority, &T)> {
        (0..CLASSES)
            .rev()
            .find_map(|c| self.queues[c].front().map(|t| (Priority::ALL[c], t)))
    }

    /// Takes the oldest item of the least important class with items, to
    /// shed it.
    pub fn shed(&mut self) -> Option<(Priority, T)> {
        let c = (0..CLASSES).rev().find(|&c| !self.queues[c].is_empty())?;
        let item = self.queues[c].pop_front()?;
        if self.queues[c].is_empty() {
            self.shares.idle(c);
        }
        Some((Priority::ALL[c], item))
    }

    /// The oldest item of `class`, for the delay control's sweep.
    pub fn oldest(&self, class: Priority) -> Option<&T> {
        self.queues[class.index()].front()
    }

    /// Takes the oldest item of `class` (the sweep found it waited too long).
    pub fn pop_oldest(&mut self, class: Priority) -> Option<T> {
        let c = class.index();
        let item = self.queues[c].pop_front();
        if self.queues[c].is_empty() {
            self.shares.idle(c);
        }
        item
    }

    /// Keeps only the items for which `keep` is true (cancelled tasks out),
    /// in every class.
    pub fn retain(&mut self, mut keep: impl FnMut(Priority, &T) -> bool) {
        for (c, q) in self.queues.iter_mut().enumerate() {
            q.retain(|t| keep(Priority::ALL[c], t));
            if q.is_empty() {
                self.shares.idle(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use Priority::{Critical, Default as Normal, Sheddable};

    fn pops(q: &mut ClassQueues<u32>, n: usize) -> String {
        (0..n)
            .map(|_| match q.pop(Order::Fifo) {
                Some((Critical, _)) => 'C',
                Some((Normal, _)) => 'D',
                Some((Sheddable, _)) => 'S',
                None => '-',
            })
            .collect()
    }

    fn filled(config: PriorityConfig, each: u32) -> ClassQueues<u32> {
        let mut q = ClassQueues::new(config);
        for i in 0..each {
            for p in Priority::ALL {
                q.push(p, i);
            }
        }
        q
    }

    #[test]
    fn names_parse_and_print() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.as_str()));
            assert_eq!(serde_json::from_str::<Priority>(&json).unwrap(), p);
        }
        assert_eq!(" Critical ".parse::<Priority>(), Ok(Critical));
        assert_eq!("SHEDDABLE".parse::<Priority>(), Ok(Sheddable));
        let e = "urgent".parse::<Priority>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown priority `urgent`: expected critical, default or sheddable"
        );
        let long = "x".repeat(10_000);
        assert_eq!(long.parse::<Priority>().unwrap_err().0.len(), 64);
        assert!(serde_json::from_str::<Priority>("\"Critical\"").is_err());
        assert_eq!(Priority::default(), Normal);
    }

    #[test]
    fn default_shares_and_validation() {
        let c = PriorityConfig::default();
        assert_eq!((c.critical, c.default, c.sheddable), (0.5, 0.2, 0.05));
        assert_eq!(c.validate(), Ok(()));
        let bad = |f: fn(&mut PriorityConfig)| {
            let mut c = PriorityConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.critical = -0.1).contains("critical"));
        assert!(bad(|c| c.default = f64::NAN).contains("default"));
        assert!(bad(|c| c.sheddable = 1.5).contains("sheddable"));
        assert!(bad(|c| c.default = 0.6).contains("at most 1"));
        let tenths = PriorityConfig {
            critical: 0.7,
            default: 0.2,
            sheddable: 0.1,
        };
        assert_eq!(tenths.validate(), Ok(()));
    }

    #[test]
    fn a_pop_within_serves_only_the_classes_asked() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        q.push(Sheddable, 1);
        q.push(Normal, 2);
        // Only critical asked, and none waits: nothing, and nothing moves.
        assert_eq!(q.pop_within(Order::Fifo, Critical), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_within(Order::Fifo, Normal), Some((Normal, 2)));
        assert_eq!(q.pop_within(Order::Fifo, Normal), None);
        q.push(Critical, 3);
        q.push(Critical, 4);
        assert_eq!(q.pop_within(Order::Lifo, Critical), Some((Critical, 4)));
        // Sheddable earned nothing while it was not asked: critical first.
        assert_eq!(q.pop(Order::Fifo), Some((Critical, 3)));
        assert_eq!(q.pop(Order::Fifo), Some((Sheddable, 1)));
        // The live filter drops dead items of the classes asked only.
        q.push(Sheddable, 5);
        q.push(Normal, 6);
        q.push(Normal, 7);
        assert_eq!(
            q.pop_live_within(Order::Fifo, Normal, |&i| i != 6),
            Some((Normal, 7))
        );
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn reserved_shares_then_priority_exact_sequence() {
        // All three backlogged. Per pop: C earns 0.5, D 0.2, S 0.05.
        // D is owed a whole dispatch every 5th pop, S every 20th; C takes
        // the rest (priority) and its own owed never reaches a whole one.
        let mut q = filled(PriorityConfig::default(), 100);
        assert_eq!(pops(&mut q, 20), "CCCCDCCCCDCCCCDCCCCD");
        // S was owed one at the 20th pop too, but D came first, and then C,
        // owed a whole one after the pop D took: S is served at the 22nd.
        assert_eq!(pops(&mut q, 5), "CSCCD");
    }

    #[test]
    fn a_lower_class_with_a_large_share_cannot_starve_critical() {
        let mut q = filled(
            PriorityConfig {
                critical: 0.25,
                default: 0.75,
                sheddable: 0.0,
            },
            300,
        );
        // D earns 0.75 per pop, C 0.25: C is owed one every 4th pop.
        assert_eq!(pops(&mut q, 8), "CDDDCDDD");
        let mut counts = [0usize; 3];
        for _ in 0..200 {
            counts[q.pop(Order::Fifo).unwrap().0.index()] += 1;
        }
        assert!(counts[0] >= 50 && counts[1] >= 140, "{counts:?}");
        assert_eq!(counts[2], 0);
    }

    #[test]
    fn work_conserving_and_no_banking() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        // Only sheddable waits: it gets every dispatch.
        for i in 0..5 {
            q.push(Sheddable, i);
        }
        assert_eq!(pops(&mut q, 6), "SSSSS-");
        // Sheddable idled through many pops of others; it banked nothing,
        // so it waits its 20 pops like anyone.
        for i in 0..50 {
            q.push(Critical, i);
        }
        assert_eq!(pops(&mut q, 10), "CCCCCCCCCC");
        q.push(Sheddable, 99);
        assert_eq!(pops(&mut q, 20), "CCCCCCCCCCCCCCCCCCCS");
    }

    #[test]
    fn pop_takes_the_end_the_order_says() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        for i in 1..=3 {
            q.push(Normal, i);
        }
        assert_eq!(q.pop(Order::Lifo), Some((Normal, 3)));
        assert_eq!(q.pop(Order::Fifo), Some((Normal, 1)));
        assert_eq!(q.oldest(Normal), Some(&2));
        assert_eq!(q.pop_oldest(Normal), Some(2));
        assert_eq!(q.pop(Order::Lifo), None);
    }

    #[test]
    fn sheds_the_oldest_of_the_lowest_class_first() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        q.push(Critical, 1);
        q.push(Normal, 2);
        q.push(Normal, 3);
        q.push(Sheddable, 4);
        assert_eq!(q.shed_candidate(), Some((Sheddable, &4)));
        assert_eq!(q.shed(), Some((Sheddable, 4)));
        assert_eq!(q.shed(), Some((Normal, 2)));
        assert_eq!(q.shed(), Some((Normal, 3)));
        assert_eq!(q.shed(), Some((Critical, 1)));
        assert_eq!(q.shed(), None);
        assert_eq!(q.shed_candidate(), None);
    }

    #[test]
    fn admit_displaces_only_less_important_items() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        assert_eq!(q.admit(Sheddable, 1, 2), Admit::Queued);
        assert_eq!(q.admit(Normal, 2, 2), Admit::Queued);
        assert_eq!(q.admit(Sheddable, 3, 2), Admit::Refused(3));
        assert_eq!(q.admit(Critical, 4, 2), Admit::Displaced(Sheddable, 1));
        assert_eq!(q.admit(Normal, 5, 2), Admit::Refused(5));
        assert_eq!(q.admit(Critical, 6, 2), Admit::Displaced(Normal, 2));
        assert_eq!(q.admit(Critical, 7, 2), Admit::Refused(7));
        assert_eq!((q.len_of(Critical), q.len()), (2, 2));
    }

    #[test]
    fn push_front_and_live_pops_skip_what_is_gone() {
        let mut q = ClassQueues::new(PriorityConfig::default());
        q.push(Sheddable, 1);
        q.push(Sheddable, 2);
        q.push(Normal, 3);
        q.push_front(Normal, 4);
        // 3 is gone: the default class still holds 4.
        let live = |t: &u32| *t != 3;
        assert_eq!(q.pop_live(Order::Lifo, live), Some((Normal, 4)));
        // Only gone items left in default: it neither waits nor is served.
        q.push(Normal, 5);
        let live = |t: &u32| *t != 5;
        assert_eq!(q.pop_live(Order::Fifo, live), Some((Sheddable, 1)));
        assert_eq!(q.len_of(Normal), 0);
        assert_eq!(q.oldest_live(Sheddable, |t| *t != 2), None);
        assert!(q.is_empty());
        q.push(Critical, 6);
        q.push(Critical, 7);
        assert_eq!(q.oldest_live(Critical, |t| *t != 6), Some(&7));
        assert_eq!(q.len_of(Critical), 1);
    }

    #[test]
    fn retain_removes_in_every_class() {
        let mut q = filled(PriorityConfig::default(), 4);
        q.retain(|p, &i| p == Critical || i % 2 == 0);
        assert_eq!(
            (q.len_of(Critical), q.len_of(Normal), q.len_of(Sheddable)),
            (4, 2, 2)
        );
        q.retain(|_, _| false);
        assert!(q.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(usize),
        Admit(usize, usize),
        Pop(bool),
        Shed,
        Sweep(usize),
        Retain(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..3).prop_map(Op::Push),
            2 => (0usize..3, 0usize..20).prop_map(|(c, cap)| Op::Admit(c, cap)),
            4 => any::<bool>().prop_map(Op::Pop),
            1 => Just(Op::Shed),
            1 => (0usize..3).prop_map(Op::Sweep),
            1 => (2u32..7).prop_map(Op::Retain),
        ]
    }

    proptest! {
        /// Every item pushed leaves exactly once (popped, shed, swept,
        /// displaced, refused or removed), with its own class, and the
        /// counts agree at every step.
        #[test]
        fn every_item_leaves_exactly_once(
            shares in (0u32..=100, 0u32..=100, 0u32..=100),
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let total = f64::from((shares.0 + shares.1 + shares.2).max(100));
            let config = PriorityConfig {
                critical: f64::from(shares.0) / total,
                default: f64::from(shares.1) / total,
                sheddable: f64::from(shares.2) / total,
            };
            let mut q = ClassQueues::new(config);
            let mut class_of = Vec::new();
            let mut left = Vec::new();
            fn gone(id: u32, p: Priority, class_of: &[Priority], left: &mut Vec<u32>) {
                assert_eq!(class_of[id as usize], p);
                left.push(id);
            }
            for op in ops {
                let next = class_of.len() as u32;
                match op {
                    Op::Push(c) => {
                        class_of.push(Priority::ALL[c]);
                        q.push(Priority::ALL[c], next);
                    }
                    Op::Admit(c, cap) => {
                        class_of.push(Priority::ALL[c]);
                        let before = q.len();
                        match q.admit(Priority::ALL[c], next, cap) {
                            Admit::Queued => prop_assert!(q.len() <= cap),
                            Admit::Displaced(p, id) => {
                                prop_assert!(p.index() > c);
                                prop_assert_eq!(q.len(), before);
                                gone(id, p, &class_of, &mut left);
                            }
                            Admit::Refused(id) => {
                                prop_assert_eq!(q.len(), before);
                                gone(id, Priority::ALL[c], &class_of, &mut left);
                            }
                        }
                    }
                    Op::Pop(lifo) => {
                        let was_empty = q.is_empty();
                        let order = if lifo { Order::Lifo } else { Order::Fifo };
                        match q.pop(order) {
                            Some((p, id)) => gone(id, p, &class_of, &mut left),
                            None => prop_assert!(was_empty),
                        }
                    }
                    Op::Shed => {
                        let lowest = q.shed_candidate().map(|(p, &id)| (p, id));
                        let shed = q.shed();
                        prop_assert_eq!(lowest, shed);
                        if let Some((p, id)) = shed {
                            prop_assert!((p.index() + 1..3).all(|c| q.len_of(Priority::ALL[c]) == 0));
                            gone(id, p, &class_of, &mut left);
                        }
                    }
                    Op::Sweep(c) => {
                        if let Some(id) = q.pop_oldest(Priority::ALL[c]) {
                            gone(id, Priority::ALL[c], &class_of, &mut left);
                        }
                    }
                    Op::Retain(k) => {
                        let mut removed = Vec::new();
                        q.retain(|p, &id| {
                            let keep = id % k != 0;
                            if !keep {
                                removed.push((p, id));
                            }
                            keep
                        });
                        for (p, id) in removed {
                            gone(id, p, &class_of, &mut left);
                        }
                    }
                }
                prop_assert_eq!(q.len(), class_of.len() - left.len());
                let by_class: usize = Priority::ALL.iter().map(|&p| q.len_of(p)).sum();
                prop_assert_eq!(by_class, q.len());
            }
            while let Some((p, id)) = q.pop(Order::Fifo) {
                gone(id, p, &class_of, &mut left);
            }
            left.sort_unstable();
            let all: Vec<u32> = (0..class_of.len() as u32).collect();
            prop_assert_eq!(left, all);
        }

        /// A class that keeps items waiting gets at least its reserved share
        /// of the dispatches, less the two pops the more important classes
        /// owed at the same time may take first.
        #[test]
        fn backlogged_classes_get_their_shares(
            shares in (0u32..=100, 0u32..=100, 0u32..=100),
            n in 1usize..500,
        ) {
            let total = f64::from((shares.0 + shares.1 + shares.2).max(100));
            let config = PriorityConfig {
                critical: f64::from(shares.0) / total,
                default: f64::from(shares.1) / total,
                sheddable: f64::from(shares.2) / total,
            };
            let wanted = [config.critical, config.default, config.sheddable];
            let mut q = filled(config, 600);
            let mut counts = [0usize; 3];
            for _ in 0..n {
                counts[q.pop(Order::Fifo).unwrap().0.index()] += 1;
            }
            for c in 0..3 {
                let floor = (wanted[c] * n as f64 - 2.0).floor().max(0.0) as usize;
                prop_assert!(counts[c] >= floor, "{:?} for {:?} over {}", counts, wanted, n);
            }
        }
    }
}
