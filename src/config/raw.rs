//! The config file as written: serde structs with documented defaults.
//!
//! These mirror the JSON exactly (unknown fields are refused, the seed's
//! `ApiServers` / `Name` / `Mode` / `ApiEndPoints` / `Address` / `Weight` /
//! `IsActive` spellings are accepted as aliases). [`super::validate`] turns
//! them into the checked values the engine runs on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

pub(crate) use super::headers::RawHeader;
pub(crate) use super::redis::RawRedis;
pub(crate) use super::tls::RawTls;

/// One service as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    #[serde(alias = "Name")]
    pub name: String,
    #[serde(alias = "Mode", default)]
    pub mode: Option<String>,
    #[serde(alias = "ApiEndPoints", alias = "EndPoints", default)]
    pub endpoints: Vec<RawEndpoint>,
    #[serde(
        alias = "Timeout",
        default = "default_timeout",
        with = "humantime_serde"
    )]
    pub timeout: Duration,
    #[serde(default = "default_max_body")]
    pub max_body: usize,
    #[serde(default = "default_keep_alive", with = "humantime_serde")]
    pub keep_alive: Duration,
    #[serde(default = "default_max_connection_age", with = "humantime_serde")]
    pub max_connection_age: Duration,
    #[serde(default)]
    pub retry: RawRetry,
    #[serde(default)]
    pub queue: RawQueue,
    #[serde(default)]
    pub balancer: RawBalancer,
    #[serde(default)]
    pub breaker: RawBreaker,
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub fallback: Option<RawFallback>,
    #[serde(default)]
    pub health_check: Option<RawHealthCheck>,
    #[serde(default)]
    pub hedge: Option<RawHedge>,
    #[serde(default)]
    pub headers: BTreeMap<String, RawHeader>,
    #[serde(default)]
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub http2: RawHttp2,
    /// The learned concurrency limit of endpoints with
    /// `max_concurrent: "auto"`.
    #[serde(default)]
    pub concurrency: RawConcurrency,
    /// Client-side throttling of each node (off unless set).
    #[serde(default)]
    pub throttle: Option<RawThrottle>,
    /// What a task line may ask of the service.
    #[serde(default)]
    pub lines: super::RawLines,
    /// Fair shares between tenants: weights and the bound on tracked ones.
    #[serde(default)]
    pub tenants: RawTenants,
}

/// `tenants`: weights per tenant and how many are tracked (`algo::tenants`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawTenants {
    pub weights: BTreeMap<String, u64>,
    pub default_weight: u64,
    pub max_tracked: u64,
    pub rate: Option<RawBucket>,
    pub shared: bool,
}

impl Default for RawTenants {
    fn default() -> Self {
        let c = crate::algo::tenants::TenantsConfig::default();
        Self {
            weights: BTreeMap::new(),
            default_weight: u64::from(c.default_weight),
            max_tracked: c.max_tracked as u64,
            rate: None,
            shared: false,
        }
    }
}

/// `throttle`: adaptive client-side throttling per node (`algo::throttle`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawThrottle {
    pub k: f64,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for RawThrottle {
    fn default() -> Self {
        let c = crate::algo::throttle::ThrottleConfig::default();
        Self {
            k: c.k,
            window: c.window,
        }
    }
}

/// `http2`: a node's HTTP/2 connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawHttp2 {
    pub connections: u32,
    pub prior_knowledge: bool,
}

impl Default for RawHttp2 {
    fn default() -> Self {
        let d = crate::config::Http2Config::default();
        Self {
            connections: d.connections,
            prior_knowledge: d.prior_knowledge,
        }
    }
}

/// `concurrency`: bounds of a learned limit (`algo::concurrency`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawConcurrency {
    pub min: u32,
    pub max: u32,
    pub initial: u32,
}

impl Default for RawConcurrency {
    fn default() -> Self {
        let c = crate::algo::concurrency::LearnedLimitConfig::default();
        Self {
            min: c.min,
            max: c.max,
            initial: c.initial,
        }
    }
}

/// An endpoint's `max_concurrent`: a number, or `"auto"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawMaxConcurrent {
    Fixed(u32),
    Word(String),
}

/// One endpoint as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEndpoint {
    #[serde(alias = "Address")]
    pub address: String,
    #[serde(alias = "Weight", default = "one_i64")]
    pub weight: i64,
    #[serde(alias = "MaxConcurrent", default = "default_max_concurrent")]
    pub max_concurrent: RawMaxConcurrent,
    #[serde(alias = "Active", alias = "IsActive", default = "yes")]
    pub active: bool,
    #[serde(default)]
    pub headers: BTreeMap<String, RawHeader>,
    #[serde(default)]
    pub tls: Option<RawTls>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawRetry {
    pub max_retries: u32,
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    #[serde(with = "humantime_serde")]
    pub max_retry_after: Duration,
    pub budget_percent: f64,
    pub min_retries_per_sec: u32,
}

