//! Prometheus metrics (cargo feature `metrics`), in the application's own
//! [`Registry`](prometheus_client::registry::Registry): no global state.
//!
#![cfg_attr(feature = "metrics", doc = "```no_run")]
#![cfg_attr(not(feature = "metrics"), doc = "```ignore")]
//! # async fn demo(dispatcher: actix_dispatch::Dispatcher) {
//! let mut registry = prometheus_client::registry::Registry::default();
//! dispatcher.register_metrics(&mut registry);
//! // ... later, on each scrape:
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! # }
//! ```
//!
//! **No message per task.** The families are created once, when the
//! dispatcher starts; each pipeline resolves its own series (labels from the
//! configuration only: service name and node address) when it starts, and
//! its actors bump those handles in place where they already count: the
//! queue in `finish` (tasks by outcome and reason, task duration), on a
//! retry, a hedge and a retry refused by the budget, and after each message
//! (queue depth); the node per attempt (class and duration, in flight), on a
//! bucket refusal, and on each breaker transition; the balancer on each
//! refresh of its view (endpoints by state); a lease when it is handed out,
//! reports an outcome and is returned (leases by event, leases out). A scrape only reads atomics, so
//! prometheus-client's synchronous encoder never waits on an actor. The
//! handles are `Arc`-shared atomics, so nodes on other threads
//! (`node_threads`) update them safely.
//!
//! Every series of a service or node is created with the pipeline or node,
//! at zero, so a rate over an outcome that has not happened yet still works.
//!
//! **Pool changes.** A node added at runtime gets its series when it starts;
//! a node re-added at the same address continues the same series (counters
//! stay monotonic). A removed node's series stay (its counters keep their
//! last value, its in-flight gauge goes to zero as it drains) until the
//! dispatcher is dropped; `dispatch_endpoints` counts only the nodes still
//! in the pool.
//!
//! **Formats.** [`encode`] gives OpenMetrics (what prometheus-client
//! writes); [`encode_as`] also the Prometheus text format 0.0.4, and
//! `GET /metrics` picks one by the scraper's `Accept` ([`Format`]).
//!
//! Without the feature every handle is a zero-sized no-op, so the default
//! build pays nothing.

#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algo::breaker::BreakerState;
use crate::outcome::{AttemptOutcome, ErrorKind, FailReason, Outcome, Rejection};
use crate::stats::LatencyHistogram;

/// `(outcome, reason)` pairs of `dispatch_tasks_total`, in [`task_index`] order.
const TASK_KINDS: [(&str, &str); 18] = [
    ("success", "ok"),
    ("failure", "not_retryable"),
    ("failure", "retries_exhausted"),
    ("failure", "deadline_exceeded"),
    ("failure", "budget_exhausted"),
    ("rejected", "queue_full"),
    ("rejected", "shutting_down"),
    ("rejected", "deadline_passed"),
    ("rejected", "unknown_service"),
    ("rejected", "invalid_task"),
    ("rejected", "circuit_open"),
    ("rejected", "internal"),
    ("rejected", "rate_limited"),
    ("fallback", "circuit_open"),
    ("fallback", "rate_limited"),
    ("fallback", "other"),
    ("rejected", "overloaded"),
    ("rejected", "cancelled"),
];

/// Outcome labels of `dispatch_task_duration_seconds`, in [`outcome_index`] order.
const OUTCOMES: [&str; 4] = ["success", "failure", "rejected", "fallback"];

/// `class` labels of `dispatch_upstream_requests_total`, in [`class_index`] order.
const CLASSES: [&str; 17] = [
    "1xx",
    "2xx",
    "3xx",
    "4xx",
    "5xx",
    "connect",
    "not_sent",
    "timeout",
    "reset",
    "body",
    "invalid",
    "panicked",
    "lost",
    "cancelled",
    "tls",
    "deadline",
    "throttled",
];

/// `event` labels of `dispatch_stream_events_total`, in [`StreamEvent`] order.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const STREAM_EVENTS: [&str; 6] = [
    "read",
    "claimed",
    "recorded",
    "duplicate",
    "failed",
    "dead_lettered",
];

