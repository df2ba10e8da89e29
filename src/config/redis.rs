//! The top-level `redis` section: several instances sharing limits and breakers.
//!
//! ```json
//! "redis": { "url": "redis://127.0.0.1:6379/0", "prefix": "ad", "timeout": "50ms",
//!            "on_down": "local", "mode": "lease", "lease": "100ms", "heartbeat": "1s",
//!            "expected_instances": 3, "cluster": false, "ca_file": null }
//! ```
//!
//! `url` may hold a password: it is shown redacted in `Debug`, logs and
//! errors ([`RedisConfig::redacted_url`]). `rediss://` connects over TLS,
//! trusting `ca_file`'s authorities (PEM, read at load) or else the
//! system's. `cluster: true` makes `url` one node of a Redis Cluster.
//! `sentinel: {"master": "mymaster", "nodes": ["redis://10.0.0.1:26379", ...]}`
//! finds the master through Redis Sentinel: `url` then names the master
//! (`redis://[user:password@]mymaster/0`), not an address (see
//! [`SentinelConfig`]); the nodes are redacted like `url`.
//! `expected_instances` is the live count assumed until Redis answers a
//! heartbeat (see [`crate::redis`]).
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
//! of [`StreamConfig`] under the same name, durations
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
//!                        "done_ttl": "24h", "max_in_flight": 500,
//!                        "max_entry_bytes": 1048576, "max_read_bytes": 67108864,
//!                        "results_max_len": 100000, "dead_max_len": 100000 } }
//! ```
//!
//! Values the consumer would otherwise clamp are refused, naming the field
//! (`redis.stream.block`, ...): `block` in 10 ms..=60 s, `claim_after` in
//! 100 ms..=7 days, `claim_every` in 100 ms..=10 s, `done_ttl` in
//! 1 s..=365 days, `max_deliveries` at least 1, `max_in_flight` in
//! 1..=1 000 000, `max_entry_bytes` in 256 B..=512 MiB, `max_read_bytes`
//! from `max_entry_bytes` to 1 GiB, `results_max_len` and `dead_max_len`
//! in 1..=10⁹, `group` and `consumer` not blank, `idempotency_header` a
//! valid header name, and each of `services` a configured service
//! (case-insensitively), listed once. Unknown fields are refused.
//!
//! `Dispatcher::consume_configured` consumes with these settings, and
//! `RedisConfig::stream_config` returns them (the defaults without the
//! object) for a caller to override some before `Dispatcher::consume`.

mod sentinel;
mod stream;
mod url;

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

pub use sentinel::SentinelConfig;
use sentinel::{is_tls, validate_sentinel, RawSentinel};
pub use stream::StreamConfig;
use stream::{stream_config, validate_stream, RawStream};
use url::{redact_url, url_secrets};

/// The section as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    pub url: String,
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default = "default_expected_instances")]
    pub expected_instances: u64,
    #[serde(default)]
    pub cluster: bool,
    #[serde(default)]
    pub sentinel: Option<RawSentinel>,
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

fn default_expected_instances() -> u64 {
    1
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
#[non_exhaustive]
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
#[non_exhaustive]
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
///
/// Its `Debug` shows the URL with its userinfo (user and password) and
/// query redacted, as [`RedisConfig::redacted_url`] does.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Connection URL (`redis://[user:password@]host:port/db`,
    /// `rediss://...` for TLS, `redis+unix:///path`). It may hold a
    /// password: log [`RedisConfig::redacted_url`], never this.
    pub url: String,
    /// Authorities trusted for `rediss://` (`ca_file`, PEM, read when the
    /// config is loaded) instead of the system's roots.
    pub ca: Option<crate::config::CaFile>,
    /// Instances expected to share the limits (default 1): until Redis has
    /// answered a heartbeat, the local fallback of `on_down: local` divides
    /// each shared rate by this, so N replicas started without a working
    /// Redis (down, or a wrong password) send at most the limit, not N
    /// times it. Once Redis answers, the live count read replaces it.
    pub expected_instances: u64,
    /// `url` is one node of a Redis Cluster (default false): the others
    /// are found from it, `MOVED` and `ASK` are followed.
    pub cluster: bool,
    /// The master is found through these sentinels (`redis.sentinel`;
    /// none by default): `url` then names the master instead of an address
    /// (see [`SentinelConfig`]).
    pub sentinel: Option<SentinelConfig>,
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
    pub stream: Option<StreamConfig>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("ca", &self.ca)
            .field("expected_instances", &self.expected_instances)
            .field("cluster", &self.cluster)
            .field("sentinel", &self.sentinel)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_down", &self.on_down)
            .field("mode", &self.mode)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("stream", &self.stream)
            .finish()
    }
}

