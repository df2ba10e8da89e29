//! `overload`'s workloads with deadlines, on real sockets: what the
//! simulator's matrix (`loadbench sim`) judges, confirmed against real
//! backends, HAProxy and tower in one run.
//!
//! Each workload is its own backend process (fixed-capacity servers, see
//! `backend.rs`) with service times that are not one fixed sleep:
//!
//! - `exp`: 3 servers of 4 workers, exponential service around 20 ms;
//! - `bimodal`: the same, 10 ms or (one in ten) 110 ms;
//! - `sizes`: servers of 2, 4 and 8 workers, 20 ms;
//! - `change`: 3 x 4 workers, 20 ms, offered 1.5x the starting capacity;
//!   every server's workers halved at a third of the run and doubled back
//!   at two thirds (the backend's `workers` command), the run three levels
//!   long;
//! - `bursts`: 3 x 4 workers, exponential; on/off bursts, 2x capacity for
//!   500 ms then nothing for 500 ms;
//! - `bursts-bimodal`: the same bursts on servers of 2, 4 and 8 workers
//!   with the bimodal service (the simulator's hardest class).
//!
//! The steady workloads run 0.7x, 1x, 2x (a fifth of the tasks critical,
//! the rest sheddable) and 4x capacity, one level after the other on the
//! same contender. Arrivals are Poisson, drawn from a fixed seed: every
//! contender gets the same schedule. Side by side:
//!
//! - the engine with `max_concurrent: "auto"`, every task carrying a
//!   250 ms deadline (`Task::deadline_in`) and its class;
//! - HAProxy with `maxconn` = each server's true worker count, following
//!   the change through its admin socket, `timeout queue` 100 ms;
//! - tower: `LoadShed` over p2c over a `ConcurrencyLimit` of each server's
//!   starting worker count (tower has no way to learn a change).
//!
//! Measured over the tasks whose intended start comes after the warm-up:
//! goodput (successes within the deadline from the intended start) and its
//! ratio to HAProxy's, p99 of the successes (those that started a deadline
//! or more before the end), refusals, the share of the
//! critical tasks served in time, and for `change` the time goodput takes
//! to settle after each change (the simulator's `settle_time`, against
//! what HAProxy delivered after that change) and the goodput per 500 ms.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Instant};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::backend::{BackendProc, Service};
use crate::common::{bare_client, ms};
use crate::haproxy::Haproxy;
use crate::overload::{
    engine_config, run_schedule, Answer, Class, Contender, LevelRun, Sample, Summary, Tally,
    HAPROXY_QUEUE_MS, MAX_LEVEL_SECS,
};
use crate::report::{table, Report};
use crate::sim::run::{settle_time, Kind, Record};
use crate::tower_peer::ShedPeer;
use crate::Cli;

/// Every task's deadline (the engine is told; it is the goodput's bound
/// for every contender).
pub const DEADLINE: Duration = Duration::from_millis(250);
/// Mean service time, ms.
const SERVICE_MS: u64 = 20;
/// Seed of the arrivals and of the backends' service-time draws.
const SEED: u64 = 1;
/// The engine's config: only the learned limit.
const ENGINE: &str = r#"{"each_endpoint": {"max_concurrent": "auto"}}"#;
const ENGINE_NAME: &str = "engine, max_concurrent auto, deadline 250 ms";
const HAPROXY_PREFIX: &str = "HAProxy";

/// The load of one run of a workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Poisson at `x` times capacity.
    Steady(f64),
    /// Poisson at `x` times capacity, a fifth critical, the rest sheddable.
    Critical(f64),
    /// 2x capacity for 500 ms, nothing for 500 ms, repeated.
    Bursts,
    /// 1.5x the starting capacity; workers halved at a third of the run,
    /// doubled back at two thirds. Three levels long.
    Change,
}

impl Load {
    fn name(self) -> String {
        match self {
            Load::Steady(x) => format!("{x}x"),
            Load::Critical(x) => format!("{x}x, 1/5 critical"),
            Load::Bursts => "bursts 2x, 0.5 s on / 0.5 s off".into(),
            Load::Change => "1.5x, workers halved at 1/3, doubled at 2/3".into(),
        }
    }

