//! Time: the queue's single actix timer over its [`TimerStore`] (backoffs,
//! deadlines, hedges), and the watchdog that answers attempts lost with
//! their node.

use super::*;

impl QueueActor {
    pub(super) fn push_timer(
        &mut self,
        at: Instant,
        no: TaskNo,
        kind: Timer,
        ctx: &mut Context<Self>,
    ) {
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

    pub(super) fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let delay = at.saturating_duration_since(Instant::now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.tick(None);
            act.guarded(ctx, |act, ctx| act.on_timer(ctx));
        });
        self.timer = Some((at, h));
    }

    pub(super) fn on_timer(&mut self, ctx: &mut Context<Self>) {
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
                    if let Gate::Reject(r) = self.gate.clone() {
                        self.reject(no, r, ctx);
                    }
                }
                Timer::Deadline if state != State::InFlight => {
                    self.finish_deadline(no, ctx);
                }
                Timer::Hedge(g) if state == State::InFlight && round == g => {
                    self.send_hedge(no, now);
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
    pub(super) fn sweep_lost(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        let lost: Vec<(Seq, u8)> = self
            .tasks
            .iter()
            .filter(|(_, p)| {
                p.state() == State::InFlight
                    && super::dispatch::watchdog_at(p, &self.cfg, &self.epoch) <= now
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
                self.out.lost.push(seq);
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
                self.on_attempt(seq, false, (NodeId(u32::MAX), &unknown), report, ctx);
            }
        }
        self.pump(ctx);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
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
pub(super) fn timer_live(tasks: &TaskTable, no: &TaskNo, kind: &Timer) -> bool {
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
