//! The overload runs of `tests/overload.rs` on tokio's paused clock, with
//! the simulator's modelled backends (`tests/sim`: fixed-capacity workers,
//! whole-millisecond service times) in place of real sockets: the same
//! seed and the same timers give the same run, so every figure is held
//! exactly, and the runs take no real time. `tests/overload.rs` keeps a
//! shorter real-socket run of each, with wide margins.

#[path = "support/open_loop.rs"]
mod open_loop;
mod sim;

use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{
    AttemptOutcome, Config, Dispatcher, ErrorKind, FailReason, Instant, Outcome, Priority,
    Rejection, Task, TaskResult,
};
use open_loop::{noisy_and_quiet, open_loop};
use sim::model::{BackendSpec, Backends, ServiceTime};

/// Three backends serving 2 requests at once for 40 ms each: 150 tasks/s.
fn three_capped() -> Vec<BackendSpec> {
    vec![BackendSpec::new(2, ServiceTime::Fixed(40.0)); 3]
}

/// Service `svc` over the modelled backends `specs`, each endpoint with the
/// fields `endpoint` (JSON, each with a leading comma), and `extra` service
/// fields; the balancer's choices seeded, so a run repeats exactly.
fn start(specs: &[BackendSpec], endpoint: &str, extra: &str) -> (Rc<Backends>, Dispatcher) {
    let backends = Backends::start(specs, 1);
    let eps: Vec<String> = (0..specs.len())
        .map(|i| format!(r#"{{"address":"{}"{endpoint}}}"#, Backends::address(i)))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{}],"balancer":{{"seed":7}}{extra}}}]}}"#,
        eps.join(",")
    );
    let config = Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    let d = Dispatcher::builder(config)
        .transport(Backends::factory())
        .start()
        .unwrap();
    (backends, d)
}

/// [`three_capped`], each endpoint's `max_concurrent` its 2 workers, the
/// balancer power-of-two-choices.
fn start_capped() -> (Rc<Backends>, Dispatcher) {
    start(
        &three_capped(),
        r#","max_concurrent":2"#,
        r#","mode":"p2c""#,
    )
}

/// How the tasks of a run ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    ok: u64,
    /// Failed `DeadlineExceeded` after an attempt cut by the deadline.
    cut: u64,
    /// Failed `DeadlineExceeded` without an attempt (its time left was below
    /// what an attempt takes).
    not_sent: u64,
    /// Refused `Overloaded` by the queue's delay control.
    overloaded: u64,
    /// Refused `DeadlinePassed`.
    passed: u64,
}

/// The tally of `results`; any other outcome fails the test.
fn tally(results: &[TaskResult]) -> Tally {
    let mut t = Tally::default();
    for r in results {
        match &r.outcome {
            Outcome::Success(_) => t.ok += 1,
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::DeadlineExceeded, "{r:?}");
                match f.last {
                    None => t.not_sent += 1,
                    Some(AttemptOutcome::Error(ErrorKind::Deadline)) => t.cut += 1,
                    _ => panic!("{r:?}"),
                }
            }
            Outcome::Rejected(Rejection::Overloaded { retry_after, .. }) => {
                assert!(!retry_after.is_zero());
                assert!(r.attempts.is_empty(), "shed before any attempt");
                t.overloaded += 1;
            }
            Outcome::Rejected(Rejection::DeadlinePassed) => t.passed += 1,
            other => panic!("only successes, sheds and late ones expected: {other:?}"),
        }
    }
    t
}

/// The service's counters against the tally: every task has its one
/// result, nothing is left, no breaker opened and no node was blamed.
async fn assert_counters(d: &Dispatcher, t: &Tally) {
    let stats = d.stats().await;
    let q = &stats.services[0].queue;
    let failed = t.cut + t.not_sent;
    let refused = t.overloaded + t.passed;
    assert_eq!(
        (
            q.submitted,
            q.succeeded,
            q.failed,
            q.rejected,
            q.queued,
            q.in_flight
        ),
        (t.ok + failed + refused, t.ok, failed, refused, 0, 0),
        "{q:?}"
    );
    assert_eq!(q.shed, t.overloaded, "{q:?}");
    for n in &stats.services[0].nodes {
        assert_eq!(n.trips, 0, "node {} tripped: {n:?}", n.address);
        assert_eq!(n.errors, 0, "a deadline is not the node's error: {n:?}");
    }
}

