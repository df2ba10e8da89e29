//! Counters and node views, serde-serializable, as `Dispatcher::stats` gives them.
//!
//! Per service the counters always satisfy
//! `submitted = succeeded + failed + rejected + queued + in_flight`
//! ([`ServiceStats::is_balanced`]); tasks parked by `on_full: wait` are
//! `waiting` and not yet submitted.

use serde::Serialize;
use tokio::time::Instant;

use crate::actors::view::{Health, Mirror, NodeView};
use crate::algo::strategy::{Candidate, LeastLoad};
use crate::config::{Mode, ServiceConfig};

/// Everything the dispatcher knows, per service.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// One entry per service.
    pub services: Vec<ServiceStats>,
    /// Tasks refused before reaching any queue (unknown service, invalid task).
    pub refused: u64,
}

impl Stats {
    /// The service named `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceStats> {
        self.services.iter().find(|s| s.name == name)
    }
}

/// One service: its queue's counters and its nodes.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceStats {
    /// Service name.
    pub name: String,
    /// Balancing mode.
    pub mode: Mode,
    /// Queue counters.
    #[serde(flatten)]
    pub queue: QueueStats,
    /// The nodes, in pool order.
    pub nodes: Vec<NodeStats>,
}

impl ServiceStats {
    /// Whether `submitted = succeeded + failed + rejected + queued + in_flight`.
    pub fn is_balanced(&self) -> bool {
        let q = &self.queue;
        q.submitted == q.succeeded + q.failed + q.rejected + q.queued + q.in_flight
    }

    /// The node with this address.
    pub fn node(&self, address: &str) -> Option<&NodeStats> {
        self.nodes.iter().find(|n| n.address == address)
    }
}

/// A service queue's counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueStats {
    /// Waiting in the queue (ready or in retry backoff).
    pub queued: u64,
    /// Handed to the balancer, not answered yet.
    pub in_flight: u64,
    /// Submitters parked until there is room (`on_full: wait`, `feed`).
    pub waiting: u64,
    /// Tasks the queue took a decision on (accepted or rejected).
    pub submitted: u64,
    /// Answered with a 2xx/3xx.
    pub succeeded: u64,
    /// Answered with a failure.
    pub failed: u64,
    /// Rejected (including those answered by the fallback).
    pub rejected: u64,
    /// Retries scheduled.
    pub retried: u64,
    /// Rejections answered by the fallback response.
    pub fallbacks: u64,
    /// Hedged attempts sent.
    pub hedged: u64,
    /// Most tasks ever queued at once.
    pub peak_queued: u64,
    /// The queue's bound.
    pub capacity: u64,
    /// Retries the budget allows right now.
    pub retry_budget_left: u64,
    /// Why the queue is refusing tasks, if it is.
    pub gate: Option<String>,
}

/// One node as the balancer sees it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStats {
    /// Endpoint address.
    pub address: String,
    /// Configured weight.
    pub weight: u32,
    /// Weight after slow start.
    pub effective_weight: u32,
    /// Configured/admin active flag.
    pub active: bool,
    /// Health-check verdict: `unknown`, `healthy` or `unhealthy`.
    pub health: &'static str,
    /// Being removed.
    pub draining: bool,
    /// Requests in flight (balancer's exact count).
    pub in_flight: u32,
    /// Cap of requests in flight.
    pub max_concurrent: u32,
    /// Attempts finished.
    pub total: u64,
    /// Attempts that failed (connect, timeout, reset, 5xx).
    pub errors: u64,
    /// Recent error ratio.
    pub error_rate: f64,
    /// EWMA latency, ms.
    pub ewma_latency_ms: f64,
    /// Last latency, ms.
    pub last_latency_ms: f64,
    /// Peak-EWMA RTT, ms.
    pub rtt_ms: f64,
    /// Least-load score `0.5·in_flight/max + 0.3·EWMA s + 0.2·error rate`.
    pub score: f64,
    /// Breaker state: `closed`, `open` or `half-open`.
    pub breaker: &'static str,
    /// Time left open, ms (when open).
    pub open_for_ms: Option<u64>,
    /// Breaker trips.
    pub trips: u64,
    /// Tokens in the node's bucket.
    pub tokens: Option<u32>,
    /// Supervisor restarts of the node actor.
    pub restarts: u32,
}

impl NodeStats {
    pub(crate) fn from_view(
        n: &NodeView,
        c: &Candidate,
        cfg: &ServiceConfig,
        now: Instant,
    ) -> Self {
        let score = LeastLoad::new(cfg.balancer.least_load).score(c);
        NodeStats {
            address: n.address.to_string(),
            weight: n.weight,
            effective_weight: c.weight,
            active: n.active,
            health: match n.health {
                Health::Unknown => "unknown",
                Health::Healthy => "healthy",
                Health::Unhealthy => "unhealthy",
            },
            draining: n.draining,
            in_flight: n.in_flight,
            max_concurrent: n.max_concurrent,
            total: n.load.total,
            errors: n.load.errors,
            error_rate: n.load.error_rate,
            ewma_latency_ms: n.load.latency_ewma * 1e3,
            last_latency_ms: n.load.last_latency.as_secs_f64() * 1e3,
            rtt_ms: n.load.rtt * 1e3,
            score,
            breaker: match n.mirror {
                Mirror::Closed => "closed",
                Mirror::Open { until } if until > now => "open",
                _ => "half-open",
            },
            open_for_ms: match n.mirror {
                Mirror::Open { until } if until > now => {
                    Some(until.saturating_duration_since(now).as_millis() as u64)
                }
                _ => None,
            },
            trips: n.load.trips,
            tokens: n.bucket.as_ref().map(|b| b.available(now)),
            restarts: n.load.restarts,
        }
    }
}
