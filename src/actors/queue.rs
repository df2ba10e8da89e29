//! `QueueActor`: the continuous task stream of one service, and the one place
//! where a task is answered.
//!
//! Read it as: **take** (intake, the bounded wait list), **hand over against
//! credit** (`pump`), **ask the policy** when an attempt ends
//! ([`crate::algo::policy`]), **answer** (`finish`, the only place a result
//! is sent).
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

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::balancer::BalancerActor;
use super::messages::*;
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
use crate::transport::TransportFactory;

/// A task's number in its queue.
pub(super) type TaskNo = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Parked until the queue has room (not yet counted as submitted).
    Waiting,
    Ready,
    Backoff,
    InFlight,
}

pub(super) struct Pending {
    pub job: Arc<Job>,
    reply: Option<oneshot::Sender<TaskResult>>,
    pub attempts: Vec<Attempt>,
    retries: u32,
    avoid: Vec<NodeId>,
    pub state: State,
    /// Attempts out right now (2 while hedged).
    outstanding: u8,
    /// Bumped at each dispatch; answers of other rounds are stale.
    round: u32,
    hedged: bool,
    /// Whether an attempt of this round failed (else the round bounced).
    round_failed: bool,
    /// When this round was sent out.
    sent_at: Instant,
    /// When the attempt out should have reported, at the latest.
    watchdog_at: Instant,
    /// The last failed attempt of this task (boxed: most tasks never fail one).
    last: Option<Box<LastFailure>>,
    /// Where a hedged round's attempts went, and which have reported.
    race: Option<Box<Race>>,
}

struct LastFailure {
    outcome: AttemptOutcome,
    response: Option<Response>,
    retry_after: Option<Duration>,
}

/// The two attempts of a hedged round.
struct Race {
    round: u32,
    first: Option<Arc<str>>,
    hedge: Option<Arc<str>>,
    hedge_sent: Instant,
    first_done: bool,
    hedge_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Backoff over: back to the ready queue.
    Due,
    /// The task's deadline.
    Deadline,
    /// Time to send a hedged attempt (round).
    Hedge(u32),
}

#[derive(Debug, Default, Clone)]
pub(super) struct Counters {
    pub submitted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub rejected: u64,
    pub retried: u64,
    pub fallbacks: u64,
    pub hedged: u64,
    pub peak_queued: usize,
}

/// The queue of one service. Also answers [`Task`] messages sent straight to it.
pub struct QueueActor {
    pub(super) service: Arc<str>,
    pub(super) cfg: Arc<ServiceConfig>,
    balancer: Option<Addr<BalancerActor>>,
    ids: Arc<std::sync::atomic::AtomicU64>,
    pub(super) tasks: HashMap<TaskNo, Pending>,
    ready: VecDeque<TaskNo>,
    /// Tasks parked for room, in arrival order (entries of tasks answered
    /// while parked are skipped when reached).
    pub(super) waiting: VecDeque<TaskNo>,
    /// Tasks parked right now (bounded by the capacity).
    parked: usize,
    pub(super) queued: usize,
    pub(super) in_flight: usize,
    timers: TimerStore<TaskNo, Timer>,
    timer: Option<(Instant, SpawnHandle)>,
    credit: usize,
    gate: Gate,
    pub(super) closed: bool,
    policy: RetryPolicy,
    budget_exhausted: bool,
    rng: SmallRng,
    next_no: TaskNo,
    pub(super) counters: Counters,
    /// Prometheus series, bumped where `counters` are (no-op without `metrics`).
    metrics: crate::metrics::ServiceMetrics,
    pub(super) drains: Vec<oneshot::Sender<()>>,
    full: bool,
    /// The pipeline is dead (its balancer stopped): everything is refused.
    dead: bool,
    latencies: super::hedge::LatencyWindow,
    /// The time of the message being handled, read at most once per message
    /// (clock reads are a measurable share of a task's cost).
    clock: Option<Instant>,
}

