//! Where a backend stops delivering more throughput for more concurrency:
//! the knee of its latency curve, fitted to the mean latency (and, for a
//! noisy service time, a low quantile) measured at each concurrency level,
//! with a confidence interval.
//!
//! A backend that serves `k` requests at once (threads, workers, GPU
//! slots) answers at its service time `S` while at most `k` are inside,
//! and beyond that each extra request waits its turn, so by Little's law
//! (`N = X * R`):
//!
//! ```text
//! R(n) = S * max(1, n / k)        X(n) = min(n, k) / S
//! ```
//!
//! [`Levels`] keeps, for each level `n` of concurrency the node's answers
//! met, the count, mean and variance of their latencies (the learned
//! limit files a window under the in-flight count at its answers, on
//! average, and lets a noisy record fade with its work, [`Levels::decay`]:
//! `crate::algo::concurrency`). The
//! fit ([`Levels::fits`]) takes the logarithm of each level's mean (its
//! variance `var / (count * mean^2)`, so a noisy level weighs little) and
//! finds the `k` of least weighted squared error, `S` falling out as the
//! weighted mean; every `k` whose error is within 4 (two standard
//! deviations) of the least is in the interval. This is why service-time
//! variance is not read as queueing: a level's mean only counts as higher
//! when it is higher by more than its own noise allows, and the interval
//! widens instead of the estimate moving. Data that are flat at every
//! level leave the interval open above (`k` is at least the highest
//! level), data that grow in proportion at every level leave it open below.
//!
//! # The low quantile, for a noisy service time
//!
//! A skewed service time hides a queue in its mean: one window of 32
//! answers of a service that takes 10 ms, or 110 ms one time in ten,
//! spreads ±26 %, and the request or two a limit above the knee keeps
//! waiting inside the backend add less than that. Its lower quartile does
//! not move with the slow answers at all (10 ms at every flat level) and
//! shows the wait at once, for past the knee every answer waits for a
//! worker: about `(n - k)·S/k` on top of its own service time. So each
//! level also keeps its latencies as a histogram (`knee/hist.rs`), and when the
//! service time is noisy (a squared coefficient of variation of
//! [`STEADY_CV2`] or more: a steady one's waits fall on a few answers in
//! whole service times, and leave its quartile flat) the fit adds the
//! error of the additive model `q(n) = q0 + b·max(0, n - k)` over the
//! levels' [`LOW_QUANTILE`] to that of the means, for each `k`
//! ([`Levels::fits`] makes that knee and the means' alone, from which
//! `S` and a level's expected mean come).
//!
//! The slope `b` is not free: a knee at `k` says the levels past it wait,
//! so `b` is at least [`WAIT_SHARE`] of `S/k` (the mean wait a request
//! more adds). Free, a flat quartile fitted every `k` with `b = 0` and
//! refuted none: an 8-worker backend whose first window at 4 met none of
//! the slow answers (a mean of 9 ms against 20 at 5 and 26 at 8) was held
//! at 5 by its means alone, its quartile flat at 10 ms up to 8. A quarter
//! because a low quantile of the wait is below its mean (the quartile of
//! one exponential gap between answers is 0.29 of its mean) and grows
//! towards it with every request queued.
//!
//! A quantile's error is the larger of the binomial one (of independent
//! answers) and the spread between the windows a level's record is made
//! of (`quantile_with`): past the knee the answers of a window
//! wait behind the same few, and its quantile moves with the queue it met.
//! With the binomial error alone, two queued levels that happened to read
//! alike fitted a knee between them and held a 2-worker backend at 7.
//!
//! Pure: no clock, no randomness.

mod hist;
use hist::Hist;

/// One level's latencies: a running count, mean and sum of squared
/// deviations (Welford), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acc {
    /// Samples (fractional once scaled down to the cap).
    pub n: f64,
    /// Mean latency, seconds.
    pub mean: f64,
    m2: f64,
    hist: Hist,
    windows: Windows,
}

/// The low quantiles of the windows a record is made of, as logarithms:
/// their spread is the quantile's error. Past the knee the answers of a
/// window wait behind the same few, so its quantile moves with the queue
/// it met, far beyond the error of independent answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Windows {
    n: f64,
    mean: f64,
    m2: f64,
}

