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
        Box::pin(async move { Ok(HttpReply::new(status)) })
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

/// Answers every request at once with 503, logging when each path was sent.
struct Sent503(Arc<Mutex<Vec<(String, Instant)>>>);

impl Transport for Sent503 {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        self.0.lock().unwrap().push((req.url, Instant::now()));
        Box::pin(std::future::ready(Ok(HttpReply::new(503))))
    }
}

#[actix_rt::test]
async fn retries_wait_out_jittered_exponential_backoff() {
    tokio::time::pause();
    const TASKS: usize = 200;
    let log: Arc<Mutex<Vec<(String, Instant)>>> = Default::default();
    let log2 = log.clone();
    // The budget never binds: 4 retries of every task are allowed.
    let d = Dispatcher::builder(cfg(
        r#","breaker":{"enabled":false},"retry":{"max_retries":4,"backoff_base":"100ms","backoff_max":"300ms",
            "budget_percent":1.0,"min_retries_per_sec":1000}"#,
    ))
    .transport(Arc::new(move |_: &str| {
        Rc::new(Sent503(log2.clone())) as Rc<dyn Transport>
    }))
    .start()
    .unwrap();
    for r in submit_all(&d, TASKS).await {
        match &r.outcome {
            Outcome::Failure(f) => assert_eq!(f.reason, FailReason::RetriesExhausted),
            o => panic!("{o:?}"),
        }
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), TASKS * 5);
    // The k-th wait of every task, in milliseconds.
    let mut gaps = vec![Vec::new(); 4];
    for i in 0..TASKS {
        let path = format!("/{i}");
        let sent: Vec<Instant> = log
            .iter()
            .filter(|(u, _)| u.ends_with(&path))
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(sent.len(), 5, "task {i}");
        for k in 0..4 {
            gaps[k].push((sent[k + 1] - sent[k]).as_secs_f64() * 1000.0);
        }
    }
    // Full jitter: the k-th wait is uniform on [0, min(300, 100·2^k)] ms.
    // Each bound is checked both ways over 200 draws: none above the
    // ceiling (a timer fires at most a tick late), some in its top and
    // bottom fifths and a mean near half, so a flat delay, no jitter, or a
    // ceiling that does not grow (max of the 2nd wait over the 1st's
    // ceiling) all fail.
    for (k, ceiling) in [100.0f64, 200.0, 300.0, 300.0].into_iter().enumerate() {
        let g = &gaps[k];
        let max = g.iter().cloned().fold(0.0, f64::max);
        let min = g.iter().cloned().fold(f64::MAX, f64::min);
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let tick = TICK.as_secs_f64() * 1000.0;
        assert!(max <= ceiling + tick, "wait {k}: max {max} over {ceiling}");
        assert!(max >= 0.8 * ceiling, "wait {k}: max {max} of {ceiling}");
        assert!(min <= 0.2 * ceiling, "wait {k}: min {min} of {ceiling}");
        assert!(
            (0.4 * ceiling..=0.6 * ceiling).contains(&mean),
            "wait {k}: mean {mean} of {ceiling}"
        );
    }
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!(
        (q.submitted, q.failed, q.retried, q.queued, q.in_flight),
        (TASKS as u64, TASKS as u64, 4 * TASKS as u64, 0, 0)
    );
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
