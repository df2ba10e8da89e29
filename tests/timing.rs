//! The timing-based behaviours of balancing and resilience (breaker periods,
//! probes, slow start, health-check intervals, hedging delays, rate limits,
//! the retry budget, supervision), held to exact figures under paused tokio
//! time with the scripted in-process transport (`scripted`): every wait is a
//! timer, so a run takes no real time, repeats exactly and cannot be
//! disturbed by a busy machine. `tests/balancing.rs` and
//! `tests/resilience.rs` keep what needs real sockets.

mod scripted;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::{
    BreakerStatus, Config, Dispatcher, EndpointConfig, ErrorKind, FailReason, Instant, Method,
    Outcome, Rejection, Task, TaskResult,
};
use futures::StreamExt;
use scripted::{Act, Backends, Req};

const A: &str = "http://127.0.0.1:9/";
const B: &str = "http://127.0.0.2:9/";
const C: &str = "http://127.0.0.3:9/";
const D: &str = "http://127.0.0.4:9/";
const E: &str = "http://127.0.0.5:9/";
const F: &str = "http://127.0.0.6:9/";

/// One service `svc` over `nodes` (address, weight, max_concurrent), with
/// `extra` service fields (JSON, each with a leading comma).
fn config(mode: &str, nodes: &[(&str, u32, u32)], extra: &str) -> Config {
    let eps: Vec<String> = nodes
        .iter()
        .map(|(a, w, m)| format!(r#"{{"address":"{a}","weight":{w},"max_concurrent":{m}}}"#))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"{mode}","endpoints":[{}]{extra}}}]}}"#,
        eps.join(",")
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn start(backends: &Backends, config: Config) -> Dispatcher {
    Dispatcher::builder(config)
        .transport(backends.factory())
        .start()
        .unwrap()
}

async fn sleep(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

async fn node(d: &Dispatcher, addr: &str) -> actix_dispatch::NodeStats {
    d.stats().await.services[0].node(addr).unwrap().clone()
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Milliseconds since `t0` of each request for a path starting `prefix`.
fn sent_ms(b: &Backends, t0: Instant, prefix: &str) -> Vec<u64> {
    b.sent()
        .iter()
        .filter(|s| s.path.starts_with(prefix))
        .map(|s| ms(s.at - t0))
        .collect()
}

/// `n` GETs `/{tag}/{i}` one after the other, each answered.
async fn one_by_one(d: &Dispatcher, tag: &str, n: usize) -> Vec<TaskResult> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(d.submit(Task::get("svc", format!("/{tag}/{i}"))).await);
    }
    out
}

/// `n` GETs `/{tag}/{i}`, `concurrency` at a time.
async fn run(d: &Dispatcher, n: usize, concurrency: usize, tag: &str) -> Vec<TaskResult> {
    futures::stream::iter(0..n)
        .map(|i| d.submit(Task::get("svc", format!("/{tag}/{i}"))))
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// `n` GETs `/{tag}/{i}` all at once.
async fn burst(d: &Dispatcher, n: usize, tag: &str) -> Vec<TaskResult> {
    futures::future::join_all((0..n).map(|i| d.submit(Task::get("svc", format!("/{tag}/{i}")))))
        .await
}

/// The service's counters against `(succeeded, failed, rejected)`, with
/// nothing left in the queue or in flight.
async fn assert_counts(d: &Dispatcher, succeeded: u64, failed: u64, rejected: u64) {
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!(
        (
            q.submitted,
            q.succeeded,
            q.failed,
            q.rejected,
            q.queued,
            q.in_flight
        ),
        (
            succeeded + failed + rejected,
            succeeded,
            failed,
            rejected,
            0,
            0
        ),
        "{q:?}"
    );
}

fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Sleeps until exactly `n` ms after `t0` (which must be a millisecond
/// tick, as every instant a paused-time timer woke at): a timer fires on
/// the tick after its deadline, so it is set one early.
async fn at(t0: Instant, n: u64) {
    tokio::time::sleep_until(t0 + millis(n.saturating_sub(1))).await;
    assert_eq!(Instant::now() - t0, millis(n), "woke on the tick");
}

/// The `retry_after` of a `CircuitOpen` rejection, in milliseconds.
fn circuit_open_for(r: &TaskResult) -> u64 {
    match r.rejection() {
        Some(Rejection::CircuitOpen { retry_after, .. }) => {
            assert_eq!(retry_after.subsec_nanos() % 1_000_000, 0, "{retry_after:?}");
            ms(*retry_after)
        }
        o => panic!("not CircuitOpen: {o:?} {:?}", r.outcome),
    }
}

fn successes(rs: &[TaskResult]) -> u64 {
    rs.iter().filter(|r| r.is_success()).count() as u64
}

// ---------------------------------------------------------------- breakers

#[actix_rt::test]
async fn a_failing_backend_is_cut_off_probed_and_used_again() {
    tokio::time::pause();
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let b = Backends::new(move |r: &Req| {
        if r.addr == A && f.load(Ordering::Relaxed) {
            Act::status(503, 1)
        } else {
            Act::ok(1)
        }
    });
    let d = start(
        &b,
        config(
            "round_robin",
            &[(A, 1, 10), (B, 1, 10)],
            r#","breaker":{"consecutive_failures":3,"open_for":"300ms","max_open_for":"300ms"},
               "retry":{"backoff_base":"1ms","backoff_max":"1ms"}"#,
        ),
    );
    assert_eq!(successes(&one_by_one(&d, "warm", 10).await), 10);
    failing.store(true, Ordering::Relaxed);
    // Sequential tasks until the breaker opens: exactly 3 failures reach A,
    // each task retried on B.
    let mut n = 0;
    while node(&d, A).await.breaker != BreakerStatus::Open {
        let r = d.submit(Task::get("svc", format!("/f/{n}"))).await;
        assert_eq!(r.node(), Some(B), "every task still succeeds on B");
        n += 1;
        assert!(n < 50, "breaker never opened");
    }
    assert_eq!(b.count(A, "/f/"), 3, "cut off after exactly 3 failures");
    assert_eq!(n, 3, "each of them tried A first and was retried on B");
    assert_eq!(node(&d, A).await.trips, 1);
    // Open for 300 ms, then one probe; a failed probe opens it again for
    // 300 ms. Over one second of tasks A sees exactly the probes at 300,
    // 600 and 900 ms (each a task's first attempt, retried on B).
    let t0 = Instant::now();
    let mut sent = 0;
    while Instant::now() - t0 < Duration::from_millis(1000) {
        let r = d.submit(Task::get("svc", format!("/o/{sent}"))).await;
        assert_eq!(r.node(), Some(B));
        sent += 1;
    }
    let probes = sent_ms(&b, t0, "/o/")
        .into_iter()
        .zip(b.sent().iter().filter(|s| s.path.starts_with("/o/")))
        .filter(|(_, s)| s.addr == A)
        .map(|(t, _)| t)
        .collect::<Vec<_>>();
    assert_eq!(probes.len(), 3, "probes at {probes:?} of {sent} tasks");
    // The breaker opened a few ms before t0 (its 3rd failure), each
    // probe's failure opens it for 300 ms again.
    assert!(
        (290..=300).contains(&probes[0]),
        "first probe at {probes:?}"
    );
    for w in probes.windows(2) {
        assert!((300..=305).contains(&(w[1] - w[0])), "probes at {probes:?}");
    }
    assert_eq!(node(&d, A).await.trips, 4, "each failed probe trips again");
    // A recovers: the next probe closes the breaker and A takes its half.
    failing.store(false, Ordering::Relaxed);
    sleep(350).await;
    let back = one_by_one(&d, "r", 40).await;
    assert_eq!(successes(&back), 40);
    assert_eq!(node(&d, A).await.breaker, BreakerStatus::Closed);
    assert_eq!(b.count(A, "/r/"), 20, "A used again, half of round robin");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn all_open_fails_fast_with_when_or_falls_back() {
    tokio::time::pause();
    let b = Backends::new(|_: &Req| Act::status(500, 0));
    let d = start(
        &b,
        config(
            "p2c",
            &[(A, 1, 10)],
            r#","breaker":{"consecutive_failures":2,"open_for":"2s"},"retry":{"max_retries":0}"#,
        ),
    );
    for _ in 0..2 {
        let r = d.submit(Task::get("svc", "/x")).await;
        assert!(matches!(r.outcome, Outcome::Failure(_)), "{r:?}");
    }
    // Tripped when the second failure came back (at once): it half-opens
    // 2 s later. Each refusal says how long is left, counted when it is
    // refused.
    let trip = b.times("/x")[1];
    at(trip, 20).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(Instant::now() - trip, millis(20), "fails fast");
    assert_eq!(circuit_open_for(&r), 1980, "{r:?}");
    assert!(r.rejection().unwrap().to_string().contains("half-opens in"));
    assert_counts(&d, 0, 2, 1).await;
    at(trip, 1920).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(circuit_open_for(&r), 80, "1.92 s into the 2 s: {r:?}");
    at(trip, 1999).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(circuit_open_for(&r), 1, "{r:?}");
    // At 2 s it may half-open: nothing is left to wait. The balancer's
    // timer for it fires on the tick after, and the gate's reopening
    // reaches the queue after this refusal's tick.
    for n in [2000, 2001] {
        at(trip, n).await;
        let r = d.submit(Task::get("svc", "/x")).await;
        assert_eq!(circuit_open_for(&r), 0, "{r:?}");
    }
    // Rejected without a request until then; then one probe.
    assert_eq!(b.times("/x").len(), 2);
    at(trip, 2002).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(matches!(r.outcome, Outcome::Failure(_)), "the probe: {r:?}");
    let t = b.times("/x");
    assert_eq!(t.len(), 3);
    assert_eq!(t[2] - trip, millis(2002), "half-open 2 s after the trip");
    // The probe failed: open again, for twice as long, and the refusals
    // count down the new period from the re-trip.
    let retrip = t[2];
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(circuit_open_for(&r), 4000, "re-tripped for 4 s: {r:?}");
    at(retrip, 2500).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(circuit_open_for(&r), 1500, "{r:?}");
    at(retrip, 3999).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert_eq!(circuit_open_for(&r), 1, "{r:?}");
    assert_eq!(b.times("/x").len(), 3);
    at(retrip, 4002).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(matches!(r.outcome, Outcome::Failure(_)), "the probe: {r:?}");
    let t = b.times("/x");
    assert_eq!(t.len(), 4);
    assert_eq!(
        t[3] - retrip,
        millis(4002),
        "half-open 4 s after the re-trip"
    );
    assert_counts(&d, 0, 4, 8).await;
    d.shutdown(Duration::from_secs(1)).await;

    // The same with a fallback response configured.
    let b = Backends::new(|_: &Req| Act::status(500, 0));
    let d = start(
        &b,
        config(
            "p2c",
            &[(A, 1, 10)],
            r#","breaker":{"consecutive_failures":1,"open_for":"5s"},"retry":{"max_retries":0},
               "fallback":{"status":200,"headers":{"x-fallback":"1"},"body":"cached"}"#,
        ),
    );
    let _ = d.submit(Task::get("svc", "/x")).await;
    sleep(20).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    match &r.outcome {
        Outcome::Fallback {
            response, reason, ..
        } => {
            assert_eq!(response.status, 200);
            assert_eq!(&response.body[..], b"cached");
            assert_eq!(response.header("x-fallback"), Some("1"));
            assert!(matches!(reason, Rejection::CircuitOpen { .. }));
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(b.times("/x").len(), 1);
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!(q.fallbacks, 1);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn all_open_wait_mode_holds_tasks_until_half_open() {
    tokio::time::pause();
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let b = Backends::new(move |_: &Req| {
        if f.load(Ordering::Relaxed) {
            Act::status(500, 0)
        } else {
            Act::ok(5)
        }
    });
    let d = start(
        &b,
        config(
            "p2c",
            &[(A, 1, 10)],
            r#","breaker":{"consecutive_failures":2,"open_for":"400ms","on_all_open":"wait"},
               "retry":{"max_retries":0}"#,
        ),
    );
    let t0 = Instant::now();
    for _ in 0..2 {
        let _ = d.submit(Task::get("svc", "/x")).await;
    }
    failing.store(false, Ordering::Relaxed);
    let results = burst(&d, 5, "w").await;
    assert_eq!(successes(&results), 5, "{:?}", results[0].outcome);
    // They waited for the breaker rather than being rejected: the probe
    // goes at 400 ms, the other four once its answer closed the breaker.
    let sent = sent_ms(&b, t0, "/w/");
    assert_eq!(sent.len(), 5);
    assert!(
        sent.iter().all(|t| (400..=420).contains(t)),
        "sent at {sent:?}"
    );
    assert_eq!(
        sent.iter().filter(|t| **t <= 401).count(),
        1,
        "one probe first: {sent:?}"
    );
    assert_counts(&d, 5, 2, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn max_ejected_percent_keeps_the_healthiest_open_node_serving() {
    tokio::time::pause();
    for capped in [false, true] {
        let failing = Arc::new(AtomicBool::new(true));
        let f = failing.clone();
        let b = Backends::new(move |_: &Req| {
            if f.load(Ordering::Relaxed) {
                Act::status(503, 0)
            } else {
                Act::ok(0)
            }
        });
        let d = start(
            &b,
            config(
                "round_robin",
                &[(A, 1, 10), (B, 1, 10)],
                if capped {
                    r#","breaker":{"consecutive_failures":1,"open_for":"30s","max_ejected_percent":50},"retry":{"max_retries":0}"#
                } else {
                    r#","breaker":{"consecutive_failures":1,"open_for":"30s"},"retry":{"max_retries":0}"#
                },
            ),
        );
        for i in 0..2 {
            let _ = d.submit(Task::get("svc", format!("/trip/{i}"))).await;
        }
        sleep(20).await;
        let s = d.stats().await;
        assert!(
            s.services[0].nodes.iter().all(|n| n.trips == 1),
            "both tripped"
        );
        // The backends recover; both breakers stay open for 30 s.
        failing.store(false, Ordering::Relaxed);
        let r = d.submit(Task::get("svc", "/after")).await;
        if capped {
            // At most half the pool may be ejected: one node still serves.
            assert!(r.is_success(), "{:?}", r.outcome);
            assert_counts(&d, 1, 2, 0).await;
        } else {
            assert!(matches!(r.rejection(), Some(Rejection::CircuitOpen { .. })));
            assert!(b.times("/after").is_empty());
            assert_counts(&d, 0, 2, 1).await;
        }
        d.shutdown(Duration::from_secs(1)).await;
    }
}

// ---------------------------------------------------- rate limits, budget

#[actix_rt::test]
async fn rate_limit_wait_holds_the_backend_to_the_rate() {
    tokio::time::pause();
    let b = Backends::new(|_: &Req| Act::ok(0));
    let d = start(
        &b,
        config(
            "p2c",
            &[(A, 1, 50)],
            r#","rate_limit":{"per_node":{"rate":50,"burst":5},"on_limit":"wait"}"#,
        ),
    );
    let t0 = Instant::now();
    let results = burst(&d, 80, "rl").await;
    assert_eq!(successes(&results), 80);
    // A burst of 5 at once, then one every 20 ms (50/s): the last of the
    // 80 at 75 x 20 = 1500 ms.
    let mut sent = sent_ms(&b, t0, "/rl/");
    sent.sort_unstable();
    assert_eq!(sent.len(), 80);
    for (i, t) in sent.iter().enumerate() {
        let due = (i as u64).saturating_sub(4) * 20;
        assert!(
            (due..=due + 1).contains(t),
            "request {i} at {t} ms, due {due}"
        );
    }
    assert_counts(&d, 80, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn rate_limit_reject_reproduces_the_seed_burst() {
    tokio::time::pause();
    let b = Backends::new(|_: &Req| Act::ok(0));
    let d = start(
        &b,
        config(
            "p2c",
            &[(A, 1, 100)],
            r#","rate_limit":{"service":{"rate":20,"burst":10},"on_limit":"reject"}"#,
        ),
    );
    let results = burst(&d, 50, "s").await;
    let limited = results
        .iter()
        .filter(|r| matches!(r.rejection(), Some(Rejection::RateLimited { .. })))
        .count();
    assert_eq!(
        (successes(&results), limited),
        (10, 40),
        "the burst, no more"
    );
    assert_eq!(b.sent().len(), 10, "only the admitted were sent");
    assert_counts(&d, 10, 0, 40).await;
    for r in &results {
        if let Some(Rejection::RateLimited { retry_after, .. }) = r.rejection() {
            assert!(
                *retry_after > Duration::ZERO && *retry_after <= Duration::from_millis(50),
                "the next token within one interval (50 ms): {retry_after:?}"
            );
        }
    }
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_total_outage_is_capped_by_the_retry_budget() {
    tokio::time::pause();
    let b = Backends::new(|_: &Req| Act::status(503, 1));
    let d = start(
        &b,
        config(
            "round_robin",
            &[(A, 1, 50), (B, 1, 50)],
            r#","breaker":{"enabled":false},
               "retry":{"max_retries":10,"backoff_base":"1ms","backoff_max":"5ms","budget_percent":0.2,"min_retries_per_sec":1}"#,
        ),
    );
    let t0 = Instant::now();
    const N: u64 = 500;
    let results = run(&d, N as usize, 100, "o").await;
    let t = (Instant::now() - t0).as_secs_f64();
    let q = d.stats().await.services[0].queue.clone();
    // Budget: 20 % of first attempts plus 1/s over the window (10 s) and
    // the run.
    let cap = 0.2 * N as f64 + (t + 10.0);
    assert!((q.retried as f64) <= cap, "retried {} > {cap}", q.retried);
    assert!(q.retried >= 100, "the budget was used: {}", q.retried);
    let budget = results
        .iter()
        .filter(|r| matches!(&r.outcome, Outcome::Failure(f) if f.reason == FailReason::BudgetExhausted))
        .count() as u64;
    let exhausted = results
        .iter()
        .filter(|r| matches!(&r.outcome, Outcome::Failure(f) if f.reason == FailReason::RetriesExhausted))
        .count() as u64;
    assert_eq!(
        budget + exhausted,
        N,
        "every task failed, on the budget or its retries"
    );
    assert!(budget > 300, "most tasks failed on the budget: {budget}");
    assert_eq!(b.sent().len() as u64, N + q.retried);
    assert_counts(&d, 0, N, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

// ------------------------------------------------------------- supervision

#[actix_rt::test]
async fn a_stopped_node_actor_is_restarted_with_its_state() {
    tokio::time::pause();
    let b = Backends::new(|r: &Req| if r.addr == A { Act::ok(20) } else { Act::ok(1) });
    let d = start(&b, config("round_robin", &[(A, 1, 10), (B, 1, 10)], ""));
    let d2 = d.clone();
    let load = actix_rt::spawn(async move { run(&d2, 400, 20, "sup").await });
    sleep(100).await;
    let before = b.count(A, "/sup/");
    assert!(before > 0);
    d.restart_node("svc", A).await.unwrap();
    let results = load.await.unwrap();
    assert_eq!(successes(&results), 400);
    assert!(results.iter().all(|r| r.attempts.len() == 1), "none lost");
    sleep(1100).await; // one load report
    let a = node(&d, A).await;
    let bn = node(&d, B).await;
    assert_eq!(a.restarts, 1);
    assert_eq!(
        a.total as usize,
        b.count(A, "/sup/"),
        "counters kept across the restart"
    );
    assert_eq!(a.total + bn.total, 400);
    assert_counts(&d, 400, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

// -------------------------------------------------------------- balancing

/// Requests of 2 000 tasks (24 at a time) the slow node gets: five nodes
/// answer in 10 ms, the sixth in 300 ms.
async fn slow_share(mode: &str) -> usize {
    let b = Backends::new(|r: &Req| {
        if r.addr == F {
            Act::ok(300)
        } else {
            Act::ok(10)
        }
    });
    let nodes: Vec<_> = [A, B, C, D, E, F].iter().map(|a| (*a, 1, 64)).collect();
    let d = start(&b, config(mode, &nodes, r#","balancer":{"seed":7}"#));
    let results = run(&d, 2000, 24, mode).await;
    assert_eq!(successes(&results), 2000);
    assert_counts(&d, 2000, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
    b.count(F, "/")
}

#[actix_rt::test]
async fn p2c_starves_a_slow_node_where_round_robin_gives_it_a_sixth() {
    tokio::time::pause();
    let rr = slow_share("round_robin").await;
    let p2c = slow_share("p2c").await;
    assert_eq!(rr, 333, "round robin: a sixth of 2000");
    // Seeded draws on a paused clock: the same few probes of the slow node
    // each run (round robin would have given it 333).
    assert_eq!(p2c, 5, "p2c share of 2000");
}

#[actix_rt::test]
async fn slow_start_ramps_a_joining_nodes_weight() {
    tokio::time::pause();
    let b = Backends::new(|_: &Req| Act::ok(1));
    let d = start(
        &b,
        config(
            "weighted",
            &[(A, 10, 10), (B, 10, 10)],
            r#","balancer":{"seed":7,"slow_start":"3s","slow_start_floor":0.1}"#,
        ),
    );
    d.add_endpoint("svc", EndpointConfig::new(C).weight(10))
        .await
        .unwrap();
    let t0 = Instant::now();
    let early = one_by_one(&d, "early", 120).await;
    assert_eq!(successes(&early), 120);
    let spent = ms(Instant::now() - t0);
    let w0 = node(&d, C).await.effective_weight;
    let early_share = b.count(C, "/early/");
    sleep(3100).await;
    assert_eq!(node(&d, C).await.effective_weight, 10);
    let _ = one_by_one(&d, "late", 120).await;
    let late_share = b.count(C, "/late/");
    assert_eq!(late_share, 40, "full weight: a third of 120");
    // Early, its weight ramps from 1 (10 %) to 2 over the 240 ms the 120
    // tasks take: 7 of 120, where full weight gives 40.
    assert_eq!(
        (early_share, w0, spent),
        (7, 2, 240),
        "early {early_share} late {late_share}"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn health_checks_mark_a_stopped_backend_out_and_a_restarted_one_in() {
    tokio::time::pause();
    let a_down = Arc::new(AtomicBool::new(false));
    let b_sick = Arc::new(AtomicBool::new(false));
    let (ad, bs) = (a_down.clone(), b_sick.clone());
    let b = Backends::new(move |r: &Req| {
        if r.addr == A && ad.load(Ordering::Relaxed) {
            Act::Fail {
                kind: ErrorKind::Connect,
                after: Duration::ZERO,
            }
        } else if r.addr == B && r.path == "/health" && bs.load(Ordering::Relaxed) {
            Act::status(503, 0)
        } else {
            Act::ok(1)
        }
    });
    let d = start(
        &b,
        config(
            "round_robin",
            &[(A, 1, 10), (B, 1, 10)],
            r#","health_check":{"path":"/health","interval":"100ms","timeout":"100ms","unhealthy_threshold":2,"healthy_threshold":2}"#,
        ),
    );
    let health = |s: &actix_dispatch::Stats, u: &str| s.services[0].node(u).unwrap().health;
    // Probes go every 100 ms (each answered in 1 ms, at 101, 201, ...);
    // every check below falls between two of them.
    let t0 = Instant::now();
    let until = |at: u64| {
        tokio::time::sleep(
            (t0 + Duration::from_millis(at)).saturating_duration_since(Instant::now()),
        )
    };
    until(650).await;
    assert_eq!(health(&d.stats().await, A), "healthy");
    assert_eq!(sent_ms(&b, t0, "/health").len(), 12, "6 probes each");
    assert_eq!(b.count(A, "/health"), 6);
    // A stops: the probes at 700 and 800 fail, two in a row mark it out.
    a_down.store(true, Ordering::Relaxed);
    until(750).await;
    assert_eq!(
        health(&d.stats().await, A),
        "healthy",
        "one failed probe is not enough"
    );
    until(850).await;
    assert_eq!(health(&d.stats().await, A), "unhealthy");
    let results = one_by_one(&d, "out", 20).await;
    assert!(
        results.iter().all(|r| r.node() == Some(B)),
        "no task to the unhealthy node"
    );
    // A is back: the probes at 900 and 1000 succeed, two mark it in.
    until(880).await;
    a_down.store(false, Ordering::Relaxed);
    until(950).await;
    assert_eq!(
        health(&d.stats().await, A),
        "unhealthy",
        "one good probe is not enough"
    );
    until(1050).await;
    assert_eq!(health(&d.stats().await, A), "healthy");
    let results = one_by_one(&d, "in", 20).await;
    assert_eq!(b.count(A, "/in/"), 10, "back to its half");
    assert_eq!(successes(&results), 20);
    // An unhealthy-but-serving node (503 on /health) is marked out too.
    until(1080).await;
    b_sick.store(true, Ordering::Relaxed);
    until(1150).await;
    assert_eq!(health(&d.stats().await, B), "healthy");
    until(1250).await;
    assert_eq!(health(&d.stats().await, B), "unhealthy");
    let results = one_by_one(&d, "sick", 10).await;
    assert!(results.iter().all(|r| r.node() == Some(A)));
    assert_counts(&d, 50, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

/// 12 GETs one after the other over A (1 ms) and B (600 ms), and how many
/// took longer than 450 ms.
async fn slow_tasks(d: &Dispatcher, tag: &str) -> usize {
    let mut slow = 0;
    for r in one_by_one(d, tag, 12).await {
        assert!(r.is_success(), "{r:?}");
        slow += (r.total > Duration::from_millis(450)) as usize;
    }
    slow
}

#[actix_rt::test]
async fn hedging_cuts_a_slow_nodes_latency_and_never_duplicates_posts() {
    tokio::time::pause();
    let b = Backends::new(|r: &Req| {
        if r.addr == B {
            Act::ok(600)
        } else {
            Act::ok(1)
        }
    });
    let nodes = [(A, 1, 10), (B, 1, 10)];
    let plain = start(&b, config("round_robin", &nodes, ""));
    assert_eq!(
        slow_tasks(&plain, "plain").await,
        6,
        "half the tasks hit the slow node"
    );
    plain.shutdown(Duration::from_secs(1)).await;
    let hedged = start(
        &b,
        config("round_robin", &nodes, r#","hedge":{"after":"40ms"}"#),
    );
    let mut worst = Duration::ZERO;
    for r in one_by_one(&hedged, "hg", 12).await {
        assert!(r.is_success(), "{r:?}");
        worst = worst.max(r.total);
    }
    // Each task that went to B first was answered by its hedge on A,
    // sent 40 ms later: 41 ms.
    assert!(
        worst >= Duration::from_millis(41) && worst <= Duration::from_millis(43),
        "{worst:?}"
    );
    // Round robin: the first task goes to A; the later ones to B first
    // (its hedge took A's turn). A hedged attempt that lost keeps its slot
    // at B until B answers (600 ms, longer than the whole run), so B's 10
    // slots are full after 10 of them and the last task goes to A alone:
    // 10 of the 12 are hedged.
    let q = hedged.stats().await.services[0].queue.clone();
    assert_eq!(q.hedged, 10);
    assert_eq!(b.count(B, "/hg/"), 10);
    assert_eq!(b.count(A, "/hg/"), 12);
    // Non-idempotent tasks are never sent twice.
    for i in 0..6 {
        let r = hedged
            .submit(Task::new("svc", Method::POST, format!("/post/{i}")).body("x"))
            .await;
        assert!(r.is_success());
        assert_eq!(r.attempts.len(), 1);
    }
    assert_eq!(b.count(A, "/post/") + b.count(B, "/post/"), 6);
    assert_eq!(hedged.stats().await.services[0].queue.hedged, 10);
    hedged.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn hedging_after_a_latency_percentile() {
    tokio::time::pause();
    let slow_b = Arc::new(AtomicU64::new(1));
    let sb = slow_b.clone();
    let b = Backends::new(move |r: &Req| {
        if r.addr == B {
            Act::ok(sb.load(Ordering::Relaxed))
        } else {
            Act::ok(1)
        }
    });
    let d = start(
        &b,
        config(
            "round_robin",
            &[(A, 1, 10), (B, 1, 10)],
            r#","hedge":{"percentile":90}"#,
        ),
    );
    // Learn the service's latency (1 ms), then one node turns slow.
    assert_eq!(successes(&one_by_one(&d, "warm", 40).await), 40);
    slow_b.store(600, Ordering::Relaxed);
    assert_eq!(
        slow_tasks(&d, "p").await,
        0,
        "hedged at the p90 of recent latency"
    );
    // As above: 10 of the 12 went to B first and were hedged, until the
    // lost attempts filled B's 10 slots.
    assert_eq!(d.stats().await.services[0].queue.hedged, 10);
    d.shutdown(Duration::from_secs(1)).await;
}
