//! `QueueActor`: the shell around [`QueueCore`]. Each handler reads the
//! clock, calls the core, and sends what the core's output says: the
//! results to their reply slots, the turn to the balancer, one actix timer
//! for the core's earliest timer, the drains once every task is answered.
//!
//! A panic inside the core is caught here: it is logged at `error`, every
//! task the queue holds is answered `Internal`, and the queue starts afresh
//! (its counters kept), so a bug never leaves callers waiting. A dead
//! balancer is found the same way (its turn cannot be sent), and the
//! dispatcher rebuilds the pipeline.
//!
//! Shutdown: [`crate::Dispatcher::shutdown`] closes every queue's intake
//! (`CloseIntake`: later tasks are refused `ShuttingDown`; tasks already
//! accepted, waiting ones included, go on), waits for the queues to drain
//! (`Drain`) for the grace period, then aborts (`Abort`): every task still
//! held is answered `ShuttingDown` and listed in the report as
//! [`crate::Unfinished`], in arrival order, so none is lost and each can be
//! submitted again elsewhere.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::core::QueueCore;
use super::port::BalancerPort;
use crate::actors::drill::PanicDrill;
#[cfg(test)]
use crate::actors::inbox::InboxSender;
use crate::actors::inbox::{Inbox, InboxReady};
use crate::actors::protocol::{
    Abort, BalancerTurn, CloseIntake, Drain, GetQueueStats, PipelineDown, ReplyTx, Stop, Submit,
};
use crate::config::ServiceConfig;
use crate::outcome::{Rejection, TaskResult};
use crate::task::Task;

/// The queue of one service. Also answers [`Task`] messages sent straight to it.
pub struct QueueActor {
    core: QueueCore,
    balancer: Option<BalancerPort>,
    ids: Arc<AtomicU64>,
    /// Submits from the dispatcher, taken a burst at a time.
    inbox: Arc<Inbox<Submit>>,
    /// The inbox's previous list, kept for reuse while it is small.
    intake_spare: Vec<Submit>,
    /// The one actix timer, for the core's earliest timer.
    timer: Option<(Instant, SpawnHandle)>,
    drains: Vec<oneshot::Sender<()>>,
    /// The store a shared rate per tenant is leased from
    /// (`tenants.shared`).
    tenant_store: Option<Arc<dyn crate::actors::share::TenantStore>>,
}

impl QueueActor {
    /// A queue answering to `balancer` (the pipeline's, or a stand-in for
    /// tests that deliver the balancer's answers in an exact order), with
    /// its intake.
    #[cfg(test)]
    pub(crate) fn with_port(
        cfg: Arc<ServiceConfig>,
        balancer: BalancerPort,
    ) -> (Addr<QueueActor>, InboxSender<Submit>) {
        let q = QueueActor::new(cfg, balancer, Arc::default(), Default::default());
        let inbox = q.inbox.clone();
        let addr = q.start();
        let sender = InboxSender::new(&inbox, addr.clone().recipient::<InboxReady>());
        (addr, sender)
    }

    /// A queue answering to `balancer`, with the service's metric series.
    pub(crate) fn new(
        cfg: Arc<ServiceConfig>,
        balancer: BalancerPort,
        ids: Arc<AtomicU64>,
        metrics: crate::metrics::ServiceMetrics,
    ) -> Self {
        QueueActor {
            core: QueueCore::new(cfg, metrics, Instant::now()),
            balancer: Some(balancer),
            ids,
            inbox: Arc::default(),
            intake_spare: Vec::new(),
            timer: None,
            drains: Vec::new(),
            tenant_store: None,
        }
    }

    /// The queue's intake, for the dispatcher's side of it.
    pub(crate) fn inbox(&self) -> Arc<Inbox<Submit>> {
        self.inbox.clone()
    }

