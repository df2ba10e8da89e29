//! `overload`: more tasks than the backends can take, open loop, and how
//! much useful work still gets done.
//!
//! Three fixed-capacity backends in another process (each serves
//! [`WORKERS`] requests at once for [`SERVICE_MS`] ms, the rest wait inside
//! it, as a worker pool does: 600 tasks/s in all). Tasks arrive on a
//! schedule (open loop, never waiting for answers) at a sequence of load
//! levels, multiples of that capacity: by default 0.5x, 1x, 2x, 4x, a mixed
//! 2x (0.4x offered as critical, 1.6x as sheddable) and 0.5x again, each
//! for `--duration` seconds, one after the other on the same contender (so
//! the last level shows how it recovers). Side by side in one run:
//!
//! - the engine under every config of [`ENGINE_CONFIGS`] (and of
//!   `--engine-config NAME=JSON`), with no per-task deadlines: the configs
//!   that shed state the SLO as `queue.slo`;
//! - tower: p2c peak EWMA over a `ConcurrencyLimit` of [`WORKERS`] per
//!   backend, `LoadShed` in front (`tower_peer.rs`, [`ShedPeer`]);
//! - HAProxy: `maxconn` [`WORKERS`] per server, `timeout queue`
//!   [`HAPROXY_QUEUE_MS`] ms (`haproxy.rs`), reached by a bare awc client;
//!   skipped, and said so, when it is not installed.
//!
//! Per level and contender, over the tasks whose intended start falls after
//! the level's warm-up: goodput (successes within the SLO, `--slo-ms`, per
//! second), p50 and p99 of the successes (of the tasks that started an SLO
//! or more before the level's end: later ones may be served in the drain
//! after the arrivals stop), p99 of the time to refuse, the
//! number of refusals; all of them per priority class too. Every latency is
//! measured from the task's intended start. A task unanswered after
//! `patience` is given up by the client (counted, never good).
//!
//! The class of a task is the bench's own label; [`with_priority`] is the
//! one place where the engine is told it.
//!
//! After the levels come the workloads with deadlines (`workloads.rs`):
//! noisy service times, servers of different sizes, a capacity change and
//! bursts, each on backends of its own, the engine with `"auto"` and a
//! 250 ms deadline per task beside HAProxy and tower. `--levels none` or
//! `--workloads none` skips either part.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Instant, Priority, Task};
use futures::future::LocalBoxFuture;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

use crate::backend::BackendProc;
use crate::common::{bare_client, hist, ms, pick, record, Lat};
use crate::haproxy::{self, Haproxy};
use crate::report::{out_dir, table, Report};
use crate::tower_peer::{ShedAnswer, ShedPeer};
use crate::Cli;

/// Fixed-capacity backends.
const BACKENDS: usize = 3;
/// Requests each backend serves at once.
const WORKERS: usize = 4;
/// Service time of one request, ms.
const SERVICE_MS: u64 = 20;
/// HAProxy's `timeout queue`: a request waits at most this long for a
/// server slot, then HAProxy answers 503. Well inside the default SLO, so
/// what it serves is good.
pub(crate) const HAPROXY_QUEUE_MS: u64 = 100;
/// No level sends more than this many tasks, whatever the flags say.
pub(crate) const MAX_TASKS_PER_LEVEL: usize = 500_000;
/// No level lasts longer than this, whatever the flags say.
pub(crate) const MAX_LEVEL_SECS: f64 = 120.0;
/// The warm-up of a level: this share of it, at most [`MAX_WARMUP`].
const WARMUP_SHARE: f64 = 0.3;
const MAX_WARMUP: Duration = Duration::from_secs(3);
/// The recovery level counts refusals after this much of it (or after half
/// of it, when shorter): "back at 0.5x, no refusals after 5 s".
const RECOVERY_AFTER: Duration = Duration::from_secs(5);

/// The engine configs run side by side, in one place: a name, and the
/// service's fields as JSON merged over `{"name", "endpoints"}`. The key
/// `each_endpoint` holds fields merged into every endpoint (e.g.
/// `{"each_endpoint": {"max_concurrent": 4}}`); [`SLO_TOKEN`] stands for
/// the SLO the levels are measured by (`--slo-ms`). More can be added at
/// run time with `--engine-config 'NAME={...}'`.
///
/// The engine sheds by time only on a time the user stated; goodput
/// within the SLO is a fair target for a config that states it
/// (`queue.slo`) or a capacity (`queue.capacity`), not for the defaults,
/// which serve every task however late (up to the default queue
/// capacity): theirs are reported only ([`states_a_bound`]).
pub const ENGINE_CONFIGS: &[(&str, &str)] = &[
    ("engine defaults", "{}"),
    ("engine, slo", r#"{"queue": {"slo": "$SLO"}}"#),
    (
        "engine, max_concurrent auto, slo",
        r#"{"each_endpoint": {"max_concurrent": "auto"}, "concurrency": {"initial": 2},
            "queue": {"slo": "$SLO"}}"#,
    ),
    (
        "engine, max_concurrent 4, queue 100",
        r#"{"each_endpoint": {"max_concurrent": 4}, "queue": {"capacity": 100}}"#,
    ),
];

/// Stands for the levels' SLO in a config of [`ENGINE_CONFIGS`].
pub const SLO_TOKEN: &str = "$SLO";

/// Whether a config states a time or a capacity that lets the engine
/// refuse or shed (a `queue.slo`, `queue.deadline`, `queue.capacity`).
fn states_a_bound(snippet: &str) -> bool {
    let v: Value = serde_json::from_str(snippet).unwrap_or(Value::Null);
    let q = &v["queue"];
    ["slo", "deadline", "capacity"]
        .iter()
        .any(|k| !q[*k].is_null())
}

