//! Redis as production runs it, against real redis-servers the tests start
//! (feature `redis`): passwords kept out of logs, errors and `Debug`; a
//! start without a working Redis bounded by `expected_instances`; foreign
//! content in the keys replaced, not obeyed; `rediss://` with a CA file; a
//! 3-master Redis Cluster (`redis-cli --cluster create`), with the slot of
//! a service's keys moved to another master mid-run.
//!
//! The logs are captured (`support::logs`) for the lines they must and
//! must not hold; each test uses its own key prefix.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Config, Dispatcher, Task};

use redis_server::{with_instance, RedisCluster, RedisServer};
use support::{logs, Backend};

const PASSWORD: &str = "hunter2-s3cret";

fn config(url: &str, redis_extra: &str, backend: &Backend, service_extra: &str) -> Config {
    let json = format!(
        r#"{{"redis":{{"url":"{url}"{redis_extra}}},
            "services":[{{"name":"svc","mode":"round_robin",
              "endpoints":[{{"address":"{}","max_concurrent":20}}]{service_extra}}}]}}"#,
        backend.url()
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn con(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("client")
        .get_connection()
        .expect("connect")
}

fn key_type(c: &mut redis::Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(c).expect("type")
}

/// Submits `n` tasks and waits (at most `limit`) for them; returns how
/// many succeeded.
async fn run_tasks(d: &Dispatcher, n: usize, limit: Duration) -> usize {
    let subs: Vec<_> = (0..n)
        .map(|i| d.submit(Task::get("svc", format!("/t/{i}"))))
        .collect();
    let all = tokio::time::timeout(limit, futures::future::join_all(subs))
        .await
        .expect("no task stuck");
    all.iter().filter(|r| r.is_success()).count()
}

// === secrets ===

/// A wrong password: `Dispatcher::start` still starts (`on_down` applies),
/// `check` refuses, and neither the logs, `check`'s error, the durable
/// enqueue's error nor the config's `Debug` holds the password.
#[test]
fn the_password_never_appears_in_logs_errors_or_debug() {
    logs::capture();
    let Some(srv) = RedisServer::start_with(&["--requirepass", "the-right-one"]) else {
        return;
    };
    let backend = Backend::start();
    let url = srv.url_with_password(PASSWORD);
    let cfg = config(
        &url,
        r#","prefix":"sec","timeout":"200ms""#,
        &backend,
        r#","rate_limit":{"service":{"rate":50,"burst":5},"shared":true}"#,
    );
    let debug = format!("{cfg:?}");
    assert!(!debug.contains(PASSWORD), "{debug}");
    assert!(debug.contains("redis://<redacted>@127.0.0.1"), "{debug}");
    let redis_cfg = cfg.redis.clone().expect("redis");
    let (check, enqueue, down) = with_instance(cfg, move |d| {
        Box::pin(async move {
            let check = actix_dispatch::redis::check(&redis_cfg)
                .await
                .expect_err("a wrong password is refused");
            let line = actix_dispatch::codec::TaskLine::parse(r#"{"service":"svc","path":"/a"}"#)
                .expect("line");
            let enqueue = d.enqueue_durable(&line).await.expect_err("refused");
            let ok = run_tasks(&d, 5, Duration::from_secs(5)).await;
            assert_eq!(ok, 5, "on_down local admits meanwhile");
            let down = d.stats().await.shared.expect("shared").down;
            (check.to_string(), enqueue.to_string(), down)
        })
    })
    .join()
    .expect("instance");
    assert!(down, "the token calls fail: shown down");
    for text in [&check, &enqueue] {
        assert!(!text.contains(PASSWORD), "{text}");
    }
    assert!(
        check.contains("WRONGPASS") || check.to_lowercase().contains("auth"),
        "{check}"
    );
    let lines = logs::lines();
    assert!(lines.iter().all(|l| !l.contains(PASSWORD)), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("redis://<redacted>@127.0.0.1") && l.contains("on_down")),
        "the warn line names the redacted URL: {lines:#?}"
    );
}

// === start without a working Redis ===

