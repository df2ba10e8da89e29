//! `tenants`: fair shares between tenants on real sockets.
//!
//! Three fixed-capacity backends in another process (each serves
//! [`WORKERS`] requests at once for [`SERVICE_MS`] ms: 600 tasks/s in
//! all), the engine limiting each node to its workers so that tasks wait
//! in the queue. Two mixes, each run twice on a fresh engine: with every
//! task naming its tenant (`Task::tenant`), and the same arrivals naming
//! none (no fair shares):
//!
//! - **noisy**: ten tenants of equal weight, nine offering 90 % of their
//!   tenth of the capacity, one the rest of twice the capacity (Poisson
//!   arrivals, open loop), every task with a deadline of `--slo-ms`
//!   (250 ms): per tenant, what it offered and what succeeded in time;
//! - **weights**: three tenants weighted 1:2:4 (`tenants.weights`), each
//!   offering the whole capacity, no deadline, `queue.capacity` 2000: the
//!   served shares while all three are backlogged.
//!
//! Each run lasts `--duration` seconds (default 10; 2 with `--smoke`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Instant, Outcome, Task};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::backend::BackendProc;
use crate::common::engine_config;
use crate::report::{table, Report};
use crate::Cli;

/// Fixed-capacity backends.
const BACKENDS: usize = 3;
/// Requests each backend serves at once.
const WORKERS: usize = 4;
/// Service time of one request, ms.
const SERVICE_MS: u64 = 20;
/// Tasks a second the backends serve together.
const CAPACITY: f64 = (BACKENDS * WORKERS) as f64 * 1000.0 / SERVICE_MS as f64;

/// One task's fate: its tenant, and whether it succeeded in time.
#[derive(Clone, Copy)]
struct Fate {
    tenant: usize,
    ok: bool,
    in_time: bool,
    done: Duration,
}

/// The arrivals of `rates` (tasks per second per tenant) over `length`:
/// `(at, tenant)` in time order, Poisson, from a fixed seed.
fn arrivals(rates: &[f64], length: Duration, seed: u64) -> Vec<(Duration, usize)> {
    let mut all = Vec::new();
    for (i, &rate) in rates.iter().enumerate() {
        let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(0x9e37));
        let mut t = 0.0;
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            if t >= length.as_secs_f64() {
                break;
            }
            all.push((Duration::from_secs_f64(t), i));
        }
    }
    all.sort_by_key(|&(at, i)| (at, i));
    all
}

