//! The overload matrix in the deterministic simulator (see `tests/sim`):
//! the real engine on a paused clock against modelled backends, beside an
//! oracle that knows each backend's true capacity.

mod sim;

use std::time::Duration;

use sim::matrix::{run_row, scenario, Pool, Shape, SERVICES};
use sim::run::Limit;

const DEADLINE: Option<Duration> = Some(Duration::from_millis(250));

#[actix_rt::test]
async fn probe_matrix() {
    tokio::time::pause();
    let mut rows = Vec::new();
    for svc in SERVICES {
        for x in [0.5, 2.0] {
            let s = scenario(
                Pool::Equal,
                svc,
                Shape::Steady(x),
                DEADLINE,
                0.0,
                Duration::from_secs(6),
            );
            rows.push(run_row(&s, Limit::Auto, 1, None).await);
        }
    }
    println!("{}", sim::matrix::table(&rows));
}

#[actix_rt::test]
async fn probe_one() {
    tokio::time::pause();
    let svc = SERVICES[0];
    let s = scenario(Pool::Equal, svc, Shape::Steady(2.0), DEADLINE, 0.0, Duration::from_secs(6));
    let e = sim::run::run_engine(&s, if std::env::var("TRUE_LIMIT").is_ok() { Limit::True } else { Limit::Auto }, 1).await;
    let sm = sim::run::summary(&e.records, s.deadline, s.length);
    println!("{sm:?}");
    for b in &e.backends {
        let mut gaps = std::collections::BTreeMap::<u128, u32>::new();
        for d in &b.dones {
            if let Some(s) = b.sends.iter().find(|s| *s >= d) {
                *gaps.entry((*s - *d).as_micros() / 100).or_default() += 1;
            }
        }
        println!("gaps(100us) {gaps:?} sends {} dones {}", b.sends.len(), b.dones.len());
        let svc: Vec<u128> = b.dones.iter().take(12).map(|d| (*d - b.sends[0]).as_micros()).collect();
        let snd: Vec<u128> = b.sends.iter().take(12).map(|d| (*d - b.sends[0]).as_micros()).collect();
        println!("sends {snd:?}\ndones {svc:?}");
    }
    let l: Vec<_> = e.limits.iter().step_by(5).map(|(t, l)| (t.as_millis(), l.clone())).collect();
    println!("limits {l:?}");
    for sec in 0..6u64 {
        let mut l: Vec<u128> = e.records.iter().filter(|r| r.kind == sim::run::Kind::Success && r.at.as_secs() == sec).map(|r| (r.done - r.at).as_millis()).collect();
        l.sort();
        if !l.is_empty() { println!("sec {sec}: n {} p50 {} p90 {} p99 {}", l.len(), l[l.len()/2], l[l.len()*9/10], l[l.len()*99/100]); }
    }
    let o = sim::oracle::run(&s.backends, &sim::run::arrivals_of(&s, 1), s.deadline, 1);
    let bucket = |rs: &[sim::run::Record]| { let mut v = vec![0; 14]; for r in rs { if r.kind == sim::run::Kind::Success { v[(r.done.as_millis() / 500) as usize] += 1; } } v };
    println!("engine by done {:?}", bucket(&e.records));
    println!("oracle by done {:?}", bucket(&o));
    println!("stats shed {} at intake {} failed {}", e.stats.queue.shed, e.stats.queue.shed_at_intake, e.stats.queue.failed);
}
