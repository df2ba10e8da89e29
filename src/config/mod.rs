//! Configuration: JSON in, validated values out.
//!
//! A config names services, each a pool of endpoints with a balancing mode,
//! timeouts, retry, queue, breaker and rate-limit settings. Every field has a
//! documented default (see [`crate::reference::config`]). Parsing happens in
//! two steps: the file is read as JSON, then each service is deserialized on
//! its own so that any error names the service and the field path
//! (`service "api": field `retry.max_retries`: invalid type ...`). The result
//! holds only values the engine can run: non-zero capacities, weights in
//! 1..=100, addresses that are http(s) URLs ending in `/`, durations no
//! longer than [`crate::algo::time::MAX_DURATION`] (365 days). Nothing in it
//! panics, whatever the input.
//!
//! The optional top-level `redis` section (instances sharing limits and
//! breakers) may hold a `stream` object: the settings of the durable task
//! stream's consumer (`RedisConfig::stream`, feature `redis`; see the
//! `redis` section's docs), checked like the rest, so that a config file
//! holds everything an instance runs with.
//!
//! As in the seed, service names match case-insensitively (two names that
//! differ only in case are a duplicate), a repeated endpoint address keeps
//! its first entry (with a warning), and `IsActive` is an alias of `active`.
//!
//! The seed project's format loads unchanged:
//!
//! ```
//! use actix_dispatch::{Config, Mode};
//! let cfg = Config::from_json(
//!     r#"{"ApiServers":[{"Name":"Did","Mode":"Poll","ApiEndPoints":[{"Address":"http://localhost:10100/","Weight":1}]}]}"#,
//! ).unwrap();
//! assert_eq!(cfg.services[0].name, "Did");
//! assert_eq!(cfg.services[0].mode, Mode::RoundRobin);
//! assert_eq!(cfg.services[0].endpoints[0].max_concurrent, 10);
//! ```

mod headers;
mod lines;
mod mode;
mod raw;
mod redis;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
mod tls;
mod validate;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

// The tuning types of the pure algorithms appear in the public fields
// below: named here, so a user can write their types.
pub use crate::algo::breaker::BreakerConfig;
pub use crate::algo::budget::BudgetConfig;
pub use crate::algo::codel::CodelConfig;
pub use crate::algo::concurrency::LearnedLimitConfig;
pub use crate::algo::priority::PriorityConfig;
pub use crate::algo::strategy::LeastLoadWeights;
pub use crate::algo::tenants::{TenantRate, TenantsConfig};
pub use crate::algo::throttle::ThrottleConfig;
pub use headers::{ConfigHeader, HeaderSet, Secret};
pub(crate) use lines::RawLines;
pub use lines::{LineLimits, DEFAULT_LINE_MAX_BODY, DEFAULT_LINE_MAX_HEADER_BYTES};
pub use mode::Mode;
pub use redis::{OnDown, RedisConfig, SentinelConfig, SharedMode, StreamConfig};
pub use tls::{CaFile, TlsConfig};

/// The largest `http2.connections`.
pub(crate) const MAX_H2_CONNECTIONS: u32 = 64;
pub use validate::ConfigError;
pub(crate) use validate::{clamp_weight, normalize_address};

/// A validated engine configuration: one entry per named service.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The services, in file order; names are unique.
    pub services: Vec<ServiceConfig>,
    /// Redis shared by several instances (none by default; feature `redis`).
    pub redis: Option<RedisConfig>,
}

impl Config {
    /// Parses and validates a JSON config (new or seed format).
    pub fn from_json(json: &str) -> Result<Config, ConfigError> {
        validate::parse(json)
    }

    /// Reads, parses and validates a JSON config file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_json(&text)
    }

    /// The service named `name`, matched case-insensitively (as the seed).
    pub fn service(&self, name: &str) -> Option<&ServiceConfig> {
        let name = name.to_lowercase();
        self.services.iter().find(|s| s.name.to_lowercase() == name)
    }
}

/// What `submit` does when a service's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnFull {
    /// Answer a `QueueFull` rejection at once (default).
    Reject,
    /// Make the submitter wait for room.
    Wait,
}

