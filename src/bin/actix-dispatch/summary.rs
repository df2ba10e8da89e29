//! The end-of-run summary: per service and node, counts, success rates,
//! latency percentiles (HdrHistogram, µs, 3 significant digits), status
//! classes, retries and breaker trips. Printed to stderr; `--summary-json`
//! writes the same as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use actix_dispatch::{AttemptOutcome, Outcome, Rejection, Stats, TaskResult};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies up to an hour, in µs.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// What the results said, as they arrive.
#[derive(Default)]
pub struct Tally {
    services: BTreeMap<String, ServiceTally>,
    invalid: u64,
}

struct ServiceTally {
    tasks: u64,
    succeeded: u64,
    failed: u64,
    rejected: u64,
    overloaded: u64,
    unfinished: u64,
    retries: u64,
    total: Histogram<u64>,
    nodes: BTreeMap<String, NodeTally>,
}

struct NodeTally {
    attempts: u64,
    succeeded: u64,
    classes: BTreeMap<String, u64>,
    latency: Histogram<u64>,
}

impl Tally {
    /// Counts one result; a `ShuttingDown` rejection counts as unfinished.
    pub fn record(&mut self, r: &TaskResult) {
        let s = self
            .services
            .entry(r.service.to_string())
            .or_insert_with(|| ServiceTally {
                tasks: 0,
                succeeded: 0,
                failed: 0,
                rejected: 0,
                overloaded: 0,
                unfinished: 0,
                retries: 0,
                total: histogram(),
                nodes: BTreeMap::new(),
            });
        s.tasks += 1;
        match &r.outcome {
            Outcome::Success(_) => s.succeeded += 1,
            Outcome::Failure(_) => s.failed += 1,
            Outcome::Rejected(Rejection::ShuttingDown) => s.unfinished += 1,
            Outcome::Rejected(Rejection::Overloaded { .. }) => {
                s.rejected += 1;
                s.overloaded += 1;
            }
            Outcome::Rejected(_) | Outcome::Fallback { .. } => s.rejected += 1,
            // `Outcome` may grow: a kind this summary does not know yet did
            // not succeed.
            _ => s.failed += 1,
        }
        s.retries += r.retries() as u64;
        s.total.saturating_record(micros(r.total));
        for a in &r.attempts {
            let n = s
                .nodes
                .entry(a.node.to_string())
                .or_insert_with(|| NodeTally {
                    attempts: 0,
                    succeeded: 0,
                    classes: BTreeMap::new(),
                    latency: histogram(),
                });
            n.attempts += 1;
            n.succeeded += u64::from(a.outcome.is_success());
            *n.classes.entry(class(&a.outcome)).or_default() += 1;
            n.latency.saturating_record(micros(a.latency));
        }
    }

    /// Counts a line that was not a task.
    pub fn record_invalid(&mut self) {
        self.invalid += 1;
    }

