//! Redis Sentinel, against real servers the tests start (feature `redis`):
//! one master, one replica (`--replicaof`) and three sentinels
//! (`redis-server <conf> --sentinel`), passwords on the data nodes and on
//! the sentinels, ephemeral loopback ports (`support/redis.rs`,
//! `RedisSentinel`). Shared limits and breakers hold their bound through
//! Sentinel and follow a failover (`kill -9` of the master, the replica
//! promoted): `on_down: local` meanwhile, nothing let through unlimited,
//! no task lost, the calls answering again within a few seconds of the
//! promotion. The durable stream runs through Sentinel and follows a
//! failover too; so do a Sentinel over TLS only and a master paused
//! (`kill -STOP`) rather than killed; `actix-dispatch enqueue` writes
//! through Sentinel.
//!
//! The logs are captured (`support::logs`): no password in them; each test
//! has its own master name and key prefix.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Config, Dispatcher, Task};

use redis_server::{with_instance, RedisSentinel};
use support::{logs, Backend};

const DATA_PASSWORD: &str = "data-s3cret-pw";
const SENTINEL_PASSWORD: &str = "sentinel-s3cret-pw";

/// The longest the engine may take, after the sentinels promoted the
/// replica, to answer through it again (a generous bound: the engine asks
/// the sentinels again within about a second).
const FOLLOW: Duration = Duration::from_secs(3);

fn config(s: &RedisSentinel, redis_extra: &str, backend: &Backend, service_extra: &str) -> Config {
    let json = format!(
        r#"{{"redis":{{"url":"{}","sentinel":{{"master":"{}","nodes":{}}}{redis_extra}}},
            "services":[{{"name":"svc","mode":"round_robin",
              "endpoints":[{{"address":"{}","max_concurrent":20}}]{service_extra}}}]}}"#,
        s.url(),
        s.name,
        s.nodes_json(),
        backend.url()
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn no_password_in(lines: &[String]) {
    for l in lines {
        assert!(
            !l.contains(DATA_PASSWORD) && !l.contains(SENTINEL_PASSWORD),
            "a password in a log line: {l}"
        );
    }
}

