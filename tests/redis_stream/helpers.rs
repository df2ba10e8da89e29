//! Set-up shared by the other modules: the keyed backend, worker processes,
//! config files, and reads of the task, result and dead-letter streams.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::redis::stream::StreamConfig;
use actix_dispatch::{Config, Dispatcher};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

pub(crate) const WORKER: &str = env!("CARGO_BIN_EXE_actix-dispatch-worker");

type Calls = Arc<Mutex<HashMap<String, u32>>>;

/// A backend counting calls per idempotency key; `/fail` answers 500,
/// `/slow` after 100 ms.
pub(crate) struct KeyedBackend {
    pub(crate) port: u16,
    pub(crate) calls: Calls,
    handle: actix_web::dev::ServerHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl KeyedBackend {
    pub(crate) fn start() -> KeyedBackend {
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

    pub(crate) fn calls(&self) -> HashMap<String, u32> {
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
pub(crate) struct Worker(Option<Child>);

impl Worker {
    pub(crate) fn spawn(cfg: &std::path::Path, name: &str, extra: &[&str]) -> Worker {
        let child = Command::new(WORKER)
            .arg("--config")
            .arg(cfg)
            .args(["--consumer", name, "--grace", "2s"])
            .args(extra)
            // Its logs (env_logger) at warn, unless the run asks for more.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker");
        Worker(Some(child))
    }

    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Closes stdin (graceful stop) and returns the stats line.
    pub(crate) fn stop(&mut self) -> serde_json::Value {
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

pub(crate) fn write_config(
    dir: &std::path::Path,
    redis: &str,
    port: u16,
    capacity: usize,
) -> std::path::PathBuf {
    write_config_with(dir, redis, port, capacity, "")
}

/// The config with `extra` (`,"key":value`) added to the service.
pub(crate) fn write_config_with(
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
pub(crate) fn load_config(
    dir: &std::path::Path,
    redis: &str,
    port: u16,
    capacity: usize,
) -> Config {
    let path = write_config(dir, redis, port, capacity);
    Config::from_file(&path).expect("config")
}

/// An instance on the current System, consuming the stream as `sc` says.
pub(crate) async fn start_consuming(cfg: Config, sc: StreamConfig) -> Dispatcher {
    let d = Dispatcher::start(cfg).expect("start");
    d.consume(sc).await.expect("consume");
    d
}

pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ad-stream-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub(crate) fn con(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("client")
        .get_connection()
        .expect("connect")
}

pub(crate) fn add_tasks(c: &mut redis::Connection, path: &str, n: usize) {
    add_tasks_from(c, path, 0..n);
}

/// Adds tasks with the ids of `ids`.
pub(crate) fn add_tasks_from(c: &mut redis::Connection, path: &str, ids: std::ops::Range<usize>) {
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

pub(crate) fn xlen(c: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("XLEN").arg(key).query(c).expect("xlen")
}

/// Every entry of the stream `key` (`XRANGE key - +`): id and fields.
pub(crate) fn entries(
    c: &mut redis::Connection,
    key: &str,
) -> Vec<(String, HashMap<String, String>)> {
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
pub(crate) fn pending_at(
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
pub(crate) fn results(c: &mut redis::Connection) -> Vec<(String, String)> {
    entries(c, "t:{svc}:results")
        .into_iter()
        .map(|(_, f)| (f["entry"].clone(), f["id"].clone()))
        .collect()
}

pub(crate) fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return;
        }
        thread::sleep(Duration::from_millis(25));
    }
    panic!("{what}: not within {limit:?}");
}
