//! Redis as operators lock it down, against real redis-servers the tests
//! start (feature `redis`): an ACL user limited to `~prefix:*` runs every
//! call (every key is under the prefix); a `redis://` URL naming a Cluster
//! node without `redis.cluster: true` is one configuration error naming
//! the setting; membership scores in the future do not count as live.
//!
//! The logs are captured (`support::logs`); each test uses its own prefix.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Task};

use redis_server::{with_instance, RedisCluster, RedisServer};
use support::{logs, Backend};

fn config(url: &str, redis_extra: &str, svc: &str, backend: &Backend) -> Config {
    let json = format!(
        r#"{{"redis":{{"url":"{url}"{redis_extra}}},
            "services":[{{"name":"{svc}","mode":"round_robin",
              "endpoints":[{{"address":"{}","max_concurrent":20}}],
              "rate_limit":{{"service":{{"rate":1000,"burst":50}},"shared":true}},
              "breaker":{{"shared":true}}}}]}}"#,
        backend.url()
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

async fn run_tasks(d: &Dispatcher, svc: &str, n: usize) -> usize {
    let subs: Vec<_> = (0..n)
        .map(|i| d.submit(Task::get(svc, format!("/t/{i}"))))
        .collect();
    let all = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(subs))
        .await
        .expect("no task stuck");
    all.iter().filter(|r| r.is_success()).count()
}

/// `ACL SETUSER limited on >pw ~lk:* +@all`: the user may touch keys under
/// `lk:` only. Heartbeats, shared buckets and breaker reads all answer (no
/// scope down), the live count is read, and the membership set is under
/// the prefix. Before, the membership key was `{lk}:members`: every
/// heartbeat failed `NOPERM` and the instance ran as if Redis were down.
#[test]
fn an_acl_user_limited_to_the_prefix_runs_every_call() {
    logs::capture();
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let out = srv.cli(&["ACL", "SETUSER", "limited", "on", ">pw", "~lk:*", "+@all"]);
    assert!(out.contains("OK"), "{out}");
    let backend = Backend::start();
    let url = format!("redis://limited:pw@127.0.0.1:{}/0", srv.port());
    let cfg = config(
        &url,
        r#","prefix":"lk","timeout":"1s","heartbeat":"100ms""#,
        "svc",
        &backend,
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    let (ok, shared, checked) = with_instance(cfg, move |d| {
        Box::pin(async move {
            let checked = actix_dispatch::redis::check(&redis_cfg).await;
            let ok = run_tasks(&d, "svc", 20).await;
            // Several heartbeats and breaker polls.
            tokio::time::sleep(Duration::from_millis(500)).await;
            (ok, d.stats().await.shared.expect("shared"), checked)
        })
    })
    .join()
    .expect("instance");
    assert!(checked.is_ok(), "{checked:?}");
    assert_eq!(ok, 20);
    assert!(!shared.down, "{shared:?}");
    assert!(shared.down_scopes.is_empty(), "{shared:?}");
    assert_eq!(shared.failures, 0, "{shared:?}");
    assert_eq!(shared.live_instances, 1, "{shared:?}");
    assert_eq!(srv.cli(&["TYPE", "lk:{members}"]).trim(), "zset");
    // No call was refused a key (the bucket keys expire once full again).
    assert_eq!(srv.cli(&["ACL", "LOG"]).trim(), "", "nothing refused");
    let lines = logs::lines();
    assert!(
        !lines.iter().any(|l| l.contains("NOPERM")),
        "no call refused: {lines:#?}"
    );
}

/// Members scored in the future (a foreign write, or a master whose clock
/// is behind the old one's) counted as live for ever and divided every
/// instance's fallback rate: now they are set to now, and expire.
#[test]
fn members_scored_in_the_future_do_not_count_as_live() {
    logs::capture();
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let key = actix_dispatch::redis::members_key("fut");
    let far = "99999999999999";
    for i in 0..50 {
        srv.cli(&["ZADD", &key, far, &format!("ghost-{i}")]);
    }
    let backend = Backend::start();
    let cfg = config(
        &srv.url(),
        r#","prefix":"fut","timeout":"1s","heartbeat":"50ms""#,
        "svc",
        &backend,
    );
    let live = with_instance(cfg, |d| {
        Box::pin(async move {
            // The ghosts are set to now at the first heartbeat and expire
            // three periods (150 ms) later.
            tokio::time::sleep(Duration::from_millis(800)).await;
            d.stats().await.shared.expect("shared").live_instances
        })
    })
    .join()
    .expect("instance");
    assert_eq!(live, 1);
    let lines = logs::lines();
    let named = lines
        .iter()
        .filter(|l| l.contains(&format!("{key:?}")) && l.contains("scored in the future"))
        .count();
    assert_eq!(named, 1, "{lines:#?}");
}

/// The first node of `cluster` that does not own `key`'s slot (it answers
/// `MOVED` for it), by its index.
fn node_without(cluster: &RedisCluster, keys: &[&str]) -> Option<usize> {
    (0..cluster.nodes.len()).find(|&i| {
        keys.iter()
            .all(|k| cluster.nodes[i].cli(&["EXISTS", k]).contains("MOVED"))
    })
}

/// A `redis://` URL naming a Cluster node, without `cluster: true`: the
/// calls to keys of other nodes' slots answer `MOVED`. `check` refuses
/// with an error naming `redis.cluster`, and the running instance says
/// so once at `error` (not once per call), naming the setting.
#[test]
fn a_cluster_node_without_cluster_true_is_one_configuration_error() {
    logs::capture();
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let members = actix_dispatch::redis::members_key("mv");
    // A service whose keys and the membership key are on other nodes
    // than the one the URL names.
    let (svc, node) = (0..50)
        .map(|i| format!("svc{i}"))
        .find_map(|svc| {
            let rl = format!("mv:{{{svc}}}:rl");
            node_without(&cluster, &[&members, &rl]).map(|n| (svc, n))
        })
        .expect("a service on another node");
    let url = format!("redis://127.0.0.1:{}/", cluster.nodes[node].port());
    let backend = Backend::start();
    let cfg = config(
        &url,
        r#","prefix":"mv","timeout":"1s","heartbeat":"50ms""#,
        &svc,
        &backend,
    );
    let redis_cfg = cfg.redis.clone().expect("redis");
    let svc2 = svc.clone();
    let (checked, ok) = with_instance(cfg, move |d| {
        Box::pin(async move {
            let checked = actix_dispatch::redis::check(&redis_cfg).await;
            let ok = run_tasks(&d, &svc2, 10).await;
            tokio::time::sleep(Duration::from_millis(400)).await;
            (checked, ok)
        })
    })
    .join()
    .expect("instance");
    let e = checked
        .expect_err("check refuses a Cluster node")
        .to_string();
    assert!(e.contains("`redis.cluster`"), "{e}");
    assert_eq!(ok, 10, "on_down local admits meanwhile");
    let lines = logs::lines();
    let told = lines
        .iter()
        .filter(|l| l.starts_with("ERROR") && l.contains("`redis.cluster`"))
        .count();
    assert_eq!(told, 1, "{lines:#?}");
}
