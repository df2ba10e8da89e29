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

/// The scenario of the matrix called `name`, `length` long.
fn named(name: &str, length: Duration) -> Scenario {
    scenarios(length)
        .into_iter()
        .map(|(s, _)| s)
        .find(|s| s.name == name)
        .expect("in the matrix")
}

/// The whole matrix for `seed`; with `SIM_ONLY=cap x,bursts` (a tool, like
/// `SIM_SEEDS`) only the scenarios whose name holds one of the parts. With
/// `SIM_LIMIT=true` the engine runs with each backend's true worker count
/// as its limit instead of `"auto"`: what the engine's queue does with a
/// perfect limit, which tells a learned limit's misses from the workload's
/// own noise.
async fn matrix(seed: u64) -> Vec<(Scenario, Row)> {
    let only = std::env::var("SIM_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|p| name.contains(p));
    let limit = match std::env::var("SIM_LIMIT").as_deref() {
        Ok("true") => Limit::True,
        _ => Limit::Auto,
    };
    let mut rows = Vec::new();
    for (s, change) in scenarios(LENGTH) {
        if !wanted(&s.name) {
            continue;
        }
        let row = run_row(&s, limit, seed, change).await;
        rows.push((s, row));
    }
    rows
}

/// What a row is held to: the overload work's target, and a floor below
/// it where the engine does not reach the target yet (the gap is stated in
/// `bench/results/features.md` and measured by `loadbench sim`): a
/// regression below the floor fails.
struct Bound {
    target: f64,
    floor: f64,
}

/// Goodput against the oracle's, by class.
fn goodput_bound(name: &str) -> Bound {
    let (target, floor) = if name.ends_with("/bursts") {
        // On/off bursts: the lull after each burst is where the oracle's
        // plain FIFO queue gains (see `bench/results/features.md`).
        (0.95, 0.85)
    } else if name.contains("cap x") {
        (0.95, 0.90)
    } else if name.ends_with("/1x") {
        // At capacity exactly the queue comes and goes at random.
        (0.95, 0.85)
    } else {
        (0.95, 0.95)
    };
    Bound { target, floor }
}

/// A target a row missed: its scenario and seed, and the line that says
/// what.
struct Miss {
    scenario: String,
    seed: u64,
    line: String,
}

/// The targets of the overload work, checked on every row: what missed a
/// target (first) and what fell below a floor (second), one line each.
fn misses(rows: &[(Scenario, Row)]) -> (Vec<Miss>, Vec<String>) {
    let (mut target, mut floor) = (Vec::new(), Vec::new());
    for (s, r) in rows {
        let name = r.scenario.as_str();
        let mut check = |ok_target: bool, ok_floor: bool, what: String| {
            let line = format!("{name} (seed {}): {what}", r.seed);
            if !ok_floor {
                floor.push(line.clone());
            }
            if !ok_target {
                target.push(Miss {
                    scenario: name.to_string(),
                    seed: r.seed,
                    line,
                });
            }
        };
        // Nothing refused or shed at 0.7x (a heavy-tailed service's own
        // answers past the deadline are failures, not the engine's doing).
        if name.ends_with("/0.7x") {
            let ok = r.engine.refused == 0;
            check(ok, ok, format!("{} refused at 0.7x", r.engine.refused));
        }
        let b = goodput_bound(name);
        let g = r.goodput_ratio();
        check(
            g >= b.target,
            g >= b.floor,
            format!("goodput {g:.3} of the oracle's"),
        );
        if name.ends_with("/2x") || name.ends_with("/4x") {
            let unloaded = s.backends[0].service.p99_ms();
            let deadline = DEADLINE.as_secs_f64() * 1000.0;
            // A request over the knee (the limit errs up) is half a
            // service time of queueing on the smallest backend (2 workers).
            let slack = 2.6;
            let p99 = r.engine.p99_ms;
            check(
                p99 <= deadline.min(2.0 * unloaded) + 1.0,
                p99 <= deadline.min(slack * unloaded) + 1.0,
                format!("p99 {p99:.0} ms, unloaded {unloaded:.0} ms"),
            );
        }
        if name.contains("critical") {
            let c = r.engine.critical_ok;
            check(c >= 0.995, c >= 0.995, format!("critical served {c:.3}"));
        }
        if let Some((settle, oracle)) = r.settle {
            let within = |d: Duration| settle.is_some_and(|s| s <= d);
            // The floor: 3.5 s, or a run that delivers at least the
            // oracle's goodput where the oracle never settles either (the
            // noisy halvings at 3x their new capacity: no run of the
            // oracle settles there, and on about one seed in twenty the
            // engine's heavy-tailed halving misses 2 s, its learned limits
            // two to four times the workers: `bench/results/features.md`).
            check(
                within(Duration::from_secs(2)),
                within(Duration::from_millis(3500)) || (oracle.is_none() && g >= 1.0),
                format!("settled after {settle:?}"),
            );
        }
    }
    (target, floor)
}

#[actix_rt::test(system = "sim::PausedSystem")]
async fn the_matrix_meets_the_overload_targets() {
    let (mut target, mut floor) = (Vec::new(), Vec::new());
    let mut rows_all = Vec::new();
    // `SIM_SEEDS=3,4,5` or `SIM_SEEDS=1-120` runs other seeds (a tool:
    // the figures below are for seeds 1 and 2; many seeds show how often a
    // class misses, in the summary printed last).
    let seeds = std::env::var("SIM_SEEDS").map_or(vec![1, 2], |s| parse_seeds(&s));
    for seed in seeds {
        let rows = matrix(seed).await;
        let (t, f) = misses(&rows);
        target.extend(t);
        floor.extend(f);
        rows_all.extend(rows.into_iter().map(|(_, r)| r));
    }
    println!("{}", sim::matrix::table(&rows_all));
    let lines: Vec<&str> = target.iter().map(|m| m.line.as_str()).collect();
    println!(
        "{} row(s) short of a target:\n{}",
        target.len(),
        lines.join("\n")
    );
    let short: Vec<(&str, u64)> = target
        .iter()
        .map(|m| (m.scenario.as_str(), m.seed))
        .collect();
    println!("{}", sim::matrix::spread(&rows_all, &short));
    assert!(
        floor.is_empty(),
        "{} below the floor:\n{}",
        floor.len(),
        floor.join("\n")
    );
}

/// Seeds from `3,4,5`, `1-120` or both (`1-10,15`); what does not parse
/// is left out.
fn parse_seeds(s: &str) -> Vec<u64> {
    s.split(',')
        .flat_map(|part| {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let range = match (lo.trim().parse::<u64>(), hi.trim().parse::<u64>()) {
                // At most 1000 seeds a part (about 25 minutes): a typo
                // does not start a run of hours.
                (Ok(lo), Ok(hi)) if lo <= hi => Some(lo..=hi.min(lo.saturating_add(999))),
                _ => None,
            };
            range.into_iter().flatten()
        })
        .collect()
}

#[test]
fn seeds_parse_from_lists_and_ranges() {
    assert_eq!(parse_seeds("3,4,5"), vec![3, 4, 5]);
    assert_eq!(parse_seeds("1-4, 9"), vec![1, 2, 3, 4, 9]);
    assert_eq!(parse_seeds("x,7,5-3, 2 - 2"), vec![7, 2]);
    assert_eq!(parse_seeds("1-99999999").len(), 1000);
}

/// Two workers kept busy from 0 to 6 s by a service of slow and fast
/// answers in turns of 500 ms: four of 110 ms and six of 10 ms, then fifty
/// of 10 ms (a mean of 16.7 ms). Each task starts as it arrives; on worker
/// 1 the tasks of `idle` are refused instead of served.
fn busy_pool(idle: std::ops::Range<Duration>) -> Vec<sim::run::Record> {
    use sim::run::{Kind, Record};
    let ms = Duration::from_millis;
    let mut out = Vec::new();
    for worker in 0..2 {
        let mut t = Duration::ZERO;
        for turn in 0..12 {
            let services = if turn % 2 == 0 {
                [vec![ms(110); 4], vec![ms(10); 6]].concat()
            } else {
                vec![ms(10); 50]
            };
            for service in services {
                let refused = worker == 1 && idle.contains(&t);
                out.push(Record {
                    at: t,
                    done: if refused { t } else { t + service },
                    kind: if refused {
                        Kind::Refused
                    } else {
                        Kind::Success
                    },
                    critical: false,
                    service,
                });
                t += service;
            }
        }
    }
    out
}

/// Settling is judged by the work delivered in time, not by the answers
/// counted: a pool that keeps every worker busy has settled, though its
/// 500 ms of slow answers hold a third of the mean's count; one that
/// leaves a worker idle for a second after the change has not.
#[test]
fn settle_counts_work_not_answers() {
    use sim::run::settle_time;
    let (s, length) = (Duration::from_secs, Duration::from_secs(6));
    let dl = Some(DEADLINE);
    // Capacity: 2 workers over the mean service time (1000 ms / 60 tasks).
    let capacity = 2.0 * 60.0;
    let none = Duration::ZERO..Duration::ZERO;
    assert_eq!(
        settle_time(&busy_pool(none), dl, s(2), capacity, length),
        Some(Duration::from_millis(500))
    );
    // The first window at 0.9 of capacity: 2.9 s to 3.4 s (a tenth of a
    // second of one worker idle, 95 %).
    let gap = busy_pool(s(2)..s(3));
    assert_eq!(
        settle_time(&gap, dl, s(2), capacity, length),
        Some(Duration::from_millis(1400))
    );
    // A window whose arrivals bring less than the target is held to them.
    let quiet: Vec<_> = busy_pool(Duration::ZERO..Duration::ZERO)
        .into_iter()
        .filter(|r| r.at < s(2) || r.at >= s(3))
        .collect();
    assert_eq!(
        settle_time(&quiet, dl, s(2), capacity, length),
        Some(Duration::from_millis(500))
    );
}

/// The queue inside the backends counts only what is in flight beyond
/// each backend's workers at the time (a capacity change moves the line),
/// per worker of the pool, from 1 s on.
#[test]
fn queued_inside_counts_past_each_backends_workers() {
    use sim::matrix::queued_inside;
    let s = named("equal/fixed/cap x2", Duration::from_secs(3));
    // 4 workers each until 1 s (a third of the run), then 8.
    let at = Duration::from_millis;
    let limits: Vec<(Duration, Vec<u32>)> = [500, 900, 1000, 2000]
        .iter()
        .map(|&t| (at(t), vec![0; 3]))
        .collect();
    let in_flight = vec![
        vec![20, 20, 20], // before 1 s: not counted
        vec![20, 20, 20],
        vec![9, 8, 8],   // 1 + 0 + 0 waiting of 24 workers (13 before the change)
        vec![8, 10, 14], // 0 + 2 + 6 of 24
    ];
    let want = (1.0 / 24.0 + 8.0 / 24.0) / 2.0;
    assert!((queued_inside(&s, &limits, &in_flight) - want).abs() < 1e-12);
    assert_eq!(queued_inside(&s, &limits[..2], &in_flight[..2]), 0.0);
}

/// A steady service's probes leave the p99 of successes at 2× and 4×
/// within twice the unloaded one (40 ms): each makes the few answers sent
/// behind its step wait up to a service time. Probing every half
/// interval, these seeds read 41 to 43 ms.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_steady_services_probes_leave_its_p99_alone() {
    for (name, seeds) in [
        ("equal/fixed/2x", [134, 175, 179, 230]),
        ("equal/fixed/4x", [156, 204, 1, 2]),
    ] {
        let s = named(name, LENGTH);
        for seed in seeds {
            let row = run_row(&s, Limit::Auto, seed, None).await;
            let p99 = row.engine.p99_ms;
            assert!(p99 <= 40.0 + 1.0, "{name} (seed {seed}): p99 {p99:.1} ms");
        }
    }
}

