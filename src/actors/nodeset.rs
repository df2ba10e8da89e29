//! `NodeSet`: the balancer's nodes, and the sums and index it keeps over them.
//!
//! The balancer answers "how many tasks can the pool take now" and "is every
//! node open, or out of tokens" on every event, so it keeps those answers as
//! running sums rather than scanning the pool (a pool of 1 000 nodes costs
//! the same per task as a pool of one). Sums that must agree with their
//! parts are easy to break when every handler updates them by hand, so one
//! type owns them, and its methods are the only way to change a node's room:
//!
//! * `capacity` is the sum of the nodes' rooms (free slots, probes, tokens:
//!   see [`NodeView::room_and_flags`]), as of each node's last refresh;
//! * `below` is the part of `capacity` under the nodes' free limits, which
//!   any class may take (the rest is headroom, see [`crate::algo::headroom`]),
//!   and `headroom_only` the number of nodes whose room is all headroom;
//! * `counts` is the sum of the nodes' [`Flags`], as of the same refresh;
//! * `cands[i]` is node `i`'s [`Candidate`] for the strategy, eligible
//!   exactly when its room is positive;
//! * `eligible` is the number of nodes with a positive room, so that a pick
//!   knows whether any node can take the task without scanning the pool;
//! * `index` maps every node's id to its position.
//!
//! A node's view can be changed through [`NodeSet::update`] (which refreshes
//! that node after the change) or [`NodeSet::node_mut`] (refreshed at the
//! next [`NodeSet::refresh`] or [`NodeSet::refresh_all`]): the room and flags
//! the sums were built from live here, not in the view, so no change to a
//! view can make the sums disagree with their parts.
//!
//! ```text
//!   push / remove ─► views, cands, slots, index   (same length, same order)
//!   refresh(i)    ─► slot i recomputed; capacity and counts moved by its delta
//!   refresh_all   ─► the ejection cap (max_ejected_percent), then every node
//! ```

use std::time::Duration;

use tokio::time::Instant;

use super::protocol::{LoadReport, NodeId};
use super::view::{Counts, Flags, Mirror, NodeView, SharedMirror};
use crate::algo::strategy::{Candidate, Member, Strategy};

/// What the set needs of the service's config to compute rooms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// Probes a half-open breaker admits.
    pub probes: u32,
    /// Slow start: ramp length and starting share of the weight.
    pub ramp: Option<(Duration, f64)>,
    /// Idle decay of latency and error figures.
    pub decay: Duration,
    /// Share of in-service nodes whose open breakers are honoured (percent).
    pub max_ejected_percent: u32,
}

/// What a node counts for in the sums, as of its last refresh.
#[derive(Debug, Clone, Copy, Default)]
struct NodeTally {
    room: usize,
    below: usize,
    flags: Flags,
}

/// The balancer's nodes with the invariants above.
pub(crate) struct NodeSet {
    tuning: Tuning,
    views: Vec<NodeView>,
    cands: Vec<Candidate>,
    slots: Vec<NodeTally>,
    /// Looked up for every report and dispatch, which in a large pool is
    /// once or twice per task.
    index: crate::FastMap<NodeId, usize>,
    capacity: usize,
    below: usize,
    headroom_only: usize,
    /// Nodes whose room is positive.
    eligible: usize,
    counts: Counts,
}

/// Pools up to this size are scanned for the node that frees a worker
/// first; larger ones leave the pick to the strategy (a scan per task
/// would cost a 1 000-node pool too much).
const SOONEST_SCAN: usize = 64;

/// How a route may be placed (see [`NodeSet::pick_for`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tier {
    /// Of the top class: may take headroom.
    pub headroom: bool,
    /// The strategy weighs load: when every worker is busy, the node that
    /// frees one first may be chosen instead.
    pub soonest: bool,
}

/// What the balancer needs to send a dispatch to the node it picked.
pub(crate) struct Placed {
    /// The node's breaker is open but it serves anyway (max_ejected_percent).
    pub bypass_breaker: bool,
    /// When the node's next token is due, if it has none left.
    pub token_due: Option<Instant>,
}

