//! `memory`: resident memory with 100 000 queued tasks and with 1000 nodes
//! in one pool, and the cost per task at pool sizes 3, 100 and 1000.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use actix_dispatch::{Dispatcher, Instant, Submission, Task};
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::common::{self, count, median, pick, rss_bytes};
use crate::overhead::{bare_round_trips, bare_round_trips_over, engine_tasks, start_engine};
use crate::report::{table, Report};
use crate::Cli;

/// A transport whose answers wait until the switch is set to true.
struct HeldTransport {
    release: watch::Receiver<bool>,
}

impl Transport for HeldTransport {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let mut rx = self.release.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|go| *go).await;
            Ok(HttpReply::new(200).with_body(Bytes::from_static(b"ok")))
        })
    }
}

fn held_factory(rx: watch::Receiver<bool>) -> TransportFactory {
    Arc::new(move |_addr: &str| {
        Rc::new(HeldTransport {
            release: rx.clone(),
        }) as Rc<dyn Transport>
    })
}

fn mb(b: f64) -> String {
    format!("{:.1}", b / (1024.0 * 1024.0))
}

/// Waits until the service holds `n` tasks (queued or in flight).
async fn wait_accepted(d: &Dispatcher, n: u64, max: Duration) -> Result<(u64, u64), String> {
    let start = Instant::now();
    loop {
        let s = d.stats().await;
        let q = &s.services[0].queue;
        if q.queued + q.in_flight >= n {
            return Ok((q.queued, q.in_flight));
        }
        if start.elapsed() > max {
            return Err(format!(
                "only {} of {n} tasks accepted after {max:?}",
                q.queued + q.in_flight
            ));
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The hidden `memory-probe` scenario: steps 1 and 2 in a fresh process (a
/// heap no earlier scenario has grown), printed as one `PROBE {json}` line.
pub fn probe_main(cli: &Cli) -> i32 {
    match actix_rt::System::new().block_on(probe(cli)) {
        Ok(v) => {
            println!("PROBE {v}");
            0
        }
        Err(e) => {
            eprintln!("memory-probe: {e}");
            1
        }
    }
}

async fn probe(cli: &Cli) -> Result<Value, String> {
    let queued_n = pick(cli.tasks, cli.smoke, 5_000, 100_000);
    let pool_n = 1000;
    let mut notes: Vec<String> = Vec::new();

    // --- 1. a pool of 1000 nodes (kept alive during 2, so that 2 cannot reuse its memory) ---
    let rss2 = rss_bytes();
    let big = start_engine("p2c", pool_n, 1024)?;
    big.stats().await; // every node started and answered
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    let rss3 = rss_bytes();
    let pool_delta = rss3.saturating_sub(rss2) as f64;
    eprintln!(
        "memory: {pool_n} nodes: +{} MB ({:.0} B/node)",
        mb(pool_delta),
        pool_delta / pool_n as f64
    );

    // --- 2. queued tasks ---
    let (tx, rx) = watch::channel(false);
    let urls = common::fake_urls(3);
    let cfg = common::engine_config(
        "p2c",
        &urls,
        10,
        // The delay control off: the queue is held for seconds on purpose,
        // and every released task must then succeed (none shed).
        json!({"timeout": "600s", "queue": {"capacity": 200_000, "delay": {"enabled": false}}}),
    )?;
    let d = Dispatcher::builder(cfg)
        .transport(held_factory(rx))
        .start()
        .map_err(|e| e.to_string())?;
    d.stats().await; // actors started
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    // `submit` enqueues at call; the caller keeps only the small `Submission`.
    let mut subs: Vec<Submission> = Vec::with_capacity(queued_n);
    for i in 0..queued_n {
        subs.push(d.submit(Task::get("bench", format!("/items/{i}"))));
    }
    let callers_bytes = subs.capacity() * std::mem::size_of::<Submission>();
    let (queued, in_flight) = wait_accepted(&d, queued_n as u64, Duration::from_secs(120)).await?;
    let accept_secs = t0.elapsed().as_secs_f64();
    let rss1 = rss_bytes();
    let delta = rss1.saturating_sub(rss0) as f64;
    eprintln!(
        "memory: {queued} queued + {in_flight} in flight: RSS {} -> {} MB (+{} MB, {:.0} B/task)",
        mb(rss0 as f64),
        mb(rss1 as f64),
        mb(delta),
        delta / queued_n as f64
    );
    let t1 = Instant::now();
    let _ = tx.send(true);
    let mut ok = 0usize;
    let all = futures::future::join_all(subs);
    match actix_rt::time::timeout(Duration::from_secs(120), all).await {
        Ok(results) => ok = results.iter().filter(|r| r.is_success()).count(),
        Err(_) => notes.push("the released tasks did not all finish within 120 s".into()),
    }
    let drain_secs = t1.elapsed().as_secs_f64();
    d.shutdown(Duration::from_secs(2)).await;
    big.shutdown(Duration::from_secs(2)).await;
    if ok != queued_n {
        notes.push(format!("only {ok} of {queued_n} released tasks succeeded"));
    }
    Ok(json!({
        "queued": {"tasks": queued_n, "queued": queued, "in_flight": in_flight,
                   "rss_before": rss0, "rss_after": rss1, "delta_bytes": delta,
                   "bytes_per_task": delta / queued_n as f64, "accept_secs": accept_secs,
                   "callers_bytes": callers_bytes,
                   "submission_bytes": std::mem::size_of::<Submission>(),
                   "drain_secs": drain_secs, "succeeded_after_release": ok},
        "pool": {"nodes": pool_n, "rss_before": rss2, "rss_after": rss3,
                 "delta_bytes": pool_delta, "bytes_per_node": pool_delta / pool_n as f64},
        "notes": notes,
    }))
}

/// Runs `memory-probe` as a child process and reads its line.
fn run_probe(cli: &Cli, queued_n: usize) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("memory-probe")
        .arg("--tasks")
        .arg(queued_n.to_string());
    if cli.smoke {
        cmd.arg("--smoke");
    }
    common::run_probe(cmd, "memory-probe")
}

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let queued_n = pick(cli.tasks, cli.smoke, 5_000, 100_000);
    let per_task_n = if cli.smoke { 2_000 } else { 100_000 };
    let rounds = pick(cli.rounds, cli.smoke, 1, 7);
    let window = cli.window.unwrap_or(1024);
    let pool_n = 1000;
    let mut rep = Report::new(
        cli,
        "memory",
        json!({"queued_tasks": queued_n, "queue_capacity": 200_000, "pool_nodes": pool_n,
               "per_task_runs": per_task_n, "rounds": rounds, "window": window}),
    );
    let probe = run_probe(cli, queued_n)?;
    let f = |a: &str, b: &str| probe[a][b].as_f64().unwrap_or(0.0);
    let ctl_delta = f("queued", "callers_bytes");
    let submission_bytes = f("queued", "submission_bytes");
    let delta = f("queued", "delta_bytes");
    let pool_delta = f("pool", "delta_bytes");
    let (queued, in_flight) = (f("queued", "queued"), f("queued", "in_flight"));
    let (accept_secs, drain_secs) = (f("queued", "accept_secs"), f("queued", "drain_secs"));
    for n in probe["notes"].as_array().into_iter().flatten() {
        if let Some(n) = n.as_str() {
            rep.note(n);
        }
    }

    // --- 3. cost per task against pool size ---
    let max = Duration::from_secs(30);
    let sizes = [3usize, 100, 1000];
    let modes = ["round_robin", "p2c"];
    let mut engines = Vec::new();
    for m in modes {
        for n in sizes {
            engines.push((m, n, start_engine(m, n, 1024)?));
        }
    }
    let warm = (per_task_n / 10).max(500);
    for (_, _, d) in &engines {
        engine_tasks(d, warm, window, max).await;
    }
    let mut bare = Vec::new();
    // The reference: bare round trips over as many echo actors as nodes.
    let mut bare_spread: Vec<(f64, f64)> = Vec::new();
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    for r in 0..rounds {
        bare.push(bare_round_trips(per_task_n, window, max).await.us_per_task);
        let over3 = bare_round_trips_over(3, per_task_n, window, max).await;
        let over1000 = bare_round_trips_over(1000, per_task_n, window, max).await;
        bare_spread.push((over3.us_per_task, over1000.us_per_task));
        // Rotate the order every round so no pool size always runs first.
        let k_all = engines.len();
        for j in 0..k_all {
            let k = (j + r) % k_all;
            let (m, n, d) = &engines[k];
            let run = engine_tasks(d, per_task_n, window, max).await;
            eprintln!(
                "memory: round {r}: {m} {n} nodes: {:.3} µs/task",
                run.us_per_task
            );
            us[k].push(run.us_per_task);
        }
    }
    for (_, _, d) in &engines {
        d.shutdown(Duration::from_secs(2)).await;
    }
    let bare_us = median(&bare);
    let spread_ratio = median(
        &bare_spread
            .iter()
            .map(|(a, b)| b / a.max(1e-9))
            .collect::<Vec<_>>(),
    );
    let spread3 = median(&bare_spread.iter().map(|s| s.0).collect::<Vec<_>>());
    let spread1000 = median(&bare_spread.iter().map(|s| s.1).collect::<Vec<_>>());
    let mut cost_rows = Vec::new();
    let mut cost_json = Vec::new();
    for m in modes {
        let mut row = vec![m.to_string()];
        let mut by_size = Vec::new();
        for n in sizes {
            let k = engines
                .iter()
                .position(|(em, en, _)| *em == m && *en == n)
                .expect("started above");
            let v = median(&us[k]);
            by_size.push(v);
            row.push(format!("{v:.3}"));
            cost_json.push(json!({"mode": m, "nodes": n, "us_per_task": v, "runs": us[k]}));
        }
        // Median of the per-round ratios: each round's two runs are close in
        // time, so the machine's drift cancels out.
        let (k3, k1000) = (
            engines
                .iter()
                .position(|(em, en, _)| *em == m && *en == 3)
                .expect("started"),
            engines
                .iter()
                .position(|(em, en, _)| *em == m && *en == 1000)
                .expect("started"),
        );
        let ratios: Vec<f64> = us[k1000]
            .iter()
            .zip(&us[k3])
            .map(|(a, b)| a / b.max(1e-9))
            .collect();
        let growth = median(&ratios);
        row.push(format!("{growth:.2}"));
        rep.target(
            format!("{m}: µs per task at 1000 nodes / at 3 nodes"),
            "<= 1.1 (does not grow with pool size)",
            format!("{growth:.2}"),
            Some(growth <= 1.1),
        );
        cost_rows.push(row);
    }

    let per_task = delta / queued_n as f64;
    let engine_delta = (delta - ctl_delta).max(0.0);
    rep.target(
        format!("RSS with {} queued tasks", count(queued_n as f64)),
        "< 100 MB",
        format!("{} MB", mb(delta)),
        Some(delta < 100.0 * 1024.0 * 1024.0),
    );
    let engine_per_task = engine_delta / queued_n as f64;
    rep.target(
        format!(
            "engine's own share per queued task ({} queued)",
            count(queued_n as f64)
        ),
        "<= 400 bytes",
        format!("{engine_per_task:.0} bytes ({} MB)", mb(engine_delta)),
        Some(engine_per_task <= 400.0),
    );
    let mut body = table(
        &["measurement", "RSS delta MB", "bytes each", "notes"],
        vec![
            vec![
                format!("{} tasks submitted, not answered", count(queued_n as f64)),
                mb(delta),
                format!("{per_task:.0}"),
                format!(
                    "{queued} queued + {in_flight} in flight (3 nodes x max_concurrent 10, transport \
                     holds every answer); the caller holds {} `Submission` futures; \
                     accepted in {accept_secs:.2} s, drained in {drain_secs:.2} s once released",
                    count(queued_n as f64)
                ),
            ],
            vec![
                format!(
                    "of which the callers' side: {} `Submission` futures in a `Vec`",
                    count(queued_n as f64)
                ),
                mb(ctl_delta),
                format!("{:.0}", ctl_delta / queued_n as f64),
                format!("size_of::<Submission>() = {submission_bytes} bytes"),
            ],
            vec![
                "of which the engine's side (difference)".into(),
                mb(engine_delta),
                format!("{:.0}", engine_delta / queued_n as f64),
                "queue slot, the task's one allocation (job and result slot), path string".into(),
            ],
            vec![
                format!("one pool of {pool_n} nodes"),
                mb(pool_delta),
                format!("{:.0}", pool_delta / pool_n as f64),
                "p2c, in-process transport, every node actor started".into(),
            ],
        ],
    );
    body.push_str("\nCost per task (µs, closed loop, in-process transport) against pool size:\n\n");
    cost_rows.push(vec![
        "reference: bare actix `send` round trips spread over 3 / 1000 echo actors".into(),
        format!("{spread3:.3}"),
        "".into(),
        format!("{spread1000:.3}"),
        format!("{spread_ratio:.2}"),
    ]);
    body.push_str(&table(
        &["mode", "3 nodes", "100 nodes", "1000 nodes", "1000 / 3"],
        cost_rows,
    ));
    rep.body = body;
    rep.results = json!({
        "queued": probe["queued"],
        "engine_share_bytes": engine_delta,
        "pool": probe["pool"],
        "cost_per_task": cost_json,
        "bare_round_trip_us": bare_us,
        "bare_spread_us": {"actors_3": spread3, "actors_1000": spread1000,
                           "ratio_1000_3": spread_ratio},
    });
    rep.note(format!(
        "RSS is VmRSS of /proc/self/status before and after each step, measured in a fresh child \
         process (`loadbench memory-probe`) so no earlier allocation is reused; the 1000-node pool \
         stays up during the queued-task step so that step cannot reuse its memory. Cost per task: \
         {} tasks per run, window {}, median of {rounds} round(s) in rotating order, the \
         1000/3 column the median of the per-round ratios; a bare actix round trip cost \
         {bare_us:.3} µs in the same run. The reference row sends the same bare round trips \
         round robin over 3 and over 1000 echo actors: over 1000, each message wakes a different \
         actor, as each task wakes its own node in a 1000-node pool (over 3, `send` also waits on \
         actix's 16-message mailboxes, which the engine's `do_send` does not).",
        count(per_task_n as f64),
        window
    ));
    Ok(rep.finish())
}
