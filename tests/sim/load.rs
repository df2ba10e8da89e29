//! Open-loop arrivals: when each task comes and of which class, drawn from
//! a seed before the run (the same list feeds the engine and the oracle).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How tasks arrive (rates in tasks per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Evenly spaced.
    Constant(f64),
    /// A Poisson process.
    Poisson(f64),
    /// Poisson at `rate` for `on`, then nothing for `off`, repeated.
    OnOff {
        rate: f64,
        on: Duration,
        off: Duration,
    },
    /// Poisson, its rate going linearly from `from` to `to` over the run.
    Ramp { from: f64, to: f64 },
    /// `n` tasks at once at the start, nothing after.
    Burst(usize),
}

/// One arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Since the run's start.
    pub at: Duration,
    /// A critical task (else sheddable or default, see [`Mix`]).
    pub critical: bool,
}

/// The arrivals of a run of `length`: `critical` is the share of critical tasks.
pub fn arrivals(a: Arrivals, length: Duration, critical: f64, seed: u64) -> Vec<Arrival> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let end = length.as_secs_f64();
    let mut out = Vec::new();
    let mut push = |t: f64, rng: &mut SmallRng| {
        out.push(Arrival {
            at: Duration::from_secs_f64(t),
            critical: critical > 0.0 && rng.random::<f64>() < critical,
        })
    };
    let exp = |rng: &mut SmallRng, rate: f64| -(1.0 - rng.random::<f64>()).ln() / rate;
    match a {
        Arrivals::Burst(n) => {
            for _ in 0..n {
                push(0.0, &mut rng);
            }
        }
        Arrivals::Constant(rate) => {
            let mut t = 0.0;
            while t < end {
                push(t, &mut rng);
                t += 1.0 / rate;
            }
        }
        Arrivals::Poisson(rate) => {
            let mut t = exp(&mut rng, rate);
            while t < end {
                push(t, &mut rng);
                t += exp(&mut rng, rate);
            }
        }
        Arrivals::OnOff { rate, on, off } => {
            let (on, period) = (on.as_secs_f64(), (on + off).as_secs_f64());
            let mut t = exp(&mut rng, rate);
            while t < end {
                if t % period < on {
                    push(t, &mut rng);
                    t += exp(&mut rng, rate);
                } else {
                    t = (t / period).floor() * period + period;
                }
            }
        }
        Arrivals::Ramp { from, to } => {
            // Thinning of a Poisson process at the higher rate.
            let top = from.max(to);
            let mut t = exp(&mut rng, top);
            while t < end {
                let rate = from + (to - from) * t / end;
                if rng.random::<f64>() < rate / top {
                    push(t, &mut rng);
                }
                t += exp(&mut rng, top);
            }
        }
    }
    out
}