/// Runs `list` open loop through a fresh engine over `urls`.
async fn run_once(
    urls: &[String],
    extra: Value,
    names: &[String],
    list: &[(Duration, usize)],
    named: bool,
    deadline: Option<Duration>,
) -> Result<(Vec<Fate>, actix_dispatch::ServiceStats), String> {
    let cfg = engine_config("p2c", urls, WORKERS as u32, extra)?;
    let d = Dispatcher::start(cfg).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let fates = Rc::new(RefCell::new(Vec::with_capacity(list.len())));
    let mut jobs = Vec::with_capacity(list.len());
    for &(at, tenant) in list {
        actix_rt::time::sleep_until(t0 + at).await;
        let mut task = Task::get("bench", format!("/{tenant}"));
        if named {
            task = task.tenant(names[tenant].clone());
        }
        if let Some(dl) = deadline {
            task = task.deadline(t0 + at + dl);
        }
        let sub = d.submit(task);
        let fates = fates.clone();
        jobs.push(actix_rt::spawn(async move {
            let r = sub.await;
            let ok = matches!(r.outcome, Outcome::Success(_));
            fates.borrow_mut().push(Fate {
                tenant,
                ok,
                in_time: ok && deadline.is_none_or(|dl| r.total <= dl),
                done: t0.elapsed(),
            });
        }));
    }
    for j in jobs {
        let _ = j.await;
    }
    let stats = d.stats().await.services.remove(0);
    d.shutdown(Duration::from_secs(2)).await;
    let fates = fates.borrow().clone();
    Ok((fates, stats))
}

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let secs = cli.duration.unwrap_or(if cli.smoke { 2.0 } else { 10.0 });
    let length = Duration::from_secs_f64(secs);
    let slo = Duration::from_millis(cli.slo_ms);
    let mut rep = Report::new(
        cli,
        "tenants",
        json!({"backends": BACKENDS, "workers": WORKERS, "service_ms": SERVICE_MS,
               "capacity_per_s": CAPACITY, "seconds_per_run": secs, "slo_ms": cli.slo_ms,
               "noisy": "9 tenants at 0.09x capacity each, 1 at the rest of 2x",
               "weights": "3 tenants weighted 1:2:4, each at 1x capacity, queue.capacity 2000"}),
    );
    let mut backend = BackendProc::spawn_capped(
        BACKENDS,
        SERVICE_MS,
        WORKERS,
        cli.backend_workers,
        (secs * 6.0 + 120.0).ceil() as u64,
    )?;
    let urls = backend.urls();

    // Noisy: nine quiet tenants and one noisy one.
    let mut names: Vec<String> = (1..=9).map(|i| format!("t{i}")).collect();
    names.push("noisy".into());
    let quiet = 0.09 * CAPACITY;
    let mut rates = vec![quiet; 9];
    rates.push(2.0 * CAPACITY - 9.0 * quiet);
    let list = arrivals(&rates, length, 1);
    let (fair, fair_stats) = run_once(&urls, json!({}), &names, &list, true, Some(slo)).await?;
    let (plain, _) = run_once(&urls, json!({}), &names, &list, false, Some(slo)).await?;
    let per = |fates: &[Fate]| {
        let mut v = vec![(0usize, 0usize); names.len()];
        for f in fates {
            v[f.tenant].0 += 1;
            v[f.tenant].1 += usize::from(f.in_time);
        }
        v
    };
    let (f, p) = (per(&fair), per(&plain));
    let pct = |(n, k): (usize, usize)| 100.0 * k as f64 / n.max(1) as f64;
    let rows = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            vec![
                n.clone(),
                f[i].0.to_string(),
                f[i].1.to_string(),
                format!("{:.1} %", pct(f[i])),
                p[i].1.to_string(),
                format!("{:.1} %", pct(p[i])),
            ]
        })
        .collect();
    rep.body.push_str(&format!(
        "Ten tenants, one noisy, 2x the capacity ({CAPACITY:.0}/s), deadline {} ms:\n\n",
        cli.slo_ms
    ));
    rep.body.push_str(&table(
        &[
            "tenant",
            "offered",
            "in time (fair)",
            "share",
            "in time (no tenants)",
            "share",
        ],
        rows,
    ));
    let worst_quiet = (0..9).map(|i| pct(f[i])).fold(100.0, f64::min);
    rep.target(
        "well-behaved tenants, in time",
        ">= 95 % of offered, each",
        format!("worst {worst_quiet:.1} %"),
        Some(worst_quiet >= 95.0),
    );
    let well: usize = (0..9).map(|i| f[i].1).sum();
    let room = CAPACITY * (secs + slo.as_secs_f64()) - well as f64;
    rep.target(
        "the noisy tenant",
        "the rest of the capacity, not more",
        format!("{} in time, {room:.0} left by the others", f[9].1),
        Some(f[9].1 as f64 <= room),
    );

    // Weights 1:2:4, all backlogged.
    let wnames: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let list = arrivals(&[CAPACITY; 3], length, 2);
    let extra = json!({"queue": {"capacity": 2000},
                       "tenants": {"weights": {"a": 1, "b": 2, "c": 4}}});
    let (wf, _) = run_once(&urls, extra, &wnames, &list, true, None).await?;
    let from = length.mul_f64(0.2);
    let mut done = [0usize; 3];
    for x in wf
        .iter()
        .filter(|x| x.ok && x.done >= from && x.done < length)
    {
        done[x.tenant] += 1;
    }
    let total = done.iter().sum::<usize>().max(1) as f64;
    let mut worst = 0.0f64;
    let rows = (0..3)
        .map(|i| {
            let want = [1.0, 2.0, 4.0][i] / 7.0;
            let share = done[i] as f64 / total;
            worst = worst.max((share / want - 1.0).abs());
            vec![
                wnames[i].clone(),
                ["1", "2", "4"][i].into(),
                done[i].to_string(),
                format!("{:.1} %", 100.0 * share),
                format!("{:.1} %", 100.0 * want),
            ]
        })
        .collect();
    rep.body.push_str(
        "\nThree backlogged tenants weighted 1:2:4 (successes after the first fifth):\n\n",
    );
    rep.body.push_str(&table(
        &["tenant", "weight", "served", "share", "weight's share"],
        rows,
    ));
    rep.target(
        "weights 1:2:4, backlogged",
        "served shares within 5 %",
        format!("worst {:.1} % off", 100.0 * worst),
        Some(worst < 0.05),
    );
    rep.results = json!({
        "noisy": names.iter().enumerate().map(|(i, n)| json!({
            "tenant": n, "offered": f[i].0, "in_time_fair": f[i].1, "in_time_plain": p[i].1}))
            .collect::<Vec<_>>(),
        "weights": {"served": done, "worst_off": worst},
        "tracked": fair_stats.queue.tenants.len(),
    });
    rep.note(
        "The per-task cost with 100 000 distinct keys against one tenant (callgrind) is not \
         measured here.",
    );
    drop(backend.hits());
    Ok(rep.finish())
}

