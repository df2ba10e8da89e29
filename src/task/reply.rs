//! Where a task's one result goes: a slot inside the task's own allocation.
//!
//! `Dispatcher::submit` allocates a task's [`Job`] once, in an `Arc`, and
//! that allocation also holds the slot its result is put in: the queue
//! fills it, the caller's [`crate::Submission`] waits on it. So a task costs
//! one allocation for its state and no channel of its own (a `oneshot` per
//! task was one more allocation, about 80 bytes per queued task).
//!
//! The queue holds a task through a [`ReplyTx`]: answering consumes it, and
//! dropping it unanswered (the queue actor gone with the task, or a submit
//! dropped with a dead queue's inbox) closes the slot, which the
//! `Submission` turns into an `Internal` rejection, as it did for a dropped
//! channel. So every task still gets exactly one result.
//!
//! A caller that drops its `Submission` unanswered abandons the slot: the
//! node working on the task watches for that (it registers its attempt's
//! waker beside the caller's, [`ReplySlot::poll_abandoned`]) and cancels
//! the attempt at once, so a client that left frees the node's slot. The
//! watch costs no allocation: the waker is the attempt slot's own, cloned
//! (a reference count) once per attempt.
//!
//! ```text
//!  Waiting(waker, watch) ──put──► Answered(result) ──taken by the caller──► Taken
//!        ├──────ReplyTx dropped unanswered──► Closed
//!        └──────Submission dropped──► Abandoned (the watch is woken; a later answer is dropped)
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Job;
use crate::outcome::TaskResult;

/// A task's result, on its way from the queue to the caller; `left` says
/// without the lock that the caller is gone (the node's check on each
/// attempt).
pub(crate) struct ReplySlot(Mutex<SlotState>, AtomicBool);

enum SlotState {
    /// Not answered yet: the waker of the caller's last poll, and that of
    /// the attempt watching for the caller to leave, if any.
    Waiting {
        caller: Option<Waker>,
        watch: Option<Waker>,
    },
    /// Answered, not yet taken. Boxed: the slot stays a few words while
    /// the task is queued.
    Answered(Box<TaskResult>),
    /// The caller has taken the result.
    Taken,
    /// The queue let go of the task without answering it.
    Closed,
    /// The caller dropped its `Submission` before the answer.
    Abandoned,
}

impl Default for ReplySlot {
    fn default() -> Self {
        ReplySlot(
            Mutex::new(SlotState::Waiting {
                caller: None,
                watch: None,
            }),
            AtomicBool::new(false),
        )
    }
}

impl fmt::Debug for ReplySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &*self.lock() {
            SlotState::Waiting { .. } => "waiting",
            SlotState::Answered(_) => "answered",
            SlotState::Taken => "taken",
            SlotState::Closed => "closed",
            SlotState::Abandoned => "abandoned",
        };
        f.debug_tuple("ReplySlot").field(&state).finish()
    }
}

