//! Shared pieces: histograms, load loops, process counters, engine configs
//! and the bare awc client (the in-process transport is `immediate.rs`).

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Config, Instant};
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

/// Latency histogram in microseconds, 1 µs .. 10 min, 3 significant digits.
pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` (clamped into the histogram's range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, 600_000_000);
    h.saturating_record(us);
}

/// A latency summary, milliseconds.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Lat {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Lat {
    pub fn of(h: &Histogram<u64>) -> Lat {
        if h.is_empty() {
            return Lat::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Lat {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// Milliseconds with a sensible number of digits.
pub fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A count with thousands separators.
pub fn count(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// CPU time (user + system) of this process so far, seconds (USER_HZ = 100).
pub fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces) in parentheses.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Resident set size of this process, bytes (`VmRSS` of /proc/self/status).
pub fn rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One closed-loop run.
#[derive(Debug, Clone, Serialize)]
pub struct ClosedRun {
    pub tasks: u64,
    pub ok: u64,
    pub secs: f64,
    /// Tasks per second.
    pub rate: f64,
    /// Microseconds of wall time per task.
    pub us_per_task: f64,
    /// Process CPU time over wall time (1.0 = one core busy).
    pub cpu_util: f64,
    pub lat: Option<Lat>,
    #[serde(skip)]
    pub hist: Option<Histogram<u64>>,
}

/// Runs `n` tasks (stopping early after `max` of wall time) with `window`
/// in flight; `f(i)` makes task `i`, resolving to whether it succeeded.
/// With `latency`, each task's time from first poll to answer is recorded.
pub async fn closed_loop<F, Fut>(
    n: usize,
    window: usize,
    max: Duration,
    latency: bool,
    mut f: F,
) -> ClosedRun
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    let cpu0 = cpu_secs();
    let stream = futures::stream::iter(0..n)
        .take_while(move |_| std::future::ready(start.elapsed() < max))
        .map(move |i| {
            let fut = f(i);
            async move {
                if latency {
                    let t = Instant::now();
                    let ok = fut.await;
                    (ok, Some(t.elapsed()))
                } else {
                    (fut.await, None)
                }
            }
        })
        .buffer_unordered(window.max(1));
    let mut stream = std::pin::pin!(stream);
    let mut h = latency.then(hist);
    let (mut tasks, mut ok) = (0u64, 0u64);
    while let Some((good, lat)) = stream.next().await {
        tasks += 1;
        ok += u64::from(good);
        if let (Some(h), Some(d)) = (h.as_mut(), lat) {
            record(h, d);
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let cpu = cpu_secs() - cpu0;
    ClosedRun {
        tasks,
        ok,
        secs,
        rate: tasks as f64 / secs,
        us_per_task: secs * 1e6 / tasks.max(1) as f64,
        cpu_util: cpu / secs,
        lat: h.as_ref().map(Lat::of),
        hist: h,
    }
}

/// One task of an open-loop run.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Intended start, from the run's start.
    pub intended: Duration,
    /// From the intended start to the answer.
    pub latency: Duration,
    pub ok: bool,
}

/// An open-loop run: what came back, and how many never did in time.
pub struct OpenRun {
    pub samples: Vec<Sample>,
    pub sent: usize,
    pub unfinished: usize,
    /// How late the scheduler was at worst (how far behind its arrival times).
    pub max_lag: Duration,
}

/// Starts task `i` at `start + i / rate` for `duration`, whatever happened to
/// the earlier ones (open loop), and measures each from its intended start,
/// so time spent waiting behind the scheduler or the engine is not hidden.
/// Waits for the stragglers at most `grace` after the last arrival.
pub async fn open_loop<F, Fut>(rate: f64, duration: Duration, grace: Duration, mut f: F) -> OpenRun
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = bool> + 'static,
{
    let n = (rate * duration.as_secs_f64()).round().max(1.0) as usize;
    let t0 = Instant::now() + Duration::from_millis(20);
    let samples = Rc::new(RefCell::new(Vec::with_capacity(n)));
    let mut handles = Vec::with_capacity(n);
    let mut max_lag = Duration::ZERO;
    for i in 0..n {
        let intended = t0 + Duration::from_secs_f64(i as f64 / rate);
        actix_rt::time::sleep_until(intended).await;
        max_lag = max_lag.max(Instant::now().saturating_duration_since(intended));
        let fut = f(i);
        let s = samples.clone();
        handles.push(actix_rt::spawn(async move {
            let ok = fut.await;
            let latency = Instant::now().saturating_duration_since(intended);
            s.borrow_mut().push(Sample {
                intended: intended - t0,
                latency,
                ok,
            });
        }));
    }
    let all = futures::future::join_all(handles.iter_mut());
    let _ = actix_rt::time::timeout(grace, all).await;
    for h in &handles {
        h.abort();
    }
    let samples = std::mem::take(&mut *samples.borrow_mut());
    OpenRun {
        unfinished: n - samples.len(),
        sent: n,
        samples,
        max_lag,
    }
}

/// A one-service engine config: `mode` over `urls`, each `max_concurrent`,
/// plus `extra` service fields (e.g. `{"timeout": "1s"}`).
pub fn engine_config(
    mode: &str,
    urls: &[String],
    max_concurrent: u32,
    extra: Value,
) -> Result<Config, String> {
    let endpoints: Vec<Value> = urls
        .iter()
        .map(|u| json!({"address": u, "max_concurrent": max_concurrent}))
        .collect();
    let mut svc = json!({"name": "bench", "mode": mode, "endpoints": endpoints});
    if let (Some(o), Value::Object(e)) = (svc.as_object_mut(), extra) {
        o.extend(e);
    }
    let text = json!({ "services": [svc] }).to_string();
    Config::from_json(&text).map_err(|e| format!("bench config refused: {e}"))
}

/// `n` distinct endpoint addresses for in-process transports (never dialled).
pub fn fake_urls(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "http://10.{}.{}.{}:8080/",
                i >> 16 & 255,
                i >> 8 & 255,
                i & 255
            )
        })
        .collect()
}

/// A bare awc client set up like the engine's transport: no redirects, no
/// connection cap.
pub fn bare_client(timeout: Duration) -> awc::Client {
    let connector = awc::Connector::new()
        .limit(0)
        .timeout(Duration::from_secs(5));
    awc::Client::builder()
        .disable_redirects()
        .connector(connector)
        .timeout(timeout)
        .finish()
}

/// One GET with the bare client; true for a 2xx with its body read.
pub async fn bare_get(client: awc::Client, url: String) -> bool {
    match client.get(url).send().await {
        Ok(mut res) => {
            let ok = res.status().is_success();
            res.body().limit(2 * 1024 * 1024).await.is_ok() && ok
        }
        Err(_) => false,
    }
}

/// Picks the knob: explicit flag, else smoke value, else full value.
pub fn pick<T: Copy>(explicit: Option<T>, smoke: bool, smoke_v: T, full_v: T) -> T {
    explicit.unwrap_or(if smoke { smoke_v } else { full_v })
}

/// Runs a probe (this benchmark's own binary with a hidden probe scenario,
/// in a fresh process so its RSS is its own) and parses the one line it
/// prints as `PROBE <json>`.
pub fn run_probe(mut cmd: std::process::Command, name: &str) -> Result<Value, String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{name} failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("PROBE "))
        .ok_or(format!("{name} printed no result"))?;
    serde_json::from_str(line).map_err(|e| format!("{name} result: {e}"))
}