impl NodeSet {
    pub fn new(tuning: Tuning) -> Self {
        NodeSet {
            tuning,
            views: Vec::new(),
            cands: Vec::new(),
            slots: Vec::new(),
            index: crate::FastMap::default(),
            capacity: 0,
            below: 0,
            headroom_only: 0,
            eligible: 0,
            counts: Counts::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.views.len()
    }

    /// Sum of the nodes' rooms: how many tasks the pool can take now.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The part of [`capacity`](Self::capacity) under the nodes' free
    /// limits: what a task below the top class may take.
    pub fn capacity_below(&self) -> usize {
        self.below
    }

    /// Pool-wide sums of the nodes' flags.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The position of node `id`.
    pub fn position(&self, id: NodeId) -> Option<usize> {
        self.index.get(&id).copied()
    }

    pub fn node(&self, i: usize) -> &NodeView {
        &self.views[i]
    }

    /// Node `i`, to change: its room is refreshed at the next `refresh`.
    pub fn node_mut(&mut self, i: usize) -> &mut NodeView {
        &mut self.views[i]
    }

    pub fn iter(&self) -> impl Iterator<Item = &NodeView> {
        self.views.iter()
    }

    /// Every node with its candidate.
    pub fn with_candidates(&self) -> impl Iterator<Item = (&NodeView, &Candidate)> {
        self.views.iter().zip(&self.cands)
    }

    /// The strategy's view of the pool, in the set's order.
    pub fn members(&self) -> Vec<Member> {
        self.views
            .iter()
            .map(|n| Member {
                key: n.address.to_string(),
                weight: n.weight,
            })
            .collect()
    }

    /// Adds a node at the end, refreshed at `now`; returns its position.
    pub fn push(&mut self, view: NodeView, now: Instant) -> usize {
        let i = self.views.len();
        self.index.insert(view.id, i);
        self.cands
            .push(Candidate::new(view.weight.max(1), view.limit()));
        self.views.push(view);
        self.slots.push(NodeTally::default());
        self.refresh(i, now);
        i
    }

    /// Removes node `i`; later nodes move up one place.
    pub fn remove(&mut self, i: usize) -> NodeView {
        let slot = self.slots.remove(i);
        self.capacity -= slot.room;
        self.below -= slot.below;
        self.headroom_only -= usize::from(slot.room > 0 && slot.below == 0);
        self.eligible -= usize::from(slot.room > 0);
        self.counts.remove(slot.flags);
        self.cands.remove(i);
        let view = self.views.remove(i);
        self.index.remove(&view.id);
        for (j, n) in self.views.iter().enumerate().skip(i) {
            self.index.insert(n.id, j);
        }
        view
    }

    /// Changes node `i` with `f`, then refreshes it at `now`.
    pub fn update<R>(&mut self, i: usize, now: Instant, f: impl FnOnce(&mut NodeView) -> R) -> R {
        let r = f(&mut self.views[i]);
        self.refresh(i, now);
        r
    }

    /// Recomputes node `i`'s room, flags and candidate at `now`, moving the
    /// sums by the difference.
    pub fn refresh(&mut self, i: usize, now: Instant) {
        let t = self.tuning;
        let n = &mut self.views[i];
        n.expire(now, t.probes);
        let (room, below, flags) = n.room_and_flags(now);
        let slot = &mut self.slots[i];
        self.capacity = self.capacity - slot.room + room;
        self.below = self.below - slot.below + below;
        self.headroom_only = self.headroom_only - usize::from(slot.room > 0 && slot.below == 0)
            + usize::from(room > 0 && below == 0);
        self.eligible = self.eligible - usize::from(slot.room > 0) + usize::from(room > 0);
        self.counts.swap(slot.flags, flags);
        *slot = NodeTally { room, below, flags };
        let w = n.effective_weight(now, t.ramp);
        self.cands[i] = n.candidate(room > 0, w, now, t.decay);
    }

    /// Applies the ejection cap, then refreshes every node at `now`.
    pub fn refresh_all(&mut self, now: Instant) {
        let probes = self.tuning.probes;
        for n in &mut self.views {
            n.expire(now, probes);
            n.overridden = false;
        }
        // max_ejected_percent: past the cap, the healthiest open nodes serve anyway.
        let in_service = self.views.iter().filter(|n| n.in_service()).count();
        let mut open: Vec<usize> = (0..self.views.len())
            .filter(|&i| self.views[i].in_service() && self.views[i].is_open(now))
            .collect();
        let allowed = in_service * self.tuning.max_ejected_percent as usize / 100;
        if open.len() > allowed {
            open.sort_by(|&a, &b| {
                let (na, nb) = (&self.views[a], &self.views[b]);
                na.load
                    .error_rate
                    .total_cmp(&nb.load.error_rate)
                    .then(na.id.cmp(&nb.id))
            });
            for &i in open.iter().take(open.len() - allowed) {
                self.views[i].overridden = true;
            }
        }
        for i in 0..self.views.len() {
            self.refresh(i, now);
        }
    }

    /// Takes node `i`'s report (unless a newer one is in); not refreshed.
    /// Returns whether its breaker changed kind.
    pub fn apply_report(&mut self, i: usize, load: LoadReport, now: Instant) -> bool {
        let t = self.tuning;
        self.views[i].apply_load(load, t.probes, t.ramp.is_some(), now)
    }

    /// One attempt on node `i` ended (`load`: the node's report with it) or
    /// was lost: its slot is free. Refreshes the node, or every node when
    /// its breaker changed kind (the ejection cap may move); returns whether
    /// it did.
    #[cfg(test)]
    pub fn attempt_ended(&mut self, i: usize, load: Option<LoadReport>, now: Instant) -> bool {
        self.attempts_ended(i, 1, load, now)
    }

    /// [`attempt_ended`](Self::attempt_ended) for `count` attempts at once,
    /// with the node's one report after the last of them.
    pub fn attempts_ended(
        &mut self,
        i: usize,
        count: u32,
        load: Option<LoadReport>,
        now: Instant,
    ) -> bool {
        let n = &mut self.views[i];
        // A report frees what its dispatches took; never more than the
        // view holds.
        n.in_flight -= count.min(n.in_flight);
        let (free, service) = (n.free_limit(), n.service_time().unwrap_or_default());
        n.sent.ended(count, free, service, now);
        n.sent.keep(n.in_flight);
        let changed = load.is_some_and(|l| self.apply_report(i, l, now));
        if changed {
            self.refresh_all(now);
        } else {
            self.refresh(i, now);
        }
        changed
    }

    /// A route waits on node `i` for a shared token: it keeps a slot there,
    /// so later picks see it taken.
    pub fn hold(&mut self, i: usize, now: Instant) {
        self.update(i, now, |n| n.in_flight += 1);
    }

    /// A route held on node `i` left it (placed again, or bounced): its
    /// slot is free.
    pub fn unhold(&mut self, i: usize, now: Instant) {
        self.update(i, now, |n| n.in_flight -= 1.min(n.in_flight));
    }

    /// Node `i` takes a task at `now`: a slot, a probe and a token.
    pub fn dispatch(&mut self, i: usize, now: Instant) -> Placed {
        let n = &mut self.views[i];
        n.in_flight += 1;
        let (free, service) = (n.free_limit(), n.service_time().unwrap_or_default());
        n.sent.sent(now, free, service);
        n.sent.keep(n.in_flight);
        if let Mirror::HalfOpen { probes } = &mut n.mirror {
            probes.take();
        }
        // The cluster's one probe is out.
        if let SharedMirror::HalfOpen { claimed } = &mut n.shared {
            *claimed = false;
        }
        let mut token_due = None;
        if let Some(b) = &mut n.bucket {
            let _ = b.try_acquire(now);
            token_due = b.check(now).err();
        }
        let placed = Placed {
            bypass_breaker: n.overridden,
            token_due,
        };
        self.refresh(i, now);
        placed
    }

    /// Picks an eligible node with `strategy`: never one of `exclude`, and
    /// one of `avoid` only when no other is eligible.
    pub fn pick(
        &mut self,
        strategy: &mut dyn Strategy,
        affinity: Option<u64>,
        exclude: &[NodeId],
        avoid: &[NodeId],
    ) -> Option<usize> {
        let mut masked: Vec<usize> = Vec::new();
        self.mask(exclude, &mut masked);
        // `mask` only turns eligible nodes ineligible: O(1) whatever the pool.
        let any = self.eligible > masked.len();
        if any && !avoid.is_empty() {
            let others = self
                .cands
                .iter()
                .zip(&self.views)
                .any(|(c, n)| c.eligible && !avoid.contains(&n.id));
            if others {
                self.mask(avoid, &mut masked);
            }
        }
        let pick = if any {
            strategy.pick(&self.cands, affinity)
        } else {
            None
        };
        for i in masked {
            self.cands[i].eligible = true;
        }
        pick.filter(|&i| self.cands[i].eligible && !exclude.contains(&self.views[i].id))
    }

    /// As [`pick`](Self::pick), for a route of `tier` at `now`:
    ///
    /// * a node whose room is all headroom is taken only when no other has
    ///   room below its free limit (a worker free): then a lower class
    ///   takes headroom only when its credit outran the view;
    /// * when no node has a worker free and the route is of the top class
    ///   and the strategy weighs load, the node expected to free one first
    ///   is taken ([`DispatchTimes::frees_at`](crate::algo::headroom::DispatchTimes::frees_at)),
    ///   in pools of up to [`SOONEST_SCAN`] nodes whose service times are
    ///   known.
    pub fn pick_for(
        &mut self,
        strategy: &mut dyn Strategy,
        tier: Tier,
        affinity: Option<u64>,
        exclude: &[NodeId],
        avoid: &[NodeId],
        now: Instant,
    ) -> Option<usize> {
        if self.below == 0 && tier.headroom && tier.soonest && self.len() <= SOONEST_SCAN {
            if let Some(i) = self.soonest(exclude, avoid, now) {
                return Some(i);
            }
        }
        if self.headroom_only == 0 || self.below == 0 {
            return self.pick(strategy, affinity, exclude, avoid);
        }
        // Masks the nodes with only headroom: an O(n) pass, made only while
        // some node has room in both tiers' sense and another only headroom.
        let mut masked = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if s.room > 0 && s.below == 0 && self.cands[i].eligible {
                self.cands[i].eligible = false;
                masked.push(i);
            }
        }
        self.eligible -= masked.len();
        let pick = self.pick(strategy, affinity, exclude, avoid);
        self.eligible += masked.len();
        for i in masked {
            self.cands[i].eligible = true;
        }
        pick
    }