/// The same seed gives the same run, task by task.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_run_is_deterministic() {
    let s = named("mixed/exp/2x", Duration::from_secs(3));
    let a = sim::run::run_engine(&s, Limit::Auto, 7).await;
    let b = sim::run::run_engine(&s, Limit::Auto, 7).await;
    assert_eq!(a.records, b.records);
    assert_eq!(a.limits, b.limits);
    let c = sim::run::run_engine(&s, Limit::Auto, 8).await;
    assert_ne!(a.records, c.records, "another seed, another run");
}

/// The defaults, tasks without deadlines: nothing is shed by time; a burst
/// the queue holds completes whole, whatever the limit.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn without_deadlines_every_accepted_task_is_served() {
    for limit in [Limit::Default, Limit::Auto, Limit::True] {
        for svc in sim::matrix::SERVICES {
            let mut s = sim::matrix::scenario(
                sim::matrix::Pool::Mixed,
                svc,
                sim::matrix::Shape::Steady(1.0),
                None,
                0.0,
                Duration::from_secs(2),
            );
            // 2000 at once: about 3 s of the pool's work, in a queue of 10 000.
            s.arrivals = sim::load::Arrivals::Burst(2000);
            let e = sim::run::run_engine(&s, limit, 3).await;
            let ok = e
                .records
                .iter()
                .filter(|r| r.kind == sim::run::Kind::Success)
                .count();
            assert_eq!(ok, 2000, "{} {limit:?}", s.name);
            let q = &e.stats.queue;
            assert_eq!((q.succeeded, q.shed, q.rejected), (2000, 0, 0));
            let served: u64 = e.backends.iter().map(|b| b.answered).sum();
            assert_eq!(served, 2000, "{} {limit:?}", s.name);
        }
    }
}

