//! The overload matrix in the deterministic simulator (see `tests/sim`):
//! the real engine on a paused clock against modelled backends, beside an
//! oracle that knows each backend's true capacity (HAProxy configured with
//! the true worker counts). Every class of workload, `max_concurrent:
//! "auto"`, tasks due in 250 ms; `loadbench sim` runs the same matrix over
//! more seeds and prints it.

mod sim;

use std::time::Duration;

use sim::matrix::{run_row, scenarios, Row, DEADLINE};
use sim::run::{Limit, Scenario};

const LENGTH: Duration = Duration::from_secs(8);

/// The whole matrix for `seed`.
async fn matrix(seed: u64) -> Vec<(Scenario, Row)> {
    let mut rows = Vec::new();
    for (s, change) in scenarios(LENGTH) {
        let row = run_row(&s, Limit::Auto, seed, change).await;
        rows.push((s, row));
    }
    rows
}

/// The targets of the overload work, checked on every row; returns what
/// missed, one line each.
fn misses(rows: &[(Scenario, Row)]) -> Vec<String> {
    let mut out = Vec::new();
    for (s, r) in rows {
        let name = &r.scenario;
        let mut miss = |what: String| out.push(format!("{name} (seed {}): {what}", r.seed));
        let light = name.ends_with("/0.7x");
        // Nothing refused or shed at 0.7x (a heavy-tailed service's own
        // answers past the deadline are failures, not the engine's doing).
        if light && r.engine.refused > 0 {
            miss(format!("{} refused at 0.7x", r.engine.refused));
        }
        if r.goodput_ratio() < 0.95 {
            miss(format!("goodput {:.3} of the oracle's", r.goodput_ratio()));
        }
        if name.ends_with("/2x") || name.ends_with("/4x") {
            let unloaded = s.backends[0].service.p99_ms();
            let bound = DEADLINE
                .as_secs_f64()
                .mul_add(1000.0, 0.0)
                .min(2.0 * unloaded);
            if r.engine.p99_ms > bound {
                miss(format!("p99 {:.0} ms over {bound:.0}", r.engine.p99_ms));
            }
        }
        if name.contains("critical") && r.engine.critical_ok < 0.995 {
            miss(format!("critical served {:.3}", r.engine.critical_ok));
        }
        if let Some((settle, _)) = r.settle {
            if settle.is_none_or(|d| d > Duration::from_secs(2)) {
                miss(format!("settled after {settle:?}"));
            }
        }
    }
    out
}

#[actix_rt::test]
async fn the_matrix_meets_the_overload_targets() {
    tokio::time::pause();
    let mut all = Vec::new();
    let mut rows_all = Vec::new();
    for seed in [1, 2] {
        let rows = matrix(seed).await;
        all.extend(misses(&rows));
        rows_all.extend(rows.into_iter().map(|(_, r)| r));
    }
    println!("{}", sim::matrix::table(&rows_all));
    assert!(all.is_empty(), "{} misses:\n{}", all.len(), all.join("\n"));
}

/// One scenario of the matrix in detail: `SIM_ONE=equal/exp/2x SIM_SEED=1
/// cargo test --test sim_matrix one_scenario -- --ignored --nocapture`.
#[actix_rt::test]
#[ignore = "a tool: prints one scenario in detail"]
async fn one_scenario() {
    tokio::time::pause();
    let want = std::env::var("SIM_ONE").unwrap_or_default();
    let seed = std::env::var("SIM_SEED").map_or(1, |s| s.parse().unwrap_or(1));
    for (s, _) in scenarios(LENGTH) {
        if s.name != want {
            continue;
        }
        let e = sim::run::run_engine(&s, Limit::Auto, seed).await;
        let o = sim::oracle::run(
            &s.backends,
            &sim::run::arrivals_of(&s, seed),
            s.deadline,
            seed,
        );
        let good = |rs: &[sim::run::Record]| {
            let mut v = vec![0; 2 * LENGTH.as_secs() as usize + 2];
            for r in rs {
                if r.kind == sim::run::Kind::Success && r.done - r.at <= DEADLINE {
                    v[(r.done.as_millis() / 500) as usize] += 1;
                }
            }
            v
        };
        println!("engine good per 500 ms {:?}", good(&e.records));
        println!("oracle good per 500 ms {:?}", good(&o));
        for sec in 0..LENGTH.as_secs() {
            let mut l: Vec<u128> = e
                .records
                .iter()
                .filter(|r| r.kind == sim::run::Kind::Success && r.at.as_secs() == sec)
                .map(|r| (r.done - r.at).as_millis())
                .collect();
            l.sort();
            if let (Some(p50), Some(p99)) = (l.get(l.len() / 2), l.get(l.len() * 99 / 100)) {
                println!(
                    "arrived in second {sec}: {} served, p50 {p50} ms, p99 {p99} ms",
                    l.len()
                );
            }
        }
        let limits: Vec<_> = e.limits.iter().step_by(5).map(|(_, l)| l.clone()).collect();
        println!("limits every 500 ms {limits:?}");
        let q = &e.stats.queue;
        println!(
            "shed {} (at intake {}), failed {}",
            q.shed, q.shed_at_intake, q.failed
        );
    }
}
