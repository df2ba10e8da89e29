//! `QueueActor`: the continuous task stream of one service, and the one place
//! where a task is answered.
//!
//! Read it as: **take** (`intake`: submits arrive a burst per message
//! through the queue's [inbox](super::inbox); the map, the bounded wait
//! list), **hand
//! over against credit** (`dispatch`: `pump`, hedges, bounces), **ask the
//! policy** when an attempt ends ([`crate::algo::policy`]), **answer**
//! (`answers`: `finish`, the only place a result is sent); `timing` holds
//! the one timer and the watchdog, [`super::shutdown`] the drain and the
//! report. This file holds the state, the panic guard and the messages that
//! touch several parts.
//!
//! - Every task lives in one map from its arrival until `finish` removes it,
//!   whatever its state: waiting for room, ready, backing off, in flight.
//!   Answering removes it, so "exactly one result per task" holds under
//!   faults, late answers (ignored: they name an earlier round) and shutdown
//!   (see [`super::shutdown`]: everything left is answered and reported).
//! - Everything that waits on time (retry backoffs, deadlines, hedges) is in
//!   one [`TimerStore`] served by a single actix timer; entries of finished
//!   tasks are dropped in bulk, so memory follows what is live.
//! - The wait list (`on_full: wait`, and `feed`) is bounded
//!   (`queue.max_waiting`); past it a task is refused `QueueFull`. Its tasks
//!   keep their deadlines and are in the shutdown report.
//! - A once-a-second watchdog sweep answers attempts whose node never
//!   reported back (the node's thread died with them) as `Lost`.
//! - A panic inside a handler is caught: it is logged at `error`, every task
//!   the queue holds is answered `Internal`, and the queue starts afresh
//!   (its counters kept), so a bug never leaves callers waiting. A dead
//!   balancer is found the same way, and the dispatcher rebuilds the
//!   pipeline.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::oneshot;
use tokio::time::Instant;

mod answers;
mod bytes;
mod deadlines;
mod dispatch;
mod intake;
mod port;
mod table;
mod tenants;
#[cfg(test)]
mod tests;
mod timing;

pub(crate) use self::port::BalancerPort;
pub(in crate::actors) use self::table::{Counters, Epoch, Pending, State, TaskNo};

use self::dispatch::list_cancelled_twin;
use self::table::TaskTable;
use self::timing::Timer;
#[cfg(test)]
use super::inbox::InboxSender;
use super::inbox::{Inbox, InboxReady};
use super::protocol::*;
use super::timers::TimerStore;
use crate::algo::policy::{Decision, Ended, RetryPolicy};
use crate::algo::time;
use crate::config::{OnFull, ServiceConfig};
use crate::outcome::{
    Attempt, AttemptOutcome, ErrorKind, FailReason, Failure, Outcome, Rejection, Response,
    TaskResult,
};
use crate::stats::QueueStats;
use crate::task::{Job, Task};

/// The queue of one service. Also answers [`Task`] messages sent straight to it.
pub struct QueueActor {
    pub(super) service: Arc<str>,
    pub(super) cfg: Arc<ServiceConfig>,
    balancer: Option<BalancerPort>,
    ids: Arc<std::sync::atomic::AtomicU64>,
    /// Submits from the dispatcher, taken a burst at a time.
    inbox: Arc<Inbox<Submit>>,
    /// The inbox's previous list, kept for reuse while it is small.
    intake_spare: Vec<Submit>,
    /// Every task held, its state and the counts by state.
    pub(super) tasks: TaskTable,
    /// The turn's news for the balancer, sent when the turn ends.
    out: QueueTurn,
    timers: TimerStore<TaskNo, Timer>,
    timer: Option<(Instant, SpawnHandle)>,
    credit: usize,
    /// Of `credit`, the headroom: only top-class tasks may spend it.
    reserve: usize,
    /// Which classes came lately: the top one may take the headroom.
    classes: crate::algo::headroom::ClassReserve,
    gate: Gate,
    pub(super) closed: bool,
    policy: RetryPolicy,
    budget_exhausted: bool,
    rng: SmallRng,
    pub(super) counters: Counters,
    /// Prometheus series, bumped where `counters` are (no-op without `metrics`).
    metrics: crate::metrics::ServiceMetrics,
    pub(super) drains: Vec<oneshot::Sender<()>>,
    full: bool,
    /// Bytes of the bodies of the tasks held (`queue.max_bytes`).
    bytes: bytes::QueueBytes,
    /// The pipeline is dead (its balancer stopped): everything is refused.
    dead: bool,
    latencies: super::hedge::LatencyWindow,
    /// The delay control (`queue.delay`), unless off for this service.
    delay: Option<crate::algo::codel::Codel>,
    /// Shedding by stated deadlines (`algo::deadline`): always on, idle for
    /// tasks without a deadline or a service `slo`.
    due: crate::algo::deadline::DeadlineControl,
    /// Whether the deadline rules are shedding (for the log's transitions).
    due_overloaded: bool,
    /// When the delay control's sweep timer is set for (see `Timer::Sweep`).
    sweep_at: Option<Instant>,
    /// The latest shed of each class, most important first.
    shed_at: [Option<Instant>; 3],
    /// The time of the message being handled, read at most once per message
    /// (clock reads are a measurable share of a task's cost).
    clock: Option<Instant>,
    /// What the tasks' send times count from.
    pub(super) epoch: Epoch,
}

