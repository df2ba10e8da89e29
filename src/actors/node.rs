//! `NodeActor`: one backend endpoint, its load counters, breaker and bucket.
//!
//! The node is the authority on its own state. The balancer keeps a view and
//! bumps it at once when it dispatches, but the node checks again on every
//! [`Dispatch`]: a dispatch its slot count, bucket or breaker refuses (a stale
//! view) comes back as a refusal, and the task returns to the queue's front
//! without counting an attempt.
//!
//! The attempts in flight are one set owned by the node and polled by one
//! driver on its context, with one timer for all their deadlines (module
//! `attempts`): no tokio task and no timer per attempt. Each runs under its
//! timeout and `catch_unwind`: a panic inside the transport is a failed
//! attempt, never a lost task. The attempts that end in the same turn of the
//! node are accounted (counters, breaker, EWMA) and reported to the balancer
//! together: one [`Completions`] with one fresh [`LoadReport`] (an attempt
//! that ends alone, the usual case under light load or in a large pool,
//! travels as a [`Completed`], with no list to allocate). Reports go through
//! the balancer's reports inbox (`balancer::reports`): the nodes that finish
//! in the same turn wake the balancer with one message between them.
//!
//! A streamed attempt ([`crate::Task::stream`], module `stream`) runs as a
//! task of its own (it lives as long as its body) and reports
//! twice: its head with [`Completed`] (carrying the body's stream; the slot
//! stays taken) and its body's end with [`StreamEnded`] (the slot is freed
//! and the attempt accounted).
//!
//! Nodes run under actix's `Supervisor`: a node that stops is restarted with
//! the same struct, so counters and breaker survive, and the restart is
//! logged.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::balancer::reports::{Report, ReportSender};
use super::messages::*;
use crate::algo::breaker::{Breaker, CallOutcome, Permit};
use crate::algo::ewma::{Ewma, PeakEwma};
use crate::algo::limiter::TokenBucket;
use crate::algo::time;
use crate::config::{HeaderSet, ServiceConfig};
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::transport::{
    ConnectionSettings, HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};

/// One backend endpoint. Started by the balancer, under a `Supervisor`.
pub struct NodeActor {
    core: Rc<RefCell<NodeCore>>,
    factory: TransportFactory,
    transport: Option<Rc<dyn Transport>>,
    /// Attempts in flight (streamed ones aside) and their one timer.
    attempts: attempts::Attempts,
    /// The driver's list of attempts finished in a turn (kept for its room).
    finished: Vec<attempts::Finished>,
}

/// The node's state, shared by the actor and its attempts in flight.
struct NodeCore {
    id: NodeId,
    service: Arc<str>,
    address: Arc<str>,
    cfg: Arc<ServiceConfig>,
    balancer: Recipient<Completed>,
    /// Where attempts that ended are reported ([`Completions`]).
    /// The balancer's reports inbox (finished attempts).
    completions: ReportSender,
    /// Where a streamed body's end is reported ([`StreamEnded`]).
    stream_ended: Recipient<StreamEnded>,
    max_concurrent: u32,
    in_flight: u32,
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
    bucket: Option<TokenBucket>,
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
}

/// What a node is built from.
pub(crate) struct NodeSpec {
    pub id: NodeId,
    pub service: Arc<str>,
    pub address: Arc<str>,
    pub max_concurrent: u32,
    pub cfg: Arc<ServiceConfig>,
    pub balancer: Recipient<Completed>,
    pub completions: ReportSender,
    pub stream_ended: Recipient<StreamEnded>,
    pub factory: TransportFactory,
    pub metrics: crate::metrics::NodeMetrics,
}

impl NodeActor {
    pub(crate) fn new(spec: NodeSpec) -> Self {
        let now = Instant::now();
        let cfg = spec.cfg;
        let headers = cfg.headers_for(&spec.address);
        let core = NodeCore {
            id: spec.id,
            service: spec.service,
            address: spec.address,
            balancer: spec.balancer,
            completions: spec.completions,
            stream_ended: spec.stream_ended,
            max_concurrent: spec.max_concurrent,
            in_flight: 0,
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
            bucket: cfg
                .rate_limit
                .per_node
                .map(|b| TokenBucket::new(b.rate, b.burst, now)),
            restarts: 0,
            reports: std::cell::Cell::new(0),
            cancels: HashMap::new(),
            headers,
            metrics: spec.metrics,
            cfg,
        };
        Self {
            core: Rc::new(RefCell::new(core)),
            factory: spec.factory,
            transport: None,
            attempts: Default::default(),
            finished: Vec::new(),
        }
    }

    pub(crate) fn transport(&self) -> Option<Rc<dyn Transport>> {
        self.transport.clone()
    }

    pub(crate) fn address(&self) -> Arc<str> {
        self.core.borrow().address.clone()
    }

