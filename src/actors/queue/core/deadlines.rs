//! Shedding by stated deadlines (`algo::deadline`): a task's due time is
//! its deadline, or its submission plus the service's `queue.slo`; a task
//! with neither, or one that waits on purpose (`feed`, `on_full: wait`),
//! is never refused, held or shed by time. A task due sooner than the
//! quickest node with room ends it waits for a quicker room
//! ([`QueueCore::waits_for_room`]).

use std::time::Duration;

use tokio::time::Instant;

use super::table::Pending;
use super::{QueueCore, TaskNo};
use crate::algo::deadline::DeadlineControl;
use crate::algo::priority::Priority;
use crate::algo::time;
use crate::metrics::Shed;
use crate::outcome::FailReason;
use crate::task::Job;

impl QueueCore {
    /// When the task of `job` is due, if the user stated it.
    pub(super) fn due_of(&self, job: &Job) -> Option<Instant> {
        job.deadline
            .or_else(|| self.cfg.queue.slo.map(|s| time::add(job.submitted, s)))
    }

    /// What an attempt is expected to take: the mean of recent successes
    /// (zero before 16). The mean, as HAProxy's `timeout queue` is set from
    /// it: a skewed service's median would send tasks whose slow answers
    /// come too late, and a high percentile would refuse most of what fits.
    pub(super) fn expected_latency(&self) -> Duration {
        self.latencies.mean().unwrap_or(Duration::ZERO)
    }

    /// How long serving newest first lasts after the last shed for time.
    pub(super) fn due_hold(&self) -> Duration {
        self.expected_latency()
    }

    /// Whether the deadline rules have been shedding lately.
    pub(super) fn due_overloaded(&self, now: Instant) -> bool {
        self.due.overloaded(self.due_hold(), now)
    }

    /// Whether the deadline rules serve the newest first now.
    pub(super) fn due_lifo(&self, now: Instant) -> bool {
        self.due.lifo(now)
    }

    /// Whether the queue may serve the newest first: no caller waits on
    /// purpose (a patient task, ready or in flight, is never shed, and
    /// under LIFO it could wait behind newer tasks for good). Otherwise it
    /// serves in order, and its intake and its depth count so.
    pub(super) fn newest_first_allowed(&self) -> bool {
        self.tasks.counts().patient == 0
    }

    /// Whether a new task of `class` due at `due` is refused at once: the
    /// ready tasks that go before it (newest first while overloaded, or
    /// while a turn to it waits for growth: only the more important
    /// classes'), less the credit in hand, take longer at the recent send
    /// rate than it has left after an attempt.
    pub(super) fn refused_for_time(
        &self,
        class: Priority,
        flow: crate::algo::fair::Flow,
        due: Instant,
        now: Instant,
    ) -> bool {
        let c = self.tasks.counts();
        // Of its own class, those its tenant's turns leave ahead of it, in
        // the order the queue serves: in order while a caller waits on
        // purpose (as `pump` does); else, while a turn waits for growth to
        // confirm it, as newest first would serve it (it goes first once
        // confirmed).
        let lifo = self.newest_first_allowed() && (self.due_lifo(now) || self.due.turning(now));
        let order = match lifo {
            true => crate::algo::codel::Order::Lifo,
            false => crate::algo::codel::Order::Fifo,
        };
        let ahead = c.ready_from(class) - c.ready_in[class.index()]
            + self.tasks.ahead_in_class(class, flow, order);
        let ahead = ahead.saturating_sub(self.credit.in_hand());
        !self.due.admits(ahead, due, self.expected_latency(), now)
    }

    /// Whether ready task `no` can no longer be served in time: an attempt
    /// is expected to take longer than it has left, by the mean of recent
    /// successes, unless the quickest node with room ends it in time (a
    /// figure of the node, which the service's mean blurs).
    pub(super) fn unservable(&self, no: TaskNo, now: Instant) -> bool {
        self.due_if_sheddable(no)
            .is_some_and(|due| self.unservable_by(due, now))
    }

    /// [`unservable`](Self::unservable) for a task due at `due`.
    pub(super) fn unservable_by(&self, due: Instant, now: Instant) -> bool {
        let room = self
            .room_latency
            .is_some_and(|t| DeadlineControl::servable(due, t, now));
        !room && !DeadlineControl::servable(due, self.expected_latency(), now)
    }

