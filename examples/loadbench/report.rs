//! Results: one JSON file per scenario and `latest.md` gathering the tables.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::Cli;

/// The order of the sections of `latest.md`.
const ORDER: [&str; 12] = [
    "micro",
    "overhead",
    "throughput",
    "nginx",
    "peers",
    "gateway",
    "slow-node",
    "memory",
    "soak",
    "overload",
    "sim",
    "cluster",
];

/// One checked target.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is measured.
    pub name: String,
    /// The goal, in words.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Whether it was met (`None`: not measured, e.g. skipped).
    pub met: Option<bool>,
}

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    /// UTC date and time of the run.
    pub date: String,
    /// `std::thread::available_parallelism`.
    pub cores: usize,
    /// The exact command line.
    pub command: String,
    pub smoke: bool,
    /// Parameters of the run.
    pub params: Value,
    /// Measured numbers.
    pub results: Value,
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
    /// The markdown section of `latest.md`.
    pub markdown: String,
    /// Tables and text of the section (without header, targets and notes).
    #[serde(skip)]
    pub body: String,
}

impl Report {
    pub fn new(cli: &Cli, scenario: &str, params: Value) -> Self {
        Report {
            scenario: scenario.to_owned(),
            date: utc_now(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            command: command_line(),
            smoke: cli.smoke,
            params,
            results: Value::Null,
            targets: Vec::new(),
            notes: Vec::new(),
            markdown: String::new(),
            body: String::new(),
        }
    }

    /// Adds a target; `met` is `None` when nothing was measured.
    pub fn target(
        &mut self,
        name: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        met: Option<bool>,
    ) {
        self.targets.push(Target {
            name: name.into(),
            target: target.into(),
            measured: measured.into(),
            met,
        });
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Builds the markdown section from the body, targets and notes.
    pub fn finish(mut self) -> Self {
        let mut md = String::new();
        let _ = writeln!(md, "## {}\n", self.scenario);
        let _ = writeln!(
            md,
            "{} UTC, {} core(s){}, `{}`\n",
            self.date,
            self.cores,
            if self.smoke { ", SMOKE run" } else { "" },
            self.command
        );
        md.push_str(&self.body);
        if !self.targets.is_empty() {
            let rows = self
                .targets
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.target.clone(),
                        t.measured.clone(),
                        match t.met {
                            Some(true) => "met".into(),
                            Some(false) => "**missed**".into(),
                            None => "n/a".into(),
                        },
                    ]
                })
                .collect();
            md.push_str("\nTargets:\n\n");
            md.push_str(&table(&["what", "target", "measured", "verdict"], rows));
        }
        if !self.notes.is_empty() {
            md.push('\n');
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        self.markdown = md;
        self
    }
}

/// A markdown table.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", headers.join(" | "));
    let _ = writeln!(
        s,
        "|{}",
        headers
            .iter()
            .map(|_| " --- |")
            .collect::<Vec<_>>()
            .join("")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

/// Where results go.
pub fn out_dir(cli: &Cli) -> PathBuf {
    if let Some(o) = &cli.out {
        return o.clone();
    }
    if cli.smoke {
        // Next to the binary (target/release/bench-smoke), so that smoke
        // runs never overwrite the real numbers.
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().and_then(Path::parent).map(Path::to_path_buf))
        {
            return dir.join("bench-smoke");
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results")
}

/// Writes `<out>/<scenario>.json`.
pub fn save(out: &Path, rep: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let path = out.join(format!("{}.json", rep.scenario));
    let tmp = out.join(format!("{}.json.tmp", rep.scenario));
    let text = serde_json::to_string_pretty(rep).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(tmp, path)
}

/// Writes `<out>/<scenario>.md`: the section alone.
pub fn save_markdown(out: &Path, rep: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let mut md = format!("# {}\n\n", rep.scenario);
    // The section's own `## scenario` header is the page's title now.
    md.push_str(
        rep.markdown
            .strip_prefix(&format!("## {}\n\n", rep.scenario))
            .unwrap_or(&rep.markdown),
    );
    std::fs::write(out.join(format!("{}.md", rep.scenario)), md)
}

/// Rebuilds `<out>/latest.md` from every scenario JSON present.
pub fn write_latest(out: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(out)?;
    let mut md = String::from(
        "# actix-dispatch benchmark results\n\n\
         Written by `cargo run --release --example loadbench -- <scenario>`; each section\n\
         is the latest run of its scenario (see `bench/README.md` for the methodology).\n\
         The machine is shared and noisy: compare ratios measured in the same run,\n\
         not absolute numbers across sections. Where the time and memory of a task go,\n\
         and what to change in the engine: `profile.md`.\n\n",
    );
    for name in ORDER {
        let path = out.join(format!("{name}.json"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => {
                if let Some(s) = v.get("markdown").and_then(Value::as_str) {
                    md.push_str(s);
                    md.push('\n');
                }
            }
            Err(e) => {
                let _ = writeln!(md, "## {name}\n\n(unreadable {}: {e})\n", path.display());
            }
        }
    }
    let path = out.join("latest.md");
    std::fs::write(&path, md)?;
    Ok(path)
}

/// The command as typed, reconstructed.
fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let features = if cfg!(feature = "web") {
        " --features web"
    } else {
        ""
    };
    format!(
        "cargo run --release{features} --example loadbench -- {}",
        args.join(" ")
    )
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, from the system clock.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
