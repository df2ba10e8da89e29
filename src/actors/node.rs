//! `NodeActor`: one backend endpoint, its load counters and breaker.
//!
//! The node is the authority on its own state. The balancer keeps a view and
//! bumps it at once when it dispatches, but the node checks again on every
//! [`Dispatch`]: a dispatch its slot count or breaker refuses (a stale
//! view) comes back as a refusal ([`NodeReport::refused`]), and the task
//! returns to the queue's front without counting an attempt.
//!
//! This file is the actor's shell: every message handler of the node is
//! here, and each reads the clock, calls the node's core (module `core`:
//! its state and counts, which take `now` and return the report to send)
//! and sends that report to the balancer's inbox. A slot in use is a guard
//! (module `in_flight`) held by its attempt, streamed body or lease and
//! freed exactly once.
//!
//! The attempts in flight are one set owned by the node and polled by one
//! driver on its context, with one timer for all their deadlines (module
//! `attempts`): no tokio task and no timer per attempt. Each runs under its
//! timeout and `catch_unwind`: a panic inside the transport is a failed
//! attempt, never a lost task. The attempts that end in the same turn of the
//! node are accounted (counters, breaker, EWMA) and reported to the balancer
//! together: one [`NodeReport`] with one fresh [`LoadReport`]. Reports go
//! through the balancer's inbox ([`super::inbox`]): the nodes that finish in
//! the same turn wake the balancer with one message between them.
//!
//! A lease's task ([`crate::Dispatcher::lease`], module `lease`) makes no
//! attempt: the node lends the endpoint to the caller, and the slot stays
//! taken until the lease is returned.
//!
//! A streamed attempt ([`crate::Task::stream`], module `stream`) runs as a
//! task of its own (it lives as long as its body) and reports
//! twice: its head (carrying the body's stream; the slot stays taken) and
//! its body's end ([`NodeReport::streams_ended`]: the slot is freed and the
//! attempt accounted).
//!
//! Nodes run under actix's `Supervisor`: a node that stops is restarted with
//! the same struct, so counters and breaker survive, and the restart is
//! logged. A panic in a handler of the node itself (not in an attempt) is
//! caught and stops the node the same way ([`NodeActor::guarded`]): actix
//! restarts no panicking actor, and a dead node's closed mailbox would
//! swallow every dispatch sent to it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::inbox::InboxSender;
use super::protocol::{
    AttemptEnded, AttemptReport, Dispatch, Dispatches, GetLoad, HealthProbe, NodeControl,
    NodeReport, Seq,
};
use crate::algo::time;
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::transport::{
    ConnectionSettings, HttpRequest, Transport, TransportError, TransportFactory,
};

/// One backend endpoint. Started by the balancer, under a `Supervisor`.
pub struct NodeActor {
    core: Rc<RefCell<NodeCore>>,
    /// Where what ended is reported ([`NodeReport`]): the balancer's inbox.
    to_balancer: InboxSender<NodeReport>,
    factory: TransportFactory,
    transport: Option<Rc<dyn Transport>>,
    /// Attempts in flight (streamed ones aside) and their one timer.
    attempts: attempts::Attempts,
    /// The driver's list of attempts finished in a turn (kept for its room).
    finished: Vec<attempts::Finished>,
    /// What every lease of this node lends (made at the first lease).
    lending: Option<Arc<crate::lease::Endpoint>>,
}

/// What a node is built from.
pub(crate) struct NodeSpec {
    pub core: CoreSpec,
    pub to_balancer: InboxSender<NodeReport>,
    pub factory: TransportFactory,
}

impl NodeActor {
    pub(crate) fn new(spec: NodeSpec) -> Self {
        let now = Instant::now();
        let core = NodeCore::new(spec.core, now);
        Self {
            core: Rc::new(RefCell::new(core)),
            to_balancer: spec.to_balancer,
            factory: spec.factory,
            transport: None,
            attempts: Default::default(),
            finished: Vec::new(),
            lending: None,
        }
    }

    pub(crate) fn transport(&self) -> Option<Rc<dyn Transport>> {
        self.transport.clone()
    }

    pub(crate) fn address(&self) -> Arc<str> {
        self.core.borrow().address().clone()
    }

