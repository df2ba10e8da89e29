//! A server closing an idle keep-alive connection must not fail a task
//! (issue 9). The engine reuses pooled connections; a server may close one
//! just as a request goes out on it. Such a request was never read: the
//! engine classifies it `NotSent`, retries it whatever its method, and does
//! not hold it against the node. And with `keep_alive` below the server's,
//! the engine closes idle connections first.
//!
//! Backends: actix-web servers with a keep-alive of a few milliseconds, and
//! nginx (when installed; `.ci/run` installs it and sets
//! `ACTIX_DISPATCH_REQUIRE_NGINX=1`, which turns a missing nginx into a
//! failure rather than a skip).

mod support;

#[path = "keepalive/nginx.rs"]
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
mod nginx;

use std::time::Duration;

use actix_dispatch::{AttemptOutcome, Dispatcher, ErrorKind, Method, Task, TaskResult};
use support::cfg::config;
use support::{init_logs, Backend};

/// A non-idempotent POST with a small body.
fn post(i: usize) -> Task {
    Task::new("svc", Method::POST, "/echo")
        .body(format!("task {i}"))
        .idempotent(false)
}

/// What a run of bursts gave.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    failed: Vec<String>,
    not_sent: usize,
    attempts: usize,
}

impl Tally {
    fn add(&mut self, r: &TaskResult) {
        self.attempts += r.attempts.len();
        self.not_sent += r
            .attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Error(ErrorKind::NotSent))
            .count();
        if r.is_success() {
            self.ok += 1;
        } else if self.failed.len() < 5 {
            self.failed
                .push(format!("{:?} after {:?}", r.outcome, r.attempts));
        } else {
            self.failed.push(String::new());
        }
    }
}

/// The service's counters after `n` tasks that all succeeded.
fn assert_counts(q: &actix_dispatch::QueueStats, n: u64) {
    assert_eq!(
        (
            q.submitted,
            q.succeeded,
            q.failed,
            q.rejected,
            q.queued,
            q.in_flight
        ),
        (n, n, 0, 0, 0, 0),
        "{q:?}"
    );
}

/// Sends `bursts` bursts of `size` POSTs, pausing between bursts for the
/// next of `pauses` (cycled). Bounded in count, and in time by `limit`.
async fn run_bursts(
    d: &Dispatcher,
    bursts: usize,
    size: usize,
    pauses: &[Duration],
    limit: Duration,
) -> Tally {
    let start = actix_dispatch::Instant::now();
    let mut tally = Tally::default();
    for k in 0..bursts {
        let tasks = (0..size).map(|i| d.submit(post(k * size + i)));
        for r in futures::future::join_all(tasks).await {
            tally.add(&r);
        }
        assert!(
            start.elapsed() < limit,
            "{k} of {bursts} bursts in {limit:?}: {tally:?}"
        );
        actix_rt::time::sleep(pauses[k % pauses.len()]).await;
    }
    tally
}

