//! Enqueueing and consuming in process, the consumer set by the config
//! file's `redis.stream`, and the CLI's `enqueue`.

use std::collections::{HashMap, HashSet};
#[cfg(feature = "cli")]
use std::process::Command;
use std::time::Duration;

use actix_dispatch::redis::stream::{StreamConfig, StreamStats};
use actix_dispatch::{Config, Dispatcher};

use super::helpers::{
    add_tasks, add_tasks_from, con, load_config, results, start_consuming, temp_dir, KeyedBackend,
};
#[cfg(feature = "cli")]
use super::helpers::{entries, write_config};
use crate::redis_server::{stream_until, RedisServer};

#[test]
fn enqueue_durable_consume_and_stats_in_process() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("inproc");
    let cfg = load_config(&dir, &server.url(), backend.port, 100);
    let stats = actix::System::new().block_on(async move {
        let d = Dispatcher::start(cfg).expect("start");
        for i in 0..20 {
            // The service named in another case reaches `svc`'s stream.
            let line = format!(r#"{{"id":"t{i}","service":"SVC","path":"/ok"}}"#);
            let line = actix_dispatch::codec::TaskLine::parse(&line).expect("line");
            d.enqueue_durable(&line).await.expect("enqueue");
        }
        let mut sc = StreamConfig::named("in-process");
        sc.claim_every = Some(Duration::from_millis(100));
        d.consume(sc).await.expect("consume");
        let done = |st: &StreamStats| st.recorded == 20 && st.pending == 0 && st.lag == 0;
        let last = stream_until(&d, Duration::from_secs(10), done)
            .await
            .filter(done);
        d.shutdown(Duration::from_secs(1)).await;
        last
    });
    let st = stats.expect("20 recorded, nothing pending or lagging, within 10 s");
    assert_eq!(
        (st.read, st.claimed, st.dead_lettered, st.duplicates),
        (20, 0, 0, 0)
    );
    let mut c = con(&server.url());
    let mut ids: Vec<String> = results(&mut c).into_iter().map(|(_, id)| id).collect();
    ids.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    want.sort();
    assert_eq!(ids, want);
    // Every call carried its entry id as the idempotency key.
    let entries: HashSet<String> = results(&mut c).into_iter().map(|(e, _)| e).collect();
    let keys: HashSet<String> = backend.calls().into_keys().collect();
    assert_eq!(keys, entries);
    let _ = std::fs::remove_dir_all(dir);
}