/// `tenants-probe`: `--tasks N` tasks through an engine with the
/// in-process transport, 256 in flight, naming no tenant (`--only none`),
/// all one tenant (`one`) or each a tenant of its own (`distinct`: the
/// hostile caller, past `max_tracked`); prints the count when done. Run
/// under `valgrind --tool=callgrind` at two task counts, the difference
/// over the difference of tasks is the cost of one task.
pub fn probe_main(cli: &Cli) -> i32 {
    use futures::StreamExt;
    let n = cli.tasks.unwrap_or(50_000);
    let mode = cli.only.clone().unwrap_or_else(|| "none".into());
    if !["none", "one", "distinct"].contains(&mode.as_str()) {
        eprintln!("tenants-probe: --only none|one|distinct, not {mode:?}");
        return 2;
    }
    let urls = crate::common::fake_urls(3);
    actix_rt::System::new().block_on(async move {
        let cfg = match engine_config(
            "round_robin",
            &urls,
            1024,
            json!({"queue": {"capacity": 200_000}, "balancer": {"refresh_interval": "60s"}}),
        ) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("tenants-probe: {e}");
                return 1;
            }
        };
        let d = match Dispatcher::builder(cfg)
            .transport(crate::immediate::immediate_factory())
            .without_metrics()
            .start()
        {
            Ok(d) => d,
            Err(e) => {
                eprintln!("tenants-probe: {e}");
                return 1;
            }
        };
        let ok = futures::stream::iter(0..n)
            .map(|i| {
                let task = Task::get("bench", "/x");
                // One tenant's key is made as the distinct ones are (the same
                // width, formatted at run time), so
                // that the two differ only in the engine's work.
                let task = match mode.as_str() {
                    "one" => task.tenant(format!("k{:06}", std::hint::black_box(0))),
                    "distinct" => task.tenant(format!("k{i:06}")),
                    _ => task,
                };
                d.submit(task)
            })
            .buffer_unordered(256)
            .filter(|r| std::future::ready(matches!(r.outcome, Outcome::Success(_))))
            .count()
            .await;
        let tracked = d.stats().await.services[0].queue.tenants.len();
        println!("{mode}: {ok} of {n} tasks succeeded; {tracked} tenant rows");
        d.shutdown(Duration::from_secs(1)).await;
        i32::from(ok != n)
    })
}
