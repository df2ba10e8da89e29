//! `throughput` and `nginx`: closed loops against real HTTP backends in
//! another process.
//!
//! `throughput`: the engine against a bare awc client that spreads the same
//! requests round robin by hand, same number in flight. `nginx`: the engine
//! (talking to the backends directly) against a bare awc client going
//! through nginx (`least_conn`, `keepalive`), with bare awc direct as a
//! reference. Rounds rotate the order of the contenders.

use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Task};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::backend::BackendProc;
use crate::common::{self, bare_client, bare_get, closed_loop, count, median, ms, pick, Lat};
use crate::nginx::{self, Nginx};
use crate::report::{out_dir, table, Report};
use crate::tower_peer::TowerPeer;
use crate::Cli;

/// What sends the requests.
pub(crate) enum Contender {
    Engine(Dispatcher),
    Bare {
        client: awc::Client,
        urls: Rc<Vec<String>>,
    },
    /// tower p2c + peak EWMA over hyper-util (the `peers` scenario).
    Tower(TowerPeer),
}

pub(crate) struct Entry {
    pub(crate) name: String,
    who: Contender,
    pub(crate) rates: Vec<f64>,
    pub(crate) hist: Histogram<u64>,
    ok: u64,
    tasks: u64,
    cpu: Vec<f64>,
}

impl Entry {
    pub(crate) fn new(name: &str, who: Contender) -> Entry {
        Entry {
            name: name.to_owned(),
            who,
            rates: Vec::new(),
            hist: common::hist(),
            ok: 0,
            tasks: 0,
            cpu: Vec::new(),
        }
    }

    async fn run(&self, n: usize, conc: usize, max: Duration) -> common::ClosedRun {
        match &self.who {
            Contender::Engine(d) => {
                closed_loop(n, conc, max, true, |i| {
                    let d = d.clone();
                    async move {
                        d.submit(Task::get("bench", format!("/bench/{i}")))
                            .await
                            .is_success()
                    }
                })
                .await
            }
            Contender::Bare { client, urls } => {
                closed_loop(n, conc, max, true, |i| {
                    let url = format!("{}bench/{i}", urls[i % urls.len()]);
                    bare_get(client.clone(), url)
                })
                .await
            }
            Contender::Tower(t) => {
                closed_loop(n, conc, max, true, |i| {
                    let t = t.clone();
                    async move { t.get(i).await }
                })
                .await
            }
        }
    }

    pub(crate) fn rate(&self) -> f64 {
        median(&self.rates)
    }

    pub(crate) fn lat(&self) -> Lat {
        Lat::of(&self.hist)
    }

    pub(crate) fn json(&self) -> Value {
        json!({"name": self.name, "rate_median": self.rate(), "rates": self.rates,
               "latency": self.lat(), "ok": self.ok, "tasks": self.tasks,
               "cpu_util_median": median(&self.cpu)})
    }
}

/// Warm-up, then `rounds` rounds of every contender, order rotating.
pub(crate) async fn compare(
    entries: &mut [Entry],
    n: usize,
    conc: usize,
    max: Duration,
    rounds: usize,
) {
    let warm = (n / 20).clamp(100, 2_000);
    for e in entries.iter() {
        e.run(warm, conc, max).await;
    }
    let k = entries.len();
    for r in 0..rounds {
        for j in 0..k {
            let e = &mut entries[(r + j) % k];
            let run = e.run(n, conc, max).await;
            eprintln!(
                "round {r}: {}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} ok of {}",
                e.name,
                run.rate,
                run.lat.map_or(0.0, |l| l.p50_ms),
                run.lat.map_or(0.0, |l| l.p99_ms),
                run.ok,
                run.tasks
            );
            e.rates.push(run.rate);
            e.cpu.push(run.cpu_util);
            e.ok += run.ok;
            e.tasks += run.tasks;
            if let Some(h) = &run.hist {
                let _ = e.hist.add(h);
            }
        }
    }
}

