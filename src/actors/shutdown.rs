//! Shutdown of a service's queue: close intake, drain, abort with a report.
//!
//! [`crate::Dispatcher::shutdown`] closes every queue's intake (later tasks
//! are refused `ShuttingDown`; tasks already accepted, parked ones
//! included, go on), waits for the queues to drain for the grace period,
//! then aborts: every task still held is answered `ShuttingDown` and listed
//! in the report as [`crate::Unfinished`], in arrival order, so none is lost
//! and each can be submitted again elsewhere.

use actix::prelude::*;

use super::protocol::{Abort, CloseIntake, Drain};
use super::queue::QueueActor;

/// Refuses every later task; tasks already accepted go on.
impl Handler<CloseIntake> for QueueActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseIntake, _ctx: &mut Self::Context) {
        self.closed = true;
    }
}

/// Resolves once every task is answered.
impl Handler<Drain> for QueueActor {
    type Result = ();

    fn handle(&mut self, msg: Drain, _ctx: &mut Self::Context) {
        self.drains.push(msg.reply);
        self.check_drained();
    }
}

/// Answers everything left `ShuttingDown` and hands the tasks back.
impl Handler<Abort> for QueueActor {
    type Result = MessageResult<Abort>;

    fn handle(&mut self, _msg: Abort, ctx: &mut Self::Context) -> Self::Result {
        let mut left = Vec::new();
        self.guard(ctx, |act, ctx| left = act.abort_all(ctx));
        MessageResult(left)
    }
}
