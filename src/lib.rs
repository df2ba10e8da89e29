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
//! per backend that performs attempts over its own HTTP/1.1 and HTTP/2
//! connections and owns that backend's load counters and breaker (its token
//! bucket is the balancer's, which takes a token as it sends an attempt).
//!
//! ```
//! use std::time::Duration;
//! use actix_dispatch::{Config, Dispatcher, Task};
//!
//! #[actix::main]
//! async fn main() {
//!     // A backend to talk to: an actix-web server on an ephemeral port.
//!     let server = actix_web::HttpServer::new(|| {
//!         actix_web::App::new().default_service(actix_web::web::to(|| async { "hello" }))
//!     })
//!     .workers(1)
//!     .disable_signals()
//!     .bind(("127.0.0.1", 0))
//!     .unwrap();
//!     let port = server.addrs()[0].port();
//!     let server = server.run();
//!     let backend = server.handle();
//!     actix::spawn(server);
//!
//!     let config = Config::from_json(&format!(
//!         r#"{{"services":[{{"name":"api","mode":"p2c",
//!             "endpoints":[{{"address":"http://127.0.0.1:{port}/"}}]}}]}}"#
//!     ))
//!     .expect("valid config");
//!     let dispatcher = Dispatcher::start(config).expect("inside a System");
//!     let result = dispatcher.submit(Task::get("api", "/items/1")).await;
//!     assert!(result.is_success(), "{:?}", result.outcome);
//!     assert_eq!(result.response().unwrap().body, "hello");
//!     let report = dispatcher.shutdown(Duration::from_secs(5)).await;
//!     assert!(report.unfinished.is_empty());
//!     backend.stop(true).await;
//! }
//! ```
//!
//! What a user needs is at the crate root: [`Dispatcher`] and its
//! [`DispatcherBuilder`], [`Config`] and its parts, [`Task`], [`TaskResult`],
//! a [`Lease`] of an endpoint for the caller's own client ([`lease`]),
//! [`Outcome`], [`Rejection`], the errors ([`ConfigError`], [`StartError`],
//! [`PoolError`]), the stats types, the JSONL wire form ([`codec`]), and,
//! behind their cargo features, the `web` gateway and `metrics` modules.
//! [`transport`] is the extension point for another HTTP client. Every
//! config field, outcome and metric is in [`reference`](mod@reference).
//!
//! The actors are not part of the API. [`Task`] is an actix `Message`
//! answered with a [`TaskResult`]; [`Dispatcher::recipient`] gives a
//! service's `Recipient<Task>` to send one to. Types that may grow (results,
//! reasons and their struct variants, error kinds, stats, reports, config
//! parts) are `#[non_exhaustive]`: match them with a `_` arm (and `..` in a
//! struct variant); those a test may build have constructors
//! ([`TaskResult::new`], [`Response::new`], [`Attempt::new`],
//! [`Failure::new`], [`Outcome::fallback`], [`Rejection::circuit_open`],
//! [`Rejection::rate_limited`], [`Rejection::overloaded`]). The cargo
//! feature `internals` exposes the pure algorithms for the benchmarks and
//! the test hooks (fault drills, the Redis scripts' wire helpers); it is
//! unstable and outside semver.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod actors;
// The pure algorithms are the implementation. The unstable cargo feature
// `internals` makes them public for the criterion benchmarks and for tests
// that compare other code against them; nothing else may rely on it.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod algo;
#[cfg(not(feature = "internals"))]
mod algo;
pub mod codec;
pub mod config;
mod dispatcher;
pub mod lease;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
pub(crate) mod metrics;
mod outcome;
mod pool;
#[cfg(feature = "redis")]
pub mod redis;
pub mod reference;
pub mod stats;
mod syntax;
pub mod task;
pub mod transport;
#[cfg(feature = "web")]
pub mod web;

/// A map looked up on the hot path (a submit's service, a report's node):
/// foldhash, already in awc's tree, instead of SipHash. Its keys are the
/// config's names and the engine's own ids, never stored from a task.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use algo::time::MAX_DURATION;
pub use awc::http::header::HeaderMap;
pub use awc::http::Method;
pub use config::EndpointConfig;
pub use config::{Config, ConfigError, Mode, ServiceConfig};
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use dispatcher::DrillTarget;
pub use dispatcher::{
    Dispatcher, DispatcherBuilder, ReloadReport, ShutdownReport, StartError, Submission, Unfinished,
};
pub use lease::{Lease, LeaseOptions, LeaseOut, LeaseOutcome, LeaseStats};
pub use outcome::{
    Attempt, AttemptOutcome, BodyStream, ErrorKind, FailReason, Failure, Outcome, Protocol,
    Rejection, Response, StreamError, TaskResult,
};
pub use pool::{PoolError, ReloadSummary};
pub use stats::{
    BreakerStatus, ByPriority, NodeStats, QueueStats, ServiceStats, Stats, TenantStats,
};
pub use task::{Priority, Task, TaskId};
pub use tokio::time::Instant;

/// The README's Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
