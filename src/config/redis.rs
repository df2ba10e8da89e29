//! The top-level `redis` section: several instances sharing limits and breakers.
//!
//! ```json
//! "redis": { "url": "redis://127.0.0.1:6379/0", "prefix": "ad", "timeout": "50ms",
//!            "on_down": "local", "mode": "lease", "lease": "100ms", "heartbeat": "1s" }
//! ```
//!
//! With it, a service's `rate_limit.shared: true` keeps every bucket it sets
//! (`service`, and each node's `per_node`) in Redis, and `breaker.shared:
//! true` shares its nodes' breaker trips (see
//! [`crate::redis`] with the `redis` cargo feature). Without the section, or
//! without the flags, nothing is shared and no Redis is needed. A build
//! without the `redis` feature refuses the section with a config error.
//!
//! ## `redis.stream`: the durable task stream's settings
//!
//! The optional `stream` object holds the settings of the durable task
//! stream's consumer (`Dispatcher::consume`, feature `redis`): every field
//! of `crate::redis::stream::StreamConfig` under the same name, durations
//! as humantime strings. Every field is optional and defaults as
//! `StreamConfig::default()`. `null` for an optional one (`consumer`,
//! `claim_after`, `claim_every`, `max_in_flight`) is its default, except
//! that `idempotency_header: null` sends no header at all.
//!
//! ```json
//! "redis": { "url": "redis://127.0.0.1:6379/0",
//!            "stream": { "consumer": "worker-1", "group": "dispatch", "services": ["api"],
//!                        "claim_after": "30s", "claim_every": "1s", "max_deliveries": 5,
//!                        "idempotency_header": "Idempotency-Key", "block": "1s",
//!                        "done_ttl": "24h", "max_in_flight": 500 } }
//! ```
//!
//! Values the consumer would otherwise clamp are refused, naming the field
//! (`redis.stream.block`, ...): `block` in 10 ms..=60 s, `claim_after` in
//! 100 ms..=7 days, `claim_every` in 100 ms..=10 s, `done_ttl` in
//! 1 s..=365 days, `max_deliveries` at least 1, `max_in_flight` in
//! 1..=1 000 000, `group` and `consumer` not blank, `idempotency_header` a
//! valid header name, and each of `services` a configured service
//! (case-insensitively), listed once. Unknown fields are refused.
//!
//! `Dispatcher::consume_configured` consumes with these settings, and
//! `RedisConfig::stream_config` returns them (the defaults without the
//! object) for a caller to override some before `Dispatcher::consume`.

use std::time::Duration;

use serde::Deserialize;

/// The section as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    pub url: String,
    #[serde(default = "default_prefix")]
    pub prefix: String,
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default = "default_on_down")]
    pub on_down: String,
    #[serde(default = "default_mode")]
    pub mode: String,
    #[serde(default = "default_lease", with = "humantime_serde")]
    pub lease: Duration,
    #[serde(default = "default_heartbeat", with = "humantime_serde")]
    pub heartbeat: Duration,
    #[serde(default)]
    pub stream: Option<RawStream>,
}

/// The `redis.stream` object as written; defaults as `StreamConfig`'s.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStream {
    #[serde(default)]
    pub consumer: Option<String>,
    #[serde(default = "default_group")]
    pub group: String,
    #[serde(default)]
    pub services: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    pub claim_after: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub claim_every: Option<Duration>,
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u32,
    /// Absent: the default header; `null`: none.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: Option<String>,
    #[serde(default = "default_block", with = "humantime_serde")]
    pub block: Duration,
    #[serde(default = "default_done_ttl", with = "humantime_serde")]
    pub done_ttl: Duration,
    #[serde(default)]
    pub max_in_flight: Option<usize>,
}

fn default_group() -> String {
    "dispatch".into()
}
fn default_max_deliveries() -> u32 {
    5
}
fn default_idempotency_header() -> Option<String> {
    Some("Idempotency-Key".into())
}
fn default_block() -> Duration {
    Duration::from_secs(1)
}
fn default_done_ttl() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_prefix() -> String {
    "ad".into()
}
fn default_timeout() -> Duration {
    Duration::from_millis(50)
}
fn default_on_down() -> String {
    "local".into()
}
fn default_mode() -> String {
    "lease".into()
}
fn default_lease() -> Duration {
    Duration::from_millis(100)
}
fn default_heartbeat() -> Duration {
    Duration::from_secs(1)
}

/// What an instance does while Redis does not answer within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDown {
    /// Local limits at `rate / (last known live instances)`, local breakers
    /// (default).
    Local,
    /// Admit as if no shared limit were set (local breakers still apply).
    Allow,
    /// Reject the service's tasks (`SharedLimitDown`) until Redis is back.
    Deny,
}

/// How a shared bucket's tokens reach the balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedMode {
    /// When tasks wait, the balancer takes their tokens and a lease ahead
    /// (at most `rate · lease`), usable for `lease`; dispatch does not wait
    /// on Redis per task. Over any window T the backends see at most
    /// `burst + rate · (T + lease)`.
    Lease,
    /// Every admission is one token taken by the script, batched per
    /// balancer turn; tasks wait in the queue meanwhile. At most
    /// `burst + rate · T`.
    Exact,
}

