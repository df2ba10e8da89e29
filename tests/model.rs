//! Model-based test of the whole engine: random interleavings of what a
//! user and the world do to it, on tokio's paused clock, checked against
//! what the test knows independently of the engine's own bookkeeping.
//!
//! A case is a service config (every mode, fixed or learned
//! `max_concurrent: "auto"` per node, queue bound and `on_full`, breaker,
//! hedging, retries) and a timeline of events: tasks submitted in bursts
//! (each of a priority class, GET or POST, with or without a deadline, some
//! cancelled by dropping their `Submission` after a while), `feed`s of task
//! streams, leases held and returned with an outcome or dropped, pool
//! changes (add, remove, weight, active, reload), node restarts and node
//! panics (fault drills), and samples of `stats()`. Every request's fate is
//! scripted per task and attempt (answers, 5xx and 429 with `Retry-After`,
//! 404, connect errors, resets, hangs, slow answers past the timeout,
//! panics), by the in-process transport of `scripted`.
//!
//! Checked: every pool change answers as the test's own model of the pool
//! predicts; at every sample, `submitted = succeeded + failed + rejected +
//! queued + in_flight`; at the end every awaited task has exactly one
//! result, nothing is left queued or in flight, and the counters equal the
//! outcomes the callers got, the cancelled tasks (whose outcome nobody
//! hears) accounting for exactly the difference.
//!
//! Cases: `PROPTEST_CASES` (proptest's default 256); failing seeds are kept
//! in `proptest-regressions/model.txt` and replayed first. `MODEL_TRACE=1`
//! prints each case.

mod scripted;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{
    Config, Dispatcher, EndpointConfig, ErrorKind, LeaseOptions, LeaseOutcome, Method, Outcome,
    PoolError, Priority, Rejection, Task, TaskResult,
};
use futures::StreamExt;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use scripted::{Act, Backends, Req};

/// Paused time a run may take before it counts as "waits forever".
const RUN_BOUND: Duration = Duration::from_secs(3600);

/// The service's attempt timeout (ms).
const TIMEOUT_MS: u64 = 300;

/// What one attempt of a task gets.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Ok(u64),
    Status(u16),
    /// 429 or 503 with `Retry-After: 1`.
    Pushback(u16),
    Fail(ErrorKind),
    Hang,
    /// Answers after 2 s, far past the timeout.
    Slow,
    Panic,
}

impl Fate {
    fn act(self) -> Act {
        match self {
            Fate::Ok(ms) => Act::ok(ms),
            Fate::Status(s) => Act::status(s, 2),
            Fate::Pushback(s) => Act::Answer {
                status: s,
                after: Duration::from_millis(1),
                headers: vec![("retry-after", "1".to_owned())],
            },
            Fate::Fail(kind) => Act::Fail {
                kind,
                after: Duration::from_millis(1),
            },
            Fate::Hang => Act::Hang,
            Fate::Slow => Act::ok(2000),
            Fate::Panic => Act::Panic,
        }
    }
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        10 => (1u64..60).prop_map(Fate::Ok),
        1 => Just(Fate::Status(500)),
        1 => Just(Fate::Status(404)),
        1 => Just(Fate::Pushback(429)),
        1 => Just(Fate::Pushback(503)),
        1 => Just(Fate::Fail(ErrorKind::Connect)),
        1 => Just(Fate::Fail(ErrorKind::Reset)),
        1 => Just(Fate::Hang),
        1 => Just(Fate::Slow),
        1 => Just(Fate::Panic),
    ]
}

fn class() -> impl Strategy<Value = Priority> {
    prop_oneof![
        Just(Priority::Critical),
        Just(Priority::Default),
        Just(Priority::Sheddable)
    ]
}

/// One task: its attempts' fates (the last repeats), and how it is sent.
#[derive(Debug, Clone)]
struct TaskSpec {
    fates: Vec<Fate>,
    class: Priority,
    post: bool,
    deadline_ms: Option<u64>,
    /// Dropped this long after submit, if not answered by then.
    cancel_after_ms: Option<u64>,
}

fn task_spec() -> impl Strategy<Value = TaskSpec> {
    (
        prop::collection::vec(fate(), 1..4),
        class(),
        prop::bool::weighted(0.25),
        prop::option::weighted(0.3, 20u64..3000),
        prop::option::weighted(0.15, 0u64..500),
    )
        .prop_map(
            |(fates, class, post, deadline_ms, cancel_after_ms)| TaskSpec {
                fates,
                class,
                post,
                deadline_ms,
                cancel_after_ms,
            },
        )
}

