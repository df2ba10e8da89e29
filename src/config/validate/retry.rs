//! `retry`: backoff, the `Retry-After` cap and the retry budget.

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::algo::budget::BudgetConfig;
use crate::config::raw::RawRetry;
use crate::config::RetryConfig;

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(r: &RawRetry) -> [(&'static str, Option<Duration>); 3] {
    [
        ("retry.backoff_base", Some(r.backoff_base)),
        ("retry.backoff_max", Some(r.backoff_max)),
        ("retry.max_retry_after", Some(r.max_retry_after)),
    ]
}

pub(super) fn validate(cx: &Ctx<'_>, r: RawRetry) -> Result<RetryConfig, ConfigError> {
    if r.backoff_base.is_zero() {
        return Err(cx.err("retry.backoff_base", "must be greater than zero"));
    }
    if r.backoff_max < r.backoff_base {
        return Err(cx.err("retry.backoff_max", "must be at least retry.backoff_base"));
    }
    if !(0.0..=10.0).contains(&r.budget_percent) || r.budget_percent.is_nan() {
        return Err(cx.err(
            "retry.budget_percent",
            "must be a ratio between 0 and 10 (0.2 = 20 %)",
        ));
    }
    Ok(RetryConfig {
        max_retries: r.max_retries,
        backoff_base: r.backoff_base,
        backoff_max: r.backoff_max,
        max_retry_after: r.max_retry_after,
        budget: BudgetConfig {
            percent: r.budget_percent,
            min_per_sec: r.min_retries_per_sec,
            ..BudgetConfig::default()
        },
    })
}