/// Two replicas started against a Redis that refuses their password, each
/// with `expected_instances: 2` and a shared limit of 20/s (burst 4),
/// `on_down: local`: together they send at most what one limit allows
/// (each runs at 10/s, burst 2), not twice it. Counted at the backend over
/// 2 s: at most 2 × (2 + 10 × 2) plus 4 for the edges.
#[test]
fn replicas_without_a_working_redis_stay_within_one_limit() {
    let Some(srv) = RedisServer::start_with(&["--requirepass", "the-right-one"]) else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv.url_with_password("wrong"),
        r#","prefix":"start","timeout":"200ms","expected_instances":2"#,
        &backend,
        r#","rate_limit":{"service":{"rate":20,"burst":4},"shared":true},"queue":{"capacity":1000}"#,
    );
    let (tx, rx) = mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let t0 = Instant::now();
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            let rx = rx.clone();
            with_instance(cfg.clone(), move |d| {
                Box::pin(async move {
                    let subs: Vec<_> = (0..200)
                        .map(|i| d.submit(Task::get("svc", format!("/t/{i}"))))
                        .collect();
                    // Until the test has counted.
                    while rx.lock().unwrap().try_recv().is_err() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let s = d.stats().await.shared.expect("shared");
                    drop(subs);
                    s
                })
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let hits = backend.hits();
    for _ in 0..2 {
        let _ = tx.send(());
    }
    for r in replicas {
        let s = r.join().expect("replica");
        assert!(s.down, "{s:?}");
        assert_eq!(s.live_instances, 2, "the expected count, never read: {s:?}");
    }
    assert!(hits <= 48, "{hits} admitted in 2 s by two replicas");
    assert!(hits >= 20, "the local fallback admits: {hits}");
}

// === foreign content ===

/// A list, then `1e300`, in a service's shared bucket key: the script
/// replaces the key (a full bucket) and says so, tasks flow at once, the
/// key is a plain value again, and Redis is not shown down.
#[test]
fn a_foreign_bucket_key_is_replaced_not_obeyed() {
    logs::capture();
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let backend = Backend::start();
    let mut c = con(&srv.url());
    for (prefix, poison) in [("list", None), ("huge", Some("1e300"))] {
        let key = format!("{prefix}:{{svc}}:rl");
        match poison {
            None => redis::cmd("RPUSH").arg(&key).arg("x").exec(&mut c),
            Some(v) => redis::cmd("SET").arg(&key).arg(v).exec(&mut c),
        }
        .expect("poison");
        let cfg = config(
            &srv.url(),
            &format!(r#","prefix":"{prefix}","timeout":"1s""#),
            &backend,
            r#","rate_limit":{"service":{"rate":100,"burst":20},"shared":true}"#,
        );
        let (ok, shared) = with_instance(cfg, |d| {
            Box::pin(async move {
                let ok = run_tasks(&d, 20, Duration::from_secs(5)).await;
                (ok, d.stats().await.shared.expect("shared"))
            })
        })
        .join()
        .expect("instance");
        assert_eq!(ok, 20, "{prefix}: every task ran");
        assert!(!shared.down, "{prefix}: {shared:?}");
        assert_eq!(key_type(&mut c, &key), "string", "{prefix}");
    }
    let lines = logs::lines();
    for (key, found) in [
        ("list:{svc}:rl", "held a list"),
        ("huge:{svc}:rl", "a time past"),
    ] {
        let named = lines
            .iter()
            .filter(|l| l.contains("service svc") && l.contains(&format!("{key:?}")))
            .filter(|l| l.contains(found))
            .count();
        assert_eq!(
            named, 1,
            "the repair names {key} and what it held: {lines:#?}"
        );
    }
}

/// A writer that keeps putting a list in a bucket key: every call
/// repairs it, the log names the key once a minute, not once a call.
#[test]
fn a_repeated_repair_is_logged_once_a_minute_per_key() {
    logs::capture();
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let backend = Backend::start();
    let url = srv.url();
    let key = "again:{svc}:rl";
    let cfg = config(
        &url,
        r#","prefix":"again","timeout":"1s","mode":"exact""#,
        &backend,
        r#","rate_limit":{"service":{"rate":1000,"burst":50},"shared":true}"#,
    );
    let repairs = with_instance(cfg, move |d| {
        Box::pin(async move {
            let mut c = con(&url);
            let mut seen = 0;
            for _ in 0..3 {
                redis::cmd("DEL").arg(key).exec(&mut c).unwrap();
                redis::cmd("RPUSH").arg(key).arg("x").exec(&mut c).unwrap();
                assert_eq!(run_tasks(&d, 5, Duration::from_secs(5)).await, 5);
                // A bucket again (or expired, full again): not the list.
                seen += usize::from(key_type(&mut c, key) != "list");
            }
            seen
        })
    })
    .join()
    .expect("instance");
    assert_eq!(repairs, 3, "each list was replaced");
    let lines = logs::lines();
    let named = lines
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains(&format!("{key:?}")))
        .count();
    assert_eq!(named, 1, "{lines:#?}");
}

/// The breaker script against foreign keys: a probe claim with no expiry
/// (which nobody could ever take again) is dropped and the claim won; a
/// list where `tripped` should be is deleted; a negative `tripped` opens
/// for the first open time, not a negative one.
#[test]
fn foreign_breaker_keys_cannot_shut_a_node_out() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let mut c = con(&srv.url());
    let script = redis::Script::new(actix_dispatch::redis::BREAKER_LUA);
    let keys = ["b:open", "b:tripped", "b:probe", "b:reports"];
    // The answer, and the keys replaced as (1-based index, what).
    let run = |c: &mut redis::Connection, op: &str, args: &[u64]| -> (i64, Vec<(i64, String)>) {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        inv.arg(op).arg("me");
        for a in args {
            inv.arg(*a);
        }
        let (answer, repaired): (i64, Vec<redis::Value>) = inv.invoke(c).expect("breaker.lua");
        let repaired = repaired
            .chunks(2)
            .map(|p| {
                (
                    redis::from_redis_value(p[0].clone()).unwrap(),
                    redis::from_redis_value(p[1].clone()).unwrap(),
                )
            })
            .collect();
        (answer, repaired)
    };
    // Half-open (tripped, not open), a foreign claim that never expires.
    redis::cmd("SET")
        .arg("b:tripped")
        .arg(100)
        .exec(&mut c)
        .unwrap();
    redis::cmd("SET")
        .arg("b:probe")
        .arg("nobody")
        .exec(&mut c)
        .unwrap();
    // Won (1), the claim named as what was replaced.
    assert_eq!(
        run(&mut c, "claim", &[500]),
        (1, vec![(3, "a probe claim without expiry".to_string())])
    );
    let owner: String = redis::cmd("GET").arg("b:probe").query(&mut c).unwrap();
    assert_eq!(owner, "me");
    // A list in `tripped`: deleted (not half-open any more), flagged.
    redis::cmd("DEL")
        .arg("b:probe")
        .arg("b:tripped")
        .exec(&mut c)
        .unwrap();
    redis::cmd("RPUSH")
        .arg("b:tripped")
        .arg("x")
        .exec(&mut c)
        .unwrap();
    assert_eq!(
        run(&mut c, "claim", &[500]),
        (0, vec![(2, "a list".to_string())])
    );
    assert_eq!(key_type(&mut c, "b:tripped"), "none");
    // A string where the reports set is: replaced, named.
    redis::cmd("SET")
        .arg("b:reports")
        .arg("x")
        .exec(&mut c)
        .unwrap();
    assert_eq!(
        run(&mut c, "trip", &[200, 2, 1000]),
        (0, vec![(4, "a string".to_string())])
    );
    assert_eq!(key_type(&mut c, "b:reports"), "zset");
    // A negative `tripped`: a failed probe opens for the first open time.
    redis::cmd("SET")
        .arg("b:tripped")
        .arg(-5000)
        .exec(&mut c)
        .unwrap();
    assert_eq!(run(&mut c, "reopen", &[200, 10_000]), (400, vec![]));
    let pttl: i64 = redis::cmd("PTTL").arg("b:open").query(&mut c).unwrap();
    assert!(pttl > 0 && pttl <= 400, "{pttl}");
}

