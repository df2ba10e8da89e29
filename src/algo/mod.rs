//! The pure core: algorithms that know nothing of actix or awc.
//!
//! Each takes `now` (tokio's `Instant`) and, where it draws, a seeded RNG, and
//! returns a value that says what to do next. The actors read the clock, call
//! these and set the timers. All are unit-tested with a fake clock.
//!
//! An item only the unit tests and the benchmarks use (an inspection
//! method, a reference implementation) is compiled under
//! `cfg(any(test, feature = "internals"))`; the rest has a caller in the
//! engine.

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod codel;
pub mod concurrency;
pub mod deadline;
pub mod ewma;
pub mod fair;
pub mod headroom;
pub mod knee;
pub mod limiter;
pub mod policy;
pub mod priority;
pub mod strategy;
pub mod tenants;
pub mod throttle;
pub mod time;