/// What happens to tasks when every node's breaker is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnAllOpen {
    /// Reject with `CircuitOpen` saying when the first breaker half-opens (default).
    FailFast,
    /// Keep tasks queued until a breaker half-opens.
    Wait,
}

/// What happens to a task when no token is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnLimit {
    /// Keep it queued; the balancer wakes when the next token is due (default).
    Wait,
    /// Answer a `RateLimited` rejection at once.
    Reject,
}

/// One backend endpoint of a service.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Base URL, `http(s)://host:port/prefix/`, always ending in `/`.
    pub address: String,
    /// Relative weight, 1..=100 (default 1).
    pub weight: u32,
    /// Hard cap of requests in flight to this endpoint (default 10).
    pub max_concurrent: u32,
    /// `max_concurrent: "auto"`: the node learns its limit from latency
    /// (within the service's `concurrency` bounds; `max_concurrent` is then
    /// their `max`, the hard cap).
    pub learned: bool,
    /// Whether it takes traffic (default true).
    pub active: bool,
    /// Headers added to every attempt to it, over the service's (none by
    /// default; see [`HeaderSet`]).
    pub headers: HeaderSet,
    /// TLS settings replacing the service's (none by default).
    pub tls: Option<TlsConfig>,
}

impl EndpointConfig {
    /// An endpoint with the defaults: weight 1, max_concurrent 10, active.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            weight: 1,
            max_concurrent: 10,
            learned: false,
            active: true,
            headers: HeaderSet::default(),
            tls: None,
        }
    }

    /// Sets the weight.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Sets max_concurrent.
    pub fn max_concurrent(mut self, max: u32) -> Self {
        self.max_concurrent = max;
        self
    }

    /// Sets whether it takes traffic.
    pub fn active(mut self, active: bool) -> Self {
        self.active = active;
        self
    }
}

/// Retry policy of a service.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Retries after the first attempt (default 3).
    pub max_retries: u32,
    /// Backoff ceiling of the first retry (default 25 ms); doubles per retry.
    pub backoff_base: Duration,
    /// Cap of the backoff ceiling (default 1 s).
    pub backoff_max: Duration,
    /// Longest `Retry-After` honoured (default 10 s): a backend's value is always capped by it.
    pub max_retry_after: Duration,
    /// Retry budget: share of recent requests plus a floor (defaults 20 %, 10/s over 10 s).
    pub budget: BudgetConfig,
}

/// The bounded queue of a service.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// Tasks waiting (ready or in backoff) at most (default 10 000).
    pub capacity: usize,
    /// Behaviour when full (default `reject`).
    pub on_full: OnFull,
    /// Tasks parked for room at most, when full with `on_full: wait` (and
    /// through `feed`); past it a task is refused `QueueFull` (default: the
    /// capacity, at least 10 000). Parked tasks keep their deadlines.
    pub max_waiting: usize,
    /// Bytes of request bodies held at most, by every task the queue holds
    /// (ready, parked, backing off, in flight) together (default 256 MiB):
    /// a task whose body would pass it is refused `QueueFull`.
    pub max_bytes: usize,
    /// Delay control (`queue.delay`, off unless the section is given:
    /// target 5 ms, interval 100 ms, newest first while overloaded): once
    /// the queue has not drained for an interval, tasks that waited past
    /// the target are shed `Overloaded`. A stated bound on queueing for
    /// every task, deadline or not. Tasks that asked to wait (`on_full:
    /// wait`, `feed`, `submit_wait`) and tasks waiting for a rate-limit
    /// token (`on_limit: wait`) are never shed.
    pub delay: Option<CodelConfig>,
    /// Deadline given to every task submitted without one (`queue.deadline`,
    /// default none), counted from its submission.
    pub deadline: Option<Duration>,
    /// Latency target for tasks without a deadline (`queue.slo`, default
    /// none): they are refused and shed by the deadline rules as if due
    /// this long after their submission, but their attempts are not cut.
    pub slo: Option<Duration>,
    /// Reserved share of the dispatches per priority class while it has
    /// tasks waiting (`queue.priority`, default critical 0.5, default 0.2,
    /// sheddable 0.05; at most 1 together). The rest goes by priority, and
    /// a class with nothing waiting leaves its share to the others.
    pub priority: PriorityConfig,
}

