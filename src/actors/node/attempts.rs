//! The attempts in flight at one node: one set, polled by one driver on the
//! node's context, with one timer for all their deadlines.
//!
//! An attempt used to be a tokio task of its own (a 2 KB allocation, a run
//! queue pass and a `JoinHandle` each) with a timer of its own (a timer-wheel
//! registration and removal each). Here every attempt is one slot of a slab
//! owned by the node: only the attempts that were woken are polled, attempts
//! that finish in the same turn of the node are reported together, and their
//! deadlines share one [`Sleep`].
//!
//! The slab is a `FuturesUnordered` that keeps its task nodes: each slot has
//! a waker made once (an `Arc` that queues the slot's number and wakes the
//! driver), and a freed slot is reused by the next attempt, so an attempt
//! costs no allocation of its own (a `FuturesUnordered` allocates and frees
//! a node per future: about a seventh of an in-process task's instructions,
//! measured with callgrind). A waker left behind by a finished attempt may
//! poll its slot's next attempt once for nothing, which a future allows.
//!
//! The timer is set for the earliest deadline it knows of. When it fires, the
//! attempts whose deadline has passed are marked and queued, answer
//! `Timeout` when polled (`Deadline` when it was their task's deadline, not
//! the node's timeout, that cut them), and the timer moves to the earliest deadline left.
//! With the usual single timeout per service, deadlines arrive in order, so
//! the timer is reset about once per timeout period, not once per attempt; a
//! scan is O(attempts in flight).
//!
//! An attempt that ends at its first poll (an in-process transport, a
//! refused connection) never touches the timer at all: the timer is armed
//! only when attempts are left pending after a poll.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures::future::LocalBoxFuture;
use futures::task::AtomicWaker;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use super::in_flight::InFlightGuard;
use super::{caller_left, panicked, twin_answered, AttemptDeadline};
use crate::actors::protocol::Seq;
use crate::algo::breaker::Permit;
use crate::task::Job;
use crate::transport::{HttpReply, HttpRequest, Transport, TransportError};

/// One attempt: the transport's future, its deadline and its cancel
/// switches (a hedged twin's answer; the caller leaving, seen in its
/// task's reply slot).
pub(super) struct Attempt {
    /// The task: its reply slot says whether the caller left.
    job: Arc<Job>,
    seq: Seq,
    hedge: bool,
    permit: Option<Permit>,
    /// Its slot, freed when the node accounts it (or if it is dropped).
    slot: Option<InFlightGuard>,
    sent: Instant,
    deadline: AttemptDeadline,
    /// `None` once the transport panicked building it (`early` says so).
    send: Option<LocalBoxFuture<'static, Result<HttpReply, TransportError>>>,
    early: Option<TransportError>,
    /// A hedged twin's answer cancels it (services that hedge only).
    cancel: Option<oneshot::Receiver<()>>,
    /// The node's timer found its deadline passed.
    expired: bool,
    /// Its waker is in the task's reply slot (its slot's waker never
    /// changes, so once is enough).
    watching: bool,
    /// Cut (its task answered), its backend still working: it keeps its
    /// slot until the backend answers or the node's timeout passes.
    tail: bool,
}

/// How a poll of an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The backend answered, failed, or the node's timeout passed: the task
    /// has its answer and the slot is free.
    Answer,
    /// A cut (the task's deadline, a hedged twin's answer) with the request
    /// out: the task has its answer, the slot stays taken
    /// by the attempt's tail.
    Cut,
    /// The tail of a cut attempt ended (the backend answered, or the node's
    /// timeout passed): its slot is free; nobody waits for the answer.
    Tail,
}

/// What an attempt gave, for the node to account and report.
pub(super) struct Finished {
    pub seq: Seq,
    pub hedge: bool,
    pub permit: Option<Permit>,
    /// `None` for a cut: the tail keeps it.
    pub slot: Option<InFlightGuard>,
    pub sent: Instant,
    pub result: Result<HttpReply, TransportError>,
    pub end: End,
}