/// What the backends received and answered, summed; every request they
/// received is answered once the run is over.
async fn served(b: &Backends, n: usize) -> u64 {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut received, mut answered) = (0, 0);
    for i in 0..n {
        let c = b.counts(i);
        received += c.received;
        answered += c.answered;
    }
    assert_eq!(received, answered);
    answered
}

/// The collapse of the overload work: at twice the backends' capacity with
/// a 250 ms deadline on every task, attempts cut by the deadline used to
/// count as the node's timeouts, the breakers of the healthy backends
/// opened, and most tasks were refused `CircuitOpen` while the backends
/// idled. A deadline is the task's: no breaker opens, and the backends keep
/// serving at their capacity.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn deadlines_under_overload_never_open_the_breakers_of_healthy_nodes() {
    let (b, d) = start(&three_capped(), "", r#","mode":"p2c""#);
    // 300 tasks/s for 1.5 s: twice the capacity.
    let results = open_loop(&d, 150, 3, |i| {
        Task::get("svc", format!("/t/{i}")).deadline_in(Duration::from_millis(250))
    })
    .await;
    assert_eq!(results.len(), 450);
    let t = tally(&results);
    assert_eq!(
        t,
        Tally {
            ok: 215,
            cut: 46,
            not_sent: 0,
            overloaded: 189,
            passed: 0
        }
    );
    assert_counters(&d, &t).await;
    // The backends could serve 225 in 1.5 s (and the queue's last 250 ms
    // after): they served every attempt sent, the cut ones included. A
    // task with less time left than the quickest room takes waits for a
    // quicker one instead of being cut inside a backend (68 cut, 195 in
    // time before).
    assert_eq!(served(&b, 3).await, t.ok + t.cut);
    d.shutdown(Duration::from_secs(1)).await;
}

/// The deadline rules shed only what a stated time allows: at twice the
/// capacity, with every third task carrying no deadline (and no `slo` on
/// the service), the tasks with one are refused or shed once they cannot
/// be served in time, and newest first keeps the queue shallow; every task
/// without one is served, however long it waits.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn tasks_without_a_deadline_are_never_shed_beside_ones_with_it() {
    let (_b, d) = start_capped();
    let due = |i: usize| i % 3 != 0;
    let results = open_loop(&d, 150, 3, |i| {
        let t = Task::get("svc", format!("/m/{i}"));
        if due(i) {
            t.deadline_in(Duration::from_millis(250))
        } else {
            t
        }
    })
    .await;
    let (with, without): (Vec<_>, Vec<_>) = results.iter().enumerate().partition(|(i, _)| due(*i));
    assert_eq!(without.len(), 150);
    for (i, r) in &without {
        assert!(r.is_success(), "task {i} had no deadline: {r:?}");
    }
    let shed = with
        .iter()
        .filter(|(_, r)| matches!(r.outcome, Outcome::Rejected(Rejection::Overloaded { .. })))
        .count();
    assert!(
        shed > 0,
        "twice the capacity sheds some of those with a deadline"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

/// Twice the capacity of backends whose worker counts the config states,
/// every task with a 250 ms deadline: what cannot be served in time is
/// refused or shed `Overloaded` (before any attempt), nothing counts
/// against the nodes, the backends stay busy, and once the load is gone
/// tasks are served again.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn tasks_that_cannot_meet_their_deadline_are_shed() {
    let (b, d) = start_capped();
    let results = open_loop(&d, 150, 3, |i| {
        Task::get("svc", format!("/s/{i}")).deadline_in(Duration::from_millis(250))
    })
    .await;
    let t = tally(&results);
    assert_eq!(
        t,
        Tally {
            ok: 236,
            cut: 0,
            not_sent: 0,
            overloaded: 214,
            passed: 0
        }
    );
    assert_counters(&d, &t).await;
    for i in 0..5 {
        let r = d
            .submit(Task::get("svc", format!("/after/{i}")).deadline_in(Duration::from_secs(1)))
            .await;
        assert!(r.is_success(), "{r:?}");
    }
    // Every request sent was served in time, the five after the load
    // included.
    assert_eq!(served(&b, 3).await, t.ok + 5);
    d.shutdown(Duration::from_secs(1)).await;
}

