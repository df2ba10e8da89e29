//! The reference: every config field, every outcome and rejection, every
//! metric. These pages are the files under `docs/reference/` in the
//! repository; the guides beside them (`docs/*.md`) explain each feature.
//!
//! - [`config`]: every field of the JSON config, its default and meaning.
//! - [`outcomes`]: every outcome, failure reason, rejection and attempt
//!   error, with its code and the gateway's status.
//! - [`metrics`]: every Prometheus family and every `stats()` field.

#[doc = include_str!("../docs/reference/config.md")]
pub mod config {}

#[doc = include_str!("../docs/reference/outcomes.md")]
pub mod outcomes {}

#[doc = include_str!("../docs/reference/metrics.md")]
pub mod metrics {}

/// The guides' Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
pub mod guides {
    #[doc = include_str!("../docs/leases.md")]
    pub struct Leases;
    #[doc = include_str!("../docs/resilience.md")]
    pub struct Resilience;
    #[doc = include_str!("../docs/streaming.md")]
    pub struct Streaming;
    #[doc = include_str!("../docs/gateway.md")]
    pub struct Gateway;
    #[doc = include_str!("../docs/observing.md")]
    pub struct Observing;
    #[doc = include_str!("../docs/redis-stream.md")]
    pub struct RedisStream;
}
