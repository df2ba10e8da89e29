//! The nodes' reports inbox: how a node's finished attempts reach the
//! balancer.
//!
//! A node pushes its turn's report ([`Completed`] for one attempt,
//! [`Completions`] for several) onto a list shared with the balancer; only a
//! node that finds the list empty sends the balancer a message
//! ([`Reported`]). The balancer takes the whole list in that one turn, so
//! when many nodes finish in the same turn (a large pool, where each node
//! holds about one task) their reports cost one actor message, not one each,
//! and the queue gets the turn's answers in one message too. Nothing waits
//! for a batch to fill: the first report wakes the balancer at once. It is
//! the queue's intake pattern ([`crate::actors::queue`]) on the way back.
//!
//! The list belongs to the balancer; nodes hold it weakly. When the balancer
//! goes away the list and the reports in it go with it, exactly as messages
//! to a dead actor are dropped; the queue's watchdog answers those attempts
//! `Lost`. A streamed answer's head and a refused dispatch still travel as
//! messages, in order with the [`StreamEnded`] that follows a head.
//!
//! [`StreamEnded`]: crate::actors::messages::StreamEnded

use std::sync::{Mutex, Weak};

use super::*;

/// One node's report of one turn.
pub(crate) enum Report {
    One(Completed),
    Many(Completions),
}

/// Reports waiting for the balancer's next [`Reported`] turn.
#[derive(Default)]
pub(crate) struct Reports {
    list: Mutex<Vec<Report>>,
}

/// The balancer has reports in its inbox.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Reported;

/// A node's side of its balancer's reports inbox.
#[derive(Clone)]
pub(crate) struct ReportSender {
    reports: Weak<Reports>,
    balancer: Recipient<Reported>,
}

impl ReportSender {
    pub(crate) fn new(reports: &Arc<Reports>, balancer: Recipient<Reported>) -> Self {
        Self {
            reports: Arc::downgrade(reports),
            balancer,
        }
    }

    /// Hands `r` to the balancer (dropped if the balancer is gone).
    pub(crate) fn send(&self, r: Report) {
        let Some(reports) = self.reports.upgrade() else {
            return;
        };
        let first = {
            let mut list = reports.list.lock().unwrap_or_else(|e| e.into_inner());
            list.push(r);
            list.len() == 1
        };
        if first {
            self.balancer.do_send(Reported);
        }
    }
}

/// Takes every report of the inbox, in order, as the same messages would
/// have been taken one by one.
impl Handler<Reported> for BalancerActor {
    type Result = ();

    fn handle(&mut self, _msg: Reported, ctx: &mut Self::Context) {
        let mut batch = std::mem::take(&mut self.reports_spare);
        std::mem::swap(
            &mut batch,
            &mut *self.reports.list.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for r in batch.drain(..) {
            match r {
                Report::One(c) => <Self as Handler<Completed>>::handle(self, c, ctx),
                Report::Many(c) => <Self as Handler<Completions>>::handle(self, c, ctx),
            }
        }
        // The list keeps its room for the next turn.
        self.reports_spare = batch;
    }
}
