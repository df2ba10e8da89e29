//! Overload against real fixed-capacity backends: more tasks than the
//! backends can take, open loop, and what that does to the nodes. These
//! runs confirm on real sockets, in half a second or so each, what
//! `tests/overload_paused.rs` holds exactly on the paused clock (the same
//! runs, three times longer, against modelled backends); here only counts
//! with wide margins are checked, never a time.

mod support;

use std::time::Duration;

use actix_dispatch::{AttemptOutcome, Dispatcher, ErrorKind, FailReason, Outcome, Rejection, Task};
use support::capacity::Capped;
use support::init_logs;
use support::open_loop::open_loop;

/// Three backends serving 2 requests at once for 40 ms each: 150 tasks/s.
fn three_capped() -> Vec<Capped> {
    (0..3)
        .map(|_| Capped::start(2, Duration::from_millis(40)))
        .collect()
}

fn config_over(bs: &[Capped], extra: &str) -> actix_dispatch::Config {
    let eps: Vec<String> = bs
        .iter()
        .map(|b| format!(r#"{{"address":"{}"}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"p2c","endpoints":[{}]{extra}}}]}}"#,
        eps.join(",")
    );
    actix_dispatch::Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// The collapse of the overload issue: at twice the backends' capacity with
/// a 250 ms deadline on every task, attempts cut by the deadline used to
/// count as the node's timeouts, the breakers of the healthy backends
/// opened, and most tasks were refused `CircuitOpen` while the backends
/// idled. A deadline is the task's: no breaker opens, and the backends keep
/// serving at their capacity.
#[actix_rt::test]
async fn deadlines_under_overload_never_open_the_breakers_of_healthy_nodes() {
    init_logs();
    let bs = three_capped();
    let d = Dispatcher::start(config_over(&bs, "")).unwrap();
    // 300 tasks/s for 0.5 s: twice the capacity.
    let results = open_loop(&d, 50, 3, |i| {
        Task::get("svc", format!("/t/{i}")).deadline_in(Duration::from_millis(250))
    })
    .await;
    let mut ok = 0;
    for r in &results {
        match &r.outcome {
            Outcome::Success(_) => ok += 1,
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::DeadlineExceeded, "{r:?}");
                // Cut by the deadline, or not sent at all because its time
                // left was below what an attempt takes.
                assert!(
                    matches!(
                        f.last,
                        None | Some(AttemptOutcome::Error(ErrorKind::Deadline))
                    ),
                    "{r:?}"
                );
            }
            // Shed by the queue's delay control (on by default): refused
            // at once, never counted against a node.
            Outcome::Rejected(Rejection::DeadlinePassed | Rejection::Overloaded { .. }) => {}
            other => panic!("only successes and deadlines expected: {other:?}"),
        }
    }
    let stats = d.stats().await;
    let q = &stats.services[0].queue;
    assert_eq!(
        (q.submitted, q.succeeded, q.queued, q.in_flight),
        (150, ok, 0, 0),
        "{q:?}"
    );
    assert_eq!(q.submitted, q.succeeded + q.failed + q.rejected, "{q:?}");
    for n in &stats.services[0].nodes {
        assert_eq!(n.trips, 0, "node {} tripped: {n:?}", n.address);
        assert_eq!(n.errors, 0, "a deadline is not the node's error: {n:?}");
    }
    // The backends could serve 75 in 0.5 s (the paused run of 150 ticks
    // serves 160 of 450 in time); work still gets done (a generous floor:
    // the machine may be busy, and this test is about the breakers, not
    // goodput, which `loadbench overload` measures).
    assert!(ok >= 15, "{ok} successes of 150");
    let served: u64 = bs.iter().map(Capped::served).sum();
    assert!(served >= 15, "backends served {served}");
    for b in &bs {
        assert!(b.peak_busy() <= 2);
    }
    d.shutdown(Duration::from_secs(1)).await;
}

/// Defaults, no deadlines (seed 000's workload): a burst the pool serves in
/// about 200 ms completes whole; nothing is shed by a time the user never
/// stated.
#[actix_rt::test]
async fn a_burst_without_deadlines_completes_whole() {
    init_logs();
    let bs: Vec<Capped> = (0..2)
        .map(|_| Capped::start(8, Duration::from_millis(50)))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[
            {{"address":"{}","max_concurrent":5}},{{"address":"{}","max_concurrent":8}}]}}]}}"#,
        bs[0].url(),
        bs[1].url()
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let results = futures::future::join_all(
        (0..50).map(|i| d.submit(Task::get("svc", format!("/seed/{i}")))),
    )
    .await;
    let ok = results.iter().filter(|r| r.is_success()).count();
    assert_eq!(ok, 50, "{:?}", results.iter().find(|r| !r.is_success()));
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!((q.succeeded, q.shed, q.rejected), (50, 0, 0));
    assert_eq!(bs[0].served() + bs[1].served(), 50);
    d.shutdown(Duration::from_secs(1)).await;
}

