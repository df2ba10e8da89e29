//! `BalancerActor`: picks the node for each task, hands credit to the queue.
//!
//! The balancer pulls: it tells the queue how many tasks it can place
//! ([`ToQueue::Room`]), computed from its view of every node (slots, probes,
//! tokens; see [`super::view`]), and the queue sends that many [`Route`]s. Each route
//! is placed at once: the strategy picks among eligible nodes, preferring
//! ones that have not failed this task, the view is bumped (in flight,
//! tokens, probes) so the next pick never sees stale load, and the node gets
//! a [`Dispatch`]. Node reports, the `GetLoad` refresh and one timer (the
//! earliest breaker expiry or token due) wake it; nothing polls.
//!
//! When nothing can be placed for a reason the service must answer for, it
//! closes the queue's gate: every breaker open with `on_all_open: fail_fast`
//! (`CircuitOpen`, saying when the first half-opens), or no token with
//! `on_limit: reject` (`RateLimited`). It reopens the gate when that ends.
//!
//! The nodes, their rooms and the sums over them live in one
//! [`NodeSet`](super::nodeset::NodeSet), the credit out in one
//! [`Credit`](super::credit::Credit) ledger. This file is the actor's
//! shell: its state, every message handler (each calls the method of the
//! file that owns the step), the timer and the pick;
//! `room` computes the credit, the reserve and the gate; `routing` places
//! routes and sends each node its turn's dispatches and the queue its
//! turn's news (one message each when the turn ends); `completions` takes
//! what comes back through the balancer's inbox (one wake-up for all the
//! nodes that report in a turn); `membership` changes the pool; `health`
//! runs the active health checks; `shared` is the side of the shared
//! store.
//!
//! An attempt the queue's watchdog gave up on ([`QueueTurn::lost`]) died with its
//! node's thread, so the node will never report it: the balancer frees its
//! slot on a node whose mailbox is closed (the one working on that task, when
//! the service hedges and so keeps that record). No per-task record is kept
//! for this: a dead node's in-flight count in the view is exactly the number
//! of its attempts that will be reported lost, since every attempt that
//! ended before the thread died has its report already on the way.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::credit::Credit;
use super::inbox::{Inbox, InboxReady, InboxSender};
use super::node::{CoreSpec, NodeActor, NodeSpec};
use super::nodeset::{NodeSet, Tier, Tuning};
use super::protocol::*;
use super::share::{ServiceShare, SharedStore, Store};
use super::view::{Health, Mirror, NodeView};
use crate::algo::limiter::TokenBucket;
use crate::algo::strategy::{Member, Strategy};
use crate::config::{EndpointConfig, Mode, OnAllOpen, OnLimit, ServiceConfig};
use crate::pool::{PoolError, ReloadSummary};
use crate::stats::NodeStats;
use crate::transport::TransportFactory;
use crate::Rejection;

/// Places tasks on the nodes of one service.
pub struct BalancerActor {
    pub(super) service: Arc<str>,
    pub(super) cfg: Arc<ServiceConfig>,
    /// Where the turn's news for the queue goes.
    pub(super) queue: Recipient<BalancerTurn>,
    pub(super) factory: TransportFactory,
    /// Threads to run node actors on (round robin); empty: this thread.
    pub(super) arbiters: Vec<actix::dev::ArbiterHandle>,
    /// The nodes, their rooms, and the sums over them.
    pub(super) nodes: NodeSet,
    pub(super) next_id: u32,
    pub(super) strategy: Box<dyn Strategy>,
    /// Credit handed to the queue and not yet used.
    pub(super) credit: Credit,
    /// The reserve last told to the queue (see [`Room::reserve`]).
    pub(super) reserve: usize,
    pub(super) service_bucket: Option<TokenBucket>,
    pub(super) gate: Gate,
    pub(super) wake: Option<(Instant, SpawnHandle)>,
    /// A wake-up to set at the next `settle` (found where no context was at hand).
    pub(super) pending_wake: Option<Instant>,
    /// Nodes with dispatches in their outbox this turn (see `post`).
    pub(super) posted: Vec<NodeId>,
    /// The queue's news of this turn (see `answer`).
    pub(super) answered: Vec<ToQueue>,
    /// The nodes' reports inbox, and a spare list to take it with.
    pub(super) reports: Arc<Inbox<NodeReport>>,
    pub(super) reports_spare: Vec<NodeReport>,
    /// A [`Flush`] is spawned for this turn.
    pub(super) flushing: bool,
    /// Nodes working on each task, kept only when the service hedges.
    pub(super) working: crate::FastMap<Seq, Vec<NodeId>>,
    /// Prometheus series (no-op without `metrics`): each node's, and the
    /// endpoint counts published on each recompute.
    pub(super) metrics: crate::metrics::ServiceMetrics,
    /// The service's shared bucket and breakers, when it has any (see
    /// [`super::share`]).
    pub(super) shared: Option<ServiceShare>,
}

