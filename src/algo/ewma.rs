//! Moving averages of per-node latency and error rate.
//!
//! * [`Ewma`]: the classic moving average with a fixed `alpha`,
//!   `value += alpha * (sample - value)`; it feeds the least-load score
//!   (latency in seconds, error rate in `0..=1`).
//! * [`PeakEwma`]: Finagle's "peak EWMA" round-trip-time estimator (as in
//!   linkerd and tower's `PeakEwma`): a sample above the estimate replaces
//!   it at once; one below pulls it down with weight
//!   `1 - exp(-elapsed / decay)`, `elapsed` the time since the previous
//!   observation.
//!
//! **Reading.** The stored estimates move only on observations; `get`
//! returns them unchanged. What the balancer uses decays with idle time,
//! as tower reads its `PeakEwma`: each pick reads a node's figures through
//! [`decay_idle`], `value · exp(-idle / decay)` (`idle`: since the node's
//! last observation; `decay`: the service's `balancer.decay`), so a node
//! left alone after one bad spell is tried again ([`PeakEwma::decayed_secs`]
//! is that read for one estimator). Pure: every call takes `now`.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::ewma::{Ewma, PeakEwma};
//! use tokio::time::{Duration, Instant};
//!
//! let start = Instant::now();
//! let mut rtt = PeakEwma::new(Duration::from_millis(30), Duration::from_secs(10), start);
//! rtt.observe(Duration::from_millis(100), start); // peak: 100ms at once
//! rtt.observe(Duration::from_millis(10), start + Duration::from_secs(10));
//! // 10ms + 90ms * e^-1 ≈ 43.1ms
//! assert!((rtt.get_secs() - (0.010 + 0.090 * (-1f64).exp())).abs() < 1e-12);
//!
//! let mut errors = Ewma::new(0.1);
//! errors.observe(1.0);
//! assert_eq!(errors.get(), Some(1.0));
//! # }
//! ```

use tokio::time::{Duration, Instant};

/// Classic EWMA with a fixed smoothing factor, for per-node latency (seconds)
/// and error rate.
///
/// The first sample becomes the value; every later sample moves the value by
/// `alpha` of the distance to it. Non-finite samples (NaN, ±∞) are ignored.
#[derive(Debug, Clone)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    /// A new, empty average with smoothing factor `alpha` (weight of the
    /// newest sample). `alpha` is clamped to `0.0..=1.0`; NaN counts as `1.0`
    /// (the average then simply follows the latest sample).
    pub fn new(alpha: f64) -> Self {
        let alpha = if alpha.is_nan() {
            1.0
        } else {
            alpha.clamp(0.0, 1.0)
        };
        Ewma { alpha, value: None }
    }

    /// Adds one sample.
    pub fn observe(&mut self, sample: f64) {
        if !sample.is_finite() {
            return;
        }
        self.value = Some(match self.value {
            None => sample,
            Some(v) => v + self.alpha * (sample - v),
        });
    }

    /// The average, or `None` before the first sample.
    #[cfg(any(test, feature = "internals"))]
    pub fn get(&self) -> Option<f64> {
        self.value
    }

    /// The average, or `default` before the first sample.
    pub fn get_or(&self, default: f64) -> f64 {
        self.value.unwrap_or(default)
    }
}

/// Peak EWMA of round-trip time as in tower's `PeakEwma` / linkerd / Finagle:
/// a sample above the estimate replaces it at once; otherwise the estimate
/// decays toward the sample with weight `exp(-elapsed/decay)` kept on the old
/// estimate, `elapsed` being the time since the previous observation.
#[derive(Debug, Clone)]
pub struct PeakEwma {
    decay_ns: f64,
    estimate_ns: f64,
    last: Instant,
}

impl PeakEwma {
    /// A new estimator that starts at `default_rtt`, so a new node is neither
    /// starved (as a pessimistic start would) nor flooded (as a zero start
    /// would). `decay` is the time constant of the decay toward lower samples;
    /// a zero `decay` makes every sample replace the estimate. `now` is the
    /// time of creation, the reference for the first observation's `elapsed`.
    pub fn new(default_rtt: Duration, decay: Duration, now: Instant) -> Self {
        PeakEwma {
            decay_ns: nanos(decay),
            estimate_ns: nanos(default_rtt),
            last: now,
        }
    }