/// The validated `redis` section.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// Connection URL (`redis://host:port/db`, `redis+unix:///path`).
    pub url: String,
    /// Prefix of every key (default `ad`).
    pub prefix: String,
    /// Longest wait for an answer before `on_down` applies (default 50 ms).
    pub timeout: Duration,
    /// Policy while Redis is slow or gone (default `local`).
    pub on_down: OnDown,
    /// Lease or exact admissions (default `lease`).
    pub mode: SharedMode,
    /// Validity of a lease of tokens (default 100 ms).
    pub lease: Duration,
    /// Membership heartbeat period (default 1 s); an instance silent for
    /// three periods no longer counts as live.
    pub heartbeat: Duration,
    /// The durable task stream's settings, `redis.stream` (none by
    /// default: [`RedisConfig::stream_config`] gives the defaults).
    #[cfg(feature = "redis")]
    pub stream: Option<crate::redis::stream::StreamConfig>,
}

#[cfg(feature = "redis")]
impl RedisConfig {
    /// The settings of [`Dispatcher::consume`](crate::Dispatcher::consume)
    /// from `redis.stream`, or `StreamConfig::default()` when the config
    /// has no such object. Change fields of the result to override the
    /// file (as `actix-dispatch-worker`'s flags do).
    pub fn stream_config(&self) -> crate::redis::stream::StreamConfig {
        self.stream.clone().unwrap_or_default()
    }
}

/// Checks `redis.stream` (all but whether `services` are configured, which
/// [`super::validate`] checks once the services are read).
fn validate_stream(raw: &RawStream) -> Result<(), (String, String)> {
    let err = |f: &str, m: String| Err((format!("redis.stream.{f}"), m));
    if raw.consumer.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return err(
            "consumer",
            "must not be empty (leave it out for `<pid>-<random>`)".into(),
        );
    }
    if raw.group.trim().is_empty() {
        return err("group", "must not be empty".into());
    }
    let ms = Duration::from_millis;
    let ranges = [
        (
            "block",
            Some(raw.block),
            ms(10),
            Duration::from_secs(60),
            "10ms",
            "60s",
        ),
        (
            "claim_after",
            raw.claim_after,
            ms(100),
            Duration::from_secs(7 * 86_400),
            "100ms",
            "7days",
        ),
        (
            "claim_every",
            raw.claim_every,
            ms(100),
            Duration::from_secs(10),
            "100ms",
            "10s",
        ),
        (
            "done_ttl",
            Some(raw.done_ttl),
            Duration::from_secs(1),
            crate::algo::time::MAX_DURATION,
            "1s",
            "365days",
        ),
    ];
    for (field, d, lo, hi, los, his) in ranges {
        if let Some(d) = d {
            if d < lo || d > hi {
                return err(field, format!("{d:?} is not in {los}..={his}"));
            }
        }
    }
    if raw.max_deliveries == 0 {
        return err("max_deliveries", "must be at least 1".into());
    }
    if let Some(n) = raw.max_in_flight {
        if !(1..=1_000_000).contains(&n) {
            return err("max_in_flight", "must be in 1..=1000000".into());
        }
    }
    if let Some(h) = &raw.idempotency_header {
        if awc::http::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
            return err(
                "idempotency_header",
                format!("{h:?} is not a valid header name (null sends none)"),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, s) in raw.services.iter().enumerate() {
        if !seen.insert(s.trim().to_lowercase()) {
            return err(
                &format!("services[{i}]"),
                format!("service {s:?} is listed twice"),
            );
        }
    }
    Ok(())
}

#[cfg(feature = "redis")]
fn stream_config(raw: RawStream) -> crate::redis::stream::StreamConfig {
    let d = crate::redis::stream::StreamConfig::default();
    crate::redis::stream::StreamConfig {
        consumer: raw.consumer.unwrap_or(d.consumer),
        group: raw.group,
        services: raw.services.iter().map(|s| s.trim().to_owned()).collect(),
        claim_after: raw.claim_after,
        claim_every: raw.claim_every,
        max_deliveries: raw.max_deliveries,
        idempotency_header: raw.idempotency_header,
        block: raw.block,
        done_ttl: raw.done_ttl,
        max_in_flight: raw.max_in_flight,
    }
}

