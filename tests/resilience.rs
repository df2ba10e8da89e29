//! Circuit breakers, rate limits, the retry budget, fallbacks and
//! supervision, against real loopback backends.

mod support;

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{AwcTransport, HttpReply, HttpRequest, Transport, TransportError};
use actix_dispatch::{
    AttemptOutcome, Dispatcher, ErrorKind, FailReason, Method, Outcome, Rejection, Task, TaskResult,
};
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use support::cfg::{burst, config, served_by};
use support::{backends, init_logs, Backend};

async fn node_stats(d: &Dispatcher, address: &str) -> actix_dispatch::NodeStats {
    d.stats().await.services[0].node(address).unwrap().clone()
}

async fn sleep(ms: u64) {
    actix_rt::time::sleep(Duration::from_millis(ms)).await;
}

#[actix_rt::test]
async fn a_failing_backend_is_cut_off_probed_and_used_again() {
    init_logs();
    let bs = backends(2);
    let (a, b) = (&bs[0], &bs[1]);
    let d = Dispatcher::start(config(
        "round_robin",
        &[(a, 1, 10), (b, 1, 10)],
        r#""breaker":{"consecutive_failures":3,"open_for":"300ms","max_open_for":"300ms"},
           "retry":{"backoff_base":"1ms","backoff_max":"1ms"}"#,
    ))
    .unwrap();
    for i in 0..10 {
        assert!(d
            .submit(Task::get("svc", format!("/warm/{i}")))
            .await
            .is_success());
    }
    a.set_status(Some(503));
    a.reset_counters();
    // Sequential tasks until the breaker opens: exactly 3 failures reach A.
    let mut n = 0;
    while node_stats(&d, &a.url()).await.breaker != "open" {
        let r = d.submit(Task::get("svc", format!("/f/{n}"))).await;
        assert_eq!(served_by(&r), b.url(), "every task still succeeds on B");
        n += 1;
        assert!(n < 50, "breaker never opened");
    }
    assert_eq!(a.hits(), 3, "cut off after exactly the configured failures");
    let s = node_stats(&d, &a.url()).await;
    assert_eq!(s.trips, 1);
    // While open A only sees probes: at most one per 300 ms open period.
    let start = actix_dispatch::Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_millis(1000) {
        let r = d.submit(Task::get("svc", format!("/o/{sent}"))).await;
        assert!(r.is_success());
        sent += 1;
    }
    let probes = a.hits() - 3;
    assert!(sent > 20, "{sent}");
    assert!((1..=4).contains(&probes), "probes {probes} of {sent} tasks");
    // A recovers: the next probe closes the breaker and A takes its share.
    a.set_status(None);
    sleep(350).await;
    let before = a.hits();
    for i in 0..40 {
        assert!(d
            .submit(Task::get("svc", format!("/r/{i}")))
            .await
            .is_success());
    }
    assert_eq!(node_stats(&d, &a.url()).await.breaker, "closed");
    assert!(
        a.hits() - before >= 15,
        "A used again: {}",
        a.hits() - before
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn all_open_fails_fast_with_when_or_falls_back() {
    init_logs();
    let b = Backend::start();
    b.set_status(Some(500));
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"consecutive_failures":2,"open_for":"2s"},"retry":{"max_retries":0}"#,
    ))
    .unwrap();
    for _ in 0..2 {
        let r = d.submit(Task::get("svc", "/x")).await;
        assert!(matches!(r.outcome, Outcome::Failure(_)));
    }
    sleep(20).await;
    let r = d.submit(Task::get("svc", "/x")).await;
    match r.rejection() {
        Some(Rejection::CircuitOpen { retry_after, .. }) => {
            assert!(*retry_after <= Duration::from_secs(2) && *retry_after > Duration::from_secs(1))
        }
        o => panic!("{o:?} {:?}", r.outcome),
    }
    assert!(r.to_string_reason().contains("half-opens in"));
    assert_eq!(b.hits(), 2);
    d.shutdown(Duration::from_secs(1)).await;

    // The same with a fallback response configured.
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"consecutive_failures":1,"open_for":"5s"},"retry":{"max_retries":0},
           "fallback":{"status":200,"headers":{"x-fallback":"1"},"body":"cached"}"#,
    ))
    .unwrap();
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
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!(q.fallbacks, 1);
    d.shutdown(Duration::from_secs(1)).await;
}

