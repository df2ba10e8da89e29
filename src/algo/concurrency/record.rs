//! What a learned limit's record says beyond its fit: whether a cut
//! attempt or a probe's answer shows a queue, what a level should answer
//! in, whether the backend changed or gained workers, and how far and how
//! long a probe runs.

use super::*;

impl LearnedLimit {
    /// Whether an attempt cut by its deadline after `rtt` says the node
    /// queues: it ran at least the last window's mean, and twice the
    /// service time of the knee when one is known. Twice, so that tight
    /// deadlines on a healthy node cannot make a window mostly of cuts
    /// (even an exponential service runs past twice its mean only one time
    /// in seven): the window mean alone is biased low by the very cuts.
    pub(super) fn cut_says_queueing(&self, rtt: Duration) -> bool {
        let secs = rtt.as_secs_f64();
        self.last_rtt.is_some_and(|m| rtt >= m) && self.service.is_none_or(|s| secs >= 2.0 * s)
    }

    /// Whether the record shows a steady service time on enough answers
    /// that a skewed one would have shown its slow answers (one in ten
    /// slow: all of 128 fast one time in a million), with a service time
    /// known.
    pub(super) fn known_steady(&self) -> bool {
        let samples: f64 = self.levels.known().map(|(_, a)| a.n).sum();
        self.service.is_some()
            && samples >= f64::from(4 * MIN_WINDOW_SAMPLES)
            && self.levels.cv2() < STEADY_CV2
    }

    /// Whether an answer that took `rtt` while a probe runs waited in the
    /// backend for a whole service time, for a steady service time: at the
    /// knee only the probe's step can make it wait, so the probe has found
    /// no gain, and ends at once (its window would have made one answer in
    /// `k + 1` wait a service time each round). A backend that gained
    /// workers answers every request in the service time.
    pub(super) fn queued_in_probe(&self, rtt: Duration) -> bool {
        let lowest = self.levels.known().next().map_or(0.0, |(_, a)| a.cv2());
        let over = (1.0 + 3.5 * lowest.sqrt()).max(QUEUED_IN_PROBE);
        self.probe.is_some()
            && self.known_steady()
            && self.service.is_some_and(|s| rtt.as_secs_f64() > s * over)
    }

    /// The knee by Little's law from the service time `S` known, when the
    /// fit `k` has no flat level and a service time over 1.25 `S`: each level
    /// `n` answering in `R > 1.1 S` serves `n S / R` at once; their mean,
    /// weighted by their answers, rounded up.
    pub(super) fn little_knee(&self, record: &Levels, k: Knee) -> Option<u32> {
        let s = self
            .service
            .filter(|&s| self.changed && k.low.is_none() && k.service > 1.25 * s)?;
        let (mut served, mut n) = (0.0, 0.0);
        for (level, a) in record.known().filter(|(_, a)| a.mean > 1.1 * s) {
            served += a.n * f64::from(level) * s / a.mean;
            n += a.n;
        }
        // `as` saturates.
        (n > 0.0).then(|| (served / n).ceil().max(1.0) as u32)
    }

    /// Whether `level` of `record` answers in the service time last known
    /// (within 10 %), so has no queue: a flat level, the knee at or above
    /// it, where the record alone cannot tell (levels past the knee lie on
    /// one line, which any `k` up to the lowest fits). Known from before a
    /// change of the backend, it saves the window below the knee that
    /// would otherwise find a flat level. For a noisy service time too: a
    /// level past the knee that comes within 10 % of the service time
    /// queues a tenth of a request per worker at most, while the window
    /// below it idles a worker (on a 2-worker backend, half of it for 32
    /// answers).
    pub(super) fn flat_at(&self, record: &Levels, level: u32) -> bool {
        let mean = record.get(level).map(|a| a.mean);
        matches!((self.service, mean), (Some(s), Some(m)) if m <= s * 1.1)
    }

    /// Whether a level expected to answer in `expected` (a queue above
    /// the service time) answered in `fresh`, within the service time, for
    /// a steady service time: the backend gained workers. The means alone
    /// cannot always tell: one request more than the knee makes only one
    /// answer in `k + 1` wait, and a probe's few answers spread that wide.
    pub(super) fn grew_flat(&self, expected: f64, fresh: f64) -> bool {
        self.levels.cv2() < STEADY_CV2
            && self
                .service
                .is_some_and(|s| fresh <= s * 1.05 && expected > s * 1.1)
    }