impl Attempt {
    /// Sends `req` on `transport` (a panic there is a failed attempt); a
    /// task whose caller already left is not sent at all.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        transport: &dyn Transport,
        job: Arc<Job>,
        req: HttpRequest,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        slot: InFlightGuard,
        sent: Instant,
        deadline: AttemptDeadline,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Self {
        let (send, early) = if job.reply.is_abandoned() {
            (None, Some(caller_left()))
        } else {
            match std::panic::catch_unwind(AssertUnwindSafe(|| transport.send(req))) {
                Ok(f) => (Some(f), None),
                Err(p) => (None, Some(panicked(p))),
            }
        };
        Attempt {
            job,
            seq,
            hedge,
            permit,
            slot: Some(slot),
            sent,
            deadline,
            send,
            early,
            cancel,
            expired: false,
            watching: false,
            tail: false,
        }
    }

    fn done(&mut self, result: Result<HttpReply, TransportError>) -> Poll<Finished> {
        let end = if self.tail { End::Tail } else { End::Answer };
        Poll::Ready(Finished {
            seq: self.seq,
            hedge: self.hedge,
            permit: self.permit.take(),
            slot: Some(self.slot.take().expect("an attempt finishes once")),
            sent: self.sent,
            result,
            end,
        })
    }

    /// Its caller left: an explicit cancel. Closing the connection (the
    /// transport's future dropped) is how a backend hears of it, and one
    /// that listens stops; one that does not goes on with the request. So
    /// the slot stays taken for the time the answer was expected to take
    /// (the node's latency estimate when it was sent), no longer: freed at
    /// once, every cancel under load let one request more into a backend
    /// still busy with the one given up, and they piled up inside it.
    fn cancel_and_hold(&mut self) -> Poll<Finished> {
        let until = self.deadline.expected_at(self.sent);
        if self.send.take().is_none() || until <= Instant::now() {
            return self.done(Err(caller_left()));
        }
        self.begin_tail(until, caller_left())
    }

    /// Cut by `why` (the task's deadline, a hedged twin's answer): the
    /// task's answer now. The backend, healthy and busy, goes on working on
    /// the request whatever the engine does with the connection (most
    /// cannot stop a request under way), so the attempt keeps its slot and
    /// waits for the answer until the node's own timeout: freed at once, the
    /// slot would let one request more into a backend still busy with this
    /// one, and under overload those pile up inside it. The answer, when it
    /// comes, gives the backend's true latency, which the cut would hide
    /// from the learned limit; the connection is then reused.
    fn cut(&mut self, why: TransportError) -> Poll<Finished> {
        if self.send.is_none() {
            return self.done(Err(why));
        }
        let until = self.deadline.timeout_at;
        self.begin_tail(until, why)
    }

    /// Answers the task with `why` and keeps the slot in a tail that ends
    /// at `until` at the latest (earlier if the request, still out, is
    /// answered).
    fn begin_tail(&mut self, until: Instant, why: TransportError) -> Poll<Finished> {
        self.tail = true;
        self.cancel = None;
        self.expired = false;
        self.deadline.at = until;
        self.deadline.by_task = false;
        Poll::Ready(Finished {
            seq: self.seq,
            hedge: self.hedge,
            permit: self.permit.take(),
            slot: None,
            sent: self.sent,
            result: Err(why),
            end: End::Cut,
        })
    }

    /// Marks it timed out if its deadline is at or before `now` (true
    /// then: it must be polled to answer).
    fn expire(&mut self, now: Instant) -> bool {
        if self.expired || self.deadline.at > now {
            return false;
        }
        self.expired = true;
        true
    }
}

impl Future for Attempt {
    type Output = Finished;

    /// The transport first (an answer that is ready wins over a cancel or
    /// the deadline, as with `tokio::time::timeout`), then the cancel
    /// switch, then the caller's presence, then the deadline.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        let this = self.get_mut();
        if let Some(e) = this.early.take() {
            return this.done(Err(e));
        }
        if let Some(send) = this.send.as_mut() {
            match std::panic::catch_unwind(AssertUnwindSafe(|| send.as_mut().poll(cx))) {
                Ok(Poll::Ready(r)) => return this.done(r),
                Ok(Poll::Pending) => {}
                Err(p) => return this.done(Err(panicked(p))),
            }
        }
        if this.tail {
            // Nobody waits for this answer: only the node's timeout ends it
            // (or, the request given up, the time it was expected to take).
            if this.expired {
                let e = match this.send {
                    Some(_) => this.deadline.error(this.sent),
                    None => caller_left(),
                };
                return this.done(Err(e));
            }
            return Poll::Pending;
        }
        if let Some(rx) = this.cancel.as_mut() {
            match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(())) => return this.cut(twin_answered()),
                // The switch was dropped unused: the attempt runs on.
                Poll::Ready(Err(_)) => this.cancel = None,
                Poll::Pending => {}
            }
        }
        let left = if this.watching {
            this.job.reply.is_abandoned()
        } else {
            this.watching = true;
            this.job.reply.poll_abandoned(cx)
        };
        if left {
            return this.cancel_and_hold();
        }
        if this.expired {
            let e = this.deadline.error(this.sent);
            return if this.deadline.by_task {
                this.cut(e)
            } else {
                this.done(Err(e))
            };
        }
        Poll::Pending
    }
}

