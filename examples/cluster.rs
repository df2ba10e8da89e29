//! Three instances sharing one rate limit through Redis:
//! `cargo run --example cluster --features redis`.
//!
//! Starts one actix-web backend on 127.0.0.1 that counts what it receives,
//! and three engine instances, each on its own thread and actix System (as
//! three replicas of an application would be), all with the service limit
//! 50/s, burst 10, `shared: true`, through the redis-server at `REDIS_URL`
//! (default `redis://127.0.0.1:6379/0`; start one with
//! `redis-server --save '' --appendonly no`). Each instance submits 300
//! tasks at once; after 3 s the example prints each instance's admissions
//! and the total the backend saw against `burst + rate·T` (+ the lease
//! bound `rate·lease`). `MODE=exact` uses exact admissions; `LIMIT=node`
//! shares the same limit as a per-node bucket (`rate_limit.per_node`)
//! instead of the service's.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Task};
use actix_web::{web, App, HttpResponse, HttpServer};

const RATE: f64 = 50.0;
const BURST: u64 = 10;
const RUN: Duration = Duration::from_secs(3);

fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let mode = std::env::var("MODE").unwrap_or_else(|_| "lease".into());
    let bucket = match std::env::var("LIMIT").as_deref() {
        Ok("node") => "per_node",
        _ => "service",
    };
    let hostport = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:6379")
        .to_string();
    if TcpStream::connect_timeout(
        &hostport.parse().unwrap_or(([127, 0, 0, 1], 6379).into()),
        Duration::from_secs(1),
    )
    .is_err()
    {
        eprintln!(
            "no redis-server reachable at {url}: start one (`redis-server --save '' \
             --appendonly no`) or set REDIS_URL"
        );
        std::process::exit(2);
    }

    // The backend: counts hits, answers 200.
    let hits = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let h = hits.clone();
    thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let h = web::Data::new(h);
            let server = HttpServer::new(move || {
                App::new().app_data(h.clone()).default_service(web::to(
                    |h: web::Data<Arc<AtomicU64>>| async move {
                        h.fetch_add(1, Ordering::Relaxed);
                        HttpResponse::Ok().body("ok")
                    },
                ))
            })
            .workers(1)
            .disable_signals()
            .bind(("127.0.0.1", 0))
            .expect("bind");
            tx.send(server.addrs()[0].port()).expect("port");
            server.run().await.expect("backend");
        });
    });
    let port = rx.recv().expect("backend up");
    let prefix = format!("cluster-{}", std::process::id());
    let json = format!(
        r#"{{"redis":{{"url":"{url}","prefix":"{prefix}","mode":"{mode}","lease":"100ms","timeout":"200ms"}},
            "services":[{{"name":"svc","endpoints":[{{"address":"http://127.0.0.1:{port}/"}}],
            "rate_limit":{{"{bucket}":{{"rate":{RATE},"burst":{BURST}}},"shared":true}}}}]}}"#
    );
    let cfg = Config::from_json(&json).expect("config");

    let instances: Vec<_> = (0..3)
        .map(|i| {
            let cfg = cfg.clone();
            thread::spawn(move || {
                actix_rt::System::new().block_on(async move {
                    let d = Dispatcher::start(cfg).expect("start");
                    actix_rt::time::sleep(Duration::from_millis(300)).await;
                    let tasks = (0..300).map(|k| d.submit(Task::get("svc", format!("/{i}/{k}"))));
                    let all = futures::future::join_all(tasks);
                    let done = actix_rt::time::timeout(RUN, all).await;
                    let admitted = d.stats().await.services[0].queue.succeeded;
                    let shared = d.stats().await.shared;
                    d.shutdown(Duration::ZERO).await;
                    drop(done);
                    (admitted, shared)
                })
            })
        })
        .collect();
    let mut total = 0;
    let mut failures = 0;
    for (i, t) in instances.into_iter().enumerate() {
        let (n, shared) = t.join().expect("instance");
        total += n;
        failures += shared.as_ref().map_or(0, |s| s.failures);
        println!("instance {i}: {n} admitted; redis: {shared:?}");
    }
    if failures > 0 {
        // `on_down: local` admitted beside the shared limit meanwhile.
        println!("{failures} calls to Redis failed or timed out: the local fallback applied");
    }
    let seen = hits.load(Ordering::Relaxed);
    let bound = BURST as f64 + RATE * RUN.as_secs_f64();
    let lease = if mode == "lease" { RATE * 0.1 } else { 0.0 };
    println!(
        "total: {total} answered, backend saw {seen}; limit burst + rate·T = {bound}, \
         + lease bound {lease} ({mode} mode, {bucket} bucket)"
    );
}
