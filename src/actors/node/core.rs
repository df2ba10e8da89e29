//! The node's state and its accounting: admission (slots, breaker; the
//! token is the balancer's to take), what an attempt that ended does to the counters, the EWMAs and
//! the breaker, and the load report the balancer gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::attempts;
use super::breaker_log::log_transition;
use super::in_flight::{InFlight, InFlightGuard};
use super::retry_after::retry_after;
use crate::actors::protocol::{AttemptEnded, AttemptReport, LoadReport, NodeId, NodeReport, Seq};
use crate::algo::breaker::{Breaker, CallOutcome, Permit};
use crate::algo::concurrency::{LearnedLimit, SampleKind};
use crate::algo::ewma::{Ewma, PeakEwma};
use crate::algo::throttle::Throttle;
use crate::config::{HeaderSet, ServiceConfig};
use crate::outcome::BodyStream;
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::transport::{HttpReply, TransportError};
use rand::rngs::SmallRng;

/// The node's state, shared by the actor and its attempts in flight.
pub(super) struct NodeCore {
    id: NodeId,
    service: Arc<str>,
    address: Arc<str>,
    cfg: Arc<ServiceConfig>,
    max_concurrent: u32,
    /// The limit learned under `max_concurrent` (`max_concurrent: "auto"`).
    learned: Option<LearnedLimit>,
    /// Slots in use, each held by a guard (see `in_flight`).
    in_flight: InFlight,
    /// The slots of leases out (a lease's end frees one).
    leases: Vec<InFlightGuard>,
    total: u64,
    errors: u64,
    latency: Ewma,
    error_rate: Ewma,
    rtt: PeakEwma,
    last_latency: Duration,
    breaker: Option<Breaker>,
    /// Open for the cluster until then (a shared breaker, feature `redis`):
    /// the more severe of this and the local breaker admits.
    shared_open: Option<Instant>,
    restarts: u32,
    /// The last report's version (see [`LoadReport::version`]).
    reports: std::cell::Cell<u64>,
    /// Cancel switches of attempts in flight (only when the service hedges).
    cancels: HashMap<(Seq, bool), oneshot::Sender<()>>,
    /// The configured headers of every attempt (the endpoint's over the
    /// service's), resolved once; usually empty.
    headers: HeaderSet,
    /// Prometheus series (no-op without `metrics`).
    metrics: crate::metrics::NodeMetrics,
    /// The last attempt that counted against the node, in words.
    last_error: Option<Arc<str>>,
    /// Client-side throttling (`throttle`), and its draws.
    throttle: Option<(Throttle, SmallRng)>,
}

/// What a node's core is built from.
pub(crate) struct CoreSpec {
    pub id: NodeId,
    pub service: Arc<str>,
    pub address: Arc<str>,
    pub max_concurrent: u32,
    /// Learn the limit under `max_concurrent` (`max_concurrent: "auto"`).
    pub learned: bool,
    pub cfg: Arc<ServiceConfig>,
    pub metrics: crate::metrics::NodeMetrics,
}

impl NodeCore {
    pub(super) fn new(spec: CoreSpec, now: Instant) -> Self {
        let cfg = spec.cfg;
        let headers = cfg.headers_for(&spec.address);
        NodeCore {
            id: spec.id,
            service: spec.service,
            address: spec.address,
            max_concurrent: spec.max_concurrent,
            learned: spec.learned.then(|| {
                let c = cfg.concurrency.clone();
                match cfg.balancer.seed {
                    Some(seed) => LearnedLimit::with_seed(c, seed ^ u64::from(spec.id.0), now),
                    None => LearnedLimit::new(c, now),
                }
            }),
            in_flight: InFlight::new(spec.metrics.clone()),
            leases: Vec::new(),
            total: 0,
            errors: 0,
            latency: Ewma::new(0.2),
            error_rate: Ewma::new(0.1),
            rtt: PeakEwma::new(cfg.balancer.default_rtt, cfg.balancer.decay, now),
            last_latency: Duration::ZERO,
            breaker: cfg
                .breaker
                .enabled
                .then(|| Breaker::new(cfg.breaker.breaker.clone())),
            shared_open: None,
            restarts: 0,
            reports: std::cell::Cell::new(0),
            cancels: HashMap::new(),
            headers,
            last_error: None,
            throttle: cfg.throttle.clone().map(|c| {
                use rand::SeedableRng;
                let rng = match cfg.balancer.seed {
                    Some(seed) => {
                        SmallRng::seed_from_u64(seed ^ 0x7468_726f ^ u64::from(spec.id.0))
                    }
                    None => SmallRng::from_os_rng(),
                };
                (Throttle::new(c, now), rng)
            }),
            metrics: spec.metrics,
            cfg,
        }
    }

