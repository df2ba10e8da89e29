//! The dispatch engine end to end, against real loopback backends.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use actix_dispatch::{
    Config, Dispatcher, FailReason, Method, Outcome, Rejection, Task, TaskResult,
};
use futures::StreamExt;
use support::cfg::{burst, config, served_by};
use support::{backends, init_logs, Backend};

#[actix_rt::test]
async fn seed_config_runs_unchanged() {
    init_logs();
    let b = Backend::start();
    let json = format!(
        r#"{{"ApiServers":[{{"Name":"Did","Mode":"Poll","ApiEndPoints":[{{"Address":"{}","Weight":1}}]}}]}}"#,
        b.url()
    );
    let d = Dispatcher::start(Config::from_json(&json).unwrap()).unwrap();
    let r = d.submit(Task::get("Did", "/hello")).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    let body = &r.response().unwrap().body;
    assert!(String::from_utf8_lossy(body).contains(r#""path":"/hello""#));
    assert_eq!(b.hits(), 1);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn round_robin_is_exactly_even() {
    init_logs();
    let bs = backends(3);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 10)).collect();
    let d = Dispatcher::start(config("round_robin", &nodes, "")).unwrap();
    let mut seen = Vec::new();
    for i in 0..30 {
        let r = d.submit(Task::get("svc", format!("/rr/{i}"))).await;
        seen.push(served_by(&r));
    }
    for b in &bs {
        assert_eq!(b.hits(), 10, "{}", b.name());
    }
    // Strict rotation: the same node every third task.
    for i in 3..30 {
        assert_eq!(seen[i], seen[i - 3]);
        assert_ne!(seen[i], seen[i - 1]);
    }
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn smooth_weighted_5_1_1_sequence_end_to_end() {
    init_logs();
    let bs = backends(3);
    let d = Dispatcher::start(config(
        "Weight",
        &[(&bs[0], 5, 10), (&bs[1], 1, 10), (&bs[2], 1, 10)],
        "",
    ))
    .unwrap();
    let names: HashMap<String, char> = bs
        .iter()
        .zip(['a', 'b', 'c'])
        .map(|(b, c)| (b.url(), c))
        .collect();
    let mut seq = String::new();
    for _ in 0..14 {
        let r = d.submit(Task::get("svc", "/w")).await;
        seq.push(names[&served_by(&r)]);
    }
    assert_eq!(seq, "aabacaaaabacaa");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn least_load_prefers_the_fast_node() {
    init_logs();
    let bs = backends(2);
    bs[1].set_latency(Duration::from_millis(150));
    let d = Dispatcher::start(config(
        "least_load",
        &[(&bs[0], 1, 10), (&bs[1], 1, 10)],
        "",
    ))
    .unwrap();
    let tasks = futures::stream::iter((0..200).map(|i| Task::get("svc", format!("/ll/{i}"))));
    let results: Vec<TaskResult> = futures::stream::iter(tasks.collect::<Vec<_>>().await)
        .map(|t| d.submit(t))
        .buffer_unordered(8)
        .collect()
        .await;
    assert!(results.iter().all(TaskResult::is_success));
    let (fast, slow) = (bs[0].hits(), bs[1].hits());
    assert_eq!(fast + slow, 200);
    assert!(fast > 3 * slow, "fast {fast} slow {slow}");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn max_concurrent_is_never_exceeded() {
    init_logs();
    let bs = backends(2);
    for b in &bs {
        b.set_latency(Duration::from_millis(20));
    }
    // The test holds a standing queue on purpose (more tasks than slots for
    // longer than an interval): the delay control would shed it.
    let d = Dispatcher::start(config(
        "p2c",
        &[(&bs[0], 1, 3), (&bs[1], 1, 5)],
        r#""queue":{"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let results: Vec<TaskResult> = futures::stream::iter(0..400)
        .map(|i| d.submit(Task::get("svc", format!("/mc/{i}"))))
        .buffer_unordered(200)
        .collect()
        .await;
    assert_eq!(results.iter().filter(|r| r.is_success()).count(), 400);
    assert!(bs[0].peak_concurrent() <= 3, "{}", bs[0].peak_concurrent());
    assert!(bs[1].peak_concurrent() <= 5, "{}", bs[1].peak_concurrent());
    // And the cap was actually reached: the queue, not the nodes, held the rest.
    assert_eq!(bs[0].peak_concurrent() + bs[1].peak_concurrent(), 8);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_retry_moves_to_a_healthy_node() {
    init_logs();
    let bs = backends(2);
    bs[0].set_status(Some(503));
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 10), (&bs[1], 1, 10)],
        r#""breaker":{"enabled":false}"#,
    ))
    .unwrap();
    for i in 0..10 {
        let r = d.submit(Task::get("svc", format!("/r/{i}"))).await;
        assert_eq!(served_by(&r), bs[1].url());
        // At most one failed attempt, and never twice on the failing node.
        assert!(r.attempts.len() <= 2, "{:?}", r.attempts);
        if r.attempts.len() == 2 {
            assert_eq!(&*r.attempts[0].node, bs[0].url());
            assert_eq!(&*r.attempts[1].node, bs[1].url());
        }
    }
    let s = d.stats().await;
    let svc = s.service("svc").unwrap();
    assert_eq!(svc.queue.retried, bs[0].hits());
    assert!(svc.is_balanced());
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_404_is_not_retried() {
    init_logs();
    let bs = backends(2);
    let d = Dispatcher::start(config("p2c", &[(&bs[0], 1, 10), (&bs[1], 1, 10)], "")).unwrap();
    let r = d.submit(Task::get("svc", "/status/404")).await;
    match &r.outcome {
        Outcome::Failure(f) => {
            assert_eq!(f.reason, FailReason::NotRetryable);
            assert_eq!(f.response.as_ref().unwrap().status, 404);
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(bs[0].hits() + bs[1].hits(), 1);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn retries_exhaust_and_429_is_retried() {
    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"enabled":false},"retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"2ms"}"#,
    ))
    .unwrap();
    let r = d.submit(Task::get("svc", "/status/500")).await;
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::RetriesExhausted),
        o => panic!("{o:?}"),
    }
    assert_eq!(r.attempts.len(), 3);
    let r = d.submit(Task::get("svc", "/retry-after/0")).await;
    assert_eq!(r.attempts.len(), 3, "429 is retried");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_deadline_stops_retries() {
    init_logs();
    let b = Backend::start();
    b.set_status(Some(503));
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""breaker":{"enabled":false},"retry":{"max_retries":100,"backoff_base":"40ms","backoff_max":"40ms"}"#,
    ))
    .unwrap();
    let r = d
        .submit(Task::get("svc", "/d").deadline_in(Duration::from_millis(300)))
        .await;
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::DeadlineExceeded),
        o => panic!("{o:?}"),
    }
    // 300 ms of 0..40 ms backoffs: far fewer than 100 retries.
    assert!(
        r.attempts.len() >= 2 && r.attempts.len() < 60,
        "{}",
        r.attempts.len()
    );
    let r = d
        .submit(Task::get("svc", "/d").deadline(actix_dispatch::Instant::now()))
        .await;
    assert_eq!(r.rejection(), Some(&Rejection::DeadlinePassed));
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn timeouts_are_retried_only_for_idempotent_tasks() {
    init_logs();
    let b = Backend::start();
    b.set_latency(Duration::from_millis(300));
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 10)],
        r#""timeout":"50ms","breaker":{"enabled":false},"retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}"#,
    ))
    .unwrap();
    let r = d
        .submit(Task::new("svc", Method::POST, "/t").body("x"))
        .await;
    assert_eq!(r.attempts.len(), 1, "POST not retried after a timeout");
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.reason, FailReason::NotRetryable),
        o => panic!("{o:?}"),
    }
    let r = d.submit(Task::get("svc", "/t")).await;
    assert_eq!(r.attempts.len(), 2, "GET retried after a timeout");
    let r = d
        .submit(Task::new("svc", Method::POST, "/t").idempotent(true))
        .await;
    assert_eq!(r.attempts.len(), 2, "marked idempotent");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn queue_full_rejects_or_waits() {
    init_logs();
    let b = Backend::start();
    b.set_latency(Duration::from_millis(100));
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 1)],
        r#""queue":{"capacity":5,"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let results: Vec<TaskResult> = burst(&d, 20, "q").await;
    let full = results
        .iter()
        .filter(|r| r.rejection() == Some(&Rejection::QueueFull))
        .count();
    let ok = results.iter().filter(|r| r.is_success()).count();
    // Five queued (and one in flight if credit came before the burst); the rest refused.
    assert!(ok == 5 || ok == 6, "{ok}");
    assert_eq!(full, 20 - ok);
    assert_eq!(d.stats().await.services[0].queue.peak_queued, 5);
    d.shutdown(Duration::from_secs(1)).await;

    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 1)],
        r#""queue":{"capacity":2,"on_full":"wait"}"#,
    ))
    .unwrap();
    b.set_latency(Duration::from_millis(5));
    let results: Vec<TaskResult> = burst(&d, 20, "q").await;
    assert!(results.iter().all(TaskResult::is_success));
    let s = d.stats().await;
    assert!(s.services[0].queue.peak_queued <= 2);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn feed_keeps_the_queue_within_capacity() {
    init_logs();
    let bs = backends(3);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 32)).collect();
    let d =
        Dispatcher::start(config("round_robin", &nodes, r#""queue":{"capacity":256}"#)).unwrap();
    const N: usize = 100_000;
    let tasks = futures::stream::iter((0..N).map(|i| Task::get("svc", format!("/f/{i}"))));
    let mut results = d.feed(tasks);
    let mut ok = 0usize;
    let mut ids = std::collections::HashSet::new();
    while let Some(r) = results.next().await {
        assert!(ids.insert(r.id), "task {} answered twice", r.id);
        ok += r.is_success() as usize;
    }
    assert_eq!(ok, N);
    let s = d.stats().await;
    let q = &s.services[0].queue;
    assert_eq!(q.submitted, N as u64);
    assert!(q.peak_queued <= 256, "peak {}", q.peak_queued);
    assert_eq!(q.rejected, 0);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn shutdown_loses_nothing() {
    init_logs();
    let b = Backend::start();
    b.set_latency(Duration::from_millis(200));
    // The test holds a standing queue on purpose (more tasks than slots for
    // longer than an interval): the delay control would shed it.
    let d = Dispatcher::start(config(
        "p2c",
        &[(&b, 1, 2)],
        r#""queue":{"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let handles: Vec<_> = (0..50)
        .map(|i| {
            let d = d.clone();
            actix_rt::spawn(async move { d.submit(Task::get("svc", format!("/s/{i}"))).await })
        })
        .collect();
    actix_rt::time::sleep(Duration::from_millis(50)).await;
    let report = d.shutdown(Duration::from_millis(300)).await;
    assert!(!report.drained);
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    let ok = results.iter().filter(|r| r.is_success()).count();
    let down = results
        .iter()
        .filter(|r| r.rejection() == Some(&Rejection::ShuttingDown))
        .count();
    assert_eq!(ok + down, 50);
    assert_eq!(report.unfinished.len(), down);
    assert!(ok >= 2, "some finished within the grace period");
    assert!(report.stats.services[0].is_balanced());
    let late = d.submit(Task::get("svc", "/late")).await;
    assert_eq!(late.rejection(), Some(&Rejection::ShuttingDown));
}

#[actix_rt::test]
async fn bad_tasks_are_refused_with_their_reason() {
    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config("p2c", &[(&b, 1, 10)], "")).unwrap();
    let cases = [
        (Task::get("nope", "/"), "unknown service"),
        (Task::get("svc", "http://example.com/"), "absolute URL"),
        (Task::get("svc", "//example.com/x"), "`//`"),
        (Task::get("svc", "/a\r\nX: y"), "CR, LF"),
        (Task::get("svc", "/").header("x", "a\nb"), "CR, LF"),
        (Task::get("svc", "/").timeout(Duration::ZERO), "timeout"),
    ];
    for (t, want) in cases {
        let r = d.submit(t).await;
        let reason = r.rejection().map(|r| r.to_string()).unwrap_or_default();
        assert!(reason.contains(want), "{reason} / {want}");
    }
    assert_eq!(b.hits(), 0);
    // A Task sent as an actix message to the service's recipient is answered
    // the same way.
    let q = d.recipient("svc").unwrap();
    let r = q.send(Task::get("svc", "/direct")).await.unwrap();
    assert!(r.is_success());
    let r = q.send(Task::get("svc", "http://x/")).await.unwrap();
    assert!(matches!(r.rejection(), Some(Rejection::InvalidTask(_))));
    let r = q.send(Task::get("other", "/x")).await.unwrap();
    let why = r.rejection().map(|r| r.to_string()).unwrap_or_default();
    assert!(why.contains("sent to the queue of service"), "{why}");
    d.shutdown(Duration::from_secs(1)).await;
}

/// `Dispatcher::recipient` is the typed way to send a `Task` as an actix
/// message: an actor holding the service's `Recipient<Task>` (here a small
/// forwarder) gets each task's `TaskResult` from a real backend, as
/// `submit` would give it.
#[actix_rt::test]
async fn a_task_sent_to_the_recipient_is_served_by_a_real_backend() {
    use actix::prelude::*;

    struct Forwarder(Recipient<Task>);
    impl Actor for Forwarder {
        type Context = Context<Self>;
    }
    #[derive(Message)]
    #[rtype(result = "Result<TaskResult, MailboxError>")]
    struct Fetch(String);
    impl Handler<Fetch> for Forwarder {
        type Result = ResponseFuture<Result<TaskResult, MailboxError>>;
        fn handle(&mut self, msg: Fetch, _: &mut Context<Self>) -> Self::Result {
            Box::pin(self.0.send(Task::get("svc", msg.0)))
        }
    }

    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config("p2c", &[(&b, 1, 10)], "")).unwrap();
    assert!(d.recipient("nope").is_none());
    // Service names match case-insensitively, as for `submit`.
    let forwarder = Forwarder(d.recipient("SVC").unwrap()).start();
    for i in 0..3 {
        let r = forwarder
            .send(Fetch(format!("/via/{i}")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(served_by(&r), b.url());
        let body = String::from_utf8_lossy(&r.response().unwrap().body).into_owned();
        assert!(body.contains(&format!(r#""path":"/via/{i}""#)), "{body}");
    }
    assert_eq!(b.hits(), 3);
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!((q.submitted, q.succeeded), (3, 3));
    d.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn start_outside_a_system_is_an_error() {
    let c = Config::from_json(
        r#"{"services":[{"name":"a","endpoints":[{"address":"http://127.0.0.1:1/"}]}]}"#,
    )
    .unwrap();
    let e = Dispatcher::start(c).err().expect("no system");
    assert!(e.to_string().contains("actix System"));
}

#[actix_rt::test]
async fn conservation_with_faults_20k_tasks() {
    init_logs();
    let bs = backends(3);
    bs[1].fail_every(10, 500);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 16)).collect();
    let d = Dispatcher::start(config(
        "p2c",
        &nodes,
        r#""timeout":"2s","queue":{"capacity":2000},"retry":{"backoff_base":"1ms","backoff_max":"10ms"}"#,
    ))
    .unwrap();
    const N: usize = 20_000;
    let tasks = futures::stream::iter((0..N).map(|i| Task::get("svc", format!("/c/{i}"))));
    let mut results = d.feed(tasks);
    let mut ids = std::collections::HashSet::new();
    let (mut ok, mut failed, mut rejected) = (0u64, 0u64, 0u64);
    while let Some(r) = results.next().await {
        assert!(ids.insert(r.id), "task {} answered twice", r.id);
        match r.outcome {
            Outcome::Success(_) => ok += 1,
            Outcome::Failure(_) => failed += 1,
            _ => rejected += 1,
        }
        if ids.len() == N / 2 {
            bs[2].stop();
        }
    }
    assert_eq!(ids.len(), N);
    let s = d.stats().await;
    let svc = s.service("svc").unwrap();
    assert!(svc.is_balanced(), "{:?}", svc.queue);
    assert_eq!(svc.queue.submitted, N as u64);
    assert_eq!(
        (svc.queue.succeeded, svc.queue.failed, svc.queue.rejected),
        (ok, failed, rejected)
    );
    assert_eq!((svc.queue.queued, svc.queue.in_flight), (0, 0));
    // Retries absorb the faults: nearly everything succeeds.
    assert!(
        ok as usize > N * 99 / 100,
        "ok {ok} failed {failed} rejected {rejected}"
    );
    // The backends saw every attempt the engine counted.
    let attempts: u64 = svc.nodes.iter().map(|n| n.total).sum();
    assert_eq!(attempts, N as u64 + svc.queue.retried);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn node_actors_on_their_own_thread() {
    init_logs();
    let bs = backends(2);
    for b in &bs {
        b.set_latency(Duration::from_millis(2));
    }
    bs[1].fail_every(5, 503);
    let d = Dispatcher::builder(config(
        "p2c",
        &[(&bs[0], 1, 4), (&bs[1], 1, 4)],
        r#""queue":{"delay":{"enabled":false}}"#,
    ))
    .node_threads(1)
    .start()
    .unwrap();
    let results: Vec<TaskResult> = futures::stream::iter(0..2000)
        .map(|i| d.submit(Task::get("svc", format!("/nt/{i}"))))
        .buffer_unordered(64)
        .collect()
        .await;
    // Retries prefer the other node but take the failing one when the other
    // is full, so now and then a task meets four injected failures in a row.
    let ok = results.iter().filter(|r| r.is_success()).count();
    assert!(ok >= 1980, "{ok} of 2000 succeeded");
    assert!(results.iter().all(|r| r.is_success()
        || matches!(&r.outcome, Outcome::Failure(f) if f.reason == FailReason::RetriesExhausted)));
    let ids: std::collections::HashSet<_> = results.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 2000);
    assert!(bs[0].peak_concurrent() <= 4 && bs[1].peak_concurrent() <= 4);
    d.restart_node("svc", &bs[0].url()).await.unwrap();
    assert!(d.submit(Task::get("svc", "/after")).await.is_success());
    let report = d.shutdown(Duration::from_secs(1)).await;
    assert!(report.drained);
    assert!(report.stats.services[0].is_balanced());
}
