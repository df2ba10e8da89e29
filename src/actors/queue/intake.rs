//! Intake: a new task enters the map (ready, or parked in the bounded wait
//! list), or is answered at once (closed, past its deadline, gate shut,
//! queue and wait list full).

use super::*;
use crate::algo::priority::Priority;
use crate::metrics::Shed;

impl QueueActor {
    /// Takes one task in and hands over what credit allows.
    pub(super) fn submit(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        if self.take_in(msg, ctx) {
            self.pump(ctx);
        }
    }

    /// Whether a new task would join the queue (rather than wait or be
    /// refused for room).
    pub(super) fn has_room(&self) -> bool {
        let c = self.tasks.counts();
        c.queued < self.cfg.queue.capacity && c.parked == 0
    }

    /// Takes one task in without handing anything over: true if it joined
    /// the ready tasks (a pump is then due).
    pub(super) fn take_in(&mut self, msg: Submit, ctx: &mut Context<Self>) -> bool {
        let now = self.now();
        let flow = self.offered(msg.task.job());
        if self.closed {
            self.reject_new(msg, Rejection::ShuttingDown, now);
            return false;
        }
        if msg.task.job().deadline.is_some_and(|d| d <= now) {
            self.reject_new(msg, Rejection::DeadlinePassed, now);
            return false;
        }
        if let Gate::Reject(r) = &self.gate {
            let r = r.clone();
            self.reject_new(msg, r, now);
            return false;
        }
        if !self.bytes.admits(msg.task.job().task.body_bytes().len()) {
            // `queue.max_bytes`: the bodies held would pass the bound.
            self.reject_new(msg, Rejection::QueueFull, now);
            return false;
        }
        let class = msg.task.job().priority;
        self.classes.seen(class, now);
        self.due.on_arrival();
        // A full queue with no line of parked tasks makes room for a more
        // important task: the oldest ready task of a lower class goes.
        if !self.has_room() && self.tasks.counts().parked == 0 {
            if let Some(victim) = self.tasks.displaceable(class, flow) {
                self.shed(victim, Shed::Displaced, now, ctx);
            }
        }
        if !self.has_room() {
            let wait = msg.wait || self.cfg.queue.on_full == OnFull::Wait;
            // The wait list is bounded too (`queue.max_waiting`).
            if wait && self.tasks.counts().parked < self.cfg.queue.max_waiting {
                self.enter(msg, true, ctx);
                return false;
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
            self.reject_new(msg, Rejection::QueueFull, now);
            return false;
        }
        if let Some(due) = self.due_of(msg.task.job()).filter(|_| !msg.wait) {
            self.due
                .on_due(due.saturating_duration_since(msg.task.job().submitted));
            if !crate::algo::deadline::DeadlineControl::servable(due, self.expected_latency(), now)
            {
                // Too late even with nothing ahead: no overload of ours.
                self.reject_new(msg, Rejection::DeadlinePassed, now);
                return false;
            }
            if self.refused_for_time(class, flow, due, now) {
                self.shed_for_time(now);
                let reason = self.overloaded(class, Shed::Intake, now);
                self.reject_new(msg, reason, now);
                return false;
            }
        }
        if !msg.wait && self.refuses_at_intake(class, flow, now) {
            let reason = self.overloaded(class, Shed::Intake, now);
            self.reject_new(msg, reason, now);
            return false;
        }
        self.enter(msg, false, ctx);
        self.submitted();
        true
    }

    /// Whether the delay control refuses a new task of `class` at once: the
    /// service is overloaded and more ready tasks are ahead of it (its class
    /// and the more important ones, less what the credit in hand sends now)
    /// than the queue sends within half the target, or more of its own
    /// class than that class is sent in that time (within the interval,
    /// for both, when less important tasks wait or were just shed: they go
    /// first), so it would only wait to be shed.
    fn refuses_at_intake(
        &mut self,
        class: Priority,
        flow: crate::algo::fair::Flow,
        now: Instant,
    ) -> bool {
        let c = self.tasks.counts();
        // The headroom in hand is only the top class's, while nothing
        // below it waits.
        let credit = match self.classes.may_take_headroom(class, |t| c.shields(t), now) {
            true => self.credit,
            false => self.credit.saturating_sub(self.reserve),
        };
        let Some(d) = self.delay.as_mut().filter(|d| d.overloaded_at(now)) else {
            return false;
        };
        // Of its own class, those its tenant's turns leave ahead of it.
        let own = self
            .tasks
            .ahead_in_class(class, flow, crate::algo::codel::Order::Fifo);
        let ahead = (c.ready_from(class) - c.ready_in[class.index()] + own).saturating_sub(credit);
        let of_class = own.saturating_sub(credit);
        let shielded = super::dispatch::shielded(&c, &self.shed_at, class, now, d);
        !d.admits_in(class, ahead, of_class, now, shielded)
    }

    /// Puts a new task in the table, parked or ready (and its deadline in
    /// the timers).
    pub(super) fn enter(&mut self, msg: Submit, parked: bool, ctx: &mut Context<Self>) -> TaskNo {
        let now = self.now();
        let deadline = msg.task.job().deadline;
        self.bytes.add(msg.task.job().task.body_bytes().len());
        let mut p = Pending::new(msg.task, self.epoch.stamp(now));
        p.patient = msg.wait;
        let no = self.tasks.enter(p, parked);
        if let Some(d) = deadline {
            self.push_timer(d, no, Timer::Deadline, ctx);
        }
        no
    }

    /// A task joined the queue (new, or leaving the wait list).
    fn submitted(&mut self) {
        self.counters.submitted += 1;
        let queued = self.tasks.counts().queued;
        self.counters.peak_queued = self.counters.peak_queued.max(queued);
    }

    /// Answers a task that never entered the queue.
    pub(super) fn reject_new(&mut self, msg: Submit, reason: Rejection, now: Instant) {
        self.counters.submitted += 1;
        self.counters.rejected += 1;
        self.count_tenant_shed(msg.task.job(), &reason);
        let outcome = self.rejection_outcome(reason);
        let total = now.saturating_duration_since(msg.task.job().submitted);
        self.metrics.task_finished(&outcome, total);
        let result = TaskResult {
            id: msg.task.job().id,
            service: self.service.clone(),
            outcome,
            attempts: Vec::new(),
            total,
        };
        msg.task.send(Box::new(result));
    }

    /// Answers task `no` with a rejection (or the fallback).
    pub(super) fn reject(&mut self, no: TaskNo, reason: Rejection, ctx: &mut Context<Self>) {
        self.count_queued_shed(no, &reason);
        let outcome = self.rejection_outcome(reason);
        self.finish(no, outcome, ctx);
    }

    /// A rejection, or the fallback response when one is configured for it.
    /// Counts fallbacks; the rejection itself is counted where it is sent.
    pub(super) fn rejection_outcome(&mut self, reason: Rejection) -> Outcome {
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
    pub(super) fn admit_waiting(&mut self) {
        while self.tasks.counts().queued < self.cfg.queue.capacity {
            if self.tasks.admit_parked().is_none() {
                break;
            }
            self.submitted();
        }
        let c = self.tasks.counts();
        if self.full && c.queued < self.cfg.queue.capacity && c.parked == 0 {
            self.full = false;
            log::info!("service {}: queue has room again", self.service);
        }
    }
}

/// The configured fallback headers (checked at config load).
pub(super) fn fallback_headers(f: &crate::config::FallbackConfig) -> awc::http::header::HeaderMap {
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

/// A task sent straight to the queue's address.
impl Handler<Task> for QueueActor {
    type Result = ResponseFuture<TaskResult>;

    fn handle(&mut self, task: Task, ctx: &mut Self::Context) -> Self::Result {
        self.tick(None);
        let now = self.now();
        let id = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
                let job = Arc::new(job);
                let submission = crate::task::Submission::waiting(job.clone(), service);
                let msg = Submit {
                    task: ReplyTx::new(job),
                    wait: false,
                };
                self.guarded(ctx, |act, ctx| act.submit(msg, ctx));
                Box::pin(submission)
            }
            Err((id, reason)) => {
                self.counters.submitted += 1;
                self.counters.rejected += 1;
                let result =
                    crate::task::rejected(id, service, Rejection::InvalidTask(reason), now);
                self.metrics.task_finished(&result.outcome, result.total);
                Box::pin(crate::task::Submission::ready(result))
            }
        }
    }
}

/// Takes every submit of the inbox, in order, and hands them over in one
/// pump (one route list to the balancer), or sooner if the queue runs out
/// of room, so that a burst is refused no more than single submits would be.
impl Handler<InboxReady> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: InboxReady, ctx: &mut Self::Context) {
        let mut batch = std::mem::take(&mut self.intake_spare);
        self.inbox.take_into(&mut batch);
        let mut due = false;
        for msg in batch.drain(..) {
            self.tick(Some(msg.task.job().submitted));
            self.guarded(ctx, |act, ctx| {
                if due && !act.has_room() {
                    act.pump(ctx);
                    due = false;
                }
                due |= act.take_in(msg, ctx);
            });
        }
        if due {
            self.guarded(ctx, |act, ctx| act.pump(ctx));
        }
        // Keep a small list for the next burst; give a big one back.
        if batch.capacity() <= 1024 {
            self.intake_spare = batch;
        }
    }
}
