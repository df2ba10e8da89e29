//! Handing over: ready tasks go to the balancer while there is credit; a
//! task due sooner than the quickest node with room ends it is held until
//! a room is quick enough (then it goes first); a hedge is sent when its
//! timer fires; a bounce puts a task back.

use std::time::Duration;

use tokio::time::Instant;

use super::table::{Counts, Epoch, Pending, Race};
use super::{QueueCore, TaskNo, Timer};
use crate::actors::hedge::LatencyWindow;
use crate::actors::protocol::{Gate, Placed, Route, Seq};
use crate::algo::codel::{Order, Transition, Verdict};
use crate::algo::priority::Priority;
use crate::algo::time;
use crate::config::ServiceConfig;
use crate::metrics::Shed;
use crate::outcome::{Attempt, AttemptOutcome, ErrorKind, FailReason, Outcome, Rejection};
use crate::task::Job;

impl QueueCore {
    /// Sends ready tasks to the balancer while there is credit: all of
    /// them in the turn's one message to the balancer.
    pub(super) fn pump(&mut self) {
        if self.tasks.counts().waiting > 0 {
            self.admit_waiting();
        }
        let now = self.now();
        let credit = self.credit.in_hand();
        if self.out.turn.routes.capacity() == 0 && credit > 1 {
            // The list went out with the last turn: room for this one.
            self.out
                .turn
                .routes
                .reserve_exact(credit.min(self.tasks.ready_listed()).min(MAX_BATCH));
        }
        // Newest first only while no caller waits on purpose
        // (`newest_first_allowed`: a durable stream's entry, say).
        let c = self.tasks.counts();
        let lifo = self.newest_first_allowed()
            && (self.due_lifo(now)
                || self
                    .delay
                    .as_ref()
                    .is_some_and(|d| d.order(now, c.ready) == Order::Lifo));
        let order = if lifo { Order::Lifo } else { Order::Fifo };
        // Sends per class, for the delay control's intake bounds.
        let mut sent = [0u64; Priority::ALL.len()];
        while self.credit.in_hand() > 0 && self.gate == Gate::Open {
            // Credit beyond the reserve serves any class; the reserve only
            // the top class, and only while no lower class waits
            // (`algo::headroom`).
            let waits_below = |top| self.tasks.counts().shields(top);
            let Some(lowest) = self.classes.lowest(
                self.credit.in_hand(),
                self.credit.reserve(),
                waits_below,
                now,
            ) else {
                break;
            };
            // A task held back goes first once a room is quick enough for
            // it; those that can no longer be served in time are answered.
            self.sweep_held(now);
            let no = match self.held_fits(lowest, now) {
                true => self.tasks.take_held(),
                false => self.tasks.next_ready_within(order, lowest),
            };
            let Some(no) = no else {
                break;
            };
            let Some(p) = self.tasks.get(&no) else {
                continue;
            };
            if p.job().reply.is_abandoned() {
                // The caller left while it waited: never sent, no token
                // or slot spent on it.
                self.counts.cancelled();
                self.finish(no, Outcome::Rejected(Rejection::Cancelled));
                continue;
            }
            let deadline = p.job().deadline;
            if deadline.is_some_and(|d| d <= now) {
                self.finish_deadline(no);
                continue;
            }
            // Looked up once: most tasks have none, and pay for no more.
            let due = self.sheddable_due(p);
            if due.is_some_and(|d| self.unservable_by(d, now)) {
                self.drop_late(no, now);
                continue;
            }
            if self.sheds(no, now) {
                self.shed(no, Shed::QueueDelay, now);
                continue;
            }
            if deadline.is_some_and(|d| self.too_late(d, now)) {
                // Its time left is below what an attempt takes here: fail
                // it now, without spending a backend's time on it.
                self.fail(no, FailReason::DeadlineExceeded);
                continue;
            }
            if due.is_some_and(|d| self.waits_for_room(d, now)) {
                // Sent now, it would wait inside a backend past its due
                // time; another node may free a quicker room in time.
                self.tasks.hold(no);
                continue;
            }
            let Some(p) = self.tasks.send(no) else {
                continue;
            };
            let hedge_after = hedge_delay(&self.cfg, &self.latencies, p.job());
            p.outstanding = 1;
            p.round = p.round.wrapping_add(1);
            p.round_failed = false;
            p.sent_at = self.epoch.stamp(now);
            let round = p.round;
            if round == 1 {
                // The budget counts requests when they are first sent, not
                // when queued, so a deep queue neither floods nor starves it.
                self.policy.sent(now);
            }
            let class = p.job().priority;
            sent[class.index()] += 1;
            let route = Route {
                seq: Seq { task: no, round },
                job: p.job().clone(),
                avoid: p.avoid(),
                exclude: p.exclude(),
                hedge: false,
                headroom: self
                    .classes
                    .top(now)
                    .is_none_or(|t| class.index() <= t.index()),
                at: now,
                due,
            };
            self.credit.spend();
            self.out.turn.routes.push(route);
            if let Some(d) = hedge_after {
                self.push_timer(time::add(now, d), no, Timer::Hedge(round));
            }
        }
        if let Some(d) = self.delay.as_mut() {
            for (class, n) in Priority::ALL.into_iter().zip(sent) {
                if n > 0 {
                    d.on_sent_in(class, n, now);
                }
            }
        }
        if self.tasks.counts().waiting > 0 {
            self.admit_waiting();
        }
        self.deadline_turn(sent.iter().sum(), now);
        self.sweep_delayed(now);
        self.tasks.compact();
    }

