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
