//! Waiting in tests for what other threads or tasks reach: a bounded number
//! of short real sleeps (the backends run on threads of their own), never
//! an assertion on how long it took.

use std::time::Duration;

use actix_dispatch::{Dispatcher, Stats};

/// How often, and how many times at most, a condition is polled: 10 ms,
/// 1000 times (10 s).
const EVERY: Duration = Duration::from_millis(10);
const TIMES: usize = 1000;

/// Polls `cond` until it holds; whether it did.
pub async fn until(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..TIMES {
        if cond() {
            return true;
        }
        actix_rt::time::sleep(EVERY).await;
    }
    cond()
}

/// As [`until`], failing the test with `what` when `cond` never held.
pub async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(until(cond).await, "timed out waiting for {what}");
}

/// Polls the dispatcher's stats until `done` holds for them; the last
/// stats either way.
pub async fn stats_until(d: &Dispatcher, done: impl Fn(&Stats) -> bool) -> Stats {
    for _ in 0..TIMES {
        let s = d.stats().await;
        if done(&s) {
            return s;
        }
        actix_rt::time::sleep(EVERY).await;
    }
    d.stats().await
}