    /// Whether the delay control sheds ready task `no` now (a sheltered one
    /// only past the interval).
    fn sheds(&mut self, no: TaskNo, now: Instant) -> bool {
        let Some(p) = self.tasks.get(&no) else {
            return false;
        };
        let (class, patient, enqueued) = (p.job().priority, p.patient, self.epoch.at(p.sent_at));
        // The strictest bound first: within it no task is shed, and most
        // are, so the shelter is worked out only for the others.
        let Some(strict) = self.delay.as_ref().and_then(|d| d.bound(now, false)) else {
            return false;
        };
        if patient || now.saturating_duration_since(enqueued) <= strict {
            return false;
        }
        let sheltered = self.sheltered(class, now);
        self.delay
            .as_mut()
            .is_some_and(|d| d.on_dequeue_for(enqueued, now, sheltered) == Verdict::Shed)
    }

    /// Whether the oldest ready task of `class` is sheltered from the
    /// target (its shed bound is the interval, see `Codel::on_dequeue_for`):
    /// it is shielded, or its class's queue is short, not standing at the
    /// rate the class is sent (more important tasks going first make it
    /// wait, not stand).
    fn sheltered(&self, class: Priority, now: Instant) -> bool {
        let Some(d) = self.delay.as_ref() else {
            return false;
        };
        let c = self.tasks.counts();
        shielded(&c, &self.shed_at, class, now, d)
            || !d.standing_in(class, now, c.ready_in[class.index()])
    }

    /// Answers ready task `no` `Overloaded`, shed for `why`.
    pub(super) fn shed(&mut self, no: TaskNo, why: Shed, now: Instant) {
        let Some(class) = self.tasks.get(&no).map(|p| p.job().priority) else {
            return;
        };
        let reason = self.overloaded(class, why, now);
        self.reject(no, reason);
    }

    /// Counts a shed of a task of `class` and gives its rejection.
    pub(super) fn overloaded(&mut self, class: Priority, why: Shed, now: Instant) -> Rejection {
        let retry_after = self
            .delay
            .as_ref()
            .map_or(DISPLACED_RETRY_AFTER, |d| d.retry_after(now));
        self.counts.shed(why, class);
        self.shed_at[class.index()] = Some(now);
        Rejection::Overloaded { retry_after }
    }