/// A queue capacity the user set is a promise: 1000 tasks at once on 10
/// slots of 20 ms with `capacity: 100, on_full: reject`: 100 are taken
/// and all of them served (in about 200 ms), 900 refused `QueueFull`.
#[actix_rt::test]
async fn every_task_a_full_queue_accepted_is_served() {
    init_logs();
    let b = Capped::start(10, Duration::from_millis(20));
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{}","max_concurrent":10}}],
            "queue":{{"capacity":100,"on_full":"reject"}}}}]}}"#,
        b.url()
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let results = futures::future::join_all(
        (0..1000).map(|i| d.submit(Task::get("svc", format!("/cap/{i}")))),
    )
    .await;
    let ok = results.iter().filter(|r| r.is_success()).count();
    let full = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Rejected(Rejection::QueueFull)))
        .count();
    assert_eq!((ok, full), (100, 900));
    assert_eq!(b.served(), 100);
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!((q.submitted, q.succeeded, q.rejected), (1000, 100, 900));
    d.shutdown(Duration::from_secs(1)).await;
}

/// Twice the capacity of backends whose worker counts the config states,
/// every task with a 250 ms deadline: what cannot be
/// served in time is refused or shed `Overloaded` (before any attempt),
/// nothing counts against the nodes, the backends stay busy, and once the
/// load is gone tasks are served again.
#[actix_rt::test]
async fn tasks_that_cannot_meet_their_deadline_are_shed() {
    init_logs();
    let bs = three_capped();
    let eps: Vec<String> = bs
        .iter()
        .map(|b| format!(r#"{{"address":"{}","max_concurrent":2}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"p2c","endpoints":[{}]}}]}}"#,
        eps.join(",")
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    // 300 tasks/s for 0.5 s: twice the capacity.
    let results = open_loop(&d, 50, 3, |i| {
        Task::get("svc", format!("/s/{i}")).deadline_in(Duration::from_millis(250))
    })
    .await;
    let (mut ok, mut shed) = (0, 0);
    for r in &results {
        match &r.outcome {
            Outcome::Success(_) => ok += 1,
            Outcome::Rejected(Rejection::Overloaded { retry_after, .. }) => {
                assert!(!retry_after.is_zero());
                assert!(r.attempts.is_empty(), "shed before any attempt");
                shed += 1;
            }
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::DeadlineExceeded, "{r:?}")
            }
            // On a busy machine a submit can reach the queue after its
            // 250 ms (never on the paused clock, where none does).
            Outcome::Rejected(Rejection::DeadlinePassed) => {}
            other => panic!("only successes, sheds and late ones expected: {other:?}"),
        }
    }
    // The paused run of these 0.5 s serves 108 and sheds 42; about half
    // of each, a wide margin for a busy machine.
    assert!(shed > 20, "{shed} shed of 150 at twice the capacity");
    assert!(ok >= 54, "{ok} successes of 150");
    let stats = d.stats().await;
    let q = &stats.services[0].queue;
    assert_eq!(q.shed, shed as u64);
    assert_eq!((q.submitted, q.succeeded), (150, ok as u64), "{q:?}");
    assert_eq!(q.submitted, q.succeeded + q.failed + q.rejected);
    for n in &stats.services[0].nodes {
        assert_eq!((n.trips, n.errors), (0, 0), "{n:?}");
    }
    for i in 0..5 {
        let r = d
            .submit(Task::get("svc", format!("/after/{i}")).deadline_in(Duration::from_secs(1)))
            .await;
        assert!(r.is_success(), "{r:?}");
    }
    d.shutdown(Duration::from_secs(1)).await;
}

