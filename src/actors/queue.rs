//! `QueueActor`: the continuous task stream of one service, and the one place
//! where a task's fate is decided.
//!
//! It holds a bounded FIFO of ready tasks and one timer heap for everything
//! that waits on time (retry backoffs, task deadlines, hedges), served by a
//! single actix timer set for the earliest entry; a once-a-second watchdog
//! sweep answers attempts whose node never reported back.
//! It hands tasks to the balancer only against [`Credit`] (pull, not push),
//! and after every attempt decides: finish, or retry after exponential
//! backoff with full jitter, within `max_retries`, the deadline and the
//! service's retry budget, preferring a node that has not failed the task.
//!
//! Every accepted task lives in one map until it is answered, and answering
//! removes it: that is how "exactly one result per task" holds under faults,
//! late answers (ignored) and shutdown (everything left is answered
//! `ShuttingDown` and returned in the report).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::balancer::BalancerActor;
use super::messages::*;
use crate::algo::backoff::Backoff;
use crate::algo::budget::RetryBudget;
use crate::config::{OnFull, ServiceConfig};
use crate::dispatcher::Unfinished;
use crate::outcome::{
    Attempt, AttemptOutcome, ErrorKind, FailReason, Failure, Outcome, Rejection, Response,
    TaskResult,
};
use crate::stats::QueueStats;
use crate::task::{Job, Task};
use crate::transport::TransportFactory;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ready,
    Backoff,
    InFlight,
}

struct Pending {
    job: Arc<Job>,
    reply: Option<oneshot::Sender<TaskResult>>,
    attempts: Vec<Attempt>,
    retries: u32,
    avoid: Vec<NodeId>,
    state: State,
    /// Attempts out right now (2 while hedged).
    outstanding: u8,
    /// Bumped at each dispatch, so a hedge timer knows if it is stale.
    generation: u32,
    hedged: bool,
    /// When the attempt out should have reported, at the latest.
    watchdog_at: Instant,
    /// The last failed attempt (boxed: most tasks never fail one).
    last: Option<Box<(AttemptOutcome, Option<Response>)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Backoff over: back to the ready queue.
    Due,
    /// The task's deadline.
    Deadline,
    /// Time to send a hedged attempt (generation).
    Hedge(u32),
}

#[derive(Debug, Default, Clone)]
struct Counters {
    submitted: u64,
    succeeded: u64,
    failed: u64,
    rejected: u64,
    retried: u64,
    fallbacks: u64,
    hedged: u64,
    peak_queued: usize,
}

