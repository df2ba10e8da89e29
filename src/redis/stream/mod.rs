//! A durable task stream shared by several instances: Redis Streams with a
//! consumer group (feature `redis`).
//!
//! Tasks live in one stream per service, `{prefix}:{svc}:tasks` (the key is
//! hash-tagged by service like the shared limits' keys, so a Redis Cluster
//! keeps a service's keys on one slot). Each entry has one field, `task`,
//! whose value is a task line of the JSONL codec ([`crate::codec::TaskLine`]):
//! a file for `actix-dispatch run`, a stream entry and `XADD` from any client
//! carry the same JSON.
//!
//! ```text
//! XADD ad:{api}:tasks * task '{"id":7,"service":"api","path":"/items/7"}'
//! ```
//!
//! [`crate::Dispatcher::consume`] starts, per service, one loop on the
//! calling arbiter that reads and, every `claim_every`, claims, one call at
//! a time (so the two never take the same credit twice), and a loop that
//! refreshes the stats:
//!
//! * **Reading by credit.** `XREADGROUP GROUP g <consumer> COUNT n BLOCK b`
//!   on a connection of its own (a blocked read never delays a result),
//!   where `n` is the credit left: the queue's capacity (or
//!   [`StreamConfig::max_in_flight`]) minus the entries read and not yet
//!   finished, and at most `max_read_bytes / max_entry_bytes`
//!   ([`StreamConfig::read_count`]), so one read of entries within the
//!   bound brings at most `max_read_bytes`. The engine's queue never holds more than it can; the rest
//!   waits in Redis. At start the consumer first reads its own pending
//!   entries (`XREADGROUP .. 0`), so a restarted instance with the same
//!   consumer name resumes what it had.
//! * **One result per task.** A finished task goes through `record.lua`:
//!   `SET {prefix}:{svc}:done:<entry> NX PX done_ttl`, and only if that
//!   marker is new, `XADD {prefix}:{svc}:results MAXLEN ~ results_max_len *
//!   entry <entry> id <task id> result <ResultLine JSON>`; then `XACK` and
//!   `XDEL` of the entry, in the same script. A task delivered twice (its first instance was slow or
//!   died after calling the backend) may call the backend twice but never
//!   records a second result.
//! * **Done or not.** A task is done when it succeeded or a backend gave a
//!   final answer below 500 (a 4xx failure is recorded as such). Anything
//!   else (5xx, connect errors, timeouts, open breakers, rate limits) is a
//!   failed delivery: the entry stays pending with its last error in
//!   `{prefix}:{svc}:error:<entry>`, and is delivered again by a claim.
//! * **Claims and dead letters.** Every `claim_every`, `XAUTOCLAIM` takes up
//!   to the free credit of entries idle longer than `claim_after` (an
//!   instance that died, or a failed delivery). Their delivery count comes
//!   from `XPENDING`; an entry delivered more than `max_deliveries` times,
//!   or failing on its `max_deliveries`-th delivery, goes to
//!   `{prefix}:{svc}:dead` (fields `entry`, `task`, `error`, `deliveries`,
//!   `consumer`; `MAXLEN ~ dead_max_len`) through the same script, and is
//!   acknowledged.
//! * **Entries that can never run** go to the dead letters on first sight,
//!   whatever their delivery count: no `task` field, a value that is not
//!   UTF-8 (kept as its bytes), an entry over `max_entry_bytes` (never
//!   parsed; its first KiB kept), not a task line, a line naming another
//!   service than its stream's (an entry belongs to its stream), a line
//!   asking more than its service's `lines` allow
//!   ([`crate::codec::TaskLine::to_task_within`]), a path that climbs out
//!   of its prefix, or a task refused `InvalidTask` at submit (a header it
//!   may not set). Log lines quote an entry's text escaped. No delivery could change them; waiting
//!   `max_deliveries × claim_after` would only hold credit.
//! * **Idempotency.** Each request carries `Idempotency-Key: <entry id>`
//!   (name configurable, or off), so a backend can recognise a task re-run
//!   after an instance died.
//! * **Shutdown.** Unfinished entries are *not* acknowledged: they stay
//!   pending in the group, and another instance claims them once they are
//!   idle for `claim_after`. None is lost; a task whose backend call had
//!   already gone out may be called again (at-least-once). A task answered
//!   before or during the shutdown is recorded before
//!   [`crate::Dispatcher::shutdown`] returns: it waits for the writes in
//!   flight (at most twice the calls' time limit, `max(timeout, 5 s)`), so
//!   a clean shutdown causes no re-run.
//!
//! `claim_after` must be longer than any delivery can take, or a live
//! instance's task is claimed and run a second time (still one result). The
//! default per service is `2 × (timeout × (max_retries + 1) + backoff_max ×
//! max_retries) + 1 s`, `timeout` the longer of the service's and its
//! `lines.max_timeout` (a line cannot ask for more).

