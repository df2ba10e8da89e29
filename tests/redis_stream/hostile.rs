//! Stream content is untrusted: an entry that can never run goes to the
//! dead letters on first sight (not after `max_deliveries` × `claim_after`),
//! and the worker binary logs what it does.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use actix_dispatch::redis::stream::StreamConfig;

use super::helpers::{
    con, entries, load_config, start_consuming, temp_dir, wait_until, write_config, xlen,
    KeyedBackend, WORKER,
};
use crate::redis_server::{stream_until, RedisServer};

/// An entry's fields as bytes.
type RawFields = Vec<(String, Vec<u8>)>;

const TASKS: &str = "t:{svc}:tasks";
const DEAD: &str = "t:{svc}:dead";

/// Five entries that no delivery can change (not UTF-8, not JSON, a line
/// of another service, a path that climbs out, a header the task may not
/// set) and three good ones; `claim_after` is a minute, so a dead letter
/// can only come from the first delivery. All five are dead-lettered once
/// each, with 1 delivery, and the good ones recorded; nothing stays
/// pending.
#[test]
fn entries_that_can_never_run_are_dead_lettered_on_first_sight() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("hostile");
    let cfg = load_config(&dir, &server.url(), backend.port, 100);
    let mut c = con(&server.url());
    let bad: [&[u8]; 5] = [
        &[b'{', 0xff, 0xfe, b'}'],
        b"not json",
        br#"{"id":"o","service":"other","path":"/ok"}"#,
        br#"{"id":"p","service":"svc","path":"/../etc/passwd"}"#,
        br#"{"id":"h","service":"svc","path":"/ok","headers":{"Host":"evil"}}"#,
    ];
    for (i, raw) in bad.iter().enumerate() {
        let _: String = redis::cmd("XADD")
            .arg(TASKS)
            .arg("*")
            .arg("task")
            .arg(*raw)
            .query(&mut c)
            .expect("xadd");
        let good = format!(r#"{{"id":"g{i}","service":"svc","path":"/ok"}}"#);
        if i < 3 {
            let _: String = redis::cmd("XADD")
                .arg(TASKS)
                .arg("*")
                .arg("task")
                .arg(good)
                .query(&mut c)
                .expect("xadd");
        }
    }
    let st = actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("hostile");
        sc.claim_after = Some(Duration::from_secs(60));
        sc.claim_every = Some(Duration::from_millis(100));
        sc.max_deliveries = 5;
        let d = start_consuming(cfg, sc).await;
        let last = stream_until(&d, Duration::from_secs(5), |s| {
            s.dead_lettered == 5 && s.recorded == 3 && s.in_flight == 0
        })
        .await;
        d.shutdown(Duration::from_secs(1)).await;
        last
    });
    let st = st.expect("stream stats");
    assert_eq!(
        (
            st.dead_lettered,
            st.recorded,
            st.claimed,
            st.failed_deliveries
        ),
        (5, 3, 0, 0),
        "{st:?}"
    );
    assert_eq!(
        xlen(&mut c, TASKS),
        0,
        "every entry acknowledged and deleted"
    );
    // Each dead letter says why, after one delivery; the non-UTF-8 one
    // keeps its bytes.
    let raw: redis::Value = redis::cmd("XRANGE")
        .arg(DEAD)
        .arg("-")
        .arg("+")
        .query(&mut c)
        .expect("xrange");
    let dead: Vec<(String, RawFields)> = redis::from_redis_value(raw).expect("dead");
    assert_eq!(dead.len(), 5);
    let get = |f: &RawFields, k: &str| {
        f.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut tasks: Vec<Vec<u8>> = dead.iter().map(|(_, f)| get(f, "task")).collect();
    tasks.sort();
    let mut want: Vec<Vec<u8>> = bad.iter().map(|b| b.to_vec()).collect();
    want.sort();
    assert_eq!(tasks, want);
    let errors: Vec<String> = dead
        .iter()
        .map(|(_, f)| String::from_utf8_lossy(&get(f, "error")).into_owned())
        .collect();
    for (_, f) in &dead {
        assert_eq!(get(f, "deliveries"), b"1", "{errors:?}");
    }
    for want in ["not UTF-8", "names service \"other\"", "invalid task"] {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{want}: {errors:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `actix-dispatch-worker` logs through env_logger: its start line and a
/// dead letter appear on its standard error.
#[test]
fn the_worker_logs_what_it_does() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("worker-logs");
    let cfg = write_config(&dir, &server.url(), backend.port, 10);
    let mut c = con(&server.url());
    let _: String = redis::cmd("XADD")
        .arg(TASKS)
        .arg("*")
        .arg("task")
        .arg("not json")
        .query(&mut c)
        .expect("xadd");
    let mut child = Command::new(WORKER)
        .arg("--config")
        .arg(&cfg)
        .args(["--consumer", "logs", "--grace", "1s"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    wait_until("the dead letter", Duration::from_secs(10), || {
        entries(&mut c, DEAD).len() == 1
    });
    drop(child.stdin.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    let _ = child.wait();
    assert!(err.contains("consuming t:{svc}:tasks"), "{err}");
    assert!(err.contains("dead-lettered"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