pub(crate) fn rows(entries: &[Entry]) -> Vec<Vec<String>> {
    entries
        .iter()
        .map(|e| {
            let l = e.lat();
            vec![
                e.name.clone(),
                count(e.rate()),
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.p999_ms),
                format!("{:.3} %", 100.0 * e.ok as f64 / e.tasks.max(1) as f64),
                e.rates
                    .iter()
                    .map(|r| count(*r))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect()
}

pub(crate) const HEADERS: [&str; 7] = [
    "client",
    "req/s (median)",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "success",
    "runs req/s",
];

/// Writes the scenario's SVG charts next to its results (a failure is a
/// note, not a failed scenario). `baseline` indexes the reference client.
pub(crate) fn charts(cli: &Cli, rep: &mut Report, entries: &[Entry], baseline: usize) {
    let series: Vec<crate::charts::Series<'_>> = entries
        .iter()
        .map(|e| crate::charts::Series {
            name: &e.name,
            rate: e.rate(),
            hist: &e.hist,
        })
        .collect();
    match crate::charts::write(&out_dir(cli), &rep.scenario, &series, baseline) {
        Ok(paths) => {
            let names: Vec<String> = paths
                .iter()
                .filter_map(|p| p.file_name().map(|f| format!("`{}`", f.to_string_lossy())))
                .collect();
            rep.note(format!("Charts: {}.", names.join(", ")));
        }
        Err(e) => rep.note(format!("Charts not written: {e}")),
    }
}

/// Ratio of the per-round rates of `a` over `b`, median over rounds.
pub(crate) fn ratio(a: &Entry, b: &Entry) -> f64 {
    let r: Vec<f64> = a
        .rates
        .iter()
        .zip(&b.rates)
        .map(|(x, y)| x / y.max(1e-9))
        .collect();
    median(&r)
}

pub(crate) fn params(cli: &Cli) -> (usize, usize, Duration, usize) {
    let n = pick(cli.tasks, cli.smoke, 500, 40_000);
    let rounds = pick(cli.rounds, cli.smoke, 1, 5);
    let max = Duration::from_secs_f64(pick(cli.duration, cli.smoke, 2.0, 20.0));
    (n, rounds, max, cli.concurrency.max(1))
}

pub(crate) fn engine(
    cli: &Cli,
    mode: &str,
    urls: &[String],
    threads: usize,
) -> Result<Dispatcher, String> {
    let mut cfg = common::engine_config(
        mode,
        urls,
        cli.max_concurrent,
        json!({"timeout": "5s", "balancer": {"seed": 7}}),
    )?;
    // Every node's room counts as credit; keep the queue roomy.
    cfg.services[0].queue.capacity = cfg.services[0].queue.capacity.max(cli.concurrency * 4);
    Dispatcher::builder(cfg)
        .node_threads(threads)
        .start()
        .map_err(|e| e.to_string())
}

pub async fn run_throughput(cli: &Cli) -> Result<Report, String> {
    let (n, rounds, max, conc) = params(cli);
    let mut rep = Report::new(
        cli,
        "throughput",
        json!({"tasks_per_run": n, "rounds": rounds, "concurrency": conc, "mode": cli.mode,
               "max_concurrent_per_node": cli.max_concurrent, "backends": 3,
               "backend_latency_ms": 0, "backend_workers": cli.backend_workers}),
    );
    let backend = BackendProc::spawn(3, &[0], &[], cli.backend_workers, 900)?;
    let urls = backend.urls();
    // (mode, node threads): the engine all on the caller's thread, and
    // with its HTTP work on a node thread of its own.
    let mut modes = vec![(cli.mode.clone(), 0)];
    if cli.mode != "round_robin" {
        modes.push(("round_robin".into(), 0));
    }
    modes.push((cli.mode.clone(), 1));
    let mut entries = vec![Entry::new(
        "bare awc, round robin by hand",
        Contender::Bare {
            client: bare_client(Duration::from_secs(5)),
            urls: Rc::new(urls.clone()),
        },
    )];
    let mut engines = Vec::new();
    let label = |m: &str, t: usize| match t {
        0 => format!("engine ({m})"),
        t => format!("engine ({m}, node_threads {t})"),
    };
    for (m, t) in &modes {
        let d = engine(cli, m, &urls, *t)?;
        entries.push(Entry::new(&label(m, *t), Contender::Engine(d.clone())));
        engines.push(d);
    }
    compare(&mut entries, n, conc, max, rounds).await;
    charts(cli, &mut rep, &entries, 0);
    for d in &engines {
        d.shutdown(Duration::from_secs(2)).await;
    }
    drop(backend);

    let mut ratios = serde_json::Map::new();
    for (k, (m, t)) in modes.iter().enumerate() {
        let r = ratio(&entries[k + 1], &entries[0]);
        ratios.insert(label(m, *t), json!(r));
        let (le, lb) = (entries[k + 1].lat(), entries[0].lat());
        rep.target(
            format!("{} throughput / bare awc throughput", label(m, *t)),
            ">= 0.95, p99 <= 1.2 x bare awc's",
            format!("{r:.3} (p99 {} vs {} ms)", ms(le.p99_ms), ms(lb.p99_ms)),
            Some(r >= 0.95 && le.p99_ms <= 1.2 * lb.p99_ms),
        );
    }
    rep.body = table(&HEADERS, rows(&entries));
    rep.results = json!({"contenders": entries.iter().map(Entry::json).collect::<Vec<_>>(),
                         "engine_over_bare": ratios});
    rep.note(format!(
        "Closed loop, {conc} requests in flight, {n} per run, {rounds} rotating round(s); 3 backends \
         answering at once in a separate process ({} worker thread(s)); each ratio is the median \
         of the per-round ratios (same round, same machine state). The client runs on one thread: \
         when it is the bottleneck the ratio is the CPU cost of an awc request over that of an \
         engine task.",
        cli.backend_workers,
    ));
    Ok(rep.finish())
}

pub async fn run_nginx(cli: &Cli) -> Result<Report, String> {
    let (n, rounds, max, conc) = params(cli);
    let mut rep = Report::new(
        cli,
        "nginx",
        json!({"tasks_per_run": n, "rounds": rounds, "concurrency": conc, "mode": cli.mode,
               "max_concurrent_per_node": cli.max_concurrent, "backends": 3,
               "backend_latency_ms": 0, "nginx": "least_conn, keepalive = concurrency, 1 worker process"}),
    );
    let bin = match nginx::find_or_install(!cli.no_install_nginx) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("nginx: skipped: {why}");
            rep.note(format!("SKIPPED: {why}"));
            rep.target(
                "engine throughput / nginx throughput",
                ">= 1.3",
                "skipped",
                None,
            );
            return Ok(rep.finish());
        }
    };
    let backend = BackendProc::spawn(3, &[0], &[], cli.backend_workers, 900)?;
    let urls = backend.urls();
    let proxy = Nginx::start(&bin, &backend.ports, conc, Duration::from_secs(5))?;
    let d = engine(cli, &cli.mode, &urls, 0)?;
    let mut entries = vec![
        Entry::new(
            "bare awc -> nginx least_conn",
            Contender::Bare {
                client: bare_client(Duration::from_secs(5)),
                urls: Rc::new(vec![proxy.url()]),
            },
        ),
        Entry::new(
            &format!("engine ({}) -> backends", cli.mode),
            Contender::Engine(d.clone()),
        ),
        Entry::new(
            "bare awc -> backends (reference)",
            Contender::Bare {
                client: bare_client(Duration::from_secs(5)),
                urls: Rc::new(urls.clone()),
            },
        ),
    ];
    compare(&mut entries, n, conc, max, rounds).await;
    charts(cli, &mut rep, &entries, 0);
    d.shutdown(Duration::from_secs(2)).await;
    drop(proxy);
    drop(backend);

    let r = ratio(&entries[1], &entries[0]);
    let (le, ln) = (entries[1].lat(), entries[0].lat());
    rep.body = table(&HEADERS, rows(&entries));
    rep.results = json!({"contenders": entries.iter().map(Entry::json).collect::<Vec<_>>(),
                         "engine_over_nginx": r});
    rep.target(
        "engine throughput / nginx throughput",
        ">= 1.3",
        format!("{r:.2}"),
        Some(r >= 1.3),
    );
    rep.target(
        "engine p99 vs nginx p99",
        "lower",
        format!("{} ms vs {} ms", ms(le.p99_ms), ms(ln.p99_ms)),
        Some(le.p99_ms < ln.p99_ms),
    );
    rep.note(format!(
        "Closed loop, {conc} requests in flight, {n} per run, {rounds} rotating round(s). nginx runs \
         one worker process; the client, nginx and the backends share the machine's {} core(s).",
        rep.cores
    ));
    Ok(rep.finish())
}
