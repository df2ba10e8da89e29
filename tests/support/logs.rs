//! A logger that keeps every line (debug level and up) for tests to read,
//! installed once per test binary. It also prints them to stderr, so a
//! failing test still shows its logs.

use std::sync::{Mutex, OnceLock};

struct Capture(Mutex<Vec<String>>);

static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Debug
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}: {}", r.level(), r.target(), r.args());
            eprintln!("{line}");
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    fn flush(&self) {}
}

/// Installs the capturing logger (once; later calls do nothing).
pub fn capture() {
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        if log::set_logger(c).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
        c
    });
}

/// Every line logged so far.
pub fn lines() -> Vec<String> {
    capture();
    CAPTURE
        .get()
        .map(|c| c.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .unwrap_or_default()
}
