//! A queued task's state (one slab slot each: kept small, the rare parts
//! boxed: its last failure and a hedged round's race), and the compact
//! instants it keeps.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::actors::protocol::NodeId;
use crate::actors::queue::core::bytes::HeldBytes;
use crate::algo::time;
use crate::outcome::{Attempt, AttemptOutcome, Response};
use crate::task::{Job, ReplyTx};

/// A task's number in its queue.
pub(in crate::actors) type TaskNo = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::actors) enum State {
    /// Waiting until the queue has room (not yet counted as submitted).
    Waiting,
    Ready,
    Backoff,
    InFlight,
}

pub(in crate::actors) struct Pending {
    /// The task's job, and the duty to answer it (one allocation holds
    /// both, and the slot the caller waits on).
    pub(in crate::actors::queue) task: ReplyTx,
    pub attempts: Vec<Attempt>,
    /// When this round was sent out.
    pub(in crate::actors::queue) sent_at: Stamp,
    /// What most tasks never need (boxed, so a queued task's slot stays
    /// small): their last failure, and a hedged round's race.
    pub(in crate::actors::queue) rare: Option<Box<Rare>>,
    /// Bumped at each dispatch; answers of other rounds are stale.
    pub(in crate::actors::queue) round: u32,
    /// The low 32 bits of the task's arrival count (its number's high half).
    pub(in crate::actors::queue::core::table) arrival: u32,
    /// Changed by the [`TaskTable`](super::TaskTable) only, which keeps the
    /// counts by state.
    pub(in crate::actors::queue::core::table) state: State,
    /// The task's tenant's flow (`algo::fair`), set by the
    /// [`TaskTable`](super::TaskTable) when it enters.
    pub(in crate::actors::queue::core::table) tenant: crate::algo::fair::Flow,
    /// Attempts out right now (2 while hedged).
    pub(in crate::actors::queue) outstanding: u8,
    pub(in crate::actors::queue) hedged: bool,
    /// The caller asked to wait (`on_full: wait`, `feed`): never shed by
    /// the queue's delay control.
    pub(in crate::actors::queue) patient: bool,
    /// Whether an attempt of this round failed (else the round bounced).
    pub(in crate::actors::queue) round_failed: bool,
    /// Its body's bytes, counted against `queue.max_bytes` until the task
    /// leaves (`None` only for an entry built outside the queue's intake).
    pub(in crate::actors::queue) bytes: Option<HeldBytes>,
}

/// An instant as nanoseconds since the queue's [`Epoch`]: 8 bytes in a
/// task's slot instead of the 16 of an `Instant`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::actors) struct Stamp(pub(in crate::actors::queue) u64);

/// The queue's start, which [`Stamp`]s count from, and the last instant
/// stamped: the tasks of one turn share its instant, so the subtraction is
/// done once per turn.
pub(in crate::actors) struct Epoch {
    start: Instant,
    last: Cell<(Instant, Stamp)>,
}

impl Epoch {
    pub(in crate::actors::queue) fn new(start: Instant) -> Self {
        Epoch {
            start,
            last: Cell::new((start, Stamp(0))),
        }
    }

    pub(in crate::actors::queue) fn stamp(&self, t: Instant) -> Stamp {
        let (at, stamp) = self.last.get();
        if t == at {
            return stamp;
        }
        let nanos = t.saturating_duration_since(self.start).as_nanos();
        let stamp = Stamp(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.last.set((t, stamp));
        stamp
    }

    pub(in crate::actors::queue) fn at(&self, s: Stamp) -> Instant {
        time::add(self.start, Duration::from_nanos(s.0))
    }
}

/// The rarely needed part of a task's state.
#[derive(Default)]
pub(in crate::actors) struct Rare {
    /// The last failed attempt of this task, the nodes that failed it and
    /// its retries so far.
    pub(in crate::actors::queue) last: Option<LastFailure>,
    /// Where a hedged round's attempts went, and which have reported.
    pub(in crate::actors::queue) race: Option<Race>,
}

impl Pending {
    /// A new task's entry (its state and arrival are the table's to set).
    pub(in crate::actors::queue) fn new(task: ReplyTx, sent_at: Stamp) -> Pending {
        Pending {
            task,
            attempts: Vec::new(),
            sent_at,
            rare: None,
            round: 0,
            arrival: 0,
            tenant: crate::algo::tenants::UNNAMED,
            state: State::Waiting,
            outstanding: 0,
            hedged: false,
            patient: false,
            round_failed: false,
            bytes: None,
        }
    }

