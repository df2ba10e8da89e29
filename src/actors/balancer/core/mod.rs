//! `Placement`: the balancer of one service with no runtime. It owns the
//! view of every node ([`NodeSet`]), the strategy, the credit out (one
//! [`Credit`] ledger), the reserve and the gate told to the queue, the
//! service's bucket, the map of nodes working on each task (hedging), the
//! turn's outboxes and the service's share of the shared store. Each input
//! (a queue's turn, the nodes' reports, a pool change, a refresh, a health
//! check's answer, a store's answer, the timer firing) comes with its `now`;
//! what it leads to is gathered in the core's [`Output`], in order: send
//! the outboxes when the turn ends, wake at an instant, place a route again
//! through the handler, make a store call,
//! send the queue its news and each node its dispatches or a control. The
//! actor ([`super::BalancerActor`]) reads the clock, calls the core, and
//! carries the output out.
//!
//! Read it as: `routing` places routes and fills the turn's outboxes (one
//! message per node and one for the queue when the turn ends);
//! `completions` takes what comes back (the nodes' reports, lost
//! attempts, cancels); `room` computes the credit, the reserve and the
//! gate; `membership` changes the pool; `health` keeps the active health
//! checks' verdicts; `shared` is the side of the shared store.
//!
//! Node actors are started through the shell's spawner (a closure given at
//! construction), since a node needs the balancer's inbox to report to; the
//! views keep each node's address as the handle the output's sends use.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use tokio::time::Instant;

use super::super::credit::Credit;
use super::super::node::NodeActor;
use super::super::nodeset::{NodeSet, Tier, Tuning};
use super::super::protocol::{
    BalancerTurn, Dispatches, Gate, LoadReport, NodeControl, NodeId, Route, Seq, ToQueue,
};
use super::super::share::{ServiceShare, Store};
use super::super::view::{Health, NodeView};
use crate::algo::limiter::TokenBucket;
use crate::algo::strategy::{Member, Strategy};
use crate::config::{BucketConfig, EndpointConfig, Mode, ServiceConfig};
use crate::metrics::NodeMetrics;
use crate::stats::NodeStats;

mod completions;
mod health;
mod membership;
mod room;
mod routing;
mod shared;
#[cfg(test)]
mod tests;

/// Starts the node actor for an endpoint (id, endpoint, its metrics).
pub(crate) type Spawner = Box<dyn FnMut(NodeId, &EndpointConfig, NodeMetrics) -> Addr<NodeActor>>;

/// One thing the shell must do, in the order the core asked for them.
pub(crate) enum Effect {
    /// Send the outboxes when the balancer's mailbox is drained (call
    /// [`Placement::flush`] then).
    FlushAtTurnEnd,
    /// Fire the timer at this instant, unless one is set earlier (call
    /// [`Placement::on_wake`] then).
    WakeAt(Instant),
    /// Once the turn's routes are in, call [`Placement::shared_flush`].
    SharedTurn,
    /// Place this route again, as a queue's turn of its own.
    Replay(Route),
    /// The queue's news of the turn.
    ToQueue(BalancerTurn),
    /// A node's dispatches of the turn.
    Dispatches(Addr<NodeActor>, Dispatches),
    /// A control message for a node.
    Control(Addr<NodeActor>, NodeControl),
    /// A store call whose answer comes back to the balancer.
    Store(StoreCall),
}

/// A call to the shared store (the shell names the service, and the
/// balancer's address for those that answer).
pub(crate) enum StoreCall {
    /// Tokens of the service's bucket ([`super::super::share::Granted`]).
    Take {
        store: Store,
        bucket: BucketConfig,
        want: u32,
    },
    /// Tokens of the nodes' buckets ([`super::super::share::NodesGranted`]).
    TakeNodes {
        store: Store,
        service: Option<BucketConfig>,
        node: BucketConfig,
        asks: Vec<(Arc<str>, u32)>,
    },
    /// The shared breakers of these nodes.
    Poll { store: Store, nodes: Vec<Arc<str>> },
    /// The half-open probe claim of a node.
    Claim {
        store: Store,
        node: Arc<str>,
        ttl: Duration,
    },
    /// This instance's breaker of a node tripped.
    Trip {
        store: Store,
        node: Arc<str>,
        open_for: Duration,
        quorum: u32,
    },
    /// This instance's probe of a node failed: open again, longer.
    Reopen {
        store: Store,
        node: Arc<str>,
        open_for: Duration,
        max: Duration,
    },
    /// This instance's probe of a node succeeded: closed for all.
    Close { store: Store, node: Arc<str> },
}

/// What the shell must do after a call into the core.
#[derive(Default)]
pub(crate) struct Output {
    pub(crate) effects: Vec<Effect>,
}

