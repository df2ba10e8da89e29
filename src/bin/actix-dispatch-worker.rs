//! `actix-dispatch-worker`: one engine instance consuming the durable task
//! streams of its config (feature `redis`).
//!
//! ```sh
//! actix-dispatch-worker --config cfg.json [--consumer NAME] [--group G] \
//!     [--claim-after 30s] [--claim-every 1s] [--max-deliveries 5] [--grace 5s]
//! ```
//!
//! The stream's settings are the config's `redis.stream` object (the
//! defaults without it); each flag given overrides its field.
//!
//! Logs go to standard error through `env_logger` (`RUST_LOG`, default
//! `info`): the consumer's claims, dead letters and Redis warnings.
//!
//! It runs until its standard input closes (or the process is killed), then
//! shuts down with the grace period, leaving unfinished entries pending for
//! other instances, and prints its final stats as one JSON line on stdout.
//! The tests (`tests/redis_stream.rs`) run three of these and `kill -9` one.

#![forbid(unsafe_code)]

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use actix_dispatch::redis::stream::StreamConfig;
use actix_dispatch::{Config, Dispatcher};

struct Args {
    config: String,
    overrides: Overrides,
    grace: Duration,
}

/// The stream settings given as flags, over the config's `redis.stream`.
#[derive(Default)]
struct Overrides {
    consumer: Option<String>,
    group: Option<String>,
    claim_after: Option<Duration>,
    claim_every: Option<Duration>,
    max_deliveries: Option<u32>,
}

impl Overrides {
    fn apply(self, s: &mut StreamConfig) {
        if let Some(v) = self.consumer {
            s.consumer = v;
        }
        if let Some(v) = self.group {
            s.group = v;
        }
        if let Some(v) = self.claim_after {
            s.claim_after = Some(v);
        }
        if let Some(v) = self.claim_every {
            s.claim_every = Some(v);
        }
        if let Some(v) = self.max_deliveries {
            s.max_deliveries = v;
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

fn parse() -> Result<Args, String> {
    let mut config = None;
    let mut stream = Overrides::default();
    let mut grace = Duration::from_secs(5);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--config" | "-c" => config = Some(value()?),
            "--consumer" => stream.consumer = Some(value()?),
            "--group" => stream.group = Some(value()?),
            "--claim-after" => stream.claim_after = Some(duration(&value()?)?),
            "--claim-every" => stream.claim_every = Some(duration(&value()?)?),
            "--max-deliveries" => {
                stream.max_deliveries = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--grace" => grace = duration(&value()?)?,
            "--help" | "-h" => {
                return Err("usage: actix-dispatch-worker --config FILE [--consumer NAME] \
                     [--group G] [--claim-after D] [--claim-every D] [--max-deliveries N] [--grace D]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        config: config.ok_or("--config is required")?,
        overrides: stream,
        grace,
    })
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("actix-dispatch-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match std::fs::read_to_string(&args.config)
        .map_err(|e| e.to_string())
        .and_then(|s| Config::from_json(&s).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("actix-dispatch-worker: {}: {e}", args.config);
            return ExitCode::from(2);
        }
    };
    // The config's `redis.stream` settings, the flags over them.
    let mut stream = cfg
        .redis
        .as_ref()
        .map(|r| r.stream_config())
        .unwrap_or_default();
    args.overrides.apply(&mut stream);
    // Standard input closing is the signal to stop.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = tx.send(());
    });
    actix::System::new().block_on(async move {
        let d = match Dispatcher::start(cfg) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("actix-dispatch-worker: {e}");
                return ExitCode::from(2);
            }
        };
        if let Err(e) = d.consume(stream).await {
            eprintln!("actix-dispatch-worker: {e}");
            return ExitCode::from(2);
        }
        let _ = rx.await;
        let report = d.shutdown(args.grace).await;
        match serde_json::to_string(&report.stats) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("actix-dispatch-worker: stats: {e}"),
        }
        ExitCode::SUCCESS
    })
}