/// The slots woken since the driver last looked, and the driver's waker.
#[derive(Default)]
struct Ready {
    slots: Mutex<Vec<usize>>,
    driver: AtomicWaker,
}

/// A slot's waker: queues the slot (once until it is polled) and wakes the
/// driver.
struct EntryWake {
    slot: usize,
    queued: AtomicBool,
    ready: Arc<Ready>,
}

impl Wake for EntryWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.slot);
            self.ready.driver.wake();
        }
    }
}

struct AttemptEntry {
    attempt: Option<Attempt>,
    wake: Arc<EntryWake>,
    waker: Waker,
}

/// The node's attempts in flight and their one timer.
#[derive(Default)]
pub(super) struct Attempts {
    slots: Vec<AttemptEntry>,
    /// Slots without an attempt, for the next ones.
    free: Vec<usize>,
    /// Attempts in the slots.
    len: usize,
    ready: Arc<Ready>,
    /// Slots to poll that were queued by the node itself (new attempts,
    /// expired ones), and the list being polled (kept for its room).
    queued: Vec<usize>,
    polling: Vec<usize>,
    /// The timer, and the deadline it is set for.
    timer: Option<(Instant, Pin<Box<Sleep>>)>,
    /// The earliest deadline of the attempts added since the last poll.
    new_min: Option<Instant>,
    /// A driver is spawned on the node's context (see `node.rs`).
    pub driving: bool,
}

