//! The intake inbox: how `Dispatcher::submit` hands a task to the queue.
//!
//! A submit pushes its [`Submit`] onto a list shared with the queue; only a
//! submit that finds the list empty sends the queue a message ([`Intake`]).
//! The queue takes the whole list in that one turn, so a burst of submits
//! costs one actor message, not one each, and a queued task keeps no mailbox
//! envelope (two allocations) while it waits to be taken. Nothing waits for
//! a batch to fill: the first submit of a burst wakes the queue at once.
//!
//! The list belongs to the queue (the dispatcher holds it weakly). When the
//! queue actor goes away, the list and every `Submit` still in it are
//! dropped with it, and their callers see the reply channel close (answered
//! `Internal` by [`crate::dispatcher::Submission`]), exactly as a message to
//! a dead actor would have been dropped. So every task still gets exactly
//! one result.

use std::sync::{Mutex, Weak};

use super::*;

/// Submits waiting for the queue's next [`Intake`] turn.
#[derive(Default)]
pub(crate) struct Inbox {
    list: Mutex<Vec<Submit>>,
}

/// The queue has submits in its inbox.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Intake;

/// The dispatcher's side of a queue's inbox.
#[derive(Clone)]
pub(crate) struct InboxSender {
    inbox: Weak<Inbox>,
    queue: Addr<QueueActor>,
}

impl InboxSender {
    pub(crate) fn new(inbox: &Arc<Inbox>, queue: Addr<QueueActor>) -> Self {
        Self {
            inbox: Arc::downgrade(inbox),
            queue,
        }
    }

    /// Hands `msg` to the queue. If the queue is gone, `msg` is dropped and
    /// its caller is answered through the closed reply channel.
    pub(crate) fn send(&self, msg: Submit) {
        let Some(inbox) = self.inbox.upgrade() else {
            return;
        };
        let first = {
            let mut list = inbox.list.lock().unwrap_or_else(|e| e.into_inner());
            list.push(msg);
            list.len() == 1
        };
        if first {
            self.queue.do_send(Intake);
        }
    }
}

impl Inbox {
    /// Takes every submit waiting here (at shutdown: they are answered and
    /// reported with the rest).
    pub(super) fn take_all(&self) -> Vec<Submit> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Takes every submit of the inbox, in order, and hands them over in one
/// pump (one `Routes` to the balancer), or sooner if the queue runs out of
/// room, so that a burst is refused no more than single submits would be.
impl Handler<Intake> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: Intake, ctx: &mut Self::Context) {
        let mut batch = std::mem::take(&mut self.intake_spare);
        {
            let mut list = self.inbox.list.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *list, &mut batch);
        }
        let mut due = false;
        for msg in batch.drain(..) {
            self.tick(Some(msg.task.job().submitted));
            self.guarded(ctx, |act, ctx| {
                if due && !act.has_room() {
                    act.pump(ctx);
                    due = false;
                }
                due |= act.take_in(msg, ctx);
            });
        }
        if due {
            self.guarded(ctx, |act, ctx| act.pump(ctx));
        }
        // Keep a small list for the next burst; give a big one back.
        if batch.capacity() <= 1024 {
            self.intake_spare = batch;
        }
    }
}