/// Chan's parallel formula: the count, mean and sum of squared deviations
/// of two sets of samples together.
fn chan((n1, mean1, m2_1): (f64, f64, f64), (n2, mean2, m2_2): (f64, f64, f64)) -> (f64, f64, f64) {
    let n = n1 + n2;
    if n2 <= 0.0 || n <= 0.0 {
        return (n1, mean1, m2_1);
    }
    let d = mean2 - mean1;
    (n, mean1 + d * n2 / n, m2_1 + (m2_2 + d * d * n1 * n2 / n))
}

impl Windows {
    fn merge(&mut self, o: &Windows) {
        (self.n, self.mean, self.m2) = chan((self.n, self.mean, self.m2), (o.n, o.mean, o.m2));
    }

    /// The variance of one window's `ln q`, with two windows or more.
    fn var(&self) -> Option<f64> {
        (self.n >= 2.0).then(|| self.m2 / (self.n - 1.0))
    }
}

impl Acc {
    /// A mean estimated from `n` samples' worth (a prediction of a fit
    /// over them): its error counts as theirs in [`differs`](Self::differs).
    pub fn estimate(mean: f64, n: f64) -> Acc {
        Acc {
            n,
            mean,
            ..Acc::default()
        }
    }

    /// Adds one latency.
    pub fn add(&mut self, x: f64) {
        self.n += 1.0;
        let d = x - self.mean;
        self.mean += d / self.n;
        self.m2 += d * (x - self.mean);
        self.hist.add(x);
    }

    /// Merges `o` in (Chan's parallel formula).
    pub fn merge(&mut self, o: &Acc) {
        if o.n == 0.0 {
            return;
        }
        if self.n == 0.0 {
            *self = *o;
            return;
        }
        (self.n, self.mean, self.m2) = chan((self.n, self.mean, self.m2), (o.n, o.mean, o.m2));
        self.hist.merge(&o.hist);
        self.windows.merge(&o.windows);
    }

    /// Keeps at most `cap` samples' weight (older data fade as new come).
    pub fn cap(&mut self, cap: f64) {
        if self.n > cap {
            self.hist.scale(cap / self.n);
            self.windows.n *= cap / self.n;
            self.windows.m2 *= cap / self.n;
            self.m2 *= cap / self.n;
            self.n = cap;
        }
    }

    /// The [`LOW_QUANTILE`] of the latencies and its standard error (half
    /// the distance between the quantiles a binomial standard deviation
    /// either side, and 5 % of it at least, as [`var`](Self::var) floors
    /// the spread); `None` under [`MIN_SAMPLES`].
    pub fn low_quantile(&self) -> Option<(f64, f64)> {
        let n = self.hist.total();
        if n < MIN_SAMPLES {
            return None;
        }
        let p = LOW_QUANTILE;
        let d = (p * (1.0 - p) / n).sqrt();
        let q = self.hist.quantile(p)?;
        let (lo, hi) = (self.hist.quantile(p - d)?, self.hist.quantile(p + d)?);
        (q > 0.0).then(|| (q, ((hi - lo) / 2.0).max(0.05 * q)))
    }

    /// Makes these latencies one window of a record: its low quantile
    /// counts in the spread between windows (once; with 8 answers or more).
    pub fn seal(&mut self) {
        if self.windows.n == 0.0 {
            if let Some((q, _)) = self.low_quantile() {
                self.windows = Windows {
                    n: 1.0,
                    mean: q.ln(),
                    m2: 0.0,
                };
            }
        }
    }

    /// Sample variance, with the coefficient of variation floored at 5 %
    /// (a fixed service time would otherwise weigh infinitely).
    pub fn var(&self) -> f64 {
        let v = if self.n > 1.0 {
            self.m2 / (self.n - 1.0)
        } else {
            0.0
        };
        v.max((0.05 * self.mean).powi(2))
    }

    /// The squared coefficient of variation (variance over the squared
    /// mean, with the floor of [`var`](Self::var)).
    pub fn cv2(&self) -> f64 {
        if self.mean <= 0.0 {
            return 0.0;
        }
        self.var() / (self.mean * self.mean)
    }