    /// Adds one round-trip-time sample taken at `now`. A `now` earlier than
    /// the previous observation counts as zero elapsed time.
    pub fn observe(&mut self, rtt: Duration, now: Instant) {
        let rtt_ns = nanos(rtt);
        if rtt_ns > self.estimate_ns {
            self.estimate_ns = rtt_ns;
        } else {
            let elapsed_ns = nanos(now.saturating_duration_since(self.last));
            let keep = if self.decay_ns <= 0.0 {
                0.0
            } else if elapsed_ns == 0.0 {
                // Samples of one turn share their time: exp(0), without the call.
                1.0
            } else {
                (-elapsed_ns / self.decay_ns).exp()
            };
            self.estimate_ns = rtt_ns + (self.estimate_ns - rtt_ns) * keep;
        }
        if now > self.last {
            self.last = now;
        }
    }

    /// Records a failed attempt that took `rtt`: observes `max(rtt, penalty)`
    /// so that fast failures (connection refused, instant 5xx) do not make a
    /// broken node look fast and attract traffic (Finagle's failure penalty).
    pub fn observe_failure(&mut self, rtt: Duration, penalty: Duration, now: Instant) {
        self.observe(rtt.max(penalty), now);
    }

    /// The stored estimate, unchanged by reading (only [`observe`] moves
    /// it); the balancer reads it decayed by idle time (see the
    /// [module docs](self#what-reading-does)).
    ///
    /// [`observe`]: PeakEwma::observe
    #[cfg(any(test, feature = "internals"))]
    pub fn get(&self) -> Duration {
        // `as` saturates; estimates beyond ~584 years are not a concern.
        Duration::from_nanos(self.estimate_ns.round() as u64)
    }

    /// The current estimate in seconds (see [`get`](PeakEwma::get)).
    pub fn get_secs(&self) -> f64 {
        self.estimate_ns / 1e9
    }

    /// When the last sample was observed (creation time before any).
    pub fn last_observed(&self) -> Instant {
        self.last
    }

    /// The estimate as tower's `PeakEwma` reads it at `now`, in seconds:
    /// decayed toward zero for the time since the last observation (see
    /// [`decay_idle`]).
    #[cfg(any(test, feature = "internals"))]
    pub fn decayed_secs(&self, now: Instant) -> f64 {
        decay_idle(
            self.get_secs(),
            now.saturating_duration_since(self.last),
            Duration::from_nanos(self.decay_ns as u64),
        )
    }
}

/// Decays an RTT estimate (seconds) toward zero over `idle` time with time
/// constant `decay`: `estimate · exp(-idle/decay)`. A node that stopped
/// getting answers (because one slow answer made it look expensive) thus
/// looks cheaper as time passes and is tried again, instead of being starved
/// for good: tower reads its peak EWMA the same way.
pub fn decay_idle(estimate: f64, idle: Duration, decay: Duration) -> f64 {
    // Below a thousandth of the time constant the factor is within 0.1 % of
    // 1: skip the `exp` (this runs on every pick's view refresh).
    if decay.is_zero() || idle.as_nanos() * 1000 < decay.as_nanos() {
        return estimate;
    }
    estimate * (-idle.as_secs_f64() / decay.as_secs_f64()).exp()
}

