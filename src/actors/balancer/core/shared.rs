//! The balancer's side of limits and breakers shared by several
//! instances (see [`crate::actors::share`]; the store is Redis's).
//!
//! Nothing here waits: tokens, breaker states and probe claims are asked
//! for with one call each and come back as messages. Between answers the
//! service's [`ServiceShare`] caps the credit
//! (leased tokens, or none while an exact admission is out), and the views'
//! [`SharedMirror`] keeps nodes another instance tripped out of the pick.
//!
//! Shared node buckets (a route waits on its node for one call) are in
//! `shared/nodes.rs`.

use std::time::Duration;

use tokio::time::Instant;

use super::{Effect, Placement, StoreCall};
use crate::actors::protocol::{Gate, LoadReport, NodeControl, Route};
use crate::actors::share::{
    Admit, Granted, NodeTokens, ProbeClaimed, SharedBreakers, SharedState, Store,
};
use crate::actors::view::{Mirror, SharedMirror};
use crate::algo::breaker::BreakerState;
use crate::algo::time;
use crate::config::OnLimit;
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::Rejection;

mod nodes;

impl Placement {
    /// The dispatcher hands over the instance's Redis handle.
    pub(crate) fn on_use_shared(&mut self, store: Store, now: Instant) {
        if let Some(s) = &mut self.shared {
            s.handle = Some(store);
            if s.node_bucket.is_some() {
                for i in 0..self.nodes.len() {
                    self.nodes.node_mut(i).shared_tokens = NodeTokens::up(now);
                }
                // Routes that came before the handle: placed again.
                for (route, id) in std::mem::take(&mut s.node_held) {
                    self.shared_replay(route, id, now, false);
                }
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }
}

impl Placement {
    /// Takes the shared bucket's word on a route: `Some` to place it now;
    /// `None` when it is held for this turn's script call or bounced.
    pub(super) fn shared_route(&mut self, msg: Route) -> Option<Route> {
        let Some(s) = self.shared.as_mut() else {
            return Some(msg);
        };
        let now = msg.at;
        match s.admit(now) {
            Admit::Go => Some(msg),
            Admit::Hold => {
                // Still counted as granted credit until the answer.
                if !msg.hedge {
                    self.credit.refund();
                }
                s.held.push(msg);
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

    /// Once per turn: asks for tokens if the share needs some (the call is
    /// sent after the turn's routes are in, so they go in one batch).
    pub(super) fn shared_turn(&mut self, _now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        if (s.bucket.is_none() && s.node_bucket.is_none()) || s.handle.is_none() || s.flush_armed {
            return;
        }
        s.flush_armed = true;
        self.effect(Effect::SharedTurn);
    }

    /// The turn's routes are in ([`Effect::SharedTurn`]): the one store
    /// call for tokens, if the share needs some.
    pub(crate) fn shared_flush(&mut self, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        s.flush_armed = false;
        if s.node_bucket.is_some() {
            return self.shared_ask_nodes(now);
        }
        let (Some(want), Some(store), Some(bucket)) = (s.ask(now), s.handle.clone(), s.bucket)
        else {
            return;
        };
        self.effect(Effect::Store(StoreCall::Take {
            store,
            bucket,
            want,
        }));
    }

    /// A trip, a recovery or a probe's end on node `i`, seen in its
    /// completion (before the view takes the report). `ends_probe`: this
    /// is the end of a dispatch (an attempt, or a refusal), which ends a
    /// half-open probe out on the node; a report of a fresh load alone (a
    /// lease's outcome, a body's end) shares only the trips it shows.
    pub(super) fn shared_completed(
        &mut self,
        i: usize,
        outcome: Option<&crate::AttemptOutcome>,
        ends_probe: bool,
        load: &LoadReport,
        now: Instant,
    ) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        let (Some(quorum), Some(h)) = (s.breakers, s.handle.clone()) else {
            return;
        };
        let n = self.nodes.node(i);
        let addr = n.address.clone();
        let br = &self.cfg.breaker.breaker;
        let mut shared = None;
        // A throttled attempt was dropped by this client, never sent: it
        // says nothing of the node, so it neither closes nor reopens it.
        let outcome = outcome.filter(|o| **o != AttemptOutcome::Error(ErrorKind::Throttled));
        if ends_probe && s.probing.remove(&addr) {
            match outcome.map(|o| !o.is_node_failure()) {
                Some(true) => {
                    let (store, node) = (h.clone(), addr.clone());
                    let call = StoreCall::Close { store, node };
                    self.out.effects.push(Effect::Store(call));
                    shared = Some(SharedMirror::Closed);
                }
                Some(false) => {
                    let call = StoreCall::Reopen {
                        store: h.clone(),
                        node: addr.clone(),
                        open_for: br.open_for,
                        max: br.max_open_for,
                    };
                    self.out.effects.push(Effect::Store(call));
                    shared = Some(SharedMirror::Open {
                        until: time::add(now, br.open_for),
                    });
                }
                None => {}
            }
        }
        let seen = s.trips.get(&addr).copied().unwrap_or(0);
        if load.trips > seen {
            s.trips.insert(addr.clone(), load.trips);
            if let BreakerState::Open { until } = load.breaker {
                let open_for = until.saturating_duration_since(now);
                let call = StoreCall::Trip {
                    store: h,
                    node: addr,
                    open_for,
                    quorum,
                };
                self.out.effects.push(Effect::Store(call));
            }
        } else if n.mirror != Mirror::Closed
            && load.breaker == BreakerState::Closed
            && load.version > n.load.version
        {
            // This instance's own probe closed its breaker: closed for all.
            let call = StoreCall::Close {
                store: h,
                node: addr,
            };
            self.out.effects.push(Effect::Store(call));
            shared = Some(SharedMirror::Closed);
        }
        if let Some(m) = shared {
            let open = match m {
                SharedMirror::Open { until } => Some(until),
                _ => None,
            };
            let addr = self.nodes.node(i).addr.clone();
            self.effect(Effect::Control(addr, NodeControl::SharedOpen(open)));
            self.nodes.node_mut(i).shared = m;
        }
    }

    /// At each refresh: reads the shared breakers of the nodes.
    pub(crate) fn shared_poll(&mut self) {
        let Some(s) = self.shared.as_ref() else {
            return;
        };
        let (Some(_), Some(h)) = (s.breakers, s.handle.as_ref()) else {
            return;
        };
        let store = h.clone();
        let nodes = self.nodes.iter().map(|n| n.address.clone()).collect();
        self.effect(Effect::Store(StoreCall::Poll { store, nodes }));
    }

    /// `on_down: deny` while Redis is down closes the gate; so does
    /// `on_limit: reject` when the shared buckets have no token for this
    /// instance: none in hand and the script said the next ones are not
    /// due yet (the service's bucket; or every node with a free slot
    /// waiting on its own). Retry after that time; the wake set for it
    /// reopens the gate, as with local buckets.
    pub(super) fn shared_gate(&self, gate: Gate, now: Instant) -> Gate {
        let Some(s) = self.shared.as_ref() else {
            return gate;
        };
        if s.bucket.is_none() && s.node_bucket.is_none() {
            return gate;
        }
        if s.denies() {
            let retry_after = s
                .handle
                .as_ref()
                .map_or(Duration::ZERO, |h| h.settings().timeout);
            return Gate::Reject(Rejection::RateLimited { retry_after });
        }
        if gate != Gate::Open || self.cfg.rate_limit.on_limit != OnLimit::Reject {
            return gate;
        }
        let next = s.limited_until(now).or_else(|| {
            if s.node_bucket.is_none() || self.nodes.capacity() > 0 {
                return None;
            }
            self.nodes
                .iter()
                .filter(|n| n.in_service() && n.slots(now) > 0)
                .filter_map(|n| n.shared_tokens.blocked_until(now))
                .min()
        });
        match next {
            // Each refusal says the time left at its own `now`.
            Some(t) => Gate::until(Rejection::rate_limited(Duration::ZERO), t),
            None => gate,
        }
    }
}

impl Placement {
    /// Tokens from the shared bucket (or Redis down): place the held routes.
    pub(crate) fn on_granted(&mut self, msg: Granted, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        let paid = s.granted(msg, now) as usize;
        let held = std::mem::take(&mut s.held);
        let replay = if s.is_down() { held.len() } else { paid };
        for (k, mut route) in held.into_iter().enumerate() {
            if k < replay {
                // Back through the handler, which takes the paid token.
                route.at = now;
                self.out.effects.push(Effect::Replay(route));
            } else {
                if !route.hedge {
                    self.credit.spend();
                }
                self.bounce(&route);
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }
}

impl Placement {
    /// The shared breakers of the nodes, read at a refresh.
    pub(crate) fn on_shared_breakers(&mut self, msg: SharedBreakers, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        let Some(h) = s.handle.clone() else {
            return;
        };
        let ttl = self.cfg.breaker.breaker.probe_timeout;
        for (addr, state) in msg.0 {
            let Some(i) = self.nodes.iter().position(|n| n.address == addr) else {
                continue;
            };
            let n = self.nodes.node(i);
            let m = match state {
                SharedState::Closed => {
                    s.probing.remove(&addr);
                    SharedMirror::Closed
                }
                SharedState::Open(d) => SharedMirror::Open {
                    until: time::add(now, d),
                },
                SharedState::HalfOpen => match n.shared {
                    SharedMirror::HalfOpen { claimed } => SharedMirror::HalfOpen { claimed },
                    _ => SharedMirror::HalfOpen { claimed: false },
                },
            };
            let locally_open = matches!(n.mirror, Mirror::Open { until } if until > now);
            if m == (SharedMirror::HalfOpen { claimed: false })
                && !s.probing.contains(&addr)
                && !locally_open
                && s.claiming.insert(addr.clone())
            {
                let (store, node) = (h.clone(), addr.clone());
                self.out
                    .effects
                    .push(Effect::Store(StoreCall::Claim { store, node, ttl }));
            }
            if m != n.shared {
                let open = match m {
                    SharedMirror::Open { until } => Some(until),
                    _ => None,
                };
                let control = NodeControl::SharedOpen(open);
                self.out
                    .effects
                    .push(Effect::Control(n.addr.clone(), control));
                log::debug!(
                    "service {}: node {}: shared breaker {:?}",
                    self.service,
                    addr,
                    m
                );
                self.nodes.node_mut(i).shared = m;
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }
}

impl Placement {
    /// The answer to a probe claim.
    pub(crate) fn on_probe_claimed(&mut self, msg: ProbeClaimed, now: Instant) {
        let Some(s) = self.shared.as_mut() else {
            return;
        };
        s.claiming.remove(&msg.node);
        if !msg.won {
            return;
        }
        s.probing.insert(msg.node.clone());
        let at = self.nodes.iter().position(|n| n.address == msg.node);
        if let Some(i) = at {
            if matches!(self.nodes.node(i).shared, SharedMirror::HalfOpen { .. }) {
                log::info!(
                    "service {}: node {}: this instance probes for the cluster",
                    self.service,
                    msg.node
                );
                self.nodes.node_mut(i).shared = SharedMirror::HalfOpen { claimed: true };
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }
}
