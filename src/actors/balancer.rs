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
//! The state and every rule live in the [`Placement`] core (`core/`),
//! which takes `now` and needs no runtime. This file is the actor's shell:
//! every message handler reads the clock, calls the core, and carries out
//! the core's [`Output`]: the turn's outboxes sent once the mailbox is
//! drained (one message per node and one for the queue), the one timer,
//! routes placed again through the handler, and the shared store's calls
//! (naming the balancer's address for those that answer). It also starts
//! the node actors, takes the nodes' reports from the inbox (one wake-up
//! for all the nodes that report in a turn), and runs the `GetLoad`
//! refresh and the health checks.
//!
//! An attempt the queue's watchdog gave up on ([`QueueTurn::lost`]) died with its
//! node's thread, so the node will never report it: the balancer frees its
//! slot on a node whose mailbox is closed (the one working on that task, when
//! the service hedges and so keeps that record). No per-task record is kept
//! for this: a dead node's in-flight count in the view is exactly the number
//! of its attempts that will be reported lost, since every attempt that
//! ended before the thread died has its report already on the way.

use std::sync::Arc;

use actix::prelude::*;
use tokio::time::Instant;

use self::core::{Effect, Output, Placement, StoreCall};
use super::inbox::{Inbox, InboxReady, InboxSender};
use super::node::{CoreSpec, NodeActor, NodeSpec};
use super::protocol::{
    BalancerTurn, GetLoad, GetNodeStats, Granted, HealthProbe, NodeReport, NodesGranted,
    PanicDrill, PoolChange, ProbeClaimed, QueueTurn, SharedBreakers, Stop, UseShared,
};
use super::share::{SharedStore, Store};
use crate::pool::{PoolError, ReloadSummary};
use crate::transport::TransportFactory;

/// Places tasks on the nodes of one service.
pub struct BalancerActor {
    core: Placement,
    /// Where the turn's news for the queue goes.
    queue: Recipient<BalancerTurn>,
    /// The one timer: when it fires, and its handle.
    wake: Option<(Instant, SpawnHandle)>,
    /// The nodes' reports inbox, and a spare list to take it with.
    reports: Arc<Inbox<NodeReport>>,
    reports_spare: Vec<NodeReport>,
    /// The core's output list, kept with its room between turns.
    spare: Output,
}

impl BalancerActor {
    /// Builds the balancer, answering to `queue`, and starts one supervised
    /// node per endpoint.
    pub(crate) fn new(
        cfg: Arc<crate::config::ServiceConfig>,
        queue: Recipient<BalancerTurn>,
        factory: TransportFactory,
        arbiters: Vec<actix::dev::ArbiterHandle>,
        metrics: crate::metrics::ServiceMetrics,
        ctx: &mut Context<Self>,
    ) -> Self {
        let now = Instant::now();
        let reports: Arc<Inbox<NodeReport>> = Arc::default();
        let spawner = spawner(cfg.clone(), factory, arbiters, &reports, ctx);
        let mut b = BalancerActor {
            core: Placement::new(cfg, spawner, metrics, now),
            queue,
            wake: None,
            reports,
            reports_spare: Vec::new(),
            spare: Output::default(),
        };
        b.carry_out(ctx);
        b
    }

    /// Carries out what the core asked for, in order.
    fn carry_out(&mut self, ctx: &mut Context<Self>) {
        let mut out = std::mem::take(&mut self.spare);
        self.core.swap_output(&mut out);
        for e in out.effects.drain(..) {
            match e {
                Effect::FlushAtTurnEnd => {
                    ctx.spawn(Flush);
                }
                Effect::WakeAt(t) => self.schedule_wake(t, ctx),
                Effect::SharedTurn => {
                    ctx.run_later(std::time::Duration::ZERO, |act, ctx| {
                        act.core.shared_flush(Instant::now());
                        act.carry_out(ctx);
                    });
                }
                Effect::Replay(route) => ctx.notify(QueueTurn {
                    routes: vec![route],
                    ..Default::default()
                }),
                Effect::ToQueue(turn) => self.queue.do_send(turn),
                Effect::Dispatches(node, d) => node.do_send(d),
                Effect::Control(node, c) => node.do_send(c),
                Effect::Store(call) => self.store_call(call, ctx),
            }
        }
        // The list keeps its room for the next turn.
        self.spare = out;
    }

