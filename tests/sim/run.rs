//! One run of the real engine (its actors and pure modules, the default
//! single arbiter) on tokio's paused clock against modelled backends, and
//! the figures of a run.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Instant, Outcome, Priority, Task};

use super::load::{arrivals, Arrival, Arrivals};
use super::model::{BackendSpec, Backends};

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Success,
    /// Failed after it was accepted (an error answer, its deadline).
    Failure,
    /// Refused or shed (`Rejected`).
    Refused,
}

/// One task's fate (times since the run's start).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    pub at: Duration,
    pub done: Duration,
    pub kind: Kind,
    pub critical: bool,
    /// The task's own service time: its first send's on the backend that
    /// would serve it fastest (where it is not known, the mean). A task
    /// whose service time exceeds its deadline cannot succeed in time,
    /// whoever schedules it (a heavy-tailed service has a few).
    pub service: Duration,
}

/// The service time of task `i` of a run seeded `seed` on `specs` (see
/// [`Record::service`]).
pub fn own_service(specs: &[BackendSpec], seed: u64, i: usize) -> Duration {
    specs
        .iter()
        .map(|b| b.service.of_task(seed, &i.to_string(), 0))
        .min()
        .unwrap_or_default()
}

/// How the engine limits each node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_concurrent: "auto"`.
    Auto,
    /// `max_concurrent` = each backend's true starting worker count.
    True,
    /// The engine's default (`max_concurrent` not set).
    Default,
}

/// A scenario: backends, arrivals, the tasks' deadline.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub backends: Vec<BackendSpec>,
    pub arrivals: Arrivals,
    pub length: Duration,
    /// Every task's deadline, from its arrival.
    pub deadline: Option<Duration>,
    /// Share of critical tasks; the others are then sheddable.
    pub critical: f64,
    /// Extra service config (JSON members, each starting with a comma).
    pub extra: String,
}

impl Scenario {
    /// The backends' total capacity at `t`, in tasks per second.
    pub fn capacity_at(&self, t: Duration) -> f64 {
        self.backends.iter().map(|b| b.capacity_at(t)).sum()
    }

    /// The engine's config for this scenario.
    pub fn config(&self, limit: Limit, seed: u64) -> Config {
        self.config_at(limit, seed, Duration::ZERO)
    }

    /// The engine's config for this scenario at `t` since its start (with
    /// [`Limit::True`], the worker counts at `t`).
    pub fn config_at(&self, limit: Limit, seed: u64, t: Duration) -> Config {
        let eps: Vec<String> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let max = match limit {
                    Limit::Auto => r#","max_concurrent":"auto""#.to_string(),
                    Limit::True => format!(r#","max_concurrent":{}"#, b.workers_at(t)),
                    Limit::Default => String::new(),
                };
                format!(r#"{{"address":"{}"{max}}}"#, Backends::address(i))
            })
            .collect();
        let json = format!(
            r#"{{"services":[{{"name":"sim","timeout":"10s","endpoints":[{}],"balancer":{{"seed":{seed}}}{}}}]}}"#,
            eps.join(","),
            self.extra
        );
        Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
    }
}

/// What a run of the engine left.
pub struct EngineRun {
    pub records: Vec<Record>,
    /// The service's counters at the end.
    pub stats: actix_dispatch::ServiceStats,
    /// Each node's learned limit, sampled every 100 ms: `(t, limits)`.
    pub limits: Vec<(Duration, Vec<u32>)>,
    /// Each node's attempts in flight, sampled with the limits.
    pub in_flight: Vec<Vec<u32>>,
    pub backends: Vec<super::model::BackendCounts>,
}

/// The arrivals of `s` under `seed`.
pub fn arrivals_of(s: &Scenario, seed: u64) -> Vec<Arrival> {
    arrivals(s.arrivals, s.length, s.critical, seed)
}

/// Runs the oracle through `s` (the same arrivals as the engine's run).
pub fn run_oracle(s: &Scenario, seed: u64) -> Vec<Record> {
    super::oracle::run(&s.backends, &arrivals_of(s, seed), s.deadline, seed)
}