impl ReplySlot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Nothing panics while holding it; a poisoned slot is still sound.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends a waiting slot as `to` and wakes the caller; a slot already
    /// answered, closed or abandoned is left as it is (each task is
    /// answered once; nobody hears an abandoned task's answer).
    fn end(&self, to: SlotState) {
        let waker = {
            let mut s = self.lock();
            match &mut *s {
                SlotState::Waiting { caller, .. } => {
                    let w = caller.take();
                    *s = to;
                    w
                }
                _ => None,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The caller is gone (its `Submission` dropped unanswered): a waiting
    /// slot becomes `Abandoned` and wakes the attempt watching it; an
    /// answer not taken is dropped now.
    pub(crate) fn abandon(&self) {
        let (watch, _answer) = {
            let mut s = self.lock();
            match std::mem::replace(&mut *s, SlotState::Taken) {
                SlotState::Waiting { watch, .. } => {
                    *s = SlotState::Abandoned;
                    self.1.store(true, Ordering::Release);
                    (watch, None)
                }
                SlotState::Answered(r) => (None, Some(r)),
                other => {
                    *s = other;
                    (None, None)
                }
            }
        };
        if let Some(w) = watch {
            w.wake();
        }
    }

    /// Whether the caller left before the answer (no lock).
    pub(crate) fn is_abandoned(&self) -> bool {
        self.1.load(Ordering::Acquire)
    }

    /// Whether the caller left before the answer; if not (and the task is
    /// not answered yet), `cx`'s waker is woken when it does. One watcher
    /// at a time: the last to register (of a hedged pair, the other
    /// attempt is cancelled by the queue once the first reports). A
    /// watcher whose waker does not change needs `watch` only once; then
    /// [`ReplySlot::is_abandoned`] is its check.
    pub(crate) fn poll_abandoned(&self, cx: &mut Context<'_>) -> bool {
        if self.is_abandoned() {
            return true;
        }
        let mut s = self.lock();
        match &mut *s {
            SlotState::Abandoned => true,
            SlotState::Waiting { watch, .. } => {
                match watch {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *watch = Some(cx.waker().clone()),
                }
                false
            }
            _ => false,
        }
    }

    /// The result, once there is one: `Some` the first time, `None` when
    /// the slot was closed unanswered. Registers the caller's waker otherwise.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Option<Box<TaskResult>>> {
        let mut s = self.lock();
        match &mut *s {
            SlotState::Waiting { caller, .. } => {
                match caller {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *caller = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Answered(_) => match std::mem::replace(&mut *s, SlotState::Taken) {
                SlotState::Answered(r) => Poll::Ready(Some(r)),
                _ => unreachable!("matched above"),
            },
            SlotState::Taken | SlotState::Closed | SlotState::Abandoned => Poll::Ready(None),
        }
    }
}

/// The queue's hold on a task: its job, and the duty to answer it exactly
/// once. [`ReplyTx::send`] answers; dropping it unanswered closes the slot.
pub(crate) struct ReplyTx(Option<Arc<Job>>);

impl ReplyTx {
    /// Takes charge of answering `job`.
    pub(crate) fn new(job: Arc<Job>) -> Self {
        ReplyTx(Some(job))
    }

    /// The task's job.
    pub(crate) fn job(&self) -> &Arc<Job> {
        self.0
            .as_ref()
            .expect("a ReplyTx holds its job until it answers")
    }

    /// Answers the task.
    pub(crate) fn send(mut self, result: Box<TaskResult>) {
        if let Some(job) = self.0.take() {
            job.reply.end(SlotState::Answered(result));
        }
    }
}

impl Drop for ReplyTx {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.reply.end(SlotState::Closed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::Task;
    use futures::task::noop_waker;
    use tokio::time::Instant;

    fn job() -> Arc<Job> {
        Arc::new(Task::get("s", "/x").prepare(7, Instant::now()).unwrap())
    }

    fn result() -> Box<TaskResult> {
        Box::new(crate::task::rejected(
            7,
            "s".into(),
            crate::Rejection::QueueFull,
            Instant::now(),
        ))
    }

    #[test]
    fn an_answer_is_taken_once() {
        let job = job();
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(job.reply.poll_take(&mut cx).is_pending());
        ReplyTx::new(job.clone()).send(result());
        match job.reply.poll_take(&mut cx) {
            Poll::Ready(Some(r)) => assert_eq!(r.id, 7),
            _ => panic!("answered"),
        }
        assert!(matches!(job.reply.poll_take(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn a_hold_dropped_unanswered_closes_the_slot() {
        let job = job();
        drop(ReplyTx::new(job.clone()));
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(job.reply.poll_take(&mut cx), Poll::Ready(None)));
    }

    /// A dropped caller wakes the attempt watching the slot, once; the
    /// answer that comes later is dropped, and a slot already answered
    /// stays answered for nobody.
    #[test]
    fn an_abandoned_slot_wakes_its_watch_and_drops_the_answer() {
        struct Flag(std::sync::atomic::AtomicUsize);
        impl futures::task::ArcWake for Flag {
            fn wake_by_ref(me: &Arc<Self>) {
                me.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(Default::default()));
        let waker = futures::task::waker(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let job = job();
        assert!(!job.reply.poll_abandoned(&mut cx));
        assert!(!job.reply.is_abandoned());
        job.reply.abandon();
        assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(job.reply.poll_abandoned(&mut cx));
        assert!(job.reply.is_abandoned());
        ReplyTx::new(job.clone()).send(result());
        assert!(job.reply.is_abandoned());
        // Abandoning again wakes nobody.
        job.reply.abandon();
        assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 1);

        let answered = self::job();
        ReplyTx::new(answered.clone()).send(result());
        answered.reply.abandon();
        assert!(!answered.reply.is_abandoned());
        assert!(!answered.reply.poll_abandoned(&mut cx));
    }

    /// A caller waiting on the slot is woken by the answer (and by a close).
    #[test]
    fn the_answer_wakes_a_waiting_caller() {
        struct Flag(std::sync::atomic::AtomicUsize);
        impl futures::task::ArcWake for Flag {
            fn wake_by_ref(me: &Arc<Self>) {
                me.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        for answer in [true, false] {
            let flag = Arc::new(Flag(Default::default()));
            let waker = futures::task::waker(flag.clone());
            let mut cx = Context::from_waker(&waker);
            let job = job();
            assert!(job.reply.poll_take(&mut cx).is_pending());
            let tx = ReplyTx::new(job.clone());
            if answer {
                tx.send(result());
            } else {
                drop(tx);
            }
            assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 1);
            let got = job.reply.poll_take(&mut cx);
            assert_eq!(matches!(got, Poll::Ready(Some(_))), answer);
        }
    }
}
