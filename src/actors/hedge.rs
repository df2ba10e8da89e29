//! Hedging support: the service's recent latency and cancellation of the
//! losing attempt.
//!
//! A hedged task has two attempts out on two different nodes: for services
//! that hedge, the balancer remembers which nodes work on each task and
//! masks them when it places the hedge (no other eligible node: the hedge is
//! dropped, the first attempt goes on). The first good answer wins; the
//! queue then lists the task in its turn's cancels
//! ([`QueueTurn::cancels`](super::protocol::QueueTurn)) and the balancer
//! tells the node still working on it to drop the attempt, which reports back as `Cancelled` and
//! counts nowhere. Hedges are only sent for idempotent tasks and each one is
//! paid from the retry budget.

use std::time::Duration;

/// The last `n` successful latencies, for `hedge.percentile`.
///
/// The percentile is recomputed every `n / 16` samples rather than at every
/// dispatch, so a hedged service pays a sort of the window a few times per
/// window, not per task.
#[derive(Debug)]
pub(crate) struct LatencyWindow {
    samples: Vec<Duration>,
    next: usize,
    since_sort: usize,
    sorted: Vec<Duration>,
    /// The sum of `samples`, in nanoseconds, kept exactly (a `u128` holds
    /// the sum of any window that fits in memory): taking a sample out
    /// subtracts exactly what putting it in added, so it cannot go below
    /// zero.
    sum: u128,
}

impl LatencyWindow {
    pub fn new(n: usize) -> Self {
        Self {
            samples: Vec::with_capacity(n),
            next: 0,
            since_sort: 0,
            sorted: Vec::new(),
            sum: 0,
        }
    }

    pub fn record(&mut self, d: Duration) {
        let cap = self.samples.capacity().max(1);
        if self.samples.len() < cap {
            self.samples.push(d);
        } else {
            self.sum -= self.samples[self.next].as_nanos();
            self.samples[self.next] = d;
            self.next = (self.next + 1) % cap;
        }
        self.sum += d.as_nanos();
        self.since_sort += 1;
        if self.since_sort >= (cap / 16).max(1) || self.sorted.len() < 16 {
            self.sorted.clone_from(&self.samples);
            self.sorted.sort_unstable();
            self.since_sort = 0;
        }
    }

    /// The mean latency, once at least 16 samples are in.
    pub fn mean(&self) -> Option<Duration> {
        let n = u32::try_from(self.samples.len())
            .ok()
            .filter(|&n| n >= 16)?;
        // The sum as a `Duration` (at most `Duration::MAX`), divided as a
        // `Duration` is.
        const NANOS: u128 = 1_000_000_000;
        let sum = u64::try_from(self.sum / NANOS).map_or(Duration::MAX, |secs| {
            Duration::new(secs, (self.sum % NANOS) as u32)
        });
        Some(sum / n)
    }

    /// Latency at percentile `p` (0..100), once at least 16 samples are in.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.sorted.len() < 16 {
            return None;
        }
        let rank = ((p / 100.0) * (self.sorted.len() - 1) as f64).round() as usize;
        self.sorted.get(rank.min(self.sorted.len() - 1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_needs_samples_then_tracks_window() {
        let mut w = LatencyWindow::new(64);
        for i in 0..15 {
            w.record(Duration::from_millis(i));
        }
        assert_eq!(w.percentile(50.0), None);
        for i in 15..64 {
            w.record(Duration::from_millis(i));
        }
        assert_eq!(w.percentile(0.0), Some(Duration::from_millis(0)));
        // 0..=63 ms: a mean of 31.5 ms; then 64 more of 100 ms replace them.
        assert_eq!(w.mean(), Some(Duration::from_micros(31_500)));
        assert_eq!(w.percentile(100.0), Some(Duration::from_millis(63)));
        let p50 = w.percentile(50.0).unwrap();
        assert!(p50 >= Duration::from_millis(31) && p50 <= Duration::from_millis(32));
    }
}
