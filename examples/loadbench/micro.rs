//! `micro`: the criterion estimates of `cargo bench --features internals --bench algo`, checked
//! against the targets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::report::{table, Report};
use crate::Cli;

/// The target directory: `$CARGO_TARGET_DIR`, or three levels above this
/// binary (`target/release/examples/loadbench`).
fn target_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(d));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().nth(3).map(Path::to_path_buf)
}

/// `full_id` -> (mean ns, median ns), from every `*/new/` of criterion's output.
fn estimates(root: &Path) -> BTreeMap<String, (f64, f64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if p.file_name().is_some_and(|n| n == "new") {
                let read = |f: &str| -> Option<Value> {
                    serde_json::from_str(&std::fs::read_to_string(p.join(f)).ok()?).ok()
                };
                let (Some(b), Some(est)) = (read("benchmark.json"), read("estimates.json")) else {
                    continue;
                };
                let id = b.get("full_id").and_then(Value::as_str).map(str::to_owned);
                let point = |k: &str| {
                    est.get(k)
                        .and_then(|v| v.get("point_estimate"))
                        .and_then(Value::as_f64)
                };
                if let (Some(id), Some(mean), Some(median)) = (id, point("mean"), point("median")) {
                    out.insert(id, (mean, median));
                }
            } else {
                stack.push(p);
            }
        }
    }
    out
}

fn ns(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}", v)
    } else {
        format!("{v:.1}")
    }
}

pub fn run(cli: &Cli) -> Result<Report, String> {
    let root = target_dir()
        .map(|t| t.join("criterion"))
        .ok_or("cannot locate the target directory")?;
    let est = estimates(&root);
    if est.is_empty() {
        return Err(format!(
            "no criterion results under {}: run `cargo bench --features internals --bench algo` first",
            root.display()
        ));
    }
    let mut rep = Report::new(
        cli,
        "micro",
        // Relative to the target directory: no machine's path in the results.
        json!({"criterion_dir": "target/criterion"}),
    );
    rep.command =
        "cargo bench --features internals --bench algo && cargo run --release --example loadbench -- micro".into();

    let sizes = [3usize, 100, 1000];
    let strategies = [
        "round_robin",
        "weighted",
        "least_load",
        "p2c",
        "consistent_hash",
    ];
    let get = |id: &str| est.get(id).map(|(mean, _)| *mean);
    let mut rows = Vec::new();
    let mut results = serde_json::Map::new();
    for s in strategies {
        let mut row = vec![s.to_string()];
        for n in sizes {
            match get(&format!("pick/{s}/{n}")) {
                Some(v) => {
                    row.push(ns(v));
                    results.insert(
                        format!("pick/{s}/{n}"),
                        json!({"ns": v, "ns_per_node": v / n as f64}),
                    );
                }
                None => row.push("-".into()),
            }
        }
        let per_node = get(&format!("pick/{s}/1000")).map(|v| v / 1000.0);
        row.push(per_node.map_or("-".into(), |v| format!("{v:.2}")));
        let growth = match (get(&format!("pick/{s}/3")), get(&format!("pick/{s}/1000"))) {
            (Some(a), Some(b)) => format!("{:.1}", b / a),
            _ => "-".into(),
        };
        row.push(growth);
        rows.push(row);
    }
    let mut body = String::from("Strategy pick, mean ns per pick (criterion):\n\n");
    body.push_str(&table(
        &[
            "strategy",
            "3 nodes",
            "100 nodes",
            "1000 nodes",
            "ns/node at 1000",
            "1000 / 3",
        ],
        rows,
    ));
    let others = [
        ("breaker/admit", "breaker admit (Closed)"),
        ("breaker/admit_record", "breaker admit + record"),
        ("bucket/acquire", "token bucket acquire (granted)"),
        ("bucket/refused", "token bucket acquire (refused)"),
        ("peak_ewma/observe", "peak EWMA observe"),
    ];
    let mut orows: Vec<Vec<String>> = others
        .iter()
        .map(|(id, what)| {
            let v = get(id);
            if let Some(v) = v {
                results.insert((*id).to_string(), json!({"ns": v}));
            }
            vec![what.to_string(), v.map_or("-".into(), ns)]
        })
        .collect();
    // One iteration is a backlog of 20 000 answers: reported per answer.
    let learned = get("learned_limit/bimodal_backlog").map(|v| v / 20_000.0);
    if let Some(v) = learned {
        results.insert(
            "learned_limit/bimodal_backlog".into(),
            json!({"ns_per_answer": v}),
        );
    }
    orows.push(vec![
        "learned limit, per answer (bimodal backend, backlog)".into(),
        learned.map_or("-".into(), ns),
    ]);
    body.push_str("\nPrimitives, mean ns per call:\n\n");
    body.push_str(&table(&["operation", "ns"], orows));
    rep.body = body;

    let check = |rep: &mut Report, id: &str, what: &str, goal: &str, per: f64, limit: f64| {
        let v = get(id).map(|v| v / per);
        rep.target(
            what,
            goal,
            v.map_or("not run".into(), |v| format!("{v:.2} ns")),
            v.map(|v| v < limit),
        );
    };
    check(
        &mut rep,
        "pick/round_robin/1000",
        "round robin pick at 1000 nodes",
        "< 100 ns",
        1.0,
        100.0,
    );
    check(
        &mut rep,
        "pick/p2c/1000",
        "p2c pick at 1000 nodes",
        "< 100 ns",
        1.0,
        100.0,
    );
    for s in ["round_robin", "p2c"] {
        let g = match (get(&format!("pick/{s}/3")), get(&format!("pick/{s}/1000"))) {
            (Some(a), Some(b)) => Some(b / a),
            _ => None,
        };
        // Issue 14: a pick at 1000 nodes costs at most 1.1 x one at 3 (a
        // compact array of what a pick reads, no pointer chasing).
        rep.target(
            format!("{s} scales with the pool: pick at 1000 nodes / at 3"),
            "<= 1.1",
            g.map_or("not run".into(), |g| format!("{g:.2}")),
            g.map(|g| g <= 1.1),
        );
    }
    check(
        &mut rep,
        "pick/weighted/1000",
        "smooth weighted per node (1000 nodes)",
        "< 10 ns/node",
        1000.0,
        10.0,
    );
    check(
        &mut rep,
        "pick/weighted/100",
        "smooth weighted per node (100 nodes)",
        "< 10 ns/node",
        100.0,
        10.0,
    );
    check(
        &mut rep,
        "pick/least_load/1000",
        "least load per node (1000 nodes)",
        "< 10 ns/node",
        1000.0,
        10.0,
    );
    check(
        &mut rep,
        "pick/least_load/100",
        "least load per node (100 nodes)",
        "< 10 ns/node",
        100.0,
        10.0,
    );
    check(
        &mut rep,
        "breaker/admit_record",
        "breaker admit + record",
        "< 50 ns",
        1.0,
        50.0,
    );
    check(
        &mut rep,
        "breaker/admit",
        "breaker admit",
        "< 50 ns",
        1.0,
        50.0,
    );
    check(
        &mut rep,
        "bucket/acquire",
        "bucket acquire",
        "< 50 ns",
        1.0,
        50.0,
    );
    rep.results = Value::Object(results);
    rep.note(
        "criterion 0.7, measurement 2 s, warm-up 0.5 s, 30 samples; candidates of varied load and \
         weights 1..=5, all eligible; consistent hashing with a rotating affinity key.",
    );
    Ok(rep.finish())
}
