//! Lending the endpoint ([`crate::Dispatcher::lease`]): where an attempt
//! would start, the node hands the caller a [`Lease`] instead, and what the
//! lease says comes back here.
//!
//! ```text
//!  Dispatch (a lease's task) ─► admit (slot, breaker)         ─► Lease into the task's hand
//!                                                              └► NodeReport: the task answered, `leased` (slot kept)
//!  Lease::report ──LeaseNews::Report──► account (as an attempt) ──► NodeReport: a fresh load
//!  Lease::complete / drop ──LeaseNews::End──► account (if an outcome) + free the slot ──► NodeReport: `streams_ended`
//! ```
//!
//! An outcome is accounted by [`NodeCore::account`], the code an attempt
//! that ended goes through (counters, EWMAs, breaker, learned limit,
//! metrics), so a failure reported through a lease opens the breaker for
//! HTTP tasks too. The lease captured this node's address: its news never
//! reaches another node, whatever happens to the pool meanwhile (a removed
//! node drains while leases are out, as while attempts are). The slot's end
//! is reported to the balancer as a streamed body's end is: it frees the
//! slot in the balancer's view.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::in_flight::InFlightGuard;
use super::NodeActor;
use crate::actors::protocol::{AttemptEnded, AttemptReport, Dispatch};
use crate::algo::breaker::Permit;
use crate::lease::{Endpoint, Lease, LeaseHand, LeaseNews, Sample};
use crate::outcome::AttemptOutcome;
use crate::transport::{ConnectionSettings, HttpReply};

impl NodeActor {
    /// Lends the endpoint to the lease task of `msg` (admitted with
    /// `permit` at `now`): the lease goes into the task's hand, and the
    /// task is reported answered with the slot kept.
    pub(super) fn lend(
        &mut self,
        msg: &Dispatch,
        hand: &LeaseHand,
        permit: Option<Permit>,
        slot: InFlightGuard,
        now: Instant,
        ctx: &mut Context<Self>,
    ) {
        self.core.borrow_mut().lend_slot(slot);
        let endpoint = match &self.lending {
            Some(e) => e.clone(),
            None => {
                let core = self.core.borrow();
                let e = Arc::new(Endpoint {
                    node: ctx.address().recipient(),
                    address: core.address().clone(),
                    authority: Endpoint::authority_of(core.address()),
                    settings: ConnectionSettings::for_endpoint(core.cfg(), core.address()),
                    headers: core.headers().clone(),
                    timeout: core.cfg().timeout,
                });
                drop(core);
                self.lending = Some(e.clone());
                e
            }
        };
        hand.put(Lease::new(endpoint, hand.book.clone(), permit, now));
        let core = self.core.borrow();
        log::debug!(
            "service {}: node {}: task {} leased",
            core.service(),
            core.address(),
            msg.job.id
        );
        // A success to the queue (the task is done once the lease is out);
        // not an attempt of the node's: nothing is accounted until the
        // lease reports.
        let done = AttemptEnded {
            seq: msg.seq,
            hedge: msg.hedge,
            report: AttemptReport {
                outcome: AttemptOutcome::Status(200),
                latency: Duration::ZERO,
                reply: Some(HttpReply::new(200)),
                retry_after: None,
                detail: None,
                stream: None,
            },
        };
        self.to_balancer.send(core.report_leased(done, now));
    }
}

impl NodeActor {
    pub(super) fn lease_news(&mut self, msg: LeaseNews) {
        let mut core = self.core.borrow_mut();
        let (sample, end) = match msg {
            LeaseNews::Report(s) => (Some(s), false),
            LeaseNews::End(s) => (s, true),
        };
        let now = Instant::now();
        if let Some(Sample {
            outcome: Some(outcome),
            permit,
            latency,
        }) = sample
        {
            // The lease still holds its slot: it counts in flight.
            let in_flight = core.in_flight();
            core.account(&outcome, permit, latency, Some(in_flight), None, now);
        }
        if end {
            core.lease_ended();
        }
        self.to_balancer
            .send(core.report_turn(Vec::new(), Vec::new(), u32::from(end), now));
    }
}
