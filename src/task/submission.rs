//! The caller's side of one submitted task: the [`Submission`] future
//! that waits for its one result, and the result of a task refused before
//! it was queued.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Job, TaskId};
use crate::outcome::{Outcome, Rejection, TaskResult};

/// The result of one submitted task, on its way: resolves to exactly one
/// [`TaskResult`]. It waits on the result slot inside the task's own
/// allocation (no channel per task; see `task/reply.rs`). A queue that
/// let go of the task unanswered (its pipeline died) answers `Internal`.
///
/// Dropping it before it resolves cancels the task: an attempt in flight
/// is cut at once and its node's slot freed, a task still queued is never
/// sent, and the task ends as [`Rejection::Cancelled`] (counted in the
/// queue's `cancelled` and `rejected` stats; never against the node).
#[must_use = "the task is already submitted; dropping this cancels it"]
pub struct Submission(SubmissionState);

enum SubmissionState {
    Ready(Box<TaskResult>),
    Waiting { job: Arc<Job>, service: Arc<str> },
    Done,
}

impl Submission {
    pub(crate) fn ready(result: TaskResult) -> Self {
        Submission(SubmissionState::Ready(Box::new(result)))
    }

    /// Waits for `job`'s answer (the queue holds its [`ReplyTx`]).
    pub(crate) fn waiting(job: Arc<Job>, service: Arc<str>) -> Self {
        Submission(SubmissionState::Waiting { job, service })
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if let SubmissionState::Waiting { job, .. } = &self.0 {
            job.reply.abandon();
        }
    }
}

impl std::future::Future for Submission {
    type Output = TaskResult;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<TaskResult> {
        use std::task::Poll;
        let out = match &mut self.0 {
            SubmissionState::Ready(_) => {
                let SubmissionState::Ready(r) =
                    std::mem::replace(&mut self.0, SubmissionState::Done)
                else {
                    unreachable!()
                };
                return Poll::Ready(*r);
            }
            SubmissionState::Waiting { job, service } => match job.reply.poll_take(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(r)) => *r,
                Poll::Ready(None) => {
                    // The queue went away without answering: only a dead
                    // pipeline does that (shutdown answers every task).
                    let why = "the service's queue stopped before answering".to_owned();
                    let (id, since) = (job.id, job.submitted);
                    rejected(id, service.clone(), Rejection::Internal(why), since)
                }
            },
            SubmissionState::Done => panic!("Submission polled after it resolved"),
        };
        self.0 = SubmissionState::Done;
        Poll::Ready(out)
    }
}

pub(crate) fn rejected(
    id: TaskId,
    service: Arc<str>,
    reason: Rejection,
    since: Instant,
) -> TaskResult {
    TaskResult {
        id,
        service,
        outcome: Outcome::Rejected(reason),
        attempts: Vec::new(),
        total: since.elapsed(),
    }
}