    /// A store call (those that answer, to this balancer).
    fn store_call(&self, call: StoreCall, ctx: &mut Context<Self>) {
        let service = self.core.service();
        match call {
            StoreCall::Take {
                store,
                bucket,
                want,
            } => store.take(service, bucket, want, ctx.address().recipient()),
            StoreCall::TakeNodes {
                store,
                service: bucket,
                node,
                asks,
            } => store.take_nodes(service, bucket, node, asks, ctx.address().recipient()),
            StoreCall::Poll { store, nodes } => {
                store.poll(service, nodes, ctx.address().recipient())
            }
            StoreCall::Claim { store, node, ttl } => {
                store.claim(service, node, ttl, ctx.address().recipient())
            }
            StoreCall::Trip {
                store,
                node,
                open_for,
                quorum,
            } => store.trip(service, &node, open_for, quorum),
            StoreCall::Reopen {
                store,
                node,
                open_for,
                max,
            } => store.reopen(service, &node, open_for, max),
            StoreCall::Close { store, node } => store.close(service, &node),
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
            act.core.on_wake(Instant::now());
            act.carry_out(ctx);
        });
        self.wake = Some((at, h));
    }

    /// Sends the turn's outboxes now.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        self.core.flush();
        self.carry_out(ctx);
    }
}

/// Starts node actors on the arbiters (round robin; none: this thread),
/// each reporting to the balancer's inbox.
fn spawner(
    cfg: Arc<crate::config::ServiceConfig>,
    factory: TransportFactory,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    reports: &Arc<Inbox<NodeReport>>,
    ctx: &mut Context<BalancerActor>,
) -> self::core::Spawner {
    let service: Arc<str> = cfg.name.as_str().into();
    let reports = reports.clone();
    // Weak: the balancer's own address must not keep it alive.
    let me = ctx.address().downgrade();
    Box::new(move |id, ep, metrics| {
        let wake = me.upgrade().expect("the balancer starts its nodes");
        let to_balancer = InboxSender::new(&reports, wake.recipient::<InboxReady>());
        let spec_cfg = cfg.clone();
        let service = service.clone();
        let address: Arc<str> = ep.address.as_str().into();
        let factory = factory.clone();
        let max = ep.max_concurrent;
        let learned = ep.learned;
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
        if arbiters.is_empty() {
            actix::Supervisor::start(make)
        } else {
            let arbiter = &arbiters[id.0 as usize % arbiters.len()];
            actix::Supervisor::start_in_arbiter(arbiter, make)
        }
    })
}

impl Actor for BalancerActor {
    type Context = Context<Self>;

    /// Dispatches of the last turn still go out (their tasks are answered).
    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.flush(ctx);
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        let cfg = self.core.cfg().clone();
        ctx.run_interval(cfg.balancer.refresh_interval, |act, ctx| {
            act.refresh_loads(ctx)
        });
        if let Some(hc) = cfg.health_check.clone() {
            ctx.run_interval(hc.interval, |act, ctx| act.run_health_checks(ctx));
        }
        self.core.on_wake(Instant::now());
        self.carry_out(ctx);
    }
}

impl BalancerActor {
    /// One `GetLoad` round: every node reports; the view re-syncs.
    fn refresh_loads(&mut self, ctx: &mut Context<Self>) {
        self.core.shared_poll();
        self.carry_out(ctx);
        let asks: Vec<_> = self
            .core
            .nodes()
            .map(|(id, addr)| {
                let f = addr.send(GetLoad);
                async move { (id, f.await) }
            })
            .collect();
        futures::future::join_all(asks)
            .into_actor(self)
            .map(|replies, act, ctx| {
                let loads = replies
                    .into_iter()
                    .filter_map(|(id, r)| Some((id, r.ok()?)))
                    .collect();
                act.core.on_loads(loads, Instant::now());
                act.carry_out(ctx);
            })
            .spawn(ctx);
    }

