//! `actix-dispatch run`: JSONL tasks in, JSONL results out.
//!
//! A reader thread ([`crate::input`]) reads the input line by line into a
//! bounded channel; the engine's `feed` pulls from it only while it has
//! room, so the file is never held in memory (at most the channel and the
//! engine's window). Each task carries its line number as its engine id,
//! which maps its result back to the line's own id and, after an
//! interrupt, to the line itself.
//!
//! The run stops early on an interrupt (in-flight tasks get `--grace`) or
//! when stdout fails (a closed pipe, as under `| head`: no new task is
//! sent, in-flight ones are not waited for, the process exits 141, as a
//! tool killed by `SIGPIPE` would). Either way `--unfinished` then holds
//! every task without a result: in flight, read ahead, and the input not
//! read yet.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use actix_dispatch::codec::{LineLimits, ResultLine, TaskLine, WireId};
use actix_dispatch::{Config, Dispatcher, Instant, Outcome, Rejection, TaskResult};
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use crate::input::{lock, read_lines, Line, ReadEnd, Unfinished, UnfinishedFile};
use crate::progress::{Counts, LogWriter, Progress};
use crate::summary::Tally;
use crate::{ProgressMode, RunArgs};

/// Lines read ahead of the engine.
const READ_AHEAD: usize = 1024;

/// Exit codes.
const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_INTERRUPTED: u8 = 130;
/// stdout closed under the run (128 + SIGPIPE, as a shell reports a tool
/// that `SIGPIPE` killed).
const EXIT_BROKEN_PIPE: u8 = 141;

/// A task handed to the engine and not answered yet.
struct Pending {
    id: Option<WireId>,
    raw: String,
}

/// State shared by the task stream, the result loop and the signal task.
struct Shared {
    out: RefCell<BufWriter<std::io::StdoutLock<'static>>>,
    pending: RefCell<HashMap<u64, Pending>>,
    tally: RefCell<Tally>,
    counts: Rc<Counts>,
    stop: Cell<bool>,
    /// Why stdout failed, once it has: nothing more is written or sent.
    broken: RefCell<Option<io::Error>>,
    waker: RefCell<Option<Waker>>,
    unfinished: Unfinished,
}

impl Shared {
    fn write(&self, line: &ResultLine) {
        if self.broken.borrow().is_some() {
            return;
        }
        let written = {
            let mut out = self.out.borrow_mut();
            serde_json::to_writer(&mut *out, line)
                .map_err(io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
        };
        if let Err(e) = written {
            self.output_failed(e);
        }
    }

    fn flush(&self) {
        if self.broken.borrow().is_some() {
            return;
        }
        let flushed = self.out.borrow_mut().flush();
        if let Err(e) = flushed {
            self.output_failed(e);
        }
    }

    /// stdout failed: stop taking tasks at once (the result loop stops
    /// too, and the engine is shut down without grace).
    fn output_failed(&self, e: io::Error) {
        *self.broken.borrow_mut() = Some(e);
        self.stop.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.borrow().is_some()
    }

    fn invalid(&self, line: u64, reason: String) {
        self.write(&ResultLine::invalid(line, reason));
        self.tally.borrow_mut().record_invalid();
        let c = &self.counts;
        c.done.set(c.done.get() + 1);
        c.failed.set(c.failed.get() + 1);
    }

    /// Keeps a task line for `--unfinished`.
    fn keep_unfinished(&self, raw: &[u8]) {
        lock(&self.unfinished).keep(raw);
    }
}

/// Runs `actix-dispatch run`; returns the process's exit code.
pub fn main(args: RunArgs) -> ExitCode {
    let env = env_logger::Env::default().default_filter_or("actix_dispatch=warn");
    env_logger::Builder::from_env(env)
        .target(env_logger::Target::Pipe(Box::new(LogWriter)))
        .init();
    let usage = |msg: String| {
        eprintln!("actix-dispatch: {msg}");
        ExitCode::from(EXIT_USAGE)
    };
    let config = match Config::from_file(&args.config) {
        Ok(c) => c,
        Err(e) => return usage(format!("config {}: {e}", args.config.display())),
    };
    let input: Box<dyn BufRead + Send> = if args.tasks == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        match File::open(&args.tasks) {
            // Opening a directory succeeds; reading it does not.
            Ok(f) if f.metadata().is_ok_and(|m| m.is_dir()) => {
                return usage(format!("tasks {}: is a directory", args.tasks))
            }
            Ok(f) => Box::new(BufReader::with_capacity(1 << 16, f)),
            Err(e) => return usage(format!("tasks {}: {e}", args.tasks)),
        }
    };
    let unfinished = match &args.unfinished {
        Some(p) => match File::create(p) {
            Ok(f) => Some(BufWriter::new(f)),
            Err(e) => return usage(format!("--unfinished {}: {e}", p.display())),
        },
        None => None,
    };
    let summary_json = match &args.summary_json {
        Some(p) => match File::create(p) {
            Ok(f) => Some(f),
            Err(e) => return usage(format!("--summary-json {}: {e}", p.display())),
        },
        None => None,
    };
    // The total, for the bar's ETA: counted on the side, for files only.
    let total = Arc::new(AtomicU64::new(0));
    if args.tasks != "-" && args.progress != ProgressMode::None {
        let (path, total) = (args.tasks.clone(), Arc::clone(&total));
        std::thread::spawn(move || {
            if let Ok(n) = count_lines(&path) {
                total.store(n, Ordering::Relaxed);
            }
        });
    }
    let run = Run {
        args,
        config,
        input,
        unfinished,
        summary_json,
        total,
    };
    actix_rt::System::new().block_on(run.go())
}