/// The bench's label of a task's priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Critical,
    Default,
    Sheddable,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Default => "default",
            Class::Sheddable => "sheddable",
        }
    }
}

/// Gives an engine task its priority class: the one place the engine is
/// told a task's class. The peers have no classes: for them the label is
/// only the bench's bookkeeping (the same labels, so the per-class figures
/// compare).
fn with_priority(task: Task, class: Class) -> Task {
    task.priority(match class {
        Class::Critical => Priority::Critical,
        Class::Default => Priority::Default,
        Class::Sheddable => Priority::Sheddable,
    })
}

// === impl Level ===

/// One load level: what is offered, as multiples of the backends' capacity,
/// per class.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub name: String,
    pub parts: Vec<(Class, f64)>,
}

impl Level {
    /// `0.5`, `2x`, `mixed` (0.4x critical + 1.6x sheddable).
    fn parse(s: &str) -> Result<Level, String> {
        let s = s.trim();
        if s == "mixed" {
            return Ok(Level {
                name: "mixed 0.4x critical + 1.6x sheddable".into(),
                parts: vec![(Class::Critical, 0.4), (Class::Sheddable, 1.6)],
            });
        }
        let x: f64 =
            s.strip_suffix('x').unwrap_or(s).parse().map_err(|e| {
                format!("--levels: {s:?}: {e} (a multiple of capacity, or `mixed`)")
            })?;
        if !(0.01..=20.0).contains(&x) {
            return Err(format!(
                "--levels: {s:?}: between 0.01 and 20 times capacity"
            ));
        }
        Ok(Level {
            name: format!("{x}x"),
            parts: vec![(Class::Default, x)],
        })
    }

    /// A comma-separated list; `none` for none (only the workloads run).
    fn parse_list(s: &str) -> Result<Vec<Level>, String> {
        if s.trim() == "none" {
            return Ok(Vec::new());
        }
        let v: Vec<Level> = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Level::parse)
            .collect::<Result<_, _>>()?;
        if v.is_empty() || v.len() > 20 {
            return Err("--levels: between 1 and 20 levels".into());
        }
        Ok(v)
    }

    /// The offered load, a multiple of capacity.
    fn multiple(&self) -> f64 {
        self.parts.iter().map(|p| p.1).sum()
    }

    fn uniform(&self) -> bool {
        self.parts.len() == 1
    }
}

/// Hands out classes in the proportions of a level's parts, smoothly
/// interleaved (nginx's smooth weighted round robin), the same sequence on
/// every contender.
struct ClassPicker {
    parts: Vec<(Class, f64)>,
    credit: Vec<f64>,
    total: f64,
}

impl ClassPicker {
    fn new(parts: &[(Class, f64)]) -> Self {
        ClassPicker {
            parts: parts.to_vec(),
            credit: vec![0.0; parts.len()],
            total: parts.iter().map(|p| p.1).sum(),
        }
    }

    fn next(&mut self) -> Class {
        let mut best = 0;
        for (k, (_, w)) in self.parts.iter().enumerate() {
            self.credit[k] += w;
            if self.credit[k] > self.credit[best] {
                best = k;
            }
        }
        self.credit[best] -= self.total;
        self.parts[best].0
    }
}

// === impl Contender ===

/// What became of one task, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Success,
    /// Refused without being served: the engine's rejections, HAProxy's
    /// 503, tower's `Overloaded`.
    Refused,
    /// Any other failure.
    Failed,
    /// Unanswered after the client's patience.
    GaveUp,
}

pub(crate) enum Contender {
    Engine(Dispatcher),
    Tower(ShedPeer),
    Haproxy { client: awc::Client, url: String },
}

impl Contender {
    /// Sends task `i` of class `class` now; the future is its answer. The
    /// engine's task carries `deadline` (from now) when given; the peers
    /// are not told it.
    pub(crate) fn send(
        &self,
        i: usize,
        class: Class,
        deadline: Option<Duration>,
    ) -> LocalBoxFuture<'static, Answer> {
        let path = format!("overload/{i}");
        match self {
            Contender::Engine(d) => {
                let mut task = with_priority(Task::get("bench", format!("/{path}")), class);
                if let Some(d) = deadline {
                    task = task.deadline_in(d);
                }
                let sub = d.submit(task);
                Box::pin(async move {
                    let r = sub.await;
                    if r.is_success() {
                        Answer::Success
                    } else if r.is_rejected() {
                        Answer::Refused
                    } else {
                        Answer::Failed
                    }
                })
            }
            Contender::Tower(t) => {
                let t = t.clone();
                Box::pin(async move {
                    match t.get(i).await {
                        ShedAnswer::Success => Answer::Success,
                        ShedAnswer::Refused => Answer::Refused,
                        ShedAnswer::Failed => Answer::Failed,
                    }
                })
            }
            Contender::Haproxy { client, url } => {
                let req = client.get(format!("{url}{path}")).send();
                Box::pin(async move {
                    match req.await {
                        Ok(mut res) => {
                            let status = res.status().as_u16();
                            let body = res.body().limit(64 * 1024).await.is_ok();
                            match status {
                                200..=299 if body => Answer::Success,
                                // HAProxy's own answer to a queue timeout.
                                503 => Answer::Refused,
                                _ => Answer::Failed,
                            }
                        }
                        Err(_) => Answer::Failed,
                    }
                })
            }
        }
    }
}

// === the open loop ===

#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) class: Class,
    /// Intended start, from the level's start.
    pub(crate) intended: Duration,
    /// From the intended start to the answer.
    pub(crate) latency: Duration,
    /// From the call (the sender's, once its schedule let it) to the
    /// answer: the time to refuse without the sender's own lag.
    pub(crate) since_call: Duration,
    pub(crate) answer: Answer,
}

