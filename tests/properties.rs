//! Property: whatever the backends do, however the service is tuned and
//! whatever happens to the pool meanwhile, every accepted task gets exactly
//! one result and the counters add up.
//!
//! Runs the whole actor pipeline under paused tokio time with a scripted
//! in-process transport (answers, 5xx, 429, 404, long hangs, connect errors,
//! resets and panics; `Retry-After` headers with hostile values; health
//! probes answered from a script of their own). Generated on top: hedging
//! (fixed delay or latency percentile), per-task timeouts and deadlines up to
//! the 365-day bound and past it (`Duration::MAX`, refused at submit as
//! `InvalidTask`, still exactly one result), active health checks, and pool
//! changes during the run through the dispatcher's API (`add_endpoint`,
//! `remove_endpoint`, `set_active`, `set_weight`, `reload`). Each run is
//! bounded by a paused-time timeout: a task that would wait forever fails it.
//! `PROP_TRACE=1` prints each case and the paused time it took.

use std::cell::Cell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{HttpReply, HttpRequest, Transport, TransportError};
use actix_dispatch::MAX_DURATION;
use actix_dispatch::{
    Config, Dispatcher, EndpointConfig, ErrorKind, Method, Outcome, PoolError, Rejection, Task,
    TaskResult,
};
use awc::http::header::{HeaderValue, RETRY_AFTER};
use futures::future::LocalBoxFuture;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// How long a scripted hang lasts: far past the service's 200 ms timeout,
/// short enough that a task with a 365-day timeout still ends in paused time.
const HANG: Duration = Duration::from_secs(5);

/// Paused time a run may take before it counts as "waits forever".
const RUN_BOUND: Duration = Duration::from_secs(1800);

#[derive(Debug, Clone, Copy)]
enum Act {
    Ok,
    Status(u16),
    Hang,
    Error(ErrorKind),
    Panic,
}

/// What a health probe gets.
#[derive(Debug, Clone, Copy)]
enum Probe {
    Up,
    Down,
    Hang,
}

struct Scripted {
    script: Arc<Vec<Act>>,
    next: Arc<AtomicUsize>,
    health: Arc<Vec<Probe>>,
    probes: Cell<usize>,
    retry_after: Option<&'static str>,
}

impl Scripted {
    fn reply(&self, status: u16) -> HttpReply {
        let mut headers = actix_dispatch::HeaderMap::new();
        if status == 429 || status == 503 {
            let v = self.retry_after.unwrap_or("1");
            headers.insert(RETRY_AFTER, HeaderValue::from_static(v));
        }
        HttpReply::new(status).with_headers(headers)
    }
}

impl Transport for Scripted {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        if req.url.ends_with("/health") {
            let i = self.probes.get();
            self.probes.set(i + 1);
            let probe = self.health[i % self.health.len()];
            let status = match probe {
                Probe::Up => 200,
                Probe::Down => 503,
                Probe::Hang => 200,
            };
            let reply = self.reply(status);
            return Box::pin(async move {
                let wait = match probe {
                    Probe::Hang => HANG,
                    _ => Duration::from_millis(1),
                };
                tokio::time::sleep(wait).await;
                Ok(reply)
            });
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let act = self.script[i % self.script.len()];
        let status = match act {
            Act::Status(s) => s,
            _ => 200,
        };
        let reply = self.reply(status);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1 + (i % 7) as u64)).await;
            match act {
                Act::Ok | Act::Status(_) => {}
                Act::Hang => tokio::time::sleep(HANG).await,
                Act::Error(k) => return Err(TransportError::new(k, "scripted")),
                Act::Panic => panic!("scripted panic"),
            }
            Ok(reply)
        })
    }
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => Just(Act::Ok),
        1 => Just(Act::Status(500)),
        1 => Just(Act::Status(503)),
        1 => Just(Act::Status(429)),
        1 => Just(Act::Status(404)),
        1 => Just(Act::Hang),
        1 => Just(Act::Error(ErrorKind::Connect)),
        1 => Just(Act::Error(ErrorKind::Reset)),
        1 => Just(Act::Panic),
    ]
}

fn probe() -> impl Strategy<Value = Probe> {
    prop_oneof![3 => Just(Probe::Up), 1 => Just(Probe::Down), 1 => Just(Probe::Hang)]
}

