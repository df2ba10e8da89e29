//! The node's state and its accounting: admission (slots, breaker; the
//! token is the balancer's to take), what an attempt that ended does to the counters, the EWMAs and
//! the breaker, and the load report the balancer gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::attempts;
use super::retry_after::retry_after;
use crate::actors::inbox::InboxSender;
use crate::actors::protocol::*;
use crate::algo::breaker::{Breaker, CallOutcome, Permit};
use crate::algo::concurrency::{LearnedLimit, SampleKind};
use crate::algo::ewma::{Ewma, PeakEwma};
use crate::algo::throttle::Throttle;
use crate::config::{HeaderSet, ServiceConfig};
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::transport::{HttpReply, TransportError};
use rand::rngs::SmallRng;

/// The node's state, shared by the actor and its attempts in flight.
pub(super) struct NodeCore {
    pub(super) id: NodeId,
    pub(super) service: Arc<str>,
    pub(super) address: Arc<str>,
    pub(super) cfg: Arc<ServiceConfig>,
    /// Where what ended is reported ([`NodeReport`]): the balancer's inbox.
    pub(super) to_balancer: InboxSender<NodeReport>,
    pub(super) max_concurrent: u32,
    /// The limit learned under `max_concurrent` (`max_concurrent: "auto"`).
    pub(super) learned: Option<LearnedLimit>,
    pub(super) in_flight: u32,
    pub(super) total: u64,
    pub(super) errors: u64,
    pub(super) latency: Ewma,
    pub(super) error_rate: Ewma,
    pub(super) rtt: PeakEwma,
    pub(super) last_latency: Duration,
    pub(super) breaker: Option<Breaker>,
    /// Open for the cluster until then (a shared breaker, feature `redis`):
    /// the more severe of this and the local breaker admits.
    pub(super) shared_open: Option<Instant>,
    pub(super) restarts: u32,
    /// The last report's version (see [`LoadReport::version`]).
    pub(super) reports: std::cell::Cell<u64>,
    /// Cancel switches of attempts in flight (only when the service hedges).
    pub(super) cancels: HashMap<(Seq, bool), oneshot::Sender<()>>,
    /// The configured headers of every attempt (the endpoint's over the
    /// service's), resolved once; usually empty.
    pub(super) headers: HeaderSet,
    /// Prometheus series (no-op without `metrics`).
    pub(super) metrics: crate::metrics::NodeMetrics,
    /// The last attempt that counted against the node, in words.
    pub(super) last_error: Option<Arc<str>>,
    /// Client-side throttling (`throttle`), and its draws.
    pub(super) throttle: Option<(Throttle, SmallRng)>,
}

impl NodeCore {
    pub(super) fn report(&self) -> LoadReport {
        self.reports.set(self.reports.get() + 1);
        LoadReport {
            version: self.reports.get(),
            in_flight: self.in_flight,
            total: self.total,
            errors: self.errors,
            latency_ewma: self.latency.get_or(0.0),
            last_latency: self.last_latency,
            error_rate: self.error_rate.get_or(0.0),
            rtt: self.rtt.get_secs(),
            rtt_at: self.rtt.last_observed(),
            breaker: self
                .breaker
                .as_ref()
                .map(|b| b.state())
                .unwrap_or(crate::algo::breaker::BreakerState::Closed),
            trips: self.breaker.as_ref().map_or(0, |b| b.trips()),
            restarts: self.restarts,
            last_error: self.last_error.clone(),
            limit: self.limit(),
            free_limit: match &self.learned {
                Some(l) => l.free_limit().min(self.limit()),
                None => self.limit(),
            },
            base_rtt: self
                .learned
                .as_ref()
                .and_then(LearnedLimit::base_rtt)
                .unwrap_or(Duration::ZERO),
        }
    }

    pub(super) fn poll_breaker(&mut self, now: Instant) {
        if let Some(b) = &mut self.breaker {
            if let Some(t) = b.poll(now) {
                log_transition(&self.service, &self.address, &t);
                self.metrics.transition(&t.from, &t.to);
            }
        }
    }

    /// Reports one turn of the node to the balancer, with a fresh load.
    pub(super) fn send_report(
        &self,
        done: Vec<AttemptEnded>,
        refused: Vec<(Seq, bool)>,
        streams_ended: u32,
        now: Instant,
    ) {
        self.to_balancer.send(NodeReport {
            node: self.id,
            done,
            refused,
            leased: 0,
            streams_ended,
            load: self.report(),
            at: now,
        });
    }