/// The consumer named and tuned by the config file's `redis.stream`
/// object: `consume_configured` reads in its group, as its consumer, only
/// its services, without an idempotency header (`null`).
#[test]
fn consume_configured_takes_the_config_files_stream_settings() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("configured");
    let json = format!(
        r#"{{"redis":{{"url":"{url}","prefix":"t","timeout":"1s",
              "stream":{{"consumer":"from-config","group":"cfg-group","services":["SVC"],
                "claim_after":"5s","claim_every":"100ms","max_deliveries":2,
                "idempotency_header":null,"block":"50ms","done_ttl":"1h","max_in_flight":4}}}},
            "services":[{{"name":"svc","mode":"round_robin","timeout":"1s",
              "endpoints":[{{"address":"http://127.0.0.1:{port}/"}}],"retry":{{"max_retries":0}}}},
              {{"name":"other","endpoints":[{{"address":"http://127.0.0.1:{port}/"}}]}}]}}"#,
        url = server.url(),
        port = backend.port,
    );
    let path = dir.join("cfg.json");
    std::fs::write(&path, json).expect("write config");
    let cfg = Config::from_file(&path).expect("config");
    let sc = cfg.redis.as_ref().expect("redis").stream_config();
    assert_eq!(
        (sc.consumer.as_str(), sc.group.as_str(), sc.max_in_flight),
        ("from-config", "cfg-group", Some(4))
    );
    let mut c = con(&server.url());
    add_tasks(&mut c, "/ok", 20);
    let stats = actix::System::new().block_on(async move {
        let d = Dispatcher::start(cfg).expect("start");
        d.consume_configured().await.expect("consume");
        let start = tokio::time::Instant::now();
        let mut last = None;
        while start.elapsed() < Duration::from_secs(10) {
            let s = d.stats().await;
            let st = s.service("svc").and_then(|s| s.stream.clone());
            if st
                .as_ref()
                .is_some_and(|st| st.recorded == 20 && st.pending == 0)
            {
                last = st;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Only the listed service is consumed.
        let other = d
            .stats()
            .await
            .service("other")
            .and_then(|s| s.stream.clone());
        d.shutdown(Duration::from_secs(1)).await;
        assert!(other.is_none(), "{other:?}");
        last
    });
    let st = stats.expect("20 recorded, nothing pending, within 10 s");
    assert_eq!((st.read, st.dead_lettered, st.duplicates), (20, 0, 0));
    assert_eq!(results(&mut c).len(), 20);
    // The group and consumer are the file's.
    let consumers: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg("t:{svc}:tasks")
        .arg("cfg-group")
        .query(&mut c)
        .expect("xinfo consumers");
    let names: Vec<String> = consumers
        .into_iter()
        .map(|m| redis::from_redis_value(m["name"].clone()).expect("name"))
        .collect();
    assert_eq!(names, ["from-config"]);
    // `idempotency_header: null`: no call carried one.
    assert_eq!(backend.calls(), HashMap::from([("none".to_owned(), 20)]));
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "cli")]
#[test]
fn the_cli_enqueue_adds_task_lines_and_reports_bad_ones() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let dir = temp_dir("cli");
    let cfg = write_config(&dir, &server.url(), 9, 10);
    let tasks = dir.join("tasks.jsonl");
    std::fs::write(
        &tasks,
        "{\"id\":1,\"service\":\"svc\",\"path\":\"/a\"}\nnot json\n\
         {\"id\":2,\"service\":\"svc\",\"path\":\"/b\"}\n{\"service\":\"nope\",\"path\":\"/\"}\n",
    )
    .expect("tasks");
    let out = Command::new(env!("CARGO_BIN_EXE_actix-dispatch"))
        .arg("enqueue")
        .arg("--config")
        .arg(&cfg)
        .arg("--tasks")
        .arg(&tasks)
        .output()
        .expect("run enqueue");
    assert_eq!(out.status.code(), Some(1), "some lines were not tasks");
    let ids = String::from_utf8_lossy(&out.stdout);
    assert_eq!(ids.lines().count(), 2, "{ids}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("unknown service"),
        "{err}"
    );
    let mut c = con(&server.url());
    let entries = entries(&mut c, "t:{svc}:tasks");
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0].1["task"],
        r#"{"id":1,"service":"svc","path":"/a"}"#
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Redis drops every client connection mid-run (as a restart or a
/// proxy's failover does): the consumer's connections come back by
/// themselves, and what is added after is consumed and recorded too.
#[test]
fn the_consumer_resumes_after_redis_drops_its_connections() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("dropped");
    let cfg = load_config(&dir, &server.url(), backend.port, 100);
    let url = server.url();
    let recorded = actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("dropped");
        sc.claim_every = Some(Duration::from_millis(100));
        sc.block = Duration::from_millis(100);
        let d = start_consuming(cfg, sc).await;
        let recorded = |d: Dispatcher| async move {
            let s = d.stats().await;
            s.service("svc")
                .and_then(|s| s.stream.clone())
                .map_or(0, |st| st.recorded)
        };
        let until = |want: u64| {
            let d = d.clone();
            async move {
                for _ in 0..400 {
                    if recorded(d.clone()).await >= want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                recorded(d).await
            }
        };
        let mut c = con(&url);
        add_tasks(&mut c, "/ok", 10);
        assert_eq!(until(10).await, 10, "the first ten recorded");
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut c)
            .expect("client kill");
        assert!(killed >= 2, "the consumer's connections dropped: {killed}");
        add_tasks_from(&mut c, "/ok", 10..20);
        let n = until(20).await;
        d.shutdown(Duration::from_secs(1)).await;
        n
    });
    assert_eq!(recorded, 20, "the reader and the recorder came back");
    let mut c = con(&server.url());
    let mut ids: Vec<usize> = results(&mut c)
        .into_iter()
        .map(|(_, id)| id.parse().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..20).collect::<Vec<_>>(), "each recorded once");
    let _ = std::fs::remove_dir_all(dir);
}
