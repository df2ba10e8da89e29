//! Promises the README makes, each held to exact figures under paused tokio
//! time with a scripted in-process transport (`scripted`): a `Retry-After`
//! below the cap delays the retry by exactly that much (in seconds and as an
//! HTTP date); a task too late to be worth an attempt is failed without one;
//! a node's breaker survives a reload; a node that recovers ramps up under
//! slow start; a panic inside a node actor itself is caught and the node
//! restarted with its attempts.

mod scripted;

use std::time::{Duration, SystemTime};

use actix_dispatch::{
    BreakerStatus, Config, Dispatcher, FailReason, Instant, Outcome, Rejection, Task, TaskResult,
};
use scripted::{Act, Backends, Req};

/// A timer fires at most one tokio tick late, never early.
const TICK: Duration = Duration::from_millis(1);

const A: &str = "http://127.0.0.1:9/";
const B: &str = "http://127.0.0.2:9/";
const C: &str = "http://127.0.0.3:9/";

fn config(mode: &str, nodes: &[(&str, u32)], extra: &str) -> Config {
    let eps: Vec<String> = nodes
        .iter()
        .map(|(a, w)| format!(r#"{{"address":"{a}","weight":{w},"max_concurrent":10}}"#))
        .collect();
    Config::from_json(&format!(
        r#"{{"services":[{{"name":"svc","mode":"{mode}","timeout":"1s",
            "endpoints":[{}],"balancer":{{"seed":7}}{extra}}}]}}"#,
        eps.join(",")
    ))
    .unwrap()
}

fn start(backends: &Backends, config: Config) -> Dispatcher {
    Dispatcher::builder(config)
        .transport(backends.factory())
        .start()
        .unwrap()
}

/// Lets the pipeline's actors run until nothing more is ready.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

