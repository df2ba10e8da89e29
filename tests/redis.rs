//! Limits and breakers shared through a real redis-server (feature `redis`).
//!
//! Each test starts its own `redis-server` (ephemeral port, no persistence;
//! skipped when it is not installed, failing instead when `CI` is set) and
//! runs each engine instance in its own thread and actix System, as
//! separate processes would.
//!
//! Modules (under `tests/redis/`):
//! - `gcra`: the GCRA script against the local `TokenBucket` (needs the
//!   unstable feature `internals`, on in CI's `--all-features` run);
//! - `limits`: shared service and per-node limits, `on_limit: reject`, stats;
//! - `paused`: redis-server paused mid-run, the `on_down` policies;
//! - `breakers`: breakers shared across instances, the quorum;
//! - `helpers`: the instances, their config and the waits the others share.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;
mod support;

#[path = "redis/breakers.rs"]
mod breakers;
#[cfg(feature = "internals")]
#[path = "redis/gcra.rs"]
mod gcra;
#[path = "redis/helpers.rs"]
mod helpers;
#[path = "redis/limits.rs"]
mod limits;
#[path = "redis/paused.rs"]
mod paused;