impl QueueActor {
    /// A queue answering to `balancer` (the pipeline's, or a stand-in for
    /// tests that deliver the balancer's answers in an exact order), with
    /// its intake.
    #[cfg(test)]
    pub(crate) fn with_port(
        cfg: Arc<ServiceConfig>,
        balancer: BalancerPort,
    ) -> (Addr<QueueActor>, InboxSender<Submit>) {
        let q = QueueActor::new(cfg, balancer, Arc::default(), Default::default());
        let inbox = q.inbox.clone();
        let addr = q.start();
        let sender = InboxSender::new(&inbox, addr.clone().recipient::<InboxReady>());
        (addr, sender)
    }

    /// A queue answering to `balancer`, with the service's metric series.
    pub(crate) fn new(
        cfg: Arc<ServiceConfig>,
        balancer: BalancerPort,
        ids: Arc<std::sync::atomic::AtomicU64>,
        metrics: crate::metrics::ServiceMetrics,
    ) -> Self {
        let now = Instant::now();
        let rng = match cfg.balancer.seed {
            Some(s) => SmallRng::seed_from_u64(s ^ 0x9e37_79b9_7f4a_7c15),
            None => SmallRng::from_os_rng(),
        };
        let r = &cfg.retry;
        Self {
            service: cfg.name.as_str().into(),
            balancer: Some(balancer),
            ids,
            inbox: Arc::default(),
            intake_spare: Vec::new(),
            tasks: TaskTable::new(cfg.queue.priority.clone(), &cfg.tenants),
            out: QueueTurn::default(),
            timers: TimerStore::default(),
            timer: None,
            credit: 0,
            reserve: 0,
            classes: Default::default(),
            gate: Gate::Open,
            closed: false,
            policy: RetryPolicy::new(
                r.max_retries,
                r.backoff_base,
                r.backoff_max,
                r.max_retry_after,
                r.budget.clone(),
                now,
            ),
            budget_exhausted: false,
            rng,
            counters: Counters::default(),
            metrics,
            drains: Vec::new(),
            full: false,
            bytes: bytes::QueueBytes::new(cfg.queue.max_bytes),
            dead: false,
            latencies: super::hedge::LatencyWindow::new(1024),
            delay: delay_control(&cfg),
            due: Default::default(),
            due_overloaded: false,
            sweep_at: None,
            shed_at: [None; 3],
            clock: None,
            epoch: Epoch::new(now),
            cfg,
        }
    }

    /// The queue's intake, for the dispatcher's side of it.
    pub(crate) fn inbox(&self) -> Arc<Inbox<Submit>> {
        self.inbox.clone()
    }

    /// Starts handling a message that happened at `at` (or now, if unknown).
    fn tick(&mut self, at: Option<Instant>) {
        self.clock = at;
    }

    /// The current message's time.
    fn now(&mut self) -> Instant {
        *self.clock.get_or_insert_with(Instant::now)
    }