/// A task's own time limits.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// The service's timeout, no deadline.
    None,
    Timeout(Duration),
    DeadlineIn(Duration),
}

impl Limit {
    /// Past the 365-day bound: refused at submit.
    fn is_invalid(self) -> bool {
        match self {
            Limit::None => false,
            Limit::Timeout(d) | Limit::DeadlineIn(d) => d > MAX_DURATION,
        }
    }
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        8 => Just(Limit::None),
        2 => (1u64..3000).prop_map(|ms| Limit::Timeout(Duration::from_millis(ms))),
        2 => (1u64..3000).prop_map(|ms| Limit::DeadlineIn(Duration::from_millis(ms))),
        1 => Just(Limit::Timeout(MAX_DURATION)),
        1 => Just(Limit::DeadlineIn(MAX_DURATION)),
        1 => Just(Limit::Timeout(Duration::MAX)),
        1 => Just(Limit::DeadlineIn(Duration::MAX)),
        1 => Just(Limit::Timeout(MAX_DURATION + Duration::from_secs(1))),
    ]
}

#[derive(Debug, Clone)]
enum Hedge {
    After(u64),
    Percentile(f64),
}

/// A pool change; indexes are taken modulo the list of known addresses
/// (the initial nodes and three spares).
#[derive(Debug, Clone)]
enum PoolOp {
    Add(usize),
    Remove(usize),
    SetActive(usize, bool),
    SetWeight(usize, u32),
    /// Reload with the endpoints whose bit is set (at least one).
    Reload(u8),
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        (0usize..8).prop_map(PoolOp::Add),
        (0usize..8).prop_map(PoolOp::Remove),
        (0usize..8, any::<bool>()).prop_map(|(i, a)| PoolOp::SetActive(i, a)),
        (0usize..8, 0u32..200).prop_map(|(i, w)| PoolOp::SetWeight(i, w)),
        any::<u8>().prop_map(PoolOp::Reload),
    ]
}

#[derive(Debug, Clone)]
struct Health {
    interval_ms: u64,
    unhealthy: u32,
    healthy: u32,
    script: Vec<Probe>,
}

fn health() -> impl Strategy<Value = Health> {
    (
        20u64..400,
        1u32..4,
        1u32..4,
        prop::collection::vec(probe(), 1..8),
    )
        .prop_map(|(interval_ms, unhealthy, healthy, mut script)| {
            // Every round of the script ends with enough good probes in a
            // row to bring a node back: a pool that never recovers parks
            // tasks without a deadline for good, by design. A hanging probe
            // fails only at its 50 ms timeout, up to three intervals later,
            // amid the good ones: three more than the threshold's 3 keep a
            // clean run after it (a seed kept in `proptest-regressions/`
            // had a node never recover with 3).
            script.extend([Probe::Up; 6]);
            Health {
                interval_ms,
                unhealthy,
                healthy,
                script,
            }
        })
}

#[derive(Debug, Clone)]
struct Case {
    script: Vec<Act>,
    tasks: usize,
    nodes: usize,
    max_concurrent: u32,
    max_retries: u32,
    capacity: usize,
    wait_when_full: bool,
    breaker: bool,
    rate_limit: Option<(u32, u32)>,
    reject_on_limit: bool,
    mode: &'static str,
    deadline_ms: Option<u64>,
    shutdown_after_ms: Option<u64>,
    hedge: Option<Hedge>,
    retry_after: Option<&'static str>,
    limits: Vec<Limit>,
    ops: Vec<(u64, PoolOp)>,
    health: Option<Health>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            prop::collection::vec(act(), 1..40),
            1usize..150,
            1usize..4,
            1u32..6,
            0u32..4,
            1usize..60,
        ),
        (
            any::<bool>(),
            any::<bool>(),
            prop::option::of((1u32..50, 1u32..5)),
            any::<bool>(),
            prop_oneof![
                Just("round_robin"),
                Just("weighted"),
                Just("least_load"),
                Just("p2c"),
                Just("consistent_hash")
            ],
            prop::option::of(50u64..3000),
            prop::option::weighted(0.3, 10u64..2000),
        ),
        (
            prop::option::of(prop_oneof![
                (1u64..300).prop_map(Hedge::After),
                (1u32..99).prop_map(|p| Hedge::Percentile(p as f64 + 0.5)),
            ]),
            prop::option::of(prop_oneof![
                Just("18446744073709551615"),
                Just("-1"),
                Just("soon"),
                Just("Fri, 31 Dec 9999 23:59:59 GMT"),
                Just("0"),
                Just("31536000"),
            ]),
            prop::collection::vec(limit(), 1..12),
            prop::collection::vec((0u64..400, pool_op()), 0..8),
            prop::option::of(health()),
        ),
    )
        .prop_map(
            |(
                (script, tasks, nodes, mc, mr, cap),
                (wait, breaker, rl, rej, mode, dl, sd),
                (hedge, retry_after, limits, ops, health),
            )| Case {
                script,
                tasks,
                nodes,
                max_concurrent: mc,
                max_retries: mr,
                capacity: cap,
                wait_when_full: wait,
                breaker,
                rate_limit: rl,
                reject_on_limit: rej,
                mode,
                deadline_ms: dl,
                shutdown_after_ms: sd,
                hedge,
                retry_after,
                limits,
                ops,
                health,
            },
        )
}

