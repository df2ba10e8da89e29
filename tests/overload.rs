//! Overload against real fixed-capacity backends: more tasks than the
//! backends can take, open loop, and what that does to the nodes.

mod support;

use std::time::Duration;

use actix_dispatch::{AttemptOutcome, Dispatcher, ErrorKind, FailReason, Outcome, Rejection, Task};
use support::capacity::Capped;
use support::init_logs;

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

/// Offers `per_tick` tasks every 10 ms for `ticks` ticks, each built by
/// `task`, without waiting for answers (open loop); returns every result.
async fn open_loop(
    d: &Dispatcher,
    ticks: usize,
    per_tick: usize,
    task: impl Fn(usize) -> Task,
) -> Vec<actix_dispatch::TaskResult> {
    let mut pending = Vec::with_capacity(ticks * per_tick);
    let mut tick = actix_rt::time::interval(Duration::from_millis(10));
    for t in 0..ticks {
        tick.tick().await;
        for i in 0..per_tick {
            pending.push(actix_rt::spawn(d.submit(task(t * per_tick + i))));
        }
    }
    let mut results = Vec::with_capacity(pending.len());
    for p in pending {
        results.push(p.await.expect("the submit task ran"));
    }
    results
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
    // 300 tasks/s for 1.5 s: twice the capacity.
    let results = open_loop(&d, 150, 3, |i| {
        Task::get("svc", format!("/t/{i}")).deadline_in(Duration::from_millis(250))
    })
    .await;
    assert_eq!(results.len(), 450, "every task has its one result");
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
    for n in &stats.services[0].nodes {
        assert_eq!(n.trips, 0, "node {} tripped: {n:?}", n.address);
        assert_eq!(n.errors, 0, "a deadline is not the node's error: {n:?}");
    }
    // The backends could serve 225 in 1.5 s; work still gets done (a
    // generous floor: the machine may be busy, and this test is about the
    // breakers, not goodput, which `loadbench overload` measures).
    assert!(ok >= 15, "{ok} successes of 450");
    let served: u64 = bs.iter().map(Capped::served).sum();
    assert!(served >= 15, "backends served {served}");
    for b in &bs {
        assert!(b.peak_busy() <= 2);
    }
    d.shutdown(Duration::from_secs(1)).await;
}

/// Defaults, no deadlines, twice the capacity: the queue's delay control
/// sheds what waited past its target (answered `Overloaded` at once)
/// instead of letting the queue become a wait of seconds, nothing counts
/// against the nodes, and once the load is gone tasks are served again.
#[actix_rt::test]
async fn a_standing_queue_is_shed_not_left_to_grow() {
    init_logs();
    let bs = three_capped();
    let d = Dispatcher::start(config_over(&bs, "")).unwrap();
    // 300 tasks/s for 1.5 s: twice the capacity.
    let results = open_loop(&d, 150, 3, |i| Task::get("svc", format!("/s/{i}"))).await;
    assert_eq!(results.len(), 450, "every task has its one result");
    let (mut ok, mut shed) = (0, 0);
    for r in &results {
        match &r.outcome {
            Outcome::Success(_) => ok += 1,
            Outcome::Rejected(Rejection::Overloaded { retry_after }) => {
                assert!(!retry_after.is_zero());
                assert!(r.attempts.is_empty(), "shed before any attempt");
                shed += 1;
            }
            other => panic!("only successes and sheds expected: {other:?}"),
        }
    }
    assert!(shed > 0, "a standing queue at twice the capacity is shed");
    assert!(ok >= 15, "{ok} successes of 450");
    let stats = d.stats().await;
    let q = &stats.services[0].queue;
    assert_eq!(q.shed, shed as u64);
    for n in &stats.services[0].nodes {
        assert_eq!((n.trips, n.errors), (0, 0), "{n:?}");
    }
    // The load is gone: one task at a time is served, none shed.
    for i in 0..5 {
        let r = d.submit(Task::get("svc", format!("/after/{i}"))).await;
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
    // A closed loop of 60 callers for 2.5 s: at the default fixed cap of
    // 10 the backend would queue 2 of them, at 60 it would queue 52.
    let start = actix_dispatch::Instant::now();
    let callers = (0..60).map(|c| {
        let d = d.clone();
        async move {
            let mut ok = 0u32;
            let mut i = 0;
            while start.elapsed() < Duration::from_millis(2500) && i < 1000 {
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

/// Headroom for the top class: with a learned limit of 3 on a backend of 2
/// workers, the limit's last slot is the critical class's while critical
/// tasks come. Under a flood of sheddable tasks the backend's workers stay
/// busy, yet no sheddable task waits inside the backend for a worker (one
/// always did when every class filled the whole limit), so none is ahead
/// of a critical task there; the critical tasks take the headroom.
/// A dispatcher on `b` whose one node has a learned limit held at 3 (a
/// free limit of 2), with `extra` service fields.
fn held_at_three(b: &Capped, extra: &str) -> Dispatcher {
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{}","max_concurrent":"auto"}}],
            "concurrency":{{"initial":3,"min":3,"max":3}}{extra}}}]}}"#,
        b.url()
    );
    Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap()
}

