//! `lines`: what a task line may ask of a service.
//!
//! Task lines come from JSONL files (`actix-dispatch run`) and Redis
//! streams (`Dispatcher::consume`, `actix-dispatch-worker`): anyone who can
//! write the file or `XADD` to the stream writes them, so they are bounded
//! per service, where the service is configured:
//!
//! ```json
//! "lines": { "max_timeout": "5s", "max_deadline": "30s", "max_body": 1048576,
//!            "max_header_bytes": 16384, "allow_priority": false }
//! ```
//!
//! * `max_timeout`: the longest per-attempt `timeout` a line may set
//!   (default: the service's own `timeout`);
//! * `max_deadline`: the longest `deadline` (default: what the service's
//!   attempts and backoffs take at most, `timeout × (max_retries + 1) +
//!   backoff_max × max_retries`);
//! * `max_body`: the largest body, in bytes once decoded (default 1 MiB);
//! * `max_header_bytes`: the headers' names and values together, in bytes
//!   (default 16 KiB);
//! * `allow_priority`: whether a line's `priority` is taken (default
//!   false: every line is of the `default` class, and a line that asks for
//!   another is logged at debug level).
//!
//! A line over a bound is refused, naming the field and the bound
//! (`timeout: 400s is over the service's lines.max_timeout (5s)`): as an
//! `invalid` result line in the CLI, a dead letter in a stream. Tasks built
//! in code ([`crate::Task`]) are the application's own and not bounded by
//! this.

use std::time::Duration;

use serde::Deserialize;

/// [`LineLimits::max_body`]'s default: 1 MiB.
pub const DEFAULT_LINE_MAX_BODY: usize = 1 << 20;
/// [`LineLimits::max_header_bytes`]'s default: 16 KiB.
pub const DEFAULT_LINE_MAX_HEADER_BYTES: usize = 16 << 10;
/// The largest `max_body` or `max_header_bytes` accepted: 1 GiB.
const MAX_BYTES: usize = 1 << 30;

/// What a task line may ask of its service (`lines`; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LineLimits {
    /// The longest `timeout` a line may set (default: the service's).
    pub max_timeout: Duration,
    /// The longest `deadline` a line may set (default: the service's
    /// attempts and backoffs together).
    pub max_deadline: Duration,
    /// The largest body, decoded (default 1 MiB).
    pub max_body: usize,
    /// The headers' names and values together at most (default 16 KiB).
    pub max_header_bytes: usize,
    /// Whether a line's `priority` is taken (default false).
    pub allow_priority: bool,
}

impl LineLimits {
    /// The defaults of a service with this `timeout` and retry policy.
    pub fn for_service(timeout: Duration, retry: &crate::config::RetryConfig) -> LineLimits {
        LineLimits {
            max_timeout: timeout,
            max_deadline: attempts_time(timeout, retry),
            max_body: DEFAULT_LINE_MAX_BODY,
            max_header_bytes: DEFAULT_LINE_MAX_HEADER_BYTES,
            allow_priority: false,
        }
    }
}

/// What a service's attempts and backoffs take at most:
/// `timeout × (max_retries + 1) + backoff_max × max_retries`.
pub(crate) fn attempts_time(timeout: Duration, r: &crate::config::RetryConfig) -> Duration {
    timeout.saturating_mul(r.max_retries.saturating_add(1))
        + r.backoff_max.saturating_mul(r.max_retries)
}

/// `lines` as written; an absent field takes the service's default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLines {
    #[serde(default, with = "humantime_serde")]
    pub max_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub max_deadline: Option<Duration>,
    #[serde(default)]
    pub max_body: Option<usize>,
    #[serde(default)]
    pub max_header_bytes: Option<usize>,
    #[serde(default)]
    pub allow_priority: bool,
}

/// Checks `lines` over the service's defaults; an error is `(field,
/// message)`.
pub(crate) fn validate(
    raw: &RawLines,
    defaults: LineLimits,
) -> Result<LineLimits, (String, String)> {
    let err = |f: &str, m: String| Err((format!("lines.{f}"), m));
    for (field, d) in [
        ("max_timeout", raw.max_timeout),
        ("max_deadline", raw.max_deadline),
    ] {
        if let Some(d) = d {
            if d.is_zero() {
                return err(field, "must be greater than zero".into());
            }
            crate::algo::time::bounded(field, d).map_err(|m| (format!("lines.{field}"), m))?;
        }
    }
    for (field, n) in [
        ("max_body", raw.max_body),
        ("max_header_bytes", raw.max_header_bytes),
    ] {
        if n.is_some_and(|n| n > MAX_BYTES) {
            return err(field, format!("must be at most {MAX_BYTES} (1 GiB)"));
        }
    }
    Ok(LineLimits {
        max_timeout: raw.max_timeout.unwrap_or(defaults.max_timeout),
        max_deadline: raw.max_deadline.unwrap_or(defaults.max_deadline),
        max_body: raw.max_body.unwrap_or(defaults.max_body),
        max_header_bytes: raw.max_header_bytes.unwrap_or(defaults.max_header_bytes),
        allow_priority: raw.allow_priority,
    })
}