/// Places tasks on the nodes of one service.
pub(crate) struct Placement {
    service: Arc<str>,
    cfg: Arc<ServiceConfig>,
    spawner: Spawner,
    /// The nodes, their rooms, and the sums over them.
    nodes: NodeSet,
    next_id: u32,
    strategy: Box<dyn Strategy>,
    /// Credit handed to the queue and not yet used.
    credit: Credit,
    /// The reserve last told to the queue (see [`Room::reserve`]).
    reserve: usize,
    service_bucket: Option<TokenBucket>,
    gate: Gate,
    /// A wake-up to ask for at the next `settle`.
    pending_wake: Option<Instant>,
    /// Nodes with dispatches in their outbox this turn (see `post`).
    posted: Vec<NodeId>,
    /// The queue's news of this turn (see `answer`).
    answered: Vec<ToQueue>,
    /// The outboxes are due at the turn's end ([`Effect::FlushAtTurnEnd`]).
    flushing: bool,
    /// Nodes working on each task, kept only when the service hedges.
    working: crate::FastMap<Seq, Vec<NodeId>>,
    /// Prometheus series (no-op without `metrics`): each node's, and the
    /// endpoint counts published on each recompute.
    metrics: crate::metrics::ServiceMetrics,
    /// The service's shared bucket and breakers, when it has any (see
    /// [`super::super::share`]).
    shared: Option<ServiceShare>,
    /// What the shell must do, gathered since it last took it.
    out: Output,
}

impl Placement {
    /// Builds the core and starts one node per endpoint through `spawner`.
    pub(crate) fn new(
        cfg: Arc<ServiceConfig>,
        spawner: Spawner,
        metrics: crate::metrics::ServiceMetrics,
        now: Instant,
    ) -> Self {
        let service: Arc<str> = cfg.name.as_str().into();
        let members: Vec<Member> = Vec::new();
        let mut strategy = cfg.mode.strategy(&cfg.balancer);
        strategy.rebuild(&members);
        let tuning = Tuning {
            probes: cfg.breaker.breaker.half_open_probes,
            ramp: cfg
                .balancer
                .slow_start
                .map(|d| (d, cfg.balancer.slow_start_floor)),
            decay: cfg.balancer.decay,
            max_ejected_percent: cfg.breaker.max_ejected_percent,
        };
        let mut b = Placement {
            service,
            spawner,
            nodes: NodeSet::new(tuning),
            next_id: 0,
            strategy,
            credit: Credit::default(),
            reserve: 0,
            // A shared service bucket lives in Redis (`shared`), not here.
            service_bucket: cfg
                .rate_limit
                .service
                .filter(|_| !cfg.rate_limit.shared)
                .map(|b| TokenBucket::new(b.rate, b.burst, now)),
            shared: ServiceShare::new(&cfg),
            gate: Gate::Open,
            working: crate::FastMap::default(),
            posted: Vec::new(),
            answered: Vec::new(),
            flushing: false,
            pending_wake: None,
            metrics,
            cfg,
            out: Output::default(),
        };
        let endpoints = b.cfg.endpoints.clone();
        for ep in &endpoints {
            b.spawn_node(ep, false, now);
        }
        b.rebuild_strategy(now);
        b
    }

    /// The service's name.
    pub(crate) fn service(&self) -> &Arc<str> {
        &self.service
    }

    /// The service's configuration.
    pub(crate) fn cfg(&self) -> &Arc<ServiceConfig> {
        &self.cfg
    }

    /// What the shell must do since it last asked, in order.
    #[cfg(test)]
    pub(crate) fn take_output(&mut self) -> Output {
        std::mem::take(&mut self.out)
    }

    /// What the shell must do since it last asked, in order, swapped into
    /// `spare` (emptied by the shell, so that the list keeps its room).
    pub(crate) fn swap_output(&mut self, spare: &mut Output) {
        debug_assert!(spare.effects.is_empty());
        std::mem::swap(&mut self.out, spare);
    }

    /// The outboxes wait for [`Self::flush`] (the turn's end).
    pub(crate) fn flush_due(&self) -> bool {
        self.flushing
    }

    fn effect(&mut self, e: Effect) {
        self.out.effects.push(e);
    }

    /// Every node, to ask for its load (`GetLoad`).
    pub(crate) fn nodes(&self) -> impl Iterator<Item = (NodeId, &Addr<NodeActor>)> {
        self.nodes.iter().map(|n| (n.id, &n.addr))
    }

    /// The nodes' answers to a `GetLoad` round: the view re-syncs.
    pub(crate) fn on_loads(&mut self, loads: Vec<(NodeId, LoadReport)>, now: Instant) {
        for (id, load) in loads {
            if let Some(i) = self.nodes.position(id) {
                self.nodes.apply_report(i, load, now);
            }
        }
        self.recompute_all(now);
        self.settle(now);
    }

    /// The timer fired (or the actor started): re-read every node.
    pub(crate) fn on_wake(&mut self, now: Instant) {
        self.recompute_all(now);
        self.settle(now);
    }