    /// One round of health checks: a probe to every node not draining.
    fn run_health_checks(&mut self, ctx: &mut Context<Self>) {
        let Some(hc) = self.core.cfg().health_check.clone() else {
            return;
        };
        for (id, addr) in self.core.health_targets() {
            addr.send(HealthProbe {
                path: hc.path.clone(),
                timeout: hc.timeout,
            })
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.core.on_health(id, res.unwrap_or(false), Instant::now());
                act.carry_out(ctx);
            })
            .spawn(ctx);
        }
    }
}

/// Reports the view of every node.
impl Handler<GetNodeStats> for BalancerActor {
    type Result = MessageResult<GetNodeStats>;

    fn handle(&mut self, _msg: GetNodeStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.core.node_stats(Instant::now()))
    }
}

/// Stops the balancer; its nodes stop when their last address is gone.
impl Handler<Stop> for BalancerActor {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        self.flush(ctx);
        ctx.stop();
    }
}

/// Takes every node report of the inbox, in order.
impl Handler<InboxReady> for BalancerActor {
    type Result = ();

    fn handle(&mut self, _msg: InboxReady, ctx: &mut Self::Context) {
        let mut batch = std::mem::take(&mut self.reports_spare);
        self.reports.take_into(&mut batch);
        self.core.on_reports(&mut batch);
        // The list keeps its room for the next turn.
        self.reports_spare = batch;
        self.carry_out(ctx);
    }
}

/// One turn of the queue: lost attempts, cancels, then the routes in
/// order, with one settle (credit and gate) pass at the end.
impl Handler<QueueTurn> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: QueueTurn, ctx: &mut Self::Context) {
        self.core.on_queue_turn(msg, Instant::now());
        self.carry_out(ctx);
    }
}

/// Adds, removes, reweights, switches, reloads or crashes endpoints.
impl Handler<PoolChange> for BalancerActor {
    type Result = Result<ReloadSummary, PoolError>;

    fn handle(&mut self, msg: PoolChange, ctx: &mut Self::Context) -> Self::Result {
        let r = self.core.on_pool_change(msg, Instant::now());
        self.carry_out(ctx);
        r
    }
}

/// The answer to a probe claim.
impl Handler<ProbeClaimed> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: ProbeClaimed, ctx: &mut Self::Context) {
        self.core.on_probe_claimed(msg, Instant::now());
        self.carry_out(ctx);
    }
}

/// The shared breakers of the nodes, read at a refresh.
impl Handler<SharedBreakers> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: SharedBreakers, ctx: &mut Self::Context) {
        self.core.on_shared_breakers(msg, Instant::now());
        self.carry_out(ctx);
    }
}

/// Tokens from the shared bucket (or Redis down): place the held routes.
impl Handler<Granted> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: Granted, ctx: &mut Self::Context) {
        self.core.on_granted(msg, Instant::now());
        self.carry_out(ctx);
    }
}

/// The dispatcher hands over the instance's Redis handle.
impl<S: SharedStore + 'static> Handler<UseShared<S>> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: UseShared<S>, ctx: &mut Self::Context) {
        self.core.on_use_shared(msg.0 as Store, Instant::now());
        self.carry_out(ctx);
    }
}

/// Tokens for the nodes (or Redis down): the held routes go to their
/// nodes, under `on_down`, or back to the queue.
impl Handler<NodesGranted> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: NodesGranted, ctx: &mut Self::Context) {
        self.core.on_nodes_granted(msg, Instant::now());
        self.carry_out(ctx);
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
        ctx: &mut Context<BalancerActor>,
        _task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if act.core.flush_due() {
            act.flush(ctx);
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

mod core;
#[cfg(test)]
mod tests;