impl QueueActor {
    /// Starts the queue, its balancer and the balancer's nodes.
    pub(crate) fn start(
        cfg: Arc<ServiceConfig>,
        factory: TransportFactory,
        ids: Arc<std::sync::atomic::AtomicU64>,
        arbiters: Vec<actix::dev::ArbiterHandle>,
        metrics: crate::metrics::ServiceMetrics,
    ) -> (Addr<QueueActor>, Addr<BalancerActor>) {
        let mut balancer_addr = None;
        let queue = QueueActor::create(|ctx| {
            let me = ctx.address();
            let bcfg = cfg.clone();
            let bmetrics = metrics.clone();
            let b = BalancerActor::create(move |bctx| {
                BalancerActor::new(bcfg, me, factory, arbiters, bmetrics, bctx)
            });
            balancer_addr = Some(b.clone());
            let mut q = QueueActor::new(cfg, b, ids);
            q.metrics = metrics;
            q
        });
        (queue, balancer_addr.expect("balancer started"))
    }

    fn new(
        cfg: Arc<ServiceConfig>,
        balancer: Addr<BalancerActor>,
        ids: Arc<std::sync::atomic::AtomicU64>,
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
            tasks: HashMap::new(),
            ready: VecDeque::new(),
            waiting: VecDeque::new(),
            parked: 0,
            queued: 0,
            in_flight: 0,
            timers: TimerStore::default(),
            timer: None,
            credit: 0,
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
            next_no: 0,
            counters: Counters::default(),
            metrics: Default::default(),
            drains: Vec::new(),
            full: false,
            dead: false,
            latencies: super::hedge::LatencyWindow::new(1024),
            clock: None,
            cfg,
        }
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
        self.metrics.queue_depth(self.queued);
    }

    /// After a panic (or a dead balancer): answers every task `Internal`,
    /// logs it at `error`, and starts afresh with the counters kept.
    fn recover(&mut self, why: &str, ctx: &mut Context<Self>) {
        let n = self.tasks.len();
        log::error!(
            "service {}: {why}; answering its {n} task(s) `internal error` and going on",
            self.service
        );
        let mut nos: Vec<TaskNo> = self.tasks.keys().copied().collect();
        nos.sort_unstable();
        for no in nos {
            // Each answer on its own guard: one bad task cannot stop the rest.
            let reason = Rejection::Internal(why.to_owned());
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.finish(no, Outcome::Rejected(reason), ctx)
            }));
        }
        self.tasks.clear();
        self.ready.clear();
        self.waiting.clear();
        self.parked = 0;
        self.timers = TimerStore::default();
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        self.queued = 0;
        self.in_flight = 0;
        self.check_drained();
    }

    /// Sends `msg` to the balancer; false (and the pipeline is declared
    /// dead) if the balancer has stopped.
    fn tell_balancer<M>(&mut self, msg: M, ctx: &mut Context<Self>) -> bool
    where
        M: Message + Send + 'static,
        M::Result: Send,
        BalancerActor: Handler<M>,
    {
        match &self.balancer {
            Some(b) if b.connected() => {
                b.do_send(msg);
                true
            }
            _ => {
                self.declare_dead("the service's balancer stopped", ctx);
                false
            }
        }
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

    // === intake ===

    fn submit(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let now = self.now();
        if self.closed {
            return self.reject_new(msg, Rejection::ShuttingDown, now);
        }
        if msg.job.deadline.is_some_and(|d| d <= now) {
            return self.reject_new(msg, Rejection::DeadlinePassed, now);
        }
        if let Gate::Reject(r) = &self.gate {
            let r = r.clone();
            return self.reject_new(msg, r, now);
        }
        let room = self.queued < self.cfg.queue.capacity && self.parked == 0;
        if !room {
            let wait = msg.wait || self.cfg.queue.on_full == OnFull::Wait;
            // The wait list is bounded too (`queue.max_waiting`).
            if wait && self.parked < self.cfg.queue.max_waiting {
                let no = self.enter(msg, State::Waiting, ctx);
                self.waiting.push_back(no);
                self.parked += 1;
                return;
            }
            if !self.full {
                self.full = true;
                log::warn!(
                    "service {}: queue full ({} tasks{}); rejecting new tasks",
                    self.service,
                    self.cfg.queue.capacity,
                    if wait { ", and the wait list too" } else { "" }
                );
            }
            return self.reject_new(msg, Rejection::QueueFull, now);
        }
        let no = self.enter(msg, State::Ready, ctx);
        self.admit(no);
        self.pump(ctx);
    }

    /// Puts a new task in the map (and its deadline in the timers).
    fn enter(&mut self, msg: Submit, state: State, ctx: &mut Context<Self>) -> TaskNo {
        let no = self.next_no;
        self.next_no += 1;
        if let Some(d) = msg.job.deadline {
            self.push_timer(d, no, Timer::Deadline, ctx);
        }
        let now = self.now();
        self.tasks.insert(
            no,
            Pending {
                job: msg.job,
                reply: Some(msg.reply),
                attempts: Vec::new(),
                retries: 0,
                avoid: Vec::new(),
                state,
                outstanding: 0,
                round: 0,
                hedged: false,
                round_failed: false,
                sent_at: now,
                watchdog_at: now,
                last: None,
                race: None,
            },
        );
        no
    }

    /// Task `no` (just entered, or leaving the wait list) joins the queue.
    fn admit(&mut self, no: TaskNo) {
        if let Some(p) = self.tasks.get_mut(&no) {
            if p.state == State::Waiting {
                self.parked -= 1;
            }
            p.state = State::Ready;
            self.counters.submitted += 1;
            self.ready.push_back(no);
            self.queued += 1;
            self.counters.peak_queued = self.counters.peak_queued.max(self.queued);
        }
    }

    /// Answers a task that never entered the queue.
    fn reject_new(&mut self, msg: Submit, reason: Rejection, now: Instant) {
        self.counters.submitted += 1;
        self.counters.rejected += 1;
        let outcome = self.rejection_outcome(reason);
        let total = now.saturating_duration_since(msg.job.submitted);
        self.metrics.task_finished(&outcome, total);
        let result = TaskResult {
            id: msg.job.id,
            service: self.service.clone(),
            outcome,
            attempts: Vec::new(),
            total,
        };
        let _ = msg.reply.send(result);
    }

    /// Answers task `no` with a rejection (or the fallback).
    pub(super) fn reject(&mut self, no: TaskNo, reason: Rejection, ctx: &mut Context<Self>) {
        let outcome = self.rejection_outcome(reason);
        self.finish(no, outcome, ctx);
    }

    /// A rejection, or the fallback response when one is configured for it.
    /// Counts fallbacks; the rejection itself is counted where it is sent.
    fn rejection_outcome(&mut self, reason: Rejection) -> Outcome {
        match (&self.cfg.fallback, &reason) {
            (Some(f), Rejection::CircuitOpen { .. } | Rejection::RateLimited { .. }) => {
                self.counters.fallbacks += 1;
                Outcome::Fallback {
                    response: Response {
                        status: f.status,
                        headers: fallback_headers(f),
                        body: f.body.clone().into(),
                        node: Arc::from("fallback"),
                        stream: None,
                    },
                    reason,
                }
            }
            _ => Outcome::Rejected(reason),
        }
    }

    /// Lets parked tasks in, in order, while there is room.
    fn admit_waiting(&mut self) {
        while self.queued < self.cfg.queue.capacity {
            let Some(no) = self.waiting.pop_front() else {
                break;
            };
            if self
                .tasks
                .get(&no)
                .is_some_and(|p| p.state == State::Waiting)
            {
                self.admit(no);
            }
        }
        if self.parked == 0 {
            self.waiting.clear();
        }
        if self.full && self.queued < self.cfg.queue.capacity && self.parked == 0 {
            self.full = false;
            log::info!("service {}: queue has room again", self.service);
        }
    }

    // === dispatch ===

    /// Sends ready tasks to the balancer while there is credit.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.parked > 0 {
            self.admit_waiting();
        }
        let now = self.now();
        while self.credit > 0 && self.gate == Gate::Open {
            let Some(no) = self.ready.pop_front() else {
                break;
            };
            let Some(p) = self.tasks.get_mut(&no) else {
                continue;
            };
            if p.state != State::Ready {
                continue;
            }
            if p.job.deadline.is_some_and(|d| d <= now) {
                self.finish_deadline(no, ctx);
                continue;
            }
            let hedge_after = hedge_delay(&self.cfg, &self.latencies, &p.job);
            p.state = State::InFlight;
            p.outstanding = 1;
            p.round = p.round.wrapping_add(1);
            p.round_failed = false;
            p.sent_at = now;
            let round = p.round;
            if round == 1 {
                // The budget counts requests when they are first sent, not
                // when queued, so a deep queue neither floods nor starves it.
                self.policy.sent(now);
            }
            let route = Route {
                seq: Seq { task: no, round },
                job: p.job.clone(),
                avoid: p.avoid.clone(),
                hedge: false,
                at: now,
            };
            let timeout = p.job.task.attempt_timeout().unwrap_or(self.cfg.timeout);
            // Generous: an attempt's own timeout starts at its node, after
            // any mailbox wait; the watchdog is only for attempts lost with
            // their node.
            let grace = time::sum(timeout, timeout.max(Duration::from_secs(5)));
            p.watchdog_at = time::add(now, grace);
            self.queued -= 1;
            self.in_flight += 1;
            self.credit -= 1;
            if !self.tell_balancer(route, ctx) {
                return;
            }
            if let Some(d) = hedge_after {
                self.push_timer(time::add(now, d), no, Timer::Hedge(round), ctx);
            }
        }
        if self.parked > 0 {
            self.admit_waiting();
        }
        self.ready
            .retain_if_bloated(self.queued, |no| is_state(&self.tasks, no, State::Ready));
    }

    // === answers ===

    /// The current round's task for an answer, or `None` if the answer is
    /// stale (the task is answered already, or it names an earlier round).
    fn current(&mut self, seq: Seq) -> Option<&mut Pending> {
        self.tasks
            .get_mut(&seq.task)
            .filter(|p| p.state == State::InFlight && p.round == seq.round && p.outstanding > 0)
    }

    fn on_attempt(&mut self, msg: AttemptDone, ctx: &mut Context<Self>) {
        let no = msg.seq.task;
        let Some(p) = self.current(msg.seq) else {
            return; // answered already, or a late answer of an earlier round
        };
        p.outstanding -= 1;
        if let Some(race) = p.race.as_mut().filter(|r| r.round == msg.seq.round) {
            if msg.hedge {
                race.hedge_done = true;
            } else {
                race.first_done = true;
            }
        }
        let r = msg.report;
        p.attempts.push(Attempt {
            node: msg.address.clone(),
            outcome: r.outcome,
            latency: r.latency,
            hedge: msg.hedge,
            protocol: r.reply.as_ref().and_then(|rep| rep.protocol),
        });
        let mut stream = r.stream;
        let response = r.reply.map(|rep| Response {
            status: rep.status,
            headers: rep.headers,
            body: rep.body,
            node: msg.address.clone(),
            stream: stream.take(),
        });
        if r.outcome.is_success() {
            if matches!(
                self.cfg.hedge,
                Some(crate::config::HedgeAfter::Percentile(_))
            ) {
                self.latencies.record(r.latency);
            }
            let outcome = match response {
                Some(response) => Outcome::Success(response),
                // A transport that reports a status without a reply: answer
                // with what is known rather than panic.
                None => Outcome::Failure(Failure {
                    reason: FailReason::NotRetryable,
                    last: Some(r.outcome),
                    response: None,
                }),
            };
            return self.finish(no, outcome, ctx);
        }
        if r.outcome != AttemptOutcome::Error(ErrorKind::Cancelled) {
            p.round_failed = true;
            p.last = Some(Box::new(LastFailure {
                outcome: r.outcome,
                response,
                retry_after: r.retry_after,
            }));
            if !p.avoid.contains(&msg.node) {
                p.avoid.push(msg.node);
            }
        }
        if p.outstanding == 0 {
            self.round_ended(no, ctx);
        }
    }

    /// Task `no`'s last outstanding attempt ended without a success (by an
    /// answer, a bounce, the watchdog or a cancel): the policy decides.
    fn round_ended(&mut self, no: TaskNo, ctx: &mut Context<Self>) {
        let now = self.now();
        let Some(p) = self.tasks.get_mut(&no) else {
            return;
        };
        let last = p.last.as_deref().filter(|_| p.round_failed);
        let Some(last) = last else {
            // No attempt of this round failed (it bounced): back to the front.
            p.state = State::Ready;
            self.in_flight -= 1;
            self.queued += 1;
            self.ready.push_front(no);
            if let Gate::Reject(r) = self.gate.clone() {
                self.reject(no, r, ctx);
            }
            return;
        };
        let ended = Ended {
            last: last.outcome,
            retry_after: last.retry_after,
            retries: p.retries,
            idempotent: p.job.idempotent,
            deadline: p.job.deadline,
        };
        match self.policy.decide(&ended, now, &mut self.rng) {
            Decision::Fail(reason) => {
                if reason == FailReason::BudgetExhausted {
                    self.metrics.budget_exhausted();
                }
                if reason == FailReason::BudgetExhausted && !self.budget_exhausted {
                    self.budget_exhausted = true;
                    log::warn!(
                        "service {}: retry budget exhausted; failing tasks instead of retrying",
                        self.service
                    );
                }
                self.fail(no, reason, ctx)
            }
            Decision::Retry { after } => {
                if self.budget_exhausted {
                    self.budget_exhausted = false;
                    log::info!("service {}: retry budget available again", self.service);
                }
                p.retries += 1;
                // A retry starts a new round from scratch: the failure that
                // caused it is kept for the answer if the retry fails too.
                log::debug!(
                    "service {}: task {} retry {} in {:?} after {}",
                    self.service,
                    p.job.id,
                    p.retries,
                    after,
                    ended.last
                );
                self.counters.retried += 1;
                self.metrics.retried();
                p.state = State::Backoff;
                p.hedged = false;
                self.in_flight -= 1;
                self.queued += 1;
                self.push_timer(time::add(now, after), no, Timer::Due, ctx);
            }
        }
    }

    fn fail(&mut self, no: TaskNo, reason: FailReason, ctx: &mut Context<Self>) {
        let last = self.tasks.get_mut(&no).and_then(|p| p.last.take());
        let (last, response) = match last {
            Some(l) => (Some(l.outcome), l.response),
            None => (None, None),
        };
        self.finish(
            no,
            Outcome::Failure(Failure {
                reason,
                last,
                response,
            }),
            ctx,
        );
    }

    fn finish_deadline(&mut self, no: TaskNo, ctx: &mut Context<Self>) {
        let tried = self.tasks.get(&no).is_some_and(|p| !p.attempts.is_empty());
        if tried {
            self.fail(no, FailReason::DeadlineExceeded, ctx);
        } else {
            self.reject(no, Rejection::DeadlinePassed, ctx);
        }
    }

    /// Answers task `no` and forgets it. The only place results are sent.
    pub(super) fn finish(&mut self, no: TaskNo, outcome: Outcome, ctx: &mut Context<Self>) {
        let now = self.now();
        let Some(mut p) = self.tasks.remove(&no) else {
            return;
        };
        match p.state {
            State::Waiting => {
                self.counters.submitted += 1;
                self.parked -= 1;
            }
            State::Ready | State::Backoff => self.queued -= 1,
            State::InFlight => self.in_flight -= 1,
        }
        match &outcome {
            Outcome::Success(_) => self.counters.succeeded += 1,
            Outcome::Failure(_) => self.counters.failed += 1,
            Outcome::Rejected(_) | Outcome::Fallback { .. } => self.counters.rejected += 1,
        }
        let outstanding = p.state == State::InFlight && p.outstanding > 0;
        if outstanding {
            list_cancelled_twin(&mut p, now);
        }
        let total = now.saturating_duration_since(p.job.submitted);
        self.metrics.task_finished(&outcome, total);
        let result = TaskResult {
            id: p.job.id,
            service: self.service.clone(),
            outcome,
            attempts: std::mem::take(&mut p.attempts),
            total,
        };
        if let Some(reply) = p.reply.take() {
            let _ = reply.send(result);
        }
        if outstanding && self.cfg.hedge.is_some() {
            // A hedged twin is still out: tell its node it lost.
            let seq = Seq {
                task: no,
                round: p.round,
            };
            self.tell_balancer(super::hedge::CancelTask { seq }, ctx);
        }
        self.check_drained();
    }

    pub(super) fn check_drained(&mut self) {
        if self.tasks.is_empty() {
            for d in self.drains.drain(..) {
                let _ = d.send(());
            }
        }
    }

    // === timers ===

    fn push_timer(&mut self, at: Instant, no: TaskNo, kind: Timer, ctx: &mut Context<Self>) {
        let tasks = &self.tasks;
        // At most three timers per task can be live (deadline, backoff, hedge).
        self.timers
            .compact_if_needed(tasks.len().saturating_mul(3), |no, kind| {
                timer_live(tasks, no, kind)
            });
        if !self.timers.push(at, no, kind) {
            return;
        }
        if let Some((t, h)) = self.timer {
            if t <= at {
                return;
            }
            ctx.cancel_future(h);
        }
        self.arm(at, ctx);
    }

    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let delay = at.saturating_duration_since(Instant::now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.tick(None);
            act.guarded(ctx, |act, ctx| act.on_timer(ctx));
        });
        self.timer = Some((at, h));
    }

    fn on_timer(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        while let Some((no, kind)) = self.timers.pop_due(now) {
            let Some(p) = self.tasks.get_mut(&no) else {
                continue;
            };
            match kind {
                Timer::Due if p.state == State::Backoff => {
                    p.state = State::Ready;
                    self.ready.push_front(no);
                    if let Gate::Reject(r) = self.gate.clone() {
                        self.reject(no, r, ctx);
                    }
                }
                Timer::Deadline if p.state != State::InFlight => {
                    self.finish_deadline(no, ctx);
                }
                Timer::Hedge(g) if p.state == State::InFlight && p.round == g => {
                    self.send_hedge(no, now, ctx);
                }
                _ => {}
            }
        }
        if let Some(at) = self.timers.next() {
            if self.timer.is_none_or(|(t, _)| at < t) {
                if let Some((_, h)) = self.timer.take() {
                    ctx.cancel_future(h);
                }
                self.arm(at, ctx);
            }
        }
        self.pump(ctx);
    }

    /// The watchdog: answers attempts that never reported back (their node
    /// actor died with them) as `Lost`, so no task waits forever. Attempts
    /// are bounded by their own timeout at the node, so this only fires on
    /// a fault; it sweeps once a second instead of keeping a timer per task.
    fn sweep_lost(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        let lost: Vec<(Seq, u8)> = self
            .tasks
            .iter()
            .filter(|(_, p)| p.state == State::InFlight && p.watchdog_at <= now)
            .map(|(no, p)| {
                let seq = Seq {
                    task: *no,
                    round: p.round,
                };
                (seq, p.outstanding.max(1))
            })
            .collect();
        for (seq, outstanding) in lost {
            if let Some(p) = self.tasks.get(&seq.task) {
                log::warn!(
                    "service {}: task {}: attempt never reported back; counted as lost",
                    self.service,
                    p.job.id
                );
            }
            for _ in 0..outstanding {
                // The balancer frees the slot each lost attempt held.
                self.tell_balancer(AttemptLost { seq }, ctx);
                self.on_attempt(
                    AttemptDone {
                        seq,
                        node: NodeId(u32::MAX),
                        address: "unknown".into(),
                        hedge: false,
                        report: AttemptReport {
                            outcome: AttemptOutcome::Error(ErrorKind::Lost),
                            latency: now.saturating_duration_since(
                                self.tasks.get(&seq.task).map_or(now, |p| p.sent_at),
                            ),
                            reply: None,
                            retry_after: None,
                            stream: None,
                        },
                        credit: 0,
                        at: now,
                    },
                    ctx,
                );
            }
        }
        self.pump(ctx);
    }

    /// The balancer could not place an attempt: if it was the round's last
    /// one out, the task goes back to the front (or, if the other attempt of
    /// a hedged round failed meanwhile, the policy decides).
    fn on_bounce(&mut self, msg: Bounce, ctx: &mut Context<Self>) {
        let Some(p) = self.current(msg.seq) else {
            return;
        };
        p.outstanding -= 1;
        if let Some(race) = p.race.as_mut().filter(|r| r.round == msg.seq.round) {
            if msg.hedge {
                race.hedge = None;
                race.hedge_done = true;
            }
        }
        if p.outstanding == 0 {
            self.round_ended(msg.seq.task, ctx);
        }
    }

    /// A hedge was placed: remember where both attempts of the round went.
    fn on_placed(&mut self, msg: Placed) {
        let Some(p) = self.current(msg.seq) else {
            return;
        };
        if let Some(race) = p.race.as_mut().filter(|r| r.round == msg.seq.round) {
            race.first = Some(msg.first);
            race.hedge = Some(msg.hedge);
        }
    }

    /// Reject every ready task (the gate closed).
    fn reject_ready(&mut self, reason: Rejection, ctx: &mut Context<Self>) {
        while let Some(no) = self.ready.pop_front() {
            if is_state(&self.tasks, &no, State::Ready) {
                self.reject(no, reason.clone(), ctx);
            }
        }
    }

    fn send_hedge(&mut self, no: TaskNo, now: Instant, ctx: &mut Context<Self>) {
        let Some(p) = self.tasks.get_mut(&no) else {
            return;
        };
        if p.hedged || p.outstanding != 1 {
            return;
        }
        if !self.policy.pay_hedge(now) {
            return;
        }
        p.hedged = true;
        p.outstanding += 1;
        p.race = Some(Box::new(Race {
            round: p.round,
            first: None,
            hedge: None,
            hedge_sent: now,
            first_done: false,
            hedge_done: false,
        }));
        self.counters.hedged += 1;
        self.metrics.hedged();
        let route = Route {
            seq: Seq {
                task: no,
                round: p.round,
            },
            job: p.job.clone(),
            avoid: p.avoid.clone(),
            hedge: true,
            at: now,
        };
        self.tell_balancer(route, ctx);
    }

    fn stats(&mut self) -> QueueStats {
        let now = self.now();
        QueueStats {
            queued: self.queued as u64,
            in_flight: self.in_flight as u64,
            waiting: self.parked as u64,
            submitted: self.counters.submitted,
            succeeded: self.counters.succeeded,
            failed: self.counters.failed,
            rejected: self.counters.rejected,
            retried: self.counters.retried,
            fallbacks: self.counters.fallbacks,
            hedged: self.counters.hedged,
            peak_queued: self.counters.peak_queued as u64,
            capacity: self.cfg.queue.capacity as u64,
            retry_budget_left: u64::from(self.policy.budget_left(now)),
            gate: match &self.gate {
                Gate::Open => None,
                Gate::Reject(r) => Some(r.to_string()),
            },
        }
    }
}

