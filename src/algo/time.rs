//! Time arithmetic that never panics, and the bound on durations from outside.
//!
//! Every `Instant + Duration` and every scaled `Duration` in the engine goes
//! through these helpers: a value from a config, a task's builder or a
//! backend's `Retry-After` can be anything up to `u64::MAX` seconds, and
//! std's operators panic on overflow. Sums saturate at a "far future" 30
//! years ahead (tokio uses the same horizon for a timer that never fires);
//! products saturate at `Duration::MAX`.
//!
//! Values that cross a boundary are also bounded where they enter: config
//! durations and a task's timeout and deadline longer than [`MAX_DURATION`]
//! are refused with a named error, so the saturation here is a last line of
//! defence, not a behaviour anyone relies on.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use std::time::Duration;
//! use actix_dispatch::algo::time;
//! let now = actix_dispatch::Instant::now();
//! assert!(time::add(now, Duration::MAX) > now);
//! assert_eq!(time::mul(Duration::MAX, 2), Duration::MAX);
//! # }
//! ```

use std::time::Duration;

use tokio::time::Instant;

/// Longest duration accepted from outside (config fields, a task's timeout
/// or deadline): 365 days. Anything longer is a mistake, not a plan.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

/// How far ahead "never" is: 30 years, as tokio's far future.
const FAR: Duration = Duration::from_secs(30 * 365 * 86_400);

/// `t + d`, saturating at 30 years after `t` (and never panicking).
pub fn add(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// `d * n`, saturating at `Duration::MAX`.
pub fn mul(d: Duration, n: u32) -> Duration {
    d.checked_mul(n).unwrap_or(Duration::MAX)
}

/// `a + b`, saturating at `Duration::MAX`.
pub fn sum(a: Duration, b: Duration) -> Duration {
    a.saturating_add(b)
}

/// Checks that `d` is at most [`MAX_DURATION`]; the error names `what`.
pub fn bounded(what: &str, d: Duration) -> Result<Duration, String> {
    if d > MAX_DURATION {
        Err(format!(
            "{what} of {d:?} is longer than the limit of {} days",
            MAX_DURATION.as_secs() / 86_400
        ))
    } else {
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_products_saturate() {
        let now = Instant::now();
        assert_eq!(
            add(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(add(now, Duration::MAX), now + FAR);
        assert_eq!(mul(Duration::from_secs(u64::MAX), 2), Duration::MAX);
        assert_eq!(mul(Duration::from_secs(3), 2), Duration::from_secs(6));
        assert_eq!(sum(Duration::MAX, Duration::MAX), Duration::MAX);
    }

    #[test]
    fn bound_names_the_value() {
        assert!(bounded("timeout", MAX_DURATION).is_ok());
        let e = bounded("timeout", MAX_DURATION + Duration::from_nanos(1)).unwrap_err();
        assert!(e.contains("timeout") && e.contains("365 days"), "{e}");
    }
}
