//! A tour of the engine: `cargo run --release --example demo [CONFIG.json]`.
//!
//! Starts three actix-web backends on 127.0.0.1 (each on its own thread and
//! actix System): `fast`, `slow` and `flaky`, of different speed and error
//! rate. Streams 20 000 GET tasks through `Dispatcher::feed` with a live
//! progress line on stderr; every 250th asks for a missing item (a 404, not
//! retried). From 5 s to 9 s `flaky` answers every request with a 503: watch
//! its breaker open, half-open and close again in the log. Then prints a
//! per-node table (latencies from the tasks' attempts), checks that the
//! counters add up and that every task got exactly one result, and shuts down.
//!
//! CONFIG is an optional JSON config file (see the README); the demo drives
//! its first service, and `{fast}`, `{slow}` and `{flaky}` in it stand for
//! the local backends' addresses, e.g. `{"services":[{"name":"x","mode":
//! "least_load","endpoints":[{"address":"{fast}"},{"address":"{flaky}"}]}]}`.
//! Default: [`DEFAULT_CONFIG`]. Logs: `RUST_LOG` (default `actix_dispatch=info`).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Instant, Outcome, Task};
use actix_rt::time::{interval, sleep, sleep_until};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures::StreamExt;
use hdrhistogram::Histogram;

/// Tasks streamed through the engine.
const TASKS: u64 = 20_000;
/// When `flaky` starts and stops failing every request, from the start.
const OUTAGE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(9));

/// The embedded config: p2c over the three backends, breakers that trip after
/// 5 failures in a row and stay open 1 s (doubling up to 2 s).
const DEFAULT_CONFIG: &str = r#"{"services": [{
    "name": "demo",
    "mode": "p2c",
    "timeout": "1s",
    "queue": {"capacity": 1000},
    "breaker": {"consecutive_failures": 5, "open_for": "1s", "max_open_for": "2s"},
    "endpoints": [
        {"address": "{fast}", "max_concurrent": 16},
        {"address": "{slow}", "max_concurrent": 16},
        {"address": "{flaky}", "max_concurrent": 16}
    ]
}]}"#;

/// One backend's behaviour: latency range (ms; 1 % of requests take 4x as
/// long), share of random 500s, and the outage knob (every request a 503).
struct Backend {
    name: &'static str,
    latency_ms: (u64, u64),
    error_rate: f64,
    down: AtomicBool,
}

/// Starts a backend on its own thread and System; returns its URL.
fn start_backend(name: &'static str, ms: (u64, u64), errors: f64) -> (String, Arc<Backend>) {
    let (latency_ms, error_rate, down) = (ms, errors, AtomicBool::new(false));
    let backend = Arc::new(Backend {
        name,
        latency_ms,
        error_rate,
        down,
    });
    let (port_tx, port_rx) = mpsc::channel();
    let shared = Arc::clone(&backend);
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let data = web::Data::from(shared);
            let app = move || {
                App::new()
                    .app_data(data.clone())
                    .default_service(web::to(serve))
            };
            let server = HttpServer::new(app)
                .workers(1)
                .disable_signals()
                .bind(("127.0.0.1", 0))?;
            let _ = port_tx.send(server.addrs()[0].port());
            server.run().await
        })
    });
    let port = port_rx.recv().expect("backend failed to bind 127.0.0.1");
    (format!("http://127.0.0.1:{port}/"), backend)
}

/// The backends' only handler.
async fn serve(req: HttpRequest, b: web::Data<Backend>) -> HttpResponse {
    if b.down.load(Ordering::Relaxed) {
        return HttpResponse::ServiceUnavailable().body("outage");
    }
    let tail = if rand::random_bool(0.01) { 4 } else { 1 };
    let ms = rand::random_range(b.latency_ms.0..=b.latency_ms.1) * tail;
    sleep(Duration::from_millis(ms)).await;
    if req.path().starts_with("/missing/") {
        HttpResponse::NotFound().body("no such item")
    } else if rand::random_bool(b.error_rate) {
        HttpResponse::InternalServerError().body("random failure")
    } else {
        HttpResponse::Ok().body(format!("{} served {}", b.name, req.path()))
    }
}

// ---- output: timestamps, log lines and notes that do not collide with the progress line ----

static START: OnceLock<Instant> = OnceLock::new();
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);
/// The backends by URL (their names also shorten the engine's log lines).
static BACKENDS: OnceLock<Vec<(String, Arc<Backend>)>> = OnceLock::new();

fn stamp() -> String {
    let t = START.get_or_init(Instant::now).elapsed();
    format!("[{:>5.1}s]", t.as_secs_f64())
}