    /// Whether `other`'s mean differs from this one's by more than `z`
    /// standard errors and by more than `rel` of this one. The spread is
    /// the larger of the two's and `cv2`: a few samples of a skewed service
    /// time (one slow answer in ten) most often show too small a variance.
    pub fn differs(&self, other: &Acc, z: f64, rel: f64, cv2: f64) -> bool {
        if self.n < 2.0 || other.n < 2.0 || self.mean <= 0.0 || other.mean <= 0.0 {
            return false;
        }
        let cv2 = cv2.max(self.cv2()).max(other.cv2());
        let d = (other.mean / self.mean).ln();
        d.abs() > rel.ln_1p() && d.abs() > z * (cv2 * (1.0 / self.n + 1.0 / other.n)).sqrt()
    }
}

/// What the latencies at the levels measured say of the knee.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knee {
    /// The best estimate of `k`.
    pub k: f64,
    /// The interval of `k` the data allow (two standard deviations):
    /// `None` below when the data fit "every level is past the knee", `None`
    /// above when they fit "no level is".
    pub low: Option<f64>,
    pub high: Option<f64>,
    /// The service time `S`, seconds.
    pub service: f64,
}

/// Levels kept at most (the nearest to the current limit stay).
pub const MAX_LEVELS: usize = 24;
/// Least samples for a level to take part in the fit.
pub const MIN_SAMPLES: f64 = 8.0;
/// A service time whose squared coefficient of variation is below this is
/// steady (a fixed 20 ms with a millisecond of jitter is 0.0025; an
/// exponential one is 1).
pub const STEADY_CV2: f64 = 0.05;
/// The low quantile a noisy service time's levels are also fitted on.
pub const LOW_QUANTILE: f64 = 0.25;
/// Past a knee `k`, the low quantile grows at least this share of `S/k`
/// per level (the mean wait one request more adds).
pub const WAIT_SHARE: f64 = 0.25;

/// The latencies at each level. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct Levels {
    /// `(level, latencies)`, by level.
    levels: Vec<(u32, Acc)>,
}

impl Levels {
    /// The data of `level`, if any.
    pub fn get(&self, level: u32) -> Option<&Acc> {
        self.levels
            .binary_search_by_key(&level, |(l, _)| *l)
            .ok()
            .map(|i| &self.levels[i].1)
    }

    /// Merges `acc` into `level` (capped at `cap` samples), dropping the
    /// level farthest from `level` past [`MAX_LEVELS`].
    pub fn merge(&mut self, level: u32, acc: &Acc, cap: f64) {
        match self.levels.binary_search_by_key(&level, |(l, _)| *l) {
            Ok(i) => {
                self.levels[i].1.merge(acc);
                self.levels[i].1.cap(cap);
            }
            Err(i) => {
                let mut a = *acc;
                a.cap(cap);
                self.levels.insert(i, (level, a));
            }
        }
        while self.levels.len() > MAX_LEVELS {
            let far = |l: u32| l.abs_diff(level);
            let (first, last) = (self.levels[0].0, self.levels[self.levels.len() - 1].0);
            if far(first) >= far(last) {
                self.levels.remove(0);
            } else {
                self.levels.pop();
            }
        }
    }

    /// Keeps `keep` of every level's weight, down to [`MIN_SAMPLES`] (a
    /// level it brought below that stays there): old data fade, and the
    /// levels that bracket the knee stay in the fit, weighing little.
    pub fn decay(&mut self, keep: f64) {
        for (_, a) in &mut self.levels {
            a.cap((a.n * keep).max(MIN_SAMPLES));
        }
    }

    /// Forgets every level.
    pub fn clear(&mut self) {
        self.levels.clear();
    }

    /// The levels with enough samples to fit, lowest first.
    pub fn known(&self) -> impl Iterator<Item = (u32, &Acc)> {
        self.levels
            .iter()
            .filter(|(_, a)| a.n >= MIN_SAMPLES && a.mean > 0.0)
            .map(|(l, a)| (*l, a))
    }

    /// The squared coefficient of variation of the service time itself:
    /// the larger of the pooled one and the lowest level's. Past the knee
    /// an answer's latency is mostly its wait behind others, so its spread
    /// is small, yet a window's mean there moves with the service times
    /// of the answers before it: the noise of the service, not of the
    /// latencies. The lowest level queues least, so its spread is the
    /// service's own.
    pub fn service_cv2(&self) -> f64 {
        let lowest = self.known().next().map_or(0.0, |(_, a)| a.cv2());
        self.cv2().max(lowest)
    }