/// The queue of one service. Also answers [`Task`] messages sent straight to it.
pub struct QueueActor {
    service: Arc<str>,
    cfg: Arc<ServiceConfig>,
    balancer: Option<Addr<BalancerActor>>,
    ids: Arc<std::sync::atomic::AtomicU64>,
    tasks: HashMap<Seq, Pending>,
    ready: VecDeque<Seq>,
    queued: usize,
    in_flight: usize,
    timers: BinaryHeap<Reverse<(Instant, Seq, Timer)>>,
    timer: Option<(Instant, SpawnHandle)>,
    credit: usize,
    gate: Gate,
    closed: bool,
    waiting: VecDeque<Submit>,
    budget: RetryBudget,
    budget_exhausted: bool,
    backoff: Backoff,
    rng: SmallRng,
    next_seq: Seq,
    counters: Counters,
    drains: Vec<oneshot::Sender<()>>,
    full: bool,
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
    ) -> (Addr<QueueActor>, Addr<BalancerActor>) {
        let mut balancer_addr = None;
        let queue = QueueActor::create(|ctx| {
            let me = ctx.address();
            let bcfg = cfg.clone();
            let b = BalancerActor::create(move |bctx| {
                BalancerActor::new(bcfg, me, factory, arbiters, bctx)
            });
            balancer_addr = Some(b.clone());
            QueueActor::new(cfg, b, ids)
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
        Self {
            service: cfg.name.as_str().into(),
            balancer: Some(balancer),
            ids,
            tasks: HashMap::new(),
            ready: VecDeque::new(),
            queued: 0,
            in_flight: 0,
            timers: BinaryHeap::new(),
            timer: None,
            credit: 0,
            gate: Gate::Open,
            closed: false,
            waiting: VecDeque::new(),
            budget: RetryBudget::new(cfg.retry.budget.clone(), now),
            budget_exhausted: false,
            backoff: Backoff::new(cfg.retry.backoff_base, cfg.retry.backoff_max),
            rng,
            next_seq: 0,
            counters: Counters::default(),
            drains: Vec::new(),
            full: false,
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

    fn balancer(&self) -> &Addr<BalancerActor> {
        self.balancer.as_ref().expect("balancer set")
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
        if self.queued >= self.cfg.queue.capacity {
            if msg.wait || self.cfg.queue.on_full == OnFull::Wait {
                self.waiting.push_back(msg);
                return;
            }
            if !self.full {
                self.full = true;
                log::warn!(
                    "service {}: queue full ({} tasks); rejecting new tasks",
                    self.service,
                    self.cfg.queue.capacity
                );
            }
            return self.reject_new(msg, Rejection::QueueFull, now);
        }
        self.accept(msg, ctx);
        self.pump(ctx);
    }

    fn accept(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.submitted += 1;
        if let Some(d) = msg.job.deadline {
            self.push_timer(d, seq, Timer::Deadline, ctx);
        }
        self.tasks.insert(
            seq,
            Pending {
                job: msg.job,
                reply: Some(msg.reply),
                attempts: Vec::new(),
                retries: 0,
                avoid: Vec::new(),
                state: State::Ready,
                outstanding: 0,
                generation: 0,
                hedged: false,
                watchdog_at: Instant::now(),
                last: None,
            },
        );
        self.ready.push_back(seq);
        self.queued += 1;
        self.counters.peak_queued = self.counters.peak_queued.max(self.queued);
    }

    /// Answers a task that never entered the queue.
    fn reject_new(&mut self, msg: Submit, reason: Rejection, now: Instant) {
        self.counters.submitted += 1;
        self.counters.rejected += 1;
        let outcome = self.rejection_outcome(reason);
        let result = TaskResult {
            id: msg.job.id,
            service: self.service.clone(),
            outcome,
            attempts: Vec::new(),
            total: now.saturating_duration_since(msg.job.submitted),
        };
        let _ = msg.reply.send(result);
    }

    /// Answers accepted task `seq` with a rejection (or the fallback).
    fn reject(&mut self, seq: Seq, reason: Rejection, ctx: &mut Context<Self>) {
        let outcome = self.rejection_outcome(reason);
        self.finish(seq, outcome, ctx);
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
                    },
                    reason,
                }
            }
            _ => Outcome::Rejected(reason),
        }
    }

    /// Lets parked submitters in while there is room.
    fn admit_waiting(&mut self, ctx: &mut Context<Self>) {
        while self.queued < self.cfg.queue.capacity {
            let Some(msg) = self.waiting.pop_front() else {
                break;
            };
            let now = self.now();
            if msg.job.deadline.is_some_and(|d| d <= now) {
                self.reject_new(msg, Rejection::DeadlinePassed, now);
                continue;
            }
            if let Gate::Reject(r) = &self.gate {
                let r = r.clone();
                self.reject_new(msg, r, now);
                continue;
            }
            self.accept(msg, ctx);
        }
        if self.full && self.queued < self.cfg.queue.capacity {
            self.full = false;
            log::info!("service {}: queue has room again", self.service);
        }
    }

    // === dispatch ===

    /// Sends ready tasks to the balancer while there is credit.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        while self.credit > 0 && self.gate == Gate::Open {
            let Some(seq) = self.ready.pop_front() else {
                break;
            };
            let Some(p) = self.tasks.get_mut(&seq) else {
                continue;
            };
            if p.state != State::Ready {
                continue;
            }
            if p.job.deadline.is_some_and(|d| d <= now) {
                self.finish_deadline(seq, now, ctx);
                continue;
            }
            let hedge_after = hedge_delay(&self.cfg, &self.latencies, &p.job);
            p.state = State::InFlight;
            p.outstanding = 1;
            p.generation += 1;
            let generation = p.generation;
            if generation == 1 {
                // The budget counts requests when they are first sent, not
                // when queued, so a deep queue neither floods nor starves it.
                self.budget.deposit(now);
            }
            let route = Route {
                seq,
                job: p.job.clone(),
                avoid: p.avoid.clone(),
                hedge: false,
                at: now,
            };
            let timeout = p.job.task.attempt_timeout().unwrap_or(self.cfg.timeout);
            p.watchdog_at = now + timeout + timeout.max(Duration::from_secs(5));
            let hedge_at = hedge_after.map(|d| now + d);
            self.queued -= 1;
            self.in_flight += 1;
            self.credit -= 1;
            self.balancer().do_send(route);
            if let Some(t) = hedge_at {
                self.push_timer(t, seq, Timer::Hedge(generation), ctx);
            }
        }
        if !self.waiting.is_empty() {
            self.admit_waiting(ctx);
        }
    }

    // === answers ===

    fn on_attempt(&mut self, msg: AttemptDone, ctx: &mut Context<Self>) {
        let now = self.now();
        let Some(p) = self.tasks.get_mut(&msg.seq) else {
            return; // answered already (shutdown abort, hedge twin)
        };
        if p.state != State::InFlight || p.outstanding == 0 {
            return;
        }
        p.outstanding -= 1;
        let r = msg.report;
        p.attempts.push(Attempt {
            node: msg.address.clone(),
            outcome: r.outcome,
            latency: r.latency,
            hedge: msg.hedge,
        });
        let response = r.reply.map(|rep| Response {
            status: rep.status,
            headers: rep.headers,
            body: rep.body,
            node: msg.address.clone(),
        });
        if r.outcome.is_success() {
            if matches!(
                self.cfg.hedge,
                Some(crate::config::HedgeAfter::Percentile(_))
            ) {
                self.latencies.record(r.latency);
            }
            let response = response.expect("a status comes with a reply");
            return self.finish(msg.seq, Outcome::Success(response), ctx);
        }
        if r.outcome != AttemptOutcome::Error(ErrorKind::Cancelled) {
            p.last = Some(Box::new((r.outcome, response)));
            if !p.avoid.contains(&msg.node) {
                p.avoid.push(msg.node);
            }
        }
        if p.outstanding > 0 {
            return; // the hedged twin may still succeed
        }
        let Some(last) = p.last.as_ref().map(|l| l.0) else {
            return self.fail(msg.seq, FailReason::NotRetryable, ctx);
        };
        let retryable = match last {
            AttemptOutcome::Status(s) => s == 429 || s >= 500,
            AttemptOutcome::Error(ErrorKind::Connect) => true,
            AttemptOutcome::Error(
                ErrorKind::Timeout | ErrorKind::Reset | ErrorKind::Panicked | ErrorKind::Lost,
            ) => p.job.idempotent,
            AttemptOutcome::Error(_) => false,
        };
        if !retryable {
            return self.fail(msg.seq, FailReason::NotRetryable, ctx);
        }
        if p.retries >= self.cfg.retry.max_retries {
            return self.fail(msg.seq, FailReason::RetriesExhausted, ctx);
        }
        let mut delay = self.backoff.delay(p.retries, &mut self.rng);
        if let Some(ra) = r.retry_after {
            let ra = if p.job.deadline.is_some() {
                ra
            } else {
                ra.min(self.cfg.retry.max_retry_after)
            };
            delay = delay.max(ra);
        }
        if p.job.deadline.is_some_and(|d| now + delay >= d) {
            return self.fail(msg.seq, FailReason::DeadlineExceeded, ctx);
        }
        if !self.budget.try_withdraw(now) {
            if !self.budget_exhausted {
                self.budget_exhausted = true;
                log::warn!(
                    "service {}: retry budget exhausted; failing tasks instead of retrying",
                    self.service
                );
            }
            return self.fail(msg.seq, FailReason::BudgetExhausted, ctx);
        }
        if self.budget_exhausted {
            self.budget_exhausted = false;
            log::info!("service {}: retry budget available again", self.service);
        }
        p.retries += 1;
        log::debug!(
            "service {}: task {} retry {} in {:?} after {}",
            self.service,
            p.job.id,
            p.retries,
            delay,
            last
        );
        self.counters.retried += 1;
        p.state = State::Backoff;
        self.in_flight -= 1;
        self.queued += 1;
        self.push_timer(now + delay, msg.seq, Timer::Due, ctx);
    }

    fn fail(&mut self, seq: Seq, reason: FailReason, ctx: &mut Context<Self>) {
        let last = self.tasks.get_mut(&seq).and_then(|p| p.last.take());
        let (last, response) = match last {
            Some(l) => (Some(l.0), l.1),
            None => (None, None),
        };
        self.finish(
            seq,
            Outcome::Failure(Failure {
                reason,
                last,
                response,
            }),
            ctx,
        );
    }

    fn finish_deadline(&mut self, seq: Seq, _now: Instant, ctx: &mut Context<Self>) {
        let tried = self.tasks.get(&seq).is_some_and(|p| !p.attempts.is_empty());
        if tried {
            self.fail(seq, FailReason::DeadlineExceeded, ctx);
        } else {
            self.reject(seq, Rejection::DeadlinePassed, ctx);
        }
    }

    /// Answers task `seq` and forgets it. The only place results are sent.
    fn finish(&mut self, seq: Seq, outcome: Outcome, ctx: &mut Context<Self>) {
        let now = self.now();
        let Some(mut p) = self.tasks.remove(&seq) else {
            return;
        };
        match p.state {
            State::Ready | State::Backoff => self.queued -= 1,
            State::InFlight => self.in_flight -= 1,
        }
        match &outcome {
            Outcome::Success(_) => self.counters.succeeded += 1,
            Outcome::Failure(_) => self.counters.failed += 1,
            Outcome::Rejected(_) | Outcome::Fallback { .. } => self.counters.rejected += 1,
        }
        let result = TaskResult {
            id: p.job.id,
            service: self.service.clone(),
            outcome,
            attempts: std::mem::take(&mut p.attempts),
            total: now.saturating_duration_since(p.job.submitted),
        };
        if let Some(reply) = p.reply.take() {
            let _ = reply.send(result);
        }
        if p.outstanding > 0 {
            // A hedged twin is still out: tell its node it lost.
            self.balancer().do_send(super::hedge::CancelTask { seq });
        }
        if !self.waiting.is_empty() {
            self.admit_waiting(ctx);
        }
        self.check_drained();
    }

    fn check_drained(&mut self) {
        if self.tasks.is_empty() && self.waiting.is_empty() {
            for d in self.drains.drain(..) {
                let _ = d.send(());
            }
        }
    }

    // === timers ===

    fn push_timer(&mut self, at: Instant, seq: Seq, kind: Timer, ctx: &mut Context<Self>) {
        self.timers.push(Reverse((at, seq, kind)));
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
            act.on_timer(ctx);
        });
        self.timer = Some((at, h));
    }

    fn on_timer(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        while let Some(Reverse((at, seq, kind))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(p) = self.tasks.get_mut(&seq) else {
                continue;
            };
            match kind {
                Timer::Due if p.state == State::Backoff => {
                    p.state = State::Ready;
                    self.ready.push_front(seq);
                    if let Gate::Reject(r) = self.gate.clone() {
                        self.reject(seq, r, ctx);
                    }
                }
                Timer::Deadline if p.state != State::InFlight => {
                    self.finish_deadline(seq, now, ctx);
                }
                Timer::Hedge(g) if p.state == State::InFlight && p.generation == g => {
                    self.send_hedge(seq, now);
                }
                _ => {}
            }
        }
        if let Some(Reverse((at, _, _))) = self.timers.peek().copied() {
            self.arm(at, ctx);
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
            .map(|(seq, p)| (*seq, p.outstanding.max(1)))
            .collect();
        for (seq, outstanding) in lost {
            if let Some(p) = self.tasks.get(&seq) {
                log::warn!(
                    "service {}: task {}: attempt never reported back; counted as lost",
                    self.service,
                    p.job.id
                );
            }
            for _ in 0..outstanding {
                self.on_attempt(
                    AttemptDone {
                        seq,
                        node: NodeId(u32::MAX),
                        address: "unknown".into(),
                        hedge: false,
                        report: AttemptReport {
                            outcome: AttemptOutcome::Error(ErrorKind::Lost),
                            latency: Duration::ZERO,
                            reply: None,
                            retry_after: None,
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

    /// The balancer could not place a task: it goes back to the front.
    fn on_bounce(&mut self, msg: Bounce, ctx: &mut Context<Self>) {
        let Some(p) = self.tasks.get_mut(&msg.seq) else {
            return;
        };
        if p.state != State::InFlight || p.outstanding == 0 {
            return;
        }
        p.outstanding -= 1;
        if msg.hedge || p.outstanding > 0 {
            return; // a hedge that found no node: the first attempt goes on
        }
        p.state = State::Ready;
        self.in_flight -= 1;
        self.queued += 1;
        self.ready.push_front(msg.seq);
        if let Gate::Reject(r) = self.gate.clone() {
            self.reject(msg.seq, r, ctx);
        }
    }

    /// Reject every ready task (the gate closed).
    fn reject_ready(&mut self, reason: Rejection, ctx: &mut Context<Self>) {
        while let Some(seq) = self.ready.pop_front() {
            if self
                .tasks
                .get(&seq)
                .is_some_and(|p| p.state == State::Ready)
            {
                self.reject(seq, reason.clone(), ctx);
            }
        }
    }

    fn send_hedge(&mut self, seq: Seq, now: Instant) {
        let Some(p) = self.tasks.get_mut(&seq) else {
            return;
        };
        if p.hedged || p.outstanding != 1 {
            return;
        }
        if !self.budget.try_withdraw(now) {
            return;
        }
        p.hedged = true;
        p.outstanding += 1;
        self.counters.hedged += 1;
        let route = Route {
            seq,
            job: p.job.clone(),
            avoid: p.avoid.clone(),
            hedge: true,
            at: now,
        };
        self.balancer().do_send(route);
    }

    fn stats(&self) -> QueueStats {
        QueueStats {
            queued: self.queued as u64,
            in_flight: self.in_flight as u64,
            waiting: self.waiting.len() as u64,
            submitted: self.counters.submitted,
            succeeded: self.counters.succeeded,
            failed: self.counters.failed,
            rejected: self.counters.rejected,
            retried: self.counters.retried,
            fallbacks: self.counters.fallbacks,
            hedged: self.counters.hedged,
            peak_queued: self.counters.peak_queued as u64,
            capacity: self.cfg.queue.capacity as u64,
            retry_budget_left: self
                .budget
                .remaining(self.clock.unwrap_or_else(Instant::now))
                as u64,
            gate: match &self.gate {
                Gate::Open => None,
                Gate::Reject(r) => Some(r.to_string()),
            },
        }
    }
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
            act.sweep_lost(ctx)
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
        let checked = if task.service() == &*self.service {
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
                self.submit(
                    Submit {
                        job: Arc::new(job),
                        reply: tx,
                        wait: false,
                    },
                    ctx,
                );
                Box::pin(crate::dispatcher::Submission::waiting(rx, id, service, now))
            }
            Err((id, reason)) => {
                self.counters.submitted += 1;
                self.counters.rejected += 1;
                Box::pin(crate::dispatcher::Submission::ready(
                    crate::dispatcher::rejected(id, service, Rejection::InvalidTask(reason), now),
                ))
            }
        }
    }
}

/// A new task from the dispatcher.
impl Handler<Submit> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Self::Context) {
        self.tick(Some(msg.job.submitted));
        self.submit(msg, ctx);
    }
}

/// The balancer can take more tasks.
impl Handler<Credit> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Credit, ctx: &mut Self::Context) {
        self.tick(None);
        self.credit += msg.0;
        self.pump(ctx);
    }
}

