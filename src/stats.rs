//! Counters and node views, serde-serializable, as `Dispatcher::stats` gives them.
//!
//! Per service the counters always satisfy
//! `submitted = succeeded + failed + rejected + queued + in_flight`
//! ([`ServiceStats::is_balanced`]); tasks parked by `on_full: wait` are
//! `waiting` and not yet submitted.
//!
//! Per node, latency percentiles (p50, p90, p99) come from a
//! `LatencyHistogram` the node records each attempt into (one atomic add;
//! log-linear buckets, four per octave, so a percentile is within about 10 %
//! of the true value).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::config::Mode;

/// Everything the dispatcher knows, per service.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// One entry per service.
    pub services: Vec<ServiceStats>,
    /// Tasks refused before reaching any queue (unknown service, invalid task).
    pub refused: u64,
    /// The Redis shared by several instances (live instances, down), when
    /// configured.
    #[cfg(feature = "redis")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedStats>,
}

impl Stats {
    /// The service named `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceStats> {
        self.services.iter().find(|s| s.name == name)
    }
}

/// One service: its queue's counters and its nodes.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
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
    /// The service's leases ([`crate::Dispatcher::lease`]). A lease is
    /// also a task in the queue's counters: submitted, and succeeded once
    /// it is handed out.
    pub leases: LeaseStats,
    /// The durable task stream, when this instance consumes it
    /// ([`crate::Dispatcher::consume`]).
    #[cfg(feature = "redis")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamStats>,
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
#[non_exhaustive]
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
    /// Tasks shed `Overloaded`: refused at intake or shed from the queue
    /// once their due time was out of reach (or past `queue.delay`'s bound),
    /// or displaced from a full queue by a more important task.
    pub shed: u64,
    /// `shed` by the tasks' priority class.
    pub shed_by_class: ByPriority,
    /// Ready tasks waiting to be sent now, by priority class.
    pub ready_by_class: ByPriority,
    /// Of `shed`, those refused at intake (answered at once, without
    /// waiting in the queue).
    pub shed_at_intake: u64,
    /// Tasks whose caller dropped its `Submission` before the answer
    /// (counted in `rejected` too): their attempt was cancelled.
    pub cancelled: u64,
    /// Whether the delay control finds the service overloaded now.
    pub overloaded: bool,
    /// Most tasks ever queued at once.
    pub peak_queued: u64,
    /// The queue's bound.
    pub capacity: u64,
    /// Retries the budget allows right now.
    pub retry_budget_left: u64,
    /// Why the queue is refusing tasks, if it is.
    pub gate: Option<String>,
    /// Per tenant ([`crate::Task::tenant`]) the queue tracks, then the
    /// overflow queue the untracked ones share (`tenant: None`): at most
    /// `tenants.max_tracked + 1` rows. Empty when no task named a tenant.
    pub tenants: Vec<TenantStats>,
}

/// One tenant's counts at its service's queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TenantStats {
    /// The tenant's key; `None` for the overflow queue (tenants beyond
    /// `tenants.max_tracked`).
    pub tenant: Option<String>,
    /// Tasks that reached the queue since the tenant was tracked.
    pub offered: u64,
    /// Tasks sent to a backend (each counted once, at its first send).
    pub served: u64,
    /// Tasks shed `Overloaded`: refused at intake, shed while waiting or
    /// displaced.
    pub shed: u64,
    /// Tasks refused `RateLimited` at submit, over the tenant's rate
    /// (`tenants.rate`).
    pub rate_limited: u64,
}

/// A count per priority class ([`crate::Priority`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ByPriority {
    /// Of `critical` tasks.
    pub critical: u64,
    /// Of `default` tasks.
    pub default: u64,
    /// Of `sheddable` tasks.
    pub sheddable: u64,
}

impl ByPriority {
    /// The count of `class`.
    pub fn get(&self, class: crate::Priority) -> u64 {
        match class {
            crate::Priority::Critical => self.critical,
            crate::Priority::Default => self.default,
            crate::Priority::Sheddable => self.sheddable,
        }
    }