    /// Attempts it may have in flight now.
    pub(super) fn limit(&self) -> u32 {
        match &self.learned {
            Some(l) => l.limit().min(self.max_concurrent).max(1),
            None => self.max_concurrent,
        }
    }

    /// Teaches the learned limit (if any) what an attempt that ended after
    /// `latency` says; `in_flight` counts it. Pushback (429, 503) lowers the
    /// limit; an attempt cut by the task's deadline ran at least that long;
    /// what says nothing about the node (cancelled, not sent, a body error)
    /// is no sample.
    fn learn(&mut self, outcome: &AttemptOutcome, latency: Duration, in_flight: u32, now: Instant) {
        let Some(l) = &mut self.learned else {
            return;
        };
        let before = l.limit();
        let kind = match outcome {
            AttemptOutcome::Status(429 | 503) => {
                l.on_pushback(now);
                None
            }
            AttemptOutcome::Status(s) if *s >= 500 => Some(SampleKind::NodeFailure),
            AttemptOutcome::Status(_) => Some(SampleKind::Success),
            AttemptOutcome::Error(ErrorKind::Timeout) => Some(SampleKind::Timeout),
            AttemptOutcome::Error(ErrorKind::Deadline) => Some(SampleKind::Cut),
            o if o.is_node_failure() => Some(SampleKind::NodeFailure),
            _ => Some(SampleKind::Ignore),
        };
        if let Some(kind) = kind {
            l.on_sample(latency, in_flight, kind, now);
        }
        if l.limit() != before {
            let now_limit = l.limit().min(self.max_concurrent).max(1);
            self.metrics.limit(now_limit);
            log::debug!(
                "service {}: node {}: concurrency limit {} -> {}",
                self.service,
                self.address,
                before,
                l.limit()
            );
        }
    }

    /// Whether client-side throttling drops an attempt about to be sent at
    /// `now` (it then ends `throttled` without being sent).
    pub(super) fn throttles(&mut self, now: Instant) -> bool {
        let Some((t, rng)) = &mut self.throttle else {
            return false;
        };
        let drop = t.should_throttle(rng, now);
        if drop {
            self.metrics
                .attempt(&AttemptOutcome::Error(ErrorKind::Throttled), Duration::ZERO);
        }
        drop
    }

    /// Checks slots and breaker; takes a slot. The node's token bucket is
    /// the balancer's (see `actors/share`): a dispatch comes paid for.
    #[allow(clippy::result_unit_err)]
    pub(super) fn admit(
        &mut self,
        bypass_breaker: bool,
        now: Instant,
    ) -> Result<Option<Permit>, ()> {
        self.poll_breaker(now);
        if self.in_flight >= self.limit() {
            return Err(());
        }
        if !bypass_breaker && self.shared_open.is_some_and(|t| t > now) {
            return Err(());
        }
        let permit = match &mut self.breaker {
            Some(b) if !bypass_breaker => Some(b.admit(now).map_err(|_| ())?),
            _ => None,
        };
        self.in_flight += 1;
        self.metrics.in_flight(self.in_flight);
        Ok(permit)
    }

    /// Counts one attempt that says something about the node's health:
    /// totals, latency, error rate, peak-EWMA cost and the breaker.
    pub(super) fn record_health(
        &mut self,
        outcome: &AttemptOutcome,
        permit: Option<Permit>,
        latency: Duration,
        now: Instant,
    ) {
        let failed = outcome.is_node_failure();
        self.total += 1;
        self.last_latency = latency;
        self.latency.observe(latency.as_secs_f64());
        self.error_rate.observe(if failed { 1.0 } else { 0.0 });
        if failed {
            self.errors += 1;
            self.rtt
                .observe_failure(latency, self.cfg.balancer.failure_penalty, now);
        } else {
            self.rtt.observe(latency, now);
        }
        if let (Some(b), Some(p)) = (&mut self.breaker, permit) {
            let call = if failed {
                CallOutcome::Failure
            } else {
                CallOutcome::Success
            };
            if let Some(t) = b.record(p, call, latency, now) {
                log_transition(&self.service, &self.address, &t);
                self.metrics.transition(&t.from, &t.to);
            }
        }
    }

