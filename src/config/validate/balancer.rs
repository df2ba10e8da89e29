//! `mode` and `balancer`: the strategy and what it runs on (least-load
//! weights, peak-EWMA timings, slow start, the seed).

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::algo::strategy::LeastLoadWeights;
use crate::config::raw::RawBalancer;
use crate::config::{BalancerConfig, Mode};

/// The service's mode: p2c when absent.
pub(super) fn mode(cx: &Ctx<'_>, mode: Option<&str>) -> Result<Mode, ConfigError> {
    match mode {
        None => Ok(Mode::P2c),
        Some(m) => Mode::parse(m).ok_or_else(|| {
            cx.err(
                "mode",
                format!("unknown mode {m:?} (expected {})", Mode::expected()),
            )
        }),
    }
}

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(b: &RawBalancer) -> [(&'static str, Option<Duration>); 5] {
    [
        ("balancer.refresh_interval", Some(b.refresh_interval)),
        ("balancer.decay", Some(b.decay)),
        ("balancer.default_rtt", Some(b.default_rtt)),
        ("balancer.failure_penalty", Some(b.failure_penalty)),
        ("balancer.slow_start", b.slow_start),
    ]
}

pub(super) fn validate(cx: &Ctx<'_>, b: RawBalancer) -> Result<BalancerConfig, ConfigError> {
    if b.refresh_interval.is_zero() {
        return Err(cx.err("balancer.refresh_interval", "must be greater than zero"));
    }
    for (f, v) in [
        ("balancer.least_load.in_flight", b.least_load.in_flight),
        ("balancer.least_load.latency", b.least_load.latency),
        ("balancer.least_load.errors", b.least_load.errors),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(cx.err(f, "must be a finite number >= 0"));
        }
    }
    if b.decay.is_zero() {
        return Err(cx.err("balancer.decay", "must be greater than zero"));
    }
    if b.default_rtt.is_zero() {
        return Err(cx.err("balancer.default_rtt", "must be greater than zero"));
    }
    if !(b.slow_start_floor > 0.0 && b.slow_start_floor <= 1.0) {
        return Err(cx.err("balancer.slow_start_floor", "must be in (0, 1]"));
    }
    if b.slow_start.is_some_and(|d| d.is_zero()) {
        return Err(cx.err("balancer.slow_start", "must be greater than zero when set"));
    }
    Ok(BalancerConfig {
        refresh_interval: b.refresh_interval,
        least_load: LeastLoadWeights {
            in_flight: b.least_load.in_flight,
            latency: b.least_load.latency,
            errors: b.least_load.errors,
        },
        decay: b.decay,
        default_rtt: b.default_rtt,
        failure_penalty: b.failure_penalty,
        slow_start: b.slow_start,
        slow_start_floor: b.slow_start_floor,
        seed: b.seed,
    })
}
