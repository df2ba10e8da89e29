//! Leases ([`Dispatcher::lease`]): endpoints lent to the caller's own
//! client under the service's balancing, breakers and limits, against real
//! loopback backends.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use actix_dispatch::{
    BreakerStatus, Dispatcher, ErrorKind, Lease, LeaseOptions, LeaseOutcome, Rejection,
    ServiceStats, Task,
};
use support::cfg::config;
use support::{backends, init_logs, wait};

/// Polls the service's stats until `done` holds; the last stats either way.
async fn stats_until(d: &Dispatcher, done: impl Fn(&ServiceStats) -> bool) -> ServiceStats {
    let svc = |s: &actix_dispatch::Stats| s.service("svc").cloned().expect("svc");
    svc(&wait::stats_until(d, |s| done(&svc(s))).await)
}

/// A dispatcher over one backend (kept alive by the first value) whose
/// node takes `max` at once, with `extra` service fields.
fn one_node(max: u32, extra: &str) -> (support::Backend, Dispatcher) {
    let b = support::Backend::start();
    let d = Dispatcher::start(config("round_robin", &[(&b, 1, max)], extra)).unwrap();
    (b, d)
}

fn in_flight(s: &ServiceStats) -> u32 {
    s.nodes.iter().map(|n| n.in_flight).sum()
}

#[actix_rt::test]
async fn failures_reported_only_through_leases_open_the_breaker_for_http_tasks() {
    init_logs();
    let (b, d) = one_node(
        10,
        r#""breaker":{"consecutive_failures":3,"open_for":"30s","on_all_open":"fail_fast"}"#,
    );
    assert!(d.submit(Task::get("svc", "/before")).await.is_success());
    for _ in 0..3 {
        let lease = d.lease("svc", LeaseOptions::new()).await.unwrap();
        lease.complete(LeaseOutcome::Failure(ErrorKind::Connect));
    }
    let s = stats_until(&d, |s| s.nodes[0].breaker == BreakerStatus::Open).await;
    assert!(
        s.nodes[0].breaker == BreakerStatus::Open,
        "{:?}",
        s.nodes[0]
    );
    assert_eq!(s.nodes[0].errors, 3);
    // HTTP tasks meet the same breaker, and so do leases.
    let r = d.submit(Task::get("svc", "/after")).await;
    assert!(
        matches!(
            r.outcome,
            actix_dispatch::Outcome::Rejected(Rejection::CircuitOpen { .. })
        ),
        "{:?}",
        r.outcome
    );
    let refused = d.lease("svc", LeaseOptions::new()).await.unwrap_err();
    assert!(
        matches!(refused, Rejection::CircuitOpen { .. }),
        "{refused:?}"
    );
    assert_eq!(b.hits(), 1, "only the first task reached the backend");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_thousand_leases_dropped_without_complete_leave_nothing_in_flight() {
    init_logs();
    let bs = backends(2);
    let d = Dispatcher::start(config("p2c", &[(&bs[0], 1, 64), (&bs[1], 1, 64)], "")).unwrap();
    for _ in 0..10 {
        let batch: Vec<Lease> =
            futures::future::join_all((0..100).map(|_| d.lease("svc", LeaseOptions::new())))
                .await
                .into_iter()
                .map(|l| l.expect("lent"))
                .collect();
        drop(batch);
    }
    let s = stats_until(&d, |s| in_flight(s) == 0 && s.leases.out == 0).await;
    assert_eq!(in_flight(&s), 0, "{:?}", s.nodes);
    assert_eq!(s.leases.granted, 1000);
    assert_eq!(s.leases.cancelled, 1000);
    assert_eq!(s.leases.out, 0);
    // Nothing was counted against (or for) the nodes.
    assert!(s.nodes.iter().all(|n| n.total == 0 && n.errors == 0));
    assert!(s.is_balanced());
    assert_eq!(bs[0].hits() + bs[1].hits(), 0);
    // The slots are free: a task still runs.
    assert!(d.submit(Task::get("svc", "/x")).await.is_success());
    let report = d.shutdown(Duration::from_secs(1)).await;
    assert!(report.drained && report.leases_out.is_empty());
}

#[actix_rt::test]
async fn outcomes_of_leases_out_during_remove_endpoint_stay_with_their_node() {
    init_logs();
    let bs = backends(2);
    let (a, b) = (bs[0].url(), bs[1].url());
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 100), (&bs[1], 1, 100)],
        r#""breaker":{"enabled":false}"#,
    ))
    .unwrap();
    let mut leases = Vec::new();
    for _ in 0..100 {
        leases.push(d.lease("svc", LeaseOptions::new()).await.unwrap());
    }
    let on_a = leases.iter().filter(|l| l.address() == a).count();
    assert_eq!(on_a, 50);
    d.remove_endpoint("svc", &a).await.unwrap();
    // The removed node drains: its leases hold it in the pool ...
    let s = stats_until(&d, |s| s.node(&a).is_some_and(|n| n.draining)).await;
    assert_eq!(s.node(&a).map(|n| n.in_flight), Some(50));
    // ... and a new lease goes to the other node.
    let late = d.lease("svc", LeaseOptions::new()).await.unwrap();
    assert_eq!(late.address(), b);
    drop(late);
    // A failure from each lease of the removed node, a success from the others.
    for l in &mut leases {
        if l.address() == a {
            l.report(LeaseOutcome::Failure(ErrorKind::Reset));
        } else {
            l.report(LeaseOutcome::Success);
        }
    }
    let s = stats_until(&d, |s| {
        s.node(&a).is_some_and(|n| n.total == 50) && s.node(&b).is_some_and(|n| n.total == 50)
    })
    .await;
    let (na, nb) = (s.node(&a).unwrap(), s.node(&b).unwrap());
    assert_eq!((na.total, na.errors), (50, 50), "{na:?}");
    assert_eq!(
        (nb.total, nb.errors),
        (50, 0),
        "no outcome went to {b}: {nb:?}"
    );
    // Returned, the removed node's leases let it leave.
    drop(leases);
    let s = stats_until(&d, |s| s.node(&a).is_none() && in_flight(s) == 0).await;
    assert!(s.node(&a).is_none(), "{:?}", s.nodes);
    assert_eq!(in_flight(&s), 0);
    assert_eq!(s.node(&b).unwrap().total, 50);
    assert_eq!(
        (s.leases.succeeded, s.leases.failed, s.leases.cancelled),
        (50, 50, 1)
    );
    d.shutdown(Duration::from_secs(1)).await;
}