/// `max_concurrent: "auto"`: a node learns how many requests its backend
/// takes at once from latency (here 8), growing from a low start without
/// piling requests up inside the backend, under more callers than it takes.
#[actix_rt::test]
async fn a_learned_limit_grows_to_what_the_backend_takes() {
    init_logs();
    let b = Capped::start(8, Duration::from_millis(20));
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{}","max_concurrent":"auto"}}],
            "concurrency":{{"initial":2}},"queue":{{"delay":{{"enabled":false}}}}}}]}}"#,
        b.url()
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let limit = |s: &actix_dispatch::Stats| s.services[0].nodes[0].concurrency_limit;
    assert_eq!(limit(&d.stats().await), 2, "it starts from `initial`");
    // A closed loop of 60 callers for 1 s: at the default fixed cap of
    // 10 the backend would queue 2 of them, at 60 it would queue 52. (On
    // the paused clock the limit is 8 from 600 ms on.)
    let start = actix_dispatch::Instant::now();
    let callers = (0..60).map(|c| {
        let d = d.clone();
        async move {
            let mut ok = 0u32;
            let mut i = 0;
            while start.elapsed() < Duration::from_millis(1000) && i < 1000 {
                ok += u32::from(
                    d.submit(Task::get("svc", format!("/l/{c}/{i}")))
                        .await
                        .is_success(),
                );
                i += 1;
            }
            ok
        }
    });
    let ok: u32 = futures::future::join_all(callers).await.into_iter().sum();
    let learned = limit(&d.stats().await);
    assert!(ok > 20, "{ok} successes");
    assert!(
        (3..=24).contains(&learned),
        "the limit grew toward the backend's 8 workers: {learned}"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

/// Every sixth task critical, the rest sheddable; the class in the path;
/// every task due in 250 ms.
fn one_critical_in_six(i: usize) -> Task {
    let class = if i % 6 == 0 {
        actix_dispatch::Priority::Critical
    } else {
        actix_dispatch::Priority::Sheddable
    };
    Task::get("svc", format!("/{class}/{i}"))
        .priority(class)
        .deadline_in(Duration::from_millis(250))
}

/// Three times the capacity, a sixth of it critical: the queue serves the
/// critical class first, so it meets its deadline while the sheddable
/// majority is shed, and the learned limit keeps the backends busy.
#[actix_rt::test]
async fn critical_tasks_are_served_while_the_sheddable_majority_is_shed() {
    init_logs();
    let bs = three_capped();
    let eps: Vec<String> = bs
        .iter()
        .map(|b| format!(r#"{{"address":"{}","max_concurrent":"auto"}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"p2c","endpoints":[{}]}}]}}"#,
        eps.join(",")
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    // 0.5 s at 450 tasks/s (three times 150/s): 25 critical, 125
    // sheddable. The paused run of these 0.5 s serves all 25 critical,
    // sheds 41 sheddable and the backends serve 109.
    let results = open_loop(&d, 50, 3, one_critical_in_six).await;
    let critical = results.iter().enumerate().filter(|(i, _)| i % 6 == 0);
    let critical_ok = critical.clone().filter(|(_, r)| r.is_success()).count();
    assert!(
        critical_ok >= 22,
        "{critical_ok} of 25 critical tasks succeeded"
    );
    let q = d.stats().await.services[0].queue.clone();
    assert!(q.shed_by_class.sheddable > 20, "{q:?}");
    assert_eq!(q.submitted, q.succeeded + q.failed + q.rejected, "{q:?}");
    let served: u64 = bs.iter().map(Capped::served).sum();
    assert!(served >= 50, "the backends kept serving: {served}");
    d.shutdown(Duration::from_secs(1)).await;
}

/// Client-side throttling: against a backend that refuses everything
/// cheaply (503), the node soon drops most attempts itself (`throttled`,
/// never sent, never the node's fault), so the backend sees a few of the
/// tasks; against one that accepts, nothing is throttled.
#[actix_rt::test]
async fn a_backend_that_refuses_everything_is_throttled_by_the_client() {
    init_logs();
    let refusing = support::Backend::start();
    refusing.set_status(Some(503));
    let d = Dispatcher::start(support::cfg::config(
        "round_robin",
        &[(&refusing, 1, 10)],
        r#""throttle":{"k":2,"window":"30s"},"breaker":{"enabled":false},
           "retry":{"max_retries":0},"balancer":{"seed":7}"#,
    ))
    .unwrap();
    let mut throttled = 0;
    for i in 0..300 {
        let r = d.submit(Task::get("svc", format!("/r/{i}"))).await;
        assert!(!r.is_success());
        if r.attempts
            .iter()
            .any(|a| a.outcome == AttemptOutcome::Error(ErrorKind::Throttled))
        {
            throttled += 1;
        }
    }
    let hits = refusing.hits();
    assert!(hits <= 60, "the backend saw {hits} of 300");
    assert_eq!(throttled + hits, 300, "every task sent or throttled");
    let stats = d.stats().await;
    let node = &stats.service("svc").unwrap().nodes[0];
    assert_eq!(
        node.errors, hits,
        "only the real 503s count against the node"
    );
    d.shutdown(Duration::ZERO).await;

    let ok = support::Backend::start();
    let d = Dispatcher::start(support::cfg::config(
        "round_robin",
        &[(&ok, 1, 10)],
        // The delay control off: on busy cores a burst of 100 can stand in
        // the queue for an interval and be shed, which is not throttling.
        r#""throttle":{"k":2,"window":"30s"},"queue":{"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let rs = support::cfg::burst(&d, 100, "ok").await;
    assert_eq!(rs.iter().filter(|r| r.is_success()).count(), 100);
    assert_eq!(ok.hits(), 100);
    d.shutdown(Duration::ZERO).await;
}
