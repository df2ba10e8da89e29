//! Answers: the balancer's news (an attempt's report, a bounce, a
//! placement, credit and the gate), and `finish`, which makes the result
//! of every task the table held (a new task refused at once is answered
//! in `intake`). When a task's last attempt out ends without a success the
//! retry policy ([`crate::algo::policy`]) decides.

use std::sync::Arc;

use super::dispatch::list_cancelled_twin;
use super::table::{LastFailure, Pending};
use super::{QueueCore, State, TaskNo, Timer};
use crate::actors::protocol::{AttemptReport, BalancerTurn, Gate, NodeId, Seq, ToQueue};
use crate::algo::policy::{Decision, Ended};
use crate::algo::time;
use crate::outcome::{
    Attempt, AttemptOutcome, ErrorKind, FailReason, Failure, Outcome, Rejection, Response,
    TaskResult,
};

impl QueueCore {
    /// The current round's task for an answer, or `None` if the answer is
    /// stale (the task is answered already, or it names an earlier round).
    pub(super) fn current(&mut self, seq: Seq) -> Option<&mut Pending> {
        self.tasks
            .get_mut(&seq.task)
            .filter(|p| p.state() == State::InFlight && p.round == seq.round && p.outstanding > 0)
    }

    /// Attempt `seq` (`hedge`) at `node` ended with `r`.
    pub(super) fn on_attempt(
        &mut self,
        seq: Seq,
        hedge: bool,
        (node, address): (NodeId, &Arc<str>),
        r: AttemptReport,
    ) {
        let no = seq.task;
        let Some(p) = self.current(seq) else {
            return; // answered already, or a late answer of an earlier round
        };
        p.outstanding -= 1;
        if let Some(race) = p.race_mut().filter(|r| r.round == seq.round) {
            if hedge {
                race.hedge_done = true;
            } else {
                race.first_done = true;
            }
        }
        if p.attempts.capacity() == 0 {
            // Most tasks make one attempt: room for just that one.
            p.attempts = Vec::with_capacity(1);
        }
        p.attempts.push(Attempt {
            node: address.clone(),
            outcome: r.outcome,
            latency: r.latency,
            hedge,
            protocol: r.reply.as_ref().and_then(|rep| rep.protocol),
            error: r.detail,
        });
        let mut stream = r.stream;
        let response = r.reply.map(|rep| Response {
            status: rep.status,
            headers: rep.headers,
            body: rep.body,
            node: address.clone(),
            stream: stream.take(),
        });
        if !r.outcome.is_success() && p.job().reply.is_abandoned() {
            // The caller left: no retry and no wait for a twin (its node
            // is told to cancel it); nobody hears this answer.
            self.counts.cancelled();
            return self.finish(no, Outcome::Rejected(Rejection::Cancelled));
        }
        if r.outcome.is_success() {
            // Recent latencies serve a hedge's percentile and the check
            // that a task's time left is worth an attempt (a due time from
            // `queue.slo` as from a deadline).
            // (A lease's hand-out is no request: it would pull them to zero.)
            if p.job().task.lease().is_none()
                && (p.job().deadline.is_some()
                    || self.cfg.queue.slo.is_some()
                    || matches!(
                        self.cfg.hedge,
                        Some(crate::config::HedgeAfter::Percentile(_))
                    ))
            {
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
            return self.finish(no, outcome);
        }
        if r.outcome != AttemptOutcome::Error(ErrorKind::Cancelled) {
            p.round_failed = true;
            let last = p.rare_mut().last.get_or_insert_with(|| LastFailure {
                outcome: r.outcome,
                response: None,
                retry_after: None,
                avoid: Vec::new(),
                exclude: Vec::new(),
                retries: 0,
            });
            last.outcome = r.outcome;
            last.response = response;
            last.retry_after = r.retry_after;
            if !last.avoid.contains(&node) {
                last.avoid.push(node);
            }
            // A failed handshake fails again: never this node for this task.
            if r.outcome == AttemptOutcome::Error(ErrorKind::Tls) && !last.exclude.contains(&node) {
                last.exclude.push(node);
            }
        }
        if p.outstanding == 0 {
            self.round_ended(no);
        }
    }

    /// Task `no`'s last outstanding attempt ended without a success (by an
    /// answer, a bounce, the watchdog or a cancel): the policy decides.
    pub(super) fn round_ended(&mut self, no: TaskNo) {
        let now = self.now();
        let Some(p) = self.tasks.get_mut(&no) else {
            return;
        };
        let last = p.last().filter(|_| p.round_failed);
        let Some(last) = last else {
            // No attempt of this round failed (it bounced): back to the front.
            self.tasks.bounce(no);
            if let Some(r) = self.gate.rejection(now) {
                self.reject(no, r);
            }
            return;
        };
        let ended = Ended {
            last: last.outcome,
            retry_after: last.retry_after,
            retries: last.retries,
            idempotent: p.job().idempotent,
            deadline: p.job().deadline,
        };
        match self.policy.decide(&ended, now, &mut self.rng) {
            Decision::Fail(reason) => {
                if reason == FailReason::BudgetExhausted {
                    self.counts.budget_exhausted();
                }
                if reason == FailReason::BudgetExhausted && !self.budget_exhausted {
                    self.budget_exhausted = true;
                    log::warn!(
                        "service {}: retry budget exhausted; failing tasks instead of retrying",
                        self.service
                    );
                }
                self.fail(no, reason)
            }
            Decision::Retry { after } => {
                if self.budget_exhausted {
                    self.budget_exhausted = false;
                    log::info!("service {}: retry budget available again", self.service);
                }
                let retries = ended.retries.saturating_add(1);
                if let Some(last) = p.last_mut() {
                    last.retries = retries;
                }
                // A retry starts a new round from scratch: the failure that
                // caused it is kept for the answer if the retry fails too.
                log::debug!(
                    "service {}: task {} retry {} in {:?} after {}",
                    self.service,
                    p.job().id,
                    retries,
                    after,
                    ended.last
                );
                self.counts.retried();
                p.hedged = false;
                self.tasks.back_off(no);
                self.push_timer(time::add(now, after), no, Timer::Due);
            }
        }
    }

    pub(super) fn fail(&mut self, no: TaskNo, reason: FailReason) {
        let last = self
            .tasks
            .get_mut(&no)
            .and_then(|p| p.rare.as_mut()?.last.take());
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
        );
    }