    /// The squared coefficient of variation of all the levels' samples
    /// together (0 with none): a level's own, from few samples, is often
    /// too small for a skewed service time.
    pub fn cv2(&self) -> f64 {
        let (mut n, mut sum) = (0.0, 0.0);
        for (_, a) in self.known() {
            n += a.n;
            sum += a.n * a.cv2();
        }
        if n > 0.0 {
            sum / n
        } else {
            0.0
        }
    }

    /// The variance of one window's `ln q` pooled over the levels with two
    /// windows or more.
    fn window_spread(&self) -> Option<f64> {
        let (mut m2, mut df) = (0.0, 0.0);
        for (_, a) in self.known().filter(|(_, a)| a.windows.n >= 2.0) {
            m2 += a.windows.m2;
            df += a.windows.n - 1.0;
        }
        (df > 0.0).then(|| m2 / df)
    }

    /// The low quantile of `a` (a level's record, or latencies to compare
    /// with them) and its standard error: the larger of the binomial one
    /// ([`Acc::low_quantile`]) and the spread between windows over their
    /// count, its own with four windows or more, else at least the pooled
    /// one of the record's levels.
    #[cfg(test)]
    pub fn quantile_of(&self, a: &Acc) -> Option<(f64, f64)> {
        quantile_with(a, self.window_spread())
    }

    /// Whether the service time is noisy: its squared coefficient of
    /// variation ([`service_cv2`](Self::service_cv2)) is [`STEADY_CV2`] or
    /// more. Then the levels' low quantiles take part in the fit.
    pub fn noisy(&self) -> bool {
        self.service_cv2() >= STEADY_CV2
    }

    /// Fits the knee to the levels' means and, for a noisy service time,
    /// their low quantiles; `None` with fewer than two levels known.
    #[cfg(test)]
    pub fn fit(&self) -> Option<Knee> {
        self.fits().0
    }

    /// Fits the knee to the levels' means alone: what the means of a level
    /// are predicted from, and the service time `S`.
    #[cfg(test)]
    pub fn fit_means(&self) -> Option<Knee> {
        self.fits().1
    }

    /// Both fits in one pass over the grid of `k`: to the means and, for a
    /// noisy service time, the low quantiles (first), and to the means
    /// alone (second; `None` both with fewer than two levels known). The
    /// means' error at each `k` is the
    /// same in both, a noisy service's adds the quantiles' to it.
    pub fn fits(&self) -> (Option<Knee>, Option<Knee>) {
        let pooled = self.cv2();
        // Levels by their logarithm: the model's `ln max(1, n/k)` is then
        // a difference, one logarithm per `k` of the grid.
        let pts: Vec<(f64, f64, f64)> = self
            .known()
            .map(|(l, a)| (f64::from(l).ln(), a.mean.ln(), a.n / a.cv2().max(pooled)))
            .collect();
        let mut levels = self.known().map(|(l, _)| f64::from(l));
        let (Some(lo), Some(hi)) = (levels.next(), levels.last()) else {
            return (None, None);
        };
        let spread = self.window_spread();
        let qpts: Vec<(f64, f64, f64)> = if self.noisy() {
            self.known()
                .filter_map(|(l, a)| {
                    quantile_with(a, spread).map(|(q, se)| (f64::from(l), q, se.powi(-2)))
                })
                .collect()
        } else {
            Vec::new()
        };
        // Below `lo` every level is past the knee, above `hi` none is: the
        // error is flat there, so the grid spans `lo..=hi` finely.
        let steps = 200;
        let at = |i: usize| lo + (hi - lo) * i as f64 / steps as f64;
        let mut means = Vec::with_capacity(steps + 1);
        let mut both = Vec::with_capacity(steps + 1);
        for i in 0..=steps {
            let (e, s) = error(&pts, at(i).ln());
            means.push((e, s));
            let q = if qpts.len() >= 2 {
                q_error(&qpts, at(i), WAIT_SHARE * s.exp() / at(i))
            } else {
                0.0
            };
            both.push((e + q, s));
        }
        // The `k` of least error (`S` falling out with it) and every `k`
        // within 4 of it (two standard deviations).
        let knee = |errs: &[(f64, f64)]| {
            let (mut best, mut best_i) = (f64::INFINITY, 0);
            for (i, &(e, _)) in errs.iter().enumerate() {
                if e < best {
                    (best, best_i) = (e, i);
                }
            }
            let within = |&(e, _): &(f64, f64)| e <= best + 4.0;
            let first = errs.iter().position(within).unwrap_or(0);
            let last = errs.iter().rposition(within).unwrap_or(steps);
            Knee {
                k: at(best_i),
                low: (first > 0).then(|| at(first)),
                high: (last < steps).then(|| at(last)),
                service: errs[best_i].1.exp(),
            }
        };
        let means = knee(&means);
        let both = if qpts.len() >= 2 { knee(&both) } else { means };
        (Some(both), Some(means))
    }
}