/// Balancer settings of a service.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BalancerConfig {
    /// How often every node is asked for its load (`GetLoad`, default 1 s).
    pub refresh_interval: Duration,
    /// Weights of the least-load score (defaults 0.5, 0.3, 0.2).
    pub least_load: LeastLoadWeights,
    /// Peak-EWMA decay time (default 10 s).
    pub decay: Duration,
    /// RTT a new node starts with (default 30 ms).
    pub default_rtt: Duration,
    /// RTT charged for a failed attempt (default 1 s).
    pub failure_penalty: Duration,
    /// Ramp time of a joining or recovered node's weight (default off).
    pub slow_start: Option<Duration>,
    /// Share of its weight a node starts the ramp with (default 0.1).
    pub slow_start_floor: f64,
    /// Fixed RNG seed for p2c and jitter (tests); entropy when absent.
    pub seed: Option<u64>,
}

/// Circuit-breaker settings of a service (each node has its own breaker).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BreakerSettings {
    /// Whether nodes have breakers at all (default true).
    pub enabled: bool,
    /// The breaker's thresholds and timings.
    pub breaker: BreakerConfig,
    /// Behaviour when every node is open (default `fail_fast`).
    pub on_all_open: OnAllOpen,
    /// Most nodes that may be open at once, in percent (default 100).
    pub max_ejected_percent: u32,
    /// Trips shared with the other instances through Redis (default false).
    pub shared: bool,
    /// Instances that must report a node's trip before it is shared
    /// (default 1).
    pub quorum: u32,
}

/// `http2`: how a node's HTTP/2 connections are kept (see
/// [`crate::transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Http2Config {
    /// Connections per node its HTTP/2 streams are spread over (1 to 64,
    /// default 1: every request of the node is a stream on one
    /// connection). A second is opened only while every open one is busy.
    pub connections: u32,
    /// Speak HTTP/2 to `http://` endpoints without TLS (h2c with prior
    /// knowledge; default false: HTTP/1.1). `https://` endpoints get
    /// HTTP/2 whenever their server offers it over ALPN.
    pub prior_knowledge: bool,
}

impl Default for Http2Config {
    /// One connection per node; HTTP/1.1 to `http://` endpoints.
    fn default() -> Self {
        Self {
            connections: 1,
            prior_knowledge: false,
        }
    }
}

/// Token-bucket parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BucketConfig {
    /// Tokens per second (> 0).
    pub rate: f64,
    /// Bucket size (>= 1).
    pub burst: u32,
}

impl BucketConfig {
    /// A bucket of `rate` tokens per second holding `burst` at most, as
    /// given (a config file's buckets are checked by [`Config::from_json`]).
    pub fn new(rate: f64, burst: u32) -> Self {
        Self { rate, burst }
    }
}

/// Rate limits of a service.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateLimitConfig {
    /// A bucket per node.
    pub per_node: Option<BucketConfig>,
    /// One bucket for the whole service.
    pub service: Option<BucketConfig>,
    /// Behaviour when out of tokens (default `wait`).
    pub on_limit: OnLimit,
    /// Every bucket set (the service's, each node's) is kept in Redis, one
    /// for all instances (default false; feature `redis`).
    pub shared: bool,
}

/// A canned response returned, marked as a fallback, on open circuits or rate limits.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FallbackConfig {
    /// Status code (default 200).
    pub status: u16,
    /// Headers.
    pub headers: BTreeMap<String, String>,
    /// Body.
    pub body: String,
}

/// Active health checking of a service's nodes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HealthCheckConfig {
    /// Path (relative to each endpoint) to GET (default `health`).
    pub path: String,
    /// Time between checks (default 5 s).
    pub interval: Duration,
    /// Timeout of one check (default 1 s).
    pub timeout: Duration,
    /// Consecutive failures that mark a node inactive (default 3).
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark it active again (default 2).
    pub healthy_threshold: u32,
}