/// Every address a case may use: its initial nodes, then three spares.
fn addresses(c: &Case) -> Vec<String> {
    let first = (0..c.nodes).map(|i| format!("http://127.0.0.{}:80/", i + 1));
    let spare = (0..3).map(|i| format!("http://127.0.1.{}:80/", i + 1));
    first.chain(spare).collect()
}

fn endpoint(c: &Case, address: &str, weight: u32) -> EndpointConfig {
    EndpointConfig::new(address)
        .weight(weight)
        .max_concurrent(c.max_concurrent)
}

fn config_with(c: &Case, endpoints: &[String]) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                r#"{{"address":"{a}","weight":{},"max_concurrent":{}}}"#,
                i + 1,
                c.max_concurrent
            )
        })
        .collect();
    let rate = match c.rate_limit {
        Some((r, b)) => format!(
            r#","rate_limit":{{"per_node":{{"rate":{r},"burst":{b}}},"on_limit":"{}"}}"#,
            if c.reject_on_limit { "reject" } else { "wait" }
        ),
        None => String::new(),
    };
    let hedge = match &c.hedge {
        Some(Hedge::After(ms)) => format!(r#","hedge":{{"after":"{ms}ms"}}"#),
        Some(Hedge::Percentile(p)) => format!(r#","hedge":{{"percentile":{p}}}"#),
        None => String::new(),
    };
    let health = match &c.health {
        Some(h) => format!(
            r#","health_check":{{"path":"health","interval":"{}ms","timeout":"50ms","unhealthy_threshold":{},"healthy_threshold":{}}}"#,
            h.interval_ms, h.unhealthy, h.healthy
        ),
        None => String::new(),
    };
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"{}","timeout":"200ms","endpoints":[{}],
            "retry":{{"max_retries":{},"backoff_base":"5ms","backoff_max":"50ms"}},
            "queue":{{"capacity":{},"on_full":"{}"}},
            "breaker":{{"enabled":{},"consecutive_failures":3,"open_for":"100ms","max_open_for":"400ms","on_all_open":"fail_fast"}},
            "balancer":{{"seed":1,"refresh_interval":"50ms"}}{}{}{}}}]}}"#,
        c.mode,
        eps.join(","),
        c.max_retries,
        c.capacity,
        if c.wait_when_full { "wait" } else { "reject" },
        c.breaker,
        rate,
        hedge,
        health,
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn config(c: &Case) -> Config {
    config_with(c, &addresses(c)[..c.nodes])
}