trait ReasonText {
    fn to_string_reason(&self) -> String;
}
impl ReasonText for TaskResult {
    fn to_string_reason(&self) -> String {
        self.rejection().map(|r| r.to_string()).unwrap_or_default()
    }
}

#[actix_rt::test]
async fn all_open_wait_mode_holds_tasks_until_half_open() {
    init_logs();
    let b = Backend::start();
    b.set_status(Some(500));
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"consecutive_failures":2,"open_for":"400ms","on_all_open":"wait"},"retry":{"max_retries":0}"#,
    ))
    .unwrap();
    for _ in 0..2 {
        let _ = d.submit(Task::get("svc", "/x")).await;
    }
    b.set_status(None);
    let start = actix_dispatch::Instant::now();
    let results: Vec<TaskResult> = burst(&d, 5, "w").await;
    assert!(
        results.iter().all(TaskResult::is_success),
        "{:?}",
        results[0].outcome
    );
    // They waited for the breaker rather than being rejected.
    assert!(start.elapsed() >= Duration::from_millis(300));
    d.shutdown(Duration::from_secs(1)).await;
}

/// Largest number of hits in any window of `w` starting at a hit.
#[allow(clippy::disallowed_types)] // the backend's own wall-clock arrival times
fn max_in_window(times: &[std::time::Instant], w: Duration) -> usize {
    let mut t = times.to_vec();
    t.sort();
    (0..t.len())
        .map(|i| t[i..].iter().take_while(|x| **x - t[i] < w).count())
        .max()
        .unwrap_or(0)
}

#[actix_rt::test]
async fn rate_limit_wait_holds_the_backend_to_the_rate() {
    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 50)],
        r#""rate_limit":{"per_node":{"rate":50,"burst":5},"on_limit":"wait"}"#,
    ))
    .unwrap();
    let results: Vec<TaskResult> = burst(&d, 80, "rl").await;
    assert!(results.iter().all(TaskResult::is_success));
    assert_eq!(b.hits(), 80);
    // Any 500 ms window: the engine admits at most burst + rate * 0.5 = 30;
    // at the backend allow a few more for network and scheduling jitter.
    let worst = max_in_window(&b.hit_times(), Duration::from_millis(500));
    assert!(worst <= 34, "{worst} hits in 500 ms");
    // 80 tasks at 50/s after a burst of 5 need at least ~1.5 s of arrivals.
    let t = b.hit_times();
    let span = *t.iter().max().unwrap() - *t.iter().min().unwrap();
    assert!(span >= Duration::from_millis(1300), "{span:?}");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn rate_limit_reject_reproduces_the_seed_burst() {
    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 100)],
        r#""rate_limit":{"service":{"rate":20,"burst":10},"on_limit":"reject"}"#,
    ))
    .unwrap();
    let results: Vec<TaskResult> = burst(&d, 50, "s").await;
    let ok = results.iter().filter(|r| r.is_success()).count();
    let limited = results
        .iter()
        .filter(|r| matches!(r.rejection(), Some(Rejection::RateLimited { .. })))
        .count();
    assert_eq!(ok + limited, 50);
    assert!((10..=13).contains(&ok), "about 10 admitted: {ok}");
    assert_eq!(b.hits() as usize, ok);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_total_outage_is_capped_by_the_retry_budget() {
    init_logs();
    let bs = backends(2);
    for b in &bs {
        b.set_status(Some(503));
    }
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 50), (&bs[1], 1, 50)],
        r#""breaker":{"enabled":false},
           "retry":{"max_retries":10,"backoff_base":"1ms","backoff_max":"5ms","budget_percent":0.2,"min_retries_per_sec":1}"#,
    ))
    .unwrap();
    let start = actix_dispatch::Instant::now();
    const N: u64 = 500;
    let results: Vec<TaskResult> = futures::stream::iter(0..N)
        .map(|i| d.submit(Task::get("svc", format!("/o/{i}"))))
        .buffer_unordered(100)
        .collect()
        .await;
    let t = start.elapsed().as_secs_f64();
    let retried = d.stats().await.services[0].queue.retried;
    // Budget: 20 % of requests plus 1/s over the window (10 s) and the run.
    let cap = 0.2 * N as f64 + 1.0 * (t + 10.0);
    assert!((retried as f64) <= cap, "retried {retried} > {cap}");
    assert!(retried >= 90, "the budget was used: {retried}");
    let budget = results
        .iter()
        .filter(|r| matches!(&r.outcome, Outcome::Failure(f) if f.reason == FailReason::BudgetExhausted))
        .count();
    assert!(budget > 300, "most tasks failed on the budget: {budget}");
    assert_eq!(bs[0].hits() + bs[1].hits(), N + retried);
    d.shutdown(Duration::from_secs(1)).await;
}