    pub(super) fn finish_deadline(&mut self, no: TaskNo) {
        let tried = self.tasks.get(&no).is_some_and(|p| !p.attempts.is_empty());
        if tried {
            self.fail(no, FailReason::DeadlineExceeded);
        } else {
            self.reject(no, Rejection::DeadlinePassed);
        }
    }

    /// Answers task `no` and forgets it. The only place a held task's
    /// result is made (into the output, which the actor sends).
    pub(super) fn finish(&mut self, no: TaskNo, outcome: Outcome) {
        let now = self.now();
        let Some(mut p) = self.tasks.remove(no) else {
            return;
        };
        // Its body's bytes are free again.
        p.bytes = None;
        let outstanding = p.state() == State::InFlight && p.outstanding > 0;
        if outstanding {
            list_cancelled_twin(&mut p, now, &self.epoch);
        }
        let total = now.saturating_duration_since(p.job().submitted);
        // A waiting task is counted as submitted when it is answered.
        self.counts
            .answered(&outcome, total, p.state() == State::Waiting);
        let result = TaskResult {
            id: p.job().id,
            service: self.service.clone(),
            outcome,
            attempts: std::mem::take(&mut p.attempts),
            total,
        };
        let round = p.round;
        self.out.results.push((p.task, Box::new(result)));
        if outstanding && self.cfg.hedge.is_some() {
            // A hedged twin is still out: tell its node it lost.
            self.out.turn.cancels.push(Seq { task: no, round });
        }
        self.check_drained();
    }
}

impl QueueCore {
    /// One turn of the balancer: its news taken in order, then one pump.
    /// An answer counts from when its attempts ended, the rest from the
    /// turn's arrival.
    pub(super) fn turn(&mut self, turn: BalancerTurn) {
        let now = self.now();
        for news in turn.0 {
            self.take_news(news, now);
        }
        self.pump();
    }

    /// Takes one piece of the balancer's news in (the caller pumps).
    fn take_news(&mut self, news: ToQueue, now: tokio::time::Instant) {
        match news {
            ToQueue::Ended(a) => {
                self.tick(a.at);
                for d in a.done {
                    self.on_attempt(d.seq, d.hedge, (a.node, &a.address), d.report);
                }
            }
            ToQueue::Bounce {
                seq,
                hedge,
                refused,
            } => {
                self.tick(now);
                self.on_bounce(seq, hedge, refused);
            }
            ToQueue::Placed(p) => {
                self.tick(now);
                self.on_placed(p);
            }
            ToQueue::Room(room) => {
                // Routes spent on this credit are decided now, not at the
                // time an answer before it ended (the balancer checks its
                // buckets at the route's time).
                self.tick(now);
                self.credit.receive(room.credit, room.reserve);
                self.room_latency = room.room_latency;
                if let Some(gate) = room.gate {
                    self.set_gate(gate);
                }
            }
        }
    }

    /// The balancer opened or closed the gate.
    fn set_gate(&mut self, gate: Gate) {
        if self.dead {
            return;
        }
        self.gate = gate;
        if let Some(r) = self.gate.rejection(self.now()) {
            self.reject_ready(r.clone());
            while let Some(no) = self.tasks.next_waiting() {
                self.reject(no, r.clone());
            }
            self.check_drained();
        }
    }
}