/// The balancer opened or closed the gate.
impl Handler<SetGate> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: SetGate, ctx: &mut Self::Context) {
        self.tick(None);
        self.gate = msg.0;
        match self.gate.clone() {
            Gate::Open => self.pump(ctx),
            Gate::Reject(r) => {
                self.reject_ready(r.clone(), ctx);
                while let Some(w) = self.waiting.pop_front() {
                    let now = self.now();
                    self.reject_new(w, r.clone(), now);
                }
                self.check_drained();
            }
        }
    }
}

/// What became of a routed task: an attempt ended, or it bounced.
impl Handler<Answer> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Answer, ctx: &mut Self::Context) {
        match msg {
            Answer::Done(done) => {
                self.tick(Some(done.at));
                self.credit += done.credit;
                self.on_attempt(done, ctx);
            }
            Answer::Bounce(b) => {
                self.tick(None);
                self.credit += b.credit;
                self.on_bounce(b, ctx);
            }
        }
        self.pump(ctx);
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

/// Refuses every later task.
impl Handler<CloseIntake> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseIntake, _ctx: &mut Self::Context) {
        self.tick(None);
        self.closed = true;
        let now = self.now();
        while let Some(w) = self.waiting.pop_front() {
            self.reject_new(w, Rejection::ShuttingDown, now);
        }
        self.check_drained();
    }
}