/// A hash where the membership set should be: the heartbeat replaces it
/// (a sorted set again) and counts this instance.
#[test]
fn a_foreign_members_key_is_replaced() {
    logs::capture();
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let backend = Backend::start();
    let mut c = con(&srv.url());
    let key = actix_dispatch::redis::members_key("mem");
    assert_eq!(key, "mem:{members}", "under the prefix, hash-tagged");
    redis::cmd("HSET")
        .arg(&key)
        .arg("a")
        .arg("b")
        .exec(&mut c)
        .unwrap();
    let cfg = config(
        &srv.url(),
        r#","prefix":"mem","timeout":"1s","heartbeat":"100ms""#,
        &backend,
        r#","rate_limit":{"service":{"rate":100,"burst":20},"shared":true}"#,
    );
    let shared = with_instance(cfg, |d| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            d.stats().await.shared.expect("shared")
        })
    })
    .join()
    .expect("instance");
    assert_eq!(key_type(&mut c, &key), "zset");
    assert_eq!(shared.live_instances, 1, "{shared:?}");
    assert!(!shared.down, "{shared:?}");
    let lines = logs::lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("{key:?}")) && l.contains("held a hash")),
        "{lines:#?}"
    );
}

// === TLS ===

/// `rediss://` to redis-server's `tls-port`, trusting the test's own CA
/// (`ca_file`): `check` passes and shared limits run over it. Without the
/// CA file the system's roots do not know that CA: `check` refuses.
#[test]
fn rediss_with_a_ca_file() {
    let Some(srv) = RedisServer::start_tls() else {
        return;
    };
    let backend = Backend::start();
    let ca = srv.ca_file();
    let cfg = config(
        &srv.tls_url(),
        &format!(r#","prefix":"tls","timeout":"1s","ca_file":"{ca}""#),
        &backend,
        r#","rate_limit":{"service":{"rate":100,"burst":20},"shared":true}"#,
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    let (checked, ok, shared) = with_instance(cfg, move |d| {
        Box::pin(async move {
            let checked = actix_dispatch::redis::check(&redis_cfg).await;
            let ok = run_tasks(&d, 20, Duration::from_secs(5)).await;
            (checked, ok, d.stats().await.shared.expect("shared"))
        })
    })
    .join()
    .expect("instance");
    checked.expect("TLS with the CA file");
    assert_eq!(ok, 20);
    assert!(!shared.down && shared.round_trips > 0, "{shared:?}");
    assert_eq!(shared.failures, 0, "{shared:?}");
    // The shared bucket's key was written over TLS.
    let mut c = con(&srv.url());
    let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert!(n >= 1);
    // Without the CA file: the certificate is not trusted.
    let cfg = config(&srv.tls_url(), "", &backend, "");
    let r = cfg.redis.expect("redis");
    let e = actix::System::new()
        .block_on(actix_dispatch::redis::check(&r))
        .expect_err("an unknown issuer is refused");
    eprintln!("without ca_file: {e}");
}

/// `ca_file` is for `rediss://` only, and must hold certificates.
#[test]
fn ca_file_is_checked_when_the_config_is_loaded() {
    let backend = Backend::start();
    let json = |url: &str, ca: &str| {
        format!(
            r#"{{"redis":{{"url":"{url}","ca_file":"{ca}"}},
                "services":[{{"name":"svc","endpoints":[{{"address":"{}"}}]}}]}}"#,
            backend.url()
        )
    };
    let e = Config::from_json(&json("redis://127.0.0.1:1/0", "/nonexistent.pem")).unwrap_err();
    assert!(e.to_string().contains("redis.ca_file"), "{e}");
    let e = Config::from_json(&json("rediss://127.0.0.1:1/0", "/nonexistent.pem")).unwrap_err();
    assert!(
        e.to_string().contains("redis.ca_file") && e.to_string().contains("cannot read"),
        "{e}"
    );
}