impl RedisConfig {
    /// The URL with its userinfo and query (where a password may be)
    /// replaced by `<redacted>`: the form every log line and error shows.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// `text` (an error message) with the URL and its password, wherever
    /// they appear, replaced by their redacted forms.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.replace(&self.url, &self.redacted_url());
        for secret in url_secrets(&self.url) {
            out = out.replace(&secret, "<redacted>");
        }
        if let Some(s) = &self.sentinel {
            for (secret, shown) in s.secrets() {
                out = out.replace(&secret, &shown);
            }
        }
        out
    }

    /// The settings of `Dispatcher::consume`
    /// from `redis.stream`, or `StreamConfig::default()` when the config
    /// has no such object. Change fields of the result to override the
    /// file (as `actix-dispatch-worker`'s flags do).
    pub fn stream_config(&self) -> StreamConfig {
        self.stream.clone().unwrap_or_default()
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
        return err("url", "expected a redis://, rediss:// or redis+unix:// URL");
    }
    if !(1..=100_000).contains(&raw.expected_instances) {
        return err("expected_instances", "must be in 1..=100000");
    }
    if raw.cluster && !(raw.url.starts_with("redis://") || raw.url.starts_with("rediss://")) {
        return err("cluster", "a Cluster is reached over redis:// or rediss://");
    }
    let sentinel = match &raw.sentinel {
        Some(s) => Some(validate_sentinel(s, &raw.url, raw.cluster)?),
        None => None,
    };
    let tls_somewhere = is_tls(&raw.url)
        || sentinel
            .as_ref()
            .is_some_and(|s| s.nodes.iter().any(|n| is_tls(n)));
    if raw.ca_file.is_some() && !tls_somewhere {
        return err(
            "ca_file",
            "applies to a rediss:// URL only (the url's or the sentinels')",
        );
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
    let ca = match &raw.ca_file {
        None => None,
        Some(path) => Some(crate::config::CaFile {
            path: path.clone(),
            certs: load_ca(path)
                .map_err(|m| ("redis.ca_file".to_owned(), m))?
                .into(),
        }),
    };
    Ok(RedisConfig {
        url: raw.url,
        ca,
        expected_instances: raw.expected_instances,
        cluster: raw.cluster,
        sentinel,
        prefix: raw.prefix,
        timeout: raw.timeout,
        on_down,
        mode,
        lease: raw.lease,
        heartbeat: raw.heartbeat,
        stream: raw.stream.map(stream_config),
    })
}

/// Reads the PEM certificates of `path` (the HTTP side's reader).
#[cfg(feature = "redis")]
fn load_ca(path: &str) -> Result<Vec<Vec<u8>>, String> {
    super::tls::read_ca_pem(path)
}

#[cfg(not(feature = "redis"))]
fn load_ca(_path: &str) -> Result<Vec<Vec<u8>>, String> {
    Err("this build has no `redis` cargo feature".into())
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
        assert_eq!(
            (r.expected_instances, r.cluster, r.ca.is_none()),
            (1, false, true)
        );
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
            (
                r#"{"url":"redis+unix:///r.sock","cluster":true}"#,
                "redis.cluster",
            ),
            (
                r#"{"url":"redis://r/","ca_file":"ca.pem"}"#,
                "redis.ca_file",
            ),
            (
                r#"{"url":"redis://r/","expected_instances":0}"#,
                "redis.expected_instances",
            ),
            (
                r#"{"url":"redis://m/","cluster":true,"sentinel":{"master":"m","nodes":["redis://h:26379"]}}"#,
                "redis.sentinel",
            ),
            (
                r#"{"url":"redis://m/","sentinel":{"master":"m","nodes":[]}}"#,
                "redis.sentinel.nodes",
            ),
            (
                r#"{"url":"redis://m/","sentinel":{"master":"","nodes":["redis://h:26379"]}}"#,
                "redis.sentinel.master",
            ),
            (
                r#"{"url":"redis://m/","sentinel":{"master":"m","nodes":["h:26379"]}}"#,
                "redis.sentinel.nodes[0]",
            ),
            (
                r#"{"url":"redis://h:6379/","sentinel":{"master":"m","nodes":["redis://h:26379"]}}"#,
                "redis.url",
            ),
            (
                r#"{"url":"redis://m/","sentinel":{"master":"m","nodes":["redis://h:26379"],"x":1}}"#,
                "redis",
            ),
            (
                r#"{"url":"redis://m/","ca_file":"ca.pem","sentinel":{"master":"m","nodes":["redis://h:26379"]}}"#,
                "redis.ca_file",
            ),
        ] {
            let e =
                Config::from_json(&format!(r#"{{"redis":{bad},"services":[{SVC}]}}"#)).unwrap_err();
            assert!(e.to_string().contains(field), "{bad}: {e}");
        }
    }

    /// A sentinel section: the master's name, its nodes, and secrets of
    /// both `url` and the nodes kept out of `Debug` and scrubbed messages.
    #[cfg(feature = "redis")]
    #[test]
    fn a_sentinel_section_is_read_and_redacted() {
        let c = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://app:data-pw@mymaster/2",
                "sentinel":{{"master":"mymaster","nodes":["redis://:sent-pw@10.0.0.1:26379","redis://:sent-pw@10.0.0.2:26379"]}}}},
              "services":[{SVC}]}}"#
        ))
        .unwrap();
        let r = c.redis.unwrap();
        let s = r.sentinel.clone().expect("sentinel");
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(r.redacted_url(), "redis://<redacted>@mymaster/2");
        let dbg = format!("{r:?}");
        assert!(
            !dbg.contains("data-pw") && !dbg.contains("sent-pw"),
            "{dbg}"
        );
        assert!(dbg.contains("redis://<redacted>@10.0.0.2:26379"), "{dbg}");
        let msg = r.scrub("failed: redis://:sent-pw@10.0.0.1:26379 (sent-pw), data-pw");
        assert!(!msg.contains("pw"), "{msg}");
        assert!(msg.contains("redis://<redacted>@10.0.0.1:26379"), "{msg}");
        // Without the object, none.
        let c = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://r/"}},"services":[{SVC}]}}"#
        ))
        .unwrap();
        assert!(c.redis.unwrap().sentinel.is_none());
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