    /// The run's length for a level of `level`.
    fn length(self, level: Duration) -> Duration {
        match self {
            Load::Change => (level * 3).min(Duration::from_secs_f64(MAX_LEVEL_SECS)),
            _ => level,
        }
    }
}

/// One backend setup and the loads it is given.
pub struct Workload {
    pub name: &'static str,
    pub workers: Vec<usize>,
    pub service: Service,
    pub loads: Vec<Load>,
}

impl Workload {
    /// Tasks per second the servers serve at `workers`.
    fn capacity(workers: &[usize]) -> f64 {
        workers.iter().sum::<usize>() as f64 * 1000.0 / SERVICE_MS as f64
    }
}

/// The workloads (see the module doc). A smoke run keeps `exp`, `sizes`
/// and `change` (every path: drawn service times, servers of several sizes,
/// a resize followed by HAProxy), the steady ones at 2x only.
pub fn workloads(smoke: bool) -> Vec<Workload> {
    let steady = if smoke {
        vec![Load::Critical(2.0)]
    } else {
        vec![
            Load::Steady(0.7),
            Load::Steady(1.0),
            Load::Critical(2.0),
            Load::Steady(4.0),
        ]
    };
    let all = vec![
        Workload {
            name: "exp",
            workers: vec![4, 4, 4],
            service: Service::Exp,
            loads: steady.clone(),
        },
        Workload {
            name: "bimodal",
            workers: vec![4, 4, 4],
            service: Service::Bimodal,
            loads: steady.clone(),
        },
        Workload {
            name: "sizes",
            workers: vec![2, 4, 8],
            service: Service::Fixed,
            loads: steady,
        },
        Workload {
            name: "change",
            workers: vec![4, 4, 4],
            service: Service::Fixed,
            loads: vec![Load::Change],
        },
        Workload {
            name: "bursts",
            workers: vec![4, 4, 4],
            service: Service::Exp,
            loads: vec![Load::Bursts],
        },
        Workload {
            name: "bursts-bimodal",
            workers: vec![2, 4, 8],
            service: Service::Bimodal,
            loads: vec![Load::Bursts],
        },
    ];
    if smoke {
        all.into_iter()
            .filter(|w| ["exp", "sizes", "change"].contains(&w.name))
            .collect()
    } else {
        all
    }
}

/// The workloads `--workloads` names (all by default; `none`: none).
pub fn selected(cli: &Cli) -> Result<Vec<Workload>, String> {
    let all = workloads(cli.smoke);
    let Some(list) = cli.workloads.as_deref() else {
        return Ok(all);
    };
    if list.trim() == "none" {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    if let Some(bad) = names.iter().find(|n| !all.iter().any(|w| w.name == **n)) {
        return Err(format!(
            "--workloads: {bad:?}: expected exp, bimodal, sizes, change, bursts, \
             bursts-bimodal or none"
        ));
    }
    Ok(all
        .into_iter()
        .filter(|w| names.contains(&w.name))
        .collect())
}

/// The arrivals of one run: Poisson (on/off for bursts) from `seed`.
fn schedule(load: Load, capacity: f64, length: Duration, seed: u64) -> Vec<(Duration, Class)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let end = length.as_secs_f64();
    let (rate, on_off) = match load {
        Load::Steady(x) | Load::Critical(x) => (x * capacity, None),
        Load::Bursts => (2.0 * capacity, Some((0.5, 1.0))),
        Load::Change => (1.5 * capacity, None),
    };
    let rate = rate.max(1.0);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if let Some((on, period)) = on_off {
            if t % period >= on {
                // Off: the next burst starts the next period.
                t = (t / period).floor() * period + period;
            }
        }
        if t >= end || out.len() >= crate::overload::MAX_TASKS_PER_LEVEL {
            break;
        }
        let class = match load {
            Load::Critical(_) if rng.random::<f64>() < 0.2 => Class::Critical,
            Load::Critical(_) => Class::Sheddable,
            _ => Class::Default,
        };
        out.push((Duration::from_secs_f64(t), class));
    }
    out
}