/// awc, except that a path containing "panic" panics inside the attempt.
struct PanickyTransport(AwcTransport);

impl Transport for PanickyTransport {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        if req.url.contains("panic-now") {
            panic!("transport exploded");
        }
        let later = req.url.contains("panic-later");
        let fut = self.0.send(req);
        Box::pin(async move {
            let r = fut.await;
            if later {
                panic!("exploded after the answer");
            }
            r
        })
    }
}

#[actix_rt::test]
async fn a_panic_in_an_attempt_is_a_failed_attempt_not_a_lost_task() {
    init_logs();
    let b = Backend::start();
    let factory: actix_dispatch::transport::TransportFactory = Arc::new(|_: &str| {
        Rc::new(PanickyTransport(AwcTransport::new(Duration::from_secs(1)))) as Rc<dyn Transport>
    });
    let d = Dispatcher::builder(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"enabled":false},"retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"1ms"}"#,
    ))
    .transport(factory)
    .start()
    .unwrap();
    for path in ["/panic-now", "/panic-later"] {
        let r = d.submit(Task::get("svc", path)).await;
        match &r.outcome {
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::RetriesExhausted);
                assert_eq!(f.last, Some(AttemptOutcome::Error(ErrorKind::Panicked)));
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(r.attempts.len(), 3, "idempotent: retried");
        let r = d.submit(Task::new("svc", Method::POST, path)).await;
        assert_eq!(r.attempts.len(), 1, "not idempotent: not retried");
    }
    // The node is still healthy and serving.
    assert!(d.submit(Task::get("svc", "/fine")).await.is_success());
    let s = d.stats().await;
    assert!(s.services[0].is_balanced());
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_stopped_node_actor_is_restarted_with_its_state() {
    init_logs();
    let bs = backends(2);
    bs[0].set_latency(Duration::from_millis(20));
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 10), (&bs[1], 1, 10)],
        "",
    ))
    .unwrap();
    let addr = bs[0].url();
    let d2 = d.clone();
    let load = actix_rt::spawn(async move {
        futures::stream::iter(0..400)
            .map(|i| d2.submit(Task::get("svc", format!("/sup/{i}"))))
            .buffer_unordered(20)
            .collect::<Vec<_>>()
            .await
    });
    sleep(100).await;
    let before = node_stats(&d, &addr).await.total;
    d.restart_node("svc", &addr).await.unwrap();
    let results = load.await.unwrap();
    assert_eq!(results.len(), 400);
    assert!(results.iter().all(TaskResult::is_success));
    sleep(1100).await; // one GetLoad round
    let s = node_stats(&d, &addr).await;
    assert_eq!(s.restarts, 1);
    assert!(s.total >= before, "counters kept across the restart");
    assert_eq!(s.total + node_stats(&d, &bs[1].url()).await.total, 400);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn chaos_20k_tasks_every_task_answered_once() {
    init_logs();
    let bs = backends(3);
    bs[0].fail_every(7, 503);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 16)).collect();
    let d = Dispatcher::start(config(
        "p2c",
        &nodes,
        r#""timeout":"150ms","queue":{"capacity":1000},
           "breaker":{"consecutive_failures":5,"open_for":"200ms","max_open_for":"1s"},
           "retry":{"max_retries":4,"backoff_base":"2ms","backoff_max":"20ms"}"#,
    ))
    .unwrap();
    const N: usize = 20_000;
    let tasks = futures::stream::iter((0..N).map(|i| {
        if i % 3 == 0 {
            Task::new("svc", Method::POST, format!("/p/{i}")).body("x")
        } else {
            Task::get("svc", format!("/g/{i}"))
        }
    }));
    let mut results = d.feed(tasks);
    let mut ids = std::collections::HashSet::new();
    let (mut ok, mut failed, mut rejected) = (0u64, 0u64, 0u64);
    while let Some(r) = results.next().await {
        assert!(ids.insert(r.id), "task {} answered twice", r.id);
        match &r.outcome {
            Outcome::Success(_) => ok += 1,
            Outcome::Failure(_) => failed += 1,
            _ => rejected += 1,
        }
        match ids.len() {
            3000 => bs[1].set_latency(Duration::from_millis(400)), // hangs past the timeout
            6000 => bs[1].set_latency(Duration::ZERO),
            8000 => bs[2].stop(),
            12000 => bs[2].restart(),
            14000 => d
                .restart_node("svc", &bs[0].url())
                .await
                .expect("the drill reaches the node"),
            _ => {}
        }
    }
    assert_eq!(ids.len(), N);
    let s = d.stats().await;
    let svc = &s.services[0];
    let q = &svc.queue;
    assert_eq!(
        (
            q.submitted,
            q.succeeded,
            q.failed,
            q.rejected,
            q.queued,
            q.in_flight
        ),
        (N as u64, ok, failed, rejected, 0, 0),
        "{q:?}"
    );
    // The faults happened: node 0 failed every 7th request and was
    // restarted once; node 2 was stopped, so tasks were retried.
    // (The balancer's copy of a node's counters is refreshed each second.)
    let mut n0 = node_stats(&d, &bs[0].url()).await;
    for _ in 0..30 {
        if n0.restarts > 0 {
            break;
        }
        sleep(50).await;
        n0 = node_stats(&d, &bs[0].url()).await;
    }
    assert_eq!(n0.restarts, 1, "{n0:?}");
    assert!(n0.errors > 0, "{n0:?}");
    assert!(q.retried > 0, "{q:?}");
    // How many succeed depends on how often a loaded machine stretches an
    // attempt past the 150 ms timeout; the promise above is what is tested.
    // This only guards against a collapse (most tasks failing).
    assert!(ok > N as u64 / 2, "ok {ok}");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn max_ejected_percent_keeps_the_healthiest_open_node_serving() {
    init_logs();
    let bs = backends(2);
    let run = |extra: &'static str| {
        let nodes = [(&bs[0], 1, 10), (&bs[1], 1, 10)];
        Dispatcher::start(config("round_robin", &nodes, extra)).unwrap()
    };
    for capped in [false, true] {
        for b in &bs {
            b.set_status(Some(503));
        }
        let d = run(if capped {
            r#""breaker":{"consecutive_failures":1,"open_for":"30s","max_ejected_percent":50},"retry":{"max_retries":0}"#
        } else {
            r#""breaker":{"consecutive_failures":1,"open_for":"30s"},"retry":{"max_retries":0}"#
        });
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
        for b in &bs {
            b.set_status(None);
        }
        let r = d.submit(Task::get("svc", "/after")).await;
        if capped {
            // At most half the pool may be ejected: one node still serves.
            assert!(r.is_success(), "{:?}", r.outcome);
        } else {
            assert!(matches!(r.rejection(), Some(Rejection::CircuitOpen { .. })));
        }
        d.shutdown(Duration::from_secs(1)).await;
    }
}