    /// Accounts what one call that ended says about the node (an attempt,
    /// or an outcome a lease reported): the learned limit, the metrics,
    /// totals, EWMAs and breaker, and the last error. `in_flight` counts
    /// the call; `detail` is its error in words.
    pub(super) fn account(
        &mut self,
        outcome: &AttemptOutcome,
        permit: Option<Permit>,
        latency: Duration,
        in_flight: u32,
        detail: Option<&Arc<str>>,
        now: Instant,
    ) {
        self.learn(outcome, latency, in_flight, now);
        if let Some((t, _)) = &mut self.throttle {
            // What the backend took: any answer but pushback. What never
            // reached it, or says nothing of it, is no request here.
            match *outcome {
                AttemptOutcome::Status(s) => t.record(s != 429 && s != 503, now),
                AttemptOutcome::Error(
                    ErrorKind::Cancelled | ErrorKind::NotSent | ErrorKind::Deadline,
                ) => {}
                o => t.record(!o.is_node_failure(), now),
            }
        }
        self.metrics.attempt(outcome, latency);
        // A cancelled hedge says nothing about the node. A request not sent
        // (a keep-alive connection closed under it) and an attempt cut by
        // its task's deadline count as attempts but say nothing about the
        // node's health either: no latency, no error rate, no breaker record
        // (a probe's permit left unrecorded ends at the probe deadline, the
        // breaker's safe side). A deadline is the task's, never the node's:
        // under overload tasks wait in the queue, and counting their cut
        // attempts as timeouts would open the breakers of healthy nodes.
        match outcome {
            AttemptOutcome::Error(ErrorKind::NotSent | ErrorKind::Deadline) => self.total += 1,
            AttemptOutcome::Error(ErrorKind::Cancelled) => {}
            _ => self.record_health(outcome, permit, latency, now),
        }
        if outcome.is_node_failure() {
            self.last_error = Some(match detail {
                Some(d) => format!("{outcome}: {d}").into(),
                None => outcome.to_string().into(),
            });
        }
    }

    /// Accounts the attempts that finished in one turn (at `now`) and
    /// reports them in one message.
    pub(super) fn finish_all(&mut self, finished: &mut Vec<attempts::Finished>, now: Instant) {
        let done = finished
            .drain(..)
            .map(|f| {
                let latency = now.saturating_duration_since(f.sent);
                self.finish(f.seq, f.hedge, f.permit, latency, f.result, now)
            })
            .collect();
        self.send_report(done, Vec::new(), 0, now);
    }

    /// Accounts one finished attempt (ended at `now`) and reports it alone.
    pub(super) fn finish_one(
        &mut self,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) {
        let done = self.finish(seq, hedge, permit, latency, result, now);
        self.send_report(vec![done], Vec::new(), 0, now);
    }

    /// Accounts one finished attempt (ended at `now`): counters, breaker,
    /// EWMA; returns its report.
    pub(super) fn finish(
        &mut self,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) -> AttemptEnded {
        let in_flight = self.in_flight;
        self.in_flight = self.in_flight.saturating_sub(1);
        self.metrics.in_flight(self.in_flight);
        if !self.cancels.is_empty() {
            self.cancels.remove(&(seq, hedge));
        }
        let outcome = match &result {
            Ok(r) => AttemptOutcome::Status(r.status),
            Err(e) => AttemptOutcome::Error(e.kind),
        };
        let detail: Option<Arc<str>> = result.as_ref().err().map(|e| e.detail.as_str().into());
        if let Err(e) = &result {
            log::debug!(
                "service {}: node {}: attempt failed: {e}",
                self.service,
                self.address
            );
        }
        self.account(&outcome, permit, latency, in_flight, detail.as_ref(), now);
        let (reply, retry_after) = match result {
            Ok(r) => {
                let ra = retry_after(&r);
                (Some(r), ra)
            }
            Err(_) => (None, None),
        };
        AttemptEnded {
            seq,
            hedge,
            report: AttemptReport {
                outcome,
                latency,
                reply,
                retry_after,
                detail,
                stream: None,
            },
        }
    }
}

pub(super) fn log_transition(service: &str, node: &str, t: &crate::algo::breaker::Transition) {
    use crate::algo::breaker::BreakerState::*;
    match t.to {
        Open { until } => log::warn!(
            "service {service}: node {node}: breaker {} -> open for {:?} ({})",
            state_name(&t.from),
            round_ms(until.saturating_duration_since(Instant::now())),
            t.reason
        ),
        HalfOpen => log::info!(
            "service {service}: node {node}: breaker open -> half-open ({})",
            t.reason
        ),
        Closed => log::info!(
            "service {service}: node {node}: breaker {} -> closed ({})",
            state_name(&t.from),
            t.reason
        ),
    }
}

/// A duration rounded to whole milliseconds, for log lines.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(((d.as_micros() + 500) / 1000) as u64)
}

fn state_name(s: &crate::algo::breaker::BreakerState) -> &'static str {
    use crate::algo::breaker::BreakerState::*;
    match s {
        Closed => "closed",
        Open { .. } => "open",
        HalfOpen => "half-open",
    }
}