mod consumer;
mod reply;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::conn::Conn;

use crate::codec::TaskLine;
use crate::config::RedisConfig;

pub(crate) use consumer::{start, Intake};

/// The script that records a result or a dead letter (see its header).
pub const RECORD_LUA: &str = include_str!("../record.lua");

/// The field of a task entry that holds the task line.
pub const TASK_FIELD: &str = "task";

/// Options of [`Dispatcher::consume`](crate::Dispatcher::consume); defined
/// with the config (`redis.stream`), which reads no part of this module.
pub use crate::config::StreamConfig;
pub use crate::stats::StreamStats;

/// Why a durable task stream could not be used (a streamed response
/// body's error is [`crate::StreamError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableStreamError {
    /// The config has no top-level `redis` section.
    #[error("a durable stream needs the top-level `redis` section")]
    NoRedis,
    /// No such service.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// Redis refused or did not answer.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// The counters behind [`StreamStats`].
#[derive(Default)]
pub(crate) struct Counters {
    lag: AtomicU64,
    pending: AtomicU64,
    in_flight: AtomicU64,
    read: AtomicU64,
    claimed: AtomicU64,
    recorded: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    /// Told when `in_flight` falls to zero (see [`Streams::settle`]).
    idle: tokio::sync::Notify,
}

impl Counters {
    fn snapshot(&self) -> StreamStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamStats {
            lag: g(&self.lag),
            pending: g(&self.pending),
            in_flight: g(&self.in_flight),
            read: g(&self.read),
            claimed: g(&self.claimed),
            recorded: g(&self.recorded),
            duplicates: g(&self.duplicates),
            failed_deliveries: g(&self.failed),
            dead_lettered: g(&self.dead),
        }
    }
}

/// A dispatcher's streams: counters per service, the producer connection.
#[derive(Default)]
pub(crate) struct Streams {
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    producer: tokio::sync::OnceCell<Conn>,
    /// How long [`Streams::settle`] waits at most (the longest of the
    /// consumers' bounds).
    settle_within: Mutex<Duration>,
}

impl Streams {
    fn counters(&self, service: &str) -> Arc<Counters> {
        let mut m = self.counters.lock().expect("lock");
        m.entry(service.to_owned()).or_default().clone()
    }

    /// At shutdown, once every task has been answered: waits until the
    /// consumers have finished what they started for their entries (the
    /// record script of each result, a kept error, a dead letter), at most
    /// twice the calls' time limit (a record is one call, or two when
    /// Redis lost the script). Without it a System ending right after
    /// `shutdown` could drop a result's write, and the entry, still
    /// pending, would be run again by another instance. Entries whose
    /// tasks were refused `ShuttingDown` are not written: they stay
    /// pending, for another instance to claim.
    pub(crate) async fn settle(&self) {
        let within = *self.settle_within.lock().expect("lock");
        let all: Vec<Arc<Counters>> = self
            .counters
            .lock()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        let deadline = crate::algo::time::add(tokio::time::Instant::now(), within);
        for c in all {
            loop {
                let idle = c.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                let left = c.in_flight.load(Ordering::Acquire);
                if left == 0 {
                    break;
                }
                if tokio::time::timeout_at(deadline, idle).await.is_err() {
                    log::warn!(
                        "shutdown: {left} stream entries still being written after {within:?}; \
                         they stay pending for another instance"
                    );
                    return;
                }
            }
        }
    }

    /// Lets [`Streams::settle`] wait up to `d` (the longest asked for).
    fn settle_within(&self, d: Duration) {
        let mut w = self.settle_within.lock().expect("lock");
        *w = (*w).max(d);
    }

    /// The stats of `service`'s stream, if it is consumed.
    pub(crate) fn stats(&self, service: &str) -> Option<StreamStats> {
        let m = self.counters.lock().expect("lock");
        m.get(service).map(|c| c.snapshot())
    }

    /// Adds `line` to its service's stream (`service` is the configured
    /// name); returns the entry id.
    pub(crate) async fn enqueue(
        &self,
        redis: &RedisConfig,
        service: &str,
        line: &TaskLine,
    ) -> Result<String, DurableStreamError> {
        let con = self
            .producer
            .get_or_try_init(|| connect(redis, ops_timeout(redis)))
            .await?;
        enqueue(&mut con.clone(), &redis.prefix, service, line)
            .await
            .map_err(|e| redacted(redis, e).into())
    }
}

