//! The durable task stream on a real redis-server (feature `redis`):
//! instances are `actix-dispatch-worker` processes, one is `kill -9`ed.
//!
//! The backend is an actix-web server on loopback that counts calls per
//! `Idempotency-Key` (the stream entry id), so the test sees exactly which
//! tasks reached a backend twice.
//!
//! Modules (under `tests/redis_stream/`):
//! - `recovery`: workers killed and restarted, claims, dead letters;
//! - `consume`: in-process enqueue and consume, config-file and CLI set-up;
//! - `shutdown`: results in flight at a shutdown;
//! - `hostile`: entries that can never run (not UTF-8, not JSON, another
//!   service's, an invalid path or header), dead-lettered on first sight;
//!   the worker's logs;
//! - `bounds`: the byte bounds of an entry and of a read, the `MAXLEN ~`
//!   of the results and dead-letter streams, what a line may ask;
//! - `helpers`: the keyed backend, workers, configs and stream reads.

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/logs.rs"]
mod logs;
#[path = "support/redis.rs"]
mod redis_server;

#[path = "redis_stream/bounds.rs"]
mod bounds;
#[path = "redis_stream/consume.rs"]
mod consume;
#[path = "redis_stream/helpers.rs"]
mod helpers;
#[path = "redis_stream/hostile.rs"]
mod hostile;
#[path = "redis_stream/recovery.rs"]
mod recovery;
#[path = "redis_stream/shutdown.rs"]
mod shutdown;
