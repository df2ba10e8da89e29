//! # actix-dispatch
//!
//! Schedules a continuous stream of HTTP tasks across named pools of backend
//! servers, inside an actix actor system: dynamic load balancing, per-node
//! load counters, circuit breakers, rate limits, retries with a budget, and
//! hedging. Every accepted task ends in exactly one [`TaskResult`].
//!
//! Each service is a pipeline of three kinds of actors: a `QueueActor` that
//! holds the task stream and decides retries, a `BalancerActor` that picks a
//! node for each task from its view of the nodes' load, and one `NodeActor`
//! per backend that performs attempts with awc and owns that backend's load
//! counters, breaker and token bucket.
//!
//! ```no_run
//! use actix_dispatch::{Config, Dispatcher, Task};
//!
//! #[actix::main]
//! async fn main() {
//!     let config = Config::from_json(r#"{"services":[{"name":"api","mode":"p2c",
//!         "endpoints":[{"address":"http://127.0.0.1:8081/"},{"address":"http://127.0.0.1:8082/"}]}]}"#)
//!         .expect("valid config");
//!     let dispatcher = Dispatcher::start(config).expect("inside a System");
//!     let result = dispatcher.submit(Task::get("api", "/items/1")).await;
//!     println!("{:?} after {} attempt(s)", result.outcome, result.attempts.len());
//!     dispatcher.shutdown(std::time::Duration::from_secs(5)).await;
//! }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod actors;
pub mod algo;
pub mod codec;
pub mod config;
mod dispatcher;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
pub(crate) mod metrics;
mod outcome;
#[cfg(feature = "redis")]
pub mod redis;
pub mod stats;
pub mod task;
pub mod transport;
#[cfg(feature = "web")]
pub mod web;

pub use actors::pool::{PoolError, ReloadSummary};
pub use awc::http::header::HeaderMap;
pub use awc::http::Method;
pub use config::EndpointConfig;
pub use config::{Config, ConfigError, Mode, ServiceConfig};
pub use dispatcher::{
    Dispatcher, DispatcherBuilder, ReloadReport, ShutdownReport, Submission, Unfinished,
};
pub use outcome::{
    Attempt, AttemptOutcome, ErrorKind, FailReason, Failure, Outcome, Protocol, Rejection,
    Response, TaskResult,
};
pub use stats::{BreakerStatus, NodeStats, QueueStats, ServiceStats, Stats};
pub use task::{Task, TaskId};
pub use tokio::time::Instant;

/// The README's Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