/// The node letters of `n` leases taken one after the other (each kept).
async fn lease_sequence(mode: &str, weights: [u32; 3], n: usize) -> String {
    let bs = backends(3);
    let nodes: Vec<_> = bs.iter().zip(weights).map(|(b, w)| (b, w, 100)).collect();
    let d = Dispatcher::start(config(mode, &nodes, "")).unwrap();
    let names: HashMap<String, char> = bs
        .iter()
        .zip(['a', 'b', 'c'])
        .map(|(b, c)| (b.url(), c))
        .collect();
    let mut held = Vec::new();
    let mut seq = String::new();
    for _ in 0..n {
        let l = d.lease("svc", LeaseOptions::new()).await.unwrap();
        seq.push(names[l.address()]);
        held.push(l);
    }
    drop(held);
    d.shutdown(Duration::from_secs(1)).await;
    seq
}

#[actix_rt::test]
async fn poll_and_weight_leases_follow_the_seeds_sequences() {
    init_logs();
    assert_eq!(lease_sequence("Poll", [1, 1, 1], 7).await, "abcabca");
    assert_eq!(
        lease_sequence("Weight", [5, 1, 1], 14).await,
        "aabacaaaabacaa"
    );
}

#[actix_rt::test]
async fn leases_are_refused_as_tasks_are() {
    init_logs();
    let (b, d) = one_node(
        1,
        r#""queue":{"capacity":1,"on_full":"reject","delay":{"enabled":false}}"#,
    );
    let first = d.lease("svc", LeaseOptions::new()).await.unwrap();
    // The only slot is lent: the next lease waits in the queue ...
    let waiting = {
        let d = d.clone();
        actix_rt::spawn(async move { d.lease("svc", LeaseOptions::new()).await })
    };
    stats_until(&d, |s| s.queue.queued == 1).await;
    // ... the queue is full for a lease and for a task alike ...
    assert_eq!(
        d.lease("svc", LeaseOptions::new()).await.unwrap_err(),
        Rejection::QueueFull
    );
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(matches!(
        r.outcome,
        actix_dispatch::Outcome::Rejected(Rejection::QueueFull)
    ));
    // ... and the waiting lease gets the slot when the first is returned.
    first.complete(LeaseOutcome::Success);
    let second = waiting.await.unwrap().expect("lent once the slot was free");
    // A deadline bounds the wait.
    let late = d
        .lease(
            "svc",
            LeaseOptions::new().deadline_in(Duration::from_millis(30)),
        )
        .await
        .unwrap_err();
    assert_eq!(late, Rejection::DeadlinePassed);
    assert_eq!(
        d.lease("nope", LeaseOptions::new()).await.unwrap_err(),
        Rejection::UnknownService("nope".into())
    );
    // The shutdown report lists the lease still held.
    let report = d.shutdown(Duration::from_millis(50)).await;
    assert!(!report.drained);
    assert_eq!(report.leases_out.len(), 1);
    assert_eq!(report.leases_out[0].address, b.url());
    drop(second);
}