// === Redis Cluster ===

/// Shared limits (service 50/s, burst 10, lease mode) of two instances on
/// a 3-master Cluster, 2 s, while the slot of the service's keys moves to
/// another master after 0.7 s (`SETSLOT IMPORTING/MIGRATING`, `MIGRATE`,
/// `SETSLOT NODE`): the calls follow `ASK`/`MOVED`, `on_down: local`
/// holds the rate meanwhile, and nothing lets everything through. The
/// backend sees at most burst + rate·T + lease (+ the local fallback's
/// share while calls failed: 2 × (burst/2 + rate/2 · 2 s) at most, which
/// the bound below includes), and at least half the rate; within 2 s of
/// the move the calls answer again (no failure in the last second), and
/// the bucket key lives on its new master.
#[test]
fn a_cluster_shares_the_limits_and_follows_a_moved_slot() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &cluster.url(),
        r#","cluster":true,"prefix":"cl","timeout":"500ms","on_down":"local""#,
        &backend,
        r#","rate_limit":{"service":{"rate":50,"burst":10},"shared":true},"breaker":{"shared":true},"queue":{"capacity":1000}"#,
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    assert!(actix::System::new()
        .block_on(actix_dispatch::redis::check(&redis_cfg))
        .is_ok());
    // The slot of `{svc}` and its owner.
    let slot: String = cluster.nodes[0]
        .cli(&["CLUSTER", "KEYSLOT", "{svc}"])
        .trim()
        .into();
    // The owner answers a key of the slot; the others say MOVED.
    let from = cluster
        .nodes
        .iter()
        .position(|n| !n.cli(&["GET", "{svc}"]).contains("MOVED"))
        .expect("an owner");
    let to = (from + 1) % 3;
    let (tx, rx) = mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let t0 = Instant::now();
    let instances: Vec<_> = (0..2)
        .map(|_| {
            let rx = rx.clone();
            with_instance(cfg.clone(), move |d| {
                Box::pin(async move {
                    let subs: Vec<_> = (0..300)
                        .map(|i| d.submit(Task::get("svc", format!("/t/{i}"))))
                        .collect();
                    // Failures seen by the test's marks (sent over `rx`).
                    let marks = redis_server::shared_at_marks(&d, &rx).await;
                    drop(subs);
                    marks
                })
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    // Move the slot: from -> to.
    let (a, b) = (&cluster.nodes[from], &cluster.nodes[to]);
    let (a_id, b_id) = (a.node_id(), b.node_id());
    assert!(b
        .cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &a_id])
        .contains("OK"));
    assert!(a
        .cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &b_id])
        .contains("OK"));
    let keys = a.cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
    let keys: Vec<&str> = keys
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    if !keys.is_empty() {
        let port = b.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().copied());
        let out = a.cli(&args);
        assert!(
            out.contains("OK") || out.contains("NOKEY"),
            "MIGRATE: {out}"
        );
    }
    for n in &cluster.nodes {
        assert!(n
            .cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &b_id])
            .contains("OK"));
    }
    let moved_at = t0.elapsed();
    // 2 s after the move: a mark, then one more second, then the end.
    thread::sleep(Duration::from_secs(2));
    for _ in 0..2 {
        let _ = tx.send(());
    }
    thread::sleep(Duration::from_secs(1));
    let elapsed = t0.elapsed();
    let hits = backend.hits();
    drop(tx);
    let marks: Vec<_> = instances
        .into_iter()
        .map(|i| i.join().expect("instance"))
        .collect();
    eprintln!("cluster: slot {slot} moved at {moved_at:?}; {hits} hits in {elapsed:?}; {marks:?}");
    for m in &marks {
        let (mid, end) = (m[0].clone(), m[m.len() - 1].clone());
        assert_eq!(
            mid.failures, end.failures,
            "no failure from 2 s after the move on: {m:?}"
        );
        assert!(!end.down, "{m:?}");
        assert!(end.round_trips > mid.round_trips, "calls went on: {m:?}");
    }
    let t = elapsed.as_secs_f64();
    let bound = (10.0 + 50.0 * (t + 0.1) + 2.0 * (5.0 + 25.0 * 2.0)).ceil() as u64;
    assert!(
        hits <= bound,
        "{hits} admitted in {elapsed:?}, bound {bound}"
    );
    assert!(hits as f64 >= 25.0 * t, "{hits} admitted in {elapsed:?}");
    // The bucket key now lives on its new master.
    assert!(
        b.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).trim() != "0",
        "keys of {{svc}} on the new owner"
    );
}