/// What happened to durable stream entries (feature `redis`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum StreamEvent {
    Read,
    Claimed,
    Recorded,
    Duplicate,
    Failed,
    DeadLettered,
}

/// Why a task was shed `Overloaded`: the `reason` labels of
/// `dispatch_shed_total`, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// Refused at intake while overloaded (too many ahead of it).
    Intake,
    /// Waited past the delay control's bound.
    QueueDelay,
    /// Taken out of a full queue for a more important task.
    Displaced,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const SHED_REASONS: [&str; 3] = ["intake", "queue_delay", "displaced"];

/// `event` labels of `dispatch_leases_total`.
const LEASE_EVENTS: [&str; 5] = ["granted", "success", "failure", "ignored", "cancelled"];

/// Index in [`LEASE_EVENTS`] of an outcome a lease reported (`None`: ignored).
fn lease_outcome_index(outcome: Option<&AttemptOutcome>) -> usize {
    match outcome {
        Some(o) if o.is_success() => 1,
        Some(_) => 2,
        None => 3,
    }
}

/// Breaker states, in [`state_index`] order.
const STATES: [&str; 3] = ["closed", "open", "half_open"];

/// Endpoint states of `dispatch_endpoints`.
const ENDPOINT_STATES: [&str; 4] = ["healthy", "unhealthy", "inactive", "open"];

fn rejection_index(r: &Rejection) -> usize {
    match r {
        Rejection::QueueFull => 5,
        Rejection::ShuttingDown => 6,
        Rejection::DeadlinePassed => 7,
        Rejection::UnknownService(_) => 8,
        Rejection::InvalidTask(_) => 9,
        Rejection::CircuitOpen { .. } => 10,
        Rejection::Internal(_) => 11,
        Rejection::RateLimited { .. } => 12,
        Rejection::Overloaded { .. } => 16,
        Rejection::Cancelled => 17,
    }
}

/// Index of `outcome` in [`TASK_KINDS`].
fn task_index(outcome: &Outcome) -> usize {
    match outcome {
        Outcome::Success(_) => 0,
        Outcome::Failure(f) => match f.reason {
            FailReason::NotRetryable => 1,
            FailReason::RetriesExhausted => 2,
            FailReason::DeadlineExceeded => 3,
            FailReason::BudgetExhausted => 4,
        },
        Outcome::Rejected(r) => rejection_index(r),
        Outcome::Fallback { reason, .. } => match reason {
            Rejection::CircuitOpen { .. } => 13,
            Rejection::RateLimited { .. } => 14,
            _ => 15,
        },
    }
}

/// Index of `outcome` in [`OUTCOMES`].
fn outcome_index(outcome: &Outcome) -> usize {
    match outcome {
        Outcome::Success(_) => 0,
        Outcome::Failure(_) => 1,
        Outcome::Rejected(_) => 2,
        Outcome::Fallback { .. } => 3,
    }
}

/// Index of an attempt's class in [`CLASSES`].
fn class_index(outcome: &AttemptOutcome) -> usize {
    match outcome {
        AttemptOutcome::Status(s) => match s / 100 {
            1 => 0,
            2 => 1,
            3 => 2,
            4 => 3,
            _ => 4,
        },
        // Matched, so that a new kind cannot ship without its label.
        AttemptOutcome::Error(k) => match k {
            ErrorKind::Connect => 5,
            ErrorKind::NotSent => 6,
            ErrorKind::Timeout => 7,
            ErrorKind::Reset => 8,
            ErrorKind::Body => 9,
            ErrorKind::Invalid => 10,
            ErrorKind::Panicked => 11,
            ErrorKind::Lost => 12,
            ErrorKind::Cancelled => 13,
            ErrorKind::Tls => 14,
            ErrorKind::Deadline => 15,
            ErrorKind::Throttled => 16,
        },
    }
}

/// Index of a breaker state in [`STATES`].
fn state_index(s: &BreakerState) -> usize {
    match s {
        BreakerState::Closed => 0,
        BreakerState::Open { .. } => 1,
        BreakerState::HalfOpen => 2,
    }
}

