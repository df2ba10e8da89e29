//! `QueueCore`: the queue of one service with no runtime. It owns every
//! task held, the counts, the ready lists, the deadline and shedding
//! state, the tenants and the mirror of the balancer's credit. Each input
//! (a submit, a turn of the balancer's news, a timer firing, the watchdog's
//! sweep) comes with its `now`; what it leads to is gathered in the core's
//! [`Output`]: the results to send (each to its task's reply slot), the
//! [`QueueTurn`] for the balancer, when the next timer must fire. The
//! actor ([`super::QueueActor`]) reads the clock, calls the core, and
//! sends the output.
//!
//! Read it as: **take** (`intake`: a new task enters the map, ready or
//! waiting in the bounded wait list, or is answered at once), **hand over
//! against credit** (`dispatch`: `pump`, hedges, bounces), **ask the
//! policy** when an attempt ends ([`crate::algo::policy`]), **answer**
//! (`answers`: `finish`, the only place a result is made); `timing` holds
//! the timers and the watchdog, `deadlines` the shedding by stated due
//! times, `counts` the counters and their metrics, `credit` the mirror of
//! the balancer's credit.
//!
//! - Every task lives in one map from its arrival until `finish` removes it,
//!   whatever its state: waiting for room, ready, backing off, in flight.
//!   Answering removes it, so "exactly one result per task" holds under
//!   faults, late answers (ignored: they name an earlier round) and shutdown
//!   (everything left is answered and reported).
//! - Everything that waits on time (retry backoffs, deadlines, hedges) is in
//!   one [`TimerStore`]; the actor keeps one timer for its earliest entry.
//!   Entries of finished tasks are dropped in bulk, so memory follows what
//!   is live.
//! - The wait list (`on_full: wait`, and `feed`) is bounded
//!   (`queue.max_waiting`); past it a task is refused `QueueFull`. Its tasks
//!   keep their deadlines and are in the shutdown report.
//! - The watchdog sweep (once a second, by the actor) answers attempts whose
//!   node never reported back (the node's thread died with them) as `Lost`.
//! - After a panic (caught by the actor) or a dead balancer, [`recover`]
//!   answers every task held `Internal` and starts afresh, counters kept.
//!
//! [`recover`]: QueueCore::recover

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Instant;

mod answers;
mod bytes;
mod counts;
mod deadlines;
mod dispatch;
mod intake;
mod table;
mod tenants;
#[cfg(test)]
mod tests;
mod timing;

use self::counts::QueueCounts;
use self::table::Epoch;
use self::table::TaskTable;
pub(in crate::actors) use self::table::{State, TaskNo};
pub(in crate::actors::queue) use self::timing::Timer;
use super::super::protocol::{BalancerTurn, Gate, QueueTurn, Submit};
use super::super::timers::TimerStore;
use crate::actors::credit::Credit;
use crate::algo::policy::RetryPolicy;
use crate::config::{OnFull, ServiceConfig};
use crate::outcome::{Outcome, Rejection, TaskResult};
use crate::stats::QueueStats;
use crate::task::ReplyTx;

/// What the core's inputs led to, for the actor to send and set.
#[derive(Default)]
pub(crate) struct Output {
    /// The results made, each with the reply slot it goes to.
    pub results: Vec<(ReplyTx, Box<TaskResult>)>,
    /// The news for the balancer (lost attempts, cancels, routes).
    pub turn: QueueTurn,
    /// A timer must fire by then (the earliest entry of the timer store,
    /// when it changed).
    pub wake: Option<Instant>,
    /// The timers set before are void: the core started afresh.
    pub disarm: bool,
    /// Every task was answered at some point: drains may resolve.
    pub drained: bool,
}

