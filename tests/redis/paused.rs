//! redis-server paused (`kill -STOP`) mid-run: the `on_down` policies
//! (local fallback, deny, allow), no task lost or stuck, and the recovery
//! after `kill -CONT`.

use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Task, TaskResult};

use super::helpers::{
    all_answered, config, redis_server, start_instance, submit_many, wait_down, wait_up,
};
use crate::support::Backend;

/// Shared node buckets with redis-server paused: the local fallback
/// (node rate / live instances) serves, no task is lost or stuck, and the
/// shared buckets are back after `kill -CONT`.
#[test]
fn a_paused_redis_loses_no_task_with_shared_node_limits() {
    let Some(srv) = redis_server() else {
        return;
    };
    let (a, b) = (Backend::start(), Backend::start());
    let cfg = config(
        &srv,
        r#""prefix":"nstop","timeout":"50ms","on_down":"local","mode":"exact""#,
        &[&a, &b],
        r#""rate_limit":{"per_node":{"rate":25,"burst":5},"shared":true}"#,
    );
    let inst = start_instance(cfg);
    let rt = actix::System::new();
    let all = submit_many(&inst.d, 150);
    thread::sleep(Duration::from_millis(500));
    srv.pause();
    wait_down(&rt, &inst.d);
    let h1 = a.hits() + b.hits();
    thread::sleep(Duration::from_millis(700));
    let h2 = a.hits() + b.hits();
    // Two nodes at 25/s each, burst 5 each when it went down: at most
    // 45 in 700 ms (+ 5 for the spread of the clocks).
    assert!(h2 - h1 >= 10, "local limits serve: {}", h2 - h1);
    assert!(h2 - h1 <= 50, "local limits hold: {}", h2 - h1);
    srv.resume();
    let rs: Vec<TaskResult> = all_answered(&rt, Duration::from_secs(20), all);
    assert_eq!(rs.len(), 150);
    assert!(rs.iter().all(|r| r.is_success()), "every task served");
    assert_eq!(a.hits() + b.hits(), 150, "each task once");
    wait_up(&rt, &inst.d);
}

/// `kill -STOP` of redis-server mid-run: no task lost or stuck, the local
/// fallback applies within the timeout, and after `kill -CONT` it is back.
#[test]
fn a_paused_redis_falls_back_to_local_limits_and_recovers() {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"stop","timeout":"50ms","on_down":"local""#,
        &[&backend],
        r#""rate_limit":{"service":{"rate":50,"burst":10},"shared":true}"#,
    );
    let a = start_instance(cfg);
    let rt = actix::System::new();
    let t0 = Instant::now();
    let all = submit_many(&a.d, 150);
    thread::sleep(Duration::from_millis(500));
    srv.pause();
    let paused = Instant::now();
    wait_down(&rt, &a.d);
    let h1 = backend.hits();
    thread::sleep(Duration::from_millis(700));
    let h2 = backend.hits();
    // Local fallback at 50/s (one live instance), its bucket full (10)
    // when it went down: at most 45 in 700 ms (+ 5 for the spread between
    // the clocks of the check and of the backend).
    assert!(
        h2 - h1 >= 15,
        "local limits serve while Redis is paused: {}",
        h2 - h1
    );
    assert!(
        h2 - h1 <= 50,
        "local limits hold while Redis is paused: {}",
        h2 - h1
    );
    srv.resume();
    eprintln!("paused for {:?}", paused.elapsed());
    let rs: Vec<TaskResult> = all_answered(&rt, Duration::from_secs(15), all);
    assert_eq!(rs.len(), 150);
    assert!(rs.iter().all(|r| r.is_success()), "every task served");
    wait_up(&rt, &a.d);
    eprintln!("150 tasks in {:?}", t0.elapsed());
}

/// `on_down: deny`: while redis-server is paused the service rejects
/// (`RateLimited`, within the timeout); after `kill -CONT` it serves again.
#[test]
fn on_down_deny_rejects_while_redis_is_paused() {
    on_down_deny(r#""rate_limit":{"service":{"rate":100,"burst":10},"shared":true}"#);
}

/// The same with only per-node buckets shared.
#[test]
fn on_down_deny_rejects_with_shared_node_limits() {
    on_down_deny(r#""rate_limit":{"per_node":{"rate":100,"burst":10},"shared":true}"#);
}

fn on_down_deny(rate_limit: &str) {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"deny","timeout":"50ms","on_down":"deny","mode":"exact""#,
        &[&backend],
        rate_limit,
    );
    let a = start_instance(cfg);
    let rt = actix::System::new();
    // Served while Redis answers (on a starved machine a 50 ms call can
    // time out and deny: then the next one serves).
    let t = Instant::now();
    let mut ok = rt.block_on(a.d.submit(Task::get("svc", "/before")));
    while !ok.is_success() && t.elapsed() < Duration::from_secs(3) {
        thread::sleep(Duration::from_millis(50));
        ok = rt.block_on(a.d.submit(Task::get("svc", "/before")));
    }
    assert!(ok.is_success(), "{:?}", ok.outcome);
    srv.pause();
    // The first task after the pause waits at most the timeout, then the
    // policy answers; later ones are refused at once.
    let t = Instant::now();
    let r = rt.block_on(a.d.submit(Task::get("svc", "/during")));
    assert!(
        matches!(
            r.rejection(),
            Some(actix_dispatch::Rejection::RateLimited { .. })
        ),
        "{:?}",
        r.outcome
    );
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    let hits = backend.hits();
    for _ in 0..10 {
        let r = rt.block_on(a.d.submit(Task::get("svc", "/during")));
        assert!(r.is_rejected(), "{:?}", r.outcome);
    }
    assert_eq!(backend.hits(), hits, "nothing sent while denied");
    srv.resume();
    let t = Instant::now();
    let mut served = false;
    while t.elapsed() < Duration::from_secs(5) && !served {
        thread::sleep(Duration::from_millis(50));
        served = rt
            .block_on(a.d.submit(Task::get("svc", "/after")))
            .is_success();
    }
    assert!(served, "serves again after kill -CONT");
}

/// `on_down: allow`: while redis-server is paused the shared limit is not
/// applied (tasks go at once, past the 5/s limit), and nothing is stuck.
#[test]
fn on_down_allow_admits_while_redis_is_paused() {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"allow","timeout":"50ms","on_down":"allow","mode":"exact""#,
        &[&backend],
        r#""rate_limit":{"service":{"rate":5,"burst":1},"shared":true}"#,
    );
    let a = start_instance(cfg);
    let rt = actix::System::new();
    srv.pause();
    let t = Instant::now();
    let rs: Vec<TaskResult> = all_answered(&rt, Duration::from_secs(5), submit_many(&a.d, 20));
    assert!(rs.iter().all(|r| r.is_success()), "every task admitted");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "20 tasks past a 5/s limit in {:?}",
        t.elapsed()
    );
    srv.resume();
}