/// Two instances share a limit (service 50/s, burst 10, lease mode) and
/// breakers through Sentinel, 150 tasks each. 0.7 s in, the master is
/// `kill -9`ed; the sentinels promote the replica. Meanwhile `on_down:
/// local` holds (each instance at 25/s); within `FOLLOW` of the promotion
/// the calls answer again through the new master (no failure after, not
/// shown down, the calls going on), the membership key lives on it, and
/// each instance's connection moved once. Every task succeeds, once; the
/// backend sees at most burst + rate·(T + lease) plus the local fallback's
/// share for the time from the kill to `FOLLOW` after the promotion, and
/// at least half the rate.
#[test]
fn limits_hold_through_sentinel_and_follow_a_failover() {
    logs::capture();
    let Some(mut s) = RedisSentinel::start(
        "limits-master",
        Some(DATA_PASSWORD),
        Some(SENTINEL_PASSWORD),
    ) else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &s,
        r#","prefix":"sl","timeout":"200ms","on_down":"local""#,
        &backend,
        r#","rate_limit":{"service":{"rate":50,"burst":10},"shared":true},"breaker":{"shared":true},"queue":{"capacity":1000}"#,
    );
    let debug = format!("{cfg:?}");
    assert!(
        !debug.contains(DATA_PASSWORD) && !debug.contains(SENTINEL_PASSWORD),
        "{debug}"
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    actix::System::new()
        .block_on(actix_dispatch::redis::check(&redis_cfg))
        .expect("check through the sentinels");
    const PER: usize = 150;
    let (tx, rx) = mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let t0 = Instant::now();
    let instances: Vec<_> = (0..2)
        .map(|k| {
            let rx = rx.clone();
            with_instance(cfg.clone(), move |d| {
                Box::pin(async move {
                    let subs: Vec<_> = (0..PER)
                        .map(|i| d.submit(Task::get("svc", format!("/i{k}/t{i}"))))
                        .collect();
                    let all = futures::future::join_all(subs);
                    let marks = redis_server::shared_at_marks(&d, &rx);
                    let all = tokio::time::timeout(Duration::from_secs(30), all);
                    let (all, marks) = futures::future::join(all, marks).await;
                    let ok = all
                        .expect("no task stuck")
                        .iter()
                        .filter(|r| r.is_success())
                        .count();
                    (ok, marks)
                })
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    let old_port = s.master.as_ref().expect("master").port();
    s.kill_master();
    let killed_at = t0.elapsed();
    assert!(
        s.wait_failover(Duration::from_secs(15)),
        "the sentinels promoted the replica"
    );
    let promoted_at = t0.elapsed();
    thread::sleep(FOLLOW);
    for _ in 0..2 {
        let _ = tx.send(());
    }
    // Heartbeats (1 s) and token calls go on after the mark.
    thread::sleep(Duration::from_millis(1500));
    drop(tx);
    let results: Vec<_> = instances
        .into_iter()
        .map(|i| i.join().expect("instance"))
        .collect();
    let elapsed = t0.elapsed();
    let hits = backend.hits();
    eprintln!(
        "sentinel: master :{old_port} killed at {killed_at:?}, replica :{} promoted at \
         {promoted_at:?}; {hits} hits in {elapsed:?}; {results:?}",
        s.replica.port()
    );
    for (ok, marks) in &results {
        assert_eq!(*ok, PER, "every task succeeded: {marks:?}");
        let (mid, end) = (&marks[0], &marks[marks.len() - 1]);
        assert_eq!(
            mid.failures, end.failures,
            "no failure from {FOLLOW:?} after the promotion on: {marks:?}"
        );
        assert!(!end.down, "{marks:?}");
        assert!(
            end.round_trips > mid.round_trips,
            "calls went on: {marks:?}"
        );
        assert!(end.failures > 0, "the kill was seen: {marks:?}");
        // The calls that failed meanwhile are bounded: about one per
        // `timeout` per kind of call while the master was gone.
        assert!(end.failures <= 100, "{marks:?}");
    }
    assert_eq!(hits, 2 * PER as u64, "each task sent once");
    // The bound: the shared bucket over the run, plus each instance's
    // local bucket (rate / 2, burst / 2) from the kill to `FOLLOW` after
    // the promotion.
    let t = elapsed.as_secs_f64();
    let down = (promoted_at + FOLLOW - killed_at).as_secs_f64();
    let bound = (10.0 + 50.0 * (t + 0.1) + 2.0 * (5.0 + 25.0 * down)).ceil() as u64;
    assert!(
        hits <= bound,
        "{hits} admitted in {elapsed:?}, bound {bound}"
    );
    // In any 1 s window of the backend's arrivals: at most the shared
    // bucket's (burst + rate·(1 s + lease)) and both local fallbacks'
    // (burst/2 + rate/2 · 1 s each), where letting everything through
    // would send the queued rest at once.
    let times = backend.hit_times();
    let window = times
        .iter()
        .map(|t0| {
            times
                .iter()
                .filter(|t| **t >= *t0 && **t < *t0 + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    eprintln!("sentinel: at most {window} arrivals in one second");
    assert!(window <= 125, "{window} arrivals in one second");
    // Completion time: at least half the rate.
    assert!(hits as f64 >= 25.0 * (t - 1.5), "{hits} in {elapsed:?}");
    // The new master holds both instances' heartbeats.
    let members: u64 = s.on_data(
        s.replica.port(),
        redis::cmd("ZCARD").arg(actix_dispatch::redis::members_key("sl")),
    );
    assert_eq!(members, 2, "both instances heartbeat into the new master");
    let lines = logs::lines();
    no_password_in(&lines);
    let moved = lines
        .iter()
        .filter(|l| l.contains("master limits-master moved from"))
        .count();
    // One shared connection per instance, each moved once.
    assert_eq!(moved, 2, "{lines:#?}");
}

/// The durable stream through Sentinel: 30 entries enqueued and recorded
/// once each; then the master is `kill -9`ed (after `WAIT` made the
/// replica hold every write) and the replica promoted; 30 more entries,
/// enqueued through the new master (an enqueue failing while the engine
/// follows is retried, at most 100 times 100 ms apart), are read and
/// recorded too: every id once, nothing pending, nothing dead-lettered.
#[test]
fn the_durable_stream_runs_through_sentinel_and_follows_a_failover() {
    logs::capture();
    let Some(mut s) = RedisSentinel::start(
        "stream-master",
        Some(DATA_PASSWORD),
        Some(SENTINEL_PASSWORD),
    ) else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(&s, r#","prefix":"ss","timeout":"1s""#, &backend, "");
    const N: usize = 30;
    let (to_test, from_instance) = mpsc::channel::<()>();
    let (to_instance, from_test) = mpsc::channel::<()>();
    let instance = with_instance(cfg, move |d| {
        Box::pin(async move {
            let enqueue = |from: usize| {
                let d = d.clone();
                async move {
                    let mut retried = 0;
                    for i in from..from + N {
                        let line = format!(r#"{{"id":"s{i}","service":"svc","path":"/s/{i}"}}"#);
                        let line = actix_dispatch::codec::TaskLine::parse(&line).expect("line");
                        loop {
                            match d.enqueue_durable(&line).await {
                                Ok(_) => break,
                                Err(e) if retried < 100 => {
                                    retried += 1;
                                    eprintln!("enqueue s{i}: {e}; retrying");
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                }
                                Err(e) => panic!("enqueue s{i}: {e}"),
                            }
                        }
                    }
                    retried
                }
            };
            let wait_recorded = |n: u64| {
                let d = d.clone();
                async move {
                    redis_server::stream_until(&d, Duration::from_secs(20), |st| {
                        st.recorded == n && st.pending == 0 && st.lag == 0
                    })
                    .await
                    .expect("stream stats")
                }
            };
            assert_eq!(enqueue(0).await, 0, "no retry before the failover");
            let mut sc = actix_dispatch::redis::stream::StreamConfig::named("sentinel-worker");
            sc.claim_every = Some(Duration::from_millis(100));
            sc.block = Duration::from_millis(200);
            d.consume(sc).await.expect("consume through Sentinel");
            let before = wait_recorded(N as u64).await;
            to_test.send(()).expect("test");
            // The test kills the master and waits for the promotion.
            while from_test.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let retried = enqueue(N).await;
            let after = wait_recorded(2 * N as u64).await;
            (before, after, retried)
        })
    });
    from_instance
        .recv_timeout(Duration::from_secs(30))
        .expect("the first entries recorded");
    let master_port = s.master.as_ref().expect("master").port();
    // Every write (entries, acks, results) on the replica before the kill.
    let acked: i64 = s.on_data(master_port, redis::cmd("WAIT").arg(1).arg(2000));
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    s.kill_master();
    assert!(
        s.wait_failover(Duration::from_secs(15)),
        "the sentinels promoted the replica"
    );
    to_instance.send(()).expect("instance");
    let (before, after, retried) = instance.join().expect("instance");
    eprintln!("sentinel stream: before {before:?}; after {after:?}; {retried} enqueues retried");
    assert_eq!(before.recorded, N as u64, "{before:?}");
    assert_eq!(after.recorded, 2 * N as u64, "{after:?}");
    assert_eq!((after.pending, after.lag), (0, 0), "{after:?}");
    assert_eq!((after.dead_lettered, after.duplicates), (0, 0), "{after:?}");
    assert_eq!(backend.hits(), 2 * N as u64, "each entry sent once");
    // Every result on the new master, the 30 from before the kill too.
    let results: u64 = s.on_data(s.replica.port(), redis::cmd("XLEN").arg("ss:{svc}:results"));
    assert_eq!(results, 2 * N as u64, "every result on the new master");
    no_password_in(&logs::lines());
}

/// Sentinel over TLS: every node (data nodes and sentinels) reached over
/// `rediss://` only, trusting the test's CA (`ca_file`), the data nodes'
/// password in `url`. The check passes, a shared limit answers through
/// the master, and after a `kill -9` failover through the new one (TLS
/// to the promoted replica's address, as the sentinels name it).
#[test]
fn sentinel_over_tls_with_a_ca_file_follows_a_failover() {
    logs::capture();
    let Some(mut s) = RedisSentinel::start_tls("tls-master", Some(DATA_PASSWORD)) else {
        return;
    };
    let backend = Backend::start();
    // Two TLS handshakes (a sentinel's, then the master's) in a debug build
    // on a busy machine took over 500 ms once: a call's bound of 2 s.
    let extra = format!(
        r#","prefix":"st","timeout":"2s","ca_file":"{}""#,
        s.ca_file()
    );
    let cfg = config(
        &s,
        &extra,
        &backend,
        r#","rate_limit":{"service":{"rate":100,"burst":10},"shared":true},"queue":{"capacity":1000}"#,
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    assert!(redis_cfg.url.starts_with("rediss://"));
    actix::System::new()
        .block_on(actix_dispatch::redis::check(&redis_cfg))
        .expect("check over TLS through the sentinels");
    let (to_test, from_instance) = mpsc::channel::<()>();
    let (to_instance, from_test) = mpsc::channel::<()>();
    let instance = with_instance(cfg, move |d| {
        Box::pin(async move {
            let first = twenty(&d, "t", 0).await;
            let before = d.stats().await.shared.expect("shared");
            to_test.send(()).expect("test");
            while from_test.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mid = d.stats().await.shared.expect("shared");
            let second = twenty(&d, "t", 20).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let end = d.stats().await.shared.expect("shared");
            (first, second, before, mid, end)
        })
    });
    from_instance
        .recv_timeout(Duration::from_secs(30))
        .expect("the first tasks done");
    s.kill_master();
    assert!(
        s.wait_failover(Duration::from_secs(15)),
        "the sentinels promoted the replica"
    );
    thread::sleep(FOLLOW);
    to_instance.send(()).expect("instance");
    let (first, second, before, mid, end) = instance.join().expect("instance");
    eprintln!("sentinel tls: {first} + {second} tasks; {before:?} {mid:?} {end:?}");
    assert_eq!((first, second), (20, 20));
    assert_eq!(before.failures, 0, "over TLS from the start: {before:?}");
    assert!(before.round_trips > 0, "{before:?}");
    followed_the_new_master(&s, "st", &mid, &end);
    let lines = logs::lines();
    no_password_in(&lines);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("master tls-master moved from")),
        "{lines:#?}"
    );
}

/// `actix-dispatch enqueue` (feature `cli`) with a Sentinel config: the
/// lines go to the master the sentinels name, and no password reaches its
/// output.
#[cfg(feature = "cli")]
#[test]
fn the_enqueue_command_writes_through_sentinel() {
    use std::io::Write as _;
    let Some(s) = RedisSentinel::start("cli-master", Some(DATA_PASSWORD), Some(SENTINEL_PASSWORD))
    else {
        return;
    };
    let backend = Backend::start();
    let json = format!(
        r#"{{"redis":{{"url":"{}","prefix":"sc","sentinel":{{"master":"{}","nodes":{}}}}},
            "services":[{{"name":"svc","endpoints":[{{"address":"{}"}}]}}]}}"#,
        s.url(),
        s.name,
        s.nodes_json(),
        backend.url()
    );
    let dir = std::env::temp_dir().join(format!(
        "actix-dispatch-sentinel-cli-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.json");
    std::fs::write(&path, json).expect("config");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_actix-dispatch"))
        .args(["enqueue", "--config"])
        .arg(&path)
        .args(["--tasks", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("actix-dispatch enqueue");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(
            b"{\"service\":\"svc\",\"path\":\"/a\"}\n{\"service\":\"svc\",\"path\":\"/b\"}\n",
        )
        .expect("write");
    let out = child.wait_with_output().expect("enqueue");
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 2, "two entry ids: {stdout}");
    for text in [&stdout, &stderr] {
        assert!(
            !text.contains(DATA_PASSWORD) && !text.contains(SENTINEL_PASSWORD),
            "{text}"
        );
    }
    let master = s.master.as_ref().expect("master").port();
    let len: u64 = s.on_data(master, redis::cmd("XLEN").arg("sc:{svc}:tasks"));
    assert_eq!(len, 2, "both lines on the master");
}

/// A master that stops answering without closing its connections
/// (`kill -STOP`, as a partition would): the sentinels promote the
/// replica; the engine's calls over the old connection get no answer, and
/// after three in a row it asks the sentinels again and answers through
/// the new master within `FOLLOW` of the promotion. Every task succeeds.
#[test]
fn a_paused_master_is_left_for_the_promoted_replica() {
    logs::capture();
    let Some(s) = RedisSentinel::start("paused-master", Some(DATA_PASSWORD), None) else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &s,
        r#","prefix":"sp","timeout":"200ms","heartbeat":"200ms""#,
        &backend,
        r#","rate_limit":{"service":{"rate":100,"burst":10},"shared":true},"queue":{"capacity":1000}"#,
    );
    let (to_test, from_instance) = mpsc::channel::<()>();
    let (to_instance, from_test) = mpsc::channel::<()>();
    let instance = with_instance(cfg, move |d| {
        Box::pin(async move {
            let first = twenty(&d, "p", 0).await;
            to_test.send(()).expect("test");
            while from_test.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mid = d.stats().await.shared.expect("shared");
            let second = twenty(&d, "p", 20).await;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let end = d.stats().await.shared.expect("shared");
            (first, second, mid, end)
        })
    });
    from_instance
        .recv_timeout(Duration::from_secs(30))
        .expect("the first tasks done");
    s.master.as_ref().expect("master").pause();
    assert!(
        s.wait_failover(Duration::from_secs(15)),
        "the sentinels promoted the replica"
    );
    thread::sleep(FOLLOW);
    to_instance.send(()).expect("instance");
    let (first, second, mid, end) = instance.join().expect("instance");
    eprintln!("sentinel paused: {first} + {second} tasks; {mid:?} {end:?}");
    assert_eq!((first, second), (20, 20));
    assert!(mid.failures > 0, "the pause was seen: {mid:?}");
    followed_the_new_master(&s, "sp", &mid, &end);
    no_password_in(&logs::lines());
}

/// Submits the tasks `/{tag}{from}` to `/{tag}{from + 19}` and waits for
/// all of them (at most 20 s: none may be stuck); how many succeeded.
async fn twenty(d: &Dispatcher, tag: &str, from: usize) -> usize {
    let subs: Vec<_> = (from..from + 20)
        .map(|i| d.submit(Task::get("svc", format!("/{tag}{i}"))))
        .collect();
    let all = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(subs))
        .await
        .expect("no task stuck");
    all.iter().filter(|r| r.is_success()).count()
}

/// After a failover: no call failed since `mid`, calls went on through the
/// new master, Redis is not taken as down, and the instance of service
/// `svc` heartbeats into the new master (the old replica).
fn followed_the_new_master(
    s: &RedisSentinel,
    svc: &str,
    mid: &actix_dispatch::redis::SharedStats,
    end: &actix_dispatch::redis::SharedStats,
) {
    assert_eq!(
        mid.failures, end.failures,
        "through the new master: {end:?}"
    );
    assert!(end.round_trips > mid.round_trips, "{end:?}");
    assert!(!end.down, "{end:?}");
    let members: u64 = s.on_data(
        s.replica.port(),
        redis::cmd("ZCARD").arg(actix_dispatch::redis::members_key(svc)),
    );
    assert_eq!(members, 1, "the instance heartbeats into the new master");
}