impl BalancerActor {
    /// Builds the balancer, answering to `queue`, and starts one supervised
    /// node per endpoint.
    pub(crate) fn new(
        cfg: Arc<ServiceConfig>,
        queue: Recipient<BalancerTurn>,
        factory: TransportFactory,
        arbiters: Vec<actix::dev::ArbiterHandle>,
        metrics: crate::metrics::ServiceMetrics,
        ctx: &mut Context<Self>,
    ) -> Self {
        let now = Instant::now();
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
        let mut b = BalancerActor {
            service,
            queue,
            factory,
            arbiters,
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
            wake: None,
            working: crate::FastMap::default(),
            posted: Vec::new(),
            answered: Vec::new(),
            reports: Arc::default(),
            reports_spare: Vec::new(),
            flushing: false,
            pending_wake: None,
            metrics,
            cfg,
        };
        let endpoints = b.cfg.endpoints.clone();
        for ep in &endpoints {
            b.spawn_node(ep, ctx, false);
        }
        b.rebuild_strategy();
        b
    }

    /// Starts a node actor for `ep` and adds its view (strategy not rebuilt).
    pub(super) fn spawn_node(&mut self, ep: &EndpointConfig, ctx: &mut Context<Self>, ramp: bool) {
        let now = Instant::now();
        let id = NodeId(self.next_id);
        self.next_id += 1;
        let spec_cfg = self.cfg.clone();
        let service = self.service.clone();
        let address: Arc<str> = ep.address.as_str().into();
        let to_balancer = InboxSender::new(&self.reports, ctx.address().recipient::<InboxReady>());
        let factory = self.factory.clone();
        let max = ep.max_concurrent;
        let learned = ep.learned;
        let metrics = self.metrics.node(&address);
        let make = move |_: &mut Context<NodeActor>| {
            NodeActor::new(NodeSpec {
                core: CoreSpec {
                    id,
                    service,
                    address,
                    max_concurrent: max,
                    learned,
                    cfg: spec_cfg,
                    metrics,
                },
                to_balancer,
                factory,
            })
        };
        let addr = if self.arbiters.is_empty() {
            actix::Supervisor::start(make)
        } else {
            let arbiter = &self.arbiters[id.0 as usize % self.arbiters.len()];
            actix::Supervisor::start_in_arbiter(arbiter, make)
        };
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
    pub(super) fn rebuild_strategy(&mut self) {
        self.strategy.rebuild(&self.nodes.members());
        self.recompute_all(Instant::now());
    }

    /// Hands `route` back to the queue unplaced (its credit is not used).
    pub(super) fn bounce(&mut self, route: &Route, ctx: &mut Context<Self>) {
        self.bounce_as(route, false, ctx);
    }

    /// [`Self::bounce`]; `refused`: only nodes the route excludes could
    /// take it.
    pub(super) fn bounce_as(&mut self, route: &Route, refused: bool, ctx: &mut Context<Self>) {
        let back = ToQueue::Bounce {
            seq: route.seq,
            hedge: route.hedge,
            refused,
        };
        self.answer(back, ctx);
    }

    /// Recomputes every node, the ejection cap and the wake-up timer.
    pub(super) fn recompute_all(&mut self, now: Instant) {
        self.nodes.refresh_all(now);
        self.pending_wake = self.next_wake(now);
        let nodes = &self.nodes;
        self.metrics
            .endpoints(|| super::view::endpoint_counts(nodes.iter(), now));
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

    /// Sets the single timer to `at` if that is earlier than the one set.
    fn schedule_wake(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if let Some((t, h)) = self.wake {
            if t <= at {
                return;
            }
            ctx.cancel_future(h);
        }
        let delay = at.saturating_duration_since(Instant::now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.wake = None;
            let now = Instant::now();
            act.recompute_all(now);
            act.settle(ctx, now);
        });
        self.wake = Some((at, h));
    }

    /// After any change: grant credit, set the gate, arm the timer.
    pub(super) fn settle(&mut self, ctx: &mut Context<Self>, now: Instant) {
        self.shared_turn(ctx, now);
        self.grant(ctx, now);
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

    fn node_stats(&self, now: Instant) -> Vec<NodeStats> {
        self.nodes
            .with_candidates()
            .map(|(n, c)| {
                let latencies = self.metrics.latencies(&n.address);
                n.stats(c, &self.cfg, latencies.as_deref(), now)
            })
            .collect()
    }
}

impl Actor for BalancerActor {
    type Context = Context<Self>;

    /// Dispatches of the last turn still go out (their tasks are answered).
    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.flush();
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.cfg.balancer.refresh_interval, |act, ctx| {
            act.refresh_loads(ctx)
        });
        if let Some(hc) = self.cfg.health_check.clone() {
            ctx.run_interval(hc.interval, |act, ctx| act.run_health_checks(ctx));
        }
        let now = Instant::now();
        self.recompute_all(now);
        self.settle(ctx, now);
    }
}

