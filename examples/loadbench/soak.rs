//! `soak`: 1 M tasks with 1 h deadlines fed through a pool with hanging and
//! failing nodes; resident memory sampled at each quarter. Memory must be
//! bounded by what is live: a finished task's deadline timer, its sequence
//! number or its entry anywhere must not outlive it, so RSS stops growing
//! once the feed window is full (growth from the second quarter to the last
//! ≤ 5 %).
//!
//! Runs in a fresh child process (`loadbench soak-probe`) like `memory`, so
//! no earlier scenario's freed memory hides a growth.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use actix_dispatch::{Dispatcher, ErrorKind, Instant, Task};
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::common::{self, count, pick, rss_bytes};
use crate::report::{table, Report};
use crate::Cli;

/// Nodes of the pool: healthy ones answer at once, the others never answer
/// (hang until the attempt's timeout) or always fail.
const HEALTHY: usize = 4;
const HANGING: usize = 1;
const FAILING: usize = 1;

/// Each task's deadline: far past the run, so every deadline timer outlives
/// its task unless the engine removes it.
const DEADLINE: Duration = Duration::from_secs(3600);

/// What one node does with every request.
#[derive(Clone, Copy)]
enum Behaviour {
    Answer,
    Hang,
    Fail,
}

struct SoakTransport(Behaviour);

impl Transport for SoakTransport {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        match self.0 {
            Behaviour::Answer => Box::pin(std::future::ready(Ok(
                HttpReply::new(200).with_body(Bytes::from_static(b"ok"))
            ))),
            Behaviour::Hang => Box::pin(futures::future::pending()),
            Behaviour::Fail => Box::pin(std::future::ready(Err(TransportError::new(
                ErrorKind::Connect,
                "soak: refused",
            )))),
        }
    }
}

fn urls() -> Vec<String> {
    common::fake_urls(HEALTHY + HANGING + FAILING)
}

fn soak_factory() -> TransportFactory {
    let urls = urls();
    Arc::new(move |addr: &str| {
        let i = urls.iter().position(|u| u == addr).unwrap_or(0);
        let b = if i < HEALTHY {
            Behaviour::Answer
        } else if i < HEALTHY + HANGING {
            Behaviour::Hang
        } else {
            Behaviour::Fail
        };
        Rc::new(SoakTransport(b)) as Rc<dyn Transport>
    })
}

/// One RSS sample, taken when a quarter of the tasks were answered.
struct Sample {
    answered: usize,
    rss: u64,
    live: u64,
    secs: f64,
}

/// The hidden `soak-probe` scenario: the run itself, in a fresh process,
/// printed as one `PROBE {json}` line.
pub fn probe_main(cli: &Cli) -> i32 {
    match actix_rt::System::new().block_on(probe(cli)) {
        Ok(v) => {
            println!("PROBE {v}");
            0
        }
        Err(e) => {
            eprintln!("soak-probe: {e}");
            1
        }
    }
}

async fn probe(cli: &Cli) -> Result<Value, String> {
    let n = pick(cli.tasks, cli.smoke, 4_000, 1_000_000);
    let window = pick(cli.window, cli.smoke, 256, 4096);
    let max = Duration::from_secs_f64(pick(cli.duration, cli.smoke, 60.0, 900.0));
    let cfg = common::engine_config(
        "p2c",
        &urls(),
        64,
        json!({
            "timeout": "20ms",
            "queue": {"capacity": window},
            "retry": {"max_retries": 2, "backoff_base": "1ms", "backoff_max": "5ms"},
            "breaker": {"consecutive_failures": 5, "open_for": "100ms", "max_open_for": "1s"},
        }),
    )?;
    let d = Dispatcher::builder(cfg)
        .transport(soak_factory())
        .start()
        .map_err(|e| e.to_string())?;
    d.stats().await; // actors started

    // Which ids were answered: one bit each, allocated before the baseline.
    let mut seen = vec![0u64; n.div_ceil(64)];
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let tasks = futures::stream::iter(0..n).map(|i| {
        Task::get("bench", format!("/items/{i}"))
            .id(i as u64)
            .deadline_in(DEADLINE)
    });
    let mut results = Box::pin(d.feed(tasks));
    let (mut ok, mut failed, mut rejected, mut twice, mut answered) = (0u64, 0u64, 0u64, 0u64, 0);
    let mut samples: Vec<Sample> = Vec::new();
    let mut timed_out = false;
    while answered < n {
        let left = max.saturating_sub(t0.elapsed());
        let Ok(next) = actix_rt::time::timeout(left, results.next()).await else {
            timed_out = true;
            break;
        };
        let Some(r) = next else { break };
        answered += 1;
        let id = r.id as usize;
        match seen.get_mut(id / 64) {
            Some(w) if *w & (1 << (id % 64)) == 0 => *w |= 1 << (id % 64),
            _ => twice += 1,
        }
        if r.is_success() {
            ok += 1;
        } else if r.is_rejected() {
            rejected += 1;
        } else {
            failed += 1;
        }
        if answered % (n / 4).max(1) == 0 && samples.len() < 4 {
            let q = &d.stats().await.services[0].queue;
            samples.push(Sample {
                answered,
                rss: rss_bytes(),
                live: q.queued + q.in_flight,
                secs: t0.elapsed().as_secs_f64(),
            });
            eprintln!(
                "soak: {} answered, {} live, RSS {:.1} MB",
                count(answered as f64),
                q.queued + q.in_flight,
                rss_bytes() as f64 / 1048576.0
            );
        }
    }
    drop(results);
    let secs = t0.elapsed().as_secs_f64();
    let stats = d.stats().await;
    let q = stats.services[0].queue.clone();
    d.shutdown(Duration::from_secs(2)).await;
    let mut notes = Vec::new();
    if timed_out {
        notes.push(format!(
            "stopped after {max:?}: only {answered} of {n} tasks answered"
        ));
    }
    if answered != n || twice != 0 {
        notes.push(format!(
            "{answered} answers for {n} tasks, {twice} of them for an id already answered"
        ));
    }
    let samples: Vec<Value> = samples
        .iter()
        .map(|s| {
            json!({"answered": s.answered, "rss": s.rss, "live": s.live, "secs": s.secs,
                   "delta_bytes": s.rss.saturating_sub(rss0),
                   "bytes_per_live_task": s.rss.saturating_sub(rss0) as f64 / s.live.max(1) as f64})
        })
        .collect();
    Ok(json!({
        "tasks": n, "window": window, "answered": answered, "answered_twice": twice,
        "succeeded": ok, "failed": failed, "rejected": rejected, "secs": secs,
        "rss_before": rss0, "samples": samples,
        "stats": {"submitted": q.submitted, "succeeded": q.succeeded, "failed": q.failed,
                  "rejected": q.rejected, "queued": q.queued, "in_flight": q.in_flight},
        "notes": notes,
    }))
}

