//! The log line of a node's breaker transition.

use std::time::Duration;

use tokio::time::Instant;

pub(super) fn log_transition(service: &str, node: &str, t: &crate::algo::breaker::Transition) {
    use crate::algo::breaker::BreakerState::*;
    match t.to {
        Open { until } => log::warn!(
            "service {service}: node {node}: breaker {} -> open for {:?} ({})",
            state_name(&t.from),
            round_ms(until.saturating_duration_since(Instant::now())),
            t.reason
        ),
        HalfOpen => log::info!(
            "service {service}: node {node}: breaker open -> half-open ({})",
            t.reason
        ),
        Closed => log::info!(
            "service {service}: node {node}: breaker {} -> closed ({})",
            state_name(&t.from),
            t.reason
        ),
    }
}

/// A duration rounded to whole milliseconds, for log lines.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(((d.as_micros() + 500) / 1000) as u64)
}

fn state_name(s: &crate::algo::breaker::BreakerState) -> &'static str {
    use crate::algo::breaker::BreakerState::*;
    match s {
        Closed => "closed",
        Open { .. } => "open",
        HalfOpen => "half-open",
    }
}