/// Lists the attempt still out when a hedged task is answered, as
/// `Cancelled`: the backend saw it, so the result shows it.
fn list_cancelled_twin(p: &mut Pending, now: Instant) {
    let Some(race) = p.race.as_deref().filter(|r| r.round == p.round) else {
        return;
    };
    let (node, hedge, sent) = if !race.hedge_done {
        (race.hedge.clone(), true, race.hedge_sent)
    } else if !race.first_done {
        (race.first.clone(), false, p.sent_at)
    } else {
        return;
    };
    if let Some(node) = node {
        p.attempts.push(Attempt {
            node,
            outcome: AttemptOutcome::Error(ErrorKind::Cancelled),
            latency: now.saturating_duration_since(sent),
            hedge,
            protocol: None,
        });
    }
}

fn is_state(tasks: &HashMap<TaskNo, Pending>, no: &TaskNo, state: State) -> bool {
    tasks.get(no).is_some_and(|p| p.state == state)
}

/// Whether a timer entry can still fire for its task.
fn timer_live(tasks: &HashMap<TaskNo, Pending>, no: &TaskNo, kind: &Timer) -> bool {
    let Some(p) = tasks.get(no) else {
        return false;
    };
    match kind {
        Timer::Due => p.state == State::Backoff,
        Timer::Deadline => p.job.deadline.is_some(),
        Timer::Hedge(g) => p.state == State::InFlight && p.round == *g,
    }
}

