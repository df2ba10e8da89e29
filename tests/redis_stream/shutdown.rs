//! Shutdown while consuming: result writes in flight awaited, tasks in
//! flight recorded once or left pending for another instance.

use std::collections::HashSet;
use std::thread;
use std::time::Duration;

use actix_dispatch::redis::stream::StreamConfig;

use super::helpers::{
    add_tasks, con, load_config, results, start_consuming, temp_dir, xlen, KeyedBackend,
};
use crate::redis_server::RedisServer;

/// `XPENDING`'s count of entries delivered and not acknowledged.
fn pending(c: &mut redis::Connection) -> usize {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg("t:{svc}:tasks")
        .arg("dispatch")
        .query(c)
        .expect("xpending");
    match v {
        redis::Value::Array(parts) => parts
            .first()
            .map(|n| redis::from_redis_value::<usize>(n.clone()).expect("count"))
            .unwrap_or(0),
        _ => 0,
    }
}

/// Runs an instance in its own System: it consumes `n` slow tasks and, once
/// the backend has seen `seen` of them, shuts down with `grace`; the System
/// ends when `shutdown` returns (as a process would exit). With
/// `pause_redis`, Redis is stopped (`kill -STOP`) for 500 ms from then.
fn run_then_shut_down(
    url: &str,
    backend: &KeyedBackend,
    n: usize,
    seen: usize,
    grace: Duration,
    pause_redis: Option<&RedisServer>,
) {
    let dir = temp_dir(&format!("shutdown-{n}-{seen}-{}", grace.as_millis()));
    let cfg = load_config(&dir, url, backend.port, 1000);
    add_tasks(&mut con(url), "/slow", n);
    let calls = backend.calls.clone();
    actix::System::new().block_on(async move {
        let sc = StreamConfig::named("leaving");
        let d = start_consuming(cfg, sc).await;
        let start = tokio::time::Instant::now();
        while calls.lock().unwrap().len() < seen && start.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(srv) = pause_redis {
            srv.pause();
            let pid = srv.pid().to_string();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(500));
                let _ = std::process::Command::new("kill")
                    .args(["-CONT", &pid])
                    .status();
            });
        }
        d.shutdown(grace).await;
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// Regression: `shutdown` returned before the record script of the last
/// answered tasks had run, so with the System ending right after, their
/// entries stayed pending and another instance would run them again. Redis
/// is paused while the tasks are at the backend, so that their writes are
/// in flight (the first ones of this server: the script is not loaded yet,
/// a second call is needed) when the queue has answered them all. Every
/// task answered before a clean shutdown is now recorded, once, and nothing
/// is left pending.
#[test]
fn a_clean_shutdown_waits_for_the_result_writes_in_flight() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let n = 60;
    // All 60 at the backend at once (64 slots), then a grace that lets
    // them finish: every one is answered before `shutdown` returns.
    run_then_shut_down(
        &server.url(),
        &backend,
        n,
        n,
        Duration::from_secs(5),
        Some(&server),
    );
    let mut c = con(&server.url());
    let rs = results(&mut c);
    let entries: HashSet<&String> = rs.iter().map(|(e, _)| e).collect();
    assert_eq!(entries.len(), rs.len(), "no entry recorded twice");
    assert_eq!(rs.len(), n, "every answered task recorded");
    assert_eq!(pending(&mut c), 0, "nothing left pending");
    assert_eq!(xlen(&mut c, "t:{svc}:tasks"), 0);
}

/// Tasks in flight when a shutdown without grace begins are either
/// recorded exactly once or left pending for another instance; a second
/// instance then finishes the rest, and every task has one result.
#[test]
fn tasks_in_flight_at_shutdown_are_recorded_once_or_left_pending() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let n = 200;
    run_then_shut_down(&server.url(), &backend, n, 100, Duration::ZERO, None);
    let mut c = con(&server.url());
    let rs = results(&mut c);
    let recorded: HashSet<&String> = rs.iter().map(|(e, _)| e).collect();
    assert_eq!(recorded.len(), rs.len(), "no entry recorded twice");
    let left = xlen(&mut c, "t:{svc}:tasks");
    assert_eq!(
        rs.len() + left,
        n,
        "each task recorded or still in the stream"
    );
    eprintln!(
        "shutdown without grace: {} recorded, {} pending, {} left in the stream",
        rs.len(),
        pending(&mut c),
        left
    );
    // Another instance claims what was left (claim_after 100 ms).
    let dir = temp_dir("shutdown-after");
    let cfg = load_config(&dir, &server.url(), backend.port, 1000);
    let url = server.url();
    actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("taking-over");
        sc.claim_after = Some(Duration::from_millis(100));
        sc.claim_every = Some(Duration::from_millis(100));
        let d = start_consuming(cfg, sc).await;
        let mut c = con(&url);
        let start = tokio::time::Instant::now();
        while results(&mut c).len() < n && start.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        d.shutdown(Duration::from_secs(5)).await;
    });
    let rs = results(&mut c);
    let entries: HashSet<&String> = rs.iter().map(|(e, _)| e).collect();
    assert_eq!(entries.len(), rs.len(), "no entry recorded twice");
    assert_eq!(rs.len(), n, "every task recorded once in the end");
    assert_eq!(pending(&mut c), 0);
    let _ = std::fs::remove_dir_all(dir);
}
