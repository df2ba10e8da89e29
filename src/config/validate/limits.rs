//! `rate_limit`: the service's and each node's token buckets, and what a
//! task does without a token.

use super::{ConfigError, Ctx};
use crate::algo::time;
use crate::config::raw::{RawBucket, RawRateLimit};
use crate::config::{BucketConfig, OnLimit, RateLimitConfig};

pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<RawRateLimit>,
) -> Result<RateLimitConfig, ConfigError> {
    let rate_limit = match raw {
        None => RateLimitConfig {
            per_node: None,
            service: None,
            on_limit: OnLimit::Wait,
            shared: false,
        },
        Some(rl) => RateLimitConfig {
            per_node: rl
                .per_node
                .map(|b| bucket(cx, "rate_limit.per_node", b))
                .transpose()?,
            service: rl
                .service
                .map(|b| bucket(cx, "rate_limit.service", b))
                .transpose()?,
            on_limit: match rl.on_limit.to_ascii_lowercase().as_str() {
                "wait" => OnLimit::Wait,
                "reject" => OnLimit::Reject,
                other => {
                    return Err(cx.err(
                        "rate_limit.on_limit",
                        format!("unknown value {other:?} (expected wait or reject)"),
                    ))
                }
            },
            shared: rl.shared,
        },
    };
    // `shared` shares every bucket set: the service's and the nodes'.
    if rate_limit.shared && rate_limit.service.is_none() && rate_limit.per_node.is_none() {
        return Err(cx.err(
            "rate_limit.shared",
            "shares the configured buckets: set rate_limit.service or rate_limit.per_node",
        ));
    }
    Ok(rate_limit)
}

fn bucket(cx: &Ctx<'_>, field: &str, b: RawBucket) -> Result<BucketConfig, ConfigError> {
    if !(b.rate.is_finite() && b.rate > 0.0) {
        return Err(cx.err(format!("{field}.rate"), "must be greater than zero"));
    }
    // One token per `1/rate` seconds: that period is bounded like any duration.
    if b.rate < 1.0 / time::MAX_DURATION.as_secs_f64() {
        return Err(cx.err(
            format!("{field}.rate"),
            format!(
                "{} per second is less than one token per {} days",
                b.rate,
                time::MAX_DURATION.as_secs() / 86_400
            ),
        ));
    }
    if b.burst == 0 {
        return Err(cx.err(format!("{field}.burst"), "must be at least 1"));
    }
    Ok(BucketConfig {
        rate: b.rate,
        burst: b.burst,
    })
}
