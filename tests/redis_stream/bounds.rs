//! What a stream may make an instance hold: an entry over
//! `max_entry_bytes` is dead-lettered unparsed (its first KiB kept), a
//! read asks for at most `max_read_bytes / max_entry_bytes` entries, and
//! the results and dead-letter streams are trimmed (`MAXLEN ~`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use actix_dispatch::redis::stream::StreamConfig;

use super::helpers::{
    add_tasks, con, entries, load_config, start_consuming, temp_dir, write_config_with, xlen,
    KeyedBackend,
};
use crate::redis_server::{stream_until, RedisServer};

const TASKS: &str = "t:{svc}:tasks";
const RESULTS: &str = "t:{svc}:results";
const DEAD: &str = "t:{svc}:dead";

/// The `COUNT` of every `XREADGROUP` and `XAUTOCLAIM` Redis received while
/// `f` ran (`redis-cli MONITOR`).
fn read_counts(server: &RedisServer, f: impl FnOnce()) -> Vec<u64> {
    let mut mon = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "MONITOR"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli MONITOR");
    let out = mon.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("\"XREADGROUP\"") || l.contains("\"XAUTOCLAIM\""))
            .collect::<Vec<String>>()
    });
    // MONITOR answers OK once it is on.
    std::thread::sleep(Duration::from_millis(200));
    f();
    let _ = mon.kill();
    let _ = mon.wait();
    let lines = reader.join().expect("monitor reader");
    lines
        .iter()
        .map(|l| {
            let words: Vec<&str> = l.split('"').filter(|w| !w.trim().is_empty()).collect();
            let at = words.iter().position(|w| *w == "COUNT").expect("COUNT");
            words[at + 1].parse().expect("a count")
        })
        .collect()
}

/// `max_entry_bytes` 4 KiB and `max_read_bytes` 16 KiB: every read asks
/// for 4 entries at most (the credit is 100); a 100 KB entry is
/// dead-lettered with its size, never parsed nor sent, and only its first
/// KiB is kept; the others run. Before, a read asked for the whole credit
/// and any entry was parsed whatever its size.
#[test]
fn an_entry_over_the_byte_bound_is_dead_lettered_and_reads_are_bounded() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("bounds-bytes");
    let cfg = load_config(&dir, &server.url(), backend.port, 100);
    let mut c = con(&server.url());
    let big = format!(
        r#"{{"id":"big","service":"svc","path":"/big","body":"{}"}}"#,
        "x".repeat(100_000)
    );
    let _: String = redis::cmd("XADD")
        .arg(TASKS)
        .arg("*")
        .arg("task")
        .arg(&big)
        .query(&mut c)
        .expect("xadd");
    add_tasks(&mut c, "/ok", 20);
    let mut st = None;
    let counts = read_counts(&server, || {
        st = actix::System::new().block_on(async move {
            let mut sc = StreamConfig::named("bounds");
            sc.claim_after = Some(Duration::from_secs(60));
            sc.claim_every = Some(Duration::from_millis(100));
            sc.max_entry_bytes = 4096;
            sc.max_read_bytes = 16384;
            let d = start_consuming(cfg, sc).await;
            let last = stream_until(&d, Duration::from_secs(5), |s| {
                s.dead_lettered == 1 && s.recorded == 20 && s.in_flight == 0
            })
            .await;
            d.shutdown(Duration::from_secs(1)).await;
            last
        });
    });
    let st = st.expect("stream stats");
    assert_eq!((st.dead_lettered, st.recorded), (1, 20), "{st:?}");
    assert!(!counts.is_empty());
    assert!(counts.iter().all(|n| *n <= 4), "{counts:?}");
    let dead = entries(&mut c, DEAD);
    assert_eq!(dead.len(), 1);
    let f = &dead[0].1;
    assert!(f["error"].contains("max_entry_bytes"), "{f:?}");
    assert!(f["error"].contains(&(big.len() + 4).to_string()), "{f:?}");
    assert_eq!(f["task"].len(), 1024, "the first KiB kept");
    assert!(big.starts_with(&f["task"]));
    let calls = backend.calls.lock().unwrap().len();
    assert_eq!(calls, 20, "the big one never reached the backend");
    assert_eq!(xlen(&mut c, TASKS), 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// `results_max_len` 10 and `dead_max_len` 5, on a server whose stream
/// nodes hold 10 entries (so `MAXLEN ~` trims closely): 200 results and
/// 40 dead letters leave at most 20 and 15 entries. Before, both streams
/// kept every entry.
#[test]
fn results_and_dead_letters_are_trimmed() {
    let Some(server) = RedisServer::start_with(&["--stream-node-max-entries", "10"]) else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("bounds-maxlen");
    let cfg = load_config(&dir, &server.url(), backend.port, 100);
    let mut c = con(&server.url());
    add_tasks(&mut c, "/ok", 200);
    for _ in 0..40 {
        let _: String = redis::cmd("XADD")
            .arg(TASKS)
            .arg("*")
            .arg("task")
            .arg("not json")
            .query(&mut c)
            .expect("xadd");
    }
    let st = actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("trim");
        sc.claim_after = Some(Duration::from_secs(60));
        sc.results_max_len = 10;
        sc.dead_max_len = 5;
        let d = start_consuming(cfg, sc).await;
        let last = stream_until(&d, Duration::from_secs(10), |s| {
            s.dead_lettered == 40 && s.recorded == 200 && s.in_flight == 0
        })
        .await;
        d.shutdown(Duration::from_secs(1)).await;
        last
    });
    let st = st.expect("stream stats");
    assert_eq!((st.dead_lettered, st.recorded), (40, 200), "{st:?}");
    let (results, dead) = (xlen(&mut c, RESULTS), xlen(&mut c, DEAD));
    assert!((10..=20).contains(&results), "{results}");
    assert!((5..=15).contains(&dead), "{dead}");
    let _ = std::fs::remove_dir_all(dir);
}