    /// The report, with breaker trips from the engine's final `stats`.
    pub fn report(&self, stats: &Stats, elapsed_s: f64, interrupted: bool) -> Report {
        let services: Vec<ServiceReport> = self
            .services
            .iter()
            .map(|(name, s)| ServiceReport {
                name: name.clone(),
                tasks: s.tasks,
                succeeded: s.succeeded,
                failed: s.failed,
                rejected: s.rejected,
                overloaded: s.overloaded,
                unfinished: s.unfinished,
                success_rate: ratio(s.succeeded, s.tasks),
                retries: s.retries,
                latency_ms: Percentiles::of(&s.total),
                nodes: s
                    .nodes
                    .iter()
                    .map(|(address, n)| NodeReport {
                        address: address.clone(),
                        attempts: n.attempts,
                        succeeded: n.succeeded,
                        success_rate: ratio(n.succeeded, n.attempts),
                        latency_ms: Percentiles::of(&n.latency),
                        classes: n.classes.clone(),
                        breaker_trips: stats
                            .service(name)
                            .and_then(|st| st.node(address))
                            .map_or(0, |node| node.trips),
                    })
                    .collect(),
            })
            .collect();
        let sum = |f: fn(&ServiceReport) -> u64| services.iter().map(f).sum::<u64>();
        Report {
            elapsed_s: (elapsed_s * 1e3).round() / 1e3,
            interrupted,
            tasks: sum(|s| s.tasks),
            succeeded: sum(|s| s.succeeded),
            failed: sum(|s| s.failed),
            rejected: sum(|s| s.rejected),
            overloaded: sum(|s| s.overloaded),
            unfinished: sum(|s| s.unfinished),
            invalid: self.invalid,
            services,
        }
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// `2xx` .. `5xx` for answers, the error kind (`timeout`, `connect`, ...)
/// otherwise.
fn class(o: &AttemptOutcome) -> String {
    match o {
        AttemptOutcome::Status(s) => format!("{}xx", s / 100),
        AttemptOutcome::Error(kind) => match serde_json::to_value(kind) {
            Ok(serde_json::Value::String(name)) => name,
            _ => format!("{kind}"),
        },
    }
}

/// The whole run.
#[derive(Serialize)]
pub struct Report {
    /// Wall time of the run, seconds.
    pub elapsed_s: f64,
    /// Whether it was interrupted.
    pub interrupted: bool,
    /// Tasks answered (invalid lines excluded).
    pub tasks: u64,
    /// Successes.
    pub succeeded: u64,
    /// Failures.
    pub failed: u64,
    /// Rejections (fallbacks included).
    pub rejected: u64,
    /// Of the rejections, tasks shed `overloaded` (the service's queue
    /// refused or shed them under overload; retry after a while).
    pub overloaded: u64,
    /// Tasks stopped by the interrupt.
    pub unfinished: u64,
    /// Lines that were not tasks.
    pub invalid: u64,
    /// Per service.
    pub services: Vec<ServiceReport>,
}

/// One service.
#[derive(Serialize)]
pub struct ServiceReport {
    name: String,
    tasks: u64,
    succeeded: u64,
    failed: u64,
    rejected: u64,
    overloaded: u64,
    unfinished: u64,
    success_rate: f64,
    retries: u64,
    latency_ms: Percentiles,
    nodes: Vec<NodeReport>,
}

/// One node, from the attempts made on it.
#[derive(Serialize)]
pub struct NodeReport {
    address: String,
    attempts: u64,
    succeeded: u64,
    success_rate: f64,
    latency_ms: Percentiles,
    classes: BTreeMap<String, u64>,
    breaker_trips: u64,
}

/// Latency percentiles, milliseconds.
#[derive(Serialize)]
pub struct Percentiles {
    p50: f64,
    p90: f64,
    p99: f64,
    #[serde(rename = "p99.9")]
    p99_9: f64,
    max: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |q: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(q) as f64 / 1e3
            }
        };
        Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            p99_9: ms(0.999),
            max: if h.is_empty() {
                0.0
            } else {
                h.max() as f64 / 1e3
            },
        }
    }

    fn text(&self) -> String {
        format!(
            "{:>8} {:>8} {:>8} {:>8}",
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.p99_9)
        )
    }
}

fn ms(v: f64) -> String {
    format!("{v:.1}ms")
}

impl Report {
    /// The summary as text, for stderr.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let rate = (self.tasks + self.invalid) as f64 / self.elapsed_s.max(1e-9);
        let _ = writeln!(
            out,
            "\n{} tasks in {:.1} s ({rate:.0}/s): {} ok, {} failed, {} rejected ({} overloaded), {} unfinished, {} invalid line(s){}",
            self.tasks,
            self.elapsed_s,
            self.succeeded,
            self.failed,
            self.rejected,
            self.overloaded,
            self.unfinished,
            self.invalid,
            if self.interrupted { " (interrupted)" } else { "" }
        );
        for s in &self.services {
            let _ = writeln!(
                out,
                "\nservice {}: {} tasks, {:.2} % ok, {} failed, {} rejected ({} overloaded), {} retries",
                s.name,
                s.tasks,
                s.success_rate * 100.0,
                s.failed,
                s.rejected,
                s.overloaded,
                s.retries
            );
            let _ = writeln!(
                out,
                "  {:<30} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>5}  classes",
                "task (submit to result)", "count", "ok %", "p50", "p90", "p99", "p99.9", "trips"
            );
            let _ = writeln!(
                out,
                "  {:<30} {:>8} {:>7.2} {} {:>5}",
                "all",
                s.tasks,
                s.success_rate * 100.0,
                s.latency_ms.text(),
                "-"
            );
            for n in &s.nodes {
                let classes: Vec<String> =
                    n.classes.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let _ = writeln!(
                    out,
                    "  {:<30} {:>8} {:>7.2} {} {:>5}  {}",
                    n.address,
                    n.attempts,
                    n.success_rate * 100.0,
                    n.latency_ms.text(),
                    n.breaker_trips,
                    classes.join(", ")
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn overloaded_rejections_are_counted_apart_and_shutdown_as_unfinished() {
        let mut t = Tally::default();
        let overloaded = Rejection::overloaded(Duration::from_millis(100));
        for outcome in [
            Outcome::Rejected(overloaded.clone()),
            Outcome::Rejected(overloaded),
            Outcome::Rejected(Rejection::QueueFull),
            Outcome::Rejected(Rejection::ShuttingDown),
        ] {
            t.record(&TaskResult::new(1, "svc", outcome));
        }
        let r = t.report(&Stats::default(), 1.0, false);
        assert_eq!(
            (r.tasks, r.rejected, r.overloaded, r.unfinished),
            (4, 3, 2, 1)
        );
        let text = r.text();
        assert!(text.contains("3 rejected (2 overloaded)"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["services"][0]["overloaded"], 2);
    }
}
