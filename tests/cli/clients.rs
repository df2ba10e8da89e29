//! What real clients found (issue 23): read errors are a failed run, a
//! closed stdout (`| head`) stops the run at once, and after an interrupt
//! `--unfinished` holds every task without a result, the unread input too.

use super::*;

use std::io::{BufRead, BufReader, Read};

fn tasks(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!(r#"{{"id":{i},"service":"svc","path":"/items/{i}"}}"#))
        .collect()
}

/// Waits for `child` to exit, killing it (and failing) after a minute: a
/// bound against a hang, far above what any run here takes.
fn wait_bounded(child: &mut std::process::Child) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the run did not stop");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_directory_as_tasks_is_a_usage_error() {
    let b = Backend::start();
    let cfg = config("dir.json", &[&b], "");
    let dir = tmp("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    let out = run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--tasks",
            dir.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is a directory"), "{}", stderr(&out));
    assert_eq!(b.hits(), 0);
}

#[test]
fn a_read_error_mid_input_fails_the_run_with_a_message() {
    use std::net::{TcpListener, TcpStream};
    let b = Backend::start();
    let cfg = config("readerr.json", &[&b], "");
    // stdin is a TCP connection that the other end resets after three
    // lines: the read fails with ECONNRESET mid-input.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut theirs, _) = listener.accept().unwrap();
    let mut to_theirs = ours.try_clone().unwrap();
    let mut child = spawn_run(
        &cfg,
        "none",
        &[],
        Stdio::from(std::os::fd::OwnedFd::from(ours)),
    );
    theirs
        .write_all((tasks(3).join("\n") + "\n").as_bytes())
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..3 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "a result line");
        assert!(line.contains(r#""outcome":"success""#), "{line}");
    }
    // Unread data in `theirs` makes closing it a reset (RFC 9293 §3.6.1).
    to_theirs.write_all(b"x").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(theirs);
    let status = wait_bounded(&mut child);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("reading tasks from stdin") && err.contains("after line 3"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    drop(to_theirs);
}

#[test]
fn a_closed_stdout_stops_the_run_without_new_requests() {
    let b = Backend::start();
    // Each answer takes 20 ms, two at a time: 3000 tasks would take 30 s.
    b.set_latency(Duration::from_millis(20));
    let cfg = config("pipe.json", &[&b], "");
    let file = write("pipe.jsonl", &tasks(3000));
    let unfinished = tmp("pipe-unfinished.jsonl");
    let mut child = spawn_run(
        &cfg,
        "none",
        &[
            "--tasks",
            file.to_str().unwrap(),
            "--unfinished",
            unfinished.to_str().unwrap(),
        ],
        Stdio::null(),
    );
    // `head -n 1`: one line read, then the pipe closed.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains(r#""outcome":"success""#), "{first}");
    drop(out);
    let status = wait_bounded(&mut child);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("stdout closed"), "{err}");
    let hits = b.hits();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.hits(), hits, "nothing sent after the exit");
    assert!(
        hits < 100,
        "{hits} of 3000 requests sent after the pipe closed"
    );
    // Every task whose result was not written is kept.
    let kept = std::fs::read_to_string(&unfinished).unwrap();
    let kept: BTreeSet<&str> = kept.lines().collect();
    assert!(kept.len() >= 3000 - hits as usize, "{} kept", kept.len());
    assert!(kept.len() < 3000);
}

#[test]
fn an_interrupt_keeps_the_unread_input_in_unfinished() {
    let b = Backend::start();
    b.set_latency(Duration::from_millis(50));
    // A window of 10 tasks: most of the 5000 lines are not read yet.
    let cfg = config("unread.json", &[&b], r#""queue":{"capacity":10}"#);
    let all = tasks(5000);
    let file = write("unread.jsonl", &all);
    let unfinished = tmp("unread-unfinished.jsonl");
    let mut child = spawn_run(
        &cfg,
        "none",
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
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut results = Vec::new();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    results.push(line);
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    for line in out.lines() {
        results.push(line.unwrap());
    }
    let status = wait_bounded(&mut child);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "{err}");

    // Every task: a final result, or kept for a rerun (a `shutting_down`
    // result is not final, and its line is kept).
    let mut done = BTreeSet::new();
    for r in &results {
        let v: Value = serde_json::from_str(r).unwrap();
        if v["reason"] != "shutting_down" {
            assert!(done.insert(v["id"].as_u64().unwrap()), "two results: {r}");
        }
    }
    let kept = std::fs::read_to_string(&unfinished).unwrap();
    let mut again = BTreeSet::new();
    for l in kept.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(again.insert(v["id"].as_u64().unwrap()), "kept twice: {l}");
    }
    assert!(done.is_disjoint(&again), "a finished task kept for a rerun");
    let every: BTreeSet<u64> = (0..5000).collect();
    let union: BTreeSet<u64> = done.union(&again).copied().collect();
    assert_eq!(
        union.len(),
        5000,
        "{} of 5000 tasks lost",
        5000 - union.len()
    );
    assert_eq!(union, every);
    assert!(
        again.len() > 4000,
        "most lines were never read: {}",
        again.len()
    );
    assert!(
        err.contains(&format!("interrupted: {} unfinished task(s)", again.len())),
        "{err}"
    );
    // In input order, as read (the in-flight ones first).
    let ids: Vec<u64> = kept
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let tail = &ids[ids.len() - 4000..];
    assert!(
        tail.windows(2).all(|w| w[0] < w[1]),
        "the unread rest in order"
    );
}