/// The low quantile of `a` and its standard error, given the record's
/// pooled spread between windows: the larger of the binomial error
/// ([`Acc::low_quantile`]) and the spread between windows over their
/// count, its own with four windows or more, else at least the pooled one.
fn quantile_with(a: &Acc, pooled: Option<f64>) -> Option<(f64, f64)> {
    let (q, se) = a.low_quantile()?;
    let own = a.windows.var().filter(|_| a.windows.n >= 4.0);
    let v = own.or_else(|| match (a.windows.var(), pooled) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    });
    let rse = v.map_or(0.0, |v| (v / a.windows.n.max(1.0)).sqrt());
    Some((q, se.max(q * rse)))
}

/// Weighted squared error of the additive model `q(n) = q0 + b·max(0, n - k)`
/// (`q0` and `b >= b_min` fitted by weighted least squares for this `k`) over
/// `(level, low quantile, weight)` points. Additive, not `S·max(1, n/k)`:
/// past the knee every answer waits about `(n - k)·S/k` for a worker on
/// top of its own service time, which shifts a low quantile by the wait,
/// not in proportion.
fn q_error(pts: &[(f64, f64, f64)], k: f64, b_min: f64) -> f64 {
    let (mut sw, mut sz, mut sy, mut szz, mut szy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y, w) in pts {
        let z = (x - k).max(0.0);
        sw += w;
        sz += w * z;
        sy += w * y;
        szz += w * z * z;
        szy += w * z * y;
    }
    let den = sw * szz - sz * sz;
    // All levels on one side of `k` (or one level past it): no slope.
    let b = if den > 1e-9 * sw * szz {
        ((sw * szy - sz * sy) / den).max(b_min)
    } else {
        b_min
    };
    let a = (sy - b * sz) / sw;
    pts.iter()
        .map(|&(x, y, w)| w * (y - a - b * (x - k).max(0.0)).powi(2))
        .sum()
}