    /// Whether a ready task due at `due` has less time left than an
    /// attempt is expected to take on the quickest node with room: sent
    /// now, it would wait inside a backend past its due time, so it waits
    /// in the queue for a quicker room (or until it can no longer be
    /// served in time).
    pub(super) fn waits_for_room(&self, due: Instant, now: Instant) -> bool {
        self.room_latency
            .is_some_and(|t| !DeadlineControl::servable(due, t, now))
    }

    /// When ready task `no` is due, if it may be shed for time.
    pub(super) fn due_if_sheddable(&self, no: TaskNo) -> Option<Instant> {
        self.tasks.get(&no).and_then(|p| self.sheddable_due(p))
    }

    /// When task `p` is due, if it may be shed for time (a task that
    /// waits on purpose never is).
    pub(super) fn sheddable_due(&self, p: &Pending) -> Option<Instant> {
        (!p.patient).then(|| self.due_of(p.job())).flatten()
    }

    /// Answers ready task `no`, which can no longer be served in time:
    /// shed `Overloaded` if it was never sent, else failed
    /// `DeadlineExceeded` (its earlier attempts failed).
    pub(super) fn drop_late(&mut self, no: TaskNo, now: Instant) {
        let tried = self.tasks.get(&no).is_some_and(|p| !p.attempts.is_empty());
        self.shed_for_time(now);
        if tried {
            self.fail(no, FailReason::DeadlineExceeded);
        } else {
            self.shed(no, Shed::QueueDelay, now);
        }
    }

    /// Notes a shed or refusal for time, and logs the start of an overload.
    pub(super) fn shed_for_time(&mut self, now: Instant) {
        let hold = self.due_hold();
        if self.due.on_shed(hold, now) && !self.due_overloaded {
            self.due_overloaded = true;
            log::warn!(
                "service {}: overloaded: tasks can no longer meet their deadlines; \
                 refusing and shedding those, newest first",
                self.service
            );
        }
    }

    /// Ends a turn of the deadline rules: the send rate learns the turn,
    /// the oldest tasks of each class that can no longer be served in time
    /// are shed (newest first leaves them there), the queue is kept to the
    /// depth its deadlines allow (shedding the oldest task of the tenant most
    /// over its share, never one of the top class of several), and the end of an
    /// overload is logged.
    pub(super) fn deadline_turn(&mut self, sent: u64, now: Instant) {
        // Held tasks too, with no credit in hand to take them.
        self.sweep_held(now);
        for class in Priority::ALL.into_iter().rev() {
            while let Some(no) = self.tasks.oldest_ready_in(class) {
                if !self.unservable(no, now) {
                    break;
                }
                self.tasks.take_oldest_ready_in(class);
                self.drop_late(no, now);
            }
        }
        // While a caller waits on purpose the queue serves in order: its
        // oldest tasks go next, and the depth would shed them.
        let depth = self
            .newest_first_allowed()
            .then(|| self.due.depth(self.expected_latency(), now))
            .flatten();
        if let Some(depth) = depth {
            // Newest first: the deep end of the queue would be served late.
            // The top class of several is shed only once it cannot be
            // served in time: it goes first, so only its own kind is ahead
            // of it, and the depth, from a send rate measured while the
            // limits still rise, can be too small for it alone.
            let top = self.classes.top_of_several(now);
            'shed: for class in Priority::ALL.into_iter().rev() {
                if top == Some(class) {
                    break;
                }
                while self.tasks.counts().ready > depth {
                    // Of the tenant most over its share: one tenant's
                    // flood does not push the others' tasks out.
                    let Some((flow, no)) = self.tasks.sheddable_in(class) else {
                        continue 'shed;
                    };
                    // Only a stated time sheds: a task with no deadline
                    // (and no `slo`), or whose caller waits on purpose,
                    // waits until it is served.
                    let bound = |p: &Pending| !p.patient && self.due_of(p.job()).is_some();
                    if !self.tasks.get(&no).is_some_and(bound) {
                        continue 'shed;
                    }
                    self.tasks.take_sheddable(class, flow);
                    self.drop_late(no, now);
                }
            }
        }
        let waiting = self.tasks.counts().ready > 0;
        self.due.on_turn(sent, waiting, now);
        if self.due_overloaded && !self.due_overloaded(now) {
            self.due_overloaded = false;
            log::info!(
                "service {}: no longer overloaded; {} task(s) shed so far",
                self.service,
                self.counts.get().shed
            );
        }
    }
}