pub(crate) struct LevelRun {
    pub(crate) samples: Vec<Sample>,
    /// How far behind its schedule the sender was at worst.
    pub(crate) max_lag: Duration,
}

/// Sends `level` to `who` for `duration` on schedule, whatever happened to
/// the earlier tasks, and waits for every answer (at most `patience` after
/// each task's intended start).
async fn run_level(
    who: &Contender,
    level: &Level,
    capacity: f64,
    duration: Duration,
    patience: Duration,
) -> LevelRun {
    let rate = (level.multiple() * capacity).max(1.0);
    let n = ((rate * duration.as_secs_f64()).round() as usize).clamp(1, MAX_TASKS_PER_LEVEL);
    let mut classes = ClassPicker::new(&level.parts);
    let schedule: Vec<(Duration, Class)> = (0..n)
        .map(|i| (Duration::from_secs_f64(i as f64 / rate), classes.next()))
        .collect();
    let t0 = Instant::now() + Duration::from_millis(20);
    run_schedule(who, &schedule, t0, None, patience).await
}

/// Sends task `i` of `schedule` to `who` at `t0 + schedule[i].0`, whatever
/// happened to the earlier tasks, and waits for every answer (at most
/// `patience` after each task's intended start). The engine's tasks carry
/// `deadline`.
pub(crate) async fn run_schedule(
    who: &Contender,
    schedule: &[(Duration, Class)],
    t0: Instant,
    deadline: Option<Duration>,
    patience: Duration,
) -> LevelRun {
    let schedule = &schedule[..schedule.len().min(MAX_TASKS_PER_LEVEL)];
    let samples = Rc::new(RefCell::new(Vec::with_capacity(schedule.len())));
    let mut handles = Vec::with_capacity(schedule.len());
    let mut max_lag = Duration::ZERO;
    for (i, &(at, class)) in schedule.iter().enumerate() {
        let intended = t0 + at;
        pace_until(intended).await;
        let called = Instant::now();
        max_lag = max_lag.max(called.saturating_duration_since(intended));
        let fut = who.send(i, class, deadline);
        let s = samples.clone();
        handles.push(actix_rt::spawn(async move {
            let answer = tokio::time::timeout_at(intended + patience, fut)
                .await
                .unwrap_or(Answer::GaveUp);
            let answered = Instant::now();
            s.borrow_mut().push(Sample {
                class,
                intended: intended - t0,
                latency: answered.saturating_duration_since(intended),
                since_call: answered.saturating_duration_since(called),
                answer,
            });
        }));
    }
    // Every task ends by its patience; the margin only bounds a bug.
    let all = futures::future::join_all(handles.iter_mut());
    let _ = actix_rt::time::timeout(patience + Duration::from_secs(2), all).await;
    for h in &handles {
        h.abort();
    }
    let samples = std::mem::take(&mut *samples.borrow_mut());
    LevelRun { samples, max_lag }
}

/// Waits until `intended`, within microseconds rather than the timer's
/// millisecond: tokio's timer fires on the first millisecond tick at or
/// after a deadline, which alone would put up to 1 ms of the sender's own
/// lag into every latency measured from the intended start. So the timer
/// wakes the sender a tick early, and it yields to the other tasks of its
/// thread (the contender's among them) until the instant comes.
async fn pace_until(intended: Instant) {
    const TICK: Duration = Duration::from_millis(1);
    let now = Instant::now();
    if intended > now + TICK {
        actix_rt::time::sleep_until(intended - TICK).await;
    }
    while Instant::now() < intended {
        tokio::task::yield_now().await;
    }
}

// === impl Tally ===

/// The latest intended start whose success latency counts: an SLO (or
/// deadline) `slo` before the end of a level of `length`, so the drain
/// after the arrivals stop is left out; the whole level when that would
/// leave nothing after the `warmup` (a short smoke level, a long SLO).
pub(crate) fn latency_until(length: Duration, slo: Duration, warmup: Duration) -> Duration {
    match length.checked_sub(slo) {
        Some(until) if until > warmup => until,
        _ => length,
    }
}

/// Counts and latencies of one class (or all) of one level.
pub(crate) struct Tally {
    sent: u64,
    ok: u64,
    good: u64,
    refused: u64,
    failed: u64,
    gave_up: u64,
    ok_hist: Histogram<u64>,
    refuse_hist: Histogram<u64>,
    refuse_call_hist: Histogram<u64>,
}

impl Tally {
    pub(crate) fn new() -> Self {
        Tally {
            sent: 0,
            ok: 0,
            good: 0,
            refused: 0,
            failed: 0,
            gave_up: 0,
            ok_hist: hist(),
            refuse_hist: hist(),
            refuse_call_hist: hist(),
        }
    }

    /// Counts a task that started inside the measured window; its latency,
    /// if it succeeded, only when it started by `until`. A task that
    /// started within its time of the level's end may be served in the
    /// drain after the arrivals stop, late but still in time: its latency
    /// tells what a lull does, not what the load does (the simulator's p99
    /// leaves out the end too).
    pub(crate) fn add(&mut self, s: &Sample, slo: Duration, until: Duration) {
        self.sent += 1;
        match s.answer {
            Answer::Success => {
                self.ok += 1;
                self.good += u64::from(s.latency <= slo);
                if s.intended <= until {
                    record(&mut self.ok_hist, s.latency);
                }
            }
            Answer::Refused => {
                self.refused += 1;
                record(&mut self.refuse_hist, s.latency);
                record(&mut self.refuse_call_hist, s.since_call);
            }
            Answer::Failed => self.failed += 1,
            Answer::GaveUp => self.gave_up += 1,
        }
    }