/// Runs the engine through `s`. Must be called inside an actix system
/// whose clock is paused from its start ([`super::PausedSystem`]).
pub async fn run_engine(s: &Scenario, limit: Limit, seed: u64) -> EngineRun {
    let list = arrivals_of(s, seed);
    let backends = Backends::start(&s.backends, seed);
    let d = Dispatcher::builder(s.config(limit, seed))
        .transport(Backends::factory())
        .start()
        .expect("the dispatcher starts");
    let t0 = Instant::now();
    let records: Rc<RefCell<Vec<Option<Record>>>> = Rc::new(RefCell::new(vec![None; list.len()]));
    let limits = Rc::new(RefCell::new(Vec::new()));
    let in_flight = Rc::new(RefCell::new(Vec::new()));
    let sampler = {
        let (d, limits, end) = (d.clone(), limits.clone(), s.length);
        let in_flight = in_flight.clone();
        actix_rt::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let t = t0.elapsed();
                if t > end {
                    break;
                }
                let st = d.stats().await;
                let l = st.services[0]
                    .nodes
                    .iter()
                    .map(|n| n.concurrency_limit)
                    .collect();
                limits.borrow_mut().push((t, l));
                let f = st.services[0].nodes.iter().map(|n| n.in_flight).collect();
                in_flight.borrow_mut().push(f);
            }
        })
    };
    // With the true worker counts as limits, each capacity change reaches
    // the engine as it happens (a reload), as the oracle's `maxconn` does.
    let mut changes: Vec<Duration> = s
        .backends
        .iter()
        .flat_map(|b| b.changes.iter().map(|(at, _)| *at))
        .collect();
    changes.sort();
    changes.dedup();
    let reloads = (limit == Limit::True).then(|| {
        let (d, s) = (d.clone(), s.clone());
        actix_rt::spawn(async move {
            for at in changes {
                tokio::time::sleep_until(t0 + at).await;
                d.reload(s.config_at(limit, seed, at))
                    .await
                    .expect("the new limits apply");
            }
        })
    });
    let mut jobs = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        tokio::time::sleep_until(t0 + a.at).await;
        let mut task = Task::get("sim", format!("/{i}"));
        if let Some(dl) = s.deadline {
            task = task.deadline(t0 + a.at + dl);
        }
        if s.critical > 0.0 {
            task = task.priority(if a.critical {
                Priority::Critical
            } else {
                Priority::Sheddable
            });
        }
        let sub = d.submit(task);
        let (records, a) = (records.clone(), *a);
        let service = own_service(&s.backends, seed, i);
        jobs.push(actix_rt::spawn(async move {
            let r = sub.await;
            let kind = match r.outcome {
                Outcome::Success(_) => Kind::Success,
                Outcome::Rejected(_) => Kind::Refused,
                _ => Kind::Failure,
            };
            records.borrow_mut()[i] = Some(Record {
                at: a.at,
                done: t0.elapsed(),
                kind,
                critical: a.critical,
                service,
            });
        }));
    }
    for j in jobs {
        j.await.expect("a submit's task ran");
    }
    sampler.abort();
    if let Some(r) = reloads {
        r.abort();
    }
    let stats = d.stats().await.services.remove(0);
    let counts = (0..s.backends.len()).map(|i| backends.counts(i)).collect();
    d.shutdown(Duration::from_secs(1)).await;
    let records = Rc::try_unwrap(records)
        .map(RefCell::into_inner)
        .unwrap_or_else(|r| r.borrow().clone())
        .into_iter()
        .map(|r| r.expect("every task answered"))
        .collect();
    let limits = limits.borrow().clone();
    let in_flight = in_flight.borrow().clone();
    EngineRun {
        records,
        stats,
        limits,
        in_flight,
        backends: counts,
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub offered: usize,
    pub succeeded: usize,
    /// Successes within the deadline, of the tasks that arrived a deadline
    /// or more before the run's end.
    pub goodput: usize,
    pub refused: usize,
    pub failed: usize,
    /// p99 of the successes' latency (arrival to answer) of the tasks of
    /// the steady part: from 3 s (from half the run in a shorter one) to
    /// half a second before the end (the queue left then drains oldest
    /// first), in ms.
    pub p99_ms: f64,
    /// Share of critical tasks that succeeded in time, of those whose own
    /// service time fits the deadline (1 when none).
    pub critical_ok: f64,
}

