//! Coming back: the nodes' reports (through the balancer's inbox) free
//! their slots and go on to the queue; a lost attempt frees its slot; an
//! answered task's attempt still out is cancelled.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Effect, Placement};
use crate::actors::protocol::{
    AttemptEnded, NodeAnswers, NodeControl, NodeId, NodeReport, Seq, ToQueue,
};
use crate::actors::view::NodeView;

impl Placement {
    /// The nodes' reports taken from the inbox, in order (`batch` is left
    /// empty, its room kept for the next turn).
    pub(crate) fn on_reports(&mut self, batch: &mut Vec<NodeReport>) {
        for r in batch.drain(..) {
            self.on_report(r);
        }
    }
}

impl Placement {
    /// What ended at one node in one of its turns: update the view once,
    /// tell the queue of each attempt.
    fn on_report(&mut self, r: NodeReport) {
        let now = r.at;
        let NodeReport {
            node,
            done,
            refused,
            leased,
            held,
            streams_ended,
            load,
            at,
        } = r;
        let Some(i) = self.nodes.position(node) else {
            // A removed node's last attempts: the queue still needs the
            // answers (its slots left with it).
            self.pass_on(node, "removed".into(), at, done, refused);
            return;
        };
        if !self.working.is_empty() {
            for d in &done {
                self.done_working(d.seq, node);
            }
            for (seq, _) in &refused {
                self.done_working(*seq, node);
            }
        }
        // (A lease handed out is no call: nothing for the shared breaker.)
        if self.shared.is_some() && leased == 0 {
            for d in &done {
                self.shared_completed(i, Some(&d.report.outcome), true, &load, now);
            }
            for _ in &refused {
                self.shared_completed(i, None, true, &load, now);
            }
            if done.is_empty() && refused.is_empty() {
                // A fresh load alone (a lease's outcomes, a body's end):
                // a trip it shows is the cluster's too.
                self.shared_completed(i, None, false, &load, now);
            }
        }
        let address = self.nodes.node(i).address.clone();
        // A streamed answer's head keeps its slot until its body ends, a
        // lease handed out until it is returned, a cut attempt until its
        // backend is done.
        let heads = done.iter().filter(|d| d.report.stream.is_some()).count()
            + leased as usize
            + held as usize;
        let freed = (done.len().saturating_sub(heads) + refused.len()) as u32 + streams_ended;
        // Every attempt that ended frees its slot; one report for them all.
        self.free_slots(i, freed, Some(load), now);
        self.pass_on(node, address, at, done, refused);
        // The slots they freed travel with the answers.
        self.grant(now);
    }

    /// Tells the queue what ended at node `node` (`address`): the attempts
    /// as the node reported them, and a bounce for each refused dispatch.
    fn pass_on(
        &mut self,
        node: NodeId,
        address: Arc<str>,
        at: Instant,
        done: Vec<AttemptEnded>,
        refused: Vec<(Seq, bool)>,
    ) {
        if !done.is_empty() {
            let answers = NodeAnswers {
                node,
                address,
                at,
                done,
            };
            self.answer(ToQueue::Ended(answers));
        }
        // A stale view's refusal: the task goes back to the front (not a
        // refusal of the task itself, which `refused` would mean).
        for (seq, hedge) in refused {
            let back = ToQueue::Bounce {
                seq,
                hedge,
                refused: false,
            };
            self.answer(back);
        }
    }

    /// Attempts the queue's watchdog gave up on: free the slots they held.
    pub(super) fn on_lost(&mut self, seq: Seq, now: Instant) {
        // Only a node whose mailbox is closed (its thread died) loses
        // attempts; a live node reports every attempt it took. Among dead
        // nodes, the ones known to work on the task (hedging) come first.
        let known = self.working.get(&seq).cloned().unwrap_or_default();
        let dead = |n: &NodeView| n.in_flight > 0 && !n.addr.connected();
        let i = known
            .iter()
            .filter_map(|id| self.nodes.position(*id))
            .find(|&i| dead(self.nodes.node(i)))
            .or_else(|| (0..self.nodes.len()).find(|&i| dead(self.nodes.node(i))));
        let Some(i) = i else {
            log::debug!(
                "service {}: a lost attempt held no slot on a dead node",
                self.service
            );
            return;
        };
        let id = self.nodes.node(i).id;
        self.done_working(seq, id);
        log::debug!(
            "service {}: node {}: a lost attempt's slot freed",
            self.service,
            self.nodes.node(i).address
        );
        self.free_slot(i, None, now);
    }

    /// A task was answered: cancel its attempts still out (hedging).
    pub(super) fn on_cancel(&mut self, seq: Seq) {
        // A cancel must reach the node after the dispatch it cancels.
        if self.flushing {
            self.flush();
        }
        for id in self.working.get(&seq).into_iter().flatten() {
            if let Some(i) = self.nodes.position(*id) {
                let addr = self.nodes.node(i).addr.clone();
                self.out
                    .effects
                    .push(Effect::Control(addr, NodeControl::Cancel(seq)));
            }
        }
    }
}