    pub(crate) fn set_max_concurrent(&mut self, max: u32) {
        self.core.borrow_mut().set_max_concurrent(max);
    }

    /// Runs a handler's body. A panic in it (a bug) is caught: logged at
    /// `error`, and the actor stops so that its supervisor restarts it with
    /// its state (counters, breaker, attempts in flight), where an uncaught
    /// panic would kill it for good (actix restarts no panicking actor) and
    /// leave the balancer sending to a closed mailbox. `fallback` is the
    /// handler's answer then.
    pub(crate) fn guarded<R>(
        &mut self,
        ctx: &mut Context<Self>,
        fallback: impl FnOnce() -> R,
        body: impl FnOnce(&mut Self, &mut Context<Self>) -> R,
    ) -> R {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(self, ctx))) {
            Ok(r) => r,
            Err(p) => {
                self.died(&*p, ctx);
                fallback()
            }
        }
    }

    /// A panic was caught in the actor itself: log it, stop for a restart.
    fn died(&mut self, p: &(dyn std::any::Any + Send), ctx: &mut Context<Self>) {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        if let Ok(core) = self.core.try_borrow() {
            log::error!(
                "service {}: node {}: the node actor panicked ({what}); stopped for its supervisor to restart it",
                core.service(),
                core.address()
            );
        } else {
            log::error!("a node actor panicked ({what}); stopped for its supervisor to restart it");
        }
        ctx.stop();
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // After a restart: the attempts still in flight need their driver.
        if !self.attempts.is_empty() && !self.attempts.driving {
            self.attempts.driving = true;
            ctx.spawn(Drive);
        }
        if self.transport.is_none() {
            let address = self.address();
            let transport = (self.factory)(&address);
            let core = self.core.borrow();
            let settings = ConnectionSettings::for_endpoint(core.cfg(), &address);
            if settings.skips_verify() && address.starts_with("https://") {
                log::warn!(
                    "service {}: node {}: TLS certificate verification is OFF \
                     (tls.insecure_skip_verify): any server can pose as this node",
                    core.service(),
                    address
                );
            }
            transport.configure(&settings);
            drop(core);
            self.transport = Some(transport);
        }
    }
}

impl Supervised for NodeActor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        // The restart dropped the context's items, the driver with them.
        self.attempts.driving = false;
        let mut core = self.core.borrow_mut();
        let restarts = core.restarted();
        log::warn!(
            "service {}: node {}: actor stopped; restarted by its supervisor (restart {}), counters and breaker kept",
            core.service(),
            core.address(),
            restarts
        );
    }
}

/// Performs (or refuses) each attempt of a balancer's turn, in order.
impl Handler<Dispatches> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: Dispatches, ctx: &mut Self::Context) {
        self.guarded(ctx, || (), |act, ctx| act.dispatch_all(msg, ctx));
    }
}

impl NodeActor {
    /// Performs (or refuses) each attempt of a balancer's turn, in order.
    fn dispatch_all(&mut self, msg: Dispatches, ctx: &mut Context<Self>) {
        // One clock read for the batch: they are all sent in this turn.
        let sent = Instant::now();
        let mut refused = Vec::new();
        let mut throttled = Vec::new();
        let mut at = sent;
        for d in msg.0 {
            at = d.at;
            if self.core.borrow_mut().throttles(d.at) {
                throttled.push(throttled_attempt(d.seq, d.hedge));
                continue;
            }
            if let Some(r) = self.dispatch(d, sent, ctx) {
                refused.push(r);
            }
        }
        if !refused.is_empty() || !throttled.is_empty() {
            let r = self.core.borrow().report_turn(throttled, refused, 0, at);
            self.to_balancer.send(r);
        }
    }
}

/// The end of an attempt dropped by client-side throttling: not sent, so
/// no slot was taken and the task may go to another node.
fn throttled_attempt(seq: Seq, hedge: bool) -> AttemptEnded {
    AttemptEnded {
        seq,
        hedge,
        report: AttemptReport {
            outcome: AttemptOutcome::Error(ErrorKind::Throttled),
            latency: Duration::ZERO,
            reply: None,
            retry_after: None,
            detail: Some(
                "dropped by client-side throttling: the backend refused most recent requests"
                    .into(),
            ),
            stream: None,
        },
    }
}

