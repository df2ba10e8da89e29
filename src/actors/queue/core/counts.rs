//! The queue's counters and their metric series, kept by one type: each
//! event bumps its counter and its Prometheus series together, so the
//! stats a caller reads and the metrics scraped cannot drift apart.

use std::time::Duration;

use crate::algo::priority::Priority;
use crate::metrics::{ServiceMetrics, Shed};
use crate::outcome::Outcome;

/// The queue's counters (as [`QueueStats`](crate::stats::QueueStats)
/// reports them).
#[derive(Debug, Default, Clone)]
pub(in crate::actors::queue) struct Counters {
    pub submitted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub rejected: u64,
    pub retried: u64,
    pub fallbacks: u64,
    pub hedged: u64,
    /// Tasks shed `Overloaded` (refused at intake, shed after waiting,
    /// displaced), in all and by class.
    pub shed: u64,
    pub shed_by_class: [u64; 3],
    pub shed_at_intake: u64,
    /// Tasks whose caller left (a dropped `Submission`).
    pub cancelled: u64,
    pub peak_queued: usize,
}

/// The counters and the service's metric series (no-op without
/// `metrics`), bumped together.
pub(in crate::actors::queue) struct QueueCounts {
    counters: Counters,
    metrics: ServiceMetrics,
}

impl QueueCounts {
    /// All zero, reporting to `metrics`.
    pub fn new(metrics: ServiceMetrics) -> Self {
        QueueCounts {
            counters: Counters::default(),
            metrics,
        }
    }

    /// The counters now.
    pub fn get(&self) -> &Counters {
        &self.counters
    }

    /// A task joined the queue (new, or leaving the wait list); `queued`
    /// are held now, counting it.
    pub fn joined(&mut self, queued: usize) {
        self.counters.submitted += 1;
        self.counters.peak_queued = self.counters.peak_queued.max(queued);
    }

    /// A task was answered `outcome` after `total`; `unsubmitted` if it
    /// was never counted as submitted (refused at the door, or answered
    /// while waiting).
    pub fn answered(&mut self, outcome: &Outcome, total: Duration, unsubmitted: bool) {
        if unsubmitted {
            self.counters.submitted += 1;
        }
        match outcome {
            Outcome::Success(_) => self.counters.succeeded += 1,
            Outcome::Failure(_) => self.counters.failed += 1,
            Outcome::Rejected(_) | Outcome::Fallback { .. } => self.counters.rejected += 1,
        }
        self.metrics.task_finished(outcome, total);
    }

    /// A rejection was answered with the configured fallback instead.
    pub fn fallback(&mut self) {
        self.counters.fallbacks += 1;
    }

    /// A task's caller left before it was answered.
    pub fn cancelled(&mut self) {
        self.counters.cancelled += 1;
    }

    /// A failed attempt is retried.
    pub fn retried(&mut self) {
        self.counters.retried += 1;
        self.metrics.retried();
    }

    /// The retry budget refused a retry (the task fails).
    pub fn budget_exhausted(&mut self) {
        self.metrics.budget_exhausted();
    }

    /// A hedged attempt was sent.
    pub fn hedged(&mut self) {
        self.counters.hedged += 1;
        self.metrics.hedged();
    }

    /// A task of `class` was shed `Overloaded` for `why`.
    pub fn shed(&mut self, why: Shed, class: Priority) {
        self.counters.shed += 1;
        self.counters.shed_by_class[class.index()] += 1;
        self.counters.shed_at_intake += u64::from(why == Shed::Intake);
        self.metrics.shed(why, class);
    }

    /// The queue holds `queued` tasks at the end of a turn.
    pub fn depth(&self, queued: usize) {
        self.metrics.queue_depth(queued);
    }
}