/// The state of one service's queue.
pub(crate) struct QueueCore {
    service: Arc<str>,
    cfg: Arc<ServiceConfig>,
    /// Every task held, its state and the counts by state.
    tasks: TaskTable,
    /// What the inputs led to, until the actor takes it.
    out: Output,
    timers: TimerStore<TaskNo, Timer>,
    /// The balancer's credit, as granted and spent.
    credit: Credit,
    /// What an attempt takes on the quickest node with room, as the
    /// balancer last said (`Room::room_latency`).
    room_latency: Option<std::time::Duration>,
    /// Which classes came lately: the top one may take the headroom.
    classes: crate::algo::headroom::ClassReserve,
    gate: Gate,
    closed: bool,
    policy: RetryPolicy,
    budget_exhausted: bool,
    rng: SmallRng,
    /// The counters, and the metric series bumped with them.
    counts: QueueCounts,
    full: bool,
    /// Bytes of the bodies of the tasks held (`queue.max_bytes`).
    bytes: bytes::QueueBytes,
    /// The pipeline is dead (its balancer stopped): everything is refused.
    dead: bool,
    latencies: super::super::hedge::LatencyWindow,
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
    /// The time of the input being handled (given with each input).
    now: Instant,
    /// What the tasks' send times count from.
    epoch: Epoch,
    /// The rate per tenant (`tenants.rate`), if set.
    rates: tenants::TenantLimits,
}

impl QueueCore {
    /// An empty queue for `cfg`, started at `now`, reporting to `metrics`.
    pub fn new(
        cfg: Arc<ServiceConfig>,
        metrics: crate::metrics::ServiceMetrics,
        now: Instant,
    ) -> Self {
        let rng = match cfg.balancer.seed {
            Some(s) => SmallRng::seed_from_u64(s ^ 0x9e37_79b9_7f4a_7c15),
            None => SmallRng::from_os_rng(),
        };
        let r = &cfg.retry;
        Self {
            service: cfg.name.as_str().into(),
            tasks: TaskTable::new(cfg.queue.priority.clone(), &cfg.tenants),
            out: Output::default(),
            timers: TimerStore::default(),
            credit: Credit::default(),
            room_latency: None,
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
            counts: QueueCounts::new(metrics),
            full: false,
            bytes: bytes::QueueBytes::new(cfg.queue.max_bytes),
            dead: false,
            latencies: super::super::hedge::LatencyWindow::new(1024),
            delay: delay_control(&cfg),
            due: Default::default(),
            due_overloaded: false,
            sweep_at: None,
            shed_at: [None; 3],
            now,
            epoch: Epoch::new(now),
            rates: tenants::TenantLimits::new(&cfg.tenants),
            cfg,
        }
    }

    /// The service's name.
    pub fn service(&self) -> &Arc<str> {
        &self.service
    }

    /// Starts handling an input that happened at `now`.
    fn tick(&mut self, now: Instant) {
        self.now = now;
    }

    // === the inputs ===

    /// A new task, at `now`: taken in, then what credit allows is handed
    /// over.
    pub fn submit(&mut self, msg: Submit, now: Instant) {
        self.tick(now);
        if self.take(msg) {
            self.pump();
        }
    }

    /// A new task of a burst, at `now`, taken in without handing anything
    /// over: true if it joined the ready tasks (a [`hand_over`] is then
    /// due).
    ///
    /// [`hand_over`]: QueueCore::hand_over
    pub fn take_in(&mut self, msg: Submit, now: Instant) -> bool {
        self.tick(now);
        self.take(msg)
    }

    /// Hands ready tasks over against credit, at `now` (the pump).
    pub fn hand_over(&mut self, now: Instant) {
        self.tick(now);
        self.pump();
    }

    /// A turn of the balancer's news, arrived at `now`.
    pub fn on_turn(&mut self, turn: BalancerTurn, now: Instant) {
        self.tick(now);
        self.turn(turn);
    }

    /// The actor's timer fired at `now`: the timers due fire, then a pump.
    pub fn on_timer(&mut self, now: Instant) {
        self.tick(now);
        self.fire_timers();
    }

    /// The watchdog's sweep at `now`: attempts that never reported back
    /// are answered `Lost`.
    pub fn on_watchdog(&mut self, now: Instant) {
        self.tick(now);
        self.sweep_lost();
    }

    /// The current input's time.
    fn now(&self) -> Instant {
        self.now
    }