/// One scenario of the matrix in detail: `SIM_ONE=equal/exp/2x SIM_SEED=1
/// cargo test --test sim_matrix one_scenario -- --ignored --nocapture`.
#[actix_rt::test(system = "sim::PausedSystem")]
#[ignore = "a tool: prints one scenario in detail"]
async fn one_scenario() {
    // `RUST_LOG=actix_dispatch::algo::concurrency=trace` shows each
    // learned limit's windows.
    let _ = env_logger::builder().is_test(true).try_init();
    let want = std::env::var("SIM_ONE").unwrap_or_default();
    let seed = std::env::var("SIM_SEED").map_or(1, |s| s.parse().unwrap_or(1));
    // `SIM_SECS=10` runs the scenario as long as `loadbench sim` does.
    let length = std::env::var("SIM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(LENGTH, |s: u64| Duration::from_secs(s.clamp(1, 120)));
    for (mut s, _) in scenarios(length) {
        if s.name != want {
            continue;
        }
        // `SIM_EXTRA=',"concurrency":{"min":4}'` sets the scenario's extra
        // service config members (each starting with a comma; the
        // matrix's scenarios have none of their own).
        if let Ok(extra) = std::env::var("SIM_EXTRA") {
            s.extra = extra;
        }
        // `SIM_LIMIT=true` runs the engine with each backend's true
        // worker count as its limit instead of `"auto"`.
        let limit = match std::env::var("SIM_LIMIT").as_deref() {
            Ok("true") => Limit::True,
            _ => Limit::Auto,
        };
        let e = sim::run::run_engine(&s, limit, seed).await;
        let o = sim::run::run_oracle(&s, seed);
        let good = |rs: &[sim::run::Record]| {
            let mut v = vec![0; 2 * length.as_secs() as usize + 2];
            for r in rs {
                if r.kind == sim::run::Kind::Success && r.done - r.at <= DEADLINE {
                    v[(r.done.as_millis() / 500) as usize] += 1;
                }
            }
            v
        };
        let (eg, og) = (good(&e.records), good(&o));
        println!("engine good per 500 ms {eg:?}");
        println!("oracle good per 500 ms {og:?}");
        let (eg, og): (u32, u32) = (eg.iter().sum(), og.iter().sum());
        println!(
            "goodput {eg} / {og}: {:.3} of the oracle's",
            f64::from(eg) / f64::from(og.max(1))
        );
        for sec in 0..length.as_secs() {
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
        if let Ok(path) = std::env::var("SIM_DUMP") {
            let lines: Vec<String> = e.records.iter().map(|r| format!("{r:?}")).collect();
            std::fs::write(&path, lines.join("\n")).expect("the dump is written");
            let lines: Vec<String> = o.iter().map(|r| format!("{r:?}")).collect();
            std::fs::write(path + ".oracle", lines.join("\n")).expect("the dump is written");
        }
        if std::env::var("SIM_TRACE").is_ok() {
            for (i, ((t, l), f)) in e.limits.iter().zip(&e.in_flight).enumerate() {
                if i % 2 == 0 {
                    println!("{:>5} ms limits {l:?} in flight {f:?}", t.as_millis());
                }
            }
        }
        let q = &e.stats.queue;
        println!(
            "shed {} (at intake {}), failed {}",
            q.shed, q.shed_at_intake, q.failed
        );
    }
}

/// A service latency target (`queue.slo`) sheds as a deadline does, for
/// tasks that carry none: at 4x, what cannot be served within 250 ms is
/// refused or shed, and what is served is served within about that.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_service_latency_target_sheds_tasks_without_deadlines() {
    let mut s = named("equal/exp/4x", Duration::from_secs(4));
    s.deadline = None;
    s.extra = r#","queue":{"slo":"250ms"}"#.into();
    let e = sim::run::run_engine(&s, Limit::Auto, 5).await;
    let q = &e.stats.queue;
    assert!(q.shed * 2 > q.submitted, "{q:?}");
    let summary = sim::run::summary(&e.records, Some(DEADLINE), s.length);
    // Oldest first, then newest first once the queue stands: the served
    // ones waited no more than the target and one attempt.
    assert!(summary.goodput * 10 >= summary.succeeded * 9, "{summary:?}");
    assert!(e.stats.is_balanced());
}

/// A standing overload is served newest first through moments when a turn
/// happened to send all that was ready: at 2x with a latency target (no
/// deadlines), a learned limit started at 2 used to leave such moments,
/// each turning the queue back to oldest first for two targets' time, and
/// the p99 of successes was 227 ms (the bench's real-socket runs showed
/// the same, 246 ms). Newest first now ends only when the queue has been
/// empty for a whole growth period.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_moment_empty_does_not_turn_a_standing_queue_back_to_oldest_first() {
    let mut s = named("equal/fixed/2x", LENGTH);
    s.deadline = None;
    s.extra = r#","queue":{"slo":"250ms"},"concurrency":{"initial":2}"#.into();
    let e = sim::run::run_engine(&s, Limit::Auto, 1).await;
    let summary = sim::run::summary(&e.records, Some(DEADLINE), s.length);
    let oracle = sim::oracle::run(
        &s.backends,
        &sim::run::arrivals_of(&s, 1),
        Some(DEADLINE),
        1,
    );
    let o = sim::run::summary(&oracle, Some(DEADLINE), s.length);
    assert!(summary.p99_ms < 50.0, "{summary:?}");
    assert!(
        summary.goodput as f64 >= 0.95 * o.goodput as f64,
        "{summary:?} {o:?}"
    );
}

