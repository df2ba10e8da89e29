//! Leases: an endpoint lent to the caller's own client, under the service's
//! balancing, breakers and limits (seed 004's factory).
//!
//! [`Dispatcher::lease`](crate::Dispatcher::lease) asks a service for one
//! of its endpoints. The lease travels as a task whose work is to be lent,
//! not an HTTP request, so it is admitted by exactly the path a task takes:
//! the queue's capacity and `on_full`, the delay control, the deadline,
//! the balancer's strategy (`round_robin`, `weighted`, ... over the same
//! picks as HTTP tasks), then the node's slot under `max_concurrent` or the
//! learned limit, its token bucket (taken by the balancer) and its
//! breaker. It is refused with the
//! same [`Rejection`](crate::Rejection)s (`QueueFull`, `CircuitOpen`, `RateLimited`,
//! `Overloaded`, `DeadlinePassed`, ...).
//!
//! ```text
//!  lease() ─task─► QueueActor ─► BalancerActor ─► NodeActor: admits (slot, breaker)
//!     ▲                 ▲                              │ puts a Lease in the task's hand,
//!     │                 └──── answered (slot kept) ────┘ reports the task answered
//!     └── the Lease ◄── hand ◄─────────────────────────┘
//!  Lease::report / complete / drop ──LeaseNews──► that same NodeActor: accounts it, frees the slot
//! ```
//!
//! Where an HTTP task's attempt would start, the node instead makes a
//! [`Lease`] and answers the task: the queue and the balancer see the task
//! done, and the node's slot stays taken until the lease is dropped (as a
//! streamed answer's slot stays taken until its body ends). The lease
//! holds the breaker's permit; what the caller says with
//! [`Lease::report`] or [`Lease::complete`] goes to the node that lent it
//! (its address is captured in the lease, so removing the endpoint never
//! sends an outcome to another node), where it is accounted by the same code
//! as an attempt's: counters, latency EWMA, peak-EWMA cost, error rate,
//! breaker and learned limit. A lease dropped without an outcome is
//! cancelled: its slot is freed and nothing is counted.
//!
//! ```
//! use std::time::Duration;
//! use actix_dispatch::{Config, Dispatcher, LeaseOptions, LeaseOutcome};
//!
//! # #[actix::main]
//! # async fn main() {
//! // An endpoint nobody listens on: a lease does not connect by itself.
//! let config = Config::from_json(
//!     r#"{"services":[{"name":"db","mode":"round_robin",
//!         "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":1}]}]}"#,
//! )
//! .unwrap();
//! let dispatcher = Dispatcher::start(config).unwrap();
//! let lease = dispatcher.lease("db", LeaseOptions::new()).await.unwrap();
//! assert_eq!(lease.address(), "http://127.0.0.1:9/");
//! // The caller's own client talks to `lease.address()`, then says how it went.
//! lease.complete(LeaseOutcome::Success);
//! # dispatcher.shutdown(Duration::from_secs(1)).await;
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use tokio::time::Instant;

use crate::algo::breaker::Permit;
use crate::config::HeaderSet;
use crate::outcome::{AttemptOutcome, ErrorKind};
use crate::task::Priority;
use crate::transport::{ConnectionSettings, ScopedHeaders};

pub use crate::stats::LeaseStats;

/// How to ask for a lease ([`crate::Dispatcher::lease`]): an affinity key,
/// a deadline and a priority class, as a task has.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LeaseOptions {
    pub(crate) affinity: Option<String>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) deadline_in: Option<Duration>,
    pub(crate) priority: Priority,
}

impl LeaseOptions {
    /// No key, no deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The affinity key a `consistent_hash` service picks the endpoint by.
    pub fn affinity(mut self, key: impl Into<String>) -> Self {
        self.affinity = Some(key.into());
        self
    }

    /// The deadline of the caller's call: a lease still waiting at `at` is
    /// refused [`Rejection::DeadlinePassed`](crate::Rejection::DeadlinePassed),
    /// as is one whose time left is below what the service's calls usually
    /// take (as a task is). A lease handed out is held until it is dropped,
    /// whatever its deadline.
    pub fn deadline(mut self, at: Instant) -> Self {
        self.deadline = Some(at);
        self.deadline_in = None;
        self
    }

    /// Gives up waiting `within` after the call to `lease`.
    pub fn deadline_in(mut self, within: Duration) -> Self {
        self.deadline_in = Some(within);
        self.deadline = None;
        self
    }

    /// The lease's class under overload, as a task's ([`crate::Task::priority`]):
    /// `critical` leases are served first and shed last, `sheddable` ones
    /// shed first (default [`Priority::Default`]).
    pub fn priority(mut self, class: Priority) -> Self {
        self.priority = class;
        self
    }
}