/// A server that answers with the `x-from` header it got.
fn header_echo() -> (u16, actix_web::dev::ServerHandle) {
    let srv = actix_web::HttpServer::new(|| {
        actix_web::App::new().default_service(actix_web::web::to(
            |req: actix_web::HttpRequest| async move {
                let from = req
                    .headers()
                    .get("x-from")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none");
                from.to_owned()
            },
        ))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let port = srv.addrs()[0].port();
    let srv = srv.run();
    let handle = srv.handle();
    actix_rt::spawn(srv);
    (port, handle)
}

#[actix_rt::test]
async fn a_lease_client_reaches_its_endpoint_with_the_endpoints_headers() {
    init_logs();
    let (port, server) = header_echo();
    let address = format!("http://127.0.0.1:{port}/");
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","headers":{{"x-from":"config"}},
            "endpoints":[{{"address":"{address}"}}]}}]}}"#
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let lease = d.lease("svc", LeaseOptions::new()).await.unwrap();
    assert!(lease.url("/../admin").is_err());
    let url = lease.url("/who").unwrap();
    assert_eq!(url, format!("{address}who"));
    let mut res = lease.client().get(url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.body().await.unwrap(), "config");
    lease.complete(LeaseOutcome::Status(res.status().as_u16()));
    let s = stats_until(&d, |s| s.nodes[0].total == 1).await;
    assert_eq!((s.nodes[0].total, s.nodes[0].errors), (1, 0));
    assert_eq!(s.leases.succeeded, 1);
    d.shutdown(Duration::from_secs(1)).await;
    server.stop(true).await;
}

/// The value of the sample of `family` whose label set includes `labels`.
#[cfg(feature = "metrics")]
fn sample(text: &str, family: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(found.len(), 1, "{family} {labels:?}\n{text}");
    found[0]
}