/// What one contender did under one load of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadResult {
    pub workload: String,
    pub load: String,
    pub contender: String,
    pub all: Summary,
    /// The critical tasks, when the load has some.
    pub critical: Option<Summary>,
    /// Seconds for goodput to settle after the workers halved and after
    /// they doubled back (`None` inside: never within the run).
    pub settle_secs: Option<(Option<f64>, Option<f64>)>,
    /// The goodput settling is measured against (tasks per second, after
    /// each change): HAProxy's in the same run when it ran, else
    /// min(offered, nominal capacity).
    pub settle_reference: Option<[f64; 2]>,
    /// For `change`: goodput per second in each 500 ms of the run (by
    /// the time of the answer), to see the recovery's shape.
    pub timeline: Option<Vec<u32>>,
    pub backend_peak_waiting: u64,
    pub sender_max_lag_ms: f64,
    #[serde(skip)]
    steady: Option<f64>,
    /// For `change`: every task's fate, for `settle_against`.
    #[serde(skip)]
    records: Vec<Record>,
    #[serde(skip)]
    length: Duration,
}

/// The knobs shared with the levels of `overload`.
pub struct Knobs {
    pub level: Duration,
    pub warmup: Duration,
    pub patience: Duration,
    pub drain: Duration,
}

/// Runs every workload; each gets its own backend process and HAProxy.
pub async fn run(
    cli: &Cli,
    list: &[Workload],
    k: &Knobs,
    haproxy_bin: &Result<PathBuf, String>,
) -> Result<Vec<WorkloadResult>, String> {
    let mut out = Vec::new();
    for w in list {
        out.extend(run_one(cli, w, k, haproxy_bin).await?);
    }
    Ok(out)
}

async fn run_one(
    cli: &Cli,
    w: &Workload,
    k: &Knobs,
    haproxy_bin: &Result<PathBuf, String>,
) -> Result<Vec<WorkloadResult>, String> {
    let per_run = |l: Load| l.length(k.level).as_secs_f64() + k.patience.as_secs_f64() + 3.0;
    let max_secs = (w.loads.iter().map(|&l| per_run(l)).sum::<f64>() + 30.0) * 3.0 + 60.0;
    let backend = RefCell::new(BackendProc::spawn_pools(
        &w.workers,
        SERVICE_MS,
        w.service,
        SEED,
        w.workers.len(),
        cli.backend_workers,
        max_secs.ceil() as u64,
    )?);
    let (urls, ports) = {
        let b = backend.borrow();
        (b.urls(), b.ports.clone())
    };
    let cfg = engine_config(ENGINE_NAME, ENGINE, &urls)?;
    let d = Dispatcher::start(cfg).map_err(|e| format!("{ENGINE_NAME}: {e}"))?;
    let mut contenders: Vec<(String, Contender)> = vec![
        (ENGINE_NAME.to_owned(), Contender::Engine(d)),
        (
            format!("tower LoadShed + ConcurrencyLimit({:?}) + p2c", w.workers),
            Contender::Tower(ShedPeer::new(&urls, &w.workers, k.patience)),
        ),
    ];
    let ha = match haproxy_bin {
        Ok(bin) => Some(Haproxy::start_overload(
            bin,
            &ports,
            &w.workers,
            Duration::from_millis(HAPROXY_QUEUE_MS),
            Duration::from_secs(5),
        )?),
        Err(_) => None,
    };
    if let Some(h) = &ha {
        contenders.push((
            format!(
                "{HAPROXY_PREFIX} maxconn {:?} + timeout queue {HAPROXY_QUEUE_MS}ms",
                w.workers
            ),
            Contender::Haproxy {
                client: bare_client(k.patience),
                url: h.url(),
            },
        ));
    }
    if let Some(only) = &cli.only {
        contenders.retain(|(name, _)| name.contains(only.as_str()));
    }
    let capacity = Workload::capacity(&w.workers);
    let half: Vec<usize> = w.workers.iter().map(|&n| (n / 2).max(1)).collect();
    let mut results = Vec::new();
    for (name, who) in &contenders {
        for round in 0..3 {
            let n = w.workers.iter().sum::<usize>();
            let batch = (0..n).map(|i| who.send(round * 100 + i, Class::Default, None));
            let _ = actix_rt::time::timeout(k.patience, futures::future::join_all(batch)).await;
        }
        for (j, &load) in w.loads.iter().enumerate() {
            let length = load.length(k.level);
            let list = schedule(load, capacity, length, SEED + j as u64);
            backend.borrow_mut().start_schedule()?;
            let t0 = Instant::now() + Duration::from_millis(20);
            // The changes are sent on time; their answers are read after
            // the run, so the sender never waits on them.
            let pending = RefCell::new(Vec::new());
            let changes = async {
                if load != Load::Change {
                    return Ok(());
                }
                for (at, workers) in [(length / 3, &half), (length * 2 / 3, &w.workers)] {
                    actix_rt::time::sleep_until(t0 + at).await;
                    backend.borrow_mut().resize_later(workers)?;
                    if let Some(h) = &ha {
                        for (i, &n) in workers.iter().enumerate() {
                            pending.borrow_mut().push(h.set_maxconn_later(i, n)?);
                        }
                    }
                }
                Ok::<(), String>(())
            };
            let (run, changed) = futures::future::join(
                run_schedule(who, &list, t0, Some(DEADLINE), k.patience),
                changes,
            )
            .await;
            let changed = changed.and_then(|()| {
                if load == Load::Change {
                    backend.borrow_mut().resized()?;
                    backend.borrow_mut().resized()?;
                }
                pending.take().into_iter().try_for_each(Haproxy::answered)
            });
            if let Err(e) = changed {
                // Put the servers back before saying why.
                let _ = resize(&backend, ha.as_ref(), &w.workers);
                return Err(format!("{}: {e}", w.name));
            }
            let peak = backend.borrow_mut().peaks()?.into_iter().max().unwrap_or(0);
            let r = summarize(w, load, name, &run, capacity, length, peak, k);
            eprintln!(
                "overload: {}: {}: {name}: goodput {:.0}/s ({:.0} % of capacity), ok p99 {} ms, \
                 {} refused, {} failed, {} gave up{}",
                w.name,
                r.load,
                r.all.goodput_per_sec,
                r.all.goodput_share_of_capacity * 100.0,
                ms(r.all.success_latency.p99_ms),
                r.all.refused,
                r.all.failed,
                r.all.gave_up,
                r.critical.as_ref().map_or(String::new(), |c| format!(
                    ", critical {:.2} % in time",
                    critical_share(c) * 100.0
                ))
            );
            results.push(r);
        }
        if let Contender::Engine(d) = who {
            d.shutdown(Duration::from_secs(2)).await;
        }
        actix_rt::time::sleep(k.drain).await;
    }
    settle_against_haproxy(&mut results);
    Ok(results)
}

