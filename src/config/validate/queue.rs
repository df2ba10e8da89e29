//! `queue`: its capacity, what a full queue does, and how many may wait.

use super::{ConfigError, Ctx};
use crate::config::raw::RawQueue;
use crate::config::{OnFull, QueueConfig};

pub(super) fn validate(cx: &Ctx<'_>, q: RawQueue) -> Result<QueueConfig, ConfigError> {
    if q.capacity == 0 {
        return Err(cx.err("queue.capacity", "must be greater than zero"));
    }
    if q.max_bytes == 0 {
        return Err(cx.err("queue.max_bytes", "must be greater than zero"));
    }
    let on_full = match q.on_full.to_ascii_lowercase().as_str() {
        "reject" => OnFull::Reject,
        "wait" | "block" => OnFull::Wait,
        other => {
            return Err(cx.err(
                "queue.on_full",
                format!("unknown value {other:?} (expected reject or wait)"),
            ))
        }
    };
    let delay = match q.delay.filter(|d| d.enabled) {
        Some(d) => {
            let c = crate::algo::codel::CodelConfig {
                target: d.target,
                interval: d.interval,
                lifo: d.lifo,
                max_wait: d.max_wait,
            };
            c.validate().map_err(|m| cx.err(field_of(&m), m.clone()))?;
            Some(c)
        }
        None => None,
    };
    let positive = |field: &str, d: Option<std::time::Duration>| match d {
        Some(d) if d.is_zero() => Err(cx.err(field, "must be greater than zero")),
        Some(d) => crate::algo::time::bounded(field, d)
            .map(Some)
            .map_err(|m| cx.err(field, m)),
        None => Ok(None),
    };
    let deadline = positive("queue.deadline", q.deadline)?;
    let slo = positive("queue.slo", q.slo)?;
    let priority = crate::algo::priority::PriorityConfig {
        critical: q.priority.critical,
        default: q.priority.default,
        sheddable: q.priority.sheddable,
    };
    priority.validate().map_err(|m| {
        // A single share names its field; their sum names the section.
        let field = ["critical", "default", "sheddable"]
            .into_iter()
            .find(|f| m.starts_with(&format!("{f} share")))
            .map_or_else(
                || "queue.priority".to_owned(),
                |f| format!("queue.priority.{f}"),
            );
        cx.err(field, m.clone())
    })?;
    Ok(QueueConfig {
        capacity: q.capacity,
        on_full,
        max_waiting: q.max_waiting.unwrap_or(q.capacity.max(10_000)),
        max_bytes: q.max_bytes,
        delay,
        deadline,
        slo,
        priority,
    })
}

/// The `queue.delay` field a [`CodelConfig::validate`] message names.
///
/// [`CodelConfig::validate`]: crate::algo::codel::CodelConfig::validate
fn field_of(message: &str) -> String {
    let name = ["max_wait", "interval", "target"]
        .into_iter()
        .find(|f| message.starts_with(f))
        .unwrap_or("target");
    format!("queue.delay.{name}")
}