    pub(crate) fn summary(&self, secs: f64, capacity: f64) -> Summary {
        let secs = secs.max(1e-9);
        let goodput = self.good as f64 / secs;
        Summary {
            offered_per_sec: round(self.sent as f64 / secs, 1),
            goodput_per_sec: round(goodput, 1),
            goodput_share_of_capacity: round(goodput / capacity, 4),
            sent: self.sent,
            succeeded: self.ok,
            within_slo: self.good,
            success_share: round(self.ok as f64 / self.sent.max(1) as f64, 5),
            refused: self.refused,
            failed: self.failed,
            gave_up: self.gave_up,
            success_latency: rounded(Lat::of(&self.ok_hist)),
            refusal_latency: rounded(Lat::of(&self.refuse_hist)),
            refusal_since_call: rounded(Lat::of(&self.refuse_call_hist)),
        }
    }
}

/// `v` to `digits` decimals (the result files stay small and readable).
fn round(v: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (v * k).round() / k
}

/// A latency summary to the µs.
fn rounded(l: Lat) -> Lat {
    Lat {
        mean_ms: round(l.mean_ms, 3),
        p50_ms: round(l.p50_ms, 3),
        p99_ms: round(l.p99_ms, 3),
        p999_ms: round(l.p999_ms, 3),
        max_ms: round(l.max_ms, 3),
        ..l
    }
}

/// What a level measured, for one class or all: the tasks that started
/// after the warm-up. Goodput is those that succeeded within the SLO over
/// the measured time, which in a steady state is the rate at which such
/// successes come (a level too short to settle, as in a smoke run, can
/// read over capacity: what was served just after the level counts too).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub(crate) offered_per_sec: f64,
    pub(crate) goodput_per_sec: f64,
    pub(crate) goodput_share_of_capacity: f64,
    pub(crate) sent: u64,
    pub(crate) succeeded: u64,
    pub(crate) within_slo: u64,
    pub(crate) success_share: f64,
    pub(crate) refused: u64,
    pub(crate) failed: u64,
    pub(crate) gave_up: u64,
    pub(crate) success_latency: Lat,
    pub(crate) refusal_latency: Lat,
    /// The time to refuse from the call, not from the intended start.
    pub(crate) refusal_since_call: Lat,
}

#[derive(Debug, Clone, Serialize)]
struct LevelResult {
    contender: String,
    level: String,
    multiple: f64,
    all: Summary,
    /// Per class, when the level has several.
    classes: Vec<(Class, Summary)>,
    /// Refusals of tasks that started after [`RECOVERY_AFTER`] (or half the
    /// level).
    refused_late: u64,
    /// The most requests that waited at once inside one backend.
    backend_peak_waiting: u64,
    sender_max_lag_ms: f64,
}

struct Params {
    duration: Duration,
    warmup: Duration,
    patience: Duration,
    slo: Duration,
    capacity: f64,
}

fn summarize(name: &str, level: &Level, run: &LevelRun, peak: u64, p: &Params) -> LevelResult {
    let secs = (p.duration - p.warmup).as_secs_f64();
    let late_from = RECOVERY_AFTER.min(p.duration / 2);
    let mut all = Tally::new();
    let mut by: Vec<(Class, Tally)> = level.parts.iter().map(|c| (c.0, Tally::new())).collect();
    let mut refused_late = 0;
    let until = latency_until(p.duration, p.slo, p.warmup);
    for s in run.samples.iter().filter(|s| s.intended >= p.warmup) {
        all.add(s, p.slo, until);
        if let Some((_, t)) = by.iter_mut().find(|(c, _)| *c == s.class) {
            t.add(s, p.slo, until);
        }
        if s.answer == Answer::Refused && s.intended >= late_from {
            refused_late += 1;
        }
    }
    LevelResult {
        contender: name.to_owned(),
        level: level.name.clone(),
        multiple: level.multiple(),
        all: all.summary(secs, p.capacity),
        // One class is the whole level: no need to say it twice.
        classes: if by.len() > 1 {
            by.iter()
                .map(|(c, t)| (*c, t.summary(secs, p.capacity)))
                .collect()
        } else {
            Vec::new()
        },
        refused_late,
        backend_peak_waiting: peak,
        sender_max_lag_ms: round(run.max_lag.as_secs_f64() * 1e3, 2),
    }
}

// === engine configs ===

/// The engine's config from a named JSON snippet (see [`ENGINE_CONFIGS`]).
pub(crate) fn engine_config(name: &str, snippet: &str, urls: &[String]) -> Result<Config, String> {
    let extra: Value = serde_json::from_str(snippet)
        .map_err(|e| format!("engine config {name:?}: not JSON: {e}"))?;
    let Value::Object(mut extra) = extra else {
        return Err(format!("engine config {name:?}: not a JSON object"));
    };
    let each = match extra.remove("each_endpoint") {
        None => serde_json::Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(format!(
                "engine config {name:?}: each_endpoint: not an object"
            ))
        }
    };
    let endpoints: Vec<Value> = urls
        .iter()
        .map(|u| {
            let mut e = serde_json::Map::new();
            e.insert("address".into(), json!(u));
            e.extend(each.clone());
            Value::Object(e)
        })
        .collect();
    let mut svc = serde_json::Map::new();
    svc.insert("name".into(), json!("bench"));
    svc.insert("endpoints".into(), json!(endpoints));
    svc.extend(extra);
    let text = json!({ "services": [svc] }).to_string();
    Config::from_json(&text).map_err(|e| format!("engine config {name:?} refused: {e}"))
}