/// Seconds from each change (at a third and two thirds of a run of
/// `length`) until goodput stays within 0.9 of `targets[i]` (tasks per
/// second), as the simulator measures it.
fn settle(records: &[Record], length: Duration, targets: [f64; 2]) -> (Option<f64>, Option<f64>) {
    let at = |from: Duration, target: f64| {
        settle_time(records, Some(DEADLINE), from, target, length).map(|d| d.as_secs_f64())
    };
    (at(length / 3, targets[0]), at(length * 2 / 3, targets[1]))
}

/// What HAProxy (`maxconn` = the true workers, following the change)
/// delivered, by its timeline `t` of a run of `l`, in the second half of
/// each phase after a change: the goodput real sockets reach at that capacity (a few per cent
/// under the nominal one: a 20 ms sleep ends on the timer's next
/// millisecond tick).
fn delivered(t: &[u32], l: Duration) -> Option<[f64; 2]> {
    let bin = |d: Duration| (d.as_millis() / 500) as usize;
    // The last bin also holds the answers after the end: left out.
    let mean = |from: Duration, to: Duration| {
        let v = t.get(bin(from)..bin(to).min(t.len() - 1))?;
        (!v.is_empty()).then(|| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64)
    };
    Some([mean(l / 2, l * 2 / 3)?, mean(l * 5 / 6, l)?])
}

/// Settle times of the `change` runs measured against what HAProxy
/// delivered in the same run (see [`delivered`]), when it ran.
fn settle_against_haproxy(results: &mut [WorkloadResult]) {
    let reference = results
        .iter()
        .find(|r| r.timeline.is_some() && r.contender.starts_with(HAPROXY_PREFIX))
        .and_then(|r| delivered(r.timeline.as_deref()?, r.length));
    let Some(targets) = reference else {
        return;
    };
    for r in results.iter_mut().filter(|r| r.timeline.is_some()) {
        r.settle_secs = Some(settle(&r.records, r.length, targets));
        r.settle_reference = Some(targets);
    }
}