/// A pool change; indexes are taken modulo the list of known addresses.
#[derive(Debug, Clone)]
enum PoolOp {
    Add(usize, bool),
    Remove(usize),
    SetActive(usize, bool),
    SetWeight(usize, u32),
    Reload(u8),
    Restart(usize),
    Panic(usize),
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        3 => (0usize..8, any::<bool>()).prop_map(|(i, auto)| PoolOp::Add(i, auto)),
        3 => (0usize..8).prop_map(PoolOp::Remove),
        3 => (0usize..8, any::<bool>()).prop_map(|(i, a)| PoolOp::SetActive(i, a)),
        2 => (0usize..8, 0u32..200).prop_map(|(i, w)| PoolOp::SetWeight(i, w)),
        2 => any::<u8>().prop_map(PoolOp::Reload),
        2 => (0usize..8).prop_map(PoolOp::Restart),
        1 => (0usize..8).prop_map(PoolOp::Panic),
    ]
}

/// What happens at one point of the timeline.
#[derive(Debug, Clone)]
enum Event {
    Submit(Vec<TaskSpec>),
    Feed(Vec<TaskSpec>),
    /// A lease held `hold_ms`, then returned with the outcome (`None`:
    /// dropped without one).
    Lease {
        class: Priority,
        hold_ms: u64,
        outcome: Option<LeaseOutcome>,
    },
    Pool(PoolOp),
    Sample,
}

fn lease_outcome() -> impl Strategy<Value = Option<LeaseOutcome>> {
    prop_oneof![
        3 => Just(Some(LeaseOutcome::Success)),
        1 => Just(Some(LeaseOutcome::Status(503))),
        1 => Just(Some(LeaseOutcome::Failure(ErrorKind::Timeout))),
        1 => Just(Some(LeaseOutcome::Ignore)),
        1 => Just(None),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => prop::collection::vec(task_spec(), 1..8).prop_map(Event::Submit),
        1 => prop::collection::vec(task_spec(), 1..12).prop_map(Event::Feed),
        2 => (class(), 0u64..400, lease_outcome()).prop_map(|(class, hold_ms, outcome)| {
            Event::Lease { class, hold_ms, outcome }
        }),
        3 => pool_op().prop_map(Event::Pool),
        3 => Just(Event::Sample),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    mode: &'static str,
    /// Per initial node: learned (`"auto"`) or fixed.
    auto: Vec<bool>,
    max_concurrent: u32,
    max_retries: u32,
    capacity: usize,
    wait_when_full: bool,
    breaker: bool,
    hedge_ms: Option<u64>,
    /// `(gap before it in ms, event)`.
    timeline: Vec<(u64, Event)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just("round_robin"),
            Just("weighted"),
            Just("least_load"),
            Just("p2c"),
            Just("consistent_hash")
        ],
        prop::collection::vec(prop::bool::weighted(0.4), 1..4),
        1u32..6,
        0u32..4,
        1usize..40,
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(0.2, 5u64..200),
        prop::collection::vec((0u64..300, event()), 1..40),
    )
        .prop_map(
            |(
                mode,
                auto,
                max_concurrent,
                max_retries,
                capacity,
                wait,
                breaker,
                hedge_ms,
                timeline,
            )| {
                Case {
                    mode,
                    auto,
                    max_concurrent,
                    max_retries,
                    capacity,
                    wait_when_full: wait,
                    breaker,
                    hedge_ms,
                    timeline,
                }
            },
        )
}

/// Every address a case may use: its initial nodes, then three spares.
fn addresses(c: &Case) -> Vec<String> {
    let first = (0..c.auto.len()).map(|i| format!("http://127.0.0.{}:80/", i + 1));
    let spare = (0..3).map(|i| format!("http://127.0.1.{}:80/", i + 1));
    first.chain(spare).collect()
}