/// Lazy deletion for the ready list: finished tasks leave their numbers
/// behind; drop them in bulk once they outnumber the live ones.
trait RetainIfBloated {
    fn retain_if_bloated(&mut self, live: usize, keep: impl FnMut(&TaskNo) -> bool);
}

impl RetainIfBloated for VecDeque<TaskNo> {
    fn retain_if_bloated(&mut self, live: usize, keep: impl FnMut(&TaskNo) -> bool) {
        if self.len() > live.saturating_mul(2).saturating_add(1024) {
            self.retain(keep);
            self.shrink_to(self.len().saturating_mul(2));
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// The configured fallback headers (checked at config load).
fn fallback_headers(f: &crate::config::FallbackConfig) -> awc::http::header::HeaderMap {
    use awc::http::header::{HeaderName, HeaderValue};
    let mut map = awc::http::header::HeaderMap::new();
    for (k, v) in &f.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            map.append(k, v);
        }
    }
    map
}

/// When to hedge `job`, if the service hedges and the task is idempotent.
fn hedge_delay(
    cfg: &ServiceConfig,
    latencies: &super::hedge::LatencyWindow,
    job: &Job,
) -> Option<Duration> {
    if !job.idempotent {
        return None;
    }
    match cfg.hedge? {
        crate::config::HedgeAfter::Delay(d) => Some(d),
        crate::config::HedgeAfter::Percentile(p) => latencies.percentile(p),
    }
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

/// A task sent straight to the queue's address.
impl Handler<Task> for QueueActor {
    type Result = ResponseFuture<TaskResult>;

    fn handle(&mut self, task: Task, ctx: &mut Self::Context) -> Self::Result {
        self.tick(None);
        let now = self.now();
        let id = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let service = self.service.clone();
        let checked = if task.service().eq_ignore_ascii_case(&self.service) {
            task.prepare(id, now)
        } else {
            let why = format!(
                "task names service {:?} but was sent to the queue of service {:?}",
                task.service(),
                self.service
            );
            Err((task.given_id().unwrap_or(id), why))
        };
        match checked {
            Ok(job) => {
                let msg = Submit {
                    job: Arc::new(job),
                    reply: tx,
                    wait: false,
                };
                self.guarded(ctx, |act, ctx| act.submit(msg, ctx));
                Box::pin(crate::dispatcher::Submission::waiting(rx, id, service, now))
            }
            Err((id, reason)) => {
                self.counters.submitted += 1;
                self.counters.rejected += 1;
                let result =
                    crate::dispatcher::rejected(id, service, Rejection::InvalidTask(reason), now);
                self.metrics.task_finished(&result.outcome, result.total);
                Box::pin(crate::dispatcher::Submission::ready(result))
            }
        }
    }
}

/// A new task from the dispatcher.
impl Handler<Submit> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Self::Context) {
        self.tick(Some(msg.job.submitted));
        self.guarded(ctx, |act, ctx| act.submit(msg, ctx));
    }
}

