//! `actix-dispatch`: runs a file of HTTP tasks through the engine.
//!
//! ```sh
//! actix-dispatch run --config cfg.json --tasks tasks.jsonl > results.jsonl
//! ```
//!
//! Reads JSONL tasks (the wire form of `actix_dispatch::codec::TaskLine`)
//! from a file or stdin, lazily, through `Dispatcher::feed`'s backpressure,
//! and writes one JSONL result per task to stdout as tasks finish. Progress
//! and a summary go to stderr. Exit code: 0 when every task succeeded, 1
//! when some did not (or a line was not a task, or the input could not be
//! read to its end), 2 for usage and config errors (a directory as
//! `--tasks`), 130 after an interrupt, 141 when stdout closed under the run
//! (`| head`).
//!
//! With the `redis` feature, `actix-dispatch enqueue --config cfg.json
//! --tasks tasks.jsonl` adds the same task lines to the durable task
//! streams instead (`actix_dispatch::redis::stream`), for instances running
//! `Dispatcher::consume` (or `actix-dispatch-worker`) to run.

#![forbid(unsafe_code)]

#[cfg(feature = "redis")]
mod enqueue;
mod input;
mod progress;
mod run;
mod summary;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "actix-dispatch",
    version,
    about = "Runs HTTP tasks across pools of backends"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reads JSONL tasks, writes one JSONL result per task to stdout.
    Run(RunArgs),
    /// Adds JSONL tasks to the durable task streams in Redis (feature
    /// `redis`); prints the entry ids.
    #[cfg(feature = "redis")]
    Enqueue(enqueue::EnqueueArgs),
}

/// Options of `actix-dispatch run`.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Engine config (JSON; the library's format).
    #[arg(long, short)]
    pub config: PathBuf,
    /// JSONL tasks, `-` for stdin.
    #[arg(long, short, default_value = "-")]
    pub tasks: String,
    /// Progress on stderr: a bar when stderr is a terminal (auto), a bar,
    /// plain lines every few seconds, or nothing.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// On Ctrl-C, how long unfinished tasks may still finish (`10s`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// On Ctrl-C, write the tasks that did not finish here, as JSONL task
    /// lines, ready to feed again.
    #[arg(long, value_name = "FILE")]
    pub unfinished: Option<PathBuf>,
    /// Leave response bodies out of the result lines.
    #[arg(long)]
    pub no_body: bool,
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    /// A live bar (rate, ok, failed, in flight, ETA).
    Bar,
    /// A line every few seconds.
    Plain,
    /// Nothing but the summary.
    None,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::main(args),
        #[cfg(feature = "redis")]
        Command::Enqueue(args) => enqueue::main(args),
    }
}