    pub(crate) fn from_array(a: [u64; 3]) -> Self {
        ByPriority {
            critical: a[0],
            default: a[1],
            sheddable: a[2],
        }
    }
}

/// One node as the balancer sees it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
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
    /// Requests it may have in flight now: `max_concurrent`, or the limit
    /// learned under it (`max_concurrent: "auto"`).
    pub concurrency_limit: u32,
    /// Of `concurrency_limit`, what tasks below the most important class
    /// may fill: the whole limit, fixed or learned (a learned limit sits at
    /// the knee, where a slot held back would be a worker idle).
    pub free_limit: u32,
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
    /// Breaker state (serialised `closed`, `open` or `half-open`).
    pub breaker: BreakerStatus,
    /// Time left open, ms (when open).
    pub open_for_ms: Option<u64>,
    /// Breaker trips.
    pub trips: u64,
    /// Tokens in the node's bucket; when it is shared (feature `redis`),
    /// the shared tokens this instance holds for the node (not the bucket
    /// in Redis).
    pub tokens: Option<u32>,
    /// Supervisor restarts of the node actor.
    pub restarts: u32,
    /// Median attempt latency, ms (0 before any attempt).
    pub latency_p50_ms: f64,
    /// 90th percentile attempt latency, ms.
    pub latency_p90_ms: f64,
    /// 99th percentile attempt latency, ms.
    pub latency_p99_ms: f64,
}

/// A node's breaker as `stats()` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum BreakerStatus {
    /// Traffic flows; failures are counted.
    Closed,
    /// Tasks are kept off the node until the open time is over.
    Open,
    /// A few probes are let through; their answers close or reopen it.
    HalfOpen,
}

impl BreakerStatus {
    /// `closed`, `open` or `half-open` (as serialised).
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerStatus::Closed => "closed",
            BreakerStatus::Open => "open",
            BreakerStatus::HalfOpen => "half-open",
        }
    }
}

impl std::fmt::Display for BreakerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Compares with the serialised name, as `stats()` users did when it was a string.
impl PartialEq<&str> for BreakerStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

// === impl LatencyHistogram ===

/// Sub-buckets per octave (power of two of microseconds).
const SUB: u32 = 4;
const BUCKETS: usize = (64 * SUB) as usize;

/// Attempt latencies of one node: log-linear buckets over microseconds,
/// atomic, so the node records and `stats()` reads without a message.
#[derive(Debug)]
pub(crate) struct LatencyHistogram {
    counts: Box<[AtomicU64]>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LatencyHistogram {
    fn index(us: u64) -> usize {
        if us < u64::from(SUB) {
            return us as usize;
        }
        let e = 63 - us.leading_zeros(); // floor(log2), >= 2
        let sub = (us >> (e - 2)) & u64::from(SUB - 1);
        (e * SUB) as usize + sub as usize
    }

    /// The middle of bucket `i`, in microseconds.
    fn middle(i: usize) -> f64 {
        if i < SUB as usize {
            return i as f64;
        }
        let (e, sub) = (i as u32 / SUB, i as u64 % u64::from(SUB));
        let low = (u64::from(SUB) + sub) << (e - 2);
        let width = 1u64 << (e - 2);
        low as f64 + width as f64 / 2.0
    }

    /// Records one latency.
    pub(crate) fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[Self::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The latencies (ms) at quantiles `qs` (each in 0..=1); zeros when empty.
    pub(crate) fn quantiles_ms<const N: usize>(&self, qs: [f64; N]) -> [f64; N] {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let mut out = [0.0; N];
        if total == 0 {
            return out;
        }
        for (o, q) in out.iter_mut().zip(qs) {
            let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    *o = Self::middle(i) / 1e3;
                    break;
                }
            }
        }
        out
    }
}