/// What a line may ask of its service (`lines`): a 1-hour timeout, a
/// 1-day deadline, a body or headers over their bounds are dead letters on
/// first sight, naming the field and the bound; a priority the service
/// does not allow is dropped, the task runs. Before, a stream entry could
/// hold a slot for a year and bring any size of body.
#[test]
fn lines_over_the_services_bounds_are_dead_lettered() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("bounds-lines");
    let path = write_config_with(
        &dir,
        &server.url(),
        backend.port,
        100,
        r#","lines":{"max_body":8,"max_header_bytes":16}"#,
    );
    let cfg = actix_dispatch::Config::from_file(&path).expect("config");
    let mut c = con(&server.url());
    let lines = [
        r#"{"id":"t","service":"svc","path":"/ok","timeout":"1h"}"#.to_string(),
        r#"{"id":"d","service":"svc","path":"/ok","deadline":"1day"}"#.to_string(),
        r#"{"id":"b","service":"svc","path":"/ok","body":"123456789"}"#.to_string(),
        format!(
            r#"{{"id":"h","service":"svc","path":"/ok","headers":{{"x-a":"{}"}}}}"#,
            "v".repeat(20)
        ),
        r#"{"id":"p","service":"svc","path":"/ok","priority":"critical"}"#.to_string(),
    ];
    for l in &lines {
        let _: String = redis::cmd("XADD")
            .arg(TASKS)
            .arg("*")
            .arg("task")
            .arg(l)
            .query(&mut c)
            .expect("xadd");
    }
    let st = actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("lines");
        sc.claim_after = Some(Duration::from_secs(60));
        let d = start_consuming(cfg, sc).await;
        let last = stream_until(&d, Duration::from_secs(5), |s| {
            s.dead_lettered == 4 && s.recorded == 1 && s.in_flight == 0
        })
        .await;
        d.shutdown(Duration::from_secs(1)).await;
        last
    });
    let st = st.expect("stream stats");
    assert_eq!((st.dead_lettered, st.recorded), (4, 1), "{st:?}");
    let mut errors: Vec<String> = entries(&mut c, DEAD)
        .into_iter()
        .map(|(_, f)| f["error"].clone())
        .collect();
    errors.sort();
    let want = [
        ("body: 9 bytes", "lines.max_body (8)"),
        ("deadline: 86400s", "lines.max_deadline (1s)"),
        ("headers: 23 bytes", "lines.max_header_bytes (16)"),
        ("timeout: 3600s", "lines.max_timeout (1s)"),
    ];
    assert_eq!(errors.len(), want.len(), "{errors:?}");
    for (e, (field, bound)) in errors.iter().zip(want) {
        assert!(e.contains(field) && e.contains(bound), "{e}");
    }
    let results = entries(&mut c, RESULTS);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1["id"], "p");
    assert_eq!(backend.calls.lock().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// A log line built from an entry cannot be forged: an entry whose text
/// (here a field name, quoted back by the parser's error) holds a newline
/// and a fake log line is logged with the newline escaped, on one line.
#[test]
fn an_entry_cannot_forge_a_log_line() {
    crate::logs::capture();
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = KeyedBackend::start();
    let dir = temp_dir("bounds-forge");
    let cfg = load_config(&dir, &server.url(), backend.port, 10);
    let mut c = con(&server.url());
    let forged =
        "{\"service\":\"svc\",\"path\":\"/ok\",\"x\\nWARN actix_dispatch: forged line\":1}";
    let _: String = redis::cmd("XADD")
        .arg(TASKS)
        .arg("*")
        .arg("task")
        .arg(forged)
        .query(&mut c)
        .expect("xadd");
    let st = actix::System::new().block_on(async move {
        let mut sc = StreamConfig::named("forge");
        sc.claim_after = Some(Duration::from_secs(60));
        let d = start_consuming(cfg, sc).await;
        let last = stream_until(&d, Duration::from_secs(5), |s| s.dead_lettered == 1).await;
        d.shutdown(Duration::from_secs(1)).await;
        last
    });
    assert_eq!(st.expect("stats").dead_lettered, 1);
    let lines = crate::logs::lines();
    let about: Vec<&String> = lines.iter().filter(|l| l.contains("forged line")).collect();
    assert!(!about.is_empty(), "{lines:#?}");
    for l in about {
        assert!(!l.contains('\n'), "a raw newline: {l:?}");
        assert!(l.contains("\\n"), "escaped: {l:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
