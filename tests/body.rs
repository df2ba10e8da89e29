//! A large body is not a sick node (issue 8, item 6): a response body over
//! `max_body` fails its task, is not retried and leaves the node's breaker
//! and error rate alone; a connection that breaks mid-body stays a node
//! failure.

mod support;

use std::time::Duration;

use actix_dispatch::{AttemptOutcome, Dispatcher, ErrorKind, FailReason, Outcome, Task};
use support::cfg::{burst, config};
use support::{init_logs, Backend};

/// One node, bodies up to 1 KiB, a breaker that opens after 5 failures in a
/// row (the default) or at a 50 % failure rate.
fn one_node(b: &Backend) -> Dispatcher {
    Dispatcher::start(config(
        "round_robin",
        &[(b, 1, 10)],
        r#""max_body":1024,"retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"5ms"},
           "breaker":{"consecutive_failures":5,"open_for":"5s"}"#,
    ))
    .unwrap()
}

#[actix_rt::test]
async fn large_bodies_do_not_open_the_breaker() {
    init_logs();
    let b = Backend::start();
    let d = one_node(&b);
    for i in 0..8 {
        let r = d
            .submit(Task::get("svc", format!("/large/{}", 64 * 1024 + i)))
            .await;
        match &r.outcome {
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::NotRetryable, "task {i}");
                assert_eq!(f.last, Some(AttemptOutcome::Error(ErrorKind::Body)));
            }
            other => panic!("task {i}: a body over max_body must fail: {other:?}"),
        }
        assert_eq!(r.attempts.len(), 1, "task {i}: a body error is not retried");
    }
    // Each large request reached the backend exactly once.
    assert_eq!(b.hits(), 8);

    let stats = d.stats().await;
    let node = &stats.service("svc").unwrap().nodes[0];
    assert_eq!(node.breaker, "closed", "{node:?}");
    assert_eq!((node.trips, node.errors), (0, 0), "{node:?}");
    assert_eq!(node.error_rate, 0.0, "{node:?}");

    // Other tasks keep succeeding on the same node.
    let ok = burst(&d, 20, "small").await;
    assert!(ok.iter().all(|r| r.is_success()), "{:?}", ok[0].outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_body_at_the_limit_is_a_success() {
    init_logs();
    let b = Backend::start();
    let d = one_node(&b);
    let r = d.submit(Task::get("svc", "/large/1024")).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    assert_eq!(r.response().unwrap().body.len(), 1024);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_reset_mid_body_is_a_node_failure() {
    init_logs();
    let b = Backend::start();
    let d = one_node(&b);
    // GETs are idempotent: each is retried twice on the one node, so five
    // tasks make up to fifteen failures; the breaker opens after five.
    let mut last = None;
    for i in 0..5 {
        let r = d
            .submit(Task::get("svc", format!("/broken/{}", 100 + i)))
            .await;
        assert!(!r.is_success(), "task {i}: {:?}", r.outcome);
        if let Some(a) = r.attempts.first() {
            assert_eq!(
                a.outcome,
                AttemptOutcome::Error(ErrorKind::Reset),
                "task {i}"
            );
        }
        last = Some(r);
    }
    let stats = d.stats().await;
    let node = &stats.service("svc").unwrap().nodes[0];
    assert!(node.errors >= 5, "resets mid-body count: {node:?}");
    assert!(
        node.trips >= 1,
        "the breaker opened: {node:?} (last {last:?})"
    );
    d.shutdown(Duration::from_secs(1)).await;
}