/// What the caller's own call through a lease gave, for the node that lent
/// the endpoint ([`Lease::report`], [`Lease::complete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseOutcome {
    /// The call succeeded: counted as a success of the node (as a 2xx).
    Success,
    /// The call got an HTTP status: counted as an attempt with this status
    /// is (5xx a node failure; 429 and 503 lower a learned limit). A code
    /// outside 100..=599 says nothing of the node (counted as
    /// [`ErrorKind::Invalid`]).
    Status(u16),
    /// The call failed this way: counted as an attempt that failed so
    /// (`Connect`, `Timeout`, `Reset`, `Tls` are node failures for the
    /// breaker and error rate; `Body`, `Invalid`, `NotSent`, `Deadline` are
    /// not; `Cancelled` counts nothing).
    Failure(ErrorKind),
    /// Says nothing about the node (the caller's own error, a call it gave
    /// up on): no counter, latency or breaker record.
    Ignore,
}

impl LeaseOutcome {
    /// The attempt outcome it is accounted as; `None` for `Ignore`.
    pub(crate) fn as_attempt(self) -> Option<AttemptOutcome> {
        match self {
            LeaseOutcome::Success => Some(AttemptOutcome::Status(200)),
            LeaseOutcome::Status(s) if (100..=599).contains(&s) => Some(AttemptOutcome::Status(s)),
            LeaseOutcome::Status(_) => Some(AttemptOutcome::Error(ErrorKind::Invalid)),
            LeaseOutcome::Failure(kind) => Some(AttemptOutcome::Error(kind)),
            LeaseOutcome::Ignore => None,
        }
    }
}

/// A lease still held when [`crate::Dispatcher::shutdown`] reported.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOut {
    /// Its service.
    pub service: String,
    /// The endpoint it holds.
    pub address: String,
    /// How long it had been held.
    pub held: Duration,
}

// === impl Lease ===

/// An endpoint lent to the caller ([`crate::Dispatcher::lease`]): it holds
/// one slot of that endpoint's node (and the breaker's permit) until it is
/// dropped. Say how the call went with [`Lease::complete`] (or, for a
/// long-lived lease such as a websocket, with [`Lease::report`] as often
/// as there is news); a lease dropped without an outcome is cancelled.
/// `Send`: it may be moved to another thread; [`Lease::client`] builds its
/// client on the thread that calls it.
#[must_use = "a lease holds its endpoint's slot until it is dropped"]
pub struct Lease {
    id: u64,
    endpoint: Arc<Endpoint>,
    book: Arc<LeaseBook>,
    permit: Option<Permit>,
    started: Instant,
    /// When the span the next outcome covers began (the start, then each report).
    since: Instant,
    reported: bool,
    /// Ended by `complete` (the drop then sends nothing).
    ended: bool,
}

/// One outcome a lease reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// `None`: `Ignore` (nothing to account).
    pub outcome: Option<AttemptOutcome>,
    /// The breaker's permit the lease was admitted with.
    pub permit: Option<Permit>,
    pub latency: Duration,
}

/// What a lease tells the node that lent it (an actix message to it).
#[derive(Debug)]
pub(crate) enum LeaseNews {
    /// An outcome; the lease is still held.
    Report(Sample),
    /// The lease was returned (with its last outcome, or none): its slot is free.
    End(Option<Sample>),
}

/// What a node lends with every lease: made once per node.
pub(crate) struct Endpoint {
    /// The node that lent it, which the lease's news goes to.
    pub node: Recipient<LeaseNews>,
    pub address: Arc<str>,
    /// `host:port` of `address`.
    pub authority: String,
    pub settings: ConnectionSettings,
    pub headers: HeaderSet,
    /// The service's per-attempt timeout: the lease client's request timeout.
    pub timeout: Duration,
}

