//! Intake: a new task enters the map (ready, or waiting in the bounded wait
//! list), or is answered at once (closed, past its deadline, gate shut,
//! queue and wait list full, shed at intake): its result goes to the
//! output without entering the table.

use std::sync::Arc;

use tokio::time::Instant;

use super::table::Pending;
use super::{QueueCore, TaskNo, Timer};
use crate::actors::protocol::Submit;
use crate::algo::priority::Priority;
use crate::config::OnFull;
use crate::metrics::Shed;
use crate::outcome::{Outcome, Rejection, Response, TaskResult};

impl QueueCore {
    /// Whether a new task would join the queue (rather than wait or be
    /// refused for room).
    pub fn has_room(&self) -> bool {
        let c = self.tasks.counts();
        c.queued < self.cfg.queue.capacity && c.waiting == 0
    }

    /// Takes one task in without handing anything over: true if it joined
    /// the ready tasks (a pump is then due).
    pub(super) fn take(&mut self, msg: Submit) -> bool {
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
        if let Some(r) = self.gate.rejection(now) {
            self.reject_new(msg, r, now);
            return false;
        }
        if let Err(retry_after) = self.tenant_rate(msg.task.job(), flow, now) {
            // Over its tenant's rate (`tenants.rate`).
            self.reject_new(msg, Rejection::rate_limited(retry_after), now);
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
        // A full queue with no line of waiting tasks makes room for a more
        // important task: the oldest ready task of a lower class goes.
        if !self.has_room() && self.tasks.counts().waiting == 0 {
            if let Some(victim) = self.tasks.displaceable(class, flow) {
                self.shed(victim, Shed::Displaced, now);
            }
        }
        if !self.has_room() {
            let wait = msg.wait || self.cfg.queue.on_full == OnFull::Wait;
            // The wait list is bounded too (`queue.max_waiting`).
            if wait && self.tasks.counts().waiting < self.cfg.queue.max_waiting {
                self.enter(msg, true);
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
        self.enter(msg, false);
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
            true => self.credit.in_hand(),
            false => self.credit.beyond_reserve(),
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

    /// Puts a new task in the table, waiting or ready (and its deadline in
    /// the timers).
    pub(super) fn enter(&mut self, msg: Submit, waiting: bool) -> TaskNo {
        let now = self.now();
        let deadline = msg.task.job().deadline;
        let held = self.bytes.hold(msg.task.job().task.body_bytes().len());
        let mut p = Pending::new(msg.task, self.epoch.stamp(now));
        p.patient = msg.wait;
        p.bytes = Some(held);
        let no = self.tasks.enter(p, waiting);
        if let Some(d) = deadline {
            self.push_timer(d, no, Timer::Deadline);
        }
        no
    }

    /// A task joined the queue (new, or leaving the wait list).
    fn submitted(&mut self) {
        self.counts.joined(self.tasks.counts().queued);
    }

    /// Answers a task that never entered the queue.
    pub(super) fn reject_new(&mut self, msg: Submit, reason: Rejection, now: Instant) {
        self.count_tenant_shed(msg.task.job(), &reason);
        let outcome = self.rejection_outcome(reason);
        let total = now.saturating_duration_since(msg.task.job().submitted);
        self.counts.answered(&outcome, total, true);
        let result = TaskResult {
            id: msg.task.job().id,
            service: self.service.clone(),
            outcome,
            attempts: Vec::new(),
            total,
        };
        self.out.results.push((msg.task, Box::new(result)));
    }

    /// Answers task `no` with a rejection (or the fallback).
    pub(super) fn reject(&mut self, no: TaskNo, reason: Rejection) {
        self.count_queued_shed(no, &reason);
        let outcome = self.rejection_outcome(reason);
        self.finish(no, outcome);
    }

    /// A rejection, or the fallback response when one is configured for it.
    /// Counts fallbacks; the rejection itself is counted where it is sent.
    pub(super) fn rejection_outcome(&mut self, reason: Rejection) -> Outcome {
        match (&self.cfg.fallback, &reason) {
            (Some(f), Rejection::CircuitOpen { .. } | Rejection::RateLimited { .. }) => {
                self.counts.fallback();
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

    /// Lets waiting tasks in, in order, while there is room.
    pub(super) fn admit_waiting(&mut self) {
        while self.tasks.counts().queued < self.cfg.queue.capacity {
            if self.tasks.admit_waiting().is_none() {
                break;
            }
            self.submitted();
        }
        let c = self.tasks.counts();
        if self.full && c.queued < self.cfg.queue.capacity && c.waiting == 0 {
            self.full = false;
            log::info!("service {}: queue has room again", self.service);
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

impl QueueCore {
    /// Counts a task refused before it was made a job (invalid), whose
    /// result the caller already has.
    pub fn refused_invalid(&mut self, result: &TaskResult) {
        self.counts.answered(&result.outcome, result.total, true);
    }
}