/// Sums up `records` against `deadline`.
pub fn summary(records: &[Record], deadline: Option<Duration>, length: Duration) -> Summary {
    // Goodput counts the tasks that had their whole time inside the run:
    // those of its last deadline are cut short by the end, not by the
    // engine (a queue served newest first holds fewer of them).
    let horizon = length.saturating_sub(deadline.unwrap_or(Duration::ZERO));
    let in_time = |r: &Record| {
        r.kind == Kind::Success && r.at < horizon && deadline.is_none_or(|d| r.done - r.at <= d)
    };
    let from = Duration::from_secs(3).min(length / 2);
    let to = length.saturating_sub(Duration::from_millis(500));
    let mut lat: Vec<f64> = records
        .iter()
        .filter(|r| r.kind == Kind::Success && r.at >= from && r.at < to)
        .map(|r| (r.done - r.at).as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99_ms = if lat.is_empty() {
        0.0
    } else {
        lat[((lat.len() as f64 * 0.99).ceil() as usize).clamp(1, lat.len()) - 1]
    };
    let crit: Vec<&Record> = records
        .iter()
        .filter(|r| r.critical && r.at < horizon && deadline.is_none_or(|d| r.service <= d))
        .collect();
    Summary {
        offered: records.len(),
        succeeded: records.iter().filter(|r| r.kind == Kind::Success).count(),
        goodput: records.iter().filter(|r| in_time(r)).count(),
        refused: records.iter().filter(|r| r.kind == Kind::Refused).count(),
        failed: records.iter().filter(|r| r.kind == Kind::Failure).count(),
        p99_ms,
        critical_ok: if crit.is_empty() {
            1.0
        } else {
            crit.iter().filter(|r| in_time(r)).count() as f64 / crit.len() as f64
        },
    }
}

/// Time from `change` until goodput is back within 0.9 of `target` (tasks
/// per second) and stays there: the end of the first 500 ms window, from
/// which every window starting in the next second reaches it. `None` when
/// it never does before the run's end.
///
/// Goodput here is work, not a count: each success in time adds its own
/// service time, spread over the last stretch of its latency (when a worker
/// served it), in units of the mean service time. Counted by answers, a
/// window of a noisy service swings with the slow answers it happens to
/// hold (bimodal on 6 workers: a standard deviation of 12 % of 500 ms's
/// answers), so even a scheduler that keeps every worker busy fails 0.9 of
/// capacity in some windows; counted by work it delivers exactly its
/// workers. A window whose arrivals brought less work than `target` is held
/// to what they brought. Work that cannot end in time (a task whose own
/// service time exceeds its deadline) counts neither way.
pub fn settle_time(
    records: &[Record],
    deadline: Option<Duration>,
    change: Duration,
    target: f64,
    length: Duration,
) -> Option<Duration> {
    let bin = Duration::from_millis(100);
    let bins = (length.as_millis() / bin.as_millis()) as usize + 1;
    let bin_of = |t: Duration| (t.as_millis() / bin.as_millis()) as usize;
    // Only work that can end in time counts (a task whose own service time
    // exceeds its deadline holds a worker for nothing, whoever sends it).
    let servable = |r: &&Record| deadline.is_none_or(|d| r.service <= d);
    let n = records.iter().filter(servable).count();
    let mean = records
        .iter()
        .filter(servable)
        .map(|r| r.service.as_secs_f64())
        .sum::<f64>()
        / n.max(1) as f64;
    if mean <= 0.0 {
        return None;
    }
    // Worker-seconds of work delivered in time, and of work arrived, per bin.
    let (mut good, mut offered) = (vec![0f64; bins], vec![0f64; bins]);
    for r in records.iter().filter(servable) {
        if let Some(o) = offered.get_mut(bin_of(r.at)) {
            *o += r.service.as_secs_f64();
        }
        if r.kind != Kind::Success || deadline.is_some_and(|d| r.done - r.at > d) {
            continue;
        }
        let from = r.done.saturating_sub(r.service).max(r.at);
        for (b, g) in good
            .iter_mut()
            .enumerate()
            .take(bin_of(r.done) + 1)
            .skip(bin_of(from))
        {
            let (lo, hi) = (bin * b as u32, bin * (b as u32 + 1));
            let overlap = r.done.min(hi).saturating_sub(from.max(lo));
            *g += overlap.as_secs_f64();
        }
    }
    // Tasks per second of mean service time, over the 500 ms from bin `start`.
    let window =
        |v: &[f64], start: usize| -> f64 { v.iter().skip(start).take(5).sum::<f64>() / mean / 0.5 };
    let first = bin_of(change);
    let last = bins.saturating_sub(5 + 10);
    (first..last)
        .find(|&b| (b..=b + 10).all(|w| window(&good, w) >= 0.9 * target.min(window(&offered, w))))
        .map(|b| bin * (b as u32 + 5) - change.min(bin * (b as u32 + 5)))
}