/// The balancer can take more tasks.
impl Handler<Credit> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Credit, ctx: &mut Self::Context) {
        self.tick(None);
        self.credit = self.credit.saturating_add(msg.0);
        self.guarded(ctx, |act, ctx| act.pump(ctx));
    }
}

/// The balancer opened or closed the gate.
impl Handler<SetGate> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: SetGate, ctx: &mut Self::Context) {
        self.tick(None);
        if self.dead {
            return;
        }
        self.gate = msg.0;
        self.guarded(ctx, |act, ctx| match act.gate.clone() {
            Gate::Open => act.pump(ctx),
            Gate::Reject(r) => {
                act.reject_ready(r.clone(), ctx);
                while let Some(no) = act.waiting.pop_front() {
                    act.reject(no, r.clone(), ctx);
                }
                act.check_drained();
            }
        });
    }
}

/// What became of a routed task: an attempt ended, or it bounced.
impl Handler<Answer> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Answer, ctx: &mut Self::Context) {
        self.guarded(ctx, |act, ctx| {
            match msg {
                Answer::Done(done) => {
                    act.tick(Some(done.at));
                    act.credit = act.credit.saturating_add(done.credit);
                    act.on_attempt(done, ctx);
                }
                Answer::Bounce(b) => {
                    act.tick(None);
                    act.credit = act.credit.saturating_add(b.credit);
                    act.on_bounce(b, ctx);
                }
                Answer::Placed(p) => {
                    act.tick(None);
                    act.on_placed(p);
                }
            }
            act.pump(ctx);
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
            b.do_send(Stop);
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
    pub(super) fn abort_all(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> Vec<crate::dispatcher::Unfinished> {
        self.closed = true;
        let mut nos: Vec<TaskNo> = self.tasks.keys().copied().collect();
        nos.sort_unstable();
        let mut left = Vec::with_capacity(nos.len());
        for no in nos {
            if let Some(p) = self.tasks.get(&no) {
                left.push(crate::dispatcher::Unfinished {
                    id: p.job.id,
                    service: self.service.to_string(),
                    task: p.job.task.clone(),
                    attempts: p.attempts.clone(),
                    was_in_flight: p.state == State::InFlight,
                });
            }
            self.reject(no, Rejection::ShuttingDown, ctx);
        }
        self.waiting.clear();
        self.parked = 0;
        self.check_drained();
        left
    }
}
