//! Limits and breakers shared through a real redis-server (feature `redis`).
//!
//! Each test starts its own `redis-server` (ephemeral port, no persistence;
//! skipped when it is not installed, failing instead when `CI` is set) and
//! runs each engine instance in its own thread and actix System, as
//! separate processes would.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::algo::limiter::TokenBucket;
use actix_dispatch::config::BucketConfig;
use actix_dispatch::redis::{take_many, take_tokens, Ask};
use actix_dispatch::{Config, Dispatcher, Task, TaskResult};
use redis_server::RedisServer;
use support::Backend;

/// One engine instance: a dispatcher on its own thread and System.
struct Instance {
    d: Dispatcher,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Instance {
    fn start(cfg: Config) -> Instance {
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            actix::System::new().block_on(async move {
                let d = Dispatcher::start(cfg).expect("start");
                tx.send(d.clone()).expect("send");
                let _ = stop_rx.await;
                d.shutdown(Duration::ZERO).await;
            });
        });
        let d = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("instance up");
        Instance {
            d,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long instances are given to connect to Redis and heartbeat before a
/// test's clock starts.
const SETTLE: Duration = Duration::from_millis(300);

/// A redis-server of the test's own (with the logs on), or `None`: skip.
fn redis_server() -> Option<RedisServer> {
    support::init_logs();
    RedisServer::start()
}

/// `n` instances of `cfg`, each on its own thread and System, given
/// [`SETTLE`] to connect and heartbeat.
fn start_instances(cfg: &Config, n: usize) -> Vec<Instance> {
    let instances = (0..n).map(|_| Instance::start(cfg.clone())).collect();
    thread::sleep(SETTLE);
    instances
}

/// One instance of `cfg`, given [`SETTLE`] to connect and heartbeat.
fn start_instance(cfg: Config) -> Instance {
    let instance = Instance::start(cfg);
    thread::sleep(SETTLE);
    instance
}

/// The config of service `svc` (round robin over `backends`, with
/// `service_extra`), its `redis` section `srv`'s url and `redis` (more
/// `"key":value` pairs).
fn config(srv: &RedisServer, redis: &str, backends: &[&Backend], service_extra: &str) -> Config {
    let redis = format!(r#"{{"url":"{}",{redis}}}"#, srv.url());
    let eps: Vec<String> = backends
        .iter()
        .map(|b| format!(r#"{{"address":"{}","max_concurrent":20}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"redis":{redis},"services":[{{"name":"svc","mode":"round_robin","endpoints":[{}],{service_extra}}}]}}"#,
        eps.join(",")
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// Waits (at most 3 s) until `d` shows Redis down: from its first call
/// after a pause, made when its next batch of tokens is due, plus
/// `timeout`. No latency is asserted, only that it comes.
fn wait_down(rt: &actix::SystemRunner, d: &Dispatcher) {
    assert!(wait_shown(rt, d, true), "down is shown in stats");
}

/// Waits (at most 3 s) until `d` shows Redis up again (it asks once per
/// `timeout` while down).
fn wait_up(rt: &actix::SystemRunner, d: &Dispatcher) {
    assert!(wait_shown(rt, d, false), "back after kill -CONT");
}

fn wait_shown(rt: &actix::SystemRunner, d: &Dispatcher, down: bool) -> bool {
    let t = Instant::now();
    loop {
        if rt.block_on(d.stats()).shared.expect("shared stats").down == down {
            return true;
        }
        if t.elapsed() > Duration::from_secs(3) {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn submit_many(d: &Dispatcher, n: usize) -> Vec<actix_dispatch::Submission> {
    (0..n)
        .map(|i| d.submit(Task::get("svc", format!("/t/{i}"))))
        .collect()
}

/// Waits (at most `limit`) for the results of `tasks`: no task may be stuck.
fn all_answered(
    rt: &actix::SystemRunner,
    limit: Duration,
    tasks: Vec<actix_dispatch::Submission>,
) -> Vec<TaskResult> {
    rt.block_on(async {
        tokio::time::timeout(limit, futures::future::join_all(tasks))
            .await
            .expect("no task stuck")
    })
}

/// The Redis round trips of `instances` so far.
fn round_trips(rt: &actix::SystemRunner, instances: &[Instance]) -> u64 {
    instances
        .iter()
        .map(|i| rt.block_on(i.d.stats()).shared.expect("shared").round_trips)
        .sum()
}

// === the script against the local GCRA ===

/// The script decides exactly as `TokenBucket` does, under a forced `now`:
/// every arrival of a sequence is admitted or refused alike.
#[actix_rt::test]
async fn gcra_script_is_exact_under_a_forced_now() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let base: u64 = 1_700_000_000_000_000;

    // A fresh bucket admits exactly its burst at one instant (rate 10,
    // burst 5); the next token is due one interval (100 ms) later.
    let b = BucketConfig {
        rate: 10.0,
        burst: 5,
    };
    let keys = vec![("t:{a}:rl".to_string(), b)];
    let t = take_tokens(&mut con, &keys, 7, Some(base)).await.unwrap();
    assert_eq!(t.granted, 5);
    // Due again when the wanted tokens are, at most half the burst (3):
    // three intervals.
    assert_eq!(t.retry_in, Duration::from_millis(300));
    let t = take_tokens(&mut con, &keys, 1, Some(base + 99_999))
        .await
        .unwrap();
    assert_eq!((t.granted, t.retry_in), (0, Duration::from_micros(1)));
    let t = take_tokens(&mut con, &keys, 1, Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(t.granted, 1);
    // TTL (on Redis's own clock): the time until the bucket is full again,
    // here 3 intervals after taking 3 tokens.
    let ttl_keys = vec![("t:{ttl}:rl".to_string(), b)];
    let t = take_tokens(&mut con, &ttl_keys, 3, None).await.unwrap();
    assert_eq!(t.granted, 3);
    let pttl: i64 = redis::cmd("PTTL")
        .arg("t:{ttl}:rl")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 200 && pttl <= 300, "pttl {pttl}");

    // Steady overload (arrivals every T/2): burst + n admitted, as the
    // local bucket's test says; and arrival by arrival the same answers.
    for (i, burst) in [1u32, 4, 25].into_iter().enumerate() {
        let b = BucketConfig { rate: 100.0, burst };
        let keys = vec![(format!("t:{{s{i}}}:rl"), b)];
        let t0 = tokio::time::Instant::now();
        let mut local = TokenBucket::new(100.0, burst, t0);
        let n = 100u64;
        let mut admitted = 0;
        for k in 0..=2 * n {
            let us = k * 5_000;
            let remote = take_tokens(&mut con, &keys, 1, Some(base + us))
                .await
                .unwrap();
            let here = local.try_acquire(t0 + Duration::from_micros(us)).is_ok();
            assert_eq!(remote.granted == 1, here, "burst {burst}, arrival {k}");
            admitted += remote.granted as u64;
        }
        assert_eq!(admitted, u64::from(burst) + n, "burst {burst}");
    }

    // Irregular gaps (rate 250/s: T = 4 ms exactly in µs and ns).
    let b = BucketConfig {
        rate: 250.0,
        burst: 3,
    };
    let keys = vec![("t:{g}:rl".to_string(), b)];
    let t0 = tokio::time::Instant::now();
    let mut local = TokenBucket::new(250.0, 3, t0);
    let mut us = 0u64;
    for k in 0..300u64 {
        us += (k * 7_919) % 9_000;
        let remote = take_tokens(&mut con, &keys, 1, Some(base + us))
            .await
            .unwrap();
        let here = local.try_acquire(t0 + Duration::from_micros(us));
        assert_eq!(remote.granted == 1, here.is_ok(), "arrival {k} at {us} µs");
    }

    // Atomic over several buckets (a service's and a node's): tokens are
    // taken from both or neither.
    let svc = BucketConfig {
        rate: 10.0,
        burst: 2,
    };
    let node = BucketConfig {
        rate: 100.0,
        burst: 5,
    };
    let keys = vec![
        ("t:{m}:rl".to_string(), svc),
        ("t:{m}:node".to_string(), node),
    ];
    let t = take_tokens(&mut con, &keys, 4, Some(base)).await.unwrap();
    assert_eq!(t.granted, 2);
    let t = take_tokens(&mut con, &keys[1..], 4, Some(base))
        .await
        .unwrap();
    assert_eq!(t.granted, 3, "the node bucket gave exactly 2 before");
}

/// Two buckets in one ask (a service's and a node's) under a forced
/// `now`: a token is taken from both or from neither, arrival by arrival
/// exactly as two local buckets checked together; asks sharing the
/// service bucket take turns; `due` says when the wanted tokens are there.
#[actix_rt::test]
async fn gcra_script_takes_from_both_buckets_or_neither() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let base: u64 = 1_700_000_000_000_000;
    let both = |want| Ask {
        buckets: vec![0, 1],
        want,
    };
    let one = |b, want| Ask {
        buckets: vec![b],
        want,
    };

    // The node's bucket is empty: nothing is taken from the service's.
    let keys = vec![
        (
            "n:{e}:rl".to_string(),
            BucketConfig {
                rate: 100.0,
                burst: 10,
            },
        ),
        (
            "n:{e}:rl:node".to_string(),
            BucketConfig {
                rate: 10.0,
                burst: 1,
            },
        ),
    ];
    let (g, _) = take_many(&mut con, &keys, &[one(1, 1)], Some(base))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 1, "the node's one token");
    let (g, _) = take_many(&mut con, &keys, &[both(3)], Some(base + 1_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 0, "node empty: neither bucket gives");
    // Due when the node's next token is: 100 ms after the first, 99 ms on.
    assert_eq!(g[0].due, Duration::from_millis(99));
    let (g, _) = take_many(&mut con, &keys, &[one(0, 20)], Some(base + 1_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 10, "the service's bucket is still full");
    // Now the service's is emptied: the node's next token stays.
    let (g, _) = take_many(&mut con, &keys, &[one(0, 20)], Some(base + 100_000))
        .await
        .unwrap();
    assert!(g[0].granted >= 1, "the service's refilled tokens taken");
    let (g, _) = take_many(&mut con, &keys, &[both(1)], Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 0, "service empty: neither bucket gives");
    let (g, _) = take_many(&mut con, &keys, &[one(1, 1)], Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 1, "the node's token was not taken");

    // Two nodes' asks share the service's bucket (burst 4): turns, 2 each.
    let keys = vec![
        (
            "n:{t}:rl".to_string(),
            BucketConfig {
                rate: 10.0,
                burst: 4,
            },
        ),
        (
            "n:{t}:rl:a".to_string(),
            BucketConfig {
                rate: 100.0,
                burst: 10,
            },
        ),
        (
            "n:{t}:rl:b".to_string(),
            BucketConfig {
                rate: 100.0,
                burst: 10,
            },
        ),
    ];
    let asks = [
        Ask {
            buckets: vec![0, 1],
            want: 5,
        },
        Ask {
            buckets: vec![0, 2],
            want: 5,
        },
    ];
    let (g, _) = take_many(&mut con, &keys, &asks, Some(base)).await.unwrap();
    assert_eq!((g[0].granted, g[1].granted), (2, 2));

    // Arrival by arrival, the same answers as two local buckets checked
    // together (service 50/s burst 3, node 20/s burst 2, every 7 ms).
    let svc = BucketConfig {
        rate: 50.0,
        burst: 3,
    };
    let node = BucketConfig {
        rate: 20.0,
        burst: 2,
    };
    let keys = vec![
        ("n:{s}:rl".to_string(), svc),
        ("n:{s}:rl:node".to_string(), node),
    ];
    let t0 = tokio::time::Instant::now();
    let mut ls = TokenBucket::new(50.0, 3, t0);
    let mut ln = TokenBucket::new(20.0, 2, t0);
    let mut admitted = 0;
    for k in 0..300u64 {
        let us = k * 7_000;
        let at = t0 + Duration::from_micros(us);
        let (g, _) = take_many(&mut con, &keys, &[both(1)], Some(base + us))
            .await
            .unwrap();
        let here = ls.check(at).is_ok() && ln.check(at).is_ok();
        if here {
            ls.try_acquire(at).unwrap();
            ln.try_acquire(at).unwrap();
        }
        assert_eq!(g[0].granted == 1, here, "arrival {k} at {us} µs");
        admitted += g[0].granted;
    }
    // The node's bucket binds: burst + 20/s over 2.093 s.
    assert!((2 + 40..=2 + 42).contains(&admitted), "{admitted}");
}

// === one limit over three instances ===

/// Three instances, one shared service limit (50/s, burst 10), one
/// backend, for 2 s: the backend sees at most burst + rate·T (+ the lease
/// bound rate·lease in lease mode) and at least 90 % of burst + rate·T.
///
/// The calls' `timeout` is long (1 s): on a machine so busy that an answer
/// waits longer than the timeout, `on_down: local` would rightly add the
/// local fallback's admissions, which is not what these tests measure.
fn three_instances_share_one_limit(mode: &str) -> (u64, u64) {
    let Some(srv) = redis_server() else {
        return (0, 0);
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        &format!(r#""prefix":"{mode}","timeout":"1s","mode":"{mode}","lease":"100ms""#),
        &[&backend],
        r#""rate_limit":{"service":{"rate":50,"burst":10},"shared":true},"queue":{"capacity":2000}"#,
    );
    let instances = start_instances(&cfg, 3);
    assert_eq!(backend.hits(), 0);
    let rt = actix::System::new();
    let trips0 = round_trips(&rt, &instances);
    let t0 = Instant::now();
    let pending: Vec<_> = instances.iter().map(|i| submit_many(&i.d, 300)).collect();
    thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let hits = backend.hits();
    let elapsed = t0.elapsed();
    let trips = round_trips(&rt, &instances) - trips0;
    // Every instance heartbeated (once a second): three are live.
    let shared = rt.block_on(instances[0].d.stats()).shared.expect("shared");
    assert_eq!(shared.live_instances, 3, "{shared:?}");
    // At saturation each instance asks once per batch (half a burst), not
    // once per token: about one round trip per admitted task at most
    // (heartbeats included).
    let per_task = trips as f64 / hits.max(1) as f64;
    eprintln!("{mode}: {trips} round trips, {per_task:.2} per admitted task");
    assert!(per_task <= 1.5, "{per_task} round trips per admitted task");
    drop(instances);
    drop(pending);
    let lease = if mode == "lease" { 5 } else { 0 };
    // Over any 1 s window of the backend's arrivals: at most burst + rate·1 s
    // (+ lease); 2 more for the spread between the script's clock and the
    // arrivals (a few ms of dispatch on a busy machine).
    let times = backend.hit_times();
    let w = Duration::from_secs(1);
    let worst = (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t - times[i] <= w)
                .count()
        })
        .max()
        .unwrap_or(0) as u64;
    eprintln!("{mode}: at most {worst} in any 1 s window (limit 60 + lease {lease})");
    assert!(worst <= 60 + lease + 2, "{worst} in one second");
    // burst + rate·T, T the measured window (a few ms past 2 s).
    let bound = 10 + (50.0 * elapsed.as_secs_f64()).floor() as u64;
    eprintln!("{mode}: {hits} admissions in {elapsed:?}; bound {bound} + lease {lease}");
    assert!(hits <= bound + lease, "{hits} > {bound} + {lease}");
    assert!(hits * 10 >= 110 * 9, "{hits} below 90 % of 110");
    (hits, bound)
}

#[test]
fn three_instances_share_one_limit_leased() {
    three_instances_share_one_limit("lease");
}

#[test]
fn three_instances_share_one_limit_exact() {
    three_instances_share_one_limit("exact");
}

/// Regression: an idle instance renewed its lease whenever it ran out, so
/// it took its share of the shared bucket while sending nothing. Now a
/// lease is asked for only when routes wait for it: one busy instance
/// beside two idle ones gets at least 90 % of burst + rate·T.
#[test]
fn idle_instances_take_no_tokens() {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"idle","timeout":"1s","mode":"lease","lease":"100ms""#,
        &[&backend],
        r#""rate_limit":{"service":{"rate":50,"burst":10},"shared":true},"queue":{"capacity":2000}"#,
    );
    let instances = start_instances(&cfg, 3);
    let t0 = Instant::now();
    let pending = submit_many(&instances[0].d, 300);
    thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let hits = backend.hits();
    let elapsed = t0.elapsed();
    drop(instances);
    drop(pending);
    let bound = 10 + (50.0 * elapsed.as_secs_f64()).floor() as u64;
    eprintln!("one busy instance of three: {hits} admissions, bound {bound} + lease 5");
    assert!(hits <= bound + 5, "{hits} > {bound} + 5");
    assert!(hits * 10 >= 110 * 9, "{hits} below 90 % of 110");
}

// === per-node limits over three instances ===

/// Three instances share per-node limits (`rate`/s, `burst`; the
/// service's 1 000/s never binds) over `nodes` backends, for 2 s: each
/// backend sees at most burst + rate·T (+ the lease bound `rate·lease` in
/// lease mode) and at least 90 % of burst + rate·T. Returns the Redis
/// round trips per admitted task. A long `timeout`, as above.
fn three_instances_share_node_limits(mode: &str, nodes: usize, rate: u64, burst: u64) -> f64 {
    let Some(srv) = redis_server() else {
        return 0.0;
    };
    let backends: Vec<Backend> = (0..nodes).map(|_| Backend::start()).collect();
    let cfg = config(
        &srv,
        &format!(r#""prefix":"n{mode}","timeout":"1s","mode":"{mode}","lease":"100ms""#),
        &backends.iter().collect::<Vec<_>>(),
        &format!(
            r#""rate_limit":{{"per_node":{{"rate":{rate},"burst":{burst}}},"service":{{"rate":1000,"burst":100}},"shared":true}},
               "queue":{{"capacity":2000}}"#
        ),
    );
    let instances = start_instances(&cfg, 3);
    let rt = actix::System::new();
    let trips0 = round_trips(&rt, &instances);
    let t0 = Instant::now();
    let pending: Vec<_> = instances.iter().map(|i| submit_many(&i.d, 300)).collect();
    thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
    let elapsed = t0.elapsed();
    let trips = round_trips(&rt, &instances) - trips0;
    drop(instances);
    drop(pending);
    // rate·lease, at least 1, at most the burst.
    let lease = if mode == "lease" {
        (rate / 10).clamp(1, burst)
    } else {
        0
    };
    let bound = burst + (rate as f64 * elapsed.as_secs_f64()).floor() as u64;
    let total: u64 = hits.iter().sum();
    let per_task = trips as f64 / total.max(1) as f64;
    eprintln!(
        "{mode}, {nodes} node(s) at {rate}/s burst {burst}: per node {hits:?} in {elapsed:?}; \
         bound {bound} + lease {lease}; {trips} round trips, {per_task:.2} per admitted task"
    );
    let full = burst + 2 * rate;
    for h in hits {
        assert!(h <= bound + lease, "{h} > {bound} + {lease}");
        assert!(h * 10 >= full * 9, "{h} below 90 % of {full}");
    }
    per_task
}

#[test]
fn three_instances_share_node_limits_leased() {
    let per_task = three_instances_share_node_limits("lease", 2, 20, 5);
    assert!(per_task <= 1.5, "{per_task} round trips per admitted task");
}

#[test]
fn three_instances_share_node_limits_exact() {
    let per_task = three_instances_share_node_limits("exact", 2, 20, 5);
    assert!(per_task <= 1.5, "{per_task} round trips per admitted task");
}

/// Regression: a node's last shared token set no wake-up for its next
/// batch, so an instance whose routes were bounced waited for the next
/// refresh (1 s): one node at 50/s, burst 10, got about half its rate.
#[test]
fn a_node_asks_again_when_its_next_batch_is_due() {
    let per_task = three_instances_share_node_limits("exact", 1, 50, 10);
    assert!(per_task <= 1.5, "{per_task} round trips per admitted task");
}

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

// === breakers ===

/// A breaker tripped by instance A keeps B and C off the node from their
/// next refresh; in half-open exactly one instance probes; a probe's
/// success closes it for all.
#[test]
fn a_trip_by_one_instance_stops_the_others_and_one_probe_goes() {
    let Some(srv) = redis_server() else {
        return;
    };
    let good = Backend::start();
    let bad = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"br","timeout":"200ms""#,
        &[&good, &bad],
        r#""balancer":{"refresh_interval":"100ms"},
           "retry":{"max_retries":0},
           "breaker":{"consecutive_failures":3,"open_for":"1s","max_open_for":"4s",
                      "probe_timeout":"1s","half_open_probes":1,"shared":true}"#,
    );
    let inst = start_instances(&cfg, 3);
    bad.set_status(Some(500));
    let rt = actix::System::new();
    // A alone trips the bad node (round robin: every other task).
    let rs: Vec<TaskResult> = rt.block_on(futures::future::join_all(submit_many(&inst[0].d, 12)));
    assert_eq!(rs.len(), 12);
    let trip = Instant::now();
    assert!(
        bad.hits() >= 3,
        "A reached the bad node {} times",
        bad.hits()
    );
    // One refresh interval (100 ms) and a margin for a busy machine.
    thread::sleep(Duration::from_millis(250));
    let before = bad.hits();
    for i in &inst[1..] {
        let rs = rt.block_on(futures::future::join_all(submit_many(&i.d, 20)));
        assert!(
            rs.iter().all(|r| r.is_success()),
            "B and C use the good node"
        );
    }
    assert_eq!(
        bad.hits(),
        before,
        "B and C sent nothing to the tripped node"
    );

    // Half-open (1 s after the trip): every instance keeps sending; exactly
    // one probe reaches the node (it fails: open again for 2 s).
    let until = trip + Duration::from_millis(2_600);
    let mut sent = 0;
    while Instant::now() < until && sent < 1_000 {
        for i in &inst {
            drop(rt.block_on(i.d.submit(Task::get("svc", "/p"))));
        }
        sent += 1;
        thread::sleep(Duration::from_millis(20));
    }
    let probes = bad
        .hit_times()
        .into_iter()
        .filter(|t| *t > trip + Duration::from_millis(500))
        .count();
    assert_eq!(probes, 1, "one probe across the three instances");

    // Healthy again: the next probe (after the doubled open time) succeeds
    // and the node is closed for every instance.
    bad.set_status(None);
    let until = trip + Duration::from_millis(5_500);
    let mut sent = 0;
    while Instant::now() < until && sent < 2_000 {
        for i in &inst {
            drop(rt.block_on(i.d.submit(Task::get("svc", "/p"))));
        }
        sent += 1;
        thread::sleep(Duration::from_millis(20));
    }
    let after = bad.hits() - before;
    assert!(
        after >= 10,
        "the node serves again after a good probe ({after} hits)"
    );
}

// === Redis paused ===

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

/// `quorum: 2`: one instance's trip stays its own; the second report shares
/// it, and the third instance stops sending.
#[test]
fn a_trip_is_shared_only_once_the_quorum_reports_it() {
    let Some(srv) = redis_server() else {
        return;
    };
    let good = Backend::start();
    let bad = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"q","timeout":"200ms""#,
        &[&good, &bad],
        r#""balancer":{"refresh_interval":"100ms"},
           "retry":{"max_retries":0},
           "breaker":{"consecutive_failures":3,"open_for":"3s","shared":true,"quorum":2}"#,
    );
    let inst = start_instances(&cfg, 3);
    bad.set_status(Some(500));
    let rt = actix::System::new();
    let send = |i: usize, n: usize| {
        let rs = rt.block_on(futures::future::join_all(submit_many(&inst[i].d, n)));
        assert_eq!(rs.len(), n);
    };
    // A trips alone: below quorum, B still reaches the node (and trips).
    send(0, 12);
    thread::sleep(Duration::from_millis(250));
    let after_a = bad.hits();
    send(1, 12);
    assert!(bad.hits() >= after_a + 3, "one report is not a quorum");
    // Two reports: shared; C stays off the node from its next refresh.
    thread::sleep(Duration::from_millis(250));
    let after_b = bad.hits();
    send(2, 20);
    assert_eq!(bad.hits(), after_b, "the quorum's trip holds for C");
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

// === on_limit: reject with shared buckets ===

/// `on_limit: reject` with a shared service bucket: a burst over the limit
/// from two instances is answered at once, the tasks over it
/// `Rejected(RateLimited)` with a retry-after, as with local buckets.
#[test]
fn on_limit_reject_with_a_shared_service_bucket() {
    on_limit_reject(
        r#""rate_limit":{"service":{"rate":20,"burst":5},"shared":true,"on_limit":"reject"}"#,
        "lease",
    );
    on_limit_reject(
        r#""rate_limit":{"service":{"rate":20,"burst":5},"shared":true,"on_limit":"reject"}"#,
        "exact",
    );
}

/// The same with shared per-node buckets (one backend: its bucket binds).
#[test]
fn on_limit_reject_with_shared_node_buckets() {
    on_limit_reject(
        r#""rate_limit":{"per_node":{"rate":20,"burst":5},"shared":true,"on_limit":"reject"}"#,
        "lease",
    );
}

/// Two instances, 400 tasks in waves over about 1 s against 20/s, burst
/// 5: every task is answered once, within 20 s (waiting for tokens would
/// take 20 s); the admitted ones within burst + rate·T (+ one lease per
/// instance, and a margin); the others `RateLimited` with a retry-after.
fn on_limit_reject(rate_limit: &str, mode: &str) {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        &format!(r#""prefix":"reject-{mode}","timeout":"1s","mode":"{mode}","lease":"100ms""#),
        &[&backend],
        &format!(r#"{rate_limit},"queue":{{"capacity":2000}}"#),
    );
    let inst = start_instances(&cfg, 2);
    let rt = actix::System::new();
    let t0 = Instant::now();
    let mut all = [Vec::new(), Vec::new()];
    for _ in 0..20 {
        for (k, i) in inst.iter().enumerate() {
            all[k].extend(submit_many(&i.d, 10));
        }
        thread::sleep(Duration::from_millis(50));
    }
    let per_instance: Vec<Vec<TaskResult>> = rt.block_on(async {
        let all = all.map(futures::future::join_all);
        tokio::time::timeout(Duration::from_secs(15), futures::future::join_all(all))
            .await
            .expect("every task answered, none waits for tokens")
    });
    let elapsed = t0.elapsed();
    let hits = backend.hits();
    drop(inst);
    for rs in &per_instance {
        let ids: std::collections::HashSet<_> = rs.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 200, "every task answered once");
    }
    let rs: Vec<TaskResult> = per_instance.into_iter().flatten().collect();
    let admitted = rs.iter().filter(|r| r.is_success()).count() as u64;
    let mut retry_after = Vec::new();
    for r in &rs {
        match r.rejection() {
            None => assert!(r.is_success(), "{:?}", r.outcome),
            Some(actix_dispatch::Rejection::RateLimited { retry_after: t }) => retry_after.push(*t),
            Some(other) => panic!("{other:?}"),
        }
    }
    let bound = 5 + (20.0 * elapsed.as_secs_f64()).ceil() as u64 + 2 * 2;
    eprintln!(
        "{mode}: {admitted} admitted of 400 in {elapsed:?} (bound {bound}), {} rejected, \
         retry-after up to {:?}",
        retry_after.len(),
        retry_after.iter().max()
    );
    assert_eq!(admitted, hits, "each admitted task sent once");
    assert!(admitted <= bound + 5, "{admitted} > {bound} + 5");
    assert!(admitted >= 5, "the burst at least: {admitted}");
    assert!(retry_after.len() >= 200, "rejected: {}", retry_after.len());
    assert!(
        retry_after.iter().any(|t| !t.is_zero()),
        "a retry-after is given"
    );
}

// === stats ===

/// A node's `tokens` in `stats()` are the shared tokens this instance
/// holds for it when its bucket is shared: none before a task asked (the
/// local bucket beside it would show its full burst), a lease's rest after.
#[test]
fn node_stats_show_the_shared_tokens_held() {
    let Some(srv) = redis_server() else {
        return;
    };
    let backend = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"shown","timeout":"1s","mode":"lease","lease":"30s""#,
        &[&backend],
        r#""rate_limit":{"per_node":{"rate":10,"burst":10},"shared":true}"#,
    );
    let a = start_instance(cfg);
    let rt = actix::System::new();
    let tokens = |d: &Dispatcher| rt.block_on(d.stats()).services[0].nodes[0].tokens;
    assert_eq!(tokens(&a.d), Some(0), "none held before a task");
    let r = rt.block_on(a.d.submit(Task::get("svc", "/one")));
    assert!(r.is_success(), "{:?}", r.outcome);
    // A lease of rate · lease (at most the burst, 10) was taken for it.
    let held = tokens(&a.d).expect("shared tokens shown");
    assert!((1..=9).contains(&held), "the lease's rest: {held}");
}
