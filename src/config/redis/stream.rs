//! The `redis.stream` object: the durable task stream consumer's settings.
//!
//! [`StreamConfig`] lives on the config side (the stream module reads it,
//! the config never reads the stream module), so the dependency goes one
//! way: `redis::stream` -> `config`.

use std::time::Duration;

use serde::Deserialize;

use crate::config::ServiceConfig;

/// Options of `Dispatcher::consume` (feature `redis`).
///
/// A config file gives them as the `redis.stream` object (same field names,
/// durations as humantime strings; see [`crate::config`]'s `redis` section),
/// read into [`RedisConfig::stream`](crate::config::RedisConfig::stream) and
/// used by `Dispatcher::consume_configured`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamConfig {
    /// This instance's consumer name in the group (default
    /// `<pid>-<random>`). Give a stable name to resume the same pending
    /// entries after a restart.
    pub consumer: String,
    /// The consumer group (default `dispatch`), created at the stream's
    /// start (`0`) if missing, so entries added before any instance started
    /// are read.
    pub group: String,
    /// Services to consume (default: every configured service).
    pub services: Vec<String>,
    /// Idle time after which a pending entry is claimed (default: computed
    /// per service, see [`StreamConfig::default_claim_after`]).
    pub claim_after: Option<Duration>,
    /// How often to claim and refresh the stream's stats (default
    /// `claim_after / 4`, within 100 ms..=10 s).
    pub claim_every: Option<Duration>,
    /// Deliveries before an entry goes to the dead-letter stream (default 5).
    pub max_deliveries: u32,
    /// The header carrying the entry id to backends (default
    /// `Idempotency-Key`; `None`: not sent).
    pub idempotency_header: Option<String>,
    /// Longest block of one read (default 1 s; also how soon a shutdown
    /// stops the reader).
    pub block: Duration,
    /// Life of a done-marker (default 24 h): longer than a task can stay in
    /// flight at any instance.
    pub done_ttl: Duration,
    /// Entries in flight per service at most (default: the queue's capacity).
    pub max_in_flight: Option<usize>,
    /// The largest entry taken as a task, in bytes of its fields' names
    /// and values (default 1 MiB): a larger one goes to the dead letters
    /// with its size, never parsed, and only its first KiB is kept there.
    pub max_entry_bytes: usize,
    /// What one read (`XREADGROUP`, `XAUTOCLAIM`) may bring at most, in
    /// bytes (default 64 MiB): a read asks for at most `max_read_bytes /
    /// max_entry_bytes` entries (64 by default), fewer when the credit is
    /// smaller.
    pub max_read_bytes: usize,
    /// `MAXLEN ~` of the results stream (default 100 000 entries): results
    /// that nobody reads cannot grow Redis's memory without bound.
    pub results_max_len: u64,
    /// `MAXLEN ~` of the dead-letter stream (default 100 000 entries).
    pub dead_max_len: u64,
}

/// [`StreamConfig::max_entry_bytes`]'s default: 1 MiB.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 1 << 20;
/// [`StreamConfig::max_read_bytes`]'s default: 64 MiB.
pub const DEFAULT_MAX_READ_BYTES: usize = 64 << 20;
/// The default `MAXLEN ~` of the results and dead-letter streams.
pub const DEFAULT_MAX_LEN: u64 = 100_000;

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            consumer: format!("{}-{:08x}", std::process::id(), rand::random::<u32>()),
            group: "dispatch".into(),
            services: Vec::new(),
            claim_after: None,
            claim_every: None,
            max_deliveries: 5,
            idempotency_header: Some("Idempotency-Key".into()),
            block: Duration::from_secs(1),
            done_ttl: Duration::from_secs(24 * 3600),
            max_in_flight: None,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
            results_max_len: DEFAULT_MAX_LEN,
            dead_max_len: DEFAULT_MAX_LEN,
        }
    }
}

impl StreamConfig {
    /// The defaults, with this instance's `consumer` name (a stable name
    /// resumes the same pending entries after a restart); set the other
    /// fields on the value.
    pub fn named(consumer: impl Into<String>) -> StreamConfig {
        StreamConfig {
            consumer: consumer.into(),
            ..StreamConfig::default()
        }
    }

    /// The default `claim_after` of `svc`: twice the longest a delivery's
    /// attempts and backoffs take, plus a second for the queue:
    /// `2 × (timeout × (max_retries + 1) + backoff_max × max_retries) + 1 s`,
    /// `timeout` the longer of the service's and the longest a line may
    /// ask (`lines.max_timeout`).
    pub fn default_claim_after(svc: &ServiceConfig) -> Duration {
        let timeout = svc.timeout.max(svc.lines.max_timeout);
        let work = crate::config::lines::attempts_time(timeout, &svc.retry);
        work.saturating_mul(2) + Duration::from_secs(1)
    }

    /// Entries one read asks for at most: the credit `free`, and no more
    /// than `max_read_bytes / max_entry_bytes` (at least 1), so that a read
    /// of entries within the bound brings at most `max_read_bytes`.
    pub fn read_count(&self, free: u64) -> u64 {
        let by_bytes = (self.max_read_bytes / self.max_entry_bytes.max(1)).max(1) as u64;
        free.min(by_bytes)
    }
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
    #[serde(default = "default_max_entry_bytes")]
    pub max_entry_bytes: usize,
    #[serde(default = "default_max_read_bytes")]
    pub max_read_bytes: usize,
    #[serde(default = "default_max_len")]
    pub results_max_len: u64,
    #[serde(default = "default_max_len")]
    pub dead_max_len: u64,
}

fn default_max_entry_bytes() -> usize {
    DEFAULT_MAX_ENTRY_BYTES
}
fn default_max_read_bytes() -> usize {
    DEFAULT_MAX_READ_BYTES
}
fn default_max_len() -> u64 {
    DEFAULT_MAX_LEN
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

/// Checks `redis.stream` (all but whether `services` are configured, which
/// `config::validate` checks once the services are read).
pub(super) fn validate_stream(raw: &RawStream) -> Result<(), (String, String)> {
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
    // Redis's own bulk string limit is 512 MiB.
    if !(256..=512 << 20).contains(&raw.max_entry_bytes) {
        return err(
            "max_entry_bytes",
            "must be in 256..=536870912 (512 MiB)".into(),
        );
    }
    if raw.max_read_bytes < raw.max_entry_bytes || raw.max_read_bytes > 1 << 30 {
        return err(
            "max_read_bytes",
            "must be at least max_entry_bytes and at most 1073741824 (1 GiB)".into(),
        );
    }
    for (field, n) in [
        ("results_max_len", raw.results_max_len),
        ("dead_max_len", raw.dead_max_len),
    ] {
        if !(1..=1_000_000_000).contains(&n) {
            return err(field, "must be in 1..=1000000000".into());
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

/// The validated object.
pub(super) fn stream_config(raw: RawStream) -> StreamConfig {
    let d = StreamConfig::default();
    StreamConfig {
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
        max_entry_bytes: raw.max_entry_bytes,
        max_read_bytes: raw.max_read_bytes,
        results_max_len: raw.results_max_len,
        dead_max_len: raw.dead_max_len,
    }
}
