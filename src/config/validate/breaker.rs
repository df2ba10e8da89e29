//! `breaker`: each node's breaker thresholds and timings, what happens
//! when all are open, and whether trips are shared.

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::algo::breaker::BreakerConfig;
use crate::algo::time;
use crate::config::raw::RawBreaker;
use crate::config::{BreakerSettings, OnAllOpen};

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(br: &RawBreaker) -> [(&'static str, Option<Duration>); 5] {
    [
        ("breaker.slow_call", br.slow_call),
        ("breaker.open_for", Some(br.open_for)),
        ("breaker.max_open_for", Some(br.max_open_for)),
        ("breaker.reset_after", Some(br.reset_after)),
        ("breaker.probe_timeout", br.probe_timeout),
    ]
}

/// `timeout` is the service's attempt timeout (bounded), the base of the
/// default probe timeout.
pub(super) fn validate(
    cx: &Ctx<'_>,
    br: RawBreaker,
    timeout: Duration,
) -> Result<BreakerSettings, ConfigError> {
    if !(br.failure_rate > 0.0 && br.failure_rate <= 1.0) {
        return Err(cx.err("breaker.failure_rate", "must be in (0, 1]"));
    }
    if br.window == 0 {
        return Err(cx.err("breaker.window", "must be greater than zero"));
    }
    if br.min_calls > br.window {
        return Err(cx.err("breaker.min_calls", "must not exceed breaker.window"));
    }
    if br.open_for.is_zero() {
        return Err(cx.err("breaker.open_for", "must be greater than zero"));
    }
    if br.max_open_for < br.open_for {
        return Err(cx.err("breaker.max_open_for", "must be at least breaker.open_for"));
    }
    if br.half_open_probes == 0 {
        return Err(cx.err("breaker.half_open_probes", "must be at least 1"));
    }
    if br.max_ejected_percent > 100 {
        return Err(cx.err("breaker.max_ejected_percent", "must be in 0..=100"));
    }
    let on_all_open = match br.on_all_open.to_ascii_lowercase().as_str() {
        "fail_fast" | "failfast" | "reject" => OnAllOpen::FailFast,
        "wait" => OnAllOpen::Wait,
        other => {
            return Err(cx.err(
                "breaker.on_all_open",
                format!("unknown value {other:?} (expected fail_fast or wait)"),
            ))
        }
    };
    Ok(BreakerSettings {
        enabled: br.enabled,
        breaker: BreakerConfig {
            consecutive_failures: br.consecutive_failures,
            failure_rate: br.failure_rate,
            window: br.window,
            min_calls: br.min_calls,
            slow_call: br.slow_call,
            open_for: br.open_for,
            max_open_for: br.max_open_for,
            reset_after: br.reset_after,
            half_open_probes: br.half_open_probes,
            // A probe that outlives two attempt timeouts is not coming back.
            probe_timeout: br.probe_timeout.unwrap_or(time::mul(timeout, 2)),
        },
        on_all_open,
        max_ejected_percent: br.max_ejected_percent,
        shared: br.shared,
        quorum: br.quorum.max(1),
    })
}