/// The pool as the test expects it: the addresses in it, in order. Each
/// change's answer is predicted from it, independently of the balancer.
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

    /// Applies `op` to the model; returns the answer it predicts.
    fn apply(&mut self, op: &PoolOp, at: impl Fn(usize) -> String) -> Expect {
        match op {
            PoolOp::Add(i) if self.has(&at(*i)) => Expect::Duplicate,
            PoolOp::Add(i) => {
                self.0.push(at(*i));
                Expect::Ok
            }
            PoolOp::Remove(i) if !self.has(&at(*i)) => Expect::Unknown,
            PoolOp::Remove(_) if self.0.len() == 1 => Expect::Last,
            PoolOp::Remove(i) => {
                let a = at(*i);
                self.0.retain(|x| *x != a);
                Expect::Ok
            }
            PoolOp::SetActive(i, _) | PoolOp::SetWeight(i, _) if !self.has(&at(*i)) => {
                Expect::Unknown
            }
            PoolOp::SetActive(..) | PoolOp::SetWeight(..) | PoolOp::Reload(_) => Expect::Ok,
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

/// The endpoints a reload with `mask` keeps (at least one).
fn kept(all: &[String], mask: u8) -> Vec<String> {
    let mut keep: Vec<String> = (0..all.len())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| all[i].clone())
        .collect();
    if keep.is_empty() {
        keep.push(all[0].clone());
    }
    keep
}

/// `a` less `b`, sorted.
fn less(a: &[String], b: &[String]) -> Vec<String> {
    let mut v: Vec<String> = a.iter().filter(|x| !b.contains(x)).cloned().collect();
    v.sort();
    v
}

/// Applies the case's pool changes, each answer checked against the
/// [`PoolModel`]'s, then puts the initial pool back (all active) so that
/// every task can still be served: a pool left empty would park tasks
/// without a deadline forever, by design. Returns how many changes were
/// made (answered `Ok`), so the run can show the changes did happen.
async fn change_pool(d: Dispatcher, c: Case, stopping: Rc<Cell<bool>>) -> usize {
    let all = addresses(&c);
    let mut model = PoolModel(all[..c.nodes].to_vec());
    let mut made = 0;
    for (after_ms, op) in &c.ops {
        tokio::time::sleep(Duration::from_millis(*after_ms)).await;
        if stopping.get() {
            return made;
        }
        let at = |i: usize| all[i % all.len()].clone();
        let before = model.clone();
        let expect = model.apply(op, at);
        let got = match op {
            PoolOp::Add(i) => d.add_endpoint("svc", endpoint(&c, &at(*i), 1)).await,
            PoolOp::Remove(i) => d.remove_endpoint("svc", &at(*i)).await,
            PoolOp::SetActive(i, a) => d.set_active("svc", &at(*i), *a).await,
            PoolOp::SetWeight(i, w) => d.set_weight("svc", &at(*i), *w).await,
            PoolOp::Reload(mask) => {
                let keep = kept(&all, *mask);
                model.0.clone_from(&keep);
                d.reload(config_with(&c, &keep)).await.map(|r| {
                    let (name, s) = &r.changed[0];
                    assert_eq!(name, "svc");
                    let (mut added, mut removed) = (s.added.clone(), s.removed.clone());
                    added.sort();
                    removed.sort();
                    assert_eq!(added, less(&keep, &before.0), "{op:?} on {before:?}");
                    assert_eq!(removed, less(&before.0, &keep), "{op:?} on {before:?}");
                })
            }
        };
        if stopping.get() && matches!(got, Err(PoolError::Stopped)) {
            // Shutdown overtook the change.
            return made;
        }
        assert_eq!(kind(&got), expect, "{op:?} on {before:?}: {got:?}");
        made += (expect == Expect::Ok) as usize;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    if stopping.get() || c.ops.is_empty() {
        return made;
    }
    let back = d.reload(config(&c)).await;
    let actives =
        futures::future::join_all(all[..c.nodes].iter().map(|a| d.set_active("svc", a, true)))
            .await;
    if !stopping.get() {
        back.expect("the initial pool is put back");
        for r in actives {
            r.expect("the initial pool is put back");
        }
    }
    made
}

fn task(c: &Case, i: usize) -> Task {
    let mut t = if i % 4 == 0 {
        Task::new("svc", Method::POST, format!("/p/{i}"))
    } else {
        Task::get("svc", format!("/g/{i}")).affinity(format!("k{}", i % 13))
    };
    if let Some(ms) = c.deadline_ms {
        t = t.deadline_in(Duration::from_millis(ms));
    }
    match c.limits[i % c.limits.len()] {
        Limit::None => t,
        Limit::Timeout(d) => t.timeout(d),
        Limit::DeadlineIn(d) => t.deadline_in(d),
    }
}

/// Outcomes counted from the callers' answers.
#[derive(Debug, Default)]
struct Tally {
    succeeded: u64,
    failed: u64,
    rejected: u64,
}

impl Tally {
    fn of<'a>(results: impl Iterator<Item = &'a TaskResult>) -> Self {
        let mut t = Tally::default();
        for r in results {
            match r.outcome {
                Outcome::Success(_) => t.succeeded += 1,
                Outcome::Failure(_) => t.failed += 1,
                Outcome::Rejected(_) | Outcome::Fallback { .. } => t.rejected += 1,
                ref o => panic!("an outcome this test does not know: {o:?}"),
            }
        }
        t
    }

    fn total(&self) -> u64 {
        self.succeeded + self.failed + self.rejected
    }
}

fn run_case(c: Case) {
    let trace = std::env::var_os("PROP_TRACE").is_some();
    if trace {
        eprintln!("CASE {c:?}");
    }
    actix_rt::System::new().block_on(async move {
        tokio::time::pause();
        let started = tokio::time::Instant::now();
        let script = Arc::new(c.script.clone());
        let next = Arc::new(AtomicUsize::new(0));
        let health = Arc::new(
            c.health
                .as_ref()
                .map_or_else(|| vec![Probe::Up], |h| h.script.clone()),
        );
        let retry_after = c.retry_after;
        let factory: actix_dispatch::transport::TransportFactory = Arc::new(move |_: &str| {
            Rc::new(Scripted {
                script: script.clone(),
                next: next.clone(),
                health: health.clone(),
                probes: Cell::new(0),
                retry_after,
            }) as Rc<dyn Transport>
        });
        let d = Dispatcher::builder(config(&c))
            .transport(factory)
            .start()
            .unwrap();
        let stopping = Rc::new(Cell::new(false));
        let pool = actix_rt::spawn(change_pool(d.clone(), c.clone(), stopping.clone()));
        let invalid: HashSet<usize> = (0..c.tasks)
            .filter(|i| c.limits[i % c.limits.len()].is_invalid())
            .collect();
        let handles: Vec<_> = (0..c.tasks)
            .map(|i| {
                let s = d.submit(task(&c, i));
                actix_rt::spawn(async move { (i, s.await) })
            })
            .collect();
        let report = if let Some(ms) = c.shutdown_after_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            stopping.set(true);
            let shut = d.shutdown(Duration::from_millis(100));
            let report = tokio::time::timeout(RUN_BOUND, shut).await;
            Some(report.expect("shutdown ends within the run's bound"))
        } else {
            None
        };
        let answers = tokio::time::timeout(RUN_BOUND, async {
            let mut all = Vec::with_capacity(handles.len());
            for h in handles {
                all.push(h.await.expect("submit never panics"));
            }
            all
        })
        .await
        .expect("every task is answered within the run's bound");
        let mut ids = HashSet::new();
        for (i, r) in &answers {
            assert!(ids.insert(r.id), "task {} answered twice", r.id);
            if invalid.contains(i) {
                assert!(
                    matches!(r.outcome, Outcome::Rejected(Rejection::InvalidTask(_))),
                    "task {i} past the 365-day bound: {:?}",
                    r.outcome
                );
            }
        }
        assert_eq!(ids.len(), c.tasks);
        if trace {
            eprintln!("DONE after {:?} paused", started.elapsed());
        }
        stopping.set(true);
        let made = tokio::time::timeout(RUN_BOUND, pool)
            .await
            .expect("pool changes end")
            .expect("pool changes never panic");
        if trace {
            eprintln!("{made} of {} pool changes made", c.ops.len());
        }
        let stats = match report {
            Some(r) => r.stats,
            None => {
                let s = d.stats().await;
                d.shutdown(Duration::from_millis(10)).await;
                s
            }
        };
        // The counters against the answers the callers got (tasks refused
        // at submit as invalid never reach the queue, so no counter has them).
        let t = Tally::of(
            answers
                .iter()
                .filter(|(i, _)| !invalid.contains(i))
                .map(|(_, r)| r),
        );
        let q = &stats.services[0].queue;
        assert_eq!(
            (
                q.submitted,
                q.succeeded,
                q.failed,
                q.rejected,
                q.queued,
                q.in_flight
            ),
            (t.total(), t.succeeded, t.failed, t.rejected, 0, 0),
            "{q:?}"
        );
        assert_eq!(t.total() as usize, c.tasks - invalid.len());
    });
}

proptest! {
    // Cases from `PROPTEST_CASES` (proptest's default: 256); failing seeds
    // are kept in `proptest-regressions/` and replayed first.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/properties.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_task_gets_exactly_one_result(c in case()) {
        run_case(c);
    }
}
