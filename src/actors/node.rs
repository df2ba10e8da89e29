//! `NodeActor`: one backend endpoint, its load counters, breaker and bucket.
//!
//! The node is the authority on its own state. The balancer keeps a view and
//! bumps it at once when it dispatches, but the node checks again on every
//! [`Dispatch`]: a dispatch its slot count, bucket or breaker refuses (a stale
//! view) comes back as a refusal, and the task returns to the queue's front
//! without counting an attempt.
//!
//! Each attempt runs as a detached task (not on the actor's context, so a
//! node with many requests in flight does not re-scan them on every wake),
//! under the attempt timeout and `catch_unwind`: a panic inside the transport
//! is a failed attempt, never a lost task. When it ends, the attempt task
//! updates the node's counters and breaker itself (the node's state is
//! shared with its attempt tasks on the node's thread, which saves a message
//! per attempt) and reports to the balancer: [`Completed`] with a fresh
//! [`LoadReport`].
//!
//! Nodes run under actix's `Supervisor`: a node that stops is restarted with
//! the same struct, so counters and breaker survive, and the restart is
//! logged.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::FutureExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::messages::*;
use crate::algo::breaker::{Breaker, CallOutcome, Permit};
use crate::algo::ewma::{Ewma, PeakEwma};
use crate::algo::limiter::TokenBucket;
use crate::config::ServiceConfig;
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::transport::{HttpReply, HttpRequest, Transport, TransportError, TransportFactory};

/// One backend endpoint. Started by the balancer, under a `Supervisor`.
pub struct NodeActor {
    core: Rc<RefCell<NodeCore>>,
    factory: TransportFactory,
    transport: Option<Rc<dyn Transport>>,
}

/// The node's state, shared by the actor and its attempts in flight.
struct NodeCore {
    id: NodeId,
    service: Arc<str>,
    address: Arc<str>,
    cfg: Arc<ServiceConfig>,
    balancer: Recipient<Completed>,
    max_concurrent: u32,
    in_flight: u32,
    total: u64,
    errors: u64,
    latency: Ewma,
    error_rate: Ewma,
    rtt: PeakEwma,
    last_latency: Duration,
    breaker: Option<Breaker>,
    bucket: Option<TokenBucket>,
    restarts: u32,
    /// Cancel switches of attempts in flight (only when the service hedges).
    cancels: HashMap<(Seq, bool), oneshot::Sender<()>>,
}

/// What a node is built from.
pub(crate) struct NodeSpec {
    pub id: NodeId,
    pub service: Arc<str>,
    pub address: Arc<str>,
    pub max_concurrent: u32,
    pub cfg: Arc<ServiceConfig>,
    pub balancer: Recipient<Completed>,
    pub factory: TransportFactory,
}

impl NodeActor {
    pub(crate) fn new(spec: NodeSpec) -> Self {
        let now = Instant::now();
        let cfg = spec.cfg;
        let core = NodeCore {
            id: spec.id,
            service: spec.service,
            address: spec.address,
            balancer: spec.balancer,
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
            bucket: cfg
                .rate_limit
                .per_node
                .map(|b| TokenBucket::new(b.rate, b.burst, now)),
            restarts: 0,
            cancels: HashMap::new(),
            cfg,
        };
        Self {
            core: Rc::new(RefCell::new(core)),
            factory: spec.factory,
            transport: None,
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
        LoadReport {
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
        Ok(permit)
    }

    /// Accounts one finished attempt (ended at `now`) and reports it.
    fn finish(
        &mut self,
        seq: Seq,
        hedge: bool,
        permit: Option<Permit>,
        latency: Duration,
        result: Result<HttpReply, TransportError>,
        now: Instant,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if !self.cancels.is_empty() {
            self.cancels.remove(&(seq, hedge));
        }
        let outcome = match &result {
            Ok(r) => AttemptOutcome::Status(r.status),
            Err(e) => AttemptOutcome::Error(e.kind),
        };
        if outcome != AttemptOutcome::Error(ErrorKind::Cancelled) {
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
                }
            }
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
        self.balancer.do_send(Completed {
            node: self.id,
            seq,
            hedge,
            report: Some(AttemptReport {
                outcome,
                latency,
                reply,
                retry_after,
            }),
            load: self.report(now),
            at: now,
        });
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

    fn started(&mut self, _ctx: &mut Self::Context) {
        if self.transport.is_none() {
            let address = self.address();
            self.transport = Some((self.factory)(&address));
        }
    }
}

impl Supervised for NodeActor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
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

    fn handle(&mut self, msg: Dispatch, _ctx: &mut Self::Context) {
        // The balancer's decision time: its bucket mirror used the same.
        let now = msg.at;
        let mut core = self.core.borrow_mut();
        let Ok(permit) = core.admit(msg.bypass_breaker, now) else {
            return core.refuse(msg.seq, msg.hedge, now);
        };
        let job = msg.job;
        let mut timeout = job.task.attempt_timeout().unwrap_or(core.cfg.timeout);
        if let Some(d) = job.deadline {
            timeout = timeout.min(
                d.saturating_duration_since(now)
                    .max(Duration::from_millis(1)),
            );
        }
        let mut url = String::with_capacity(core.address.len() + job.path().len());
        url.push_str(&core.address);
        url.push_str(job.path());
        let req = HttpRequest {
            method: job.task.method().clone(),
            url,
            headers: job.headers.clone(),
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
        let transport = self.transport.clone().expect("transport made in started()");
        let shared = self.core.clone();
        let deadline = now + timeout;
        actix::spawn(async move {
            let started = Instant::now();
            let attempt = run_attempt(&*transport, req, deadline);
            let result = match cancel {
                None => attempt.await,
                Some(rx) => {
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
            };
            let end = Instant::now();
            let latency = end.saturating_duration_since(started);
            shared
                .borrow_mut()
                .finish(seq, hedge, permit, latency, result, end);
        });
    }
}

/// One attempt under its timeout, with panics caught.
async fn run_attempt(
    transport: &dyn Transport,
    req: HttpRequest,
    deadline: Instant,
) -> Result<HttpReply, TransportError> {
    let timeout = req.timeout;
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| transport.send(req))) {
        Ok(f) => f,
        Err(p) => return Err(panicked(p)),
    };
    match AssertUnwindSafe(tokio::time::timeout_at(deadline, fut))
        .catch_unwind()
        .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(TransportError::new(
            ErrorKind::Timeout,
            format!("no answer within {timeout:?}"),
        )),
        Err(p) => Err(panicked(p)),
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
/// the past means "now").
fn parse_retry_after(value: &str, wall_now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(wall_now).unwrap_or(Duration::ZERO))
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
}