impl Endpoint {
    /// `host:port` of a configured (validated) address.
    pub(crate) fn authority_of(address: &str) -> String {
        let Ok(uri) = address.parse::<awc::http::Uri>() else {
            return address.to_owned();
        };
        let host = uri.host().unwrap_or_default();
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

impl Lease {
    /// A lease of `endpoint`'s slot, taken at `now` (registered in `book`).
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        book: Arc<LeaseBook>,
        permit: Option<Permit>,
        now: Instant,
    ) -> Lease {
        let id = book.granted(&endpoint.address, now);
        Lease {
            id,
            endpoint,
            book,
            permit,
            started: now,
            since: now,
            reported: false,
            ended: false,
        }
    }

    /// The endpoint's address, as configured (`http://10.0.0.7:8080/`).
    pub fn address(&self) -> &str {
        &self.endpoint.address
    }

    /// The endpoint's host and port (`10.0.0.7:8080`; the scheme's
    /// default port when the address names none), for a client that is not
    /// HTTP's (a raw TCP or gRPC connection).
    pub fn authority(&self) -> &str {
        &self.endpoint.authority
    }

    /// The endpoint's address with `path` appended, checked as a task's
    /// path is: it must stay relative and under the endpoint's prefix.
    pub fn url(&self, path: &str) -> Result<String, String> {
        crate::syntax::check_path(path)?;
        let path = path.strip_prefix('/').unwrap_or(path);
        Ok(format!("{}{path}", self.endpoint.address))
    }

    /// An awc client set up for this endpoint as the engine's own are:
    /// its TLS settings (trusted authorities, `insecure_skip_verify`),
    /// keep-alive and connection age, the endpoint's configured headers on
    /// every request to the endpoint's origin (scheme, host and port: never
    /// to another host the client is pointed at, so its credentials stay
    /// with it), no redirects, and the service's `timeout` per request.
    /// Build requests with [`Lease::url`]. Each call makes a new client
    /// with its own connection pool: keep it for the lease's calls. Made
    /// on the calling thread (an awc client is not `Send`); it needs an
    /// actix runtime.
    pub fn client(&self) -> awc::Client {
        let e = &self.endpoint;
        let headers = e
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.expose().clone()))
            .collect();
        let scoped = ScopedHeaders::new(&e.address, headers);
        crate::transport::caller_client(&e.settings, e.timeout, scoped)
    }

    /// How long it has been held.
    pub fn held(&self) -> Duration {
        self.started.elapsed()
    }

    /// Tells the node how one call through the lease went, and keeps the
    /// lease (and its slot). The latency counted is the time since the
    /// lease was handed out or since its last report.
    pub fn report(&mut self, outcome: LeaseOutcome) {
        let sample = self.sample(outcome);
        self.endpoint.node.do_send(LeaseNews::Report(sample));
    }

    /// Tells the node how the call went and gives the slot back: the last
    /// outcome of the lease (latency since it was handed out, or since its
    /// last report).
    pub fn complete(mut self, outcome: LeaseOutcome) {
        let sample = self.sample(outcome);
        self.ended = true;
        self.book.returned(self.id);
        self.endpoint.node.do_send(LeaseNews::End(Some(sample)));
    }

    fn sample(&mut self, outcome: LeaseOutcome) -> Sample {
        let now = Instant::now();
        let latency = now.saturating_duration_since(self.since);
        self.since = now;
        self.reported = true;
        let outcome = outcome.as_attempt();
        self.book.outcome(outcome.as_ref());
        Sample {
            outcome,
            permit: self.permit,
            latency,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if !self.reported {
            self.book.cancelled();
        }
        self.book.returned(self.id);
        self.endpoint.node.do_send(LeaseNews::End(None));
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("service", &self.book.service)
            .field("address", &self.endpoint.address)
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

mod book;
pub(crate) use book::{LeaseBook, LeaseHand};

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease may move to another thread (the caller's worker).
    #[test]
    fn a_lease_is_send() {
        fn send<T: Send>() {}
        send::<Lease>();
        send::<LeaseOptions>();
    }

    #[test]
    fn the_authority_has_a_port() {
        assert_eq!(
            Endpoint::authority_of("http://10.0.0.7:8080/v1/"),
            "10.0.0.7:8080"
        );
        assert_eq!(
            Endpoint::authority_of("https://api.example/"),
            "api.example:443"
        );
        assert_eq!(Endpoint::authority_of("http://[::1]/"), "[::1]:80");
    }

    #[test]
    fn outcomes_are_accounted_as_attempts() {
        use LeaseOutcome::*;
        assert_eq!(Success.as_attempt(), Some(AttemptOutcome::Status(200)));
        assert_eq!(Status(503).as_attempt(), Some(AttemptOutcome::Status(503)));
        assert_eq!(
            Status(0).as_attempt(),
            Some(AttemptOutcome::Error(ErrorKind::Invalid))
        );
        assert_eq!(
            Status(600).as_attempt(),
            Some(AttemptOutcome::Error(ErrorKind::Invalid))
        );
        assert_eq!(
            Failure(ErrorKind::Reset).as_attempt(),
            Some(AttemptOutcome::Error(ErrorKind::Reset))
        );
        assert_eq!(Ignore.as_attempt(), None);
    }
}
