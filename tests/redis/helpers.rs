//! Set-up shared by the other modules: engine instances on their own
//! threads and Systems against a redis-server of the test's own, their
//! config, and waits on their stats and tasks.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Config, Dispatcher, Task, TaskResult};

use crate::redis_server::RedisServer;
use crate::support::{self, Backend};

/// One engine instance: a dispatcher on its own thread and System.
pub(crate) struct Instance {
    pub(crate) d: Dispatcher,
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
pub(crate) const SETTLE: Duration = Duration::from_millis(300);

/// A redis-server of the test's own (with the logs on), or `None`: skip.
pub(crate) fn redis_server() -> Option<RedisServer> {
    support::init_logs();
    RedisServer::start()
}

/// `n` instances of `cfg`, each on its own thread and System, given
/// [`SETTLE`] to connect and heartbeat.
pub(crate) fn start_instances(cfg: &Config, n: usize) -> Vec<Instance> {
    let instances = (0..n).map(|_| Instance::start(cfg.clone())).collect();
    thread::sleep(SETTLE);
    instances
}

/// One instance of `cfg`, given [`SETTLE`] to connect and heartbeat.
pub(crate) fn start_instance(cfg: Config) -> Instance {
    let instance = Instance::start(cfg);
    thread::sleep(SETTLE);
    instance
}

/// The config of service `svc` (round robin over `backends`, with
/// `service_extra`), its `redis` section `srv`'s url and `redis` (more
/// `"key":value` pairs).
pub(crate) fn config(
    srv: &RedisServer,
    redis: &str,
    backends: &[&Backend],
    service_extra: &str,
) -> Config {
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
pub(crate) fn wait_down(rt: &actix::SystemRunner, d: &Dispatcher) {
    assert!(wait_shown(rt, d, true), "down is shown in stats");
}

/// Waits (at most 3 s) until `d` shows Redis up again (it asks once per
/// `timeout` while down).
pub(crate) fn wait_up(rt: &actix::SystemRunner, d: &Dispatcher) {
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

pub(crate) fn submit_many(d: &Dispatcher, n: usize) -> Vec<actix_dispatch::Submission> {
    (0..n)
        .map(|i| d.submit(Task::get("svc", format!("/t/{i}"))))
        .collect()
}

/// Waits (at most `limit`) for the results of `tasks`: no task may be stuck.
pub(crate) fn all_answered(
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
pub(crate) fn round_trips(rt: &actix::SystemRunner, instances: &[Instance]) -> u64 {
    instances
        .iter()
        .map(|i| rt.block_on(i.d.stats()).shared.expect("shared").round_trips)
        .sum()
}