fn count_lines(path: &str) -> std::io::Result<u64> {
    let mut r = BufReader::with_capacity(1 << 16, File::open(path)?);
    let mut n = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(n);
        }
        n += buf.iter().filter(|b| **b == b'\n').count() as u64;
        let len = buf.len();
        r.consume(len);
    }
}

struct Run {
    args: RunArgs,
    config: Config,
    input: Box<dyn BufRead + Send>,
    unfinished: Option<BufWriter<File>>,
    summary_json: Option<File>,
    total: Arc<AtomicU64>,
}

impl Run {
    async fn go(self) -> ExitCode {
        let start = Instant::now();
        // What a line may ask of each service (`lines`), by lower-cased
        // name as services match.
        let limits: HashMap<String, LineLimits> = self
            .config
            .services
            .iter()
            .map(|s| (s.name.to_lowercase(), s.lines.clone()))
            .collect();
        let dispatcher = match Dispatcher::start(self.config) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("actix-dispatch: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        };
        let counts = Rc::new(Counts::default());
        let shared = Rc::new(Shared {
            out: RefCell::new(BufWriter::with_capacity(1 << 16, std::io::stdout().lock())),
            pending: RefCell::new(HashMap::new()),
            tally: RefCell::new(Tally::default()),
            counts: Rc::clone(&counts),
            stop: Cell::new(false),
            broken: RefCell::new(None),
            waker: RefCell::new(None),
            unfinished: UnfinishedFile::new(self.unfinished),
        });
        let progress = Rc::new(Progress::start(
            self.args.progress,
            counts,
            self.total,
            dispatcher.clone(),
        ));

        let (tx, rx) = mpsc::channel::<Line>(READ_AHEAD);
        let (copy_rest, copy_rest_rx) = std::sync::mpsc::channel();
        let input = self.input;
        let reader = std::thread::spawn(move || read_lines(input, tx, copy_rest_rx));
        let rx = Rc::new(RefCell::new(rx));

        let shutdown = watch_signals(
            dispatcher.clone(),
            Rc::clone(&shared),
            Rc::clone(&progress),
            self.args.grace,
        );

        // The task stream: parse each line; a bad one is answered at once.
        let tasks = futures::stream::poll_fn({
            let (shared, rx) = (Rc::clone(&shared), Rc::clone(&rx));
            move |cx| loop {
                if shared.stop.get() {
                    return Poll::Ready(None);
                }
                let (n, text) = match rx.borrow_mut().poll_recv(cx) {
                    Poll::Ready(Some(line)) => line,
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => {
                        *shared.waker.borrow_mut() = Some(cx.waker().clone());
                        shared.flush();
                        return Poll::Pending;
                    }
                };
                let parsed = String::from_utf8(text)
                    .map_err(|e| format!("line is not UTF-8: {}", e.utf8_error()))
                    .and_then(|t| {
                        let line = TaskLine::parse(&t)?;
                        // Within its service's `lines`; a line for no
                        // configured service is refused at submit.
                        let task = match limits.get(&line.service.trim().to_lowercase()) {
                            Some(l) => line.to_task_within(l)?,
                            None => line.to_task()?,
                        };
                        Ok((task, line.id, t))
                    });
                match parsed {
                    Ok((task, id, raw)) => {
                        shared.pending.borrow_mut().insert(n, Pending { id, raw });
                        return Poll::Ready(Some(task.id(n)));
                    }
                    Err(reason) => shared.invalid(n, reason),
                }
            }
        });

        let mut results = dispatcher.feed(tasks);
        let no_body = self.args.no_body;
        while !shared.is_broken() {
            let next = match results.next().now_or_never() {
                Some(next) => next,
                None => {
                    shared.flush();
                    if shared.is_broken() {
                        break;
                    }
                    results.next().await
                }
            };
            let Some(r) = next else { break };
            answer(&shared, &r, no_body);
        }
        shared.flush();
        let broken = shared.broken.borrow_mut().take();

        // With stdout gone, nothing waits for the tasks in flight: the
        // engine stops now (the signal's shutdown, if one started, stops
        // it too), and they are unfinished.
        let started = shutdown.borrow_mut().take();
        let report = match started {
            Some(pending) => pending.await.ok(),
            None if broken.is_some() => Some(dispatcher.shutdown(Duration::ZERO).await),
            None => None,
        };
        drop(results);
        let mut left: Vec<(u64, Pending)> = shared.pending.borrow_mut().drain().collect();
        left.sort_by_key(|(n, _)| *n);
        for (_, p) in left {
            shared.keep_unfinished(p.raw.as_bytes());
        }

        // Lines read but never fed are unfinished too, then (with
        // `--unfinished`) the input not read yet.
        let stopped = shared.stop.get();
        rx.borrow_mut().close();
        while let Ok((_, raw)) = rx.borrow_mut().try_recv() {
            shared.keep_unfinished(&raw);
        }
        let copy = stopped && lock(&shared.unfinished).has_file();
        let _ = copy_rest.send(copy.then(|| Arc::clone(&shared.unfinished)));
        // A reader blocked on stdin is left to the end of the process,
        // unless it copies the rest (a second interrupt quits then).
        let patience = match (copy, broken.is_some()) {
            (true, _) => None,
            (false, true) => Some(Duration::from_millis(50)),
            (false, false) => Some(Duration::from_secs(1)),
        };
        let waited = Instant::now();
        let mut noted = false;
        while stopped && !reader.is_finished() {
            let elapsed = waited.elapsed();
            if patience.is_some_and(|p| elapsed >= p) {
                break;
            }
            if !noted && elapsed >= Duration::from_millis(200) {
                noted = true;
                progress
                    .note("copying the unread input to --unfinished (interrupt again to quit now)");
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        let read_end = match reader.is_finished() || !stopped {
            true => reader.join().ok(),
            false => None,
        };

        let report = match report {
            Some(r) => r,
            None => dispatcher.shutdown(self.args.grace).await,
        };
        let counts = &shared.counts;
        progress.finish(counts, self.args.progress);
        if let Err(e) = lock(&shared.unfinished).finish() {
            eprintln!("actix-dispatch: --unfinished: {e}");
        }
        let interrupted = stopped && broken.is_none();
        let elapsed = start.elapsed().as_secs_f64();
        let summary = shared
            .tally
            .borrow()
            .report(&report.stats, elapsed, interrupted);
        eprint!("{}", summary.text());
        let unfinished = lock(&shared.unfinished).count();
        if stopped {
            let unread = match &read_end {
                Some(ReadEnd::Stopped {
                    first,
                    kept: 0,
                    error: None,
                }) => format!("; input not read from line {first} on"),
                Some(ReadEnd::Stopped {
                    first,
                    error: Some(e),
                    ..
                }) => format!("; reading the input from line {first} on failed: {e}"),
                Some(_) => String::new(),
                None if !copy => "; input not read to its end".into(),
                None => "; the input's rest may be missing".into(),
            };
            eprintln!(
                "\n{}: {unfinished} unfinished task(s){}{unread}",
                match &broken {
                    Some(e) => format!("stdout closed ({e}); stopped"),
                    None => "interrupted".into(),
                },
                match &self.args.unfinished {
                    Some(p) => format!(" written to {}", p.display()),
                    None => " (use --unfinished FILE to keep them)".into(),
                },
            );
        }
        let read_failed = match read_end {
            Some(ReadEnd::Failed { after, error }) => {
                eprintln!(
                    "actix-dispatch: reading tasks {}: {error} (after line {after}); \
                     the rest of the input was not run",
                    if self.args.tasks == "-" {
                        "from stdin"
                    } else {
                        &self.args.tasks
                    },
                );
                true
            }
            _ => false,
        };
        if let Some(f) = self.summary_json {
            if let Err(e) = serde_json::to_writer_pretty(f, &summary) {
                eprintln!("actix-dispatch: --summary-json: {e}");
            }
        }
        if broken.is_some() {
            ExitCode::from(EXIT_BROKEN_PIPE)
        } else if interrupted {
            ExitCode::from(EXIT_INTERRUPTED)
        } else if read_failed {
            ExitCode::from(EXIT_FAILED)
        } else if counts.failed.get() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Writes a task's result line and counts it; a task stopped by shutdown
/// is kept for `--unfinished`.
fn answer(shared: &Shared, r: &TaskResult, no_body: bool) {
    let pending = shared.pending.borrow_mut().remove(&r.id);
    let (id, raw) = match pending {
        Some(p) => (p.id, Some(p.raw)),
        None => (None, None),
    };
    let mut line = ResultLine::from_result(r, id, Some(r.id));
    if no_body {
        line.body = None;
        line.body_encoding = None;
    }
    shared.write(&line);
    shared.tally.borrow_mut().record(r);
    let c = &shared.counts;
    c.done.set(c.done.get() + 1);
    if r.is_success() {
        c.ok.set(c.ok.get() + 1);
    } else {
        c.failed.set(c.failed.get() + 1);
    }
    if matches!(r.outcome, Outcome::Rejected(Rejection::ShuttingDown)) {
        if let Some(raw) = raw {
            shared.keep_unfinished(raw.as_bytes());
        }
    }
}

type ShutdownTask = actix_rt::task::JoinHandle<actix_dispatch::ShutdownReport>;

/// On the first SIGINT or SIGTERM: stop reading, shut the engine down with
/// `grace`; on a second: exit at once. Returns the shutdown's handle once
/// started.
fn watch_signals(
    dispatcher: Dispatcher,
    shared: Rc<Shared>,
    progress: Rc<Progress>,
    grace: std::time::Duration,
) -> Rc<RefCell<Option<ShutdownTask>>> {
    let slot: Rc<RefCell<Option<ShutdownTask>>> = Rc::new(RefCell::new(None));
    let mut signals = Signals::new();
    let out = Rc::clone(&slot);
    actix_rt::spawn(async move {
        signals.next().await;
        progress.note(&format!(
            "interrupted: no new tasks; waiting up to {grace:?} for those in flight \
             (interrupt again to quit now)"
        ));
        shared.stop.set(true);
        if let Some(w) = shared.waker.borrow_mut().take() {
            w.wake();
        }
        let d = dispatcher.clone();
        *out.borrow_mut() = Some(actix_rt::spawn(async move { d.shutdown(grace).await }));
        signals.next().await;
        shared.flush();
        let _ = lock(&shared.unfinished).finish();
        eprintln!("actix-dispatch: interrupted twice; quitting (--unfinished may be incomplete)");
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    });
    slot
}

/// SIGINT and SIGTERM, registered at once (so a signal that comes before
/// the first poll is not lost).
struct Signals {
    #[cfg(unix)]
    int: Option<actix_rt::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<actix_rt::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use actix_rt::signal::unix::{signal, SignalKind};
            Signals {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            let int = async {
                match self.int.as_mut() {
                    Some(s) => s.recv().await,
                    None => futures::future::pending().await,
                }
            };
            let term = async {
                match self.term.as_mut() {
                    Some(s) => s.recv().await,
                    None => futures::future::pending().await,
                }
            };
            futures::pin_mut!(int, term);
            futures::future::select(int, term).await;
        }
        #[cfg(not(unix))]
        {
            let _ = actix_rt::signal::ctrl_c().await;
        }
    }
}
