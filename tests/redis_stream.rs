//! The durable task stream on a real redis-server (feature `redis`):
//! instances are `actix-dispatch-worker` processes, one is `kill -9`ed.
//!
//! The backend is an actix-web server on loopback that counts calls per
//! `Idempotency-Key` (the stream entry id), so the test sees exactly which
//! tasks reached a backend twice.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::redis::stream::StreamConfig;
use actix_dispatch::{Config, Dispatcher};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use redis_server::RedisServer;

const WORKER: &str = env!("CARGO_BIN_EXE_actix-dispatch-worker");

type Calls = Arc<Mutex<HashMap<String, u32>>>;

/// A backend counting calls per idempotency key; `/fail` answers 500,
/// `/slow` after 100 ms.
struct KeyedBackend {
    port: u16,
    calls: Calls,
    handle: actix_web::dev::ServerHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl KeyedBackend {
    fn start() -> KeyedBackend {
        let calls: Calls = Arc::default();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (tx, rx) = std::sync::mpsc::channel();
        let c = calls.clone();
        let thread = thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || {
                    let c = c.clone();
                    App::new().default_service(web::to(move |req: HttpRequest| {
                        let c = c.clone();
                        async move {
                            let key = req
                                .headers()
                                .get("idempotency-key")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("none")
                                .to_owned();
                            *c.lock().unwrap().entry(key).or_insert(0) += 1;
                            if req.path() == "/slow" {
                                actix_web::rt::time::sleep(Duration::from_millis(100)).await;
                            }
                            if req.path() == "/fail" {
                                HttpResponse::InternalServerError().body("down")
                            } else {
                                HttpResponse::Ok().body("ok")
                            }
                        }
                    }))
                })
                .workers(1)
                .listen(listener)
                .expect("listen")
                .run();
                tx.send(server.handle()).expect("send");
                let _ = server.await;
            });
        });
        let handle = rx.recv_timeout(Duration::from_secs(5)).expect("backend up");
        KeyedBackend {
            port,
            calls,
            handle,
            thread: Some(thread),
        }
    }

    fn calls(&self) -> HashMap<String, u32> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for KeyedBackend {
    fn drop(&mut self) {
        let h = self.handle.clone();
        actix_web::rt::System::new().block_on(h.stop(false));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A worker process; killed (`kill -9`) on drop unless stopped.
struct Worker(Option<Child>);

impl Worker {
    fn spawn(cfg: &std::path::Path, name: &str, extra: &[&str]) -> Worker {
        let child = Command::new(WORKER)
            .arg("--config")
            .arg(cfg)
            .args(["--consumer", name, "--grace", "2s"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker");
        Worker(Some(child))
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Closes stdin (graceful stop) and returns the stats line.
    fn stop(&mut self) -> serde_json::Value {
        let mut c = self.0.take().expect("running");
        drop(c.stdin.take());
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if c.try_wait().expect("wait").is_some() {
                let mut out = String::new();
                c.stdout
                    .take()
                    .expect("stdout")
                    .read_to_string(&mut out)
                    .expect("read");
                return serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null);
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        panic!("worker did not stop within 15 s");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn write_config(
    dir: &std::path::Path,
    redis: &str,
    port: u16,
    capacity: usize,
) -> std::path::PathBuf {
    write_config_with(dir, redis, port, capacity, "")
}

/// The config with `extra` (`,"key":value`) added to the service.
fn write_config_with(
    dir: &std::path::Path,
    redis: &str,
    port: u16,
    capacity: usize,
    extra: &str,
) -> std::path::PathBuf {
    let json = format!(
        r#"{{"redis":{{"url":"{redis}","prefix":"t","timeout":"1s"}},
            "services":[{{"name":"svc","mode":"round_robin","timeout":"1s",
              "endpoints":[{{"address":"http://127.0.0.1:{port}/","max_concurrent":64}}],
              "retry":{{"max_retries":0}},
              "queue":{{"capacity":{capacity}}}{extra}}}]}}"#
    );
    let p = dir.join("cfg.json");
    std::fs::write(&p, json).expect("write config");
    p
}

/// The config written by [`write_config`], read back as the worker reads it.
fn load_config(dir: &std::path::Path, redis: &str, port: u16, capacity: usize) -> Config {
    let path = write_config(dir, redis, port, capacity);
    Config::from_file(&path).expect("config")
}

/// An instance on the current System, consuming the stream as `sc` says.
async fn start_consuming(cfg: Config, sc: StreamConfig) -> Dispatcher {
    let d = Dispatcher::start(cfg).expect("start");
    d.consume(sc).await.expect("consume");
    d
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ad-stream-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn con(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("client")
        .get_connection()
        .expect("connect")
}

fn add_tasks(c: &mut redis::Connection, path: &str, n: usize) {
    add_tasks_from(c, path, 0..n);
}

/// Adds tasks with the ids of `ids`.
fn add_tasks_from(c: &mut redis::Connection, path: &str, ids: std::ops::Range<usize>) {
    for chunk in ids.collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let line = format!(r#"{{"id":{i},"service":"svc","path":"{path}"}}"#);
            pipe.cmd("XADD")
                .arg("t:{svc}:tasks")
                .arg("*")
                .arg("task")
                .arg(line)
                .ignore();
        }
        pipe.exec(c).expect("xadd");
    }
}

fn xlen(c: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("XLEN").arg(key).query(c).expect("xlen")
}

/// Every entry of the stream `key` (`XRANGE key - +`): id and fields.
fn entries(c: &mut redis::Connection, key: &str) -> Vec<(String, HashMap<String, String>)> {
    let raw: redis::Value = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(c)
        .expect("xrange");
    redis::from_redis_value(raw).expect("entries")
}

/// The entries of the task stream delivered to `consumer` and not
/// acknowledged, at most `count` (`XPENDING` in its extended form).
fn pending_at(
    c: &mut redis::Connection,
    consumer: &str,
    count: usize,
) -> redis::RedisResult<Vec<(String, String, u64, u64)>> {
    redis::cmd("XPENDING")
        .arg("t:{svc}:tasks")
        .arg("dispatch")
        .arg("-")
        .arg("+")
        .arg(count)
        .arg(consumer)
        .query(c)
}

/// `(entry, task id)` of every result.
fn results(c: &mut redis::Connection) -> Vec<(String, String)> {
    entries(c, "t:{svc}:results")
        .into_iter()
        .map(|(_, f)| (f["entry"].clone(), f["id"].clone()))
        .collect()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return;
        }
        thread::sleep(Duration::from_millis(25));
    }
    panic!("{what}: not within {limit:?}");
}

#[test]
fn ten_thousand_tasks_three_instances_one_killed_every_result_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("kill");
    let cfg = write_config(&dir, &server.url(), backend.port, 200);
    let mut c = con(&server.url());
    const N: usize = 10_000;
    add_tasks(&mut c, "/ok", N);
    let started = Instant::now();
    // claim_after far above a task's time here (milliseconds), so that only
    // the killed instance's entries are claimed, even on a busy machine.
    let fast = ["--claim-after", "2s", "--claim-every", "100ms"];
    let mut w1 = Worker::spawn(&cfg, "w1", &fast);
    let mut w2 = Worker::spawn(&cfg, "w2", &fast);
    let mut w3 = Worker::spawn(&cfg, "w3", &fast);

    wait_until("a quarter of the results", Duration::from_secs(60), || {
        xlen(&mut c, "t:{svc}:results") >= N / 4
    });
    w2.kill9();
    // The killed instance's unfinished entries, as the group sees them.
    let pending = pending_at(&mut c, "w2", N).expect("xpending");
    let orphans: HashSet<String> = pending.into_iter().map(|p| p.0).collect();
    let killed_at = xlen(&mut c, "t:{svc}:results");
    // The others claim them after claim_after; then the killed one comes
    // back under its name and takes part again.
    wait_until("the orphans claimed", Duration::from_secs(30), || {
        let p = pending_at(&mut c, "w2", N).expect("xpending");
        p.is_empty()
    });
    let mut w2 = Worker::spawn(&cfg, "w2", &fast);

    wait_until("every result", Duration::from_secs(120), || {
        xlen(&mut c, "t:{svc}:results") >= N
    });
    let took = started.elapsed();
    // The restarted instance resumes alone: the others stop, more tasks
    // come, and it runs them all.
    let s1 = w1.stop();
    let s3 = w3.stop();
    const MORE: usize = 1_000;
    add_tasks_from(&mut c, "/ok", N..N + MORE);
    wait_until(
        "the restarted instance's results",
        Duration::from_secs(60),
        || xlen(&mut c, "t:{svc}:results") >= N + MORE,
    );
    // Let late duplicates (if any) land before counting.
    thread::sleep(Duration::from_millis(300));
    let s2 = w2.stop();
    const N_ALL: usize = N + MORE;

    let res = results(&mut c);
    let mut ids: HashMap<String, u32> = HashMap::new();
    for (_, id) in &res {
        *ids.entry(id.clone()).or_default() += 1;
    }
    assert_eq!(res.len(), N_ALL, "one result per task");
    assert_eq!(ids.len(), N_ALL, "every task id present");
    assert!(ids.values().all(|n| *n == 1), "no id twice");
    for i in 0..N_ALL {
        assert!(ids.contains_key(&i.to_string()), "task {i} missing");
    }
    assert_eq!(
        xlen(&mut c, "t:{svc}:tasks"),
        0,
        "every entry acked and deleted"
    );
    assert_eq!(xlen(&mut c, "t:{svc}:dead"), 0);

    let calls = backend.calls();
    let repeated: Vec<(&String, &u32)> = calls.iter().filter(|(_, n)| **n > 1).collect();
    let extra: u32 = repeated.iter().map(|(_, n)| **n - 1).sum();
    for (key, _) in &repeated {
        assert!(
            orphans.contains(*key),
            "entry {key} was called twice but was not the killed instance's"
        );
    }
    assert_eq!(calls.len(), N_ALL, "every task reached the backend");
    let stream =
        |s: &serde_json::Value, k: &str| s["services"][0]["stream"][k].as_u64().unwrap_or(0);
    let claimed = stream(&s1, "claimed") + stream(&s3, "claimed") + stream(&s2, "claimed");
    assert!(
        stream(&s2, "recorded") >= MORE as u64,
        "the restarted instance took part"
    );
    eprintln!(
        "stream: {N} tasks in {took:?}; killed w2 at {killed_at} results with {} pending; \
         {} tasks called twice ({extra} extra calls), {claimed} claimed; \
         results by w1/w2(restarted, then {MORE} more alone)/w3: {}/{}/{}",
        orphans.len(),
        repeated.len(),
        stream(&s1, "recorded"),
        stream(&s2, "recorded"),
        stream(&s3, "recorded"),
    );
    assert!(
        claimed as usize >= orphans.len(),
        "the orphans were claimed"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_restarted_instance_resumes_its_own_pending_entries() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("resume");
    // A backend that is down at first: the worker reads the entries, its
    // attempts fail to connect, and it is killed with them pending.
    let dead_port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let cfg_down = write_config(&dir, &server.url(), dead_port, 50);
    let mut c = con(&server.url());
    add_tasks(&mut c, "/ok", 50);
    // claim_after is long: only the instance's own re-read can resume them.
    let slow = ["--claim-after", "60s", "--max-deliveries", "9"];
    let mut w = Worker::spawn(&cfg_down, "w1", &slow);
    wait_until("entries pending at w1", Duration::from_secs(10), || {
        let v = pending_at(&mut c, "w1", 100).unwrap_or_default();
        v.len() == 50
    });
    w.kill9();
    let cfg = write_config(&dir, &server.url(), backend.port, 50);
    let mut w = Worker::spawn(&cfg, "w1", &slow);
    wait_until("results after the restart", Duration::from_secs(20), || {
        xlen(&mut c, "t:{svc}:results") == 50
    });
    let stats = w.stop();
    assert_eq!(stats["services"][0]["stream"]["recorded"], 50);
    assert_eq!(results(&mut c).len(), 50);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_backend_that_always_fails_sends_its_tasks_to_the_dead_letters() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("dead");
    // Without the breaker every delivery reaches the backend (an open
    // breaker would fail a delivery without a call).
    let no_breaker = r#","breaker":{"enabled":false}"#;
    let cfg = write_config_with(&dir, &server.url(), backend.port, 100, no_breaker);
    let mut c = con(&server.url());
    const N: usize = 20;
    add_tasks(&mut c, "/fail", N);
    let args = [
        "--claim-after",
        "300ms",
        "--claim-every",
        "100ms",
        "--max-deliveries",
        "3",
    ];
    let mut w1 = Worker::spawn(&cfg, "w1", &args);
    let mut w2 = Worker::spawn(&cfg, "w2", &args);
    wait_until("every task dead-lettered", Duration::from_secs(20), || {
        xlen(&mut c, "t:{svc}:dead") >= N
    });
    thread::sleep(Duration::from_millis(200));
    let _ = (w1.stop(), w2.stop());
    assert_eq!(xlen(&mut c, "t:{svc}:dead"), N);
    assert_eq!(xlen(&mut c, "t:{svc}:results"), 0);
    assert_eq!(xlen(&mut c, "t:{svc}:tasks"), 0);
    let dead = entries(&mut c, "t:{svc}:dead");
    for (_, f) in &dead {
        assert_eq!(f["deliveries"], "3", "{f:?}");
        assert!(f["error"].contains("500"), "{f:?}");
        assert!(f["task"].contains(r#""path":"/fail""#), "{f:?}");
    }
    // No retries inside the engine: one call per delivery.
    let calls = backend.calls();
    assert_eq!(calls.len(), N);
    assert!(calls.values().all(|n| *n == 3), "{calls:?}");
    let _ = std::fs::remove_dir_all(dir);
}

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
        let sc = StreamConfig {
            consumer: "in-process".into(),
            claim_every: Some(Duration::from_millis(100)),
            ..Default::default()
        };
        d.consume(sc).await.expect("consume");
        let start = tokio::time::Instant::now();
        let mut last = None;
        while start.elapsed() < Duration::from_secs(10) {
            let s = d.stats().await;
            let st = s.service("svc").and_then(|s| s.stream.clone());
            if st
                .as_ref()
                .is_some_and(|st| st.recorded == 20 && st.pending == 0 && st.lag == 0)
            {
                last = st;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

// === shutdown ===

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
        let sc = StreamConfig {
            consumer: "leaving".into(),
            ..Default::default()
        };
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
        let sc = StreamConfig {
            consumer: "taking-over".into(),
            claim_after: Some(Duration::from_millis(100)),
            claim_every: Some(Duration::from_millis(100)),
            ..Default::default()
        };
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
