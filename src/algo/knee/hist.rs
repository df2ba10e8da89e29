//! A level's latencies as a histogram, for its low quantile: eight buckets
//! an octave (6–12 % wide, the float's exponent and top three mantissa
//! bits, so adding a sample is a shift), from 61 µs to 64 s. Weights are
//! fractional so that a level's record scales down to its cap with its
//! mean and variance. Hand-written rather than `hdrhistogram`: that one
//! counts in integers (no scaling) and is not `Copy`.

/// Octaves below one second where the first bucket starts (2^-14 s).
const FIRST_OCTAVE: i32 = -14;
/// Sub-buckets of an octave (the top mantissa bits read).
const SUB_BITS: u32 = 3;
const PER_OCTAVE: usize = 1 << SUB_BITS;
/// 20 octaves: 61 µs to 64 s.
const BUCKETS: usize = 20 * PER_OCTAVE;

#[derive(Clone, Copy, PartialEq)]
pub(super) struct Hist {
    w: [f32; BUCKETS],
}

impl Default for Hist {
    fn default() -> Self {
        Hist { w: [0.0; BUCKETS] }
    }
}

impl std::fmt::Debug for Hist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hist({})", self.total())
    }
}

impl Hist {
    /// The bucket of `x` seconds (the first for anything below it, zero
    /// and NaN too; the last for anything above).
    fn bucket(x: f64) -> usize {
        // Zero, negatives and NaN: the first bucket.
        if x.is_nan() || x <= 0.0 {
            return 0;
        }
        let bits = x.to_bits();
        // A positive finite or infinite f64: the exponent is 11 bits.
        let exp = ((bits >> 52) & 0x7ff) as i32 - 1023;
        let sub = ((bits >> (52 - SUB_BITS)) & (PER_OCTAVE as u64 - 1)) as i32;
        let i = (exp - FIRST_OCTAVE) * PER_OCTAVE as i32 + sub;
        i.clamp(0, BUCKETS as i32 - 1) as usize
    }

    /// Where bucket `i` starts, seconds.
    fn edge(i: usize) -> f64 {
        let (octave, sub) = (i / PER_OCTAVE, i % PER_OCTAVE);
        let start = f64::from(FIRST_OCTAVE + octave as i32).exp2();
        start * (1.0 + sub as f64 / PER_OCTAVE as f64)
    }

    pub(super) fn add(&mut self, x: f64) {
        self.w[Self::bucket(x)] += 1.0;
    }

    pub(super) fn merge(&mut self, o: &Hist) {
        for (a, b) in self.w.iter_mut().zip(o.w.iter()) {
            *a += *b;
        }
    }

    pub(super) fn scale(&mut self, f: f64) {
        for a in &mut self.w {
            *a = (f64::from(*a) * f) as f32;
        }
    }

    pub(super) fn total(&self) -> f64 {
        self.w.iter().map(|&w| f64::from(w)).sum()
    }

    /// The `p`-quantile, seconds, interpolated within its bucket; `None`
    /// when empty.
    pub(super) fn quantile(&self, p: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let target = p.clamp(0.0, 1.0) * total;
        let mut below = 0.0;
        for (i, &w) in self.w.iter().enumerate() {
            let w = f64::from(w);
            if w > 0.0 && below + w >= target {
                let f = ((target - below) / w).clamp(0.0, 1.0);
                let (lo, hi) = (Self::edge(i), Self::edge(i + 1));
                return Some(lo + f * (hi - lo));
            }
            below += w;
        }
        Some(Self::edge(BUCKETS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_an_eighth_of_an_octave() {
        assert_eq!(Hist::bucket(2f64.powi(-14)), 0);
        assert_eq!(Hist::bucket(0.0), 0);
        assert_eq!(Hist::bucket(f64::NAN), 0);
        assert_eq!(Hist::bucket(-1.0), 0);
        assert_eq!(Hist::bucket(1e-9), 0);
        assert_eq!(Hist::bucket(1e9), BUCKETS - 1);
        assert_eq!(Hist::bucket(f64::INFINITY), BUCKETS - 1);
        // 1 s starts octave 14; 1.5 s is its fifth bucket.
        assert_eq!(Hist::bucket(1.0), 14 * 8);
        assert_eq!(Hist::bucket(1.5), 14 * 8 + 4);
        for i in [0, 1, 7, 8, 100, BUCKETS - 1] {
            assert_eq!(Hist::bucket(Hist::edge(i)), i);
            assert_eq!(Hist::bucket(Hist::edge(i + 1) * 0.999_999), i);
        }
        assert!((Hist::edge(14 * 8 + 4) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let mut h = Hist::default();
        assert_eq!(h.quantile(0.5), None);
        // 90 answers of 10 ms, 10 of 110 ms: every low quantile is in
        // 10 ms's bucket (9.77–10.99 ms), the top one in 110 ms's.
        for i in 0..100 {
            h.add(if i % 10 == 0 { 0.110 } else { 0.010 });
        }
        let (lo, hi) = (
            Hist::edge(Hist::bucket(0.010)),
            Hist::edge(Hist::bucket(0.010) + 1),
        );
        let q = h.quantile(0.25).unwrap();
        assert!((q - (lo + (hi - lo) * 25.0 / 90.0)).abs() < 1e-12, "{q}");
        assert!(h.quantile(0.95).unwrap() > 0.1);
        // Scaling keeps the quantiles.
        let mut s = h;
        s.scale(0.5);
        assert!((s.total() - 50.0).abs() < 1e-6);
        assert!((s.quantile(0.25).unwrap() - q).abs() < 1e-9);
        // A merge of two halves is the whole.
        let (mut a, mut b) = (Hist::default(), Hist::default());
        for i in 0..100 {
            let x = if i % 10 == 0 { 0.110 } else { 0.010 };
            if i < 50 {
                a.add(x)
            } else {
                b.add(x)
            }
        }
        a.merge(&b);
        assert_eq!(a, h);
    }
}
