//! `actix-dispatch run`: JSONL tasks in, JSONL results out.
//!
//! A reader thread reads the input line by line into a bounded channel; the
//! engine's `feed` pulls from it only while it has room, so the file is
//! never held in memory (at most the channel and the engine's window). Each
//! task carries its line number as its engine id, which maps its result back
//! to the line's own id and, after an interrupt, to the line itself.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

use actix_dispatch::codec::{ResultLine, TaskLine, WireId};
use actix_dispatch::{Config, Dispatcher, Instant, Outcome, Rejection, TaskResult};
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use crate::progress::{Counts, LogWriter, Progress};
use crate::summary::Tally;
use crate::{ProgressMode, RunArgs};

/// Lines read ahead of the engine.
const READ_AHEAD: usize = 1024;

/// Exit codes.
const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_INTERRUPTED: u8 = 130;

/// One input line: its number and text (or why it is not text).
type Line = (u64, Result<String, String>);

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
    waker: RefCell<Option<Waker>>,
    unfinished: RefCell<Option<BufWriter<File>>>,
    unfinished_count: Cell<u64>,
}

impl Shared {
    fn write(&self, line: &ResultLine) {
        let mut out = self.out.borrow_mut();
        let ok = serde_json::to_writer(&mut *out, line).is_ok() && out.write_all(b"\n").is_ok();
        if !ok {
            eprintln!("actix-dispatch: cannot write to stdout; stopping");
            std::process::exit(i32::from(EXIT_FAILED));
        }
    }

    fn flush(&self) {
        let _ = self.out.borrow_mut().flush();
    }

    fn invalid(&self, line: u64, reason: String) {
        self.write(&ResultLine::invalid(line, reason));
        self.tally.borrow_mut().record_invalid();
        let c = &self.counts;
        c.done.set(c.done.get() + 1);
        c.failed.set(c.failed.get() + 1);
    }

    /// Keeps a task line for `--unfinished`.
    fn keep_unfinished(&self, raw: &str) {
        self.unfinished_count.set(self.unfinished_count.get() + 1);
        if let Some(f) = self.unfinished.borrow_mut().as_mut() {
            let _ = writeln!(f, "{raw}");
        }
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

/// Reads lines into `tx` until the input ends or the receiver is closed.
/// Returns the number of the first line not handed over, if any.
fn read_lines(mut input: Box<dyn BufRead + Send>, tx: mpsc::Sender<Line>) -> Option<u64> {
    let mut buf = Vec::new();
    let mut n = 0u64;
    loop {
        buf.clear();
        match input.read_until(b'\n', &mut buf) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => {
                log::error!("reading tasks: {e}");
                return None;
            }
        }
        n += 1;
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let text = String::from_utf8(std::mem::take(&mut buf))
            .map_err(|e| format!("line is not UTF-8: {}", e.utf8_error()));
        if tx.blocking_send((n, text)).is_err() {
            return Some(n);
        }
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
            waker: RefCell::new(None),
            unfinished: RefCell::new(self.unfinished),
            unfinished_count: Cell::new(0),
        });
        let progress = Rc::new(Progress::start(
            self.args.progress,
            counts,
            self.total,
            dispatcher.clone(),
        ));

        let (tx, rx) = mpsc::channel::<Line>(READ_AHEAD);
        let input = self.input;
        let reader = std::thread::spawn(move || read_lines(input, tx));
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
                let parsed = text.and_then(|t| {
                    let line = TaskLine::parse(&t)?;
                    Ok((line.to_task()?, line.id, t))
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
        loop {
            let next = match results.next().now_or_never() {
                Some(next) => next,
                None => {
                    shared.flush();
                    results.next().await
                }
            };
            let Some(r) = next else { break };
            answer(&shared, &r, no_body);
        }
        shared.flush();

        // Lines read but never fed (after an interrupt) are unfinished too.
        let interrupted = shared.stop.get();
        rx.borrow_mut().close();
        while let Ok((_, text)) = rx.borrow_mut().try_recv() {
            // A line that is not text would only come back invalid.
            if let Ok(raw) = text {
                shared.keep_unfinished(&raw);
            }
        }
        // After an interrupt the reader may be blocked reading stdin: it is
        // left to the end of the process then.
        for _ in 0..100 {
            if !interrupted || reader.is_finished() {
                break;
            }
            actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let first_unread = match reader.is_finished() || !interrupted {
            true => reader.join().ok().flatten(),
            false => None,
        };

        let started = shutdown.borrow_mut().take();
        let report = match started {
            Some(pending) => pending.await.ok(),
            None => None,
        };
        let report = match report {
            Some(r) => r,
            None => dispatcher.shutdown(self.args.grace).await,
        };
        let counts = &shared.counts;
        progress.finish(counts, self.args.progress);
        if let Some(f) = shared.unfinished.borrow_mut().as_mut() {
            if let Err(e) = f.flush() {
                eprintln!("actix-dispatch: --unfinished: {e}");
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let summary = shared
            .tally
            .borrow()
            .report(&report.stats, elapsed, interrupted);
        eprint!("{}", summary.text());
        if interrupted {
            eprintln!(
                "\ninterrupted: {} unfinished task(s){}{}",
                shared.unfinished_count.get(),
                match &self.args.unfinished {
                    Some(p) => format!(" written to {}", p.display()),
                    None => " (use --unfinished FILE to keep them)".into(),
                },
                match first_unread {
                    Some(n) if self.args.tasks != "-" => {
                        format!("; input not read from line {n} on")
                    }
                    _ => String::new(),
                }
            );
        }
        if let Some(f) = self.summary_json {
            if let Err(e) = serde_json::to_writer_pretty(f, &summary) {
                eprintln!("actix-dispatch: --summary-json: {e}");
            }
        }
        if interrupted {
            ExitCode::from(EXIT_INTERRUPTED)
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
            shared.keep_unfinished(&raw);
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
        if let Some(f) = shared.unfinished.borrow_mut().as_mut() {
            let _ = f.flush();
        }
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
