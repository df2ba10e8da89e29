//! `actix-dispatch enqueue`: adds JSONL task lines to the durable task
//! streams of the config's `redis` section (feature `redis`).
//!
//! ```sh
//! actix-dispatch enqueue --config cfg.json --tasks tasks.jsonl
//! ```
//!
//! Each line is checked as a task line (the same codec as `run`) and added
//! with `XADD {prefix}:{svc}:tasks * task <line>`, in pipelines of 500; the
//! entry ids go to stdout, one a line. Instances running
//! `Dispatcher::consume` (or `actix-dispatch-worker`) run them. Exit code:
//! 0 when every line was added, 1 when some line was not a task (it is
//! skipped and reported on stderr), 2 for usage, config and Redis errors.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use actix_dispatch::codec::TaskLine;
use actix_dispatch::redis::stream::{key, TASK_FIELD};
use actix_dispatch::Config;

/// Options of `actix-dispatch enqueue`.
#[derive(clap::Args, Debug)]
pub(crate) struct EnqueueArgs {
    /// Engine config (JSON) with a top-level `redis` section.
    #[arg(long, short)]
    pub config: PathBuf,
    /// JSONL tasks, `-` for stdin.
    #[arg(long, short, default_value = "-")]
    pub tasks: String,
}

const BATCH: usize = 500;

pub(crate) fn main(args: EnqueueArgs) -> ExitCode {
    let fail = |m: String| {
        eprintln!("actix-dispatch enqueue: {m}");
        ExitCode::from(2)
    };
    let config = match Config::from_file(&args.config) {
        Ok(c) => c,
        Err(e) => return fail(format!("{}: {e}", args.config.display())),
    };
    let Some(redis) = config.redis.clone() else {
        return fail("the config has no top-level `redis` section".into());
    };
    let input: Box<dyn BufRead> = if args.tasks == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        match std::fs::File::open(&args.tasks) {
            Ok(f) => Box::new(BufReader::new(f)),
            Err(e) => return fail(format!("--tasks {}: {e}", args.tasks)),
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("runtime: {e}")),
    };
    rt.block_on(async move {
        // One node, a Cluster, or the master the sentinels name.
        let mut con = match actix_dispatch::redis::connect(&redis).await {
            Ok(c) => c,
            Err(e) => {
                let e = redis.scrub(&e.to_string());
                return fail(format!("redis {}: {e}", redis.redacted_url()));
            }
        };
        let (mut added, mut invalid) = (0u64, 0u64);
        let mut batch = redis::pipe();
        let mut in_batch = 0;
        let mut out = std::io::stdout().lock();
        let mut lines = input.lines().enumerate();
        loop {
            let next = lines.next();
            if let Some((n, line)) = &next {
                let line = match line {
                    Ok(l) => l,
                    Err(e) => return fail(format!("reading tasks: {e}")),
                };
                if line.trim().is_empty() {
                    continue;
                }
                let checked = TaskLine::parse(line).and_then(|t| {
                    let svc = config
                        .services
                        .iter()
                        .find(|s| s.name.eq_ignore_ascii_case(t.service.trim()))
                        .ok_or_else(|| format!("unknown service {:?}", t.service))?;
                    // What the consumer would refuse is refused here.
                    t.to_task_within(&svc.lines)?;
                    Ok((svc.name.clone(), t))
                });
                match checked {
                    Ok((svc, t)) => {
                        let json = serde_json::to_string(&t).expect("a task line serialises");
                        batch
                            .cmd("XADD")
                            .arg(key(&redis.prefix, &svc, "tasks"))
                            .arg("*")
                            .arg(TASK_FIELD)
                            .arg(json);
                        in_batch += 1;
                    }
                    Err(e) => {
                        invalid += 1;
                        // Escaped: the line is input, its text may hold newlines.
                        eprintln!(
                            "actix-dispatch enqueue: line {}: {}",
                            n + 1,
                            e.escape_debug()
                        );
                    }
                }
            }
            if in_batch > 0 && (in_batch >= BATCH || next.is_none()) {
                let ids: Vec<String> = match batch.query_async(&mut con).await {
                    Ok(ids) => ids,
                    Err(e) => {
                        let e = redis.scrub(&e.to_string());
                        return fail(format!("redis: {e} (after {added} added)"));
                    }
                };
                added += ids.len() as u64;
                for id in ids {
                    let _ = writeln!(out, "{id}");
                }
                batch = redis::pipe();
                in_batch = 0;
            }
            if next.is_none() {
                break;
            }
        }
        eprintln!("actix-dispatch enqueue: {added} task(s) added, {invalid} invalid line(s)");
        if invalid > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    })
}