/// The durable stream runs on a Cluster: every key of a service's stream
/// shares its hash tag, so entries enqueued through one master's slot are
/// read, sent and recorded exactly once, with nothing left pending.
#[test]
fn the_durable_stream_runs_on_a_cluster() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &cluster.url(),
        r#","cluster":true,"prefix":"cs","timeout":"1s""#,
        &backend,
        "",
    );
    const N: usize = 40;
    let stats = with_instance(cfg, |d| {
        Box::pin(async move {
            for i in 0..N {
                let line = format!(r#"{{"id":"c{i}","service":"svc","path":"/c/{i}"}}"#);
                let line = actix_dispatch::codec::TaskLine::parse(&line).expect("line");
                d.enqueue_durable(&line)
                    .await
                    .expect("enqueue on a Cluster");
            }
            let mut sc = actix_dispatch::redis::stream::StreamConfig::named("cluster-worker");
            sc.claim_every = Some(Duration::from_millis(100));
            d.consume(sc).await.expect("consume on a Cluster");
            redis_server::stream_until(&d, Duration::from_secs(15), |st| {
                st.recorded == N as u64 && st.pending == 0 && st.lag == 0
            })
            .await
        })
    })
    .join()
    .expect("instance")
    .expect("stream stats");
    assert_eq!(stats.recorded, N as u64, "{stats:?}");
    assert_eq!((stats.pending, stats.lag), (0, 0), "{stats:?}");
    assert_eq!((stats.dead_lettered, stats.duplicates), (0, 0), "{stats:?}");
    assert_eq!(backend.hits(), N as u64);
    // Every key of the stream sits in the slot of its hash tag.
    let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", "{svc}"]);
    let keys: usize = cluster
        .nodes
        .iter()
        .map(|n| {
            n.cli(&["CLUSTER", "COUNTKEYSINSLOT", slot.trim()])
                .trim()
                .parse::<usize>()
                .unwrap_or(0)
        })
        .sum();
    assert!(
        keys >= 2,
        "the stream and its results share {{svc}}'s slot: {keys}"
    );
}