fn endpoint_json(c: &Case, address: &str, auto: bool) -> String {
    let max = if auto {
        r#""auto""#.to_owned()
    } else {
        c.max_concurrent.to_string()
    };
    format!(r#"{{"address":"{address}","max_concurrent":{max}}}"#)
}

fn config_with(c: &Case, endpoints: &[(String, bool)]) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|(a, auto)| endpoint_json(c, a, *auto))
        .collect();
    let hedge = c.hedge_ms.map_or_else(String::new, |ms| {
        format!(r#","hedge":{{"after":"{ms}ms"}}"#)
    });
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"{}","timeout":"{TIMEOUT_MS}ms","endpoints":[{}],
            "concurrency":{{"min":1,"max":8,"initial":2}},
            "retry":{{"max_retries":{},"backoff_base":"5ms","backoff_max":"50ms"}},
            "queue":{{"capacity":{},"on_full":"{}"}},
            "breaker":{{"enabled":{},"consecutive_failures":3,"open_for":"100ms","max_open_for":"400ms","on_all_open":"wait"}},
            "balancer":{{"seed":1}}{hedge}}}]}}"#,
        c.mode,
        eps.join(","),
        c.max_retries,
        c.capacity,
        if c.wait_when_full { "wait" } else { "reject" },
        c.breaker,
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn initial(c: &Case) -> Vec<(String, bool)> {
    addresses(c)
        .into_iter()
        .zip(c.auto.iter().copied())
        .collect()
}

/// The pool as the test expects it: the addresses in it.
#[derive(Debug, Clone)]
struct PoolModel(Vec<String>);

/// What a pool change should answer.
#[derive(Debug, PartialEq)]
enum Expect {
    Ok,
    Duplicate,
    Unknown,
    Last,
}

impl PoolModel {
    fn has(&self, a: &str) -> bool {
        self.0.iter().any(|x| x == a)
    }

    /// Applies `op` (with `kept` the reload's endpoints) and returns the
    /// answer it predicts.
    fn apply(&mut self, op: &PoolOp, at: &str, kept: &[String]) -> Expect {
        match op {
            PoolOp::Add(..) if self.has(at) => Expect::Duplicate,
            PoolOp::Add(..) => {
                self.0.push(at.to_owned());
                Expect::Ok
            }
            PoolOp::Reload(_) => {
                self.0 = kept.to_vec();
                Expect::Ok
            }
            _ if !self.has(at) => Expect::Unknown,
            PoolOp::Remove(_) if self.0.len() == 1 => Expect::Last,
            PoolOp::Remove(_) => {
                self.0.retain(|x| x != at);
                Expect::Ok
            }
            PoolOp::SetActive(..) | PoolOp::SetWeight(..) | PoolOp::Restart(_) => Expect::Ok,
            PoolOp::Panic(_) => Expect::Ok,
        }
    }
}

fn kind(r: &Result<(), PoolError>) -> Expect {
    match r {
        Ok(()) => Expect::Ok,
        Err(PoolError::Duplicate(_)) => Expect::Duplicate,
        Err(PoolError::UnknownEndpoint(_)) => Expect::Unknown,
        Err(PoolError::LastEndpoint) => Expect::Last,
        Err(e) => panic!("unexpected pool error: {e}"),
    }
}

/// What the callers heard, counted as the queue counts it.
#[derive(Debug, Default)]
struct Heard {
    succeeded: u64,
    failed: u64,
    rejected: u64,
    /// Tasks whose caller dropped the `Submission` before the answer.
    dropped: u64,
    ids: HashSet<u64>,
}

impl Heard {
    fn result(&mut self, r: &TaskResult) {
        assert!(self.ids.insert(r.id), "task {} answered twice", r.id);
        match &r.outcome {
            Outcome::Success(_) => self.succeeded += 1,
            Outcome::Failure(_) => self.failed += 1,
            Outcome::Rejected(Rejection::Cancelled) => {
                panic!("a caller that waits is never answered `Cancelled`: {r:?}")
            }
            Outcome::Rejected(_) | Outcome::Fallback { .. } => self.rejected += 1,
            o => panic!("an outcome this test does not know: {o:?}"),
        }
    }

    /// A lease's answer: lent (a success), or why not (the engine maps a
    /// failed lease task to `Internal("no endpoint was lent ...")`).
    fn lease(&mut self, r: &Result<(), Rejection>) {
        match r {
            Ok(()) => self.succeeded += 1,
            Err(Rejection::Internal(m)) if m.starts_with("no endpoint was lent") => {
                self.failed += 1
            }
            Err(_) => self.rejected += 1,
        }
    }
}

fn task(i: usize, t: &TaskSpec) -> Task {
    let path = format!("/m/{i}");
    let mut task = if t.post {
        Task::new("svc", Method::POST, path)
    } else {
        Task::get("svc", path).affinity(format!("k{}", i % 11))
    };
    if let Some(ms) = t.deadline_ms {
        task = task.deadline_in(Duration::from_millis(ms));
    }
    task.priority(t.class)
}