    /// Runs `f` on the core; a panic inside it is answered, not left
    /// silent. Then sends what the core's output says.
    fn guarded(&mut self, ctx: &mut Context<Self>, f: impl FnOnce(&mut QueueCore)) {
        if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut self.core))) {
            let what = panic_message(&p);
            self.core.recover(&format!("the queue panicked: {what}"));
        }
        self.flush(ctx);
    }

    /// Sends the core's output: results, then the turn (if the balancer
    /// has stopped, the pipeline is declared dead instead), then sets the
    /// timer and resolves the drains.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        self.send_results();
        let out = self.core.output();
        if !out.turn.is_empty() {
            let turn = std::mem::take(&mut out.turn);
            match self.balancer.as_ref() {
                Some(b) if b.turn.connected() => b.turn.do_send(turn),
                _ => {
                    drop(turn);
                    self.core.declare_dead("the service's balancer stopped");
                    self.core.output().turn = Default::default();
                    self.send_results();
                }
            }
        }
        let out = self.core.output();
        if std::mem::take(&mut out.disarm) {
            if let Some((_, h)) = self.timer.take() {
                ctx.cancel_future(h);
            }
        }
        if let Some(at) = out.wake.take() {
            if self.timer.is_none_or(|(t, _)| at < t) {
                if let Some((_, h)) = self.timer.take() {
                    ctx.cancel_future(h);
                }
                self.arm(at, ctx);
            }
        }
        self.ask_tenants(ctx);
        self.core.end_input();
    }

    /// Sends the calls for tenants' shared tokens the core asked for.
    fn ask_tenants(&mut self, ctx: &mut Context<Self>) {
        let Some(store) = self.tenant_store.as_ref() else {
            return;
        };
        let Some((bucket, asks)) = self.core.tenant_asks() else {
            return;
        };
        let reply = ctx.address().recipient();
        for (tenant, flow, want) in asks {
            store.lease_tenant(
                self.core.service(),
                tenant,
                flow,
                bucket,
                want,
                reply.clone(),
            );
        }
    }

    /// Sends the results the core made, each to its reply slot, then
    /// resolves the drains if every task was answered.
    fn send_results(&mut self) {
        let out = self.core.output();
        for (tx, result) in out.results.drain(..) {
            tx.send(result);
        }
        if std::mem::take(&mut out.drained) {
            for d in self.drains.drain(..) {
                let _ = d.send(());
            }
        }
    }

    /// Sets the actix timer for `at`: the core's timers fire then.
    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let delay = at.saturating_duration_since(Instant::now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.guarded(ctx, |core| core.on_timer(Instant::now()));
        });
        self.timer = Some((at, h));
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

impl Actor for QueueActor {
    type Context = Context<Self>;

    /// The watchdog: once a second, attempts that never reported back are
    /// answered `Lost`.
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_secs(1), |act, ctx| {
            act.guarded(ctx, |core| core.on_watchdog(Instant::now()));
        });
    }
}

/// Reports the queue's counters.
impl Handler<GetQueueStats> for QueueActor {
    type Result = MessageResult<GetQueueStats>;

    fn handle(&mut self, _msg: GetQueueStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.core.stats(Instant::now()))
    }
}

/// Stops the queue and its balancer.
impl Handler<Stop> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        if let Some(b) = self.balancer.take() {
            b.stop.do_send(Stop);
        }
        ctx.stop();
    }
}

/// A task sent straight to the queue's address.
impl Handler<Task> for QueueActor {
    type Result = ResponseFuture<TaskResult>;

    fn handle(&mut self, task: Task, ctx: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let service = self.core.service().clone();
        let checked = if task.service().eq_ignore_ascii_case(&service) {
            task.prepare(id, now)
        } else {
            let why = format!(
                "task names service {:?} but was sent to the queue of service {:?}",
                task.service(),
                service
            );
            Err((task.given_id().unwrap_or(id), why))
        };
        match checked {
            Ok(job) => {
                let job = Arc::new(job);
                let submission = crate::task::Submission::waiting(job.clone(), service);
                let msg = Submit {
                    task: ReplyTx::new(job),
                    wait: false,
                };
                self.guarded(ctx, |core| core.submit(msg, now));
                Box::pin(submission)
            }
            Err((id, reason)) => {
                let result =
                    crate::task::rejected(id, service, Rejection::InvalidTask(reason), now);
                self.core.refused_invalid(&result);
                Box::pin(crate::task::Submission::ready(result))
            }
        }
    }
}

