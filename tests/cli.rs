//! The `actix-dispatch` binary (feature `cli`), run as a child process on
//! JSONL files against real backends: result lines, exit codes, malformed
//! lines, and the unfinished file after an interrupt.

#![cfg(feature = "cli")]
// The test waits on a child process: wall time, outside the engine.
#![allow(clippy::disallowed_types)]

mod support;

#[path = "cli/clients.rs"]
mod clients;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Backend;

const BIN: &str = env!("CARGO_BIN_EXE_actix-dispatch");

/// A fresh path under cargo's temporary directory for integration tests.
fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

/// Writes a config of service `svc` over `backends` (`extra`: more fields).
fn config(name: &str, backends: &[&Backend], extra: &str) -> PathBuf {
    let eps: Vec<String> = backends
        .iter()
        .map(|b| format!(r#"{{"address":"{}","max_concurrent":2}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{}]{}{extra}}}]}}"#,
        eps.join(","),
        if extra.is_empty() { "" } else { "," }
    );
    let path = tmp(name);
    std::fs::write(&path, json).unwrap();
    path
}

fn write(name: &str, lines: &[String]) -> PathBuf {
    let path = tmp(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Starts `actix-dispatch run --config cfg --progress progress` with
/// `args` after, its logs off, `stdin` as given, stdout and stderr piped.
fn spawn_run(cfg: &Path, progress: &str, args: &[&str], stdin: Stdio) -> Child {
    Command::new(BIN)
        .args([
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--progress",
            progress,
        ])
        .args(args)
        .env("RUST_LOG", "off")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The result line whose `id` is `id`.
fn by_id<'a>(results: &'a [Value], id: &Value) -> &'a Value {
    let mut found = results.iter().filter(|r| &r["id"] == id);
    let r = found.next().unwrap_or_else(|| panic!("no result for {id}"));
    assert!(found.next().is_none(), "two results for {id}");
    r
}

#[test]
fn a_file_of_tasks_gives_one_result_each_and_exit_0() {
    let (b0, b1) = (Backend::named("b0"), Backend::named("b1"));
    let cfg = config("ok.json", &[&b0, &b1], "");
    let mut tasks: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"id":{i},"service":"svc","path":"/items/{i}?q=1","timeout":"5s"}}"#))
        .collect();
    tasks.push(
        r#"{"id":"json","service":"svc","path":"/echo","json":{"a":[1,2]},"idempotent":true}"#
            .into(),
    );
    tasks.push(
        r#"{"id":"bin","service":"svc","method":"PUT","path":"/echo","body":"/wA=","body_encoding":"base64","headers":{"content-type":"application/octet-stream"}}"#
            .into(),
    );
    let file = write("ok.jsonl", &tasks);
    let summary = tmp("ok-summary.json");
    let out = run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--tasks",
            file.to_str().unwrap(),
            "--progress",
            "plain",
            "--summary-json",
            summary.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = lines(&out);
    assert_eq!(results.len(), 22);
    let nodes = [b0.url(), b1.url()];
    for i in 0..20 {
        let r = by_id(&results, &Value::from(i));
        assert_eq!(r["outcome"], "success", "{r}");
        assert_eq!(r["service"], "svc");
        assert_eq!(r["status"], 200);
        assert_eq!(r["line"], i + 1);
        assert!(r["attempts"].as_u64().unwrap() >= 1);
        assert!(r["total_ms"].as_f64().unwrap() >= 0.0);
        assert!(nodes.iter().any(|n| r["node"] == n.as_str()), "{r}");
        assert_eq!(r["body_encoding"], "utf8");
        let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["path"], format!("/items/{i}"));
    }
    let json = by_id(&results, &Value::from("json"));
    assert_eq!(json["body"], r#"{"a":[1,2]}"#);
    let bin = by_id(&results, &Value::from("bin"));
    assert_eq!(bin["body_encoding"], "base64");
    assert_eq!(bin["body"], "/wA=");
    assert_eq!(b0.hits() + b1.hits(), 22);

    let err = stderr(&out);
    assert!(err.contains("22 done"), "{err}");
    assert!(err.contains("service svc: 22 tasks, 100.00 % ok"), "{err}");
    let s: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(s["tasks"], 22);
    assert_eq!(s["succeeded"], 22);
    assert_eq!(s["services"][0]["name"], "svc");
    let attempts: u64 = s["services"][0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["classes"]["2xx"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(attempts, 22);
    for p in ["p50", "p90", "p99", "p99.9"] {
        assert!(s["services"][0]["latency_ms"][p].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn tasks_from_stdin_and_failures_and_malformed_lines_exit_1() {
    let b = Backend::start();
    let cfg = config("mixed.json", &[&b], "");
    let input = [
        r#"{"id":"a","service":"svc","path":"/items/a"}"#,
        "this is not json",
        r#"{"service":"svc"}"#,
        "",
        r#"{"id":"nf","service":"svc","path":"/status/404"}"#,
        r#"{"id":"typo","service":"svc","path":"/","idempotnet":true}"#,
        r#"{"id":"b","service":"svc","path":"/items/b"}"#,
    ]
    .join("\n");
    let out = run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--progress",
            "none",
        ],
        Some(&input),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let results = lines(&out);
    assert_eq!(results.len(), 6, "{results:?}");
    for id in ["a", "b"] {
        assert_eq!(by_id(&results, &Value::from(id))["outcome"], "success");
    }
    let nf = by_id(&results, &Value::from("nf"));
    assert_eq!(nf["outcome"], "failure");
    assert_eq!(nf["reason"], "not_retryable");
    assert_eq!(nf["status"], 404);
    assert_eq!(nf["body"], "status 404");
    let invalid: Vec<&Value> = results
        .iter()
        .filter(|r| r["outcome"] == "invalid")
        .collect();
    let at: Vec<u64> = invalid
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(at, [2, 3, 6]);
    assert!(
        invalid[1]["error"].as_str().unwrap().contains("path"),
        "{}",
        invalid[1]
    );
    assert!(invalid[2]["error"].as_str().unwrap().contains("idempotnet"));
    assert_eq!(b.hits(), 3);
}

/// Task lines are untrusted: a timeout or deadline past the service's
/// `lines` bounds, a body or headers larger, are `invalid` results naming
/// the field and the bound, never sent; a priority the service does not
/// allow is dropped, not refused. Before, a line could set a 365-day
/// timeout and any size of body or headers.
#[test]
fn lines_over_the_services_bounds_are_invalid_naming_the_field() {
    let b = Backend::start();
    let cfg = config(
        "bounded.json",
        &[&b],
        r#""timeout":"2s","lines":{"max_body":16,"max_header_bytes":32}"#,
    );
    let big_header = "v".repeat(40);
    let input = [
        r#"{"id":"ok","service":"svc","path":"/items/1","body":"small","timeout":"2s"}"#
            .to_string(),
        r#"{"id":"t","service":"svc","path":"/items/2","timeout":"365days"}"#.to_string(),
        r#"{"id":"d","service":"svc","path":"/items/3","deadline":"1day"}"#.to_string(),
        format!(
            r#"{{"id":"b","service":"svc","path":"/items/4","body":"{}"}}"#,
            "x".repeat(17)
        ),
        format!(
            r#"{{"id":"h","service":"svc","path":"/items/5","headers":{{"x-a":"{big_header}"}}}}"#
        ),
        r#"{"id":"p","service":"svc","path":"/items/6","priority":"critical"}"#.to_string(),
    ]
    .join("\n");
    let out = run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--progress",
            "none",
        ],
        Some(&input),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let results = lines(&out);
    assert_eq!(results.len(), 6, "{results:?}");
    for id in ["ok", "p"] {
        assert_eq!(
            by_id(&results, &Value::from(id))["outcome"],
            "success",
            "{id}"
        );
    }
    let invalid: Vec<(u64, String)> = results
        .iter()
        .filter(|r| r["outcome"] == "invalid")
        .map(|r| {
            (
                r["line"].as_u64().unwrap(),
                r["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        (2, "timeout: 31536000s", "lines.max_timeout (2s)"),
        (3, "deadline: 86400s", "lines.max_deadline"),
        (4, "body: 17 bytes", "lines.max_body (16)"),
        (5, "headers: 43 bytes", "lines.max_header_bytes (32)"),
    ];
    assert_eq!(invalid.len(), want.len(), "{invalid:?}");
    for ((at, error), (line, field, bound)) in invalid.iter().zip(want) {
        assert_eq!(*at, line);
        assert!(error.starts_with(field) && error.contains(bound), "{error}");
    }
    assert_eq!(b.hits(), 2, "only the lines within bounds were sent");
}

#[test]
fn usage_and_config_errors_exit_2() {
    let b = Backend::start();
    let cfg = config("usage.json", &[&b], "");
    let bad = tmp("bad.json");
    std::fs::write(
        &bad,
        r#"{"services":[{"name":"svc","endpoints":[{"address":"ftp://x/"}]}]}"#,
    )
    .unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["run"],
        vec![
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--progress",
            "sometimes",
        ],
        vec!["run", "--config", cfg.to_str().unwrap(), "--grace", "soon"],
        vec!["run", "--config", "/nonexistent/config.json"],
        vec!["run", "--config", bad.to_str().unwrap()],
        vec![
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--tasks",
            "/nonexistent/tasks",
        ],
    ];
    for args in cases {
        let out = run(&args, Some(""));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run(&["run", "--config", bad.to_str().unwrap()], Some(""));
    assert!(stderr(&out).contains("ftp"), "{}", stderr(&out));
    assert_eq!(b.hits(), 0);
}

#[test]
fn an_interrupt_writes_the_unfinished_tasks_ready_to_feed_again() {
    let b = Backend::start();
    b.set_latency(Duration::from_secs(60));
    let cfg = config("int.json", &[&b], "");
    let tasks: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"id":{i},"service":"svc","path":"/items/{i}"}}"#))
        .collect();
    let file = write("int.jsonl", &tasks);
    let unfinished = tmp("int-unfinished.jsonl");
    let child = spawn_run(
        &cfg,
        "plain",
        &[
            "--tasks",
            file.to_str().unwrap(),
            "--grace",
            "100ms",
            "--unfinished",
            unfinished.to_str().unwrap(),
        ],
        Stdio::null(),
    );
    let until = Instant::now() + Duration::from_secs(20);
    while b.in_flight() < 2 {
        assert!(
            Instant::now() < until,
            "the tasks never reached the backend"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted: 10 unfinished task(s) written to"),
        "{err}"
    );

    // Every task has one result, `shutting_down`, and its line is kept as it was.
    let results = lines(&out);
    assert_eq!(results.len(), 10);
    for i in 0..10 {
        let r = by_id(&results, &Value::from(i));
        assert_eq!(r["outcome"], "rejected");
        assert_eq!(r["reason"], "shutting_down");
    }
    let kept: BTreeSet<String> = std::fs::read_to_string(&unfinished)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(kept, tasks.iter().cloned().collect::<BTreeSet<_>>());

    // Fed again, they all finish.
    b.set_latency(Duration::ZERO);
    let out = run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--tasks",
            unfinished.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = lines(&out);
    assert_eq!(results.len(), 10);
    for i in 0..10 {
        assert_eq!(by_id(&results, &Value::from(i))["outcome"], "success");
    }
}
