//! Progress on stderr: an indicatif bar on a terminal, plain lines in a pipe.
//!
//! Log lines go through [`LogWriter`], which prints them above the bar
//! (`ProgressBar::suspend`) instead of through it.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_dispatch::{Dispatcher, Instant};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::ProgressMode;

/// The bar, once shown, for the log writer.
static BAR: OnceLock<ProgressBar> = OnceLock::new();

/// How often a plain progress line is written.
const PLAIN_EVERY: Duration = Duration::from_secs(2);
/// How often the bar is refreshed.
const BAR_EVERY: Duration = Duration::from_millis(100);

/// Counts the results as they are written (single-threaded: the run's
/// System thread).
#[derive(Default)]
pub struct Counts {
    /// Results written (tasks and invalid lines).
    pub done: Cell<u64>,
    /// Successes.
    pub ok: Cell<u64>,
    /// Failures, rejections and invalid lines.
    pub failed: Cell<u64>,
}

/// Writes log records above the bar when there is one.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match BAR.get() {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| std::io::stderr().write(buf)),
            _ => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The running progress display.
pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
}

impl Progress {
    /// Starts the display `mode` asks for. `total` is the number of task
    /// lines once known (0 until then: no ETA).
    pub fn start(
        mode: ProgressMode,
        counts: Rc<Counts>,
        total: Arc<AtomicU64>,
        dispatcher: Dispatcher,
    ) -> Progress {
        let start = Instant::now();
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Plain,
            m => m,
        };
        let bar = (mode == ProgressMode::Bar).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(spinner_style());
            let _ = BAR.set(bar.clone());
            bar
        });
        match mode {
            ProgressMode::Bar => {
                let bar = bar.clone().expect("a bar");
                actix_rt::spawn(async move {
                    let mut tick = actix_rt::time::interval(BAR_EVERY);
                    let mut has_len = false;
                    // (time, done) of the last second, for the rate.
                    let mut window = std::collections::VecDeque::new();
                    loop {
                        tick.tick().await;
                        let n = total.load(Ordering::Relaxed);
                        if n > 0 && !has_len {
                            bar.set_length(n);
                            bar.set_style(bar_style());
                            has_len = true;
                        }
                        let (now, done) = (Instant::now(), counts.done.get());
                        window.push_back((now, done));
                        while window.len() > 10 {
                            window.pop_front();
                        }
                        let (then, done_then) = window.front().copied().unwrap_or((now, done));
                        let rate = rate(done - done_then, now.saturating_duration_since(then));
                        bar.set_position(done);
                        let engine = Engine::read(&dispatcher).await;
                        bar.set_message(format!(
                            "{rate:>6.0}/s  ok {}  failed {}  in flight {}  queued {}",
                            counts.ok.get(),
                            counts.failed.get(),
                            engine.in_flight,
                            engine.queued,
                        ));
                    }
                });
            }
            ProgressMode::Plain => {
                actix_rt::spawn(async move {
                    let mut tick = actix_rt::time::interval(PLAIN_EVERY);
                    tick.tick().await;
                    let (mut then, mut done_then) = (start, 0);
                    loop {
                        tick.tick().await;
                        let now = Instant::now();
                        let done = counts.done.get();
                        let rate = rate(done - done_then, now.saturating_duration_since(then));
                        (then, done_then) = (now, done);
                        let engine = Engine::read(&dispatcher).await;
                        eprintln!("{}", line(start, &counts, rate, &engine));
                    }
                });
            }
            _ => {}
        }
        Progress { bar, start }
    }

    /// Prints a line above the bar (or plainly).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    /// Removes the bar; writes a last plain line unless progress is off.
    pub fn finish(&self, counts: &Counts, mode: ProgressMode) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if mode != ProgressMode::None {
            let rate = rate(counts.done.get(), self.start.elapsed());
            let engine = Engine::default();
            eprintln!("{}", line(self.start, counts, rate, &engine));
        }
    }
}

/// Tasks in the engine: sent to a node, or waiting in a queue.
#[derive(Default)]
struct Engine {
    in_flight: u64,
    queued: u64,
}

impl Engine {
    async fn read(d: &Dispatcher) -> Engine {
        let stats = d.stats().await;
        let sum = |f: fn(&actix_dispatch::QueueStats) -> u64| {
            stats.services.iter().map(|s| f(&s.queue)).sum()
        };
        Engine {
            in_flight: sum(|q| q.in_flight),
            queued: sum(|q| q.queued + q.waiting),
        }
    }
}

fn rate(n: u64, over: Duration) -> f64 {
    n as f64 / over.as_secs_f64().max(1e-3)
}

fn line(start: Instant, c: &Counts, rate: f64, engine: &Engine) -> String {
    format!(
        "[{:>7.1}s] {} done  {rate:.0}/s  ok {}  failed {}  in flight {}  queued {}",
        start.elapsed().as_secs_f64(),
        c.done.get(),
        c.ok.get(),
        c.failed.get(),
        engine.in_flight,
        engine.queued,
    )
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{elapsed_precise}] {human_pos} done  {msg}")
        .expect("a valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "[{elapsed_precise}] [{wide_bar}] {human_pos}/{human_len}  {msg}  ETA {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ")
}