/// Weighted squared error of the model with knee `e^ln_k` (and the fitted
/// `ln S`) over `(ln level, ln mean, weight)` points.
fn error(pts: &[(f64, f64, f64)], ln_k: f64) -> (f64, f64) {
    let resid = |&(lx, y, _): &(f64, f64, f64)| y - (lx - ln_k).max(0.0);
    let (mut sw, mut swr) = (0.0, 0.0);
    for p in pts {
        sw += p.2;
        swr += p.2 * resid(p);
    }
    let ln_s = swr / sw;
    let e = pts.iter().map(|p| p.2 * (resid(p) - ln_s).powi(2)).sum();
    (e, ln_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` samples alternating `mean * (1 ± spread)` (mean `mean`).
    fn acc(mean: f64, spread: f64, n: usize) -> Acc {
        let mut a = Acc::default();
        for i in 0..n {
            a.add(
                mean * if i % 2 == 0 {
                    1.0 + spread
                } else {
                    1.0 - spread
                },
            );
        }
        a
    }

    fn levels(pts: &[(u32, f64)], spread: f64, n: usize) -> Levels {
        let mut l = Levels::default();
        for &(x, m) in pts {
            l.merge(x, &acc(m, spread, n), 512.0);
        }
        l
    }

    #[test]
    fn welford_and_merge_agree() {
        let mut a = Acc::default();
        for x in [1.0, 2.0, 3.0, 4.0] {
            a.add(x);
        }
        let (mut b, mut c) = (Acc::default(), Acc::default());
        b.add(1.0);
        b.add(2.0);
        c.add(3.0);
        c.add(4.0);
        b.merge(&c);
        assert_eq!(a.n, 4.0);
        assert!((a.mean - 2.5).abs() < 1e-12 && (b.mean - 2.5).abs() < 1e-12);
        // Sample variance of 1..=4 is 5/3.
        assert!((a.var() - 5.0 / 3.0).abs() < 1e-12);
        assert!((b.var() - 5.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn decay_fades_every_level_down_to_a_short_windows_weight() {
        let mut l = levels(&[(4, 0.02), (8, 0.04)], 0.5, 64);
        l.merge(2, &acc(0.02, 0.5, 10), 512.0);
        let before: Vec<(u32, Acc)> = l.levels.clone();
        l.decay(0.5);
        let n: Vec<(u32, f64)> = l.levels.iter().map(|(x, a)| (*x, a.n)).collect();
        // 64 -> 32; 10 -> 8, not 5: the level stays in the fit.
        assert_eq!(n, vec![(2, MIN_SAMPLES), (4, 32.0), (8, 32.0)]);
        for ((_, a), (_, b)) in l.levels.iter().zip(&before) {
            // The mean, quantile and spread stay (the sample variance
            // within its `n - 1`): only the weight fades.
            assert_eq!(a.mean, b.mean);
            assert!((a.var() / b.var() - 1.0).abs() <= 0.05);
            assert_eq!(a.low_quantile().map(|q| q.0), b.low_quantile().map(|q| q.0));
        }
        l.decay(0.5);
        l.decay(0.5);
        assert!(l.levels.iter().all(|(_, a)| a.n == MIN_SAMPLES));
        assert_eq!(l.known().count(), 3);
    }

    #[test]
    fn a_fixed_service_knee_is_found_exactly() {
        // k = 4, S = 20 ms: flat to 4, then in proportion.
        let l = levels(
            &[(2, 0.020), (3, 0.020), (4, 0.020), (5, 0.025), (6, 0.030)],
            0.0,
            32,
        );
        let f = l.fit().unwrap();
        assert!((f.k - 4.0).abs() < 0.05, "{f:?}");
        assert!((f.service - 0.020).abs() < 1e-4);
        let (low, high) = (f.low.unwrap(), f.high.unwrap());
        assert!(low > 3.8 && high < 4.3, "{f:?}");
    }

    #[test]
    fn flat_levels_leave_the_interval_open_above() {
        let f = levels(&[(4, 0.020), (6, 0.020)], 0.5, 64).fit().unwrap();
        assert_eq!(f.high, None);
    }

    #[test]
    fn proportional_levels_leave_it_open_below() {
        let f = levels(&[(10, 0.050), (20, 0.100)], 0.5, 64).fit().unwrap();
        assert_eq!(f.low, None);
        assert!(f.high.unwrap() < 12.5, "{f:?}");
    }

    #[test]
    fn noise_widens_the_interval_instead_of_moving_the_knee() {
        // A 10 % rise from 4 to 5 with a CV of 1 and 16 samples each is
        // within the noise of the means: both "flat" and "past the knee"
        // fit them.
        let l = levels(&[(4, 0.020), (5, 0.022)], 1.0, 16);
        let f = l.fit_means().unwrap();
        assert_eq!((f.low, f.high), (None, None));
        // The low quartile (the same at both) says no answer waited at 5.
        let f = l.fit().unwrap();
        assert!(
            f.low.is_some_and(|low| low > 4.9) && f.high.is_none(),
            "{f:?}"
        );
        // With 512 samples each, the same rise is a knee between 4 and 5.
        let f = levels(&[(4, 0.020), (5, 0.022)], 1.0, 512).fit().unwrap();
        assert!(f.high.is_some() || f.low.is_some(), "{f:?}");
    }

    #[test]
    fn one_level_fits_nothing() {
        assert_eq!(levels(&[(4, 0.020)], 0.0, 32).fit(), None);
        // Nor do levels with too few samples.
        assert_eq!(levels(&[(4, 0.020), (5, 0.025)], 0.0, 4).fit(), None);
    }

    #[test]
    fn differs_needs_both_significance_and_size() {
        let a = acc(0.020, 1.0, 64);
        assert!(!a.differs(&acc(0.022, 1.0, 64), 3.0, 0.15, 0.0));
        assert!(a.differs(&acc(0.040, 1.0, 64), 3.0, 0.15, 0.0));
        let f = acc(0.020, 0.0, 64);
        assert!(
            !f.differs(&acc(0.022, 0.0, 64), 3.0, 0.15, 0.0),
            "10 % is below 15 %"
        );
        // Few samples that happen to agree say little of a skewed service:
        // the spread given (a CV of 3) keeps a doubling within the noise.
        let few = acc(0.040, 0.0, 8);
        assert!(f.differs(&few, 3.0, 0.15, 0.0));
        assert!(!f.differs(&few, 3.0, 0.15, 9.0));
    }

    #[test]
    fn the_service_spread_is_the_lowest_levels_when_queueing_hides_it() {
        // A bimodal service time (10 ms, or 110 ms one time in ten: a
        // squared CV of 2.25) answered flat at 2; past the knee the wait
        // behind others makes the latencies spread little.
        let mut low = Acc::default();
        for i in 0..30 {
            low.add(if i % 10 == 0 { 0.110 } else { 0.010 });
        }
        let mut l = Levels::default();
        l.merge(2, &low, 512.0);
        l.merge(6, &acc(0.060, 0.3, 480), 512.0);
        assert!(l.cv2() < 0.3, "{}", l.cv2());
        let s = l.service_cv2();
        assert!((2.25..2.4).contains(&s), "{s}");
        // A steady one stays steady.
        let f = levels(&[(4, 0.020), (6, 0.030)], 0.0, 64);
        assert_eq!(f.service_cv2(), f.cv2());
    }

    #[test]
    fn the_table_keeps_the_levels_nearest_the_last() {
        let mut l = Levels::default();
        for x in 1..=40 {
            l.merge(x, &acc(0.02, 0.0, 10), 512.0);
        }
        assert_eq!(l.levels.len(), MAX_LEVELS);
        assert_eq!(l.levels[0].0, 40 - MAX_LEVELS as u32 + 1);
        l.merge(40, &acc(0.02, 0.0, 1000), 512.0);
        assert_eq!(l.get(40).unwrap().n, 512.0);
    }

    /// `windows` windows of 40 latencies each, sealed: a bimodal service
    /// (10 ms, or 110 ms one time in ten) plus `wait` seconds for each.
    fn bimodal(wait: f64, windows: usize) -> Acc {
        windows_of(wait, 4, windows)
    }

    /// `windows` sealed windows of 40 answers of a bimodal service plus
    /// `wait` seconds each, `slow` of them 110 ms, the others 10 ms.
    fn windows_of(wait: f64, slow: usize, windows: usize) -> Acc {
        let mut all = Acc::default();
        for _ in 0..windows {
            let mut w = Acc::default();
            for i in 0..40 {
                w.add(wait + if i < slow { 0.110 } else { 0.010 });
            }
            w.seal();
            all.merge(&w);
        }
        all
    }

    #[test]
    fn a_noisy_knee_shows_in_the_low_quantile() {
        // Three workers, a bimodal service of mean 20 ms (a squared CV of
        // 2.25): flat at 2 and 3, then every answer waits (n - 3)·20/3 ms.
        // The means (20, 20, 27, 33, 40 ms) of 80 answers each, with a
        // standard error of 17 %, place the knee between 2.1 and 4; the
        // low quantile (10 ms, then 17, 23, 30) between 2.8 and 3.4.
        let mut l = Levels::default();
        for (level, wait) in [(2, 0.0), (3, 0.0), (4, 0.0067), (5, 0.0133), (6, 0.020)] {
            l.merge(level, &bimodal(wait, 2), 512.0);
        }
        assert!(l.noisy());
        let means = l.fit_means().unwrap();
        let both = l.fit().unwrap();
        let width = |k: Knee| k.high.unwrap() - k.low.unwrap();
        assert!(width(both) * 2.0 < width(means), "{means:?} {both:?}");
        let (low, high) = (both.low.unwrap(), both.high.unwrap());
        assert!(low > 2.5 && high < 3.5, "{both:?}");
        assert!((both.k - 3.0).abs() < 0.3, "{both:?}");
    }

    #[test]
    fn a_flat_low_quantile_refutes_a_knee_the_means_would_place() {
        // Eight workers, no level past them. The one window at 4 met no
        // slow answer (10 ms), the windows above met their tenth or a
        // little more (20 to 25 ms): by the means alone the backend queues
        // from about 4 on. Its quartile, 10 ms at every level, says none
        // waits.
        let mut l = Levels::default();
        l.merge(4, &windows_of(0.0, 0, 1), 512.0);
        l.merge(5, &windows_of(0.0, 4, 8), 512.0);
        l.merge(6, &windows_of(0.0, 5, 3), 512.0);
        l.merge(8, &windows_of(0.0, 6, 3), 512.0);
        assert!(l.noisy());
        let means = l.fit_means().unwrap();
        let both = l.fit().unwrap();
        assert!(means.k < 5.5 && means.high.is_some(), "{means:?}");
        assert!(both.k >= 7.0, "{both:?}");
    }

    #[test]
    fn a_steady_service_is_fitted_on_its_means_alone() {
        let l = levels(
            &[(2, 0.020), (3, 0.020), (4, 0.020), (5, 0.025), (6, 0.030)],
            0.0,
            32,
        );
        assert!(!l.noisy());
        assert_eq!(l.fit(), l.fit_means());
    }

    #[test]
    fn the_additive_model_fits_a_wait_on_top_of_the_service() {
        // 10 ms, and 5 ms more for each request past 3.
        let pts: Vec<(f64, f64, f64)> = (1..=6)
            .map(|n| {
                let x = f64::from(n);
                (x, 0.010 + (x - 3.0).max(0.0) * 0.005, 1.0)
            })
            .collect();
        assert!(q_error(&pts, 3.0, 0.0) < 1e-12);
        assert!(q_error(&pts, 4.0, 0.0) > 1e-7);
        assert!(q_error(&pts, 2.0, 0.0) > 1e-7);
        // A least slope below the data's leaves the fit as it is.
        assert!(q_error(&pts, 3.0, 0.004) < 1e-12);
        // Flat data: no slope at any `k`, no error, unless a wait is due.
        let flat: Vec<(f64, f64, f64)> = (1..=4).map(|n| (f64::from(n), 0.01, 1.0)).collect();
        assert!(q_error(&flat, 2.5, 0.0) < 1e-15);
        // With `b = 0.004` past 2.5, `q0` fits the mean of 0.01, 0.01,
        // 0.01 - 0.002 and 0.01 - 0.006 in the residuals.
        let e = q_error(&flat, 2.5, 0.004);
        let r = [0.002, 0.002, 0.0, -0.004];
        let want: f64 = r.iter().map(|x| x * x).sum();
        assert!((e - want).abs() < 1e-12, "{e} {want}");
        // A falling line is fitted flat (no negative wait).
        let falling = [(1.0, 0.02, 1.0), (2.0, 0.01, 1.0)];
        let e = q_error(&falling, 1.0, 0.0);
        assert!((e - 2.0 * 0.005f64.powi(2)).abs() < 1e-12, "{e}");
    }

    #[test]
    fn the_low_quantiles_error_is_the_spread_between_windows() {
        let l = Levels::default();
        // Windows alike: the binomial error of 80 answers, under a bucket.
        let alike = bimodal(0.0, 2);
        let (q, se) = l.quantile_of(&alike).unwrap();
        assert!((0.0097..0.0110).contains(&q), "{q}");
        assert!((se - 0.05 * q).abs() < 1e-12, "the 5 % floor: {se}");
        // Two windows a queue apart (10 and 20 ms): their spread is the
        // error, far above what 80 independent answers would allow.
        let mut apart = bimodal(0.0, 1);
        apart.merge(&bimodal(0.010, 1));
        let (q, se) = l.quantile_of(&apart).unwrap();
        let (_, binomial) = apart.low_quantile().unwrap();
        assert!(se > 3.0 * binomial && se > 0.3 * q, "{q} {se} {binomial}");
        // Sealed once: merging more answers into a window does not count
        // it again.
        let mut w = bimodal(0.0, 1);
        w.seal();
        assert_eq!(w.windows.n, 1.0);
        // A single window borrows the spread the record's levels show.
        let mut record = Levels::default();
        record.merge(4, &apart, 512.0);
        let one = bimodal(0.0, 1);
        let (_, own) = l.quantile_of(&one).unwrap();
        let (_, pooled) = record.quantile_of(&one).unwrap();
        assert!(pooled > 3.0 * own, "{own} {pooled}");
    }
}