impl NodeActor {
    /// Starts one attempt (sent at `sent`: its timeout counts from then),
    /// or refuses it when the node cannot take it (the refusal is returned).
    fn dispatch(
        &mut self,
        msg: Dispatch,
        sent: Instant,
        ctx: &mut Context<Self>,
    ) -> Option<(Seq, bool)> {
        // The balancer's decision time, for the admission check only: its
        // view used the same. The attempt's own timeout starts when
        // it is sent (below), so a mailbox backlog never shortens it.
        let now = msg.at;
        let mut core = self.core.borrow_mut();
        let Ok((permit, slot)) = core.admit(msg.bypass_breaker, now) else {
            return Some((msg.seq, msg.hedge));
        };
        if let Some(hand) = msg.job.task.lease() {
            drop(core);
            self.lend(&msg, hand, permit, slot, sent, ctx);
            return None;
        }
        core.sent(sent);
        let job = msg.job;
        let timeout = job.task.attempt_timeout().unwrap_or(core.cfg().timeout);
        let expected = core.latency_estimate_ns();
        let task_deadline = job.deadline;
        let mut url = String::with_capacity(core.address().len() + job.path().len());
        url.push_str(core.address());
        url.push_str(job.path());
        let req = HttpRequest {
            method: job.task.method().clone(),
            url,
            headers: if core.headers().is_empty() {
                job.headers.clone()
            } else {
                core.headers().apply(&job.headers)
            },
            body: job.task.body_bytes().clone(),
            timeout,
            max_body: core.cfg().max_body,
        };
        log::debug!(
            "service {}: node {}: task {} attempt (timeout {:?})",
            core.service(),
            core.address(),
            job.id,
            timeout
        );
        let (seq, hedge) = (msg.seq, msg.hedge);
        let cancel = core
            .cfg()
            .hedge
            .is_some()
            .then(|| core.cancel_switch(seq, hedge));
        drop(core);
        let transport = self
            .transport
            .as_ref()
            .expect("transport made in started()");
        let deadline = attempt_deadline(sent, timeout, task_deadline, expected);
        if job.task.is_stream() {
            actix::spawn(stream::attempt(
                self.core.clone(),
                self.to_balancer.clone(),
                transport.clone(),
                job,
                req,
                seq,
                hedge,
                permit,
                slot,
                cancel,
                timeout,
                deadline,
                sent,
            ));
            return None;
        }
        let attempt = attempts::Attempt::new(
            &**transport,
            job,
            req,
            seq,
            hedge,
            permit,
            slot,
            sent,
            deadline,
            cancel,
        );
        self.attempts.push(attempt);
        if !self.attempts.driving {
            self.attempts.driving = true;
            ctx.spawn(Drive);
        }
        None
    }
}

/// Polls the node's attempts (on its context, after each batch of
/// messages and whenever an attempt is woken) and reports those that
/// finished; ends when none is left, so that an idle node can stop.
struct Drive;

impl ActorFuture<NodeActor> for Drive {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        act: &mut NodeActor,
        ctx: &mut Context<NodeActor>,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // A panic here (each attempt's own is caught inside) is the node's:
        // the driver ends, and the restart spawns a new one for the
        // attempts left.
        act.guarded(
            ctx,
            || std::task::Poll::Ready(()),
            |act, _| Drive::poll_attempts(act, task),
        )
    }
}

impl Drive {
    fn poll_attempts(
        act: &mut NodeActor,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut finished = std::mem::take(&mut act.finished);
        let more = act.attempts.poll(task, &mut finished);
        if !finished.is_empty() {
            let r = act
                .core
                .borrow_mut()
                .finish_all(&mut finished, Instant::now());
            act.to_balancer.send(r);
        }
        act.finished = finished;
        if more {
            std::task::Poll::Pending
        } else {
            act.attempts.driving = false;
            std::task::Poll::Ready(())
        }
    }
}

mod attempts;
mod breaker_log;
mod core;
mod in_flight;
pub(crate) mod lease;
mod retry_after;
mod stream;

pub(crate) use self::core::CoreSpec;
use self::core::NodeCore;