fn nanos(d: Duration) -> f64 {
    d.as_secs() as f64 * 1e9 + f64::from(d.subsec_nanos())
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    #[test]
    fn an_idle_estimate_decays_toward_zero() {
        let t0 = Instant::now();
        let mut p = PeakEwma::new(Duration::from_millis(30), Duration::from_secs(10), t0);
        p.observe(Duration::from_millis(500), t0);
        assert_eq!(p.decayed_secs(t0), 0.5);
        let e = p.decayed_secs(t0 + Duration::from_secs(10));
        assert!((e - 0.5 * (-1f64).exp()).abs() < 1e-12);
        assert_eq!(p.get(), Duration::from_millis(500), "reading moves nothing");
        assert_eq!(decay_idle(0.5, Duration::from_secs(3), Duration::ZERO), 0.5);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn assert_rel(actual: f64, expected: f64) {
        let rel = ((actual - expected) / expected).abs();
        assert!(rel < 1e-9, "{actual} != {expected} (rel {rel})");
    }

    #[test]
    fn ewma_exact_sequence() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.get(), None);
        assert_eq!(e.get_or(7.0), 7.0);
        e.observe(4.0);
        assert_eq!(e.get(), Some(4.0));
        e.observe(0.0);
        assert_eq!(e.get(), Some(2.0));
        e.observe(4.0);
        assert_eq!(e.get(), Some(3.0));
        e.observe(f64::NAN);
        e.observe(f64::INFINITY);
        assert_eq!(e.get_or(7.0), 3.0);
    }

    #[test]
    fn ewma_alpha_is_clamped() {
        let mut e = Ewma::new(2.0);
        e.observe(1.0);
        e.observe(5.0);
        assert_eq!(e.get(), Some(5.0));
        let mut e = Ewma::new(-1.0);
        e.observe(1.0);
        e.observe(5.0);
        assert_eq!(e.get(), Some(1.0));
        let mut e = Ewma::new(f64::NAN);
        e.observe(1.0);
        e.observe(5.0);
        assert_eq!(e.get(), Some(5.0));
    }

    #[test]
    fn ewma_error_rate() {
        let mut e = Ewma::new(0.25);
        for s in [0.0, 1.0, 1.0, 0.0] {
            e.observe(s);
        }
        // 0 -> .25 -> .4375 -> .328125
        assert_eq!(e.get(), Some(0.328125));
    }

    #[test]
    fn peak_starts_at_default_and_reading_does_not_decay() {
        let t0 = Instant::now();
        let p = PeakEwma::new(ms(30), Duration::from_secs(10), t0);
        assert_eq!(p.get(), ms(30));
        assert_rel(p.get_secs(), 0.030);
        assert_eq!(p.get(), ms(30));
    }

    #[test]
    fn peak_replaces_at_once_then_decays() {
        let t0 = Instant::now();
        let decay = Duration::from_secs(10);
        let mut p = PeakEwma::new(ms(30), decay, t0);
        p.observe(ms(100), t0 + ms(5));
        assert_eq!(p.get(), ms(100));
        p.observe(ms(10), t0 + ms(5) + decay);
        assert_rel(p.get_secs(), 0.010 + 0.090 * (-1f64).exp());
        // A higher sample replaces at once whatever the elapsed time.
        p.observe(ms(200), t0 + ms(5) + decay);
        assert_eq!(p.get(), ms(200));
    }

    #[test]
    fn peak_two_decay_periods() {
        let t0 = Instant::now();
        let decay = Duration::from_millis(500);
        let mut p = PeakEwma::new(ms(30), decay, t0);
        p.observe(ms(10), t0 + ms(1000));
        assert_rel(p.get_secs(), 0.010 + 0.020 * (-2f64).exp());
    }

    #[test]
    fn same_instant_lower_sample_keeps_estimate() {
        let t0 = Instant::now();
        let mut p = PeakEwma::new(ms(30), Duration::from_secs(10), t0);
        p.observe(ms(100), t0);
        p.observe(ms(1), t0);
        assert_eq!(p.get(), ms(100));
        // An instant before the last observation also counts as zero elapsed.
        p.observe(ms(100), t0 + ms(50));
        p.observe(ms(1), t0);
        assert_eq!(p.get(), ms(100));
    }

    #[test]
    fn zero_decay_follows_samples() {
        let t0 = Instant::now();
        let mut p = PeakEwma::new(ms(30), Duration::ZERO, t0);
        p.observe(ms(5), t0);
        assert_eq!(p.get(), ms(5));
    }

    #[test]
    fn failure_penalty() {
        let t0 = Instant::now();
        let mut p = PeakEwma::new(ms(30), Duration::from_secs(10), t0);
        p.observe_failure(ms(1), Duration::from_secs(1), t0);
        assert_eq!(p.get(), Duration::from_secs(1));
        let mut q = PeakEwma::new(ms(30), Duration::from_secs(10), t0);
        q.observe_failure(Duration::from_secs(3), Duration::from_secs(1), t0);
        assert_eq!(q.get(), Duration::from_secs(3));
    }
}