    /// What the inputs so far led to; the actor empties it after each
    /// input (its lists keep their room).
    pub fn output(&mut self) -> &mut Output {
        &mut self.out
    }

    /// Ends an input: the queue depth goes to its metric.
    pub fn end_input(&self) {
        self.counts.depth(self.tasks.counts().queued);
    }

    /// Whether no task is held.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// After a panic (or a dead balancer): answers every task `Internal`
    /// (at the last input's time), logs it at `error`, and starts afresh
    /// with the counters kept.
    pub fn recover(&mut self, why: &str) {
        let n = self.tasks.len();
        log::error!(
            "service {}: {why}; answering its {n} task(s) `internal error` and going on",
            self.service
        );
        for no in self.tasks.in_arrival_order() {
            // Each answer on its own guard: one bad task cannot stop the rest.
            let reason = Rejection::Internal(why.to_owned());
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.finish(no, Outcome::Rejected(reason))
            }));
        }
        // Dropping the entries gives their bodies' bytes back.
        self.tasks.clear();
        self.out.turn.routes.clear();
        self.timers = TimerStore::default();
        self.out.wake = None;
        self.out.disarm = true;
        self.check_drained();
    }

    /// The pipeline is dead: every task held and every later one is
    /// answered `Internal` (the dispatcher rebuilds the pipeline), at the
    /// last input's time.
    pub fn declare_dead(&mut self, why: &'static str) {
        if !self.dead {
            self.dead = true;
            self.gate = Gate::Reject(Rejection::Internal(why.into()));
            self.recover(why);
        }
    }

    /// Refuses every later task `ShuttingDown`; tasks already accepted go on.
    pub fn close_intake(&mut self) {
        self.closed = true;
    }

    /// Answers every task left `ShuttingDown` and returns them, in arrival
    /// order (waiting ones included), after taking in `unread`: submits
    /// accepted but not yet taken, answered and reported like the rest.
    pub fn abort_all(&mut self, unread: Vec<Submit>, now: Instant) -> Vec<crate::task::Unfinished> {
        self.tick(now);
        self.closed = true;
        for msg in unread {
            self.enter(msg, true);
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
            self.reject(no, Rejection::ShuttingDown);
        }
        self.check_drained();
        left
    }

    /// Notes in the output that every task is answered, when it is.
    fn check_drained(&mut self) {
        if self.tasks.is_empty() {
            self.out.drained = true;
        }
    }

    /// The queue's counts and state at `now`, as [`QueueStats`].
    pub fn stats(&mut self, now: Instant) -> QueueStats {
        self.tick(now);
        let c = self.tasks.counts();
        let n = self.counts.get();
        QueueStats {
            queued: c.queued as u64,
            in_flight: c.in_flight as u64,
            waiting: c.waiting as u64,
            submitted: n.submitted,
            succeeded: n.succeeded,
            failed: n.failed,
            rejected: n.rejected,
            retried: n.retried,
            fallbacks: n.fallbacks,
            hedged: n.hedged,
            shed: n.shed,
            shed_by_class: crate::stats::ByPriority::from_array(n.shed_by_class),
            ready_by_class: crate::stats::ByPriority::from_array(c.ready_in.map(|n| n as u64)),
            shed_at_intake: n.shed_at_intake,
            cancelled: n.cancelled,
            overloaded: self.delay.as_ref().is_some_and(|d| d.congested().is_some())
                || self.due.overloaded(self.due_hold(), now),
            peak_queued: n.peak_queued as u64,
            capacity: self.cfg.queue.capacity as u64,
            retry_budget_left: u64::from(self.policy.budget_left(now)),
            gate: self.gate.rejection(now).map(|r| r.to_string()),
            tenants: self.tenant_stats(),
        }
    }

    /// Task `id`'s number, if it is held (for the actor's tests).
    #[cfg(test)]
    pub fn find(&self, id: crate::task::TaskId) -> Option<TaskNo> {
        self.tasks
            .iter()
            .find(|(_, p)| p.job().id == id)
            .map(|(no, _)| no)
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