/// What to write before a full line so it does not land on the progress line.
fn line_start() -> &'static str {
    match PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
        false => "",
        true if std::io::stderr().is_terminal() => "\r\x1b[2K",
        true => "\n",
    }
}

/// A timeline line on stderr, between the engine's log lines.
fn note(msg: &str) {
    eprintln!("{}{} DEMO  {msg}", line_start(), stamp());
}

fn init_logs() {
    let env = env_logger::Env::default().default_filter_or("actix_dispatch=info");
    env_logger::Builder::from_env(env)
        .format(|buf, rec| {
            let mut msg = rec.args().to_string();
            for (url, b) in BACKENDS.get().into_iter().flatten() {
                msg = msg.replace(url.as_str(), b.name);
            }
            writeln!(buf, "{}{} {:<5} {msg}", line_start(), stamp(), rec.level())
        })
        .init();
}

/// Per node, from the results' attempts: node failures and latencies (µs).
type NodeTally = (u64, Histogram<u64>);

fn no_attempts() -> NodeTally {
    let histogram = Histogram::new_with_bounds(1, 60_000_000, 3);
    (0, histogram.expect("valid bounds"))
}

/// The backend's name for an address, `-` for others.
fn name_of(address: &str) -> &'static str {
    let mut all = BACKENDS.get().into_iter().flatten();
    all.find(|(url, _)| url == address)
        .map_or("-", |(_, b)| b.name)
}

fn main() {
    START.get_or_init(Instant::now);
    init_logs();
    let backends = BACKENDS.get_or_init(|| {
        vec![
            start_backend("fast", (20, 30), 0.0),
            start_backend("slow", (60, 90), 0.01),
            start_backend("flaky", (30, 45), 0.05),
        ]
    });
    println!("backends:");
    for (url, b) in backends {
        let ((lo, hi), errors) = (b.latency_ms, b.error_rate * 100.0);
        println!("  {:<6} {url}  {lo}-{hi} ms, {errors:.0} % errors", b.name);
    }
    let (source, mut json) = match std::env::args().nth(1) {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(text) => (path, text),
            Err(e) => fail(&format!("cannot read {path}: {e}")),
        },
        None => ("embedded default".to_owned(), DEFAULT_CONFIG.to_owned()),
    };
    for (url, b) in backends {
        json = json.replace(&format!("{{{}}}", b.name), url);
    }
    let config = Config::from_json(&json).unwrap_or_else(|e| fail(&e.to_string()));
    let flaky = Arc::clone(&backends[2].1);
    let ok = actix_rt::System::new().block_on(run(config, source, flaky));
    std::process::exit(if ok { 0 } else { 1 });
}

fn fail(msg: &str) -> ! {
    eprintln!("demo: {msg}");
    std::process::exit(2)
}

