//! `health_check`: the path, timings and thresholds of active checks.

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::config::raw::RawHealthCheck;
use crate::config::HealthCheckConfig;

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(h: Option<&RawHealthCheck>) -> [(&'static str, Option<Duration>); 2] {
    [
        ("health_check.interval", h.map(|h| h.interval)),
        ("health_check.timeout", h.map(|h| h.timeout)),
    ]
}

pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<RawHealthCheck>,
) -> Result<Option<HealthCheckConfig>, ConfigError> {
    let Some(h) = raw else {
        return Ok(None);
    };
    if h.interval.is_zero() {
        return Err(cx.err("health_check.interval", "must be greater than zero"));
    }
    if h.timeout.is_zero() {
        return Err(cx.err("health_check.timeout", "must be greater than zero"));
    }
    if h.unhealthy_threshold == 0 {
        return Err(cx.err("health_check.unhealthy_threshold", "must be at least 1"));
    }
    if h.healthy_threshold == 0 {
        return Err(cx.err("health_check.healthy_threshold", "must be at least 1"));
    }
    crate::syntax::check_path(&h.path).map_err(|m| cx.err("health_check.path", m))?;
    Ok(Some(HealthCheckConfig {
        path: h.path.trim_start_matches('/').to_owned(),
        interval: h.interval,
        timeout: h.timeout,
        unhealthy_threshold: h.unhealthy_threshold,
        healthy_threshold: h.healthy_threshold,
    }))
}