/// The key `prefix:{service}:rest`.
pub fn key(prefix: &str, service: &str, rest: &str) -> String {
    format!("{prefix}:{{{service}}}:{rest}")
}

/// `XADD`s `line` (as JSON, field `task`) to `service`'s stream under
/// `prefix`; returns the entry id. The CLI's `enqueue` uses this.
pub async fn enqueue<C: redis::aio::ConnectionLike>(
    con: &mut C,
    prefix: &str,
    service: &str,
    line: &TaskLine,
) -> redis::RedisResult<String> {
    let json = serde_json::to_string(line).expect("a task line serialises");
    redis::cmd("XADD")
        .arg(key(prefix, service, "tasks"))
        .arg("*")
        .arg(TASK_FIELD)
        .arg(json)
        .query_async(con)
        .await
}

fn ops_timeout(redis: &RedisConfig) -> Duration {
    redis.timeout.max(Duration::from_secs(5))
}

/// `e` with the URL and its secrets redacted from its message.
fn redacted(redis: &RedisConfig, e: redis::RedisError) -> redis::RedisError {
    (e.kind(), "redis", redis.scrub(&e.to_string())).into()
}

/// A connection of its own to `redis` (TLS for `rediss://`; a Cluster
/// when `redis.cluster`: every key of a stream shares its service's hash
/// tag, so each call and script goes to the one master owning that slot,
/// `MOVED` and `ASK` followed); errors redacted.
async fn connect(redis: &RedisConfig, timeout: Duration) -> redis::RedisResult<Conn> {
    Conn::dedicated(redis, timeout).await
}

#[cfg(test)]
mod tests {
    use super::reply::{delivery_count, field, read_reply};
    use super::*;
    use redis::Value;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn keys_are_hash_tagged_per_service() {
        assert_eq!(key("ad", "api", "tasks"), "ad:{api}:tasks");
        assert_eq!(key("ad", "api", "done:1-0"), "ad:{api}:done:1-0");
    }

    #[test]
    fn replies_parse() {
        let read = Value::Array(vec![Value::Array(vec![
            b("ad:{api}:tasks"),
            Value::Array(vec![
                Value::Array(vec![b("1-0"), Value::Array(vec![b("task"), b("{}")])]),
                Value::Array(vec![b("2-0"), Value::Nil]),
            ]),
        ])]);
        let e = read_reply(&read);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "1-0");
        assert_eq!(field(&e[0].1, "task"), Some(&Ok("{}".to_string())));
        let pending = Value::Array(vec![Value::Array(vec![
            b("1-0"),
            b("c1"),
            Value::Int(1200),
            Value::Int(3),
        ])]);
        assert_eq!(delivery_count(&pending), Some(3));
        assert!(read_reply(&Value::Nil).is_empty());
    }

    /// An entry that is not UTF-8, or has no text field at all, is read
    /// (so it is dead-lettered), not dropped (which left it pending for
    /// ever, claimed again and again).
    #[test]
    fn entries_that_are_not_text_are_kept() {
        let bad = Value::BulkString(vec![b'{', 0xff, b'}']);
        let read = Value::Array(vec![Value::Array(vec![
            b("ad:{api}:tasks"),
            Value::Array(vec![
                Value::Array(vec![b("1-0"), Value::Array(vec![b("task"), bad])]),
                Value::Array(vec![
                    b("2-0"),
                    Value::Array(vec![Value::BulkString(vec![0xfe]), b("x")]),
                ]),
            ]),
        ])]);
        let e = read_reply(&read);
        assert_eq!(e.len(), 2);
        assert_eq!(field(&e[0].1, "task"), Some(&Err(vec![b'{', 0xff, b'}'])));
        assert_eq!(e[1].0, "2-0");
        assert!(field(&e[1].1, "task").is_none());
    }

    #[test]
    fn the_default_claim_after_outlasts_every_attempt() {
        let c = crate::Config::from_json(
            r#"{"services":[{"name":"a","timeout":"2s","endpoints":[{"address":"http://h/"}],
                "retry":{"max_retries":2,"backoff_max":"1s"}}]}"#,
        )
        .unwrap();
        // 2 × (2 s × 3 + 1 s × 2) + 1 s
        assert_eq!(
            StreamConfig::default_claim_after(&c.services[0]),
            Duration::from_secs(17)
        );
    }
}
