//! `cluster`: the cost of a service limit shared through Redis (feature `redis`).
//!
//! One engine over 4 in-process nodes (no HTTP: the limit's own cost shows),
//! a service limit high enough never to bind (1 000 000/s, burst 10 000),
//! closed loop: the limit kept locally, then shared through a local
//! `redis-server` (started by the scenario on an ephemeral port) in `lease`
//! and in `exact` mode; then the same limit as per-node buckets shared
//! (each node's with the service's in one call). Reports throughput and
//! Redis round trips per task.
//! Without the `redis` feature or without `redis-server`, the scenario says
//! so and fails.

use crate::report::Report;
use crate::Cli;

#[cfg(not(feature = "redis"))]
pub async fn run(_cli: &Cli) -> Result<Report, String> {
    Err("the cluster scenario needs `--features redis`".into())
}

#[cfg(feature = "redis")]
pub async fn run(cli: &Cli) -> Result<Report, String> {
    imp::run(cli).await
}

#[cfg(feature = "redis")]
mod imp {
    use std::net::TcpListener;
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use actix_dispatch::{Config, Dispatcher};
    use serde_json::{json, Value};

    use crate::common::{self, count, pick};
    use crate::report::{table, Report};
    use crate::Cli;

    /// `redis-server` on a free port, killed on drop.
    struct Server(Child, u16);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn start_server() -> Result<Server, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server ({e}); apt-get install redis-server"))?;
        let s = Server(child, port);
        for _ in 0..250 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not start within 5 s".into())
    }

    /// `redis`: the port and mode when shared; `per_node`: node buckets
    /// too (then the service's and the nodes' are shared).
    fn config(redis: Option<(u16, &str)>, per_node: bool) -> Result<Config, String> {
        let endpoints: Vec<Value> = common::fake_urls(4)
            .iter()
            .map(|u| json!({"address": u, "max_concurrent": 1_000}))
            .collect();
        let bucket = json!({"rate": 1_000_000, "burst": 10_000});
        let mut limit = json!({"service": bucket, "shared": redis.is_some()});
        if per_node {
            limit["per_node"] = bucket;
        }
        let svc = json!({"name": "bench", "mode": "round_robin", "endpoints": endpoints,
            "rate_limit": limit,
            "queue": {"capacity": 100_000}});
        let text = match redis {
            Some((port, mode)) => json!({"redis": {"url": format!("redis://127.0.0.1:{port}/0"),
                "prefix": format!("bench-{mode}-{per_node}"), "mode": mode, "timeout": "200ms"},
                "services": [svc]}),
            None => json!({ "services": [svc] }),
        };
        Config::from_json(&text.to_string()).map_err(|e| format!("bench config refused: {e}"))
    }

    pub async fn run(cli: &Cli) -> Result<Report, String> {
        let n = pick(cli.tasks, cli.smoke, 500, 50_000);
        let max = Duration::from_secs_f64(pick(cli.duration, cli.smoke, 2.0, 20.0));
        let window = cli.concurrency;
        let server = start_server()?;
        let mut rows = Vec::new();
        let mut results = Vec::new();
        for (name, redis, per_node) in [
            ("local", None, false),
            ("shared, lease", Some((server.1, "lease")), false),
            ("shared, exact", Some((server.1, "exact")), false),
            ("local, per node", None, true),
            ("shared per node, lease", Some((server.1, "lease")), true),
            ("shared per node, exact", Some((server.1, "exact")), true),
        ] {
            let cfg = config(redis, per_node)?;
            let d = Dispatcher::builder(cfg)
                .transport(crate::immediate::immediate_factory())
                .start()
                .map_err(|e| e.to_string())?;
            actix_rt::time::sleep(Duration::from_millis(200)).await;
            let before = d.stats().await.shared.map_or(0, |s| s.round_trips);
            let r = crate::overhead::engine_tasks(&d, n, window, max).await;
            let after = d.stats().await.shared.map_or(0, |s| s.round_trips);
            d.shutdown(Duration::from_secs(1)).await;
            let trips = (after - before) as f64 / r.tasks.max(1) as f64;
            rows.push(vec![
                name.to_string(),
                r.tasks.to_string(),
                r.ok.to_string(),
                count(r.rate),
                format!("{trips:.4}"),
            ]);
            results.push(
                json!({"run": name, "tasks": r.tasks, "ok": r.ok, "rate": r.rate,
                "redis_round_trips_per_task": trips}),
            );
        }
        drop(server);
        let mut rep = Report::new(
            cli,
            "cluster",
            json!({"tasks": n, "window": window, "nodes": 4, "transport": "in-process"}),
        );
        rep.results = Value::Array(results);
        rep.body = table(
            &["limit", "tasks", "ok", "tasks/s", "redis round trips/task"],
            rows,
        );
        rep.note("One instance; the limit never binds: the figures are the cost of asking Redis.");
        rep.note("Round trips include the membership heartbeat (one a second).");
        Ok(rep.finish())
    }
}