/// One service's lease counters, in [`crate::ServiceStats::leases`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Leases handed out.
    pub granted: u64,
    /// Leases held now (handed out, not dropped).
    pub out: u64,
    /// Outcomes reported as successes (`Success`, a 2xx or 3xx status).
    pub succeeded: u64,
    /// Outcomes reported as anything else but `Ignore`.
    pub failed: u64,
    /// Outcomes reported `Ignore`.
    pub ignored: u64,
    /// Leases dropped without any outcome.
    pub cancelled: u64,
}

#[cfg(feature = "redis")]
/// What `stats()` shows of the Redis shared by several instances
/// (feature `redis`).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct SharedStats {
    /// Instances that heartbeated within three periods (this one included);
    /// the last count read while Redis answered.
    pub live_instances: u64,
    /// Some kind of call (tokens, breakers or heartbeats, of some service)
    /// did not answer within `timeout`, or failed, the last time.
    pub down: bool,
    /// Which scopes are down, each a kind of call and the service it is
    /// for (`"token calls of api"`, `"heartbeats"`), sorted: one service's
    /// failing calls say nothing of the others'.
    pub down_scopes: Vec<String>,
    /// Script calls made (round trips), and calls that timed out or failed.
    pub round_trips: u64,
    /// Calls that timed out or failed.
    pub failures: u64,
    /// Calls for a tenant's shared bucket
    /// ([`SharedLimits::take_tenant`](crate::redis::SharedLimits::take_tenant)).
    pub tenant_calls: u64,
}

#[cfg(feature = "redis")]
/// One service's durable task stream, as `stats()` shows it (feature
/// `redis`).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct StreamStats {
    /// Entries of the stream not yet delivered to the group (`XINFO GROUPS`
    /// lag), as last read.
    pub lag: u64,
    /// Entries delivered and not acknowledged, all consumers (`XINFO
    /// GROUPS` pending), as last read.
    pub pending: u64,
    /// Entries this instance has read and not finished.
    pub in_flight: u64,
    /// Entries read (new or own pending).
    pub read: u64,
    /// Entries claimed from idle consumers.
    pub claimed: u64,
    /// Results recorded by this instance.
    pub recorded: u64,
    /// Finished a second time; the result was already recorded.
    pub duplicates: u64,
    /// Deliveries that failed and were left pending for a later claim.
    pub failed_deliveries: u64,
    /// Entries this instance sent to the dead-letter stream.
    pub dead_lettered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_breaker_status_serialises_as_the_old_strings() {
        let names: Vec<String> = [
            BreakerStatus::Closed,
            BreakerStatus::Open,
            BreakerStatus::HalfOpen,
        ]
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
        assert_eq!(names, [r#""closed""#, r#""open""#, r#""half-open""#]);
        assert_eq!(BreakerStatus::HalfOpen, "half-open");
        assert_eq!(format!("{:>6}", BreakerStatus::Open), "  open");
    }

    #[test]
    fn stats_latency_percentiles_are_within_a_bucket() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantiles_ms([0.5]), [0.0]);
        // 1..=100 ms, one each: p50 = 50 ms, p90 = 90 ms, p99 = 99 ms.
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let [p50, p90, p99] = h.quantiles_ms([0.5, 0.9, 0.99]);
        for (got, want) in [(p50, 50.0), (p90, 90.0), (p99, 99.0)] {
            assert!((got - want).abs() / want < 0.13, "{got} vs {want}");
        }
        // Sub-microsecond and huge values land in the end buckets, no panic.
        h.record(Duration::ZERO);
        h.record(Duration::MAX);
        assert!(h.quantiles_ms([1.0])[0] > 1e12);
    }

    #[test]
    fn stats_histogram_buckets_are_monotonic() {
        let mut last = 0;
        for us in [0u64, 1, 3, 4, 5, 7, 8, 15, 16, 1000, 1 << 40, u64::MAX] {
            let i = LatencyHistogram::index(us);
            assert!(i >= last && i < BUCKETS, "{us}: {i}");
            last = i;
        }
    }
}