/// Streams the tasks, reports, shuts down. Returns whether every check held.
async fn run(config: Config, source: String, flaky: Arc<Backend>) -> bool {
    let svc = config.services[0].name.clone();
    let mode = config.services[0].mode;
    println!("config: {source}; service {svc:?}, mode {mode:?}, {TASKS} tasks\n");
    let d = Dispatcher::start(config).unwrap_or_else(|e| fail(&e.to_string()));
    let start = Instant::now();

    actix_rt::spawn(async move {
        sleep_until(start + OUTAGE.0).await;
        flaky.down.store(true, Ordering::Relaxed);
        note("knob: flaky now answers every request with 503");
        sleep_until(start + OUTAGE.1).await;
        flaky.down.store(false, Ordering::Relaxed);
        note("knob: flaky is healthy again");
    });

    // [ok, failed, rejected], counted as results arrive.
    let tally = Rc::new(Cell::new([0u64; 3]));
    let mut progress = actix_rt::spawn({
        let (d, tally, svc) = (d.clone(), Rc::clone(&tally), svc.clone());
        async move {
            // On a terminal, one line redrawn in place (`\r`) every 200 ms;
            // into a pipe or file, a full line every 2 s, so a log stays
            // readable line by line.
            let tty = std::io::stderr().is_terminal();
            let mut tick = interval(Duration::from_millis(200));
            let (mut then, mut done_then) = (start, 0);
            for n in 1u64.. {
                tick.tick().await;
                let [ok, failed, rejected] = tally.get();
                if !tty && n % 10 != 0 && ok + failed + rejected < TASKS {
                    continue;
                }
                let stats = d.stats().await;
                let Some(q) = stats.service(&svc).map(|s| &s.queue) else {
                    continue;
                };
                let [ok, failed, rejected] = tally.get();
                let (now, done) = (Instant::now(), ok + failed + rejected);
                if done == TASKS {
                    (then, done_then) = (start, 0); // the last line shows the average
                }
                let rate = (done - done_then) as f64 / (now - then).as_secs_f64().max(1e-9);
                (then, done_then) = (now, done);
                let (flight, queued) = (q.in_flight, q.queued);
                let line = format!(
                    "{} {done:>6}/{TASKS}  ok {ok:>6}  failed {failed:>3}  rejected {rejected:>3}  \
                     | {rate:>5.0}/s  in flight {flight:>3}  queued {queued:>4} ",
                    stamp()
                );
                if tty {
                    eprint!("\r{line}");
                    PROGRESS_SHOWN.store(true, Ordering::Relaxed);
                } else {
                    eprintln!("{line}");
                }
                if done == TASKS {
                    break; // the last line, left on screen
                }
            }
        }
    });

    let tasks = futures::stream::iter(0..TASKS).map({
        let svc = svc.clone();
        move |i| match i % 250 {
            249 => Task::get(svc.clone(), format!("/missing/{i}")),
            _ => Task::get(svc.clone(), format!("/items/{i}")),
        }
    });
    let mut results = d.feed(tasks);
    let (mut received, mut ids) = (0u64, HashSet::new());
    let mut nodes: HashMap<String, NodeTally> = HashMap::new();
    let mut why_failed: BTreeMap<String, u64> = BTreeMap::new();
    while let Some(r) = results.next().await {
        received += 1;
        ids.insert(r.id);
        let mut t = tally.get();
        t[usize::from(!r.is_success()) + usize::from(r.is_rejected())] += 1; // ok, failed, rejected
        tally.set(t);
        if let Outcome::Failure(f) = &r.outcome {
            *why_failed.entry(f.reason.to_string()).or_default() += 1;
        }
        for a in &r.attempts {
            let (errors, latency) = nodes.entry(a.node.to_string()).or_insert_with(no_attempts);
            *errors += u64::from(a.outcome.is_node_failure());
            latency.saturating_record(a.latency.as_micros() as u64);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let _ = actix_rt::time::timeout(Duration::from_secs(1), &mut progress).await;
    progress.abort();
    if PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
        eprintln!(); // end the line the progress was redrawn on
    }

    let stats = d.stats().await;
    let s = stats.service(&svc).expect("the service exists");
    let q = &s.queue;
    let [ok, failed, rejected] = tally.get();
    let rate = TASKS as f64 / elapsed;
    let retries = q.retried;
    println!(
        "\n{TASKS} tasks in {elapsed:.1} s ({rate:.0}/s): {ok} ok, {failed} failed, \
         {rejected} rejected; {retries} retries"
    );
    for (reason, n) in &why_failed {
        println!("  {n} failed: {reason}");
    }
    println!();
    let total = nodes.values().map(|(_, h)| h.len()).sum::<u64>().max(1);
    println!(
        "node   address                  requests errors      p50      p99  share trips  breaker"
    );
    for n in &s.nodes {
        let (errors, h) = nodes.remove(&n.address).unwrap_or_else(no_attempts);
        let (p50, p99) = (ms(&h, 0.5), ms(&h, 0.99));
        let share = 100.0 * h.len() as f64 / total as f64;
        println!(
            "{:<6} {:<24} {:>8} {errors:>6} {p50:>8} {p99:>8} {share:>5.1}% {:>5}  {}",
            name_of(&n.address),
            n.address,
            h.len(),
            n.trips,
            n.breaker
        );
    }

    let balanced = s.is_balanced() && q.submitted == TASKS;
    let once = received == TASKS && ids.len() as u64 == TASKS;
    println!(
        "\nconservation: submitted {} = succeeded {} + failed {} + rejected {} + queued {} \
         + in_flight {}  {}",
        q.submitted,
        q.succeeded,
        q.failed,
        q.rejected,
        q.queued,
        q.in_flight,
        check(balanced)
    );
    println!(
        "results: {received} received for {TASKS} tasks ({} refused before queueing), \
         {} distinct ids  {}",
        stats.refused,
        ids.len(),
        check(once)
    );

    let report = d.shutdown(Duration::from_secs(5)).await;
    let unfinished = report.unfinished.len();
    println!(
        "shutdown: {unfinished} unfinished task(s), drained: {}",
        report.drained
    );
    balanced && once && unfinished == 0
}

fn ms(h: &Histogram<u64>, quantile: f64) -> String {
    format!("{:.1}ms", h.value_at_quantile(quantile) as f64 / 1e3)
}

fn check(ok: bool) -> &'static str {
    ["MISMATCH", "OK"][usize::from(ok)]
}
