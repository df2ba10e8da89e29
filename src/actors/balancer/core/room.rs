//! What the queue may send: the credit the nodes' room allows (the
//! [`Credit`](crate::actors::credit::Credit) ledger counts what is out),
//! the part of it that is headroom, what an attempt takes on the quickest
//! node with room, and the gate when it changed.

use std::time::Duration;

use tokio::time::Instant;

use super::{Effect, Placement};
use crate::actors::protocol::{Gate, Room, ToQueue};
use crate::actors::view::{Mirror, NodeView};
use crate::config::{OnAllOpen, OnLimit};
use crate::Rejection;

impl Placement {
    /// Tells the queue what it may send now, as one [`Room`]: the credit
    /// the nodes' room allows (after the turn's news so far: a bounced task
    /// is back at the queue's front before the credit is spent), the part
    /// of it that is headroom, and the gate when it changed; arms the
    /// timer.
    pub(super) fn grant(&mut self, now: Instant) {
        let credit = self.take_credit(now);
        let gate = self.settle_gate(now);
        let (cap, _) = self.capacity_now(now);
        let reserve = (self
            .nodes
            .capacity()
            .saturating_sub(self.nodes.capacity_below()))
        .min(cap);
        if credit > 0 || gate.is_some() || reserve != self.reserve {
            self.reserve = reserve;
            let room = Room {
                credit,
                reserve,
                gate,
                room_latency: self.nodes.room_latency(),
            };
            self.answer(ToQueue::Room(room));
        }
    }

    /// What the nodes can take now, capped by the service's tokens.
    pub(super) fn capacity_now(&self, now: Instant) -> (usize, bool) {
        if let Some(s) = self.shared.as_ref().filter(|s| s.bucket.is_some()) {
            let t = s.room(now);
            return (self.nodes.capacity().min(t), t == 0);
        }
        match &self.service_bucket {
            Some(b) => {
                let t = b.available(now) as usize;
                (self.nodes.capacity().min(t), t == 0)
            }
            None => (self.nodes.capacity(), false),
        }
    }

    /// Credit to hand the queue now (counted as granted).
    fn take_credit(&mut self, now: Instant) -> usize {
        let (cap, _) = self.capacity_now(now);
        self.credit.grant(cap)
    }

    /// Opens or closes the queue's gate and arms the timer; the gate, if
    /// it changed.
    fn settle_gate(&mut self, now: Instant) -> Option<Gate> {
        let (cap, service_out) = self.capacity_now(now);
        let c = self.nodes.counts();
        let maybe_all_open = c.open > 0 && c.open == c.in_service;
        let maybe_limited =
            self.cfg.rate_limit.on_limit == OnLimit::Reject && (service_out || c.token_blocked > 0);
        let gate = if cap == 0 && (maybe_all_open || maybe_limited) {
            self.closed_gate(now, service_out)
        } else {
            Gate::Open
        };
        let gate = self.shared_gate(gate, now);
        if gate != self.gate {
            match gate.rejection(now) {
                None => log::info!("service {}: accepting tasks again", self.service),
                Some(r) => log::warn!("service {}: rejecting tasks: {r}", self.service),
            }
        }
        let changed = (gate != self.gate).then(|| {
            self.gate = gate.clone();
            gate
        });
        if let Some(t) = self.pending_wake.take() {
            self.effect(Effect::WakeAt(t));
        }
        changed
    }

    /// Why nothing can be placed, if the service must answer for it.
    fn closed_gate(&self, now: Instant, service_out: bool) -> Gate {
        let in_service: Vec<&NodeView> = self.nodes.iter().filter(|n| n.in_service()).collect();
        if self.cfg.breaker.on_all_open == OnAllOpen::FailFast
            && !in_service.is_empty()
            && in_service.iter().all(|n| n.is_open(now))
        {
            // Every refusal says how long is left until the first of them
            // may half-open, counted at its own time (the gate keeps the
            // instant, not the wait at closing).
            let first = in_service
                .iter()
                .filter_map(|n| half_opens_at(n, now).map(|t| (t, n)))
                .min_by_key(|(t, _)| *t);
            let last_error = first.and_then(|(_, n)| n.load.last_error.clone());
            let why = Rejection::circuit_open(Duration::ZERO, last_error);
            return Gate::until(why, first.map_or(now, |(t, _)| t));
        }
        if self.cfg.rate_limit.on_limit == OnLimit::Reject {
            let next = if service_out {
                self.service_bucket
                    .as_ref()
                    .and_then(|b| b.check(now).err())
            } else if in_service.iter().any(|n| n.token_blocked(now)) {
                in_service
                    .iter()
                    .filter(|n| n.token_blocked(now))
                    .filter_map(|n| n.bucket.as_ref().and_then(|b| b.check(now).err()))
                    .min()
            } else {
                None
            };
            if let Some(t) = next {
                return Gate::until(Rejection::rate_limited(Duration::ZERO), t);
            }
        }
        Gate::Open
    }
}

/// When `n`, open at `now`, may half-open: the later of its own breaker's
/// and the shared breaker's ends still ahead (it takes no traffic while
/// either is open).
fn half_opens_at(n: &NodeView, now: Instant) -> Option<Instant> {
    let own = match n.mirror {
        Mirror::Open { until } if until > now => Some(until),
        _ => None,
    };
    let shared = match n.shared {
        crate::actors::view::SharedMirror::Open { until } if until > now => Some(until),
        _ => None,
    };
    own.max(shared)
}