impl Attempts {
    pub fn push(&mut self, a: Attempt) {
        if self.new_min.is_none_or(|m| a.deadline.at < m) {
            self.new_min = Some(a.deadline.at);
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let wake = Arc::new(EntryWake {
                    slot: self.slots.len(),
                    queued: AtomicBool::new(false),
                    ready: self.ready.clone(),
                });
                self.slots.push(AttemptEntry {
                    attempt: None,
                    waker: Waker::from(wake.clone()),
                    wake,
                });
                self.slots.len() - 1
            }
        };
        let s = &mut self.slots[slot];
        s.attempt = Some(a);
        self.len += 1;
        // Its first poll: queued here, not through its waker (no lock).
        if !s.wake.queued.swap(true, Ordering::AcqRel) {
            self.queued.push(slot);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Polls the attempts that were woken, collecting those that finished
    /// into `out`, and keeps the timer at the earliest deadline. Returns
    /// whether attempts are left (the driver ends when none is).
    pub fn poll(&mut self, cx: &mut Context<'_>, out: &mut Vec<Finished>) -> bool {
        self.ready.driver.register(cx.waker());
        self.poll_queued(out);
        loop {
            if self.len == 0 {
                // Dropping the timer takes it out of the wheel.
                self.timer = None;
                self.new_min = None;
                return false;
            }
            if let Some(d) = self.new_min.take() {
                if self.timer.as_ref().is_none_or(|(t, _)| d < *t) {
                    self.arm(d);
                }
            }
            let Some((_, sleep)) = self.timer.as_mut() else {
                break;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                break;
            }
            // The timer fired: time out what is due, then set it for the
            // earliest deadline left.
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            for (i, s) in self.slots.iter_mut().enumerate() {
                let Some(a) = s.attempt.as_mut() else {
                    continue;
                };
                if a.expire(now) {
                    if !s.wake.queued.swap(true, Ordering::AcqRel) {
                        self.queued.push(i);
                    }
                } else if !a.expired && next.is_none_or(|n| a.deadline.at < n) {
                    next = Some(a.deadline.at);
                }
            }
            match next {
                Some(d) => self.arm(d),
                None => self.timer = None,
            }
            // The expired attempts answer now.
            self.poll_queued(out);
        }
        // Woken while being polled (a future that yields): once more on the
        // driver's next turn, not in a loop here, so one that always yields
        // cannot keep the node's thread.
        if !self.queued.is_empty() || !self.lock_ready().is_empty() {
            cx.waker().wake_by_ref();
        }
        true
    }

    /// Polls once every slot queued so far.
    fn poll_queued(&mut self, out: &mut Vec<Finished>) {
        let mut polling = std::mem::take(&mut self.polling);
        polling.append(&mut self.queued);
        polling.append(&mut self.lock_ready());
        for &i in &polling {
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            // Cleared before the poll: a wake during it queues it again.
            s.wake.queued.store(false, Ordering::Release);
            let Some(a) = s.attempt.as_mut() else {
                continue; // a finished attempt's late wake
            };
            if let Poll::Ready(f) = Pin::new(&mut *a).poll(&mut Context::from_waker(&s.waker)) {
                if f.end == End::Cut {
                    // Its tail stays, with the node's timeout as deadline.
                    if self.new_min.is_none_or(|m| a.deadline.at < m) {
                        self.new_min = Some(a.deadline.at);
                    }
                } else {
                    s.attempt = None;
                    self.free.push(i);
                    self.len -= 1;
                }
                out.push(f);
            }
        }
        polling.clear();
        self.polling = polling;
    }

    fn lock_ready(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.ready.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arm(&mut self, at: Instant) {
        match self.timer.as_mut() {
            Some((t, sleep)) => {
                *t = at;
                sleep.as_mut().reset(at);
            }
            None => self.timer = Some((at, Box::pin(tokio::time::sleep_until(at)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::node::in_flight::InFlight;
    use crate::outcome::ErrorKind;
    use std::time::Duration;

    /// Answers after the request's `timeout` field (as a delay), or panics
    /// when the URL says so.
    struct Delayed;

    impl Transport for Delayed {
        fn send(
            &self,
            req: HttpRequest,
        ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
            assert!(!req.url.ends_with("/panic"), "the transport panicked");
            Box::pin(async move {
                tokio::time::sleep(req.timeout).await;
                Ok(HttpReply::new(200))
            })
        }
    }

    fn request(path: &str, answer_after_ms: u64) -> HttpRequest {
        HttpRequest {
            method: awc::http::Method::GET,
            url: format!("http://node{path}"),
            headers: Vec::new(),
            body: Default::default(),
            timeout: Duration::from_millis(answer_after_ms),
            max_body: 1024,
        }
    }

    fn seq(task: u64) -> Seq {
        Seq { task, round: 1 }
    }

    fn job(task: u64) -> Arc<Job> {
        let job = crate::task::Task::get("s", "/x").prepare(task, Instant::now());
        Arc::new(job.expect("a valid task"))
    }

    type Seen = Vec<(u64, Result<u16, ErrorKind>, u64)>;

    /// Polls the set until it is empty; each task's answer with the
    /// (paused) time it was seen at, in milliseconds since `t0`, sorted by
    /// task; the ends of cut attempts' tails the same way.
    async fn run_all(mut set: Attempts, t0: Instant) -> (Seen, Seen) {
        let (mut seen, mut tails) = (Vec::new(), Vec::new());
        std::future::poll_fn(|cx| {
            let mut out = Vec::new();
            let more = set.poll(cx, &mut out);
            let now = Instant::now();
            for f in out {
                let ms = now.saturating_duration_since(t0).as_millis() as u64;
                // A cut keeps the slot, every other end frees it.
                assert_eq!(f.slot.is_none(), f.end == End::Cut);
                let to = if f.end == End::Tail {
                    &mut tails
                } else {
                    &mut seen
                };
                to.push((
                    f.seq.task,
                    f.result.map(|r| r.status).map_err(|e| e.kind),
                    ms,
                ));
            }
            if more {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        seen.sort_by_key(|s| s.0);
        tails.sort_by_key(|s| s.0);
        (seen, tails)
    }

    #[tokio::test(start_paused = true)]
    async fn one_timer_times_out_each_attempt_at_its_own_deadline() {
        let t0 = Instant::now();
        let slots = InFlight::new(Default::default());
        let ms = |n| t0 + Duration::from_millis(n);
        let mut set = Attempts::default();
        let mut add = |task, path: &str, answer_ms, deadline_ms, cancel| {
            // Task 6's deadline is its task's, the others' the node's timeout.
            let deadline = AttemptDeadline {
                at: ms(deadline_ms),
                by_task: task == 6,
                timeout_at: if task == 6 { ms(600) } else { ms(deadline_ms) },
                expected_ns: 0,
            };
            let a = Attempt::new(
                &Delayed,
                job(task),
                request(path, answer_ms),
                seq(task),
                false,
                None,
                slots.try_take(u32::MAX).unwrap(),
                t0,
                deadline,
                cancel,
            );
            set.push(a);
        };
        // Deadlines out of order: the later one is added first.
        add(1, "/a", 500, 300, None);
        add(2, "/b", 500, 100, None);
        add(3, "/c", 50, 200, None);
        add(4, "/panic", 10, 200, None);
        let (tx, rx) = oneshot::channel();
        add(5, "/d", 500, 400, Some(rx));
        add(6, "/e", 500, 250, None);
        let cancel = async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ = tx.send(());
        };
        let ((seen, tails), ()) = futures::join!(run_all(set, t0), cancel);
        assert_eq!(
            seen,
            vec![
                (1, Err(ErrorKind::Timeout), 300),
                (2, Err(ErrorKind::Timeout), 100),
                (3, Ok(200), 50),
                (4, Err(ErrorKind::Panicked), 0),
                (5, Err(ErrorKind::Cancelled), 150),
                (6, Err(ErrorKind::Deadline), 250),
            ]
        );
        // The cut ones wait for their backend: 5 until the node's timeout
        // (400 ms, before its answer at 500), 6 for its answer at 500 (its
        // timeout is at 600).
        assert_eq!(
            tails,
            vec![(5, Err(ErrorKind::Timeout), 400), (6, Ok(200), 500)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_ready_at_the_deadline_wins_and_a_dropped_switch_lets_it_run() {
        let t0 = Instant::now();
        let slots = InFlight::new(Default::default());
        let mut set = Attempts::default();
        let (tx, rx) = oneshot::channel::<()>();
        drop(tx);
        let a = Attempt::new(
            &Delayed,
            job(1),
            request("/a", 100),
            seq(1),
            true,
            None,
            slots.try_take(u32::MAX).unwrap(),
            t0,
            AttemptDeadline {
                at: t0 + Duration::from_millis(100),
                by_task: false,
                timeout_at: t0 + Duration::from_millis(100),
                expected_ns: 0,
            },
            Some(rx),
        );
        set.push(a);
        let (seen, tails) = run_all(set, t0).await;
        assert_eq!(seen, vec![(1, Ok(200), 100)]);
        assert_eq!(tails, vec![]);
    }

    /// A caller that leaves cancels its attempt at once (without a hedge's
    /// switch), and one that left before the dispatch is never sent.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_leaves_cancels_its_attempt_at_once() {
        let t0 = Instant::now();
        let slots = InFlight::new(Default::default());
        let mut set = Attempts::default();
        let deadline = AttemptDeadline {
            at: t0 + Duration::from_secs(10),
            by_task: false,
            timeout_at: t0 + Duration::from_secs(10),
            expected_ns: 300_000_000,
        };
        let (stays, leaves, left) = (job(1), job(2), job(3));
        left.reply.abandon();
        for (j, path) in [(&stays, "/a"), (&leaves, "/b"), (&left, "/panic")] {
            let no = j.id;
            let req = request(path, 500);
            set.push(Attempt::new(
                &Delayed,
                j.clone(),
                req,
                seq(no),
                false,
                None,
                slots.try_take(u32::MAX).unwrap(),
                t0,
                deadline,
                None,
            ));
        }
        let leave = async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            leaves.reply.abandon();
        };
        let ((seen, tails), ()) = futures::join!(run_all(set, t0), leave);
        // Answered at once; its slot is held for the 300 ms its answer was
        // expected to take (its request given up at 100 ms, not the 500 ms
        // the backend would have answered in).
        assert_eq!(tails, vec![(2, Err(ErrorKind::Cancelled), 300)]);
        assert_eq!(
            seen,
            vec![
                (1, Ok(200), 500),
                (2, Err(ErrorKind::Cancelled), 100),
                // Not sent: the transport (which panics on this path) was
                // never called.
                (3, Err(ErrorKind::Cancelled), 0),
            ]
        );
    }
}