/// Resolves once every task is answered.
impl Handler<Drain> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Drain, _ctx: &mut Self::Context) {
        self.tick(None);
        self.drains.push(msg.reply);
        self.check_drained();
    }
}

/// Answers everything left `ShuttingDown` and hands the tasks back.
impl Handler<Abort> for QueueActor {
    type Result = MessageResult<Abort>;

    fn handle(&mut self, _msg: Abort, ctx: &mut Self::Context) -> Self::Result {
        self.tick(None);
        self.closed = true;
        let mut seqs: Vec<Seq> = self.tasks.keys().copied().collect();
        seqs.sort_unstable();
        let mut left = Vec::with_capacity(seqs.len());
        for seq in seqs {
            if let Some(p) = self.tasks.get(&seq) {
                left.push(Unfinished {
                    id: p.job.id,
                    service: self.service.to_string(),
                    task: p.job.task.clone(),
                    attempts: p.attempts.clone(),
                    was_in_flight: p.state == State::InFlight,
                });
            }
            self.reject(seq, Rejection::ShuttingDown, ctx);
        }
        let now = self.now();
        while let Some(w) = self.waiting.pop_front() {
            self.reject_new(w, Rejection::ShuttingDown, now);
        }
        self.check_drained();
        MessageResult(left)
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