    /// Sheds from the oldest end of each class, least important first, what
    /// waited too long (under LIFO the oldest are never taken), then tells
    /// the delay control the queue's length and logs a change between calm
    /// and overload.
    fn sweep_delayed(&mut self, now: Instant) {
        if self.delay.is_none() {
            return;
        }
        for class in Priority::ALL.into_iter().rev() {
            while let Some(no) = self.tasks.oldest_ready_in(class) {
                if !self.sheds(no, now) {
                    break;
                }
                self.tasks.take_oldest_ready_in(class);
                self.shed(no, Shed::QueueDelay, now);
            }
        }
        let ready = self.tasks.counts().ready;
        let Some(d) = self.delay.as_mut() else {
            return;
        };
        match d.on_queue_len(ready, now) {
            Some(Transition::Entered) => log::warn!(
                "service {}: overloaded: the queue has not drained for {:?}; shedding tasks \
                 that waited over {:?}{}",
                self.service,
                d.config().interval,
                d.config().target,
                if d.config().lifo {
                    ", newest first"
                } else {
                    ""
                }
            ),
            Some(Transition::Left { lasted }) => log::info!(
                "service {}: overload over after {:?}; {} task(s) shed so far",
                self.service,
                lasted,
                self.counts.get().shed
            ),
            None => {}
        }
        self.arm_sweep(now);
    }

    /// Sets one timer for the delay control's next decision about the
    /// ready tasks (the oldest one's shed, or entering overload), so that
    /// a standing queue is shed on time even when no news wakes the queue
    /// (every node full with answers slow to come).
    fn arm_sweep(&mut self, now: Instant) {
        let Some(d) = self.delay.as_ref() else {
            return;
        };
        // The earliest shed among the classes' oldest tasks.
        let mut first: Option<(Instant, TaskNo)> = None;
        for class in Priority::ALL {
            let Some(no) = self.tasks.oldest_ready_in(class) else {
                continue;
            };
            let Some(p) = self.tasks.get(&no).filter(|p| !p.patient) else {
                continue;
            };
            if let Some(at) =
                d.expires_at_for(self.epoch.at(p.sent_at), now, self.sheltered(class, now))
            {
                if first.is_none_or(|(t, _)| at < t) {
                    first = Some((at, no));
                }
            }
        }
        let next = match (first.map(|f| f.0), d.next_change()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return,
            },
        };
        let Some(on) = first.map(|f| f.1).or_else(|| self.tasks.oldest_ready()) else {
            return;
        };
        // One entry per instant: the pump runs at every turn under load.
        if self.sweep_at.is_some_and(|t| t <= next && t > now) {
            return;
        }
        self.sweep_at = Some(next);
        self.push_timer(next.max(now), on, Timer::Sweep);
    }

    /// Whether a task with `deadline` has less time left than an attempt
    /// usually takes here (the 10th percentile of recent successes), so
    /// that sending it would only spend a backend's time on a late answer.
    fn too_late(&self, deadline: Instant, now: Instant) -> bool {
        self.latencies
            .percentile(10.0)
            .is_some_and(|p10| deadline.saturating_duration_since(now) < p10)
    }

    /// Answers the tasks held first while they can no longer be served
    /// in time (or their caller left).
    pub(super) fn sweep_held(&mut self, now: Instant) {
        while let Some(no) = self.tasks.held_front() {
            let Some(p) = self.tasks.get(&no) else {
                return;
            };
            if p.job().reply.is_abandoned() {
                self.tasks.take_held();
                self.counts.cancelled();
                self.finish(no, Outcome::Rejected(Rejection::Cancelled));
            } else if p.job().deadline.is_some_and(|d| d <= now) {
                self.tasks.take_held();
                self.finish_deadline(no);
            } else if self.unservable(no, now) {
                self.tasks.take_held();
                self.drop_late(no, now);
            } else {
                return;
            }
        }
    }

    /// Whether the task held first may be sent now: of a class the credit
    /// serves, and the quickest room ends it in time.
    fn held_fits(&mut self, lowest: Priority, now: Instant) -> bool {
        let Some(no) = self.tasks.held_front() else {
            return false;
        };
        self.tasks.get(&no).is_some_and(|p| {
            p.job().priority.index() <= lowest.index()
                && self
                    .sheddable_due(p)
                    .is_none_or(|d| !self.waits_for_room(d, now))
        })
    }

    pub(super) fn send_hedge(&mut self, no: TaskNo, now: Instant) {
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
        p.rare_mut().race = Some(Race {
            round: p.round,
            first: None,
            hedge: None,
            hedge_sent: now,
            first_done: false,
            hedge_done: false,
        });
        self.counts.hedged();
        let route = Route {
            seq: Seq {
                task: no,
                round: p.round,
            },
            job: p.job().clone(),
            avoid: p.avoid(),
            exclude: p.exclude(),
            hedge: true,
            headroom: true,
            at: now,
            due: None,
        };
        self.out.turn.routes.push(route);
    }

    /// A hedge was placed: remember where both attempts of the round went.
    pub(super) fn on_placed(&mut self, msg: Placed) {
        let Some(p) = self.current(msg.seq) else {
            return;
        };
        if let Some(race) = p.race_mut().filter(|r| r.round == msg.seq.round) {
            race.first = Some(msg.first);
            race.hedge = Some(msg.hedge);
        }
    }

    /// The balancer could not place an attempt: if it was the round's last
    /// one out, the task goes back to the front (or, if the other attempt of
    /// a hedged round failed meanwhile, the policy decides).
    pub(super) fn on_bounce(&mut self, seq: Seq, hedge: bool, refused: bool) {
        let Some(p) = self.current(seq) else {
            return;
        };
        p.outstanding -= 1;
        if let Some(race) = p.race_mut().filter(|r| r.round == seq.round) {
            if hedge {
                race.hedge = None;
                race.hedge_done = true;
            }
        }
        if refused && p.outstanding == 0 {
            // Only nodes that failed its TLS handshake could take it.
            return self.fail(seq.task, FailReason::NotRetryable);
        }
        if p.outstanding == 0 {
            self.round_ended(seq.task);
        }
    }

    /// Reject every ready task (the gate closed).
    pub(super) fn reject_ready(&mut self, reason: Rejection) {
        while let Some(no) = self.tasks.take_held() {
            self.reject(no, reason.clone());
        }
        while let Some(no) = self.tasks.next_ready(Order::Fifo) {
            self.reject(no, reason.clone());
        }
    }
}