/// Where a scenario's goodput goes with `"auto"` against each backend's
/// true worker count as its limit, over seeds: `SIM_ONE=mixed/bimodal/bursts
/// SIM_SEEDS=1-20 cargo test --release --test sim_matrix limit_against_workers
/// -- --ignored --nocapture`. For each: goodput against the oracle's, tasks
/// shed and failed, and each backend's limit over its workers in the 100 ms
/// samples (from 1 s on) where it was full (its attempts in flight at its
/// limit or at its workers).
#[actix_rt::test(system = "sim::PausedSystem")]
#[ignore = "a tool: prints where the learned limit stands against the truth"]
async fn limit_against_workers() {
    let want = std::env::var("SIM_ONE").unwrap_or_default();
    let seeds = std::env::var("SIM_SEEDS").map_or(vec![1, 2], |s| parse_seeds(&s));
    let Some((s, _)) = scenarios(LENGTH).into_iter().find(|(s, _)| s.name == want) else {
        println!("no scenario {want:?} in the matrix");
        return;
    };
    for limit in [Limit::Auto, Limit::True] {
        let (mut good, mut oracle, mut shed, mut failed) = (0, 0, 0, 0);
        let mut full = vec![(0u32, 0f64); s.backends.len()];
        for &seed in &seeds {
            let e = sim::run::run_engine(&s, limit, seed).await;
            let o = sim::run::run_oracle(&s, seed);
            good += sim::run::summary(&e.records, s.deadline, s.length).goodput;
            oracle += sim::run::summary(&o, s.deadline, s.length).goodput;
            shed += e.stats.queue.shed;
            failed += e.stats.queue.failed;
            for ((t, limits), in_flight) in e.limits.iter().zip(&e.in_flight) {
                if *t < Duration::from_secs(1) {
                    continue;
                }
                for (i, b) in s.backends.iter().enumerate() {
                    let workers = b.workers_at(*t);
                    let (l, f) = (limits[i], in_flight[i]);
                    if f >= l || f >= workers {
                        full[i].0 += 1;
                        full[i].1 += f64::from(l) / f64::from(workers.max(1));
                    }
                }
            }
        }
        let ratios: Vec<String> = full
            .iter()
            .map(|(n, sum)| format!("{:.2}", sum / f64::from((*n).max(1))))
            .collect();
        println!(
            "{want} {limit:?}, seeds {seeds:?}: goodput {good} / oracle {oracle} = {:.3}; \
             shed {shed}, failed {failed}; limit over workers while full {ratios:?}",
            good as f64 / oracle.max(1) as f64
        );
    }
}