/// Sets every server's workers, and HAProxy's `maxconn` with them.
fn resize(
    backend: &RefCell<BackendProc>,
    ha: Option<&Haproxy>,
    workers: &[usize],
) -> Result<(), String> {
    backend.borrow_mut().resize(workers)?;
    if let Some(h) = ha {
        for (i, &n) in workers.iter().enumerate() {
            h.set_maxconn(i, n)?;
        }
    }
    Ok(())
}

/// Share of critical tasks that succeeded within the deadline.
fn critical_share(c: &Summary) -> f64 {
    c.within_slo as f64 / c.sent.max(1) as f64
}

/// A run's samples as the simulator's records (for `settle_time`).
fn records(samples: &[Sample]) -> Vec<Record> {
    samples
        .iter()
        .map(|s| Record {
            at: s.intended,
            done: s.intended + s.latency,
            kind: match s.answer {
                Answer::Success => Kind::Success,
                Answer::Refused => Kind::Refused,
                Answer::Failed | Answer::GaveUp => Kind::Failure,
            },
            critical: s.class == Class::Critical,
            // A real backend's own draw is not known here.
            service: Duration::from_millis(SERVICE_MS),
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    w: &Workload,
    load: Load,
    contender: &str,
    run: &LevelRun,
    capacity: f64,
    length: Duration,
    peak: u64,
    k: &Knobs,
) -> WorkloadResult {
    let secs = length.saturating_sub(k.warmup).as_secs_f64();
    let mut all = Tally::new();
    let mut crit = Tally::new();
    let until = crate::overload::latency_until(length, DEADLINE, k.warmup);
    for s in run.samples.iter().filter(|s| s.intended >= k.warmup) {
        all.add(s, DEADLINE, until);
        if s.class == Class::Critical {
            crit.add(s, DEADLINE, until);
        }
    }
    // Against the nominal capacity here; against what HAProxy delivered,
    // when it ran, once every contender has (`settle_against`).
    let recs = if load == Load::Change {
        records(&run.samples)
    } else {
        Vec::new()
    };
    let offered = 1.5 * capacity;
    let settle_secs = (load == Load::Change).then(|| {
        settle(
            &recs,
            length,
            [offered.min(capacity / 2.0), offered.min(capacity)],
        )
    });
    let timeline = (load == Load::Change).then(|| timeline(&run.samples, length));
    WorkloadResult {
        workload: w.name.to_owned(),
        load: load.name(),
        contender: contender.to_owned(),
        all: all.summary(secs, capacity),
        critical: matches!(load, Load::Critical(_)).then(|| crit.summary(secs, capacity)),
        settle_reference: settle_secs.map(|_| [offered.min(capacity / 2.0), offered.min(capacity)]),
        settle_secs,
        timeline,
        records: recs,
        length,
        backend_peak_waiting: peak,
        sender_max_lag_ms: (run.max_lag.as_secs_f64() * 1e5).round() / 100.0,
        steady: match load {
            Load::Steady(x) | Load::Critical(x) => Some(x),
            _ => None,
        },
    }
}

/// Goodput per second in each 500 ms of a run of `length`, by the time
/// of the answer (answers after the end count in the last bin).
fn timeline(samples: &[Sample], length: Duration) -> Vec<u32> {
    let bins = (length.as_millis() / 500).max(1) as usize;
    let mut v = vec![0u32; bins];
    for s in samples {
        if s.answer == Answer::Success && s.latency <= DEADLINE {
            let b = ((s.intended + s.latency).as_millis() / 500) as usize;
            v[b.min(bins - 1)] += 2;
        }
    }
    v
}

/// HAProxy's result for the same workload and load, if it ran.
fn haproxy_of<'a>(all: &'a [WorkloadResult], r: &WorkloadResult) -> Option<&'a WorkloadResult> {
    all.iter().find(|x| {
        x.workload == r.workload && x.load == r.load && x.contender.starts_with(HAPROXY_PREFIX)
    })
}

fn settle_cell(s: Option<(Option<f64>, Option<f64>)>) -> String {
    let one = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1}"));
    s.map_or("-".into(), |(a, b)| format!("{} / {}", one(a), one(b)))
}