/// Runs `soak-probe` as a child process and reads its line.
fn run_probe(cli: &Cli, n: usize, window: usize) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("soak-probe")
        .arg("--tasks")
        .arg(n.to_string())
        .arg("--window")
        .arg(window.to_string());
    if let Some(s) = cli.duration {
        cmd.arg("--duration").arg(s.to_string());
    }
    if cli.smoke {
        cmd.arg("--smoke");
    }
    common::run_probe(cmd, "soak-probe")
}

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let n = pick(cli.tasks, cli.smoke, 4_000, 1_000_000);
    let window = pick(cli.window, cli.smoke, 256, 4096);
    let mut rep = Report::new(
        cli,
        "soak",
        json!({"tasks": n, "window": window, "deadline_secs": DEADLINE.as_secs(),
               "healthy_nodes": HEALTHY, "hanging_nodes": HANGING, "failing_nodes": FAILING,
               "attempt_timeout_ms": 20, "max_retries": 2}),
    );
    let probe = run_probe(cli, n, window)?;
    for note in probe["notes"].as_array().into_iter().flatten() {
        if let Some(s) = note.as_str() {
            rep.note(s);
        }
    }
    let samples = probe["samples"].as_array().cloned().unwrap_or_default();
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let mb = |b: f64| format!("{:.1}", b / 1048576.0);
    let rows: Vec<Vec<String>> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vec![
                format!("Q{}", i + 1),
                count(f(s, "answered")),
                count(f(s, "live")),
                mb(f(s, "rss")),
                mb(f(s, "delta_bytes")),
                if f(s, "live") > 0.0 {
                    format!("{:.0}", f(s, "bytes_per_live_task"))
                } else {
                    "-".into()
                },
                format!("{:.1}", f(s, "secs")),
            ]
        })
        .collect();
    let answered = f(&probe, "answered");
    let twice = f(&probe, "answered_twice");
    rep.target(
        "every task answered exactly once",
        format!("{} answers, none twice", count(n as f64)),
        format!("{} answers, {} twice", count(answered), count(twice)),
        Some(answered == n as f64 && twice == 0.0),
    );
    let growth = if samples.len() == 4 {
        let (q2, q4) = (f(&samples[1], "rss"), f(&samples[3], "rss"));
        Some((q4 - q2) / q2.max(1.0) * 100.0)
    } else {
        None
    };
    rep.target(
        "RSS growth from the second quarter to the last",
        "<= 5 %",
        growth.map_or("not measured".into(), |g| format!("{g:.1} %")),
        growth.map(|g| g <= 5.0),
    );
    // Bytes per live task mid-run (Q2, Q3), when the feed window is full.
    let mid: Vec<f64> = samples
        .iter()
        .skip(1)
        .take(2)
        .map(|s| f(s, "bytes_per_live_task"))
        .collect();
    let per_live = mid.iter().sum::<f64>() / mid.len().max(1) as f64;
    let mut body = table(
        &[
            "quarter",
            "answered",
            "live",
            "RSS MB",
            "RSS delta MB",
            "bytes per live task",
            "secs",
        ],
        rows,
    );
    body.push_str(&format!(
        "\n{} tasks in {:.1} s: {} succeeded, {} failed, {} rejected; about {:.0} bytes of RSS \
         per live task mid-run.\n",
        count(answered),
        f(&probe, "secs"),
        count(f(&probe, "succeeded")),
        count(f(&probe, "failed")),
        count(f(&probe, "rejected")),
        per_live
    ));
    rep.body = body;
    rep.results = json!({
        "probe": probe,
        "growth_q2_to_q4_percent": growth,
        "bytes_per_live_task": per_live,
    });
    rep.note(format!(
        "Pool: {HEALTHY} nodes answering at once, {HANGING} never answering (attempt timeout 20 ms), \
         {FAILING} refusing every connection; p2c, breakers on, 2 retries. Every task has a {} s \
         deadline, far past the run, so a timer kept after its task ended would show as growth. \
         Fed with `Dispatcher::feed` ({} in flight, the queue's capacity). RSS is VmRSS of \
         /proc/self/status in a fresh child process (`loadbench soak-probe`), sampled when each \
         quarter of the tasks had been answered; bytes per live task is the RSS above the \
         baseline over the tasks queued or in flight at that moment.",
        DEADLINE.as_secs(),
        count(window as f64)
    ));
    Ok(rep.finish())
}