    /// Where the task is: waiting, ready, backing off or in flight.
    pub(in crate::actors) fn state(&self) -> State {
        self.state
    }

    /// The task's job.
    pub(in crate::actors::queue) fn job(&self) -> &Arc<Job> {
        self.task.job()
    }

    pub(in crate::actors::queue) fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Default::default)
    }

    pub(in crate::actors::queue) fn last(&self) -> Option<&LastFailure> {
        self.rare.as_ref()?.last.as_ref()
    }

    pub(in crate::actors::queue) fn last_mut(&mut self) -> Option<&mut LastFailure> {
        self.rare.as_mut()?.last.as_mut()
    }

    pub(in crate::actors::queue) fn race(&self) -> Option<&Race> {
        self.rare.as_ref()?.race.as_ref()
    }

    pub(in crate::actors::queue) fn race_mut(&mut self) -> Option<&mut Race> {
        self.rare.as_mut()?.race.as_mut()
    }

    /// The nodes that failed this task so far.
    pub(in crate::actors::queue) fn avoid(&self) -> Vec<NodeId> {
        self.last().map_or_else(Vec::new, |l| l.avoid.clone())
    }

    /// The nodes whose TLS handshake this task failed.
    pub(in crate::actors::queue) fn exclude(&self) -> Vec<NodeId> {
        self.last().map_or_else(Vec::new, |l| l.exclude.clone())
    }
}

/// A task's last failed attempt, the nodes that failed it and its retries.
pub(in crate::actors::queue) struct LastFailure {
    pub(in crate::actors::queue) outcome: AttemptOutcome,
    pub(in crate::actors::queue) response: Option<Response>,
    pub(in crate::actors::queue) retry_after: Option<Duration>,
    /// Nodes that failed this task: avoided by its retries where possible.
    pub(in crate::actors::queue) avoid: Vec<NodeId>,
    /// Nodes whose TLS handshake this task failed: never tried again.
    pub(in crate::actors::queue) exclude: Vec<NodeId>,
    /// Retries so far.
    pub(in crate::actors::queue) retries: u32,
}

/// The two attempts of a hedged round.
pub(in crate::actors::queue) struct Race {
    pub(in crate::actors::queue) round: u32,
    pub(in crate::actors::queue) first: Option<Arc<str>>,
    pub(in crate::actors::queue) hedge: Option<Arc<str>>,
    pub(in crate::actors::queue) hedge_sent: Instant,
    pub(in crate::actors::queue) first_done: bool,
    pub(in crate::actors::queue) hedge_done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_instant_gets_the_stamp_a_fresh_epoch_gives() {
        // The last instant's stamp is kept; any other, earlier or later,
        // is computed again, and an instant before the start stamps 0.
        let t0 = Instant::now();
        let e = Epoch::new(t0);
        for ns in [5_000u64, 5_000, 10, 5_000, 9_000_000, 0] {
            let t = t0 + Duration::from_nanos(ns);
            assert_eq!(e.stamp(t), Epoch::new(t0).stamp(t), "at {ns} ns");
            assert_eq!(e.stamp(t), Stamp(ns));
            assert_eq!(e.at(e.stamp(t)), t);
        }
        let before = Epoch::new(t0 + Duration::from_secs(1));
        assert_eq!(before.stamp(t0), Stamp(0));
    }
}