    pub(crate) fn set_max_concurrent(&mut self, max: u32) {
        self.core.borrow_mut().max_concurrent = max.max(1);
    }
}

// === impl NodeCore ===

impl NodeCore {
    fn report(&self, now: Instant) -> LoadReport {
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
            tokens: self.bucket.as_ref().map(|b| b.available(now)),
            restarts: self.restarts,
        }
    }

    fn poll_breaker(&mut self, now: Instant) {
        if let Some(b) = &mut self.breaker {
            if let Some(t) = b.poll(now) {
                log_transition(&self.service, &self.address, &t);
                self.metrics.transition(&t.from, &t.to);
            }
        }
    }

    fn refuse(&self, seq: Seq, hedge: bool, now: Instant) {
        self.balancer.do_send(Completed {
            node: self.id,
            seq,
            hedge,
            report: None,
            load: self.report(now),
            at: now,
        });
    }

    /// Checks slots, bucket (before the breaker) and breaker; takes a slot.
    #[allow(clippy::result_unit_err)]
    fn admit(&mut self, bypass_breaker: bool, now: Instant) -> Result<Option<Permit>, ()> {
        self.poll_breaker(now);
        if self.in_flight >= self.max_concurrent {
            return Err(());
        }
        if self.bucket.as_ref().is_some_and(|b| b.check(now).is_err()) {
            self.metrics.rate_limited();
            return Err(());
        }
        if !bypass_breaker && self.shared_open.is_some_and(|t| t > now) {
            return Err(());
        }
        let permit = match &mut self.breaker {
            Some(b) if !bypass_breaker => Some(b.admit(now).map_err(|_| ())?),
            _ => None,
        };
        if let Some(b) = &mut self.bucket {
            let _ = b.try_acquire(now);
        }
        self.in_flight += 1;
        self.metrics.in_flight(self.in_flight);
        Ok(permit)
    }

    /// Counts one attempt that says something about the node's health:
    /// totals, latency, error rate, peak-EWMA cost and the breaker.
    fn record_health(
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

    /// Accounts the attempts that finished in one turn (at `now`) and
    /// reports them in one message.
    /// `finished` is left empty, its room kept for the next turn.
    fn finish_all(&mut self, finished: &mut Vec<attempts::Finished>, now: Instant) {
        if finished.len() == 1 {
            if let Some(f) = finished.pop() {
                let latency = now.saturating_duration_since(f.sent);
                self.finish_one(f.seq, f.hedge, f.permit, latency, f.result, now);
            }
            return;
        }
        let done = finished
            .drain(..)
            .map(|f| {
                let latency = now.saturating_duration_since(f.sent);
                self.finish(f.seq, f.hedge, f.permit, latency, f.result, now)
            })
            .collect();
        self.completions.send(Report::Many(Completions {
            node: self.id,
            done,
            load: self.report(now),
            at: now,
        }));
    }

    /// Accounts one finished attempt (ended at `now`) and reports it alone
    /// (a [`Completed`]: no list to allocate).
    fn finish_one(
        &mut self,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) {
        let done = self.finish(seq, hedge, permit, latency, result, now);
        self.completions.send(Report::One(Completed {
            node: self.id,
            seq: done.seq,
            hedge: done.hedge,
            report: Some(done.report),
            load: self.report(now),
            at: now,
        }));
    }

    /// Accounts one finished attempt (ended at `now`): counters, breaker,
    /// EWMA; returns its report.
    fn finish(
        &mut self,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) -> Ended {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.metrics.in_flight(self.in_flight);
        if !self.cancels.is_empty() {
            self.cancels.remove(&(seq, hedge));
        }
        let outcome = match &result {
            Ok(r) => AttemptOutcome::Status(r.status),
            Err(e) => AttemptOutcome::Error(e.kind),
        };
        self.metrics.attempt(&outcome, latency);
        // A cancelled hedge says nothing about the node. A request not sent
        // (a keep-alive connection closed under it) counts as an attempt but
        // says nothing about the node's health either: no latency, no error
        // rate, no breaker record (a probe's permit left unrecorded ends at
        // the probe deadline, the breaker's safe side).
        if outcome == AttemptOutcome::Error(ErrorKind::NotSent) {
            self.total += 1;
        } else if outcome != AttemptOutcome::Error(ErrorKind::Cancelled) {
            self.record_health(&outcome, permit, latency, now);
        }
        if let Err(e) = &result {
            log::debug!(
                "service {}: node {}: attempt failed: {e}",
                self.service,
                self.address
            );
        }
        let (reply, retry_after) = match result {
            Ok(r) => {
                let ra = retry_after(&r);
                (Some(r), ra)
            }
            Err(_) => (None, None),
        };
        Ended {
            seq,
            hedge,
            report: AttemptReport {
                outcome,
                latency,
                reply,
                retry_after,
                stream: None,
            },
        }
    }
}