    /// Runs a handler's body; a panic inside it is answered, not left silent.
    fn guarded(&mut self, ctx: &mut Context<Self>, f: impl FnOnce(&mut Self, &mut Context<Self>)) {
        if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| f(self, ctx))) {
            let what = panic_message(&p);
            self.recover(&format!("the queue panicked: {what}"), ctx);
        }
        self.send_turn(ctx);
        self.metrics.queue_depth(self.tasks.counts().queued);
    }

    /// Sends the turn's news to the balancer (one message); if the
    /// balancer has stopped, the pipeline is declared dead instead.
    fn send_turn(&mut self, ctx: &mut Context<Self>) {
        if self.out.is_empty() {
            return;
        }
        let turn = std::mem::take(&mut self.out);
        match self.balancer.as_ref() {
            Some(b) if b.turn.connected() => b.turn.do_send(turn),
            _ => {
                drop(turn);
                self.declare_dead("the service's balancer stopped", ctx);
                self.out = QueueTurn::default();
            }
        }
    }

    /// After a panic (or a dead balancer): answers every task `Internal`,
    /// logs it at `error`, and starts afresh with the counters kept.
    fn recover(&mut self, why: &str, ctx: &mut Context<Self>) {
        let n = self.tasks.len();
        log::error!(
            "service {}: {why}; answering its {n} task(s) `internal error` and going on",
            self.service
        );
        for no in self.tasks.in_arrival_order() {
            // Each answer on its own guard: one bad task cannot stop the rest.
            let reason = Rejection::Internal(why.to_owned());
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.finish(no, Outcome::Rejected(reason), ctx)
            }));
        }
        self.tasks.clear();
        self.bytes.clear();
        self.out.routes.clear();
        self.timers = TimerStore::default();
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        self.check_drained();
    }

    /// The pipeline is dead: every task held and every later one is
    /// answered `Internal` (the dispatcher rebuilds the pipeline).
    pub(super) fn declare_dead(&mut self, why: &'static str, ctx: &mut Context<Self>) {
        if !self.dead {
            self.dead = true;
            self.gate = Gate::Reject(Rejection::Internal(why.into()));
            self.recover(why, ctx);
        }
    }

    // === dispatch ===

    // === timers ===

    fn stats(&mut self) -> QueueStats {
        let now = self.now();
        let c = self.tasks.counts();
        QueueStats {
            queued: c.queued as u64,
            in_flight: c.in_flight as u64,
            waiting: c.parked as u64,
            submitted: self.counters.submitted,
            succeeded: self.counters.succeeded,
            failed: self.counters.failed,
            rejected: self.counters.rejected,
            retried: self.counters.retried,
            fallbacks: self.counters.fallbacks,
            hedged: self.counters.hedged,
            shed: self.counters.shed,
            shed_by_class: crate::stats::ByPriority::from_array(self.counters.shed_by_class),
            ready_by_class: crate::stats::ByPriority::from_array(
                self.tasks.counts().ready_in.map(|n| n as u64),
            ),
            shed_at_intake: self.counters.shed_at_intake,
            cancelled: self.counters.cancelled,
            overloaded: self.delay.as_ref().is_some_and(|d| d.congested().is_some())
                || self.due.overloaded(self.due_hold(), now),
            peak_queued: self.counters.peak_queued as u64,
            capacity: self.cfg.queue.capacity as u64,
            retry_budget_left: u64::from(self.policy.budget_left(now)),
            gate: match &self.gate {
                Gate::Open => None,
                Gate::Reject(r) => Some(r.to_string()),
            },
            tenants: self.tenant_stats(),
        }
    }
}

/// The delay control of a service, unless it is off: by config, or
/// because its tasks wait on purpose (`on_full: wait`; `on_all_open:
/// wait`; rate limits with `on_limit: wait`, whose tasks wait in the queue
/// for their tokens).
fn delay_control(cfg: &ServiceConfig) -> Option<crate::algo::codel::Codel> {
    let limited = cfg.rate_limit.service.is_some() || cfg.rate_limit.per_node.is_some();
    let waits = cfg.queue.on_full == OnFull::Wait
        || cfg.breaker.on_all_open == crate::config::OnAllOpen::Wait
        || (limited && cfg.rate_limit.on_limit == crate::config::OnLimit::Wait);
    match &cfg.queue.delay {
        Some(c) if !waits => Some(crate::algo::codel::Codel::new(c.clone())),
        _ => None,
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

impl Actor for QueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_secs(1), |act, ctx| {
            act.tick(None);
            act.guarded(ctx, |act, ctx| act.sweep_lost(ctx));
        });
    }
}

/// Reports the queue's counters.
impl Handler<GetQueueStats> for QueueActor {
    type Result = MessageResult<GetQueueStats>;

    fn handle(&mut self, _msg: GetQueueStats, _ctx: &mut Self::Context) -> Self::Result {
        self.tick(None);
        MessageResult(self.stats())
    }
}

/// Stops the queue and its balancer.
impl Handler<Stop> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        if let Some(b) = self.balancer.take() {
            b.stop.do_send(Stop);
        }
        ctx.stop();
    }
}

impl QueueActor {
    pub(super) fn guard(
        &mut self,
        ctx: &mut Context<Self>,
        f: impl FnOnce(&mut Self, &mut Context<Self>),
    ) {
        self.tick(None);
        self.guarded(ctx, f);
    }

    /// Answers every task left `ShuttingDown` and returns them, in arrival
    /// order (waiting ones included).
    pub(super) fn abort_all(&mut self, ctx: &mut Context<Self>) -> Vec<crate::task::Unfinished> {
        self.closed = true;
        // Submits still in the inbox were accepted by `submit`: they are
        // answered and reported like the tasks already taken.
        for msg in self.inbox.take_all() {
            self.enter(msg, true, ctx);
        }
        let nos = self.tasks.in_arrival_order();
        let mut left = Vec::with_capacity(nos.len());
        for no in nos {
            if let Some(p) = self.tasks.get(&no) {
                left.push(crate::task::Unfinished {
                    id: p.job().id,
                    service: self.service.to_string(),
                    task: p.job().to_task(&self.service),
                    attempts: p.attempts.clone(),
                    was_in_flight: p.state() == State::InFlight,
                });
            }
            self.reject(no, Rejection::ShuttingDown, ctx);
        }
        self.check_drained();
        left
    }
}