    /// Whether a level whose record queued, for a noisy service time, now
    /// answers as the lowest level does: the backend gained workers. The
    /// record's low quantile stands 30 % and 3 standard errors above the
    /// lowest level's (which queues least); the new answers' within 10 %
    /// and 2 standard errors of it, and 3 standard errors below the
    /// record's. A probe's few answers of a noisy service time cannot show
    /// the gain in their mean, and a limit at the knee reads flat before
    /// and after it. The errors are the answers' own (binomial): past the
    /// knee a window's quantile moves with the queue it met, which the
    /// third test keeps from passing for a gain.
    pub(super) fn grew_flat_q(&self, old: &Acc, fresh: &Acc) -> bool {
        if !self.levels.noisy() {
            return false;
        }
        let Some((q0, s0)) = self
            .levels
            .known()
            .next()
            .and_then(|(_, a)| a.low_quantile())
        else {
            return false;
        };
        let (Some((qo, so)), Some((qf, sf))) = (old.low_quantile(), fresh.low_quantile()) else {
            return false;
        };
        qo > q0 * 1.3 + 3.0 * so.hypot(s0)
            && qf < q0 * 1.1 + 2.0 * sf.hypot(s0)
            && qo - qf > 3.0 * so.hypot(sf)
    }

    /// Whether the answers of `w`, a probe's window that held `level` or
    /// more most of the time without filling its own level, came faster
    /// than the record at `level` says it queues: by its mean (3 standard
    /// errors, 20 %) or its lower quartile ([`grew_flat_q`](Self::grew_flat_q)).
    pub(super) fn gained_at(&self, level: u32, w: &mut Window) -> bool {
        let Some(old) = self
            .levels
            .get(level)
            .filter(|a| a.n >= crate::algo::knee::MIN_SAMPLES)
        else {
            return false;
        };
        w.latencies.seal();
        let new = &w.latencies;
        let faster = new.mean < old.mean
            && old.differs(new, 3.0, 0.2, self.levels.service_cv2().max(self.spread));
        faster || self.grew_flat_q(old, new)
    }

    /// Answers a probe's window at `probe` takes: as many as its mean needs
    /// to stand 3.5 standard errors (of the record's pooled spread) from
    /// the queue the step adds, were the limit at the knee; between 8 and
    /// 32. A steady service time tells one request more from a few answers,
    /// and every answer of a probe past the knee waits in the backend.
    pub(super) fn probe_samples(&self, probe: u32) -> u32 {
        let rise = (f64::from(probe) / f64::from(self.limit.max(1))).ln();
        if rise <= 0.0 {
            return PROBE_SAMPLES;
        }
        let n = (3.5 * self.levels.cv2().sqrt() / rise).powi(2).ceil();
        (n as u32).clamp(MIN_PROBE_SAMPLES, PROBE_SAMPLES)
    }

    /// How far above the limit a probe goes: far enough that, were the
    /// backend to serve it all at once now, the mean of a probe's window
    /// would stand 3.5 standard errors below the queue it had before (the
    /// pooled spread of the record): one for a steady service time, more
    /// for a noisy one, whose small steps a short window cannot tell.
    /// At most half the limit again: a noisy service would ask for a
    /// doubling, and every request of the step waits in the backend while
    /// the probe runs; a larger gain shows over the probes that follow,
    /// whose level keeps its record.
    pub(super) fn probe_step(&self) -> u32 {
        let cv = self.levels.cv2().sqrt();
        let frac = (3.5 * cv / f64::from(PROBE_SAMPLES).sqrt()).exp() - 1.0;
        let step = (f64::from(self.limit) * frac).ceil();
        // `as` saturates; at least one.
        (step as u32).clamp(1, self.limit.div_ceil(2).max(1))
    }

    /// What the latencies at `level` should be, and by how much more than
    /// 3 standard errors they must differ to mean a change of the backend:
    /// its record once it has a fit's worth of samples (20 %), or else what
    /// the fitted knee predicts, as sure as the samples it rests on (30 %:
    /// a fit on one all-fast window of a skewed service predicts too fast).
    /// The errors are of the largest spread of the service time's
    /// ([`Levels::service_cv2`]: past the knee a window's mean moves with
    /// the service times of the answers before it, not with the latencies'
    /// small spread; or a window's lately, `spread`) and either side's own:
    /// the sample variance of a heavy-tailed service time is itself low
    /// more often than not.
    pub(super) fn expected(&self, level: u32) -> Option<(Acc, f64)> {
        if let Some(a) = self
            .levels
            .get(level)
            .filter(|a| a.n >= crate::algo::knee::MIN_SAMPLES)
        {
            return Some((*a, 0.2));
        }
        // A prediction only from a knee the record brackets.
        let k = self
            .knee_means
            .filter(|k| k.low.is_some() && k.high.is_some())?;
        let mean = k.service * (f64::from(level) / k.k).max(1.0);
        let samples: f64 = self.levels.known().map(|(_, a)| a.n).sum();
        Some((Acc::estimate(mean, samples), 0.3))
    }
}

/// As many at once as a backend serves whose answers at `level` take
/// `now` where they took `before` (Little's law), rounded up and at least
/// half of `level`: one noisy window halves it at most, and a second
/// confirms a larger fall.
pub(super) fn little(level: u32, before: f64, now: f64) -> u32 {
    let served = (f64::from(level) * before / now).ceil() as u32;
    served.max(level.div_ceil(2))
}

/// A probe's step from `limit`: a quarter of it, at least one.
pub(super) fn step(limit: u32) -> u32 {
    limit.div_ceil(4).max(1)
}