#[cfg(all(not(feature = "metrics"), feature = "redis"))]
pub(crate) use disabled::PromStream;
#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::{Families, PromLeases};
#[cfg(not(feature = "metrics"))]
use disabled::{PromNode, PromService};

/// One service's metric handles: the Prometheus series (no-op without the
/// feature) and, always, each node's latency histogram for `stats()`.
#[derive(Clone, Default)]
pub(crate) struct ServiceMetrics {
    prom: PromService,
    latencies: Arc<Mutex<HashMap<String, Arc<LatencyHistogram>>>>,
}

impl ServiceMetrics {
    /// The handles of node `address` (a node re-added at the same address
    /// continues its series and histogram).
    pub(crate) fn node(&self, address: &str) -> NodeMetrics {
        let latency = self
            .latencies
            .lock()
            .expect("lock")
            .entry(address.to_owned())
            .or_default()
            .clone();
        NodeMetrics {
            prom: self.prom.node(address),
            latency,
        }
    }

    /// Node `address`'s latency histogram, if it has one.
    pub(crate) fn latencies(&self, address: &str) -> Option<Arc<LatencyHistogram>> {
        self.latencies.lock().expect("lock").get(address).cloned()
    }
}

impl std::ops::Deref for ServiceMetrics {
    type Target = PromService;
    fn deref(&self) -> &PromService {
        &self.prom
    }
}

/// One node's metric handles (`Send + Sync`: nodes may run on other threads).
#[derive(Clone, Default)]
pub(crate) struct NodeMetrics {
    prom: PromNode,
    latency: Arc<LatencyHistogram>,
}

impl NodeMetrics {
    /// One attempt ended with `outcome` after `latency`.
    #[inline]
    pub(crate) fn attempt(&self, outcome: &AttemptOutcome, latency: Duration) {
        self.prom.attempt(outcome, latency);
        if !matches!(
            outcome,
            AttemptOutcome::Error(
                ErrorKind::Cancelled
                    | ErrorKind::NotSent
                    | ErrorKind::Deadline
                    | ErrorKind::Throttled
            )
        ) {
            self.latency.record(latency);
        }
    }
}

impl std::ops::Deref for NodeMetrics {
    type Target = PromNode;
    fn deref(&self) -> &PromNode {
        &self.prom
    }
}
#[cfg(all(feature = "metrics", feature = "redis"))]
pub(crate) use enabled::PromStream;
#[cfg(feature = "metrics")]
pub use enabled::{encode, encode_as, Register, CONTENT_TYPE};
#[cfg(feature = "metrics")]
pub(crate) use enabled::{Families, PromLeases};
#[cfg(feature = "metrics")]
use enabled::{PromNode, PromService};
#[cfg(feature = "metrics")]
pub use format::{openmetrics_to_text, Format, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};

/// Counts of a service's endpoints by state, for `dispatch_endpoints`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndpointCounts {
    /// Active, not unhealthy, breaker not open.
    pub healthy: i64,
    /// Marked unhealthy by health checks.
    pub unhealthy: i64,
    /// Inactive (configuration or admin) or draining.
    pub inactive: i64,
    /// Breaker open.
    pub open: i64,
}

#[cfg(feature = "metrics")]
mod enabled;
#[cfg(feature = "metrics")]
mod format;

#[cfg(not(feature = "metrics"))]
mod disabled;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_and_kind_has_a_distinct_label() {
        let mut kinds: Vec<_> = TASK_KINDS.to_vec();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds.len(), TASK_KINDS.len());
        assert_eq!(class_index(&AttemptOutcome::Status(204)), 1);
        assert_eq!(class_index(&AttemptOutcome::Status(503)), 4);
        assert_eq!(
            CLASSES[class_index(&AttemptOutcome::Error(ErrorKind::NotSent))],
            "not_sent"
        );
        assert_eq!(STATES[state_index(&BreakerState::HalfOpen)], "half_open");
        let ok = AttemptOutcome::Status(204);
        assert_eq!(LEASE_EVENTS[lease_outcome_index(Some(&ok))], "success");
        assert_eq!(LEASE_EVENTS[lease_outcome_index(None)], "ignored");
    }
}
