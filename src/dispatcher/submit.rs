//! Submitting tasks: [`Dispatcher::submit`] and [`Dispatcher::feed`] (the
//! [`Submission`] future they hand back is the task's, in `task/`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::Dispatcher;
use crate::actors::protocol::*;
use crate::config::OnFull;
use crate::outcome::{Rejection, TaskResult};
use crate::task::{rejected, ReplyTx, Submission, Task};

impl Dispatcher {
    /// Submits one task; the returned future resolves to its result. The
    /// task is checked and handed to its service's queue at once, when
    /// `submit` is called (not when the future is first polled), so the
    /// future only waits for the answer and is small. It never fails:
    /// problems come back as a rejection or failure inside the result.
    pub fn submit(&self, task: Task) -> Submission {
        self.submit_inner(task, false)
    }

    fn submit_inner(&self, task: Task, wait: bool) -> Submission {
        let now = Instant::now();
        let id = self.inner.ids.fetch_add(1, Ordering::Relaxed);
        let Some(h) = self.handle(task.service()) else {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            let id = task.given_id().unwrap_or(id);
            let service: Arc<str> = task.service().into();
            let why = Rejection::UnknownService(task.service().to_owned());
            return Submission::ready(rejected(id, service, why, now));
        };
        if self.inner.closed.load(Ordering::Acquire) {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            let id = task.given_id().unwrap_or(id);
            return Submission::ready(rejected(id, h.name.clone(), Rejection::ShuttingDown, now));
        }
        let mut job = match task.prepare(id, now) {
            Ok(job) => job,
            Err((id, reason)) => {
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                let why = Rejection::InvalidTask(reason);
                return Submission::ready(rejected(id, h.name.clone(), why, now));
            }
        };
        if !h.alive() {
            self.rebuild(&h);
            let why = Rejection::Internal(
                "the service's pipeline stopped; it is being rebuilt, submit again".into(),
            );
            return Submission::ready(rejected(job.id, h.name.clone(), why, now));
        }
        if job.deadline.is_none() {
            // The service's default deadline (`queue.deadline`), if stated.
            job.deadline = h.cfg.queue.deadline.map(|d| crate::algo::time::add(now, d));
        }
        // One allocation for the task's state and the slot of its result.
        let job = Arc::new(job);
        let submission = Submission::waiting(job.clone(), h.name.clone());
        h.inbox.send(Submit {
            task: ReplyTx::new(job),
            wait: wait || h.cfg.queue.on_full == OnFull::Wait,
        });
        submission
    }

    /// Consumes a (possibly endless) stream of tasks and yields their results
    /// as they finish. Backpressure: it pulls a task only while fewer than
    /// the largest queue capacity are unanswered, and waits for room instead
    /// of taking `QueueFull`, so no queue ever holds more than its capacity.
    pub fn feed<S>(&self, tasks: S) -> impl Stream<Item = TaskResult> + 'static
    where
        S: Stream<Item = Task> + 'static,
    {
        let window = self
            .inner
            .services
            .read()
            .expect("lock")
            .values()
            .map(|h| h.cfg.queue.capacity)
            .max()
            .unwrap_or(1)
            .max(1);
        let d = self.clone();
        tasks
            .map(move |t| d.submit_inner(t, true))
            .buffer_unordered(window)
    }

    /// Submits and, when the queue is full, waits for room.
    #[cfg(feature = "redis")]
    pub(crate) fn submit_waiting(&self, task: Task) -> Submission {
        self.submit_inner(task, true)
    }
}