/// Validates the section; errors are `(field, message)`.
pub(crate) fn validate(raw: RawRedis) -> Result<RedisConfig, (String, String)> {
    let err = |f: &str, m: &str| Err((format!("redis.{f}"), m.to_string()));
    if !(raw.url.starts_with("redis://")
        || raw.url.starts_with("rediss://")
        || raw.url.starts_with("redis+unix://")
        || raw.url.starts_with("unix://"))
    {
        return err("url", "expected a redis:// or redis+unix:// URL");
    }
    if raw.prefix.is_empty() || raw.prefix.contains(['{', '}']) {
        return err("prefix", "must be non-empty, without braces");
    }
    let bounded = |d: Duration| !d.is_zero() && d <= Duration::from_secs(60);
    if !bounded(raw.timeout) {
        return err("timeout", "must be in (0, 60s]");
    }
    if !bounded(raw.lease) {
        return err("lease", "must be in (0, 60s]");
    }
    if !bounded(raw.heartbeat) {
        return err("heartbeat", "must be in (0, 60s]");
    }
    let on_down = match raw.on_down.to_ascii_lowercase().as_str() {
        "local" => OnDown::Local,
        "allow" => OnDown::Allow,
        "deny" => OnDown::Deny,
        _ => return err("on_down", "expected local, allow or deny"),
    };
    let mode = match raw.mode.to_ascii_lowercase().as_str() {
        "lease" => SharedMode::Lease,
        "exact" => SharedMode::Exact,
        _ => return err("mode", "expected lease or exact"),
    };
    if let Some(s) = &raw.stream {
        validate_stream(s)?;
    }
    if !cfg!(feature = "redis") {
        return err("url", "this build has no `redis` cargo feature");
    }
    Ok(RedisConfig {
        url: raw.url,
        prefix: raw.prefix,
        timeout: raw.timeout,
        on_down,
        mode,
        lease: raw.lease,
        heartbeat: raw.heartbeat,
        #[cfg(feature = "redis")]
        stream: raw.stream.map(stream_config),
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const SVC: &str = r#"{"name":"a","endpoints":[{"address":"http://h/"}],
        "rate_limit":{"service":{"rate":5,"burst":2},"shared":true},"breaker":{"shared":true,"quorum":2}}"#;

    #[test]
    fn without_the_section_nothing_is_shared() {
        let c = Config::from_json(
            r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#,
        )
        .unwrap();
        assert!(c.redis.is_none());
        assert!(!c.services[0].rate_limit.shared);
        assert!(!c.services[0].breaker.shared);
        assert_eq!(c.services[0].breaker.quorum, 1);
    }

    #[test]
    fn shared_flags_need_the_section() {
        let e = Config::from_json(&format!(r#"{{"services":[{SVC}]}}"#)).unwrap_err();
        assert!(
            e.to_string().contains("need a top-level `redis` section"),
            "{e}"
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn the_section_with_defaults_and_values() {
        use crate::config::{OnDown, SharedMode};
        let c = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://127.0.0.1:6379/0"}},"services":[{SVC}]}}"#
        ))
        .unwrap();
        let r = c.redis.unwrap();
        assert_eq!(r.prefix, "ad");
        assert_eq!(r.timeout, std::time::Duration::from_millis(50));
        assert_eq!(r.on_down, OnDown::Local);
        assert_eq!(r.mode, SharedMode::Lease);
        assert!(c.services[0].rate_limit.shared);
        assert_eq!(c.services[0].breaker.quorum, 2);
        let c = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://r/","on_down":"deny","mode":"exact","timeout":"20ms"}},"services":[{SVC}]}}"#
        ))
        .unwrap();
        let r = c.redis.unwrap();
        assert_eq!((r.on_down, r.mode), (OnDown::Deny, SharedMode::Exact));
        for (bad, field) in [
            (r#"{"url":"http://r/"}"#, "redis.url"),
            (r#"{"url":"redis://r/","on_down":"maybe"}"#, "redis.on_down"),
            (r#"{"url":"redis://r/","timeout":"0s"}"#, "redis.timeout"),
            (r#"{"url":"redis://r/","prefix":"a{b}"}"#, "redis.prefix"),
            (r#"{"url":"redis://r/","nope":1}"#, "redis"),
        ] {
            let e =
                Config::from_json(&format!(r#"{{"redis":{bad},"services":[{SVC}]}}"#)).unwrap_err();
            assert!(e.to_string().contains(field), "{bad}: {e}");
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn shared_shares_every_bucket_set_and_needs_one() {
        let with = |rl: &str| {
            Config::from_json(&format!(
                r#"{{"redis":{{"url":"redis://r/"}},"services":[{{"name":"a","endpoints":[{{"address":"http://h/"}}],"rate_limit":{rl}}}]}}"#
            ))
        };
        // Per-node buckets alone may be shared.
        let c = with(r#"{"per_node":{"rate":20,"burst":5},"shared":true}"#).unwrap();
        let rl = &c.services[0].rate_limit;
        assert!(rl.shared && rl.service.is_none() && rl.per_node.is_some());
        // Both: both shared.
        let c = with(
            r#"{"per_node":{"rate":20,"burst":5},"service":{"rate":50,"burst":10},"shared":true}"#,
        )
        .unwrap();
        assert!(c.services[0].rate_limit.shared);
        // Nothing to share: refused, naming the field.
        let e = with(r#"{"shared":true}"#).unwrap_err().to_string();
        assert!(e.contains("rate_limit.shared"), "{e}");
        assert!(e.contains("rate_limit.per_node"), "{e}");
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn a_build_without_the_feature_refuses_the_section() {
        let e = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://127.0.0.1:6379/0"}},"services":[{SVC}]}}"#
        ))
        .unwrap_err();
        assert!(e.to_string().contains("no `redis` cargo feature"), "{e}");
    }
}