    /// The eligible node (not in `exclude`, and not in `avoid` unless only
    /// those are left) whose wait for a worker is the least; `None` if a
    /// candidate's service time is not known yet.
    fn soonest(&self, exclude: &[NodeId], avoid: &[NodeId], now: Instant) -> Option<usize> {
        let mut best: Option<(bool, Option<Instant>, usize)> = None;
        for (i, n) in self.views.iter().enumerate() {
            if !self.cands[i].eligible || exclude.contains(&n.id) {
                continue;
            }
            let frees = n.sent.frees_at(n.free_limit(), n.service_time()?, now);
            let key = (avoid.contains(&n.id), frees, i);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        best.map(|(.., i)| i)
    }

    /// What an attempt is expected to take on the quickest node with room
    /// ([`NodeView::expected_latency`]): `None` when a node with room is
    /// idle or has no figure yet (nothing need wait for a quicker room
    /// then), when no node has room, or in pools over [`SOONEST_SCAN`]
    /// nodes (a scan per grant would cost a large pool too much).
    pub fn room_latency(&self) -> Option<Duration> {
        if self.len() > SOONEST_SCAN {
            return None;
        }
        let mut best: Option<Duration> = None;
        for (n, c) in self.views.iter().zip(&self.cands) {
            if !c.eligible {
                continue;
            }
            let t = n.expected_latency()?;
            best = Some(best.map_or(t, |b| b.min(t)));
        }
        best
    }

    /// Where a task due at `due`, picked for node `i`, goes: `i` if it is
    /// expected to end the task by then; else the eligible node not in
    /// `avoid` (those the task failed on, the excluded among them)
    /// expected to end it first, if that one can (a node with a queue
    /// inside is passed over for one that ends the task in time); `i`
    /// still when only nodes in `avoid` could. `None` when no
    /// eligible node is expected to end it in time: the queue's figure
    /// ([`room_latency`](Self::room_latency)) was stale, and the task goes
    /// back to wait for a quicker room. Pools over [`SOONEST_SCAN`] nodes
    /// keep the pick.
    pub fn in_time(&self, i: usize, due: Instant, avoid: &[NodeId], now: Instant) -> Option<usize> {
        let ends = |j: usize| {
            self.views[j]
                .expected_latency()
                .map_or(now, |t| crate::algo::time::add(now, t))
        };
        if ends(i) <= due || self.len() > SOONEST_SCAN {
            return Some(i);
        }
        let mut best: Option<(Instant, usize)> = None;
        let mut any = false;
        for j in (0..self.views.len()).filter(|&j| self.cands[j].eligible) {
            let t = ends(j);
            any |= t <= due;
            if t <= due && !avoid.contains(&self.views[j].id) && best.is_none_or(|b| (t, j) < b) {
                best = Some((t, j));
            }
        }
        match best {
            Some((_, j)) => Some(j),
            None => any.then_some(i),
        }
    }

    /// Makes the eligible nodes of `ids` ineligible, noting them in `masked`.
    fn mask(&mut self, ids: &[NodeId], masked: &mut Vec<usize>) {
        for id in ids {
            if let Some(i) = self.position(*id) {
                if self.cands[i].eligible {
                    self.cands[i].eligible = false;
                    masked.push(i);
                }
            }
        }
    }

    /// The earliest instant after `now` at which time alone adds room to a
    /// node (a breaker's open time ends, a token comes due).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for n in self.views.iter().filter(|n| n.in_service()) {
            let mut consider = |t: Instant| {
                if t > now && next.is_none_or(|x| t < x) {
                    next = Some(t);
                }
            };
            if let Mirror::Open { until } = n.mirror {
                consider(until);
            }
            if let SharedMirror::Open { until } = n.shared {
                consider(until);
            }
            if n.token_blocked(now) {
                if let Some(Err(t)) = n.bucket.as_ref().map(|b| b.check(now)) {
                    consider(t);
                }
            }
            if let Some(t) = n.shared_tokens.wake(now) {
                consider(t);
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::view::tests::{report, view};
    use crate::algo::breaker::BreakerState;
    use crate::algo::limiter::TokenBucket;
    use crate::algo::strategy::RoundRobin;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
    use proptest::strategy::Strategy as _;

    fn tuning() -> Tuning {
        Tuning {
            probes: 2,
            ramp: None,
            decay: Duration::from_secs(10),
            max_ejected_percent: 50,
        }
    }

    /// Every invariant the set promises, checked from scratch.
    fn check(set: &NodeSet) {
        assert_eq!(set.views.len(), set.cands.len());
        assert_eq!(set.views.len(), set.slots.len());
        assert_eq!(set.index.len(), set.views.len());
        for (i, n) in set.views.iter().enumerate() {
            assert_eq!(set.position(n.id), Some(i), "index of {:?}", n.id);
            assert_eq!(set.cands[i].eligible, set.slots[i].room > 0);
        }
        let rooms: usize = set.slots.iter().map(|s| s.room).sum();
        assert_eq!(set.capacity(), rooms, "capacity is the sum of rooms");
        let below: usize = set.slots.iter().map(|s| s.below).sum();
        assert_eq!(set.capacity_below(), below, "below is the sum of its parts");
        let only = set
            .slots
            .iter()
            .filter(|s| s.room > 0 && s.below == 0)
            .count();
        assert_eq!(set.headroom_only, only);
        for (s, n) in set.slots.iter().zip(&set.views) {
            assert!(s.below <= s.room);
            assert!(n.sent.len() <= n.in_flight as usize);
        }
        let eligible = set.slots.iter().filter(|s| s.room > 0).count();
        assert_eq!(
            set.eligible, eligible,
            "eligible counts the nodes with room"
        );
        let mut counts = Counts::default();
        for s in &set.slots {
            counts.swap(Flags::default(), s.flags);
        }
        let c = set.counts();
        assert_eq!(
            (c.in_service, c.open, c.token_blocked),
            (counts.in_service, counts.open, counts.token_blocked),
            "counts are the sums of flags"
        );
    }

    /// After a full refresh, every stored room is the view's own at `now`.
    fn check_fresh(set: &NodeSet, now: Instant) {
        check(set);
        for (i, n) in set.views.iter().enumerate() {
            assert_eq!(set.slots[i].room, n.compute_room(now));
            let free = n.free_limit().saturating_sub(n.in_flight) as usize;
            assert_eq!(set.slots[i].below, n.compute_room(now).min(free));
            assert_eq!(set.slots[i].flags, n.flags(now));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push { weight: u32, max: u32, bucket: bool },
        Remove(usize),
        Dispatch,
        Ended(usize),
        Trip(usize, u64),
        Close(usize),
        SetActive(usize, bool),
        Drain(usize),
        SetMax(usize, u32),
        SetFree(usize, u32),
        Advance(u64),
        RefreshAll,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        prop_oneof![
            (1u32..5, 1u32..4, any::<bool>()).prop_map(|(weight, max, bucket)| Op::Push {
                weight,
                max,
                bucket
            }),
            (0usize..8).prop_map(Op::Remove),
            Just(Op::Dispatch),
            Just(Op::Dispatch),
            (0usize..8).prop_map(Op::Ended),
            (0usize..8, 1u64..500).prop_map(|(i, ms)| Op::Trip(i, ms)),
            (0usize..8).prop_map(Op::Close),
            (0usize..8, any::<bool>()).prop_map(|(i, a)| Op::SetActive(i, a)),
            (0usize..8).prop_map(Op::Drain),
            (0usize..8, 1u32..4).prop_map(|(i, m)| Op::SetMax(i, m)),
            (0usize..8, 1u32..4).prop_map(|(i, f)| Op::SetFree(i, f)),
            (1u64..300).prop_map(Op::Advance),
            Just(Op::RefreshAll),
        ]
    }

    proptest! {
        /// Whatever the sequence of changes, the sums agree with their parts,
        /// the index and candidates follow the nodes, and a pick is eligible.
        #[test]
        fn sums_index_and_candidates_always_agree(ops in proptest::collection::vec(op(), 1..120)) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut set = NodeSet::new(tuning());
            let mut rr = RoundRobin::new();
            let mut next_id = 0u32;
            let mut version = 0u64;
            for op in ops {
                let len = set.len();
                match op {
                    Op::Push { weight, max, bucket } => {
                        let mut v = view(next_id, weight, max, now);
                        next_id += 1;
                        if bucket {
                            v.bucket = Some(TokenBucket::new(5.0, 2, now));
                        }
                        set.push(v, now);
                        rr.rebuild(&set.members());
                    }
                    Op::Remove(i) if i < len => {
                        set.remove(i);
                        rr.rebuild(&set.members());
                    }
                    Op::Dispatch => {
                        let below = set.capacity_below() > 0;
                        let tier = Tier { headroom: false, soonest: false };
                        if let Some(i) = set.pick_for(&mut rr, tier, None, &[], &[], now) {
                            prop_assert!(set.slots[i].room > 0);
                            // Below the top class, headroom only when no
                            // node has room below its free limit.
                            prop_assert!(!below || set.slots[i].below > 0);
                            set.dispatch(i, now);
                        }
                    }
                    Op::Ended(i) if i < len => {
                        version += 1;
                        set.attempt_ended(i, Some(report(version, BreakerState::Closed, now)), now);
                    }
                    Op::Trip(i, ms) if i < len => {
                        version += 1;
                        let until = now + Duration::from_millis(ms);
                        set.apply_report(i, report(version, BreakerState::Open { until }, now), now);
                        set.refresh_all(now);
                    }
                    Op::Close(i) if i < len => {
                        // An older report than any applied: never changes the view.
                        let before = set.node(i).mirror;
                        prop_assert!(!set.apply_report(i, report(0, BreakerState::Closed, now), now));
                        prop_assert_eq!(set.node(i).mirror, before);
                    }
                    Op::SetActive(i, a) if i < len => set.update(i, now, |n| n.active = a),
                    Op::Drain(i) if i < len => set.update(i, now, |n| n.draining = true),
                    Op::SetMax(i, m) if i < len => {
                        set.node_mut(i).max_concurrent = m;
                        set.refresh(i, now);
                    }
                    Op::SetFree(i, f) if i < len => {
                        set.node_mut(i).load.free_limit = f;
                        set.refresh(i, now);
                    }
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                    Op::RefreshAll => {
                        set.refresh_all(now);
                        check_fresh(&set, now);
                    }
                    _ => {}
                }
                check(&set);
            }
            set.refresh_all(now);
            check_fresh(&set, now);
        }
    }

    /// A set of `n` nodes of limit 5, each of whose backends serves 4 at
    /// once (a learned free limit of 4) in 20 ms.
    fn tiered(n: u32, now: Instant) -> NodeSet {
        let mut set = NodeSet::new(tuning());
        for id in 0..n {
            let mut v = view(id, 1, 5, now);
            v.load.free_limit = 4;
            v.load.base_rtt = Duration::from_millis(20);
            set.push(v, now);
        }
        set
    }

    const LOWER: Tier = Tier {
        headroom: false,
        soonest: true,
    };
    const TOP: Tier = Tier {
        headroom: true,
        soonest: true,
    };

    /// The placement core without a runtime: a least-load pick goes to the
    /// idle node, and the credit ledger grants the set's room once.
    #[test]
    fn the_least_loaded_node_is_picked_and_credit_is_granted_once() {
        use crate::actors::credit::Credit;
        use crate::algo::strategy::LeastLoad;
        let t0 = Instant::now();
        let mut set = NodeSet::new(tuning());
        set.push(view(0, 1, 4, t0), t0);
        set.push(view(1, 1, 4, t0), t0);
        set.refresh_all(t0);
        let mut ll = LeastLoad::new(Default::default());
        ll.rebuild(&set.members());
        let mut credit = Credit::default();
        assert_eq!(credit.grant(set.capacity()), 8);
        assert_eq!(credit.grant(set.capacity()), 0, "granted once");
        set.dispatch(0, t0);
        set.dispatch(0, t0);
        credit.spend();
        credit.spend();
        for _ in 0..3 {
            assert_eq!(set.pick(&mut ll, None, &[], &[]), Some(1), "node 1 is idle");
        }
        // Node 1 takes two: both hold two, and node 0's two end.
        set.dispatch(1, t0);
        set.dispatch(1, t0);
        credit.spend();
        credit.spend();
        set.attempts_ended(0, 2, None, t0);
        assert_eq!(set.node(0).in_flight, 0);
        assert_eq!(set.pick(&mut ll, None, &[], &[]), Some(0));
        // Two slots freed: two credits, once.
        assert_eq!(set.capacity(), 6);
        assert_eq!(credit.grant(set.capacity()), 2);
        assert_eq!(credit.grant(set.capacity()), 0);
        check(&set);
    }

    /// What the quickest room takes, and where a task with a due time goes:
    /// a node's recent mean latency counts only while it is busy, and a
    /// task goes where it ends in time if a node with room can end it.
    #[test]
    fn a_task_with_a_due_time_goes_to_a_room_that_ends_it_in_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut set = NodeSet::new(tuning());
        for id in 0..3 {
            set.push(view(id, 1, 4, t0), t0);
        }
        let busy = |set: &mut NodeSet, i: usize, latency: f64, n: u32| {
            for _ in 0..n {
                set.dispatch(i, t0);
            }
            set.node_mut(i).load.latency_ewma = latency;
        };
        // Idle nodes: nothing waits inside, no figure is stated.
        assert_eq!(set.room_latency(), None);
        busy(&mut set, 0, 0.060, 3);
        busy(&mut set, 1, 0.025, 4);
        assert_eq!(set.room_latency(), None, "node 2 is idle");
        busy(&mut set, 2, 0.040, 2);
        set.refresh_all(t0);
        // Node 1 is full: the quickest room is node 2's.
        assert_eq!(set.room_latency(), Some(ms(40)));
        // Due in 50 ms: node 0 (60 ms) is passed over for node 2.
        assert_eq!(set.in_time(0, t0 + ms(50), &[], t0), Some(2));
        assert_eq!(set.in_time(2, t0 + ms(50), &[], t0), Some(2));
        // Only a node the task avoids ends it in time: the pick stands.
        assert_eq!(set.in_time(0, t0 + ms(50), &[NodeId(2)], t0), Some(0));
        // No room ends it in time (the queue's figure was stale): back.
        assert_eq!(set.in_time(0, t0 + ms(30), &[], t0), None);
        // Due in an hour: any pick ends it in time.
        assert_eq!(
            set.in_time(0, t0 + Duration::from_secs(3600), &[], t0),
            Some(0)
        );
        // Node 2 drains: an idle room states no figure again.
        set.attempts_ended(2, 2, None, t0);
        assert_eq!(set.room_latency(), None);
        check(&set);
    }

    #[test]
    fn below_the_top_class_a_node_is_filled_to_its_free_limit_only() {
        let t0 = Instant::now();
        let mut set = tiered(2, t0);
        assert_eq!((set.capacity(), set.capacity_below()), (10, 8));
        let mut rr = RoundRobin::new();
        rr.rebuild(&set.members());
        // Node 0 holds 4: its one slot left is headroom.
        for _ in 0..4 {
            set.dispatch(0, t0);
        }
        assert_eq!(
            (set.capacity(), set.capacity_below(), set.headroom_only),
            (6, 4, 1)
        );
        // Round robin would take node 0 every other time: a lower route
        // never does while node 1 has room below its free limit.
        for k in 0..4 {
            let i = set.pick_for(&mut rr, LOWER, None, &[], &[], t0);
            assert_eq!(i, Some(1), "pick {k}");
            set.dispatch(1, t0);
        }
        check(&set);
        // No room below a free limit is left: a lower route that comes
        // anyway (the queue's view lagged) takes headroom rather than
        // going back.
        assert_eq!((set.capacity(), set.capacity_below()), (2, 0));
        assert!(set.pick_for(&mut rr, LOWER, None, &[], &[], t0).is_some());
        assert!(set.cands.iter().all(|c| c.eligible), "masks are lifted");
    }

    #[test]
    fn a_top_class_route_goes_where_a_worker_frees_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut set = tiered(3, t0);
        let mut rr = RoundRobin::new();
        rr.rebuild(&set.members());
        // Each backend's four workers took requests 1 ms apart; node 1's
        // first is the oldest.
        for (i, start) in [(0, 3), (1, 0), (2, 6)] {
            for k in 0..4 {
                set.dispatch(i, t0 + ms(start + k));
            }
        }
        assert_eq!(set.capacity_below(), 0);
        let now = t0 + ms(10);
        // Node 1's first request ends at 20 ms, node 0's at 23, node 2's at 26.
        assert_eq!(set.pick_for(&mut rr, TOP, None, &[], &[], now), Some(1));
        // Not one it must not use, and one it should avoid only if no other.
        let one = [NodeId(1)];
        assert_eq!(set.pick_for(&mut rr, TOP, None, &one, &[], now), Some(0));
        assert_eq!(set.pick_for(&mut rr, TOP, None, &[], &one, now), Some(0));
        // A lower class, or a strategy that does not weigh load, keeps the
        // strategy's pick.
        let plain = Tier {
            soonest: false,
            ..TOP
        };
        for tier in [LOWER, plain] {
            let picks: Vec<_> = (0..3)
                .map(|_| set.pick_for(&mut rr, tier, None, &[], &[], now))
                .collect();
            assert!(
                picks.contains(&Some(0)) && picks.contains(&Some(2)),
                "{picks:?}"
            );
        }
        // Once a node has a worker free, the strategy picks among those
        // that have: node 1 (none free) is not taken.
        set.attempt_ended(2, None, now);
        set.attempt_ended(0, None, now);
        assert_eq!(set.node(2).sent.len(), 3);
        for _ in 0..4 {
            let i = set.pick_for(&mut rr, TOP, None, &[], &[], now);
            assert!(matches!(i, Some(0 | 2)), "{i:?}");
        }
        // Before any latency is known the strategy picks.
        let mut fresh = NodeSet::new(tuning());
        let mut v = view(9, 1, 5, t0);
        v.load.free_limit = 4;
        fresh.push(v, t0);
        for _ in 0..4 {
            fresh.dispatch(0, t0);
        }
        let mut rr = RoundRobin::new();
        rr.rebuild(&fresh.members());
        assert_eq!(fresh.pick_for(&mut rr, TOP, None, &[], &[], t0), Some(0));
    }