/// When an attempt gives up, and whose limit that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AttemptDeadline {
    /// The instant the attempt is cut.
    pub at: Instant,
    /// The task's deadline cuts it, before the node's own timeout would:
    /// the attempt then ends as [`ErrorKind::Deadline`], which says nothing
    /// about the node (a task that waited long in an overloaded queue must
    /// not open a healthy node's breaker).
    pub by_task: bool,
    /// The node's own timeout (`at` when it is not `by_task`): a cut
    /// attempt's backend is waited for until then (see `attempts`).
    pub timeout_at: Instant,
    /// How long its answer is expected to take (the node's latency
    /// estimate when it was sent), in nanoseconds: a cancelled attempt's
    /// slot stays taken until then, at most until `timeout_at` (see
    /// `attempts`). Raw, as only a cancel reads it.
    pub expected_ns: u64,
}

impl AttemptDeadline {
    /// When an attempt sent at `sent` is expected to have its answer.
    pub(super) fn expected_at(&self, sent: Instant) -> Instant {
        time::add(sent, Duration::from_nanos(self.expected_ns)).min(self.timeout_at)
    }

    /// The error an attempt cut here ends with, `sent` being when it left.
    pub(super) fn error(&self, sent: Instant) -> TransportError {
        let after = self.at.saturating_duration_since(sent);
        if self.by_task {
            TransportError::new(
                ErrorKind::Deadline,
                format!("the task's deadline cut the attempt {after:?} after sending"),
            )
        } else {
            TransportError::new(ErrorKind::Timeout, format!("no answer within {after:?}"))
        }
    }
}

/// When an attempt sent at `sent` gives up: `timeout` after it is sent, or
/// at the task's deadline if that comes first (but never less than 1 ms
/// after sending, so an attempt is not dead on arrival).
fn attempt_deadline(
    sent: Instant,
    timeout: Duration,
    task_deadline: Option<Instant>,
    expected_ns: u64,
) -> AttemptDeadline {
    let end = time::add(sent, timeout);
    match task_deadline {
        Some(d) => {
            let d = d.max(time::add(sent, Duration::from_millis(1)));
            AttemptDeadline {
                at: end.min(d),
                by_task: d < end,
                timeout_at: end,
                expected_ns,
            }
        }
        None => AttemptDeadline {
            at: end,
            by_task: false,
            timeout_at: end,
            expected_ns,
        },
    }
}

/// Runs an attempt (or its head) unless a hedged twin answers first or
/// the caller leaves (`job`'s `Submission` dropped): either ends it as
/// `Cancelled`; a cancel switch dropped unused lets it run.
pub(super) async fn cancellable<T>(
    attempt: impl std::future::Future<Output = Result<T, TransportError>>,
    mut cancel: Option<oneshot::Receiver<()>>,
    job: &crate::task::Job,
) -> Result<T, TransportError> {
    use std::future::Future;
    use std::task::Poll;
    futures::pin_mut!(attempt);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = attempt.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if let Some(rx) = cancel.as_mut() {
            match std::pin::Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Err(twin_answered())),
                Poll::Ready(Err(_)) => cancel = None,
                Poll::Pending => {}
            }
        }
        if job.reply.poll_abandoned(cx) {
            return Poll::Ready(Err(caller_left()));
        }
        Poll::Pending
    })
    .await
}

/// A hedged attempt's end when its twin answered first.
pub(super) fn twin_answered() -> TransportError {
    TransportError::new(ErrorKind::Cancelled, "a hedged twin answered first")
}

/// An attempt's end when its caller dropped the `Submission`.
pub(super) fn caller_left() -> TransportError {
    TransportError::new(ErrorKind::Cancelled, "the caller left before the answer")
}

fn panicked(p: Box<dyn std::any::Any + Send>) -> TransportError {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    TransportError::new(ErrorKind::Panicked, format!("attempt panicked: {what}"))
}

/// Answers the node's current load (and advances its breaker's clock).
impl Handler<GetLoad> for NodeActor {
    type Result = MessageResult<GetLoad>;

    fn handle(&mut self, _msg: GetLoad, ctx: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        // Whatever happens, the asker gets a report.
        let core = self.core.clone();
        self.guarded(
            ctx,
            || MessageResult(core.borrow().report()),
            |act, _| {
                let mut core = act.core.borrow_mut();
                core.poll_breaker(now);
                MessageResult(core.report())
            },
        )
    }
}