/// The workloads' table, as markdown.
pub fn tables(all: &[WorkloadResult]) -> String {
    let rows = all
        .iter()
        .map(|r| {
            vec![
                r.workload.clone(),
                r.load.clone(),
                r.contender.clone(),
                format!("{:.0}", r.all.offered_per_sec),
                format!(
                    "{:.0} ({:.0} %)",
                    r.all.goodput_per_sec,
                    r.all.goodput_share_of_capacity * 100.0
                ),
                haproxy_of(all, r).map_or("-".into(), |h| {
                    format!(
                        "{:.2}",
                        r.all.goodput_per_sec / h.all.goodput_per_sec.max(1e-9)
                    )
                }),
                ms(r.all.success_latency.p99_ms),
                r.all.refused.to_string(),
                format!("{} / {}", r.all.failed, r.all.gave_up),
                r.critical.as_ref().map_or("-".into(), |c| {
                    format!("{:.2} %", critical_share(c) * 100.0)
                }),
                settle_cell(r.settle_secs),
                r.backend_peak_waiting.to_string(),
            ]
        })
        .collect();
    let lines: Vec<Vec<String>> = all
        .iter()
        .filter_map(|r| {
            let t = r.timeline.as_ref()?;
            let v: Vec<String> = t.iter().map(u32::to_string).collect();
            Some(vec![r.contender.clone(), v.join(" ")])
        })
        .collect();
    let mut md = String::from(
        "\n### Workloads with deadlines\n\nEvery task carries a 250 ms deadline (the engine is \
         told it); goodput counts the successes within it. Capacity: the servers' workers / \
         20 ms mean service (`exp`, `bimodal`, `bursts`: 600/s; `sizes`, `bursts-bimodal`: \
         700/s; `change`: 600/s, 300/s while halved).\n\n",
    );
    md.push_str(&table(
        &[
            "workload",
            "load",
            "contender",
            "offered/s",
            "goodput/s in 250 ms (of capacity)",
            "vs HAProxy",
            "ok p99 ms",
            "refused",
            "failed / gave up",
            "critical in time",
            "settle s (halved / doubled)",
            "peak backend queue",
        ],
        rows,
    ));
    if !lines.is_empty() {
        md.push_str(
            "\n`change`: goodput per second in each 500 ms of the run, by the time of the answer \
             (the workers halve at a third of the run and double back at two thirds):\n\n",
        );
        md.push_str(&table(&["contender", "goodput/s per 500 ms"], lines));
        if let Some([a, b]) = all.iter().find_map(|r| r.settle_reference) {
            md.push_str(&format!(
                "\nSettle: from a change until goodput stays within 0.9 of {a:.0}/s after the \
                 halving and {b:.0}/s after the doubling (the simulator's `settle_time`): what \
                 HAProxy, `maxconn` = the true workers, delivered in the second half of each \
                 phase when it ran (real sockets reach a few per cent under the nominal \
                 capacity: a 20 ms sleep ends on the timer's next millisecond tick), else \
                 min(offered, nominal capacity).\n"
            ));
        }
    }
    md
}