#[actix_rt::test]
async fn posts_survive_servers_closing_idle_connections() {
    init_logs();
    // Servers that close connections idle for 3 ms; an engine that would keep
    // them 10 s, so it keeps reusing connections the servers are closing.
    let ka = Duration::from_millis(3);
    let bs = [
        Backend::with_keep_alive("b0", ka),
        Backend::with_keep_alive("b1", ka),
    ];
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 32), (&bs[1], 1, 32)],
        // The retry budget is sized so that it never binds: not-sent retries
        // do pay from it (issue 9), and a burst of 100 POSTs on connections
        // the servers all just closed can take more than the default budget
        // allows early in a run (2 of 12 runs failed `budget_exhausted`).
        // What this test checks is the classification, not the budget.
        // Nor the delay control: on a busy machine a burst's tail can keep
        // the queue from draining for an interval, and then it is shed.
        r#""keep_alive":"10s","timeout":"10s","queue":{"delay":{"enabled":false}},
           "retry":{"max_retries":8,"backoff_base":"1ms","backoff_max":"10ms",
                    "budget_percent":1.0,"min_retries_per_sec":1000}"#,
    ))
    .unwrap();
    let pauses: Vec<Duration> = [1, 2, 3, 4, 5, 3].map(Duration::from_millis).to_vec();
    let t = run_bursts(&d, 150, 100, &pauses, Duration::from_secs(240)).await;
    eprintln!(
        "keep-alive 3 ms: {} of 15000 POSTs ok, {} attempts, {} not sent",
        t.ok, t.attempts, t.not_sent
    );
    assert_eq!(
        t.ok,
        15_000,
        "failures: {:?}",
        &t.failed[..t.failed.len().min(5)]
    );
    // The race this test guards against happened: requests went out on
    // connections the servers were closing.
    assert!(t.not_sent > 0, "no request met a closing connection: {t:?}");
    // A request classified not sent never reached a handler: each POST was
    // handled exactly once.
    assert_eq!(bs[0].hits() + bs[1].hits(), 15_000);
    let stats = d.stats().await;
    let svc = stats.service("svc").unwrap();
    assert_counts(&svc.queue, 15_000);
    for n in &svc.nodes {
        assert_eq!(
            (n.trips, n.errors),
            (0, 0),
            "not sent is not the node's fault: {n:?}"
        );
    }
    // Not-sent retries are retries: counted in the service's stats.
    assert_eq!(svc.queue.retried as usize, t.attempts - 15_000);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn idle_connections_are_closed_before_the_server_does() {
    init_logs();
    // The server keeps idle connections 1.5 s (actix-web sets the deadline
    // from a clock it refreshes every 500 ms, so 1 to 1.5 s), the engine
    // 100 ms; the pauses between bursts (300 ms) fall between the two, so
    // every burst starts on connections the engine opened afresh, and no
    // request meets a connection the server is closing. (Not the delay
    // control either: on a machine whose cores are busy a burst can stand
    // in the queue for an interval, and be shed.)
    let b = Backend::with_keep_alive("b0", Duration::from_millis(1500));
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&b, 1, 16)],
        r#""keep_alive":"100ms","max_connection_age":"10s","queue":{"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let pauses = [Duration::from_millis(300)];
    let t = run_bursts(&d, 6, 40, &pauses, Duration::from_secs(60)).await;
    assert_eq!(t.ok, 240, "{t:?}");
    assert_eq!(t.not_sent, 0, "{t:?}");
    assert_eq!(b.hits(), 240);
    assert_counts(&d.stats().await.service("svc").unwrap().queue, 240);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn posts_survive_nginx_closing_idle_connections() {
    init_logs();
    let Some(bin) = nginx::find_or_require() else {
        return;
    };
    // Three nginx servers answering themselves, as in the issue's run:
    // at most 3 requests per connection, idle connections closed after 5 ms.
    // The delay control is off, as in the test above.
    let servers = nginx::Nginx::start(&bin, 3, "keepalive_requests 3; keepalive_timeout 5ms;")
        .unwrap_or_else(|e| panic!("nginx: {e}"));
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","keep_alive":"10s","timeout":"10s",
            "queue":{{"delay":{{"enabled":false}}}},
            "retry":{{"max_retries":8,"backoff_base":"1ms","backoff_max":"10ms",
                      "budget_percent":1.0,"min_retries_per_sec":1000}},
            "endpoints":[{}]}}]}}"#,
        servers
            .urls()
            .iter()
            .map(|u| format!(r#"{{"address":"{u}","max_concurrent":16}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let pauses: Vec<Duration> = [5, 4, 6, 5, 3].map(Duration::from_millis).to_vec();
    let t = run_bursts(&d, 60, 50, &pauses, Duration::from_secs(240)).await;
    eprintln!(
        "nginx keep-alive 5 ms: {} of 3000 POSTs ok, {} attempts, {} not sent",
        t.ok, t.attempts, t.not_sent
    );
    assert_eq!(
        t.ok,
        3_000,
        "failures: {:?}",
        &t.failed[..t.failed.len().min(5)]
    );
    // nginx closes every connection after 3 requests or 5 ms idle: some
    // requests met a closing one.
    assert!(t.not_sent > 0, "no request met a closing connection: {t:?}");
    let stats = d.stats().await;
    let svc = stats.service("svc").unwrap();
    assert_counts(&svc.queue, 3_000);
    for n in &svc.nodes {
        assert_eq!(n.trips, 0, "{n:?}");
    }
    d.shutdown(Duration::from_secs(1)).await;
}