    #[test]
    fn removing_a_node_moves_the_later_ones_up() {
        let now = Instant::now();
        let mut set = NodeSet::new(tuning());
        for id in 0..4 {
            set.push(view(id, 1, 3, now), now);
        }
        assert_eq!(set.capacity(), 12);
        set.dispatch(1, now);
        assert_eq!(set.capacity(), 11);
        let gone = set.remove(1);
        assert_eq!(gone.id, NodeId(1));
        assert_eq!(gone.in_flight, 1);
        assert_eq!(set.capacity(), 9);
        assert_eq!(set.counts().in_service, 3);
        assert_eq!(set.position(NodeId(1)), None);
        assert_eq!(set.position(NodeId(3)), Some(2));
        check_fresh(&set, now);
    }

    #[test]
    fn pick_masks_excluded_and_prefers_not_avoided() {
        let now = Instant::now();
        let mut set = NodeSet::new(tuning());
        for id in 0..3 {
            set.push(view(id, 1, 1, now), now);
        }
        let mut rr = RoundRobin::new();
        rr.rebuild(&set.members());
        for _ in 0..6 {
            let i = set.pick(&mut rr, None, &[NodeId(0)], &[NodeId(1)]);
            assert_eq!(i, Some(2));
        }
        // Only avoided nodes left: one of them serves.
        set.dispatch(2, now);
        assert_eq!(set.pick(&mut rr, None, &[NodeId(0)], &[NodeId(1)]), Some(1));
        // Only excluded ones left: none.
        set.dispatch(1, now);
        assert_eq!(set.pick(&mut rr, None, &[NodeId(0)], &[]), None);
        check(&set);
        assert!(set.cands[0].eligible, "masks are lifted after the pick");
    }

    #[test]
    fn an_ended_attempt_frees_its_slot_and_a_trip_closes_the_node() {
        let t0 = Instant::now();
        let mut set = NodeSet::new(Tuning {
            max_ejected_percent: 100,
            ..tuning()
        });
        set.push(view(0, 1, 2, t0), t0);
        set.push(view(1, 1, 2, t0), t0);
        set.dispatch(0, t0);
        let until = t0 + Duration::from_secs(1);
        set.attempt_ended(0, Some(report(1, BreakerState::Open { until }, t0)), t0);
        assert_eq!(set.node(0).in_flight, 0);
        assert_eq!(set.capacity(), 2, "node 0 is open");
        assert_eq!(set.counts().open, 1);
        assert_eq!(set.next_wake(t0), Some(until));
        // Time alone half-opens it: two probes.
        set.refresh_all(until);
        assert_eq!(set.capacity(), 4);
        assert_eq!(set.counts().open, 0);
        check_fresh(&set, until);
    }
}