/// [`ENGINE_CONFIGS`] and those of `--engine-config NAME=JSON`.
fn engine_configs(cli: &Cli) -> Result<Vec<(String, String)>, String> {
    let slo = format!("{}ms", cli.slo_ms.clamp(1, 60_000));
    let mut v: Vec<(String, String)> = ENGINE_CONFIGS
        .iter()
        .map(|(n, j)| {
            let name = n.replace("slo", &format!("slo {slo}"));
            (name, j.replace(SLO_TOKEN, &slo))
        })
        .collect();
    for arg in &cli.engine_config {
        let (name, snippet) = arg
            .split_once('=')
            .ok_or_else(|| format!("--engine-config {arg:?}: expected NAME=JSON"))?;
        v.push((format!("engine, {}", name.trim()), snippet.to_owned()));
    }
    Ok(v)
}

// === the scenario ===

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let capacity = (BACKENDS * WORKERS) as f64 * 1000.0 / SERVICE_MS as f64;
    let secs = pick(cli.duration, cli.smoke, 0.3, 10.0).clamp(0.1, MAX_LEVEL_SECS);
    let duration = Duration::from_secs_f64(secs);
    let p = Params {
        duration,
        warmup: duration.mul_f64(WARMUP_SHARE).min(MAX_WARMUP),
        patience: Duration::from_secs(if cli.smoke { 1 } else { 10 }),
        slo: Duration::from_millis(cli.slo_ms.clamp(1, 60_000)),
        capacity,
    };
    let default_levels = if cli.smoke {
        "0.5,4,mixed,0.5"
    } else {
        "0.5,1,2,4,mixed,0.5"
    };
    let levels = Level::parse_list(cli.levels.as_deref().unwrap_or(default_levels))?;
    let configs = engine_configs(cli)?;
    let mut rep = Report::new(
        cli,
        "overload",
        json!({"backends": BACKENDS, "workers_per_backend": WORKERS, "service_ms": SERVICE_MS,
               "capacity_per_sec": capacity, "level_secs": secs,
               "warmup_secs": p.warmup.as_secs_f64(), "patience_secs": p.patience.as_secs_f64(),
               "slo_ms": p.slo.as_millis() as u64,
               "levels": levels.iter().map(|l| json!({"name": l.name, "multiple": l.multiple()}))
                   .collect::<Vec<_>>(),
               "engine_configs": configs.iter().map(|(n, j)| json!({"name": n, "service": j}))
                   .collect::<Vec<_>>(),
               "tower": format!("LoadShed over balance::p2c::Balance over PeakEwmaDiscover over \
                                 limit::ConcurrencyLimit({WORKERS}) per backend, hyper-util"),
               "haproxy": format!("balance leastconn, maxconn {WORKERS} per server, \
                                   timeout queue {HAPROXY_QUEUE_MS}ms, retries 0, nbthread 1")}),
    );
    let haproxy_bin = haproxy::find_or_install(!cli.no_install_haproxy);
    if let Err(why) = &haproxy_bin {
        eprintln!("overload: haproxy skipped: {why}");
        rep.note(format!("HAProxy SKIPPED: {why}"));
    }
    let workload_list = crate::workloads::selected(cli)?;
    let mut results: Vec<LevelResult> = Vec::new();
    if !levels.is_empty() {
        let max_secs = (levels.len() as f64 * (secs + p.patience.as_secs_f64() + 3.0) + 60.0)
            * (configs.len() + 2) as f64;
        let mut backend = BackendProc::spawn_capped(
            BACKENDS,
            SERVICE_MS,
            WORKERS,
            cli.backend_workers,
            max_secs.ceil() as u64,
        )?;
        let urls = backend.urls();

        let mut contenders: Vec<(String, Contender)> = Vec::new();
        for (name, snippet) in &configs {
            let cfg = engine_config(name, snippet, &urls)?;
            let d = Dispatcher::start(cfg).map_err(|e| format!("{name}: {e}"))?;
            contenders.push((name.clone(), Contender::Engine(d)));
        }
        contenders.push((
            format!("tower LoadShed + ConcurrencyLimit({WORKERS}) + p2c"),
            Contender::Tower(ShedPeer::new(&urls, &[WORKERS], p.patience)),
        ));
        let ha = match &haproxy_bin {
            Ok(bin) => Some(Haproxy::start_overload(
                bin,
                &backend.ports,
                &[WORKERS],
                Duration::from_millis(HAPROXY_QUEUE_MS),
                Duration::from_secs(5),
            )?),
            Err(_) => None,
        };
        if let Some(h) = &ha {
            contenders.push((
                format!("HAProxy maxconn {WORKERS} + timeout queue {HAPROXY_QUEUE_MS}ms"),
                Contender::Haproxy {
                    client: bare_client(p.patience),
                    url: h.url(),
                },
            ));
        }

        if let Some(only) = &cli.only {
            contenders.retain(|(name, _)| name.contains(only.as_str()));
            rep.note(format!("Only the contenders named like `{only}`."));
        }
        for (name, who) in &contenders {
            // Connections opened before the first level: a few rounds of one
            // request per worker.
            for round in 0..3 {
                let batch = (0..BACKENDS * WORKERS)
                    .map(|i| who.send(round * 100 + i, Class::Default, None));
                let _ = actix_rt::time::timeout(p.patience, futures::future::join_all(batch)).await;
            }
            for level in &levels {
                backend.start_schedule()?;
                let sheds_before = engine_sheds(who).await;
                let run = run_level(who, level, capacity, duration, p.patience).await;
                if let (Some(a), Some(b)) = (sheds_before, engine_sheds(who).await) {
                    eprintln!(
                        "overload: {name}: {}: the engine shed {} at intake, {} after waiting or \
                         displaced; the nodes' free/whole limits at the end: {:?}",
                        level.name,
                        b.1 - a.1,
                        (b.0 - a.0) - (b.1 - a.1),
                        b.2
                    );
                }
                let peak = backend.peaks()?.into_iter().max().unwrap_or(0);
                let r = summarize(name, level, &run, peak, &p);
                eprintln!(
                    "overload: {name}: {}: goodput {:.0}/s ({:.0} %), ok p50 {} p99 {} ms, \
                     {} refused (p99 {} ms), {} failed, {} gave up",
                    r.level,
                    r.all.goodput_per_sec,
                    r.all.goodput_share_of_capacity * 100.0,
                    ms(r.all.success_latency.p50_ms),
                    ms(r.all.success_latency.p99_ms),
                    r.all.refused,
                    ms(r.all.refusal_latency.p99_ms),
                    r.all.failed,
                    r.all.gave_up
                );
                results.push(r);
            }
            if let Contender::Engine(d) = who {
                d.shutdown(Duration::from_secs(2)).await;
            }
            // Let what a contender left inside the backends drain.
            actix_rt::time::sleep(Duration::from_millis(if cli.smoke { 100 } else { 1000 })).await;
        }
        drop(contenders);
        drop(ha);
        drop(backend);
    }

    let knobs = crate::workloads::Knobs {
        level: duration,
        warmup: p.warmup,
        patience: p.patience,
        drain: Duration::from_millis(if cli.smoke { 100 } else { 1000 }),
    };
    let worked = crate::workloads::run(cli, &workload_list, &knobs, &haproxy_bin).await?;

    rep.body = if results.is_empty() {
        String::new()
    } else {
        tables(&results)
    };
    rep.body.push_str(&crate::workloads::tables(&worked));
    if !results.is_empty() {
        chart(cli, &mut rep, &results, &levels, capacity);
    }
    targets(&mut rep, &results, &levels, &configs, &p);
    crate::workloads::targets(&mut rep, &worked, haproxy_bin.is_ok());
    rep.results = json!({"levels": results, "workloads": worked});
    rep.note(format!(
        "Open loop: each contender gets the levels in order, {secs} s each, on schedule (latency \
         from each task's intended start); figures count the tasks that started after the first \
         {:.1} s of each level; the success p50 and p99, those that started an SLO or more before \
         its end (later ones may be served in the drain after the arrivals stop). Capacity: {BACKENDS} backends x {WORKERS} workers / {SERVICE_MS} ms \
         = {capacity:.0} tasks/s, the rest queueing inside the backends. Goodput: successes within \
         {} ms per second. Refused: the engine's rejections, HAProxy's 503 (its queue timeout), \
         tower's Overloaded. The client gives a task up after {:.0} s (dropping its handle: the engine cuts the task's attempt, while the backend may still be working on it). \
         'Sender lag': how far behind its schedule the client fell at worst (a busy machine \
         shows here first). 'From the call': the refusal p99 from the moment the sender made \
         the call to the answer, without its lag behind the schedule (tower's call runs at its \
         future's first poll, so its figure also holds one spawn's wait). 'Unloaded' is each contender's first level at or below 0.5x. The engine is told \
         each task's class (Task::priority); HAProxy and tower have no classes, so theirs are \
         only the bench's labels.",
        p.warmup.as_secs_f64(),
        p.slo.as_millis(),
        p.patience.as_secs_f64(),
    ));
    Ok(rep.finish())
}

