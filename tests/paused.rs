//! Actor wiring under paused tokio time: exact timing properties of the
//! pipeline, with an in-process transport (pure scheduling; the behaviour
//! tests against real sockets are in the other files).

use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use actix_dispatch::{Config, Dispatcher, FailReason, Instant, Outcome, Task, TaskResult};
use futures::future::LocalBoxFuture;

type Log = Arc<Mutex<Vec<Instant>>>;

/// tokio's timer resolution: a timer fires at most this late, never early.
const TICK: Duration = Duration::from_millis(1);

/// Answers every request at once with `status`, logging when it was sent.
struct Immediate {
    log: Log,
    status: u16,
}

impl Transport for Immediate {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        self.log.lock().unwrap().push(Instant::now());
        let status = self.status;
        Box::pin(async move {
            Ok(HttpReply {
                status,
                headers: Default::default(),
                body: Default::default(),
                protocol: None,
            })
        })
    }
}

fn factory(log: &Log, status: u16) -> TransportFactory {
    let log = log.clone();
    Arc::new(move |_: &str| {
        Rc::new(Immediate {
            log: log.clone(),
            status,
        }) as Rc<dyn Transport>
    })
}

fn cfg(extra: &str) -> Config {
    Config::from_json(&format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"http://127.0.0.1:9/","max_concurrent":100}}],
            "balancer":{{"seed":7}}{extra}}}]}}"#
    ))
    .unwrap()
}

async fn submit_all(d: &Dispatcher, n: usize) -> Vec<TaskResult> {
    futures::future::join_all((0..n).map(|i| d.submit(Task::get("svc", format!("/{i}"))))).await
}

#[actix_rt::test]
async fn token_bucket_admission_is_exact_in_virtual_time() {
    tokio::time::pause();
    let log = Log::default();
    let d = Dispatcher::builder(cfg(
        r#","rate_limit":{"per_node":{"rate":10,"burst":5},"on_limit":"wait"}"#,
    ))
    .transport(factory(&log, 200))
    .start()
    .unwrap();
    let t0 = Instant::now();
    let results = submit_all(&d, 45).await;
    assert!(results.iter().all(TaskResult::is_success));
    let sent = log.lock().unwrap().clone();
    assert_eq!(sent.len(), 45);
    // The burst at once, then one every 100 ms: never early, and late by at
    // most tokio's 1 ms timer resolution (lateness does not accumulate).
    assert!(sent[..5].iter().all(|t| *t == t0));
    for (i, t) in sent[5..].iter().enumerate() {
        let due = Duration::from_millis(100 * (i as u64 + 1));
        let at = *t - t0;
        assert!(
            at >= due && at <= due + TICK,
            "task {}: {at:?} for {due:?}",
            i + 5
        );
    }
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn retries_wait_out_jittered_exponential_backoff() {
    tokio::time::pause();
    let log = Log::default();
    let d = Dispatcher::builder(cfg(
        r#","breaker":{"enabled":false},"retry":{"max_retries":4,"backoff_base":"100ms","backoff_max":"300ms"}"#,
    ))
    .transport(factory(&log, 503))
    .start()
    .unwrap();
    let r = d.submit(Task::get("svc", "/x")).await;
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::RetriesExhausted),
        o => panic!("{o:?}"),
    }
    let sent = log.lock().unwrap().clone();
    assert_eq!(sent.len(), 5);
    // Full jitter: each wait is within [0, min(300, 100·2^k)] ms.
    for (k, ceiling) in [100u64, 200, 300, 300].into_iter().enumerate() {
        let gap = sent[k + 1] - sent[k];
        assert!(gap <= Duration::from_millis(ceiling), "retry {k}: {gap:?}");
    }
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_deadline_cuts_the_backoff_short_in_virtual_time() {
    tokio::time::pause();
    let log = Log::default();
    let d = Dispatcher::builder(cfg(
        r#","breaker":{"enabled":false},"retry":{"max_retries":50,"backoff_base":"100ms","backoff_max":"100ms"}"#,
    ))
    .transport(factory(&log, 503))
    .start()
    .unwrap();
    let t0 = Instant::now();
    let r = d
        .submit(Task::get("svc", "/x").deadline_in(Duration::from_millis(1000)))
        .await;
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::DeadlineExceeded),
        o => panic!("{o:?}"),
    }
    assert!(Instant::now() - t0 <= Duration::from_millis(1000));
    assert!(
        r.attempts.len() >= 10,
        "backoffs of at most 100 ms: {}",
        r.attempts.len()
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_open_breaker_doubles_its_time_between_probes() {
    tokio::time::pause();
    let log = Log::default();
    let d = Dispatcher::builder(cfg(
        r#","breaker":{"consecutive_failures":1,"open_for":"1s","max_open_for":"4s","on_all_open":"wait"},
           "retry":{"max_retries":5,"backoff_base":"1ms","backoff_max":"1ms","min_retries_per_sec":100}"#,
    ))
    .transport(factory(&log, 503))
    .start()
    .unwrap();
    let t0 = Instant::now();
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(matches!(r.outcome, Outcome::Failure(_)), "{r:?}");
    let sent: Vec<Duration> = log.lock().unwrap().iter().map(|t| *t - t0).collect();
    assert_eq!(sent.len(), 6, "{r:?}");
    // Probes after 1 s, 2 s, 4 s, then 4 s (capped) open periods.
    for (w, open) in sent.windows(2).zip([1000u64, 2000, 4000, 4000, 4000]) {
        let (gap, open) = (w[1] - w[0], Duration::from_millis(open));
        assert!(gap >= open && gap <= open + 2 * TICK, "{sent:?}");
    }
    d.shutdown(Duration::from_secs(1)).await;
}