/// Accounts what a lease says, as an attempt's end is; frees its slot when
/// it is returned.
impl Handler<crate::lease::LeaseNews> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: crate::lease::LeaseNews, ctx: &mut Self::Context) {
        self.guarded(ctx, || (), |act, _| act.lease_news(msg));
    }
}

/// Cancels, restarts, limits and the shared breaker's word.
impl Handler<NodeControl> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: NodeControl, ctx: &mut Self::Context) {
        self.guarded(ctx, || (), |act, ctx| act.control(msg, ctx));
    }
}

impl NodeActor {
    fn control(&mut self, msg: NodeControl, ctx: &mut Context<Self>) {
        match msg {
            NodeControl::Cancel(seq) => self.core.borrow_mut().cancel(seq),
            // Its supervisor restarts it with its state.
            NodeControl::Crash => ctx.stop(),
            NodeControl::Panic => panic!("fault drill"),
            NodeControl::SetMaxConcurrent(max) => self.set_max_concurrent(max),
            NodeControl::SharedOpen(until) => self.core.borrow_mut().set_shared_open(until),
        }
    }
}

/// Runs one health check through the node's transport.
impl Handler<HealthProbe> for NodeActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: HealthProbe, ctx: &mut Self::Context) -> Self::Result {
        // A transport that panics on a probe fails the probe; the node
        // lives on.
        let failed = || -> ResponseFuture<bool> { Box::pin(async { false }) };
        self.guarded(ctx, failed, |act, _| act.probe(msg))
    }
}

impl NodeActor {
    /// Sends one health check; resolves to whether it answered 2xx/3xx.
    fn probe(&mut self, msg: HealthProbe) -> ResponseFuture<bool> {
        let Some(t) = self.transport() else {
            return Box::pin(async { false });
        };
        let req = HttpRequest {
            method: awc::http::Method::GET,
            url: format!("{}{}", self.address(), msg.path),
            headers: Vec::new(),
            body: bytes::Bytes::new(),
            timeout: msg.timeout,
            max_body: 64 * 1024,
        };
        // A transport that panics fails the probe, as it fails an attempt.
        let Ok(fut) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.send(req))) else {
            return Box::pin(async { false });
        };
        Box::pin(async move {
            matches!(
                tokio::time::timeout(msg.timeout, fut).await,
                Ok(Ok(r)) if (200..400).contains(&r.status)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_timeout_starts_when_it_is_sent() {
        let decided = Instant::now();
        // Sent 3 s after the queue's decision (a mailbox backlog): still the
        // whole 1 s timeout.
        let sent = decided + Duration::from_secs(3);
        let t = Duration::from_secs(1);
        let end = time::add(sent, t);
        let node = |at| AttemptDeadline {
            at,
            by_task: false,
            timeout_at: at,
            expected_ns: 0,
        };
        let task = |at| AttemptDeadline {
            at,
            by_task: true,
            timeout_at: end,
            expected_ns: 0,
        };
        assert_eq!(attempt_deadline(sent, t, None, 0), node(sent + t));
        // The task's deadline still caps it, and says so ...
        let d = sent + Duration::from_millis(300);
        assert_eq!(attempt_deadline(sent, t, Some(d), 0), task(d));
        assert_eq!(
            attempt_deadline(sent, t, Some(sent + t * 5), 0),
            node(sent + t)
        );
        // ... a deadline equal to the timeout is the node's timeout ...
        assert_eq!(attempt_deadline(sent, t, Some(sent + t), 0), node(sent + t));
        // ... and a deadline already passed leaves 1 ms, not a panic.
        assert_eq!(
            attempt_deadline(sent, t, Some(decided), 0),
            task(sent + Duration::from_millis(1))
        );
        // Extreme timeouts saturate.
        assert!(attempt_deadline(sent, Duration::MAX, None, 0).at > sent);
    }

    #[test]
    fn a_cut_by_the_tasks_deadline_is_not_a_timeout_of_the_node() {
        let sent = Instant::now();
        let t = Duration::from_secs(1);
        let cut = attempt_deadline(sent, t, Some(sent + Duration::from_millis(250)), 0);
        assert_eq!(cut.error(sent).kind, ErrorKind::Deadline);
        let timed_out = attempt_deadline(sent, t, None, 0);
        assert_eq!(timed_out.error(sent).kind, ErrorKind::Timeout);
    }
}