/// The engine's sheds so far, those made at intake, and each node's
/// free and whole concurrency limits now (`None`: not the engine).
async fn engine_sheds(who: &Contender) -> Option<(u64, u64, Vec<String>)> {
    let Contender::Engine(d) = who else {
        return None;
    };
    let stats = d.stats().await;
    let svc = stats.service("bench")?;
    let q = &svc.queue;
    let limits = svc
        .nodes
        .iter()
        .map(|n| format!("{}/{}", n.free_limit, n.concurrency_limit))
        .collect();
    Some((q.shed, q.shed_at_intake, limits))
}

/// One figure of a summary.
type Pick = fn(&Summary) -> f64;

fn tables(results: &[LevelResult]) -> String {
    let rows = results
        .iter()
        .map(|r| {
            vec![
                r.contender.clone(),
                r.level.clone(),
                format!("{:.0}", r.all.offered_per_sec),
                format!(
                    "{:.0} ({:.0} %)",
                    r.all.goodput_per_sec,
                    r.all.goodput_share_of_capacity * 100.0
                ),
                ms(r.all.success_latency.p50_ms),
                ms(r.all.success_latency.p99_ms),
                r.all.refused.to_string(),
                if r.all.refused > 0 {
                    ms(r.all.refusal_latency.p99_ms)
                } else {
                    "-".into()
                },
                if r.all.refused > 0 {
                    ms(r.all.refusal_since_call.p99_ms)
                } else {
                    "-".into()
                },
                format!("{} / {}", r.all.failed, r.all.gave_up),
                r.backend_peak_waiting.to_string(),
                ms(r.sender_max_lag_ms),
            ]
        })
        .collect();
    let mut md = table(
        &[
            "contender",
            "load",
            "offered/s",
            "goodput/s (of capacity)",
            "ok p50 ms",
            "ok p99 ms",
            "refused",
            "refusal p99 ms",
            "from the call",
            "failed / gave up",
            "peak backend queue",
            "sender lag ms",
        ],
        rows,
    );
    let class_rows: Vec<Vec<String>> = results
        .iter()
        .filter(|r| r.classes.len() > 1)
        .flat_map(|r| {
            r.classes.iter().map(move |(c, s)| {
                vec![
                    r.contender.clone(),
                    r.level.clone(),
                    c.name().to_owned(),
                    format!("{:.0}", s.offered_per_sec),
                    format!("{:.0}", s.goodput_per_sec),
                    format!("{:.2} %", s.success_share * 100.0),
                    ms(s.success_latency.p50_ms),
                    ms(s.success_latency.p99_ms),
                    s.refused.to_string(),
                    if s.refused > 0 {
                        ms(s.refusal_latency.p99_ms)
                    } else {
                        "-".into()
                    },
                ]
            })
        })
        .collect();
    if !class_rows.is_empty() {
        md.push_str("\nPer class, at the levels with several:\n\n");
        md.push_str(&table(
            &[
                "contender",
                "load",
                "class",
                "offered/s",
                "goodput/s",
                "success",
                "ok p50 ms",
                "ok p99 ms",
                "refused",
                "refusal p99 ms",
            ],
            class_rows,
        ));
    }
    md
}

