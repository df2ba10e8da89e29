//! `slow-node`: open loop at a fixed arrival rate, 6 backends at 20 ms, one
//! of them at 500 ms for the middle third of the run, 1 s timeout; every
//! engine mode and nginx `least_conn`, side by side.
//!
//! Latency is measured from each task's intended start, so a client that
//! falls behind (or an engine that queues) shows it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Task};
use serde_json::{json, Value};

use crate::backend::{BackendProc, Slow};
use crate::common::{self, bare_client, bare_get, closed_loop, hist, ms, open_loop, record, Lat};
use crate::nginx::{self, Nginx};
use crate::report::{table, Report};
use crate::Cli;

const NODES: usize = 6;
const HEALTHY_MS: u64 = 20;
const SLOW_MS: u64 = 500;
/// The slow server.
const SLOW: usize = 2;

/// Answers per phase (before, during, after the slow third) and per server.
type Served = Rc<RefCell<[[u64; NODES]; 3]>>;

/// The phase of task `i` of an open loop at `rate`.
fn phase(i: usize, rate: f64, from: Duration, to: Duration) -> usize {
    let t = Duration::from_secs_f64(i as f64 / rate);
    if t < from {
        0
    } else if t < to {
        1
    } else {
        2
    }
}

/// A GET through nginx: success, and which server answered (`x-backend: bK`).
async fn nginx_get(client: awc::Client, url: String) -> (bool, Option<usize>) {
    match client.get(url).send().await {
        Ok(mut res) => {
            let ok = res.status().is_success();
            let server = res
                .headers()
                .get("x-backend")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix('b'))
                .and_then(|v| v.parse::<usize>().ok());
            (res.body().await.is_ok() && ok, server)
        }
        Err(_) => (false, None),
    }
}

struct Row {
    name: String,
    all: Lat,
    window: Lat,
    success: f64,
    slow_share: f64,
    /// The slow node's share of the answers before, during and after its slow third.
    phase_share: [f64; 3],
    unfinished: usize,
    max_lag_ms: f64,
}

impl Row {
    fn json(&self) -> Value {
        json!({"name": self.name, "latency": self.all, "latency_slow_window": self.window,
               "success_rate": self.success, "slow_node_share": self.slow_share,
               "slow_node_share_by_phase": self.phase_share,
               "unfinished": self.unfinished, "scheduler_max_lag_ms": self.max_lag_ms})
    }
}

