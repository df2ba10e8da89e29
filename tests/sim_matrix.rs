//! The overload matrix in the deterministic simulator (see `tests/sim`):
//! the real engine on a paused clock against modelled backends, beside an
//! oracle that knows each backend's true capacity.

mod sim;

use std::time::Duration;

use sim::matrix::{run_row, scenarios};
use sim::run::Limit;

#[actix_rt::test]
#[ignore = "calibration: prints the whole matrix"]
async fn print_matrix() {
    tokio::time::pause();
    let mut rows = Vec::new();
    for (s, change) in scenarios(Duration::from_secs(8)) {
        rows.push(run_row(&s, Limit::Auto, 1, change).await);
    }
    println!("{}", sim::matrix::table(&rows));
}

#[actix_rt::test]
#[ignore = "calibration: one scenario's limits over time"]
async fn print_one() {
    tokio::time::pause();
    let want = std::env::var("SIM_ONE").unwrap_or_default();
    for (s, change) in scenarios(Duration::from_secs(8)) {
        if s.name != want {
            continue;
        }
        let e = sim::run::run_engine(
            &s,
            if std::env::var("TRUE_LIMIT").is_ok() {
                Limit::True
            } else {
                Limit::Auto
            },
            1,
        )
        .await;
        let l: Vec<_> = e
            .limits
            .iter()
            .step_by(2)
            .map(|(t, l)| (t.as_millis() / 100, l.clone()))
            .collect();
        println!("{change:?} limits {l:?}");
        let mut v = vec![0; 20];
        for r in &e.records {
            if r.kind == sim::run::Kind::Success && r.done - r.at <= sim::matrix::DEADLINE {
                v[(r.done.as_millis() / 500) as usize] += 1;
            }
        }
        println!("goodput by 500ms {v:?}");
        let o = sim::oracle::run(&s.backends, &sim::run::arrivals_of(&s, 1), s.deadline, 1);
        let mut w = vec![0; 20];
        for r in &o {
            if r.kind == sim::run::Kind::Success && r.done - r.at <= sim::matrix::DEADLINE {
                w[(r.done.as_millis() / 500) as usize] += 1;
            }
        }
        println!("oracle by 500ms  {w:?}");
        let mut f = vec![0; 40];
        let mut g = vec![0; 40];
        for r in &e.records {
            let b = r.done.as_millis() / 50;
            if (40..80).contains(&b) {
                if r.kind == sim::run::Kind::Success && r.done - r.at <= sim::matrix::DEADLINE {
                    f[(b - 40) as usize] += 1;
                }
                if r.kind == sim::run::Kind::Refused {
                    g[(b - 40) as usize] += 1;
                }
            }
        }
        println!("engine good by 50ms from 2s {f:?}\nrefused by 50ms {g:?}");
        let l: Vec<_> = e
            .limits
            .iter()
            .filter(|(t, _)| t.as_millis() >= 2000 && t.as_millis() < 4000)
            .map(|(_, l)| l.clone())
            .collect();
        println!("limits 2-4s {l:?}");
        println!(
            "shed {} at intake {} failed {}",
            e.stats.queue.shed, e.stats.queue.shed_at_intake, e.stats.queue.failed
        );
    }
}