    pub(super) fn service(&self) -> &Arc<str> {
        &self.service
    }

    pub(super) fn address(&self) -> &Arc<str> {
        &self.address
    }

    pub(super) fn cfg(&self) -> &Arc<ServiceConfig> {
        &self.cfg
    }

    /// The configured headers of every attempt.
    pub(super) fn headers(&self) -> &HeaderSet {
        &self.headers
    }

    pub(super) fn set_max_concurrent(&mut self, max: u32) {
        self.max_concurrent = max.max(1);
    }

    /// The shared breaker's word: open for the cluster until then, or not.
    pub(super) fn set_shared_open(&mut self, until: Option<Instant>) {
        self.shared_open = until;
    }

    /// The actor was restarted by its supervisor; the restarts so far.
    pub(super) fn restarted(&mut self) -> u32 {
        self.restarts += 1;
        self.restarts
    }

    /// A cancel switch for the attempt `(seq, hedge)` (services that hedge).
    pub(super) fn cancel_switch(&mut self, seq: Seq, hedge: bool) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel::<()>();
        self.cancels.insert((seq, hedge), tx);
        rx
    }

    /// Cancels the attempts of task `seq` still out (a twin answered).
    pub(super) fn cancel(&mut self, seq: Seq) {
        for hedge in [false, true] {
            if let Some(tx) = self.cancels.remove(&(seq, hedge)) {
                let _ = tx.send(());
            }
        }
    }

    pub(super) fn report(&self) -> LoadReport {
        self.reports.set(self.reports.get() + 1);
        LoadReport {
            version: self.reports.get(),
            in_flight: self.in_flight.get(),
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

    /// Slots in use now.
    pub(super) fn in_flight(&self) -> u32 {
        self.in_flight.get()
    }

    /// A lease took the slot `slot`: it stays in use until the lease ends.
    pub(super) fn lend_slot(&mut self, slot: InFlightGuard) {
        self.leases.push(slot);
    }

    /// A lease ended: its slot is free.
    pub(super) fn lease_ended(&mut self) {
        if let Some(slot) = self.leases.pop() {
            slot.release();
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

    /// The report of one turn of the node to the balancer, with a fresh
    /// load.
    pub(super) fn report_turn(
        &self,
        done: Vec<AttemptEnded>,
        refused: Vec<(Seq, bool)>,
        streams_ended: u32,
        now: Instant,
    ) -> NodeReport {
        NodeReport {
            node: self.id,
            done,
            refused,
            leased: 0,
            held: 0,
            streams_ended,
            load: self.report(),
            at: now,
        }
    }

    /// The report of a lease handed out: its task answered, its slot kept.
    pub(super) fn report_leased(&self, done: AttemptEnded, now: Instant) -> NodeReport {
        NodeReport {
            leased: 1,
            ..self.report_turn(vec![done], Vec::new(), 0, now)
        }
    }

    /// How long an answer of the node is expected to take, in
    /// nanoseconds: its latency estimate (a peak EWMA, which rises at once
    /// with a slow answer). `as` saturates.
    pub(super) fn latency_estimate_ns(&self) -> u64 {
        (self.rtt.get_secs() * 1e9) as u64
    }

    /// Attempts it may have in flight now.
    pub(super) fn limit(&self) -> u32 {
        match &self.learned {
            Some(l) => l.limit().min(self.max_concurrent).max(1),
            None => self.max_concurrent,
        }
    }

    /// Tells the learned limit (if any) that an attempt was sent at `sent`:
    /// its windows are the requests they sent, judged once all have ended.
    pub(super) fn sent(&mut self, sent: Instant) {
        if let Some(l) = &mut self.learned {
            l.on_send(sent);
        }
    }

    /// A streamed attempt's head arrived `latency` after it was sent: its
    /// send ends for the learned limit's window (every send it counted
    /// ends once), with no sample: the slot stays taken while the body
    /// flows, so its latency says nothing of the backend's queue.
    fn head_ended(&mut self, latency: Duration, now: Instant) {
        let in_flight = self.in_flight();
        self.teach(SampleKind::Ignore, false, latency, in_flight, now);
    }

    /// Teaches the learned limit (if any) what an attempt that ended after
    /// `latency` says; `in_flight` counts it. Pushback (429, 503) lowers the
    /// limit; a streamed attempt cut by the task's deadline ran at least
    /// that long (any other cut attempt teaches it from its tail, with the
    /// backend's answer); what says nothing about the node (cancelled, not
    /// sent, a body error) is no sample.
    fn learn(&mut self, outcome: &AttemptOutcome, latency: Duration, in_flight: u32, now: Instant) {
        let kind = match outcome {
            // Pushback lowers the limit on its own; as a sample it ends
            // its send and says nothing more.
            AttemptOutcome::Status(429 | 503) => SampleKind::Ignore,
            AttemptOutcome::Status(s) if *s >= 500 => SampleKind::NodeFailure,
            AttemptOutcome::Status(_) => SampleKind::Success,
            AttemptOutcome::Error(ErrorKind::Timeout) => SampleKind::Timeout,
            AttemptOutcome::Error(ErrorKind::Deadline) => SampleKind::Cut,
            o if o.is_node_failure() => SampleKind::NodeFailure,
            _ => SampleKind::Ignore,
        };
        let pushback = matches!(outcome, AttemptOutcome::Status(429 | 503));
        self.teach(kind, pushback, latency, in_flight, now);
    }

    /// Gives the learned limit (if any) one attempt's end: every send it
    /// counted ends exactly once (its window waits for all of them),
    /// after the pushback, if any, has lowered it.
    fn teach(
        &mut self,
        kind: SampleKind,
        pushback: bool,
        latency: Duration,
        in_flight: u32,
        now: Instant,
    ) {
        let Some(l) = &mut self.learned else {
            return;
        };
        let before = l.limit();
        if pushback {
            l.on_pushback(now);
        }
        log::trace!("node {}: {kind:?} after {latency:?}", self.address);
        l.on_sample(latency, in_flight, kind, now);
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
    ) -> Result<(Option<Permit>, InFlightGuard), ()> {
        self.poll_breaker(now);
        let limit = self.limit();
        if self.in_flight.get() >= limit {
            return Err(());
        }
        if !bypass_breaker && self.shared_open.is_some_and(|t| t > now) {
            return Err(());
        }
        let permit = match &mut self.breaker {
            Some(b) if !bypass_breaker => Some(b.admit(now).map_err(|_| ())?),
            _ => None,
        };
        let slot = self.in_flight.try_take(limit).ok_or(())?;
        Ok((permit, slot))
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
    /// the call (`None`: no sample for the learned limit, a cut attempt's
    /// tail gives it); `detail` is its error in words.
    pub(super) fn account(
        &mut self,
        outcome: &AttemptOutcome,
        permit: Option<Permit>,
        latency: Duration,
        in_flight: Option<u32>,
        detail: Option<&Arc<str>>,
        now: Instant,
    ) {
        if let Some(in_flight) = in_flight {
            self.learn(outcome, latency, in_flight, now);
        }
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

    /// Accounts the attempts that finished in one turn (at `now`); their
    /// report, in one message. A cut attempt's task is answered, its slot
    /// kept (`held`); a tail's end frees the slot and teaches the learned
    /// limit what the backend took, with no answer to pass on.
    pub(super) fn finish_all(
        &mut self,
        finished: &mut Vec<attempts::Finished>,
        now: Instant,
    ) -> NodeReport {
        let (mut held, mut freed) = (0, 0);
        let mut done = Vec::with_capacity(finished.len());
        for f in finished.drain(..) {
            let latency = now.saturating_duration_since(f.sent);
            match (f.end, f.slot) {
                (attempts::End::Tail, Some(slot)) => {
                    freed += 1;
                    self.tail_ended(slot, latency, &f.result, now);
                }
                (end, slot) => {
                    held += u32::from(end == attempts::End::Cut);
                    done.push(self.finish(
                        f.seq,
                        f.hedge,
                        (f.permit, slot),
                        latency,
                        f.result,
                        now,
                    ));
                }
            }
        }
        NodeReport {
            held,
            ..self.report_turn(done, Vec::new(), freed, now)
        }
    }

    /// The tail of a cut attempt ended after `latency`: the backend answered
    /// (or the node's timeout passed). Its slot is free; the learned limit
    /// gets the latency the cut hid. Nothing else counts it: its attempt was
    /// accounted when it was cut.
    fn tail_ended(
        &mut self,
        slot: InFlightGuard,
        latency: Duration,
        result: &Result<HttpReply, TransportError>,
        now: Instant,
    ) {
        let in_flight = slot.release();
        let outcome = match result {
            Ok(r) => AttemptOutcome::Status(r.status),
            Err(e) => AttemptOutcome::Error(e.kind),
        };
        self.learn(&outcome, latency, in_flight, now);
    }

    /// Accounts one finished attempt (ended at `now`); its report, alone.
    pub(super) fn finish_one(
        &mut self,
        seq: Seq,
        hedge: bool,
        (permit, slot): (Option<Permit>, InFlightGuard),
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) -> NodeReport {
        let done = self.finish(seq, hedge, (permit, Some(slot)), latency, result, now);
        self.report_turn(vec![done], Vec::new(), 0, now)
    }

    /// Accounts one finished attempt (ended at `now`): counters, breaker,
    /// EWMA; returns its report.
    pub(super) fn finish(
        &mut self,
        seq: Seq,
        hedge: bool,
        (permit, slot): (Option<Permit>, Option<InFlightGuard>),
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) -> AttemptEnded {
        // Without its slot, a cut whose tail goes on: the tail's end
        // teaches the learned limit, not the cut.
        let in_flight = slot.map(InFlightGuard::release);
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

// Streamed attempts (see `stream`).
impl NodeCore {
    /// A streamed attempt's head arrived: the queue gets it (and the body's
    /// stream) now; the slot stays taken until [`NodeCore::stream_ended`].
    pub(super) fn stream_head(
        &mut self,
        seq: Seq,
        hedge: bool,
        latency: Duration,
        head: HttpReply,
        body: BodyStream,
        now: Instant,
    ) -> NodeReport {
        // The race is over: a cancel for this round no longer applies.
        if !self.cancels.is_empty() {
            self.cancels.remove(&(seq, hedge));
        }
        self.head_ended(latency, now);
        let done = AttemptEnded {
            seq,
            hedge,
            report: AttemptReport {
                outcome: AttemptOutcome::Status(head.status),
                latency,
                reply: Some(head),
                retry_after: None,
                detail: None,
                stream: Some(body),
            },
        };
        self.report_turn(vec![done], Vec::new(), 0, now)
    }

    /// A streamed attempt's body ended: free the slot, account the attempt
    /// (latency to the head; the body's end decides failure), tell the
    /// balancer.
    pub(super) fn stream_ended(
        &mut self,
        permit: Option<Permit>,
        slot: InFlightGuard,
        latency: Duration,
        outcome: AttemptOutcome,
        now: Instant,
    ) -> NodeReport {
        slot.release();
        self.metrics.attempt(&outcome, latency);
        if outcome.is_node_failure() {
            log::debug!(
                "service {}: node {}: streamed body ended by {outcome}",
                self.service,
                self.address
            );
        }
        self.record_health(&outcome, permit, latency, now);
        self.report_turn(Vec::new(), Vec::new(), 1, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::breaker::BreakerState;
    use crate::config::Config;

    fn core(max: u32, now: Instant) -> NodeCore {
        core_with("", max, now)
    }

    /// A node of a service whose JSON has `extra` fields too.
    fn core_with(extra: &str, max: u32, now: Instant) -> NodeCore {
        let json = format!(
            r#"{{"services":[{{"name":"svc",{extra}
                "endpoints":[{{"address":"http://127.0.0.1:9/","max_concurrent":2}}],
                "breaker":{{"consecutive_failures":3,"open_for":"5s"}}}}]}}"#
        );
        let cfg = Config::from_json(&json).unwrap().services.remove(0);
        NodeCore::new(
            CoreSpec {
                id: NodeId(0),
                service: "svc".into(),
                address: "http://127.0.0.1:9/".into(),
                max_concurrent: max,
                learned: false,
                cfg: Arc::new(cfg),
                metrics: Default::default(),
            },
            now,
        )
    }

    fn failed() -> Result<HttpReply, TransportError> {
        Err(TransportError::new(ErrorKind::Connect, "refused"))
    }

    fn ok(status: u16) -> Result<HttpReply, TransportError> {
        Ok(HttpReply {
            status,
            headers: Default::default(),
            body: Default::default(),
            protocol: None,
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_node_admits_up_to_its_limit_and_each_end_frees_one_slot() {
        let t0 = Instant::now();
        let mut c = core(2, t0);
        let a = c.admit(false, t0).expect("first");
        let b = c.admit(false, t0).expect("second");
        assert_eq!(c.in_flight(), 2);
        assert!(c.admit(false, t0).is_err(), "max_concurrent is 2");
        let ms = Duration::from_millis(10);
        let r = c.finish_one(Seq { task: 1, round: 0 }, false, a, ms, failed(), t0);
        assert_eq!(r.done.len(), 1);
        assert_eq!(c.in_flight(), 1);
        // A lease's slot stays taken until the lease ends.
        let (_, slot) = c.admit(false, t0).expect("the freed slot");
        c.lend_slot(slot);
        assert_eq!(c.in_flight(), 2);
        c.lease_ended();
        assert_eq!(c.in_flight(), 1);
        // A second end of the lease frees nothing more.
        c.lease_ended();
        assert_eq!(c.in_flight(), 1);
        drop(b);
        assert_eq!(c.in_flight(), 0);
        assert_eq!(c.report().total, 1);
        assert_eq!(c.report().errors, 1);
    }

    #[test]
    fn three_failures_in_a_row_trip_the_breaker_and_it_refuses() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let ms = Duration::from_millis(10);
        for k in 0..3u64 {
            let held = c.admit(false, t0).expect("closed");
            let r = c.finish_one(Seq { task: k, round: 0 }, false, held, ms, failed(), t0);
            let open = matches!(r.load.breaker, BreakerState::Open { .. });
            assert_eq!(open, k == 2, "open after the third failure only");
        }
        assert_eq!(c.report().trips, 1);
        assert_eq!(c.in_flight(), 0);
        assert!(c.admit(false, t0).is_err(), "an open breaker refuses");
        // A dispatch that bypasses the breaker (max_ejected_percent) is
        // admitted, with no permit.
        let (permit, _slot) = c.admit(true, t0).expect("bypass");
        assert!(permit.is_none());
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn an_attempt_not_sent_or_cut_counts_but_says_nothing_of_the_node_and_a_cancel_not_even_that() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        for (k, kind) in [ErrorKind::NotSent, ErrorKind::Deadline]
            .into_iter()
            .enumerate()
        {
            let held = c.admit(false, t0).expect("closed");
            let seq = Seq {
                task: k as u64,
                round: 1,
            };
            let err = Err(TransportError::new(kind, "x"));
            let e = c.finish(seq, false, (held.0, Some(held.1)), ms(40), err, t0);
            assert_eq!(e.report.outcome, AttemptOutcome::Error(kind));
        }
        let r = c.report();
        assert_eq!((r.total, r.errors), (2, 0), "counted, never an error");
        assert_eq!((r.latency_ewma, r.last_latency), (0.0, Duration::ZERO));
        assert_eq!(r.last_error, None);
        // A cancelled twin is not even an attempt of the node's.
        let cancelled = AttemptOutcome::Error(ErrorKind::Cancelled);
        c.account(&cancelled, None, ms(40), Some(1), None, t0);
        let r = c.report();
        assert_eq!((r.total, r.errors, r.last_latency), (2, 0, Duration::ZERO));
        // A failure of the node's own counts, with its words.
        let detail: Arc<str> = "refused".into();
        let refused = AttemptOutcome::Error(ErrorKind::Connect);
        c.account(&refused, None, ms(40), Some(1), Some(&detail), t0);
        let r = c.report();
        assert_eq!((r.total, r.errors, r.last_latency), (3, 1, ms(40)));
        assert_eq!(r.last_error.as_deref(), Some("connect error: refused"));
    }

    #[test]
    fn the_throttle_counts_what_the_backend_took_and_skips_what_never_reached_it() {
        let t0 = Instant::now();
        let mut c = core_with(r#""throttle":{"k":2,"window":"30s"},"#, 10, t0);
        let outcomes = [
            AttemptOutcome::Status(200), // taken
            AttemptOutcome::Status(429), // pushback
            AttemptOutcome::Status(503), // pushback
            AttemptOutcome::Status(500), // taken (an answer, not pushback)
            AttemptOutcome::Error(ErrorKind::Connect),
            AttemptOutcome::Error(ErrorKind::Reset),
            AttemptOutcome::Error(ErrorKind::Body), // taken: says nothing bad
            AttemptOutcome::Error(ErrorKind::Cancelled), // none of these count
            AttemptOutcome::Error(ErrorKind::NotSent),
            AttemptOutcome::Error(ErrorKind::Deadline),
        ];
        for o in &outcomes {
            c.account(o, None, ms(10), Some(1), None, t0);
        }
        let (t, _) = c.throttle.as_ref().expect("throttle on");
        assert_eq!(t.counts(t0), (7, 3), "(requests, accepts)");
    }

    #[test]
    fn a_shared_open_breaker_refuses_until_its_end_unless_bypassed() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let (permit, slot) = c.admit(false, t0).expect("closed");
        assert!(permit.is_some(), "a local breaker's permit");
        drop(slot);
        c.set_shared_open(Some(t0 + ms(1000)));
        assert!(c.admit(false, t0).is_err(), "open for the cluster");
        assert!(c.admit(false, t0 + ms(999)).is_err());
        let (permit, slot) = c.admit(true, t0).expect("a bypass ignores it");
        assert!(permit.is_none());
        drop(slot);
        assert_eq!(c.in_flight(), 0, "a refusal takes no slot");
        let (permit, _slot) = c.admit(false, t0 + ms(1000)).expect("open until then");
        assert!(permit.is_some());
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn an_attempt_that_ends_drops_its_own_cancel_switch_only() {
        use tokio::sync::oneshot::error::TryRecvError;
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let seq = Seq { task: 4, round: 2 };
        let mut first = c.cancel_switch(seq, false);
        let mut hedge = c.cancel_switch(seq, true);
        let held = c.admit(false, t0).expect("closed");
        let e = c.finish(seq, false, (held.0, Some(held.1)), ms(30), ok(200), t0);
        assert_eq!((e.seq, e.hedge), (seq, false));
        assert_eq!(
            first.try_recv(),
            Err(TryRecvError::Closed),
            "its switch is gone"
        );
        assert_eq!(
            hedge.try_recv(),
            Err(TryRecvError::Empty),
            "the twin's is kept"
        );
        c.cancel(seq);
        assert_eq!(hedge.try_recv(), Ok(()), "the twin is told to stop");
    }

    #[test]
    fn a_streamed_attempt_holds_its_slot_from_its_head_to_its_body_end() {
        use tokio::sync::oneshot::error::TryRecvError;
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let seq = Seq { task: 9, round: 1 };
        let mut switch = c.cancel_switch(seq, true);
        let mut other = c.cancel_switch(seq, false);
        let (permit, slot) = c.admit(false, t0).expect("closed");
        let Ok(head) = ok(200) else { unreachable!() };
        let body = BodyStream::new(tokio::sync::mpsc::channel(1).1);
        let r = c.stream_head(seq, true, ms(20), head, body, t0 + ms(20));
        assert_eq!((r.node, r.at, r.streams_ended), (NodeId(0), t0 + ms(20), 0));
        assert_eq!(r.done.len(), 1);
        let d = &r.done[0];
        assert_eq!((d.seq, d.hedge), (seq, true));
        assert_eq!(d.report.outcome, AttemptOutcome::Status(200));
        assert_eq!(d.report.latency, ms(20));
        assert!(d.report.stream.is_some() && d.report.reply.is_some());
        assert_eq!(
            switch.try_recv(),
            Err(TryRecvError::Closed),
            "the race is over"
        );
        assert_eq!(other.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(c.in_flight(), 1, "the body holds the slot");
        assert_eq!(c.report().total, 0, "accounted at the body's end");

        let failed = AttemptOutcome::Error(ErrorKind::Reset);
        let r = c.stream_ended(permit, slot, ms(20), failed, t0 + ms(90));
        assert_eq!((r.node, r.at, r.streams_ended), (NodeId(0), t0 + ms(90), 1));
        assert!(r.done.is_empty() && r.refused.is_empty());
        assert_eq!(c.in_flight(), 0);
        assert_eq!(
            (r.load.total, r.load.errors, r.load.last_latency),
            (1, 1, ms(20))
        );
    }

    #[test]
    fn a_turn_accounts_every_finished_attempt_and_reports_them_in_order() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let a = Seq { task: 1, round: 1 };
        let b = Seq { task: 2, round: 3 };
        let mut finished = Vec::new();
        for (seq, hedge, sent, result) in [(a, false, t0, ok(503)), (b, true, t0 + ms(10), ok(200))]
        {
            let (permit, slot) = c.admit(false, t0).expect("closed");
            finished.push(attempts::Finished {
                seq,
                hedge,
                permit,
                slot: Some(slot),
                sent,
                result,
                end: attempts::End::Answer,
            });
        }
        assert_eq!(c.in_flight(), 2);
        let r = c.finish_all(&mut finished, t0 + ms(30));
        assert!(finished.is_empty());
        let done: Vec<_> = r
            .done
            .iter()
            .map(|d| (d.seq, d.hedge, d.report.outcome, d.report.latency))
            .collect();
        assert_eq!(
            done,
            vec![
                (a, false, AttemptOutcome::Status(503), ms(30)),
                (b, true, AttemptOutcome::Status(200), ms(20)),
            ]
        );
        assert_eq!(
            (r.node, r.at, r.leased, r.streams_ended),
            (NodeId(0), t0 + ms(30), 0, 0)
        );
        assert_eq!((r.load.total, r.load.errors), (2, 1));
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn a_lease_handed_out_is_reported_as_leased_with_its_answer() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        let seq = Seq { task: 5, round: 1 };
        let held = c.admit(false, t0).expect("closed");
        let done = c.finish(seq, false, (held.0, Some(held.1)), ms(10), ok(200), t0);
        let r = c.report_leased(done, t0 + ms(10));
        assert_eq!(
            (r.node, r.at, r.leased, r.streams_ended),
            (NodeId(0), t0 + ms(10), 1, 0)
        );
        assert_eq!(r.done.len(), 1);
        assert_eq!(r.done[0].seq, seq);
    }

    #[test]
    fn restarts_and_report_versions_count_up_one_at_a_time() {
        let t0 = Instant::now();
        let mut c = core(10, t0);
        assert_eq!((c.report().version, c.report().version), (1, 2));
        assert_eq!((c.restarted(), c.restarted()), (1, 2));
        let r = c.report();
        assert_eq!((r.version, r.restarts), (3, 2));
    }

    /// Every send the learned limit counts ends once, however the attempt
    /// ends: a streamed attempt's head ends its (with no sample: its slot
    /// stays taken while the body flows), so a window is judged at its
    /// last answer, not after waiting out a send that would never end.
    #[test]
    fn a_streamed_head_ends_its_send() {
        let t0 = Instant::now();
        let mut c = core(4, t0);
        c.learned = Some(LearnedLimit::with_seed(Default::default(), 1, t0));
        let ms = Duration::from_millis;
        // The first end starts the learned limit's count.
        c.head_ended(ms(1), t0);
        // 32 sent 1 ms apart at its limit of 4; each ends 20 ms later.
        let sent = t0 + ms(100);
        for i in 0..32 {
            c.sent(sent + ms(i));
        }
        let last_rtt = |c: &NodeCore| c.learned.as_ref().and_then(LearnedLimit::last_rtt);
        for i in 0..31 {
            c.learn(&AttemptOutcome::Status(200), ms(20), 4, sent + ms(i + 20));
        }
        assert_eq!(last_rtt(&c), None, "judged before its last send ended");
        c.head_ended(ms(20), sent + ms(51));
        assert_eq!(last_rtt(&c), Some(ms(20)));
    }
}