fn summarize(
    name: &str,
    run: common::OpenRun,
    slow_from: Duration,
    slow_to: Duration,
    hits: (Vec<u64>, Vec<u64>),
    served: &Served,
) -> Row {
    let mut all = hist();
    let mut win = hist();
    let mut ok = 0usize;
    for s in &run.samples {
        record(&mut all, s.latency);
        if s.intended >= slow_from && s.intended < slow_to {
            record(&mut win, s.latency);
        }
        ok += usize::from(s.ok);
    }
    let delta: Vec<u64> = hits.1.iter().zip(&hits.0).map(|(b, a)| b - a).collect();
    let total: u64 = delta.iter().sum();
    Row {
        name: name.to_owned(),
        all: Lat::of(&all),
        window: Lat::of(&win),
        success: ok as f64 / run.sent.max(1) as f64,
        slow_share: delta.get(SLOW).copied().unwrap_or(0) as f64 / total.max(1) as f64,
        phase_share: {
            let by = served.borrow();
            let share = |p: usize| by[p][SLOW] as f64 / by[p].iter().sum::<u64>().max(1) as f64;
            [share(0), share(1), share(2)]
        },
        unfinished: run.unfinished,
        max_lag_ms: run.max_lag.as_secs_f64() * 1e3,
    }
}

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let rate = if cli.smoke && cli.rate == 400.0 {
        200.0
    } else {
        cli.rate
    };
    let secs = common::pick(cli.duration, cli.smoke, 1.5, 15.0);
    let duration = Duration::from_secs_f64(secs);
    let slow_from = duration / 3;
    let slow_to = duration * 2 / 3;
    let max_conc = cli.max_concurrent.max(100);
    let mut rep = Report::new(
        cli,
        "slow-node",
        json!({"rate_per_sec": rate, "duration_secs": secs, "backends": NODES,
               "healthy_latency_ms": HEALTHY_MS, "slow_server": SLOW, "slow_latency_ms": SLOW_MS,
               "slow_window_secs": [slow_from.as_secs_f64(), slow_to.as_secs_f64()],
               "timeout": "1s", "max_concurrent_per_node": max_conc}),
    );
    let slow = Slow {
        server: SLOW,
        ms: SLOW_MS,
        from_ms: slow_from.as_millis() as u64 + 20,
        to_ms: slow_to.as_millis() as u64 + 20,
    };
    let mut backend = BackendProc::spawn(NODES, &[HEALTHY_MS], &[slow], 2, 900)?;
    let urls = backend.urls();
    let grace = Duration::from_secs(10);
    let warm = if cli.smoke { 60 } else { 300 };
    let mut rows = Vec::new();

    for mode in ["round_robin", "weighted", "least_load", "p2c"] {
        let cfg = common::engine_config(
            mode,
            &urls,
            max_conc,
            json!({"timeout": "1s", "balancer": {"seed": 11}}),
        )?;
        let d = Dispatcher::start(cfg).map_err(|e| e.to_string())?;
        // Warm-up: connections open, estimates settle on the healthy pool.
        closed_loop(warm, 16, Duration::from_secs(10), false, |i| {
            let d = d.clone();
            async move {
                d.submit(Task::get("bench", format!("/warm/{i}")))
                    .await
                    .is_success()
            }
        })
        .await;
        let h0 = backend.hits()?;
        backend.start_schedule()?;
        let served: Served = Rc::new(RefCell::new([[0; NODES]; 3]));
        let addrs = Rc::new(urls.clone());
        let run = open_loop(rate, duration, grace, |i| {
            let d = d.clone();
            let (served, addrs) = (served.clone(), addrs.clone());
            let p = phase(i, rate, slow_from, slow_to);
            async move {
                let r = d
                    .submit(Task::get("bench", format!("/slow-node/{i}")))
                    .await;
                if let Some(k) = r.node().and_then(|n| addrs.iter().position(|a| a == n)) {
                    served.borrow_mut()[p][k] += 1;
                }
                r.is_success()
            }
        })
        .await;
        let h1 = backend.hits()?;
        d.shutdown(Duration::from_secs(2)).await;
        let row = summarize(mode, run, slow_from, slow_to, (h0, h1), &served);
        eprintln!(
            "slow-node: {mode}: p50 {} p99 {} p99.9 {} ms, success {:.3} %, slow node share {:.1} %",
            ms(row.all.p50_ms),
            ms(row.all.p99_ms),
            ms(row.all.p999_ms),
            row.success * 100.0,
            row.slow_share * 100.0
        );
        rows.push(row);
    }

    match nginx::find_or_install(!cli.no_install_nginx) {
        Ok(bin) => {
            let proxy = Nginx::start(&bin, &backend.ports, 64, Duration::from_secs(1))?;
            let client = bare_client(Duration::from_secs(5));
            let url = Rc::new(proxy.url());
            closed_loop(warm, 16, Duration::from_secs(10), false, |i| {
                bare_get(client.clone(), format!("{url}warm/{i}"))
            })
            .await;
            let h0 = backend.hits()?;
            backend.start_schedule()?;
            let served: Served = Rc::new(RefCell::new([[0; NODES]; 3]));
            let run = open_loop(rate, duration, grace, |i| {
                let served = served.clone();
                let p = phase(i, rate, slow_from, slow_to);
                let get = nginx_get(client.clone(), format!("{url}slow-node/{i}"));
                async move {
                    let (ok, server) = get.await;
                    if let Some(k) = server.filter(|k| *k < NODES) {
                        served.borrow_mut()[p][k] += 1;
                    }
                    ok
                }
            })
            .await;
            let h1 = backend.hits()?;
            drop(proxy);
            let row = summarize(
                "nginx least_conn",
                run,
                slow_from,
                slow_to,
                (h0, h1),
                &served,
            );
            eprintln!(
                "slow-node: nginx: p50 {} p99 {} p99.9 {} ms, success {:.3} %",
                ms(row.all.p50_ms),
                ms(row.all.p99_ms),
                ms(row.all.p999_ms),
                row.success * 100.0
            );
            rows.push(row);
        }
        Err(why) => {
            eprintln!("slow-node: nginx skipped: {why}");
            rep.note(format!("nginx least_conn SKIPPED: {why}"));
        }
    }
    drop(backend);

    let md_rows = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                ms(r.all.p50_ms),
                ms(r.all.p99_ms),
                ms(r.all.p999_ms),
                ms(r.all.max_ms),
                ms(r.window.p50_ms),
                ms(r.window.p99_ms),
                format!("{:.3} %", r.success * 100.0),
                format!(
                    "{:.1} / {:.1} / {:.1} %",
                    r.phase_share[0] * 100.0,
                    r.phase_share[1] * 100.0,
                    r.phase_share[2] * 100.0
                ),
            ]
        })
        .collect();
    rep.body = table(
        &[
            "mode",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "slow third p50",
            "slow third p99",
            "success",
            "slow node's share before / during / after",
        ],
        md_rows,
    );
    let healthy = HEALTHY_MS as f64;
    if let Some(p) = rows.iter().find(|r| r.name == "p2c") {
        rep.target(
            "p2c p99",
            format!("< 1.5 x healthy latency ({} ms)", ms(1.5 * healthy)),
            format!("{} ms", ms(p.all.p99_ms)),
            Some(p.all.p99_ms < 1.5 * healthy),
        );
        rep.target(
            "p2c success rate",
            ">= 99.9 %",
            format!("{:.3} %", p.success * 100.0),
            Some(p.success >= 0.999),
        );
    }
    if let Some(r) = rows.iter().find(|r| r.name == "round_robin") {
        rep.target(
            "round robin p99 shows the slow node",
            format!(">= {SLOW_MS} ms"),
            format!("{} ms", ms(r.all.p99_ms)),
            Some(r.all.p99_ms >= SLOW_MS as f64 * 0.95),
        );
    }
    rep.results = json!({"modes": rows.iter().map(Row::json).collect::<Vec<_>>()});
    rep.note(format!(
        "Open loop: {rate} tasks/s for {secs} s per mode, latency from each task's intended start. \
         {NODES} backends at {HEALTHY_MS} ms; backend {SLOW} answers after {SLOW_MS} ms during \
         [{:.1} s, {:.1} s) ('slow third' columns: tasks whose intended start falls in it). \
         Engine: fresh dispatcher per mode, timeout 1 s, max_concurrent {max_conc}, default retries; \
         nginx: proxy timeouts 1 s, proxy_next_upstream error timeout. 'weighted' with equal weights \
         is plain rotation. The slow node's share is of the answers to tasks that started before, \
         during and after its slow third (a healthy share is 1/6 = 16.7 %). 'Healthy latency' is the backends' configured {HEALTHY_MS} ms.",
        slow_from.as_secs_f64(),
        slow_to.as_secs_f64()
    ));
    Ok(rep.finish())
}
