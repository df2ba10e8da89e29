//! Worker processes killed and restarted: orphaned entries claimed, an
//! instance resuming its own pending entries, and the dead letters.

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use super::helpers::{
    add_tasks, add_tasks_from, con, entries, pending_at, results, temp_dir, wait_until,
    write_config, write_config_with, xlen, KeyedBackend, Worker,
};
use crate::redis_server::RedisServer;

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