/// The script: each task's attempts by its number in the path.
fn backends(c: &Case) -> Backends {
    let mut fates: Vec<Vec<Fate>> = Vec::new();
    for (_, e) in &c.timeline {
        if let Event::Submit(ts) | Event::Feed(ts) = e {
            fates.extend(ts.iter().map(|t| t.fates.clone()));
        }
    }
    Backends::new(move |r: &Req| {
        let Some(i) = r
            .path
            .strip_prefix("/m/")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            return Act::ok(1);
        };
        let f = &fates[i];
        f[(r.nth as usize).min(f.len() - 1)].act()
    })
}

/// Checks the one invariant on a snapshot.
fn balanced(q: &actix_dispatch::QueueStats) {
    assert_eq!(
        q.submitted,
        q.succeeded + q.failed + q.rejected + q.queued + q.in_flight,
        "{q:?}"
    );
}

async fn pool_change(
    d: &Dispatcher,
    c: &Case,
    model: &mut PoolModel,
    autos: &mut std::collections::HashMap<String, bool>,
    op: &PoolOp,
) {
    let all = addresses(c);
    let at = |i: usize| all[i % all.len()].clone();
    let kept: Vec<String> = match op {
        PoolOp::Reload(mask) => {
            let mut k: Vec<String> = (0..all.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| all[i].clone())
                .collect();
            if k.is_empty() {
                k.push(all[0].clone());
            }
            k
        }
        _ => Vec::new(),
    };
    let addr = match op {
        PoolOp::Add(i, _)
        | PoolOp::Remove(i)
        | PoolOp::SetActive(i, _)
        | PoolOp::SetWeight(i, _)
        | PoolOp::Restart(i)
        | PoolOp::Panic(i) => at(*i),
        PoolOp::Reload(_) => String::new(),
    };
    let before = model.clone();
    let expect = model.apply(op, &addr, &kept);
    let got = match op {
        PoolOp::Add(_, auto) => {
            let mut ep = EndpointConfig::new(addr.clone()).max_concurrent(c.max_concurrent);
            ep.learned = *auto;
            let r = d.add_endpoint("svc", ep).await;
            if r.is_ok() {
                autos.insert(addr.clone(), *auto);
            }
            r
        }
        PoolOp::Remove(_) => d.remove_endpoint("svc", &addr).await,
        PoolOp::SetActive(_, a) => d.set_active("svc", &addr, *a).await,
        PoolOp::SetWeight(_, w) => d.set_weight("svc", &addr, *w).await,
        PoolOp::Restart(_) => d.restart_node("svc", &addr).await,
        PoolOp::Panic(_) => d.node_fault_drill("svc", &addr).await,
        PoolOp::Reload(_) => {
            let eps: Vec<(String, bool)> = kept
                .iter()
                .map(|a| (a.clone(), autos.get(a).copied().unwrap_or(false)))
                .collect();
            d.reload(config_with(c, &eps)).await.map(|r| {
                let (_, s) = &r.changed[0];
                let mut added = s.added.clone();
                added.sort();
                let mut want: Vec<String> =
                    kept.iter().filter(|a| !before.has(a)).cloned().collect();
                want.sort();
                assert_eq!(added, want, "{op:?} on {before:?}");
            })
        }
    };
    assert_eq!(kind(&got), expect, "{op:?} on {before:?}: {got:?}");
}

