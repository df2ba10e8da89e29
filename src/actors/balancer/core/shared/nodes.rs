//! The balancer's side of shared node buckets (`rate_limit.shared` with
//! `per_node`).
//!
//! With shared node buckets, each view's [`NodeTokens`] caps the node's
//! room: tokens in hand (a lease, or those paid for held routes), none
//! until the script says more are due, or, with nothing in hand, "ask".
//! A route placed on a node with nothing in hand is held on that node (it
//! keeps a slot there) until the turn's one script call, which names every
//! node asked for and the service's bucket when that is shared too; a
//! route paid for goes back through the handler, pinned to its node, and
//! one that is not goes back to the queue. No route is ever dropped.

use std::sync::Arc;

use tokio::time::Instant;

use super::super::{Effect, Placement, StoreCall};
use crate::actors::protocol::{NodeId, Route};
use crate::actors::share::{Admit, NodeTokens, NodesGranted};

impl Placement {
    /// Shared node buckets: the route `msg`, placed on node `i`, takes a
    /// token of the node's (`Some`: dispatch it), waits on the node for
    /// the turn's call, or goes back to the queue (`None` for both).
    pub(in crate::actors) fn shared_place(&mut self, i: usize, msg: Route) -> Option<Route> {
        let Some(s) = self.shared.as_mut() else {
            return Some(msg);
        };
        if s.node_bucket.is_none() {
            return Some(msg);
        }
        let now = msg.at;
        let n = self.nodes.node_mut(i);
        if matches!(n.shared_tokens, NodeTokens::Off) {
            // A node added at runtime: shared like the others.
            n.shared_tokens = if s.is_down() {
                s.node_fallback(now)
            } else {
                NodeTokens::up(now)
            };
        }
        // Before the Redis handle is in (right after the start), routes
        // wait on their node: a bounce would come straight back as credit.
        let verdict = if s.handle.is_none() {
            Admit::Hold
        } else {
            n.shared_tokens.take(now)
        };
        match verdict {
            Admit::Go => {
                // Its last token: wake when the next batch is due.
                if let Some(t) = n.shared_tokens.wake(now) {
                    if self.pending_wake.is_none_or(|w| t < w) {
                        self.pending_wake = Some(t);
                    }
                }
                Some(msg)
            }
            Admit::Hold => {
                // The node keeps a slot for it: later picks see it taken.
                let id = n.id;
                self.nodes.hold(i, now);
                s.node_held.push((msg, id));
                self.shared_turn(now);
                None
            }
            Admit::Bounce => {
                self.bounce(&msg);
                self.recompute_all(now);
                self.settle(now);
                None
            }
        }
    }

    /// The node a replayed route was paid for on, if it can still take it.
    pub(in crate::actors) fn shared_pinned(&mut self, route: &Route) -> Option<usize> {
        let s = self.shared.as_mut()?;
        if s.pinned.is_empty() {
            return None;
        }
        let id = s.pinned.remove(&(route.seq, route.hedge))?;
        let i = self.nodes.position(id)?;
        let eligible = self.nodes.with_candidates().nth(i)?.1.eligible;
        eligible.then_some(i)
    }

    /// At the end of a turn: one script call for the nodes that have
    /// routes held on them (and, while Redis is down, a ping once per
    /// `timeout` to see it back).
    pub(super) fn shared_ask_nodes(&mut self, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        let (Some(h), Some(nb)) = (s.handle.clone(), s.node_bucket) else {
            return;
        };
        if !s.may_ask_nodes(now) {
            return;
        }
        let mut held: Vec<(NodeId, u32)> = Vec::new();
        for (_, id) in &s.node_held {
            match held.iter_mut().find(|(n, _)| n == id) {
                Some((_, c)) => *c += 1,
                None => held.push((*id, 1)),
            }
        }
        let mut asks: Vec<(Arc<str>, u32)> = held
            .into_iter()
            .filter_map(|(id, c)| {
                let i = self.nodes.position(id)?;
                Some((self.nodes.node(i).address.clone(), s.node_want(c)))
            })
            .collect();
        if s.is_down() && asks.is_empty() {
            // Only the clock: is Redis back?
            match self.nodes.iter().next() {
                Some(n) => asks.push((n.address.clone(), 0)),
                None => return,
            }
        }
        if asks.is_empty() {
            return;
        }
        s.node_asking = true;
        let call = StoreCall::TakeNodes {
            store: h,
            service: s.bucket,
            node: nb,
            asks,
        };
        self.effect(Effect::Store(call));
    }

    /// A held route goes back through the handler, pinned to node `id`
    /// (released from the slot it held there).
    pub(super) fn shared_replay(&mut self, mut route: Route, id: NodeId, now: Instant, pin: bool) {
        self.shared_release(id, now);
        if !route.hedge {
            // The handler takes it off again.
            self.credit.refund();
        }
        if pin {
            if let Some(s) = self.shared.as_mut() {
                s.pinned.insert((route.seq, route.hedge), id);
            }
        }
        route.at = now;
        self.effect(Effect::Replay(route));
    }

    /// Frees the slot a held route kept on node `id`.
    fn shared_release(&mut self, id: NodeId, now: Instant) {
        if let Some(i) = self.nodes.position(id) {
            self.nodes.unhold(i, now);
            let n = self.nodes.node(i);
            if n.draining && n.in_flight == 0 {
                self.finish_removal(i, now);
            }
        }
    }
}

impl Placement {
    /// Tokens for the nodes (or Redis down): the held routes go to their
    /// nodes, under `on_down`, or back to the queue.
    pub(crate) fn on_nodes_granted(&mut self, msg: NodesGranted, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        s.node_asking = false;
        let held = std::mem::take(&mut s.node_held);
        let Some(got) = msg.got else {
            if s.go_down(now) {
                for i in 0..self.nodes.len() {
                    let fallback = s.node_fallback(now);
                    self.nodes.node_mut(i).shared_tokens = fallback;
                }
            }
            // Placed again under `on_down` (a bounce if it denies).
            for (route, id) in held {
                self.shared_replay(route, id, now, true);
            }
            self.recompute_all(now);
            return self.settle(now);
        };
        if s.come_up() {
            for i in 0..self.nodes.len() {
                self.nodes.node_mut(i).shared_tokens = NodeTokens::up(now);
            }
        }
        let until = s.node_until(msg.asked, now);
        // What each node got, to pay its held routes first.
        let mut paid: Vec<(NodeId, u32)> = Vec::new();
        for ((addr, _), g) in msg.asks.iter().zip(&got) {
            let Some(i) = self.nodes.iter().position(|n| &n.address == addr) else {
                continue;
            };
            let not_before = s.due_at(g.due, now);
            let n = self.nodes.node_mut(i);
            n.shared_tokens = NodeTokens::Up {
                tokens: g.granted,
                until,
                not_before,
            };
            paid.push((n.id, g.granted));
        }
        for (route, id) in held {
            let budget = paid.iter_mut().find(|(n, _)| *n == id);
            match budget {
                Some((_, c)) if *c > 0 => {
                    *c -= 1;
                    self.shared_replay(route, id, now, true);
                }
                None if self.nodes.position(id).is_some() => {
                    // Held after the call went out: asked for next.
                    if let Some(s) = self.shared.as_mut() {
                        s.node_held.push((route, id));
                    }
                }
                _ => {
                    // Not paid: the node has no token before it is due;
                    // the route waits in the queue meanwhile.
                    self.shared_release(id, now);
                    self.bounce(&route);
                }
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }
}