/// Whether a task of `class` is shielded under overload: less important
/// tasks wait now, or were shed within the last interval, so the overload
/// is being taken out on them first (see `Codel::on_dequeue_for`).
pub(super) fn shielded(
    counts: &Counts,
    shed_at: &[Option<Instant>; 3],
    class: Priority,
    now: Instant,
    delay: &crate::algo::codel::Codel,
) -> bool {
    let recent = |t: &Option<Instant>| {
        t.is_some_and(|t| now.saturating_duration_since(t) <= delay.config().interval)
    };
    counts.shields(class) || shed_at[class.index() + 1..].iter().any(recent)
}

/// The `retry_after` of a task displaced from a full queue when the delay
/// control is off (nothing then measures how long the overload lasts).
const DISPLACED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The most room a pump reserves for its routes up front (more grows).
const MAX_BATCH: usize = 4096;

/// When to hedge `job`, if the service hedges and the task is idempotent.
pub(super) fn hedge_delay(
    cfg: &ServiceConfig,
    latencies: &LatencyWindow,
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

/// Lists the attempt still out when a hedged task is answered, as
/// `Cancelled`: the backend saw it, so the result shows it.
pub(super) fn list_cancelled_twin(p: &mut Pending, now: Instant, epoch: &Epoch) {
    let Some(race) = p.race().filter(|r| r.round == p.round) else {
        return;
    };
    let (node, hedge, sent) = if !race.hedge_done {
        (race.hedge.clone(), true, race.hedge_sent)
    } else if !race.first_done {
        (race.first.clone(), false, epoch.at(p.sent_at))
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
            error: None,
        });
    }
}