impl BalancerActor {
    /// One `GetLoad` round: every node reports; the view re-syncs.
    fn refresh_loads(&mut self, ctx: &mut Context<Self>) {
        self.shared_poll(ctx);
        let asks: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                let id = n.id;
                let f = n.addr.send(GetLoad);
                async move { (id, f.await) }
            })
            .collect();
        futures::future::join_all(asks)
            .into_actor(self)
            .map(|replies, act, ctx| {
                for (id, r) in replies {
                    if let (Ok(load), Some(i)) = (r, act.nodes.position(id)) {
                        act.nodes.apply_report(i, load, Instant::now());
                    }
                }
                let now = Instant::now();
                act.recompute_all(now);
                act.settle(ctx, now);
            })
            .spawn(ctx);
    }
}

/// Reports the view of every node.
impl Handler<GetNodeStats> for BalancerActor {
    type Result = MessageResult<GetNodeStats>;

    fn handle(&mut self, _msg: GetNodeStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.node_stats(Instant::now()))
    }
}

/// Stops the balancer; its nodes stop when their last address is gone.
impl Handler<Stop> for BalancerActor {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        self.flush();
        ctx.stop();
    }
}

/// Takes every node report of the inbox, in order.
impl Handler<InboxReady> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: InboxReady, ctx: &mut Self::Context) {
        self.on_inbox(msg, ctx);
    }
}

/// One turn of the queue: lost attempts, cancels, then the routes in
/// order, with one settle (credit and gate) pass at the end.
impl Handler<QueueTurn> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: QueueTurn, ctx: &mut Self::Context) {
        self.on_queue_turn(msg, ctx);
    }
}

/// Adds, removes, reweights, switches, reloads or crashes endpoints.
impl Handler<PoolChange> for BalancerActor {
    type Result = Result<ReloadSummary, PoolError>;

    fn handle(&mut self, msg: PoolChange, ctx: &mut Self::Context) -> Self::Result {
        self.on_pool_change(msg, ctx)
    }
}

/// The answer to a probe claim.
impl Handler<ProbeClaimed> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: ProbeClaimed, ctx: &mut Self::Context) {
        self.on_probe_claimed(msg, ctx);
    }
}

/// The shared breakers of the nodes, read at a refresh.
impl Handler<SharedBreakers> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: SharedBreakers, ctx: &mut Self::Context) {
        self.on_shared_breakers(msg, ctx);
    }
}

/// Tokens from the shared bucket (or Redis down): place the held routes.
impl Handler<Granted> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: Granted, ctx: &mut Self::Context) {
        self.on_granted(msg, ctx);
    }
}

/// The dispatcher hands over the instance's Redis handle.
impl<S: SharedStore + 'static> Handler<UseShared<S>> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: UseShared<S>, ctx: &mut Self::Context) {
        self.on_use_shared(msg.0 as Store, ctx);
    }
}

/// Tokens for the nodes (or Redis down): the held routes go to their
/// nodes, under `on_down`, or back to the queue.
impl Handler<NodesGranted> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: NodesGranted, ctx: &mut Self::Context) {
        self.on_nodes_granted(msg, ctx);
    }
}

/// Sends the outboxes once the balancer's mailbox is drained: spawned on
/// its context by the turn's first dispatch, polled after the messages.
struct Flush;

impl ActorFuture<BalancerActor> for Flush {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        act: &mut BalancerActor,
        _ctx: &mut Context<BalancerActor>,
        _task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if act.flushing {
            act.flush();
        }
        std::task::Poll::Ready(())
    }
}

/// Panics: the balancer dies as it would with a bug (a fault drill).
impl Handler<PanicDrill> for BalancerActor {
    type Result = ();

    fn handle(&mut self, _msg: PanicDrill, _ctx: &mut Self::Context) {
        panic!("fault drill");
    }
}

impl BalancerActor {
    pub(super) fn health_of(&self, i: usize) -> Health {
        self.nodes.node(i).health
    }
}

mod completions;
mod health;
mod membership;
mod room;
mod routing;
mod shared;
#[cfg(test)]
mod tests;