    /// Starts a node actor for `ep` and adds its view (strategy not rebuilt).
    fn spawn_node(&mut self, ep: &EndpointConfig, ramp: bool, now: Instant) {
        let id = NodeId(self.next_id);
        self.next_id += 1;
        let metrics = self.metrics.node(&ep.address);
        let addr = (self.spawner)(id, ep, metrics);
        let max = ep.max_concurrent;
        let limit = if ep.learned {
            self.cfg.concurrency.initial.min(max)
        } else {
            max
        };
        let load = LoadReport {
            version: 0,
            in_flight: 0,
            total: 0,
            errors: 0,
            latency_ewma: 0.0,
            last_latency: Duration::ZERO,
            error_rate: 0.0,
            rtt: self.cfg.balancer.default_rtt.as_secs_f64(),
            rtt_at: now,
            breaker: crate::algo::breaker::BreakerState::Closed,
            trips: 0,
            restarts: 0,
            last_error: None,
            limit,
            free_limit: limit,
            base_rtt: Duration::ZERO,
        };
        let bucket = self
            .cfg
            .rate_limit
            .per_node
            .map(|b| TokenBucket::new(b.rate, b.burst, now));
        let mut view = NodeView::new(id, ep, addr, load, bucket);
        if ramp && self.cfg.balancer.slow_start.is_some() {
            view.ramp_from = Some(now);
        }
        self.nodes.push(view, now);
    }

    /// Rebuilds the strategy after membership changed, and refreshes every node.
    fn rebuild_strategy(&mut self, now: Instant) {
        self.strategy.rebuild(&self.nodes.members());
        self.recompute_all(now);
    }

    /// Hands `route` back to the queue unplaced (its credit is not used).
    fn bounce(&mut self, route: &Route) {
        self.bounce_as(route, false);
    }

    /// [`Self::bounce`]; `refused`: only nodes the route excludes could
    /// take it.
    fn bounce_as(&mut self, route: &Route, refused: bool) {
        let back = ToQueue::Bounce {
            seq: route.seq,
            hedge: route.hedge,
            refused,
        };
        self.answer(back);
    }

    /// Recomputes every node, the ejection cap and the wake-up timer.
    fn recompute_all(&mut self, now: Instant) {
        self.nodes.refresh_all(now);
        self.pending_wake = self.next_wake(now);
        let nodes = &self.nodes;
        self.metrics
            .endpoints(|| super::super::view::endpoint_counts(nodes.iter(), now));
    }

    /// Remembers a wake-up at `t` for the next `settle`.
    fn wake_at(&mut self, t: Instant) {
        if self.pending_wake.is_none_or(|w| t < w) {
            self.pending_wake = Some(t);
        }
    }

    /// The earliest instant at which time alone adds room.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let service = match self.service_bucket.as_ref().map(|b| b.check(now)) {
            Some(Err(t)) if t > now => Some(t),
            _ => None,
        };
        let service = match (service, self.shared.as_ref().and_then(|s| s.next_wake(now))) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (self.nodes.next_wake(now), service) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// After any change: grant credit, set the gate, arm the timer.
    fn settle(&mut self, now: Instant) {
        self.shared_turn(now);
        self.grant(now);
    }

    /// Picks a node for `route`, preferring nodes it has not failed on; a
    /// hedge never goes to a node already working on the task.
    fn pick(&mut self, route: &Route) -> Option<usize> {
        // A route paid for on its node (shared node buckets) goes back there.
        if let Some(i) = self.shared_pinned(route) {
            return Some(i);
        }
        // Only a hedge avoids the node working on its task (and only
        // hedging services keep that map): no lookup for the rest.
        let working: &[NodeId] = match route.hedge {
            true => self.working.get(&route.seq).map_or(&[], Vec::as_slice),
            false => &[],
        };
        let tier = Tier {
            headroom: route.headroom,
            soonest: !route.hedge
                && match self.cfg.mode {
                    Mode::P2c | Mode::LeastLoad => true,
                    Mode::ConsistentHash => route.job.affinity.is_none(),
                    _ => false,
                },
        };
        let i = self.nodes.pick_for(
            &mut *self.strategy,
            tier,
            route.job.affinity,
            working,
            &route.avoid,
            route.at,
        )?;
        // A task with a due time goes where it is expected to end by then,
        // or back to wait for a quicker room (the grant that follows says
        // what the rooms take now, so it is not sent again at once); only
        // where the strategy weighs load (an affinity keeps its node, a
        // rotation its order), never onto a node the task avoids.
        let i = match route.due.filter(|_| tier.soonest) {
            Some(due) => self.nodes.in_time(i, due, &route.avoid, route.at)?,
            None => i,
        };
        if route.exclude.is_empty() || !route.exclude.contains(&self.nodes.node(i).id) {
            return Some(i);
        }
        // The fallback to an avoided node landed on an excluded one: any
        // other eligible node first (the caller refuses the route if none).
        let hard: Vec<NodeId> = working.iter().chain(&route.exclude).copied().collect();
        let other = self
            .nodes
            .pick(&mut *self.strategy, route.job.affinity, &hard, &route.avoid);
        Some(other.unwrap_or(i))
    }

    /// The view of every node.
    pub(crate) fn node_stats(&self, now: Instant) -> Vec<NodeStats> {
        self.nodes
            .with_candidates()
            .map(|(n, c)| {
                let latencies = self.metrics.latencies(&n.address);
                n.stats(c, &self.cfg, latencies.as_deref(), now)
            })
            .collect()
    }

    fn health_of(&self, i: usize) -> Health {
        self.nodes.node(i).health
    }
}