impl Default for RawRetry {
    fn default() -> Self {
        let budget = crate::algo::budget::BudgetConfig::default();
        Self {
            max_retries: 3,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(10),
            budget_percent: budget.percent,
            min_retries_per_sec: budget.min_per_sec,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawQueue {
    pub capacity: usize,
    pub on_full: String,
    pub max_waiting: Option<usize>,
    pub max_bytes: usize,
    pub delay: Option<RawDelay>,
    #[serde(with = "humantime_serde")]
    pub deadline: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub slo: Option<Duration>,
    pub priority: RawPriority,
}

impl Default for RawQueue {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            on_full: "reject".into(),
            max_waiting: None,
            max_bytes: 256 << 20,
            delay: None,
            deadline: None,
            slo: None,
            priority: RawPriority::default(),
        }
    }
}

/// `queue.priority`: the reserved share of each class (`algo::priority`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawPriority {
    pub critical: f64,
    pub default: f64,
    pub sheddable: f64,
}

impl Default for RawPriority {
    fn default() -> Self {
        let c = crate::algo::priority::PriorityConfig::default();
        Self {
            critical: c.critical,
            default: c.default,
            sheddable: c.sheddable,
        }
    }
}

/// `queue.delay`: the queue's delay control (`algo::codel`), on when the
/// section is given (unless `enabled: false`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawDelay {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub target: Duration,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    pub lifo: bool,
    #[serde(with = "humantime_serde")]
    pub max_wait: Option<Duration>,
}

impl Default for RawDelay {
    fn default() -> Self {
        let c = crate::algo::codel::CodelConfig::default();
        Self {
            enabled: true,
            target: c.target,
            interval: c.interval,
            lifo: c.lifo,
            max_wait: c.max_wait,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawBalancer {
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    pub least_load: RawLeastLoad,
    #[serde(with = "humantime_serde")]
    pub decay: Duration,
    #[serde(with = "humantime_serde")]
    pub default_rtt: Duration,
    #[serde(with = "humantime_serde")]
    pub failure_penalty: Duration,
    #[serde(with = "humantime_serde")]
    pub slow_start: Option<Duration>,
    pub slow_start_floor: f64,
    pub seed: Option<u64>,
}

impl Default for RawBalancer {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_secs(1),
            least_load: RawLeastLoad::default(),
            decay: Duration::from_secs(10),
            default_rtt: Duration::from_millis(30),
            failure_penalty: Duration::from_secs(1),
            slow_start: None,
            slow_start_floor: 0.1,
            seed: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawLeastLoad {
    pub in_flight: f64,
    pub latency: f64,
    pub errors: f64,
}

impl Default for RawLeastLoad {
    fn default() -> Self {
        let w = crate::algo::strategy::LeastLoadWeights::default();
        Self {
            in_flight: w.in_flight,
            latency: w.latency,
            errors: w.errors,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawBreaker {
    pub enabled: bool,
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub window: u32,
    pub min_calls: u32,
    #[serde(with = "humantime_serde")]
    pub slow_call: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    #[serde(with = "humantime_serde")]
    pub max_open_for: Duration,
    #[serde(with = "humantime_serde")]
    pub reset_after: Duration,
    pub half_open_probes: u32,
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Option<Duration>,
    pub on_all_open: String,
    pub max_ejected_percent: u32,
    pub shared: bool,
    pub quorum: u32,
}

impl Default for RawBreaker {
    /// The breaker's own defaults (see `BreakerConfig`); the probe timeout
    /// defaults to twice the service's attempt timeout (set in validation).
    fn default() -> Self {
        let b = crate::algo::breaker::BreakerConfig::default();
        Self {
            enabled: true,
            consecutive_failures: b.consecutive_failures,
            failure_rate: b.failure_rate,
            window: b.window,
            min_calls: b.min_calls,
            slow_call: b.slow_call,
            open_for: b.open_for,
            max_open_for: b.max_open_for,
            reset_after: b.reset_after,
            half_open_probes: b.half_open_probes,
            probe_timeout: None,
            on_all_open: "fail_fast".into(),
            max_ejected_percent: 100,
            shared: false,
            quorum: 1,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBucket {
    pub rate: f64,
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    #[serde(default)]
    pub per_node: Option<RawBucket>,
    #[serde(default)]
    pub service: Option<RawBucket>,
    #[serde(default = "default_on_limit")]
    pub on_limit: String,
    #[serde(default)]
    pub shared: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFallback {
    #[serde(default = "default_fallback_status")]
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawHealthCheck {
    pub path: String,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub unhealthy_threshold: u32,
    pub healthy_threshold: u32,
}

impl Default for RawHealthCheck {
    fn default() -> Self {
        Self {
            path: "health".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHedge {
    #[serde(default, with = "humantime_serde")]
    pub after: Option<Duration>,
    #[serde(default)]
    pub percentile: Option<f64>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_max_body() -> usize {
    2 * 1024 * 1024
}
/// 1 s: below the idle timeouts of common servers (gunicorn 2 s; uvicorn,
/// Node.js, Apache and actix-web 5 s; nginx 75 s), so the engine, not the
/// server, closes an idle connection, and the race of reusing a connection
/// the server is closing does not arise with them.
fn default_keep_alive() -> Duration {
    Duration::from_secs(1)
}
/// 60 s: connections are renewed now and then (a moved or re-weighted
/// backend behind a load balancer is seen).
fn default_max_connection_age() -> Duration {
    Duration::from_secs(60)
}
fn one_i64() -> i64 {
    1
}
fn default_max_concurrent() -> RawMaxConcurrent {
    RawMaxConcurrent::Fixed(10)
}
fn yes() -> bool {
    true
}
fn default_on_limit() -> String {
    "wait".into()
}
fn default_fallback_status() -> u16 {
    200
}