/// Takes every submit of the inbox, in order, and hands them over in one
/// pump (one route list to the balancer), or sooner if the queue runs out
/// of room, so that a burst is refused no more than single submits would be.
impl Handler<InboxReady> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: InboxReady, ctx: &mut Self::Context) {
        let mut batch = std::mem::take(&mut self.intake_spare);
        self.inbox.take_into(&mut batch);
        let mut due = false;
        let mut now = None;
        for msg in batch.drain(..) {
            let at = msg.task.job().submitted;
            now = Some(at);
            self.guarded(ctx, |core| {
                if due && !core.has_room() {
                    core.hand_over(at);
                    due = false;
                }
                due |= core.take_in(msg, at);
            });
        }
        if let Some(at) = now.filter(|_| due) {
            self.guarded(ctx, |core| core.hand_over(at));
        }
        // Keep a small list for the next burst; give a big one back.
        if batch.capacity() <= 1024 {
            self.intake_spare = batch;
        }
    }
}

/// One turn of the balancer: its news taken in order, then one pump.
impl Handler<BalancerTurn> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: BalancerTurn, ctx: &mut Self::Context) {
        self.guarded(ctx, |core| core.on_turn(msg, Instant::now()));
    }
}

/// Refuses every later task; tasks already accepted go on.
impl Handler<CloseIntake> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseIntake, _ctx: &mut Self::Context) {
        self.core.close_intake();
    }
}

/// Resolves once every task is answered.
impl Handler<Drain> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Drain, _ctx: &mut Self::Context) {
        self.drains.push(msg.reply);
        if self.core.is_empty() {
            for d in self.drains.drain(..) {
                let _ = d.send(());
            }
        }
    }
}

/// Answers everything left `ShuttingDown` and hands the tasks back.
impl Handler<Abort> for QueueActor {
    type Result = MessageResult<Abort>;

    fn handle(&mut self, _msg: Abort, ctx: &mut Self::Context) -> Self::Result {
        let mut left = Vec::new();
        // Submits still in the inbox were accepted by `submit`: they are
        // answered and reported like the tasks already taken.
        let unread = self.inbox.take_all();
        self.guarded(ctx, |core| left = core.abort_all(unread, Instant::now()));
        MessageResult(left)
    }
}

/// Panics inside a guarded handler (a fault drill): the queue answers its
/// tasks and goes on.
impl Handler<PanicDrill> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: PanicDrill, ctx: &mut Self::Context) {
        self.guarded(ctx, |_| panic!("fault drill"));
    }
}

/// The dispatcher found the pipeline dead: answer everything, then stop.
impl Handler<PipelineDown> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: PipelineDown, ctx: &mut Self::Context) {
        self.core.declare_dead(msg.0);
        // Its balancer is gone: nothing more to tell it.
        self.core.output().turn = Default::default();
        self.flush(ctx);
        ctx.stop();
    }
}

#[cfg(test)]
impl QueueActor {
    /// Task `id`'s number in the core's table, if it is held.
    pub(super) fn find(&self, id: crate::task::TaskId) -> Option<super::core::TaskNo> {
        self.core.find(id)
    }
}

impl Handler<crate::actors::share::UseTenantStore> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: crate::actors::share::UseTenantStore, _ctx: &mut Self::Context) {
        self.core.use_tenant_store(msg.0.settings());
        self.tenant_store = Some(msg.0);
    }
}

impl Handler<crate::actors::share::TenantGranted> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: crate::actors::share::TenantGranted, ctx: &mut Self::Context) {
        self.guarded(ctx, |core| core.tenant_granted(msg, Instant::now()));
    }
}