fn log_transition(service: &str, node: &str, t: &crate::algo::breaker::Transition) {
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

pub(crate) fn state_name(s: &crate::algo::breaker::BreakerState) -> &'static str {
    use crate::algo::breaker::BreakerState::*;
    match s {
        Closed => "closed",
        Open { .. } => "open",
        HalfOpen => "half-open",
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
            let settings = ConnectionSettings::for_endpoint(&core.cfg, &address);
            if settings.skips_verify() && address.starts_with("https://") {
                log::warn!(
                    "service {}: node {}: TLS certificate verification is OFF \
                     (tls.insecure_skip_verify): any server can pose as this node",
                    core.service,
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
        core.restarts += 1;
        log::warn!(
            "service {}: node {}: actor stopped; restarted by its supervisor (restart {}), counters and breaker kept",
            core.service,
            core.address,
            core.restarts
        );
    }
}

/// Performs one attempt, or refuses it when the node cannot take it.
impl Handler<Dispatch> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: Dispatch, ctx: &mut Self::Context) {
        self.dispatch(msg, Instant::now(), ctx);
    }
}

/// Performs (or refuses) each attempt of a balancer's turn, in order.
impl Handler<Dispatches> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: Dispatches, ctx: &mut Self::Context) {
        // One clock read for the batch: they are all sent in this turn.
        let sent = Instant::now();
        for d in msg.0 {
            self.dispatch(d, sent, ctx);
        }
    }
}

impl NodeActor {
    /// Starts one attempt (sent at `sent`: its timeout counts from then),
    /// or refuses it when the node cannot take it.
    fn dispatch(&mut self, msg: Dispatch, sent: Instant, ctx: &mut Context<Self>) {
        // The balancer's decision time, for the admission check only: its
        // bucket mirror used the same. The attempt's own timeout starts when
        // it is sent (below), so a mailbox backlog never shortens it.
        let now = msg.at;
        let mut core = self.core.borrow_mut();
        let Ok(permit) = core.admit(msg.bypass_breaker, now) else {
            return core.refuse(msg.seq, msg.hedge, now);
        };
        let job = msg.job;
        let timeout = job.task.attempt_timeout().unwrap_or(core.cfg.timeout);
        let task_deadline = job.deadline;
        let mut url = String::with_capacity(core.address.len() + job.path().len());
        url.push_str(&core.address);
        url.push_str(job.path());
        let req = HttpRequest {
            method: job.task.method().clone(),
            url,
            headers: if core.headers.is_empty() {
                job.headers.clone()
            } else {
                core.headers.apply(&job.headers)
            },
            body: job.task.body_bytes().clone(),
            timeout,
            max_body: core.cfg.max_body,
        };
        log::debug!(
            "service {}: node {}: task {} attempt (timeout {:?})",
            core.service,
            core.address,
            job.id,
            timeout
        );
        let (seq, hedge) = (msg.seq, msg.hedge);
        let cancel = core.cfg.hedge.is_some().then(|| {
            let (tx, rx) = oneshot::channel::<()>();
            core.cancels.insert((seq, hedge), tx);
            rx
        });
        drop(core);
        let transport = self
            .transport
            .as_ref()
            .expect("transport made in started()");
        let deadline = attempt_deadline(sent, timeout, task_deadline);
        if job.task.is_stream() {
            actix::spawn(stream::attempt(
                self.core.clone(),
                transport.clone(),
                req,
                seq,
                hedge,
                permit,
                cancel,
                timeout,
                deadline,
            ));
            return;
        }
        let attempt = attempts::Attempt::new(
            &**transport,
            req,
            seq,
            hedge,
            permit,
            sent,
            deadline,
            cancel,
        );
        self.attempts.push(attempt);
        if !self.attempts.driving {
            self.attempts.driving = true;
            ctx.spawn(Drive);
        }
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
        _ctx: &mut Context<NodeActor>,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut finished = std::mem::take(&mut act.finished);
        let more = act.attempts.poll(task, &mut finished);
        if !finished.is_empty() {
            act.core
                .borrow_mut()
                .finish_all(&mut finished, Instant::now());
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
mod stream;

/// When an attempt sent at `sent` gives up: `timeout` after it is sent, or
/// at the task's deadline if that comes first (but never less than 1 ms
/// after sending, so an attempt is not dead on arrival).
fn attempt_deadline(sent: Instant, timeout: Duration, task_deadline: Option<Instant>) -> Instant {
    let end = time::add(sent, timeout);
    match task_deadline {
        Some(d) => end.min(d.max(time::add(sent, Duration::from_millis(1)))),
        None => end,
    }
}

/// Runs an attempt (or its head) unless a hedged twin answers first: a
/// cancel ends it as `Cancelled`; a cancel switch dropped unused lets it run.
pub(super) async fn cancellable<T>(
    attempt: impl std::future::Future<Output = Result<T, TransportError>>,
    cancel: Option<oneshot::Receiver<()>>,
) -> Result<T, TransportError> {
    let Some(rx) = cancel else {
        return attempt.await;
    };
    futures::pin_mut!(attempt);
    match futures::future::select(attempt, rx).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right((Ok(()), _)) => Err(TransportError::new(
            ErrorKind::Cancelled,
            "a hedged twin answered first",
        )),
        futures::future::Either::Right((Err(_), a)) => a.await,
    }
}

fn panicked(p: Box<dyn std::any::Any + Send>) -> TransportError {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    TransportError::new(ErrorKind::Panicked, format!("attempt panicked: {what}"))
}

/// `Retry-After` of a 429 or 503, as delta-seconds or an HTTP date.
fn retry_after(reply: &HttpReply) -> Option<Duration> {
    if reply.status != 429 && reply.status != 503 {
        return None;
    }
    let value = reply
        .headers
        .get(awc::http::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    #[allow(clippy::disallowed_methods)] // an HTTP date is wall-clock time
    let wall = std::time::SystemTime::now();
    parse_retry_after(value, wall)
}

/// Parses a `Retry-After` value: delta-seconds, or an HTTP date (a date in
/// the past means "now"). A value from a backend can be anything: it is
/// bounded here by [`time::MAX_DURATION`] (the queue caps it further by the
/// service's `max_retry_after` and the task's deadline); what does not parse
/// (a negative number, garbage) is ignored.
fn parse_retry_after(value: &str, wall_now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    let d = if value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty() {
        // Digits only: delta-seconds, however many (past u64 is "huge").
        value
            .parse::<u64>()
            .map_or(time::MAX_DURATION, Duration::from_secs)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(wall_now).unwrap_or(Duration::ZERO)
    };
    Some(d.min(time::MAX_DURATION))
}

/// Answers the node's current load (and advances its breaker's clock).
impl Handler<GetLoad> for NodeActor {
    type Result = MessageResult<GetLoad>;

    fn handle(&mut self, _msg: GetLoad, _ctx: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        let mut core = self.core.borrow_mut();
        core.poll_breaker(now);
        MessageResult(core.report(now))
    }
}

/// The shared breaker's open time (feature `redis`), from the balancer.
#[cfg(feature = "redis")]
impl Handler<crate::redis::SharedOpen> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: crate::redis::SharedOpen, _ctx: &mut Self::Context) {
        self.core.borrow_mut().shared_open = msg.0;
    }
}

/// Stops the actor; its supervisor restarts it with its state.
impl Handler<Crash> for NodeActor {
    type Result = ();