/// Every sixth task critical, the rest sheddable; the class in the path.
fn one_critical_in_six(i: usize) -> Task {
    let class = if i % 6 == 0 {
        actix_dispatch::Priority::Critical
    } else {
        actix_dispatch::Priority::Sheddable
    };
    Task::get("svc", format!("/{class}/{i}")).priority(class)
}

#[actix_rt::test]
async fn lower_classes_leave_the_backends_queue_to_the_critical_class() {
    init_logs();
    let b = Capped::start(2, Duration::from_millis(30));
    let d = held_at_three(&b, "");
    // 1.5 s: two sheddable tasks every 10 ms (three times the backend's
    // 67/s), one critical task every 30 ms (half of it).
    let results = open_loop(&d, 150, 2, one_critical_in_six).await;
    let node = &d.stats().await.services[0].nodes[0];
    assert_eq!((node.concurrency_limit, node.free_limit), (3, 2));
    let critical_ok = results
        .iter()
        .enumerate()
        .filter(|(i, r)| i % 6 == 0 && r.is_success())
        .count();
    assert!(
        critical_ok >= 45,
        "{critical_ok} of 50 critical tasks succeeded"
    );
    assert!(b.served() >= 70, "the backend kept serving: {}", b.served());
    // A route placed on a view a turn old may still land in the headroom:
    // a margin of a few, of some 70 sent.
    let sheddable_sent = b.served() as usize - critical_ok;
    assert!(
        b.waited("sheddable") <= 3,
        "{} of {sheddable_sent} sheddable tasks waited inside the backend",
        b.waited("sheddable")
    );
    assert!(
        b.waited("critical") > 0,
        "the critical tasks used the headroom"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

/// While sheddable tasks wait in the queue, a critical task does not take
/// the headroom inside the backend (where it would wait for one worker): it
/// waits in the queue for the next worker that frees, which it gets ahead
/// of them. With the delay control off the sheddable backlog stays queued,
/// so no critical task should find the backend's workers busy; when every
/// class filled the limit, or the critical class took the headroom
/// whenever it came, most of them did.
#[actix_rt::test]
async fn the_critical_class_waits_in_the_queue_while_lower_classes_wait() {
    init_logs();
    let b = Capped::start(2, Duration::from_millis(30));
    let d = held_at_three(&b, r#","queue":{"delay":{"enabled":false}}"#);
    // 0.6 s at three times the backend's capacity: 100 sheddable tasks
    // and 20 critical ones, the backlog served within 2 s.
    let results = open_loop(&d, 60, 2, one_critical_in_six).await;
    let ok = results.iter().filter(|r| r.is_success()).count();
    assert_eq!(ok, 120, "nothing is shed with the delay control off");
    assert_eq!(b.served(), 120);
    // A route placed on a view a turn old may still land in the headroom:
    // a margin of a few.
    assert!(
        b.waited("critical") <= 3,
        "{} of 20 critical tasks waited inside the backend",
        b.waited("critical")
    );
    // (Sheddable tasks do take the headroom at the end: a second after the
    // last critical task, theirs is the top class, and the backlog is not
    // served yet.)
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
