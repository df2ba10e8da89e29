//! The scenario matrix: the classes of workload a rule must hold across,
//! each run through the engine and the oracle with the same arrivals.

use std::time::Duration;

use super::load::Arrivals;
use super::model::{BackendSpec, ServiceTime};
use super::run::{run_engine, run_oracle, settle_time, summary, Limit, Scenario, Summary};

/// The service-time classes, each with a mean of about 20 ms.
pub const SERVICES: [(&str, ServiceTime); 4] = [
    ("fixed", ServiceTime::Fixed(20.0)),
    ("exp", ServiceTime::Exp(20.0)),
    (
        "bimodal",
        ServiceTime::Bimodal {
            fast: 10.0,
            slow: 110.0,
            p_slow: 0.1,
        },
    ),
    (
        "pareto",
        ServiceTime::Pareto {
            mean: 20.0,
            alpha: 1.5,
        },
    ),
];

/// Pools: equal backends, or backends of different sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Three backends of 4 workers.
    Equal,
    /// Backends of 2, 4 and 8 workers.
    Mixed,
}

impl Pool {
    fn workers(self) -> [u32; 3] {
        match self {
            Pool::Equal => [4, 4, 4],
            Pool::Mixed => [2, 4, 8],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pool::Equal => "equal",
            Pool::Mixed => "mixed",
        }
    }
}

/// The shape of the load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Poisson at `x` times capacity.
    Steady(f64),
    /// On/off bursts: 2× capacity for 500 ms, then 500 ms of nothing.
    Bursts,
    /// 1.5× the starting capacity throughout; every backend's workers
    /// multiplied by `factor` at a third of the run.
    Change(f64),
}

/// Builds a scenario of `length`.
pub fn scenario(
    pool: Pool,
    service: (&str, ServiceTime),
    shape: Shape,
    deadline: Option<Duration>,
    critical: f64,
    length: Duration,
) -> Scenario {
    let change_at = length / 3;
    let backends: Vec<BackendSpec> = pool
        .workers()
        .iter()
        .map(|&w| {
            let mut b = BackendSpec::new(w, service.1);
            if let Shape::Change(f) = shape {
                b.changes
                    .push((change_at, ((f64::from(w) * f).round() as u32).max(1)));
            }
            b
        })
        .collect();
    let cap: f64 = backends.iter().map(|b| b.capacity_at(Duration::ZERO)).sum();
    let (arrivals, label) = match shape {
        Shape::Steady(x) => (Arrivals::Poisson(cap * x), format!("{x}x")),
        Shape::Bursts => (
            Arrivals::OnOff {
                rate: cap * 2.0,
                on: Duration::from_millis(500),
                off: Duration::from_millis(500),
            },
            "bursts".to_string(),
        ),
        Shape::Change(f) => (Arrivals::Poisson(cap * 1.5), format!("cap x{f}")),
    };
    Scenario {
        name: format!("{}/{}/{}", pool.name(), service.0, label),
        backends,
        arrivals,
        length,
        deadline,
        critical,
        extra: String::new(),
    }
}

/// One line of the matrix: the engine's figures beside the oracle's.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: String,
    pub limit: Limit,
    pub seed: u64,
    pub engine: Summary,
    pub oracle: Summary,
    /// Time to settle after a capacity change (engine, oracle).
    pub settle: Option<(Option<Duration>, Option<Duration>)>,
    /// Each backend's highest limit over the run (sampled every 100 ms).
    pub peak_limits: Vec<u32>,
    /// Requests the engine had waiting inside the backends (in flight
    /// beyond their workers) per worker of the pool, mean over the 100 ms
    /// samples from 1 s on: the queue a limit above the knee moves into the
    /// backends, where no deadline or priority of ours reaches it (the
    /// oracle's is 0). See [`queued_inside`].
    pub inside: f64,
    pub shed: u64,
    pub submitted: u64,
}

impl Row {
    /// Engine goodput over the oracle's (1 when the oracle had none).
    pub fn goodput_ratio(&self) -> f64 {
        if self.oracle.goodput == 0 {
            1.0
        } else {
            self.engine.goodput as f64 / self.oracle.goodput as f64
        }
    }
}

/// Runs `s` through the engine with `limit` and through the oracle.
pub async fn run_row(s: &Scenario, limit: Limit, seed: u64, change: Option<f64>) -> Row {
    let e = run_engine(s, limit, seed).await;
    let o = run_oracle(s, seed);
    let settle = change.map(|_| {
        let at = s.length / 3;
        let offered = match s.arrivals {
            Arrivals::Poisson(r) => r,
            _ => f64::INFINITY,
        };
        let target = offered.min(s.capacity_at(at));
        (
            settle_time(&e.records, s.deadline, at, target, s.length),
            settle_time(&o, s.deadline, at, target, s.length),
        )
    });
    let peak_limits = (0..s.backends.len())
        .map(|i| e.limits.iter().map(|(_, l)| l[i]).max().unwrap_or(0))
        .collect();
    let inside = queued_inside(s, &e.limits, &e.in_flight);
    Row {
        scenario: s.name.clone(),
        limit,
        seed,
        engine: summary(&e.records, s.deadline, s.length),
        oracle: summary(&o, s.deadline, s.length),
        settle,
        peak_limits,
        inside,
        shed: e.stats.queue.shed,
        submitted: e.stats.queue.submitted,
    }
}