#[cfg(feature = "metrics")]
#[actix_rt::test]
async fn leases_are_counted_in_prometheus() {
    init_logs();
    let (_b, d) = one_node(10, "");
    let mut kept = d.lease("svc", LeaseOptions::new()).await.unwrap();
    kept.report(LeaseOutcome::Success);
    kept.report(LeaseOutcome::Ignore);
    d.lease("svc", LeaseOptions::new())
        .await
        .unwrap()
        .complete(LeaseOutcome::Status(503));
    drop(d.lease("svc", LeaseOptions::new()).await.unwrap());
    stats_until(&d, |s| in_flight(s) == 1).await;
    let text = actix_dispatch::metrics::encode(&d);
    let svc = r#"service="svc""#;
    let event = |e: &str| {
        sample(
            &text,
            "dispatch_leases_total",
            &[svc, &format!(r#"event="{e}""#)],
        )
    };
    assert_eq!(event("granted"), 3.0);
    assert_eq!(event("success"), 1.0);
    assert_eq!(event("ignored"), 1.0);
    assert_eq!(event("failure"), 1.0);
    assert_eq!(event("cancelled"), 1.0);
    assert_eq!(sample(&text, "dispatch_leases_out", &[svc]), 1.0);
    // The outcomes went through the node's own series, as attempts.
    let class = |c: &str| {
        sample(
            &text,
            "dispatch_upstream_requests_total",
            &[svc, &format!(r#"class="{c}""#)],
        )
    };
    assert_eq!((class("2xx"), class("5xx")), (1.0, 1.0));
    drop(kept);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn leases_are_rate_limited_and_shed_as_tasks_are() {
    init_logs();
    let bs = backends(1);
    // One token a minute: the first lease takes it, the next is refused.
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 10)],
        r#""rate_limit":{"service":{"rate":0.0167,"burst":1},"on_limit":"reject"}"#,
    ))
    .unwrap();
    d.lease("svc", LeaseOptions::new())
        .await
        .unwrap()
        .complete(LeaseOutcome::Success);
    let refused = d.lease("svc", LeaseOptions::new()).await.unwrap_err();
    assert!(
        matches!(refused, Rejection::RateLimited { .. }),
        "{refused:?}"
    );
    d.shutdown(Duration::from_secs(1)).await;

    // A lease that waits past the interval under overload is shed by the
    // delay control.
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&bs[0], 1, 1)],
        r#""queue":{"delay":{"target":"5ms","interval":"50ms"}}"#,
    ))
    .unwrap();
    let held = d.lease("svc", LeaseOptions::new()).await.unwrap();
    let waited =
        actix_rt::time::timeout(Duration::from_secs(10), d.lease("svc", LeaseOptions::new()))
            .await
            .expect("answered by the delay control");
    assert!(
        matches!(waited, Err(Rejection::Overloaded { .. })),
        "{waited:?}"
    );
    drop(held);
    let s = stats_until(&d, |s| in_flight(s) == 0).await;
    assert_eq!(
        (s.leases.granted, s.leases.cancelled, s.queue.shed),
        (1, 1, 1)
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_critical_lease_is_served_before_default_ones_waiting() {
    use std::cell::RefCell;
    use std::rc::Rc;
    init_logs();
    let (_b, d) = one_node(1, r#""queue":{"delay":{"enabled":false}}"#);
    let held = d.lease("svc", LeaseOptions::new()).await.unwrap();
    let order = Rc::new(RefCell::new(Vec::new()));
    let mut waiting = Vec::new();
    for (i, class) in [
        actix_dispatch::Priority::Default,
        actix_dispatch::Priority::Default,
        actix_dispatch::Priority::Critical,
    ]
    .into_iter()
    .enumerate()
    {
        let (d2, order) = (d.clone(), order.clone());
        waiting.push(actix_rt::spawn(async move {
            let lease = d2
                .lease("svc", LeaseOptions::new().priority(class))
                .await
                .unwrap();
            order.borrow_mut().push(i);
            lease.complete(LeaseOutcome::Success);
        }));
        stats_until(&d, |s| s.queue.queued == i as u64 + 1).await;
    }
    drop(held);
    for w in waiting {
        w.await.unwrap();
    }
    assert_eq!(*order.borrow(), vec![2, 0, 1]);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_lease_given_up_while_waiting_returns_its_slot() {
    init_logs();
    let (_b, d) = one_node(1, r#""queue":{"delay":{"enabled":false}}"#);
    let held = d.lease("svc", LeaseOptions::new()).await.unwrap();
    // The caller stops waiting (its future is dropped) while the slot is taken.
    let gave_up = actix_rt::time::timeout(
        Duration::from_millis(20),
        d.lease("svc", LeaseOptions::new()),
    )
    .await;
    assert!(gave_up.is_err());
    drop(held);
    // Its turn comes once the slot is free: it is answered cancelled in
    // the queue, never lent (no slot or token spent on it).
    let s = stats_until(&d, |s| s.queue.cancelled == 1 && in_flight(s) == 0).await;
    assert_eq!(
        (s.leases.granted, s.leases.cancelled, s.leases.out),
        (1, 1, 0)
    );
    assert_eq!(in_flight(&s), 0);
    let next = d.lease("svc", LeaseOptions::new()).await.unwrap();
    next.complete(LeaseOutcome::Success);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn pushback_reported_through_a_lease_lowers_a_learned_limit() {
    init_logs();
    let bs = backends(1);
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin",
            "endpoints":[{{"address":"{}","max_concurrent":"auto"}}]}}]}}"#,
        bs[0].url()
    );
    let d = Dispatcher::start(actix_dispatch::Config::from_json(&json).unwrap()).unwrap();
    let before = stats_until(&d, |_| true).await.nodes[0].concurrency_limit;
    d.lease("svc", LeaseOptions::new())
        .await
        .unwrap()
        .complete(LeaseOutcome::Status(503));
    let s = stats_until(&d, |s| s.nodes[0].concurrency_limit < before).await;
    assert!(
        s.nodes[0].concurrency_limit < before,
        "{before} -> {}",
        s.nodes[0].concurrency_limit
    );
    assert_eq!(s.nodes[0].errors, 1);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_lease_with_less_time_left_than_calls_take_is_refused_deadline_passed() {
    init_logs();
    let bs = backends(1);
    bs[0].set_latency(Duration::from_millis(100));
    let d = Dispatcher::start(config("round_robin", &[(&bs[0], 1, 16)], "")).unwrap();
    // Tasks with deadlines teach the queue what a call takes here (100 ms+;
    // it judges from 16 of them).
    let tasks = (0..16).map(|i| {
        d.submit(Task::get("svc", format!("/t/{i}")).deadline_in(Duration::from_secs(10)))
    });
    assert!(futures::future::join_all(tasks)
        .await
        .iter()
        .all(|r| r.is_success()));
    let short = LeaseOptions::new().deadline_in(Duration::from_millis(20));
    assert_eq!(
        d.lease("svc", short).await.unwrap_err(),
        Rejection::DeadlinePassed
    );
    let s = stats_until(&d, |_| true).await;
    assert_eq!((s.leases.granted, in_flight(&s)), (0, 0));
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn leases_with_the_same_affinity_key_get_the_same_endpoint() {
    init_logs();
    let bs = backends(3);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 100)).collect();
    let d = Dispatcher::start(config("consistent_hash", &nodes, "")).unwrap();
    let mut owners = HashMap::new();
    for round in 0..2 {
        for k in 0..30 {
            let key = format!("user-{k}");
            let l = d
                .lease("svc", LeaseOptions::new().affinity(key.clone()))
                .await
                .unwrap();
            let owner = owners.entry(key).or_insert_with(|| l.address().to_owned());
            assert_eq!(*owner, l.address(), "round {round}");
        }
    }
    let used: std::collections::HashSet<_> = owners.values().collect();
    assert!(used.len() > 1, "keys spread over the nodes: {used:?}");
    d.shutdown(Duration::from_secs(1)).await;
}

/// The defaults shed nothing by a time nobody stated: a lease (no
/// deadline) that waits for the slot another lease holds gets it when
/// that one is returned, however long that takes.
#[actix_rt::test]
async fn a_lease_without_a_deadline_waits_for_the_slot() {
    init_logs();
    // Paused time: nothing here goes over the wire, so the wait below is
    // a timer, not real time.
    tokio::time::pause();
    let (_b, d) = one_node(1, "");
    let held = d.lease("svc", LeaseOptions::new()).await.unwrap();
    let waiting = actix_rt::spawn({
        let d = d.clone();
        async move {
            d.lease("svc", LeaseOptions::new())
                .await
                .map(|l| l.address().to_owned())
        }
    });
    // Well past the old delay control's 100 ms interval: a minute.
    actix_rt::time::sleep(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished(), "it waits in the queue");
    drop(held);
    let got = actix_rt::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("answered once the slot is free")
        .unwrap();
    assert!(got.is_ok(), "{got:?}");
    let s = stats_until(&d, |s| in_flight(s) == 0).await;
    assert_eq!((s.leases.granted, s.queue.shed), (2, 0));
    d.shutdown(Duration::from_secs(1)).await;
}