/// `max_concurrent: "auto"`: a node learns how many requests its backend
/// takes at once from latency (here 8), growing from a low start without
/// piling requests up inside the backend, under more callers than it takes.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_learned_limit_grows_to_what_the_backend_takes() {
    let (b, d) = start(
        &[BackendSpec::new(8, ServiceTime::Fixed(20.0))],
        r#","max_concurrent":"auto""#,
        r#","concurrency":{"initial":2},"queue":{"delay":{"enabled":false}}"#,
    );
    let limit = |s: &actix_dispatch::Stats| s.services[0].nodes[0].concurrency_limit;
    assert_eq!(limit(&d.stats().await), 2, "it starts from `initial`");
    // A closed loop of 60 callers for 2.5 s: at the default fixed cap of
    // 10 the backend would queue 2 of them, at 60 it would queue 52.
    let start = Instant::now();
    let limits = {
        let d = d.clone();
        actix_rt::spawn(async move {
            let mut seen = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for _ in 0..26 {
                tick.tick().await;
                seen.push(limit(&d.stats().await));
            }
            seen
        })
    };
    let callers = (0..60).map(|c| {
        let d = d.clone();
        async move {
            let mut ok = 0u32;
            let mut i = 0;
            while start.elapsed() < Duration::from_millis(2500) {
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
    let limits = limits.await.unwrap();
    assert_eq!(
        (ok, learned),
        (970, 8),
        "the limit every 100 ms: {limits:?}"
    );
    // It doubles from 2 once the backend's latency holds (by 600 ms),
    // probes past 8 to 16, where the backend queues 8 of them inside, and
    // settles on its 8 workers, probing a step above every 0.65 s or so
    // (a steady service time's probe ends at its first answer that waited,
    // so most probes fall between the samples).
    assert_eq!(
        limits,
        vec![2, 2, 2, 2, 4, 8, 16, 16, 8, 9, 8, 8, 8, 8, 8, 9, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
    );
    assert_eq!(b.counts(0).peak_inside, 16);
    d.shutdown(Duration::from_secs(1)).await;
}

/// Every `n`-th task critical (from the first), the rest sheddable; the
/// class in the path; every task due in 250 ms.
fn one_critical_in(n: usize) -> impl Fn(usize) -> Task {
    move |i| {
        let class = if i % n == 0 {
            Priority::Critical
        } else {
            Priority::Sheddable
        };
        Task::get("svc", format!("/{class}/{i}"))
            .priority(class)
            .deadline_in(Duration::from_millis(250))
    }
}

/// Three times the capacity, a sixth of it critical: the queue serves the
/// critical class first, so it meets its deadline while the sheddable
/// majority is shed, and the learned limit keeps the backends busy.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn critical_tasks_are_served_while_the_sheddable_majority_is_shed() {
    let (b, d) = start(
        &three_capped(),
        r#","max_concurrent":"auto""#,
        r#","mode":"p2c""#,
    );
    // 1.5 s at 450 tasks/s (three times 150/s): 75 critical, 375 sheddable.
    let results = open_loop(&d, 150, 3, one_critical_in(6)).await;
    let critical: Vec<&TaskResult> = results.iter().step_by(6).collect();
    assert_eq!(critical.len(), 75);
    let critical_ok = critical.iter().filter(|r| r.is_success()).count();
    let t = tally(&results);
    assert_eq!(critical_ok, 75);
    assert_eq!(
        t,
        Tally {
            ok: 252,
            cut: 4,
            not_sent: 0,
            overloaded: 194,
            passed: 0
        }
    );
    assert_counters(&d, &t).await;
    let shed = d.stats().await.services[0].queue.shed_by_class;
    assert_eq!(
        (shed.critical, shed.sheddable),
        (0, t.overloaded),
        "{shed:?}"
    );
    assert_eq!(served(&b, 3).await, t.ok + t.cut);
    d.shutdown(Duration::from_secs(1)).await;
}

/// Half the tasks critical, at four times the capacity (the critical
/// class alone at twice it): the top class of several is refused at
/// intake when the critical tasks ahead of it need longer than it has, or
/// shed once it can no longer be served in time, never by the depth the
/// queue keeps while newest first (a send rate's guess, which shed
/// critical tasks that could still be served while the limits rose).
#[actix_rt::test(system = "sim::PausedSystem")]
async fn the_top_class_is_shed_only_when_it_cannot_be_served_in_time() {
    let (_b, d) = start_capped();
    let results = open_loop(&d, 150, 6, one_critical_in(2)).await;
    let shed_at: Vec<u128> = results
        .iter()
        .step_by(2)
        .filter(|r| matches!(r.outcome, Outcome::Rejected(Rejection::Overloaded { .. })))
        .map(|r| r.total.as_millis())
        .collect();
    // At intake (no wait), or once what is left (under 210 ms waited of
    // 250) is less than an attempt's 40 ms: never in between.
    let early: Vec<&u128> = shed_at.iter().filter(|&&t| t > 0 && t < 200).collect();
    assert!(early.is_empty(), "{early:?} of {shed_at:?}");
    let critical_ok = results.iter().step_by(2).filter(|r| r.is_success()).count();
    assert_eq!((results.len(), critical_ok, shed_at.len()), (900, 242, 208));
    // Every task has its one result, and no node was blamed.
    assert_counters(&d, &tally(&results)).await;
    d.shutdown(Duration::from_secs(1)).await;
}

/// A noisy tenant offering twice the capacity beside four quiet ones
/// offering 20 tasks a second each, for `ticks` ticks of 10 ms, every task
/// due in 500 ms (`tests/tenants.rs`'s run): `(offered, in time)` per
/// tenant, and the service's tenant rows.
async fn tenants_run(ticks: usize) -> (Vec<(String, u32, u32)>, actix_dispatch::ServiceStats) {
    let (_b, d) = start_capped();
    let ok = noisy_and_quiet(&d, ticks, Duration::from_millis(500)).await;
    let st = d.stats().await.services.remove(0);
    assert!(st.is_balanced());
    d.shutdown(Duration::from_secs(1)).await;
    let ok = ok.into_iter().map(|(t, (o, g))| (t, o, g)).collect();
    (ok, st)
}

/// The quiet tenants are served in full, the noisy one is shed, and the
/// stats count each tenant (`tests/tenants.rs` on the paused clock).
#[actix_rt::test(system = "sim::PausedSystem")]
async fn quiet_tenants_are_served_beside_a_noisy_one() {
    let (ok, st) = tenants_run(300).await;
    let quiet = |q| (format!("quiet{q}"), 60, 60);
    let mut want = vec![("noisy".to_string(), 900, 261)];
    want.extend((0..4).map(quiet));
    assert_eq!(ok, want, "(tenant, offered, in time)");
    let rows: Vec<(&str, u64, u64)> = st
        .queue
        .tenants
        .iter()
        .map(|r| (r.tenant.as_deref().unwrap(), r.offered, r.shed))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("noisy", 900, 636),
            ("quiet0", 60, 0),
            ("quiet1", 60, 0),
            ("quiet2", 60, 0),
            ("quiet3", 60, 0)
        ],
        "(tenant, offered, shed)"
    );
    // The run of `tests/tenants.rs` on real sockets, half as long.
    let (ok, _) = tenants_run(150).await;
    let mut want = vec![("noisy".to_string(), 450, 116)];
    want.extend((0..4).map(|q| (format!("quiet{q}"), 30, 30)));
    assert_eq!(ok, want, "(tenant, offered, in time) in 1.5 s");
}
