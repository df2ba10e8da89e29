//! `hedge`: when a second attempt is sent, by delay or by percentile.

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::config::raw::RawHedge;
use crate::config::HedgeAfter;

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(h: Option<&RawHedge>) -> [(&'static str, Option<Duration>); 1] {
    [("hedge.after", h.and_then(|h| h.after))]
}

pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<RawHedge>,
) -> Result<Option<HedgeAfter>, ConfigError> {
    let Some(h) = raw else {
        return Ok(None);
    };
    match (h.after, h.percentile) {
        (Some(d), None) if !d.is_zero() => Ok(Some(HedgeAfter::Delay(d))),
        (None, Some(p)) if p > 0.0 && p < 100.0 => Ok(Some(HedgeAfter::Percentile(p))),
        _ => Err(cx.err(
            "hedge",
            "give exactly one of `after` (a non-zero duration) or `percentile` (0 < p < 100)",
        )),
    }
}