async fn node(d: &Dispatcher, addr: &str) -> actix_dispatch::NodeStats {
    d.stats().await.services[0].node(addr).unwrap().clone()
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

/// Retries 1 ms apart unless a `Retry-After` says otherwise (cap 10 s).
const RETRY: &str = r#","breaker":{"enabled":false},
    "retry":{"max_retries":3,"backoff_base":"1ms","backoff_max":"1ms","max_retry_after":"10s"}"#;

/// The first answer to each path is `status` with `Retry-After: value`,
/// then 200.
fn pushback(status: u16, value: impl Fn() -> String + Send + Sync + 'static) -> Backends {
    Backends::new(move |r: &Req| match r.nth {
        0 => Act::Answer {
            status,
            after: Duration::ZERO,
            headers: vec![("retry-after", value())],
        },
        _ => Act::ok(0),
    })
}

#[actix_rt::test]
async fn a_retry_after_in_seconds_below_the_cap_delays_the_retry_exactly() {
    tokio::time::pause();
    for (status, value, wait) in [
        (503, "3", Duration::from_secs(3)),
        (429, "7", Duration::from_secs(7)),
        // Over the cap: the cap.
        (503, "60", Duration::from_secs(10)),
    ] {
        let b = pushback(status, move || value.to_owned());
        let d = start(&b, config("round_robin", &[(A, 1)], RETRY));
        let r = d.submit(Task::get("svc", "/x")).await;
        assert!(r.is_success(), "{r:?}");
        assert_eq!(r.attempts.len(), 2);
        let t = b.times("/x");
        let gap = t[1] - t[0];
        assert!(
            gap >= wait && gap <= wait + TICK,
            "{status} Retry-After {value}: retried after {gap:?}"
        );
        assert_counts(&d, 1, 0, 0).await;
        assert_eq!(d.stats().await.services[0].queue.retried, 1);
        d.shutdown(Duration::from_secs(1)).await;
    }
}

#[actix_rt::test]
async fn a_retry_after_as_an_http_date_delays_the_retry_until_then() {
    tokio::time::pause();
    // An HTTP date has whole seconds and is read against the wall clock,
    // which paused time does not stop: the date is 4 s from now (so 3 to
    // 4 s away once truncated), and the wait expected is the date less
    // the wall clock when the answer was made; the engine reads the wall
    // clock a little later, so waits a little less (real microseconds; 50
    // ms allows a busy machine). A wait of a fraction of a millisecond is
    // rounded up to the timer's next tick, then fires at most a tick late.
    let made: std::sync::Arc<std::sync::Mutex<Option<SystemTime>>> = Default::default();
    let made2 = made.clone();
    let b = pushback(503, move || {
        let now = SystemTime::now();
        *made2.lock().unwrap() = Some(now);
        httpdate::fmt_http_date(now + Duration::from_secs(4))
    });
    let d = start(&b, config("round_robin", &[(A, 1)], RETRY));
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(r.is_success(), "{r:?}");
    let t = b.times("/x");
    let gap = t[1] - t[0];
    let made = made.lock().unwrap().unwrap();
    let date =
        httpdate::parse_http_date(&httpdate::fmt_http_date(made + Duration::from_secs(4))).unwrap();
    let expected = date.duration_since(made).unwrap();
    assert!(expected > Duration::from_secs(3), "{expected:?}");
    assert!(
        gap <= expected + 2 * TICK && gap + Duration::from_millis(50) >= expected,
        "retried after {gap:?}, the date was {expected:?} away"
    );
    assert_counts(&d, 1, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_retry_after_past_the_deadline_fails_the_task_at_once() {
    tokio::time::pause();
    let b = pushback(503, || "5".to_owned());
    let d = start(&b, config("round_robin", &[(A, 1)], RETRY));
    let t0 = Instant::now();
    let r = d
        .submit(Task::get("svc", "/x").deadline_in(Duration::from_secs(2)))
        .await;
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::DeadlineExceeded),
        o => panic!("{o:?}"),
    }
    assert_eq!(Instant::now() - t0, Duration::ZERO, "at once");
    assert_eq!(b.times("/x").len(), 1);
    assert_counts(&d, 0, 1, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_task_too_late_to_be_worth_an_attempt_is_failed_without_one() {
    tokio::time::pause();
    // Every answer takes 100 ms: the service's recent latencies say so.
    let b = Backends::new(|_: &Req| Act::ok(100));
    let d = start(&b, config("round_robin", &[(A, 1)], ""));
    let warm: Vec<TaskResult> = futures::future::join_all((0..20).map(|i| {
        d.submit(Task::get("svc", format!("/warm/{i}")).deadline_in(Duration::from_secs(5)))
    }))
    .await;
    assert!(warm.iter().all(TaskResult::is_success));
    settle().await;
    // 50 ms left, an attempt takes 100: not sent, failed at once.
    let t0 = Instant::now();
    let r = d
        .submit(Task::get("svc", "/late").deadline_in(Duration::from_millis(50)))
        .await;
    assert_eq!(Instant::now() - t0, Duration::ZERO, "at once: {r:?}");
    assert!(
        matches!(&r.outcome, Outcome::Rejected(Rejection::DeadlinePassed)),
        "{r:?}"
    );
    assert!(r.attempts.is_empty(), "{:?}", r.attempts);
    assert!(b.times("/late").is_empty(), "never sent");
    // With time for an attempt it is sent.
    let r = d
        .submit(Task::get("svc", "/in-time").deadline_in(Duration::from_millis(300)))
        .await;
    assert!(r.is_success(), "{r:?}");
    assert_eq!(b.times("/in-time").len(), 1);
    assert_counts(&d, 21, 0, 1).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_nodes_breaker_is_kept_across_a_reload() {
    tokio::time::pause();
    // A fails everything; its breaker opens after 2 failures for 30 s.
    let b = Backends::new(|r: &Req| {
        if r.addr == A {
            Act::status(503, 0)
        } else {
            Act::ok(1)
        }
    });
    let extra = r#","breaker":{"consecutive_failures":2,"open_for":"30s","max_open_for":"60s"},
        "retry":{"max_retries":0}"#;
    let d = start(&b, config("round_robin", &[(A, 1), (B, 1)], extra));
    for i in 0..4 {
        d.submit(Task::get("svc", format!("/trip/{i}"))).await;
    }
    assert_eq!(b.count(A, "/trip/"), 2);
    let before = node(&d, A).await;
    assert_eq!((before.breaker, before.trips), (BreakerStatus::Open, 1));
    // A reload that keeps A (with a new weight) and adds C.
    let report = d
        .reload(config("round_robin", &[(A, 2), (B, 1), (C, 1)], extra))
        .await
        .unwrap();
    let (_, summary) = &report.changed[0];
    assert_eq!(summary.added, vec![C.to_owned()]);
    assert_eq!(summary.updated, vec![A.to_owned()]);
    settle().await;
    let after = node(&d, A).await;
    assert_eq!((after.breaker, after.trips), (BreakerStatus::Open, 1));
    assert_eq!((after.total, after.errors), (before.total, before.errors));
    // Still open: nothing goes to A for the rest of its 30 s.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for i in 0..30 {
        let r = d.submit(Task::get("svc", format!("/after/{i}"))).await;
        assert!(r.is_success(), "{r:?}");
    }
    assert_eq!(b.count(A, "/after/"), 0);
    assert_eq!(b.count(B, "/after/") + b.count(C, "/after/"), 30);
    assert_counts(&d, 32, 2, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

/// Requests for the tasks tagged `tag` that went to `addr`.
fn share(b: &Backends, addr: &str, tag: &str) -> usize {
    b.count(addr, &format!("/{tag}/"))
}

async fn run(d: &Dispatcher, tag: &str, n: usize) {
    for i in 0..n {
        let r = d.submit(Task::get("svc", format!("/{tag}/{i}"))).await;
        assert!(r.is_success(), "{r:?}");
    }
}

#[actix_rt::test]
async fn a_node_that_recovers_its_breaker_ramps_up_under_slow_start() {
    tokio::time::pause();
    // B fails until told otherwise; breaker after 1 failure, open 1 s.
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = failing.clone();
    let b = Backends::new(move |r: &Req| {
        if r.addr == B && f.load(std::sync::atomic::Ordering::Relaxed) {
            Act::status(503, 0)
        } else {
            Act::ok(1)
        }
    });
    let extra = r#","breaker":{"consecutive_failures":1,"open_for":"1s","max_open_for":"1s"},
        "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"},
        "balancer":{"seed":7,"slow_start":"10s","slow_start_floor":0.1}"#;
    let d = start(&b, config("weighted", &[(A, 10), (B, 10)], extra));
    run(&d, "trip", 4).await;
    assert_eq!(node(&d, B).await.breaker, BreakerStatus::Open);
    failing.store(false, std::sync::atomic::Ordering::Relaxed);
    // After the open second a probe closes it: B is back, at 10 % of its
    // weight, and ramps to all of it over 10 s.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    run(&d, "probe", 4).await;
    assert_eq!(node(&d, B).await.breaker, BreakerStatus::Closed);
    run(&d, "early", 110).await;
    let early = share(&b, B, "early");
    tokio::time::sleep(Duration::from_secs(10)).await;
    run(&d, "late", 110).await;
    let late = share(&b, B, "late");
    assert_eq!(node(&d, B).await.effective_weight, 10);
    // Smooth weighted round robin: half of 110 at full weight; 1 in 11 at
    // the floor (the 110 ms of the early run move the ramp by 1 %).
    assert_eq!(late, 55, "full weight");
    assert_eq!(early, 10, "at the floor, weight 1 against 10: 1 in 11");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_node_marked_healthy_again_ramps_up_under_slow_start() {
    tokio::time::pause();
    let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dn = down.clone();
    let b = Backends::new(move |r: &Req| {
        if r.addr == B && r.path == "/health" && dn.load(std::sync::atomic::Ordering::Relaxed) {
            Act::status(503, 0)
        } else {
            Act::ok(1)
        }
    });
    let extra = r#","health_check":{"path":"/health","interval":"100ms","timeout":"50ms",
            "unhealthy_threshold":1,"healthy_threshold":1},
        "balancer":{"seed":7,"slow_start":"10s","slow_start_floor":0.1}"#;
    let d = start(&b, config("weighted", &[(A, 10), (B, 10)], extra));
    tokio::time::sleep(Duration::from_millis(250)).await;
    down.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(node(&d, B).await.health, "unhealthy");
    run(&d, "out", 20).await;
    assert_eq!(share(&b, B, "out"), 0, "an unhealthy node takes nothing");
    down.store(false, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(node(&d, B).await.health, "healthy");
    run(&d, "early", 110).await;
    let early = share(&b, B, "early");
    tokio::time::sleep(Duration::from_secs(10)).await;
    run(&d, "late", 110).await;
    let late = share(&b, B, "late");
    assert_eq!(late, 55, "full weight");
    assert_eq!(early, 10, "at the floor, weight 1 against 10: 1 in 11");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_panic_inside_a_node_actor_is_caught_and_the_node_restarted() {
    tokio::time::pause();
    // Every answer takes 200 ms; 100 tasks over A and B, 10 slots each.
    let b = Backends::new(|_: &Req| Act::ok(200));
    let extra = r#","breaker":{"enabled":false},
        "retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"1ms"}"#;
    let d = start(&b, config("round_robin", &[(A, 1), (B, 1)], extra));
    let d2 = d.clone();
    let all = actix_rt::spawn(async move {
        futures::future::join_all((0..100).map(|i| d2.submit(Task::get("svc", format!("/t/{i}")))))
            .await
    });
    // A's actor panics (in a handler, not an attempt) with its 10 attempts
    // in flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(b.count(A, "/t/"), 10);
    d.node_fault_drill("svc", A).await.unwrap();
    let results = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every task answered")
        .unwrap();
    let mut ids: Vec<u64> = results.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 100, "one answer each");
    // The panic was caught and the node restarted with its attempts in
    // flight: they finished there, nothing was lost, every task succeeded.
    let ok = results.iter().filter(|r| r.is_success()).count() as u64;
    assert_eq!(ok, 100, "{:?}", results.iter().find(|r| !r.is_success()));
    assert!(results.iter().all(|r| r.attempts.len() == 1));
    assert_eq!(b.count(A, "/t/") + b.count(B, "/t/"), 100);
    assert!(b.count(A, "/t/") > 10, "A serves again after its restart");
    let a = node(&d, A).await;
    assert_eq!((a.restarts, a.errors), (1, 0), "{a:?}");
    assert_counts(&d, ok, 100 - ok, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_transport_panicking_on_a_health_probe_fails_the_probe_not_the_node() {
    tokio::time::pause();
    let panics = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let p = panics.clone();
    let b = Backends::new(move |r: &Req| {
        if r.addr == A && r.path == "/health" && p.load(std::sync::atomic::Ordering::Relaxed) {
            Act::PanicNow
        } else {
            Act::ok(1)
        }
    });
    let extra = r#","health_check":{"path":"/health","interval":"100ms","timeout":"50ms",
            "unhealthy_threshold":1,"healthy_threshold":1}"#;
    let d = start(&b, config("round_robin", &[(A, 1), (B, 1)], extra));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let a = node(&d, A).await;
    assert_eq!((a.health, a.restarts), ("unhealthy", 0), "{a:?}");
    run(&d, "out", 10).await;
    assert_eq!(share(&b, B, "out"), 10);
    // The node lived on: its next good probe brings it back.
    panics.store(false, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(node(&d, A).await.health, "healthy");
    run(&d, "back", 10).await;
    assert_eq!(share(&b, A, "back"), 5);
    assert_counts(&d, 20, 0, 0).await;
    d.shutdown(Duration::from_secs(1)).await;
}
