//! Time: the queue's timers in its [`TimerStore`] (backoffs, deadlines,
//! hedges, the delay control's sweep), of which the output names the
//! earliest for the actor's one timer, and the watchdog that answers
//! attempts lost with their node.
//!
//! [`TimerStore`]: crate::actors::timers::TimerStore

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::table::{Epoch, Pending, TaskTable};
use super::{QueueCore, State, TaskNo};
use crate::actors::protocol::{AttemptReport, NodeId, Seq};
use crate::algo::time;
use crate::config::ServiceConfig;
use crate::outcome::{AttemptOutcome, ErrorKind};

impl QueueCore {
    /// Sets a timer of `kind` for task `no` at `at`; the output's `wake`
    /// says when it is the earliest.
    pub(super) fn push_timer(&mut self, at: Instant, no: TaskNo, kind: Timer) {
        let tasks = &self.tasks;
        // At most three timers per task can be live (deadline, backoff, hedge).
        self.timers
            .compact_if_needed(tasks.len().saturating_mul(3), |no, kind| {
                timer_live(tasks, no, kind)
            });
        if self.timers.push(at, no, kind) {
            self.wake_by(at);
        }
    }

    /// Notes in the output that a timer must fire by `at`.
    fn wake_by(&mut self, at: Instant) {
        if self.out.wake.is_none_or(|t| at < t) {
            self.out.wake = Some(at);
        }
    }

    /// The timers due now fire (the actor's timer fired); then a pump.
    pub(super) fn fire_timers(&mut self) {
        let now = self.now();
        while let Some((no, kind)) = self.timers.pop_due(now) {
            let Some((state, round)) = self.tasks.get(&no).map(|p| (p.state(), p.round)) else {
                continue;
            };
            match kind {
                Timer::Due if self.tasks.backoff_over(no) => {
                    // Its wait in the queue counts from now.
                    let stamp = self.epoch.stamp(now);
                    if let Some(p) = self.tasks.get_mut(&no) {
                        p.sent_at = stamp;
                    }
                    if let Some(r) = self.gate.rejection(now) {
                        self.reject(no, r);
                    }
                }
                Timer::Deadline if state != State::InFlight => {
                    self.finish_deadline(no);
                }
                Timer::Hedge(g) if state == State::InFlight && round == g => {
                    self.send_hedge(no, now);
                }
                _ => {}
            }
        }
        // The actor's timer fired: it is set again for the next entry.
        if let Some(at) = self.timers.next() {
            self.wake_by(at);
        }
        self.pump();
    }

    /// The watchdog: answers attempts that never reported back (their node
    /// actor died with them) as `Lost`, so no task waits forever. Attempts
    /// are bounded by their own timeout at the node, so this only fires on
    /// a fault; it sweeps once a second instead of keeping a timer per task.
    pub(super) fn sweep_lost(&mut self) {
        let now = self.now();
        let lost: Vec<(Seq, u8)> = self
            .tasks
            .iter()
            .filter(|(_, p)| {
                p.state() == State::InFlight && watchdog_at(p, &self.cfg, &self.epoch) <= now
            })
            .map(|(no, p)| {
                let seq = Seq {
                    task: no,
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
                    p.job().id
                );
            }
            for _ in 0..outstanding {
                // The balancer frees the slot each lost attempt held.
                self.out.turn.lost.push(seq);
                let unknown: Arc<str> = "unknown".into();
                let latency = now.saturating_duration_since(
                    self.tasks
                        .get(&seq.task)
                        .map_or(now, |p| self.epoch.at(p.sent_at)),
                );
                let report = AttemptReport {
                    outcome: AttemptOutcome::Error(ErrorKind::Lost),
                    latency,
                    reply: None,
                    retry_after: None,
                    detail: None,
                    stream: None,
                };
                self.on_attempt(seq, false, (NodeId(u32::MAX), &unknown), report);
            }
        }
        self.pump();
    }
}

/// What a timer entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::actors::queue) enum Timer {
    /// Backoff over: back to the ready queue.
    Due,
    /// The task's deadline.
    Deadline,
    /// Time to send a hedged attempt (round).
    Hedge(u32),
    /// The delay control's next decision (a shed, or entering overload)
    /// while no news wakes the queue; set on the oldest ready task.
    Sweep,
}

/// Whether a timer entry can still fire for its task.
fn timer_live(tasks: &TaskTable, no: &TaskNo, kind: &Timer) -> bool {
    let Some(p) = tasks.get(no) else {
        return false;
    };
    match kind {
        Timer::Due => p.state() == State::Backoff,
        Timer::Deadline => p.job().deadline.is_some(),
        Timer::Hedge(g) => p.state() == State::InFlight && p.round == *g,
        Timer::Sweep => p.state() == State::Ready,
    }
}

/// When an attempt of `p` sent at `p.sent_at` should have reported, at the
/// latest. Generous: an attempt's own timeout starts at its node, after any
/// mailbox wait; the watchdog is only for attempts lost with their node.
/// (Computed at each once-a-second sweep rather than kept per task.)
fn watchdog_at(p: &Pending, cfg: &ServiceConfig, epoch: &Epoch) -> Instant {
    let timeout = p.job().task.attempt_timeout().unwrap_or(cfg.timeout);
    let grace = time::sum(timeout, timeout.max(Duration::from_secs(5)));
    time::add(epoch.at(p.sent_at), grace)
}
