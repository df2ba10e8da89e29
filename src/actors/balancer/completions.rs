//! Coming back: completions (one, or a node's turn together) free their
//! slots and go to the queue; a streamed body's end, a lost attempt and a
//! cancelled hedge free theirs.

use super::*;

/// An attempt ended (or was refused): update the view, tell the queue.
impl Handler<Completed> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: Completed, ctx: &mut Self::Context) {
        let now = msg.at;
        let Some(i) = self.nodes.position(msg.node) else {
            // A removed node's last attempt: the queue still needs the answer.
            let (seq, hedge) = (msg.seq, msg.hedge);
            let answer = match msg.report {
                Some(report) => Answer::Done(AttemptDone {
                    seq,
                    node: msg.node,
                    address: "removed".into(),
                    hedge,
                    report,
                    credit: 0,
                    at: msg.at,
                }),
                None => Answer::Bounce(Bounce {
                    seq,
                    hedge,
                    credit: 0,
                }),
            };
            self.answer(answer, ctx);
            return;
        };
        self.done_working(msg.seq, msg.node);
        let address = self.nodes.node(i).address.clone();
        #[cfg(feature = "redis")]
        self.shared_completed(i, &msg, now);
        // A streamed answer's head: the attempt keeps its slot until its
        // body ends (`StreamEnded`), so no slot and no credit yet.
        let holds_slot = msg.report.as_ref().is_some_and(|r| r.stream.is_some());
        let credit = if holds_slot {
            0
        } else {
            self.free_slot(i, Some(msg.load), now);
            // The slot this attempt freed travels with its answer.
            self.take_credit(now)
        };
        let answer = match msg.report {
            Some(report) => Answer::Done(AttemptDone {
                seq: msg.seq,
                node: msg.node,
                address,
                hedge: msg.hedge,
                report,
                credit,
                at: msg.at,
            }),
            None => Answer::Bounce(Bounce {
                seq: msg.seq,
                hedge: msg.hedge,
                credit,
            }),
        };
        self.answer(answer, ctx);
        self.settle_gate(ctx, now);
    }
}

/// Attempts ended: update the view once, tell the queue of each.
impl Handler<Completions> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: Completions, ctx: &mut Self::Context) {
        let now = msg.at;
        let Some(i) = self.nodes.position(msg.node) else {
            // A removed node's last attempts: the queue still needs the answers.
            let answers = Answers {
                node: msg.node,
                address: "removed".into(),
                credit: 0,
                at: now,
                done: msg.done,
            };
            self.answer(Answer::Batch(answers), ctx);
            return;
        };
        if !self.working.is_empty() {
            for d in &msg.done {
                self.done_working(d.seq, msg.node);
            }
        }
        #[cfg(feature = "redis")]
        let msg = self.shared_completions(i, msg, now);
        let address = self.nodes.node(i).address.clone();
        // Every attempt of the batch frees its slot; one report for them all.
        self.free_slots(i, msg.done.len() as u32, Some(msg.load), now);
        // The slots they freed travel with the answers.
        let credit = self.take_credit(now);
        let answers = Answers {
            node: msg.node,
            address,
            credit,
            at: now,
            done: msg.done,
        };
        self.answer(Answer::Batch(answers), ctx);
        self.settle_gate(ctx, now);
    }
}

impl BalancerActor {
    /// The shared breaker's view of each attempt of a batch (feature
    /// `redis`): the same hook as for a single [`Completed`].
    #[cfg(feature = "redis")]
    pub(super) fn shared_completions(
        &mut self,
        i: usize,
        msg: Completions,
        now: Instant,
    ) -> Completions {
        if self.shared.is_none() {
            return msg;
        }
        let Completions {
            node,
            done,
            load,
            at,
        } = msg;
        let mut kept = Vec::with_capacity(done.len());
        for d in done {
            let one = Completed {
                node,
                seq: d.seq,
                hedge: d.hedge,
                report: Some(d.report),
                load: load.clone(),
                at,
            };
            self.shared_completed(i, &one, now);
            kept.push(Ended {
                seq: one.seq,
                hedge: one.hedge,
                report: one.report.expect("put in above"),
            });
        }
        Completions {
            node,
            done: kept,
            load,
            at,
        }
    }
}

/// A streamed body ended: free the slot its attempt held, grant credit.
impl Handler<StreamEnded> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: StreamEnded, ctx: &mut Self::Context) {
        // A removed node's stream: its slot left with it.
        if let Some(i) = self.nodes.position(msg.node) {
            self.free_slot(i, Some(msg.load), msg.at);
            self.settle(ctx, msg.at);
        }
    }
}

/// The queue's watchdog gave up on an attempt: free the slot it held.
impl Handler<AttemptLost> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: AttemptLost, ctx: &mut Self::Context) {
        let now = Instant::now();
        // Only a node whose mailbox is closed (its thread died) loses
        // attempts; a live node reports every attempt it took. Among dead
        // nodes, the ones known to work on the task (hedging) come first.
        let known = self.working.get(&msg.seq).cloned().unwrap_or_default();
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
        self.done_working(msg.seq, id);
        log::debug!(
            "service {}: node {}: a lost attempt's slot freed",
            self.service,
            self.nodes.node(i).address
        );
        self.free_slot(i, None, now);
        self.settle(ctx, now);
    }
}

/// A task was answered: cancel its attempts still out (hedging).
impl Handler<crate::actors::hedge::CancelTask> for BalancerActor {
    type Result = ();

    fn handle(&mut self, msg: crate::actors::hedge::CancelTask, _ctx: &mut Self::Context) {
        // The cancel must not overtake the dispatch it cancels.
        if self.flushing {
            self.flush();
        }
        for id in self.working.get(&msg.seq).into_iter().flatten() {
            if let Some(i) = self.nodes.position(*id) {
                self.nodes
                    .node(i)
                    .addr
                    .do_send(crate::actors::hedge::CancelAttempt { seq: msg.seq });
            }
        }
    }
}