/// Requests waiting inside the backends per worker of the pool, mean over
/// the samples `(t, _)` of `limits` from 1 s on, with `in_flight` the
/// engine's attempts in flight to each backend at each sample: the sum of
/// each backend's in flight beyond its workers at `t`, over the sum of the
/// workers. 0 with no sample.
pub fn queued_inside(s: &Scenario, limits: &[(Duration, Vec<u32>)], in_flight: &[Vec<u32>]) -> f64 {
    let (mut sum, mut n) = (0.0, 0u32);
    for ((t, _), f) in limits.iter().zip(in_flight) {
        if *t < Duration::from_secs(1) {
            continue;
        }
        let (mut waiting, mut workers) = (0u32, 0u32);
        for (b, &inside) in s.backends.iter().zip(f) {
            let w = b.workers_at(*t);
            waiting += inside.saturating_sub(w);
            workers += w;
        }
        sum += f64::from(waiting) / f64::from(workers.max(1));
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        sum / f64::from(n)
    }
}

/// A table of rows, as markdown.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | limit | seed | goodput (engine / oracle) | ratio | refused | p99 ms (engine / oracle) | critical ok | settle s (engine / oracle) | queued inside per worker |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let secs =
        |d: Option<Duration>| d.map_or("never".to_string(), |d| format!("{:.1}", d.as_secs_f64()));
    for r in rows {
        out.push_str(&format!(
            "| {} | {:?} | {} | {} / {} | {:.3} | {} | {:.0} / {:.0} | {:.3} | {} | {:.2} |\n",
            r.scenario,
            r.limit,
            r.seed,
            r.engine.goodput,
            r.oracle.goodput,
            r.goodput_ratio(),
            r.engine.refused,
            r.engine.p99_ms,
            r.oracle.p99_ms,
            r.engine.critical_ok,
            r.settle.map_or("-".to_string(), |(e, o)| format!(
                "{} / {}",
                secs(e),
                secs(o)
            )),
            r.inside,
        ));
    }
    out
}

/// Per scenario over every seed run: the goodput ratio's least, tenth
/// percentile and mean, and how many seeds missed a target (`short`: the
/// scenario and seed of each target missed; a row may miss several).
pub fn spread(rows: &[Row], short: &[(&str, u64)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.scenario.as_str()) {
            names.push(&r.scenario);
        }
    }
    let mut out = String::from(
        "| scenario | seeds | goodput ratio: least / 10th pct / mean | queued inside per worker: mean / most | seeds short of a target |\n|---|---|---|---|---|\n",
    );
    for name in names {
        let mut ratios: Vec<f64> = rows
            .iter()
            .filter(|r| r.scenario == name)
            .map(Row::goodput_ratio)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let seeds: std::collections::BTreeSet<u64> = short
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|&(_, seed)| seed)
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
        let inside: Vec<f64> = rows
            .iter()
            .filter(|r| r.scenario == name)
            .map(|r| r.inside)
            .collect();
        let inside_mean = inside.iter().sum::<f64>() / inside.len().max(1) as f64;
        let inside_most = inside.iter().copied().fold(0.0, f64::max);
        out.push_str(&format!(
            "| {name} | {} | {:.3} / {:.3} / {mean:.3} | {inside_mean:.2} / {inside_most:.2} | {} |\n",
            ratios.len(),
            ratios.first().copied().unwrap_or(f64::NAN),
            ratios.get(ratios.len() / 10).copied().unwrap_or(f64::NAN),
            seeds.len(),
        ));
    }
    out
}

/// The deadline every matrix task carries.
pub const DEADLINE: Duration = Duration::from_millis(250);

/// The whole matrix for `limit` and `seed`: every service-time class on
/// both pools at 0.7×, 1×, 2× and 4× and under bursts; capacity halved and
/// doubled; a fifth critical at 2×. Each run `length` long.
pub fn scenarios(length: Duration) -> Vec<(Scenario, Option<f64>)> {
    let mut out = Vec::new();
    for pool in [Pool::Equal, Pool::Mixed] {
        for svc in SERVICES {
            for shape in [
                Shape::Steady(0.7),
                Shape::Steady(1.0),
                Shape::Steady(2.0),
                Shape::Steady(4.0),
                Shape::Bursts,
            ] {
                out.push((
                    scenario(pool, svc, shape, Some(DEADLINE), 0.0, length),
                    None,
                ));
            }
        }
    }
    for svc in SERVICES {
        for f in [0.5, 2.0] {
            let s = scenario(
                Pool::Equal,
                svc,
                Shape::Change(f),
                Some(DEADLINE),
                0.0,
                length,
            );
            out.push((s, Some(f)));
        }
        let mut s = scenario(
            Pool::Equal,
            svc,
            Shape::Steady(2.0),
            Some(DEADLINE),
            0.2,
            length,
        );
        s.name.push_str(" critical 1/5");
        out.push((s, None));
    }
    out
}
