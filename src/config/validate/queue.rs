//! `queue`: its capacity, what a full queue does, and how many may wait.

use super::{ConfigError, Ctx};
use crate::config::raw::RawQueue;
use crate::config::{OnFull, QueueConfig};

pub(super) fn validate(cx: &Ctx<'_>, q: RawQueue) -> Result<QueueConfig, ConfigError> {
    if q.capacity == 0 {
        return Err(cx.err("queue.capacity", "must be greater than zero"));
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
    Ok(QueueConfig {
        capacity: q.capacity,
        on_full,
        max_waiting: q.max_waiting.unwrap_or(q.capacity.max(10_000)),
    })
}
