//! Shared service and per-node limits over several instances, `on_limit:
//! reject` with shared buckets, and the shared tokens shown in stats.

use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Dispatcher, Task, TaskResult};

use super::helpers::{
    config, redis_server, round_trips, start_instance, start_instances, submit_many,
};
use crate::support::Backend;

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
            Some(actix_dispatch::Rejection::RateLimited { retry_after: t, .. }) => {
                retry_after.push(*t)
            }
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