/// Index of the first uniform level at or below 0.5x (the unloaded one).
fn unloaded(levels: &[Level]) -> Option<usize> {
    levels
        .iter()
        .position(|l| l.uniform() && l.multiple() <= 0.5)
}

/// Index of the last uniform level at or below 0.5x that follows a level
/// over capacity (the recovery one).
fn recovery(levels: &[Level]) -> Option<usize> {
    let first_over = levels.iter().position(|l| l.multiple() > 1.0)?;
    (first_over + 1..levels.len())
        .rev()
        .find(|&k| levels[k].uniform() && levels[k].multiple() <= 0.5)
}

/// The result of `contender` at level index `k` (results are in contender
/// order, levels in order within each).
fn at<'a>(
    results: &'a [LevelResult],
    levels: &[Level],
    contender: &str,
    k: usize,
) -> Option<&'a LevelResult> {
    results
        .iter()
        .filter(|r| r.contender == contender)
        .nth(k)
        .filter(|r| r.level == levels[k].name)
}

fn targets(
    rep: &mut Report,
    results: &[LevelResult],
    levels: &[Level],
    configs: &[(String, String)],
    p: &Params,
) {
    let over: Vec<usize> = (0..levels.len())
        .filter(|&k| levels[k].uniform() && [2.0, 4.0].contains(&levels[k].multiple()))
        .collect();
    let mixed = levels
        .iter()
        .position(|l| l.parts.iter().any(|c| c.0 == Class::Critical) && l.parts.len() > 1);
    let haproxy = results
        .iter()
        .find(|r| r.contender.starts_with("HAProxy"))
        .map(|r| r.contender.clone());
    let names = |ks: &[usize]| {
        ks.iter()
            .map(|&k| levels[k].name.clone())
            .collect::<Vec<_>>()
    };
    for (name, snippet) in configs {
        if !states_a_bound(snippet) {
            // No time stated: every task waits until it is served (or the
            // default queue capacity refuses it), so no time-based target
            // applies; what happened is reported.
            let (mut refused, mut gave_up) = (0, 0);
            for r in results.iter().filter(|r| &r.contender == name) {
                refused += r.all.refused;
                gave_up += r.all.gave_up;
            }
            rep.target(
                format!("{name}: states no time, so none applies"),
                "reported only",
                format!(
                    "{refused} refused (the default queue capacity), \
                     {gave_up} given up by the client's patience"
                ),
                None,
            );
            continue;
        }
        let base_p99 = unloaded(levels)
            .and_then(|k| at(results, levels, name, k))
            .map(|r| r.all.success_latency.p99_ms);
        if !over.is_empty() {
            let got: Vec<&LevelResult> = over
                .iter()
                .filter_map(|&k| at(results, levels, name, k))
                .collect();
            let list = |f: &dyn Fn(&LevelResult) -> String| {
                got.iter()
                    .map(|r| format!("{}: {}", r.level, f(r)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            rep.target(
                format!("{name}: goodput at {}", names(&over).join(" and ")),
                ">= 90 % of capacity",
                list(&|r| format!("{:.0} %", r.all.goodput_share_of_capacity * 100.0)),
                Some(got.iter().all(|r| r.all.goodput_share_of_capacity >= 0.9)),
            );
            rep.target(
                format!("{name}: success p99 at {}", names(&over).join(" and ")),
                match base_p99 {
                    Some(b) => format!("<= 2 x unloaded ({} ms)", ms(2.0 * b)),
                    None => "<= 2 x unloaded (no unloaded level)".into(),
                },
                list(&|r| format!("{} ms", ms(r.all.success_latency.p99_ms))),
                base_p99.map(|b| got.iter().all(|r| r.all.success_latency.p99_ms <= 2.0 * b)),
            );
            // From the intended start, as every latency here, and from the
            // call, without the sender's lag behind its schedule.
            let refusal: [(&str, Pick); 2] = [
                ("", |s| s.refusal_latency.p99_ms),
                (" from the call", |s| s.refusal_since_call.p99_ms),
            ];
            for (how, p99) in refusal {
                rep.target(
                    format!("{name}: refusal p99{how} at {}", names(&over).join(" and ")),
                    "<= 1 ms",
                    list(&|r| {
                        if r.all.refused > 0 {
                            format!("{} ms", ms(p99(&r.all)))
                        } else {
                            "none".into()
                        }
                    }),
                    Some(got.iter().all(|r| r.all.refused == 0 || p99(&r.all) <= 1.0)),
                );
            }
        }
        if let Some(r) = mixed.and_then(|k| at(results, levels, name, k)) {
            if let Some((_, c)) = r.classes.iter().find(|(c, _)| *c == Class::Critical) {
                rep.target(
                    format!("{name}: critical tasks at {}", r.level),
                    match base_p99 {
                        Some(b) => format!(
                            ">= 99.5 % succeed, p99 <= 1.5 x unloaded ({} ms)",
                            ms(1.5 * b)
                        ),
                        None => ">= 99.5 % succeed, p99 <= 1.5 x unloaded".into(),
                    },
                    format!(
                        "{:.2} %, p99 {} ms",
                        c.success_share * 100.0,
                        ms(c.success_latency.p99_ms)
                    ),
                    base_p99
                        .map(|b| c.success_share >= 0.995 && c.success_latency.p99_ms <= 1.5 * b),
                );
            }
        }
        if let Some(r) = recovery(levels).and_then(|k| at(results, levels, name, k)) {
            let after = RECOVERY_AFTER.min(p.duration / 2);
            rep.target(
                format!("{name}: back at {}", r.level),
                format!("no refusals after {:.1} s", after.as_secs_f64()),
                format!("{} refused", r.refused_late),
                Some(r.refused_late == 0),
            );
        }
        match &haproxy {
            Some(h) => {
                let pairs: Vec<(String, f64, f64)> = (0..levels.len())
                    .filter_map(|k| {
                        let e = at(results, levels, name, k)?;
                        let x = at(results, levels, h, k)?;
                        Some((
                            e.level.clone(),
                            e.all.goodput_per_sec,
                            x.all.goodput_per_sec,
                        ))
                    })
                    .collect();
                let worst = pairs
                    .iter()
                    .map(|(l, e, x)| (l, e / x.max(1e-9)))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                rep.target(
                    format!("{name}: goodput vs HAProxy's, every load"),
                    ">= 1.0 x",
                    worst.map_or("n/a".into(), |(l, r)| format!("worst {r:.2} x (at {l})")),
                    // A level where neither gets anything done is a tie.
                    Some(pairs.iter().all(|(_, e, x)| *e >= *x)),
                );
            }
            None => rep.target(
                format!("{name}: goodput vs HAProxy's, every load"),
                ">= 1.0 x",
                "skipped (not installed)",
                None,
            ),
        }
    }
}

/// `overload-goodput.svg`: goodput against offered load, one line per
/// contender, over the uniform levels (the first run of each multiple).
fn chart(cli: &Cli, rep: &mut Report, results: &[LevelResult], levels: &[Level], capacity: f64) {
    let mut shown: Vec<usize> = Vec::new();
    for (k, l) in levels.iter().enumerate() {
        if l.uniform() && !shown.iter().any(|&j| levels[j].multiple() == l.multiple()) {
            shown.push(k);
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.contender.as_str()) {
            names.push(&r.contender);
        }
    }
    let series: Vec<crate::charts::Curve<'_>> = names
        .iter()
        .map(|&name| {
            let mut points: Vec<(f64, f64)> = shown
                .iter()
                .filter_map(|&k| at(results, levels, name, k))
                .map(|r| (r.multiple, r.all.goodput_per_sec))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            crate::charts::Curve { name, points }
        })
        .collect();
    let path = out_dir(cli).join("overload-goodput.svg");
    match crate::charts::goodput(&path, "overload", &series, capacity) {
        Ok(()) => rep.note("Chart: `overload-goodput.svg`."),
        Err(e) => rep.note(format!("Chart not written: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mixed_level_sends_one_critical_task_in_five_evenly() {
        let l = Level::parse("mixed").unwrap();
        assert_eq!(l.multiple(), 2.0);
        let mut p = ClassPicker::new(&l.parts);
        let seq: Vec<Class> = (0..10).map(|_| p.next()).collect();
        let crit: Vec<usize> = (0..10).filter(|&i| seq[i] == Class::Critical).collect();
        assert_eq!(crit.len(), 2);
        assert_eq!(crit[1] - crit[0], 5);
    }

    #[test]
    fn levels_parse_with_or_without_x_and_refuse_nonsense() {
        let v = Level::parse_list("0.5,2x, mixed").unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[1].multiple(), 2.0);
        assert!(Level::parse_list("fast").unwrap_err().contains("--levels"));
        assert!(Level::parse_list("0").is_err());
        assert!(Level::parse_list("").is_err());
    }

    #[test]
    fn unloaded_and_recovery_levels_are_found() {
        let v = Level::parse_list("0.5,1,2,4,mixed,0.5").unwrap();
        assert_eq!(unloaded(&v), Some(0));
        assert_eq!(recovery(&v), Some(5));
        assert_eq!(recovery(&Level::parse_list("0.5,1").unwrap()), None);
    }

    #[test]
    fn engine_snippets_reach_every_endpoint() {
        let urls = vec![
            "http://127.0.0.1:1/".to_owned(),
            "http://127.0.0.1:2/".into(),
        ];
        let (name, snippet) = *ENGINE_CONFIGS
            .iter()
            .find(|(n, _)| n.contains("queue 100"))
            .expect("a config with a queue of 100");
        let cfg = engine_config(name, snippet, &urls).unwrap();
        assert_eq!(cfg.services[0].queue.capacity, 100);
        // Every config parses once the SLO is put in; only the defaults
        // state neither a time nor a capacity.
        for (n, j) in ENGINE_CONFIGS {
            let j = j.replace(SLO_TOKEN, "250ms");
            assert!(engine_config(n, &j, &urls).is_ok(), "{n}");
            assert_eq!(states_a_bound(&j), *n != "engine defaults", "{n}");
        }
        let e = engine_config("x", r#"{"each_endpoint": 3}"#, &urls).unwrap_err();
        assert!(e.contains("each_endpoint"), "{e}");
        assert!(engine_config("x", r#"{"nope": 1}"#, &urls).is_err());
    }
}
