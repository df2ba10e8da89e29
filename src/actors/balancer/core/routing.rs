//! Sending: the routes of a queue's turn are placed, each node's
//! dispatches of a turn go out in one message, and the turn's news for the
//! queue (answers, a hedge's placement, credit, the gate) in another.

use tokio::time::Instant;

use super::{Effect, Placement};
use crate::actors::protocol::{
    BalancerTurn, Batch, Dispatch, Dispatches, LoadReport, NodeId, Placed, QueueTurn, Route, Seq,
    ToQueue,
};

impl Placement {
    /// One turn of the queue: lost attempts, cancels, then the routes in
    /// order, with one settle (credit and gate) pass at the end.
    pub(crate) fn on_queue_turn(&mut self, msg: QueueTurn, now: Instant) {
        let mut settle_at = None;
        for seq in msg.lost {
            self.on_lost(seq, now);
            settle_at = Some(now);
        }
        for seq in msg.cancels {
            self.on_cancel(seq);
        }
        for route in msg.routes {
            if let Some(now) = self.route(route) {
                settle_at = Some(now);
            }
        }
        if let Some(now) = settle_at {
            self.settle(now);
        }
    }
}

impl Placement {
    /// Places one route (or bounces it, or holds it for a shared token);
    /// the time to settle at, unless the route is held.
    pub(super) fn route(&mut self, msg: Route) -> Option<Instant> {
        if !msg.hedge {
            self.credit.spend();
        }
        let msg = self.shared_route(msg)?;
        // Decide at the time the queue sent it (µs ago): one clock read less.
        let now = msg.at;
        let service_ok = self
            .service_bucket
            .as_ref()
            .is_none_or(|b| b.check(now).is_ok());
        let Some(i) = service_ok.then(|| self.pick(&msg)).flatten() else {
            self.bounce(&msg);
            // The credit was granted on a view that, at this route's time,
            // has no room after all (a token not yet due at `now`, a stale
            // candidate): re-read it, so that the timer is set for when a
            // token is due instead of the task waiting for the next refresh.
            self.recompute_all(now);
            return Some(now);
        };
        if !msg.hedge && msg.exclude.contains(&self.nodes.node(i).id) {
            // Only nodes that failed this task's TLS handshake can take it.
            self.bounce_as(&msg, true);
            return Some(now);
        }
        // The node's bucket is this view's alone (the node keeps none): a
        // node whose room was read after this route's instant may have no
        // token at it, and the route goes back, not on to the node. Checked
        // before the shared bucket, whose token a route sent back would
        // waste.
        if let Some(Err(t)) = self.nodes.node(i).bucket.as_ref().map(|b| b.check(now)) {
            self.metrics
                .node(&self.nodes.node(i).address)
                .rate_limited();
            self.wake_at(t);
            self.bounce(&msg);
            return Some(now);
        }
        // The node's shared bucket: a token in hand, or wait for one call.
        let msg = self.shared_place(i, msg)?;
        if let Some(b) = &mut self.service_bucket {
            let _ = b.try_acquire(now);
            if let Err(t) = b.check(now) {
                self.wake_at(t);
            }
        }
        let placed = self.nodes.dispatch(i, now);
        let n = self.nodes.node(i);
        if self.cfg.hedge.is_some() {
            self.working.entry(msg.seq).or_default().push(n.id);
        }
        log::debug!(
            "service {}: task {} -> node {}",
            self.service,
            msg.job.id,
            n.address
        );
        let id = n.id;
        self.post(
            i,
            id,
            Dispatch {
                seq: msg.seq,
                job: msg.job,
                bypass_breaker: placed.bypass_breaker,
                hedge: msg.hedge,
                at: now,
            },
        );
        if msg.hedge {
            self.tell_placed(msg.seq, i);
        }
        if let Some(t) = placed.token_due {
            self.wake_at(t);
        }
        Some(now)
    }