/// When to send a hedged second attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum HedgeAfter {
    /// After a fixed delay.
    Delay(Duration),
    /// After the service's recent latency at this percentile (0 < p < 100).
    Percentile(f64),
}

/// One named service: a pool of endpoints and its policies.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// Unique name that tasks address; names match case-insensitively (a
    /// task for `"did"` reaches service `"Did"`), as in the seed.
    pub name: String,
    /// Balancing mode (default `p2c`).
    pub mode: Mode,
    /// The pool.
    pub endpoints: Vec<EndpointConfig>,
    /// Per-attempt timeout (default 5 s).
    pub timeout: Duration,
    /// Largest response body read (default 2 MiB).
    pub max_body: usize,
    /// How long an idle pooled connection is kept (default 1 s, below the
    /// 2 to 5 s after which common servers close idle connections; see
    /// [`crate::transport`]). Zero: no reuse, a connection per request.
    pub keep_alive: Duration,
    /// Longest life of one connection, idle or not (default 60 s).
    pub max_connection_age: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Queue bound and overflow behaviour.
    pub queue: QueueConfig,
    /// Balancer settings.
    pub balancer: BalancerConfig,
    /// Circuit breakers.
    pub breaker: BreakerSettings,
    /// Rate limits (none by default).
    pub rate_limit: RateLimitConfig,
    /// Fallback response (none by default).
    pub fallback: Option<FallbackConfig>,
    /// Active health checks (off by default).
    pub health_check: Option<HealthCheckConfig>,
    /// Hedging (off by default).
    pub hedge: Option<HedgeAfter>,
    /// Headers added to every attempt to every endpoint (none by default);
    /// an endpoint's replace these by name. Values are redacted in `Debug`.
    pub headers: HeaderSet,
    /// TLS settings of its `https://` endpoints (none by default: the
    /// webpki roots, full verification).
    pub tls: Option<TlsConfig>,
    /// Client-side throttling of each node (`throttle`, off by default):
    /// once a node's backend accepts less than `1 / k` of what it is sent
    /// (429 and 503 are not accepts) over `window`, attempts to it are
    /// dropped locally with probability `(requests - k·accepts) /
    /// (requests + 1)`, ending `throttled` (retried elsewhere, never the
    /// node's fault).
    pub throttle: Option<ThrottleConfig>,
    /// How its endpoints' HTTP/2 connections are kept (`http2`).
    pub http2: Http2Config,
    /// Bounds of the learned limits of endpoints with `max_concurrent:
    /// "auto"` (defaults min 1, max 1000, initial 20).
    pub concurrency: LearnedLimitConfig,
    /// What a task line (a JSONL file's, a Redis stream's) may ask of the
    /// service (`lines`; see [`LineLimits`]).
    pub lines: LineLimits,
    /// Fair shares between tenants (`tenants`): weights per tenant key
    /// (default none), the weight of the others (default 1) and how many
    /// tenants are tracked at once (default 1024; the rest share one
    /// queue). See `docs/tenants.md`.
    pub tenants: TenantsConfig,
}

impl ServiceConfig {
    /// The configured endpoint at `address` (as normalized), if any.
    pub fn endpoint(&self, address: &str) -> Option<&EndpointConfig> {
        self.endpoints.iter().find(|e| e.address == address)
    }

    /// The headers of every attempt to `address`: the endpoint's over the
    /// service's (the service's alone for an endpoint not in the config).
    pub fn headers_for(&self, address: &str) -> HeaderSet {
        match self.endpoint(address) {
            Some(e) => HeaderSet::merged(&self.headers, &e.headers),
            None => self.headers.clone(),
        }
    }

    /// The TLS settings of `address`: the endpoint's, else the service's.
    pub fn tls_for(&self, address: &str) -> Option<&TlsConfig> {
        self.endpoint(address)
            .and_then(|e| e.tls.as_ref())
            .or(self.tls.as_ref())
    }
}
