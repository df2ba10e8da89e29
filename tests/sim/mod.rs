//! A deterministic simulator of the engine: the real engine (its actors and
//! pure modules) on tokio's paused clock, with an in-process transport that
//! models backends (`model`), open-loop arrivals drawn from a seed (`load`),
//! and beside it an oracle that knows each backend's true capacity
//! (`oracle`). The same seed gives the same numbers.
//!
//! Shared by the tests (`tests/sim_matrix.rs`) and `loadbench sim`
//! (`examples/loadbench/sim.rs`), which include this folder by path.

#![allow(dead_code)]

pub mod load;
pub mod matrix;
pub mod model;
pub mod oracle;
pub mod run;
pub mod tenants;

/// The actix system of a simulation: a current-thread runtime whose clock
/// is paused from its start (tokio's `start_paused`), for
/// `#[actix_rt::test(system = "sim::PausedSystem")]`.
///
/// Paused from the start, not by `tokio::time::pause()` in the test: the
/// timer wheel counts whole milliseconds from the runtime's start, and a
/// clock paused later stands at a fraction of a millisecond past a tick
/// that differs in every process, which rounds every timer of the run
/// differently (the same seed gave other numbers in another process).
pub struct PausedSystem;

impl PausedSystem {
    /// A system runner over a paused runtime.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> actix_rt::SystemRunner {
        actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a paused current-thread runtime")
        })
    }
}