    /// Puts a dispatch in node `i`'s outbox; the outboxes go out together
    /// when the balancer's turn ends (the shell's flush): one message per node per
    /// turn, however many routes the turn placed there.
    pub(super) fn post(&mut self, i: usize, id: NodeId, d: Dispatch) {
        let outbox = &mut self.nodes.node_mut(i).outbox;
        if outbox.is_empty() {
            self.posted.push(id);
        }
        outbox.push(d);
        self.flush_at_turn_end();
    }

    /// Puts news for the queue in the turn's outbox: the turn's news goes
    /// in one message when it ends (the shell's flush), in the order it happened.
    pub(super) fn answer(&mut self, a: ToQueue) {
        match (self.answered.last_mut(), a) {
            // Credit alone, then more room: one grant (a gate set between
            // them would be skipped by a merge, so only credit merges).
            (Some(ToQueue::Room(last)), ToQueue::Room(next)) if last.gate.is_none() => {
                last.credit = last.credit.saturating_add(next.credit);
                last.reserve = next.reserve;
                last.room_latency = next.room_latency;
                last.gate = next.gate;
            }
            (_, a) => self.answered.push(a),
        }
        self.flush_at_turn_end();
    }

    fn flush_at_turn_end(&mut self) {
        if !self.flushing {
            self.flushing = true;
            self.effect(Effect::FlushAtTurnEnd);
        }
    }

    /// Sends the turn's news for the queue so far (one message).
    fn send_answers(&mut self) {
        if !self.answered.is_empty() {
            let turn = BalancerTurn(std::mem::take(&mut self.answered));
            self.effect(Effect::ToQueue(turn));
        }
    }

    /// Sends every outbox (before anything that must reach a node after
    /// the dispatches of this turn: a cancel, a stop).
    pub(crate) fn flush(&mut self) {
        self.flushing = false;
        self.send_answers();
        // The list of nodes posted to keeps its room for the next turn.
        let mut posted = std::mem::take(&mut self.posted);
        for id in posted.drain(..) {
            if let Some(i) = self.nodes.position(id) {
                let n = self.nodes.node_mut(i);
                if !n.outbox.is_empty() {
                    let d = Dispatches(Batch::take(&mut n.outbox));
                    let addr = n.addr.clone();
                    self.out.effects.push(Effect::Dispatches(addr, d));
                }
            }
        }
        self.posted = posted;
    }
    /// Tells the queue where both attempts of a hedged round went (node `i`
    /// took the hedge), so the one that loses the race is still listed in
    /// the task's result. Hedges only: one message per hedge.
    pub(super) fn tell_placed(&mut self, seq: Seq, i: usize) {
        let n = self.nodes.node(i);
        let (hedge, me) = (n.address.clone(), n.id);
        let first = self
            .working
            .get(&seq)
            .and_then(|w| w.iter().find(|id| **id != me))
            .and_then(|id| self.nodes.position(*id))
            .map(|j| self.nodes.node(j).address.clone());
        if let Some(first) = first {
            self.answer(ToQueue::Placed(Placed { seq, first, hedge }));
        }
    }

    /// Forgets that `node` works on `seq` (hedging only).
    pub(super) fn done_working(&mut self, seq: Seq, node: NodeId) {
        if let Some(w) = self.working.get_mut(&seq) {
            w.retain(|id| *id != node);
            if w.is_empty() {
                self.working.remove(&seq);
            }
        }
    }

    /// One attempt on node `i` ended or was lost: free its slot, and let a
    /// drained node leave.
    pub(super) fn free_slot(&mut self, i: usize, load: Option<LoadReport>, now: Instant) {
        self.free_slots(i, 1, load, now)
    }

    /// `n` attempts on node `i` ended (`load`: the node's report after
    /// them): free their slots, and let a drained node leave.
    pub(super) fn free_slots(&mut self, i: usize, n: u32, load: Option<LoadReport>, now: Instant) {
        if self.nodes.attempts_ended(i, n, load, now) {
            // A breaker changed kind: an open one sets the timer.
            self.pending_wake = self.next_wake(now);
        }
        let n = self.nodes.node(i);
        if n.draining && n.in_flight == 0 {
            self.finish_removal(i, now);
        }
    }
}