fn run_case(c: Case) {
    if std::env::var_os("MODEL_TRACE").is_some() {
        eprintln!("CASE {c:?}");
    }
    actix_rt::System::new().block_on(async move {
        tokio::time::pause();
        let b = backends(&c);
        let d = Dispatcher::builder(config_with(&c, &initial(&c)))
            .transport(b.factory())
            .start()
            .unwrap();
        let heard = Rc::new(RefCell::new(Heard::default()));
        let lent = Rc::new(Cell::new(0u64));
        let mut model = PoolModel(initial(&c).into_iter().map(|(a, _)| a).collect());
        let mut autos: std::collections::HashMap<String, bool> = initial(&c).into_iter().collect();
        let mut waiting = Vec::new();
        let mut next = 0usize;
        let mut samples = 0;
        for (gap, e) in &c.timeline {
            tokio::time::sleep(Duration::from_millis(*gap)).await;
            match e {
                Event::Submit(ts) => {
                    for t in ts {
                        let s = d.submit(task(next, t));
                        next += 1;
                        let heard = heard.clone();
                        let cancel = t.cancel_after_ms.map(Duration::from_millis);
                        waiting.push(actix_rt::spawn(async move {
                            // (Awaited before the borrow: callers interleave.)
                            let r = match cancel {
                                None => Some(s.await),
                                // The Submission is dropped on the timeout.
                                Some(after) => tokio::time::timeout(after, s).await.ok(),
                            };
                            let mut h = heard.borrow_mut();
                            match r {
                                Some(r) => h.result(&r),
                                None => h.dropped += 1,
                            }
                        }));
                    }
                }
                Event::Feed(ts) => {
                    let tasks: Vec<Task> = ts
                        .iter()
                        .map(|t| {
                            let task = task(next, t);
                            next += 1;
                            task
                        })
                        .collect();
                    let n = tasks.len();
                    let mut results = d.feed(futures::stream::iter(tasks));
                    let heard = heard.clone();
                    waiting.push(actix_rt::spawn(async move {
                        let mut got = 0;
                        while let Some(r) = results.next().await {
                            heard.borrow_mut().result(&r);
                            got += 1;
                        }
                        assert_eq!(got, n, "a feed answers each of its tasks");
                    }));
                }
                Event::Lease {
                    class,
                    hold_ms,
                    outcome,
                } => {
                    let d = d.clone();
                    let heard = heard.clone();
                    let lent = lent.clone();
                    let (class, hold, outcome) =
                        (*class, Duration::from_millis(*hold_ms), *outcome);
                    waiting.push(actix_rt::spawn(async move {
                        let r = d.lease("svc", LeaseOptions::new().priority(class)).await;
                        let answer = r.as_ref().map(|_| ()).map_err(Clone::clone);
                        heard.borrow_mut().lease(&answer);
                        if let Ok(lease) = r {
                            lent.set(lent.get() + 1);
                            tokio::time::sleep(hold).await;
                            match outcome {
                                Some(o) => lease.complete(o),
                                None => drop(lease),
                            }
                        }
                    }));
                }
                Event::Pool(op) => pool_change(&d, &c, &mut model, &mut autos, op).await,
                Event::Sample => {
                    let s = d.stats().await;
                    balanced(&s.services[0].queue);
                    samples += 1;
                }
            }
        }
        // The initial pool back, all active: a pool left without a node in
        // service keeps tasks without a deadline waiting, by design (a
        // cancelled one too, until it is dispatched and found abandoned).
        let back = d.reload(config_with(&c, &initial(&c))).await;
        back.expect("the initial pool is put back");
        for (a, _) in initial(&c) {
            d.set_active("svc", &a, true)
                .await
                .expect("the initial pool is put back");
        }
        tokio::time::timeout(RUN_BOUND, async {
            for w in waiting {
                w.await.expect("no caller panics");
            }
        })
        .await
        .expect("every task is answered within the run's bound");
        // Cancelled tasks leave when the queue next looks at them (sent,
        // or out of a retry's backoff): within the bound too.
        let s = tokio::time::timeout(RUN_BOUND, async {
            loop {
                let s = d.stats().await;
                let q = &s.services[0].queue;
                balanced(q);
                if q.queued + q.in_flight + q.waiting == 0 {
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("cancelled tasks leave the queue within the run's bound");
        let svc = &s.services[0];
        let q = &svc.queue;
        // Every caller is done: what they heard is the test's now.
        let h = std::mem::take(&mut *heard.borrow_mut());
        balanced(q);
        assert_eq!((q.queued, q.in_flight, q.waiting), (0, 0, 0), "{q:?}");
        // Every task (and lease) submitted reached the queue once.
        let leases = c
            .timeline
            .iter()
            .filter(|(_, e)| matches!(e, Event::Lease { .. }))
            .count() as u64;
        assert_eq!(q.submitted, next as u64 + leases, "{q:?}");
        // The counters hold what the callers heard, and the dropped tasks'
        // outcomes (heard by nobody) make up the difference exactly.
        let (ds, df, dr) = (
            q.succeeded.checked_sub(h.succeeded),
            q.failed.checked_sub(h.failed),
            q.rejected.checked_sub(h.rejected),
        );
        let (Some(ds), Some(df), Some(dr)) = (ds, df, dr) else {
            panic!("the counters {q:?} hold less than the callers heard {h:?}");
        };
        assert_eq!(ds + df + dr, h.dropped, "{q:?} {h:?}");
        assert!(
            q.cancelled <= dr,
            "cancelled tasks are rejections: {q:?} {h:?}"
        );
        assert_eq!(svc.leases.granted, lent.get(), "{:?}", svc.leases);
        if std::env::var_os("MODEL_TRACE").is_some() {
            eprintln!("DONE {samples} samples, {q:?}");
        }
        d.shutdown(Duration::from_millis(10)).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_engine_keeps_its_books_under_any_interleaving(c in case()) {
        run_case(c);
    }
}