    fn handle(&mut self, _msg: Crash, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Drops the attempt of a task a hedged twin already answered.
impl Handler<super::hedge::CancelAttempt> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: super::hedge::CancelAttempt, _ctx: &mut Self::Context) {
        let mut core = self.core.borrow_mut();
        for hedge in [false, true] {
            if let Some(tx) = core.cancels.remove(&(msg.seq, hedge)) {
                let _ = tx.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        // 2015-10-21 07:28:00 GMT is `now`; one minute later:
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_extremes_are_bounded_never_a_panic() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let max = Some(time::MAX_DURATION);
        assert_eq!(parse_retry_after("18446744073709551615", now), max);
        assert_eq!(parse_retry_after("99999999999999999999999999", now), max);
        assert_eq!(parse_retry_after("31536001", now), max);
        assert_eq!(
            parse_retry_after("31536000", now),
            Some(Duration::from_secs(31_536_000))
        );
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("-18446744073709551615", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(parse_retry_after("\u{0}\u{ff}garbage", now), None);
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), max);
        // From the earliest wall clock too: no overflow either way.
        let epoch = std::time::UNIX_EPOCH;
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", epoch),
            max
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn an_attempts_timeout_starts_when_it_is_sent() {
        let decided = Instant::now();
        // Sent 3 s after the queue's decision (a mailbox backlog): still the
        // whole 1 s timeout.
        let sent = decided + Duration::from_secs(3);
        let t = Duration::from_secs(1);
        assert_eq!(attempt_deadline(sent, t, None), sent + t);
        // The task's deadline still caps it ...
        let d = sent + Duration::from_millis(300);
        assert_eq!(attempt_deadline(sent, t, Some(d)), d);
        assert_eq!(attempt_deadline(sent, t, Some(sent + t * 5)), sent + t);
        // ... but a deadline already passed leaves 1 ms, not a panic.
        assert_eq!(
            attempt_deadline(sent, t, Some(decided)),
            sent + Duration::from_millis(1)
        );
        // Extreme timeouts saturate.
        assert!(attempt_deadline(sent, Duration::MAX, None) > sent);
    }
}