/// The overload targets on real sockets, for the engine's rows.
pub fn targets(rep: &mut Report, all: &[WorkloadResult], haproxy: bool) {
    let engine: Vec<&WorkloadResult> = all.iter().filter(|r| r.contender == ENGINE_NAME).collect();
    if engine.is_empty() {
        return;
    }
    let list = |v: &[(&WorkloadResult, String)]| -> String {
        if v.is_empty() {
            "none".into()
        } else {
            v.iter()
                .map(|(r, m)| format!("{} {}: {m}", r.workload, r.load))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    if haproxy {
        let loaded: Vec<(&WorkloadResult, f64)> = engine
            .iter()
            .filter(|r| r.steady.is_none_or(|x| x >= 1.0))
            .filter_map(|r| {
                let h = haproxy_of(all, r)?;
                Some((*r, r.all.goodput_per_sec / h.all.goodput_per_sec.max(1e-9)))
            })
            .collect();
        let worst = loaded
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(r, x)| format!("worst {x:.2} ({} {})", r.workload, r.load))
            .unwrap_or_else(|| "n/a".into());
        let short: Vec<(&WorkloadResult, String)> = loaded
            .iter()
            .filter(|(_, x)| *x < 0.95)
            .map(|(r, x)| (*r, format!("{x:.2}")))
            .collect();
        rep.target(
            "workloads, engine auto: goodput in 250 ms vs HAProxy's, 1x to 4x, bursts, change",
            ">= 0.95 x",
            format!("{worst}; below: {}", list(&short)),
            Some(short.is_empty()),
        );
    } else {
        rep.target(
            "workloads, engine auto: goodput in 250 ms vs HAProxy's",
            ">= 0.95 x",
            "skipped (HAProxy not installed)",
            None,
        );
    }
    let light: Vec<(&WorkloadResult, String)> = engine
        .iter()
        .filter(|r| r.steady.is_some_and(|x| x <= 0.7) && r.all.refused > 0)
        .map(|r| (*r, r.all.refused.to_string()))
        .collect();
    rep.target(
        "workloads, engine auto: refusals at 0.7x",
        "none",
        list(&light),
        Some(light.is_empty()),
    );
    let crit: Vec<(&WorkloadResult, String)> = engine
        .iter()
        .filter_map(|r| {
            let c = r.critical.as_ref()?;
            Some((*r, format!("{:.2} %", critical_share(c) * 100.0)))
        })
        .collect();
    rep.target(
        "workloads, engine auto: critical tasks at 2x in time",
        ">= 99.5 %",
        list(&crit),
        Some(engine.iter().all(|r| {
            r.critical
                .as_ref()
                .is_none_or(|c| critical_share(c) >= 0.995)
        })),
    );
    let changes: Vec<(&WorkloadResult, String)> = engine
        .iter()
        .filter(|r| r.settle_secs.is_some())
        .map(|r| (*r, settle_cell(r.settle_secs)))
        .collect();
    if !changes.is_empty() {
        rep.target(
            "workloads, engine auto: settle after the workers halve / double",
            "<= 2 s each",
            list(&changes),
            Some(engine.iter().all(|r| match r.settle_secs {
                None => true,
                Some((a, b)) => [a, b].iter().all(|s| s.is_some_and(|s| s <= 2.0)),
            })),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_seeded_and_shaped() {
        let a = schedule(Load::Steady(1.0), 600.0, Duration::from_secs(2), 3);
        assert_eq!(
            a,
            schedule(Load::Steady(1.0), 600.0, Duration::from_secs(2), 3)
        );
        assert!((1000..1400).contains(&a.len()), "{}", a.len());
        let b = schedule(Load::Bursts, 600.0, Duration::from_secs(2), 3);
        assert!(b.iter().all(|(t, _)| t.as_secs_f64() % 1.0 < 0.5));
        let c = schedule(Load::Critical(2.0), 600.0, Duration::from_secs(2), 3);
        let crit = c.iter().filter(|(_, k)| *k == Class::Critical).count();
        assert!((400..560).contains(&crit), "{crit} of {}", c.len());
        assert!(c
            .iter()
            .all(|(_, k)| matches!(k, Class::Critical | Class::Sheddable)));
    }

    #[test]
    fn the_timeline_counts_answers_in_time_by_when_they_came() {
        let s = |at_ms: u64, lat_ms: u64, answer: Answer| Sample {
            class: Class::Default,
            intended: Duration::from_millis(at_ms),
            latency: Duration::from_millis(lat_ms),
            since_call: Duration::ZERO,
            answer,
        };
        let v = timeline(
            &[
                s(100, 20, Answer::Success),
                s(450, 100, Answer::Success),
                s(600, 300, Answer::Success),
                s(700, 10, Answer::Refused),
                s(1400, 200, Answer::Success),
            ],
            Duration::from_millis(1500),
        );
        assert_eq!(v, vec![2, 2, 2]);
    }

    #[test]
    fn the_reference_is_the_second_half_of_each_phase_without_the_last_bin() {
        // 9 s: halved at 3 s, doubled at 6 s; bins of 500 ms.
        let mut t = vec![600; 18];
        t[9..12].copy_from_slice(&[270, 280, 290]);
        t[15..17].copy_from_slice(&[530, 550]);
        t[17] = 900;
        assert_eq!(delivered(&t, Duration::from_secs(9)), Some([280.0, 540.0]));
        assert_eq!(delivered(&[600], Duration::from_millis(900)), None);
    }

    #[test]
    fn a_change_run_is_three_levels_long() {
        let l = Duration::from_secs(3);
        assert_eq!(Load::Change.length(l), Duration::from_secs(9));
        assert_eq!(Load::Bursts.length(l), l);
    }
}
