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
//! [`crate::Dispatcher::consume`] starts, per service, a reader and a
//! claimer on the calling arbiter:
//!
//! * **Reading by credit.** `XREADGROUP GROUP g <consumer> COUNT n BLOCK b`
//!   on a connection of its own (a blocked read never delays a result),
//!   where `n` is the credit left: the queue's capacity (or
//!   [`StreamConfig::max_in_flight`]) minus the entries read and not yet
//!   finished. The engine's queue never holds more than it can; the rest
//!   waits in Redis. At start the consumer first reads its own pending
//!   entries (`XREADGROUP .. 0`), so a restarted instance with the same
//!   consumer name resumes what it had.
//! * **One result per task.** A finished task goes through `record.lua`:
//!   `SET {prefix}:{svc}:done:<entry> NX PX done_ttl`, and only if that
//!   marker is new, `XADD {prefix}:{svc}:results * entry <entry> id <task id>
//!   result <ResultLine JSON>`; then `XACK` and `XDEL` of the entry, in the
//!   same script. A task delivered twice (its first instance was slow or
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
//!   `consumer`) through the same script, and is acknowledged.
//! * **Idempotency.** Each request carries `Idempotency-Key: <entry id>`
//!   (name configurable, or off), so a backend can recognise a task re-run
//!   after an instance died.
//! * **Shutdown.** Unfinished entries are *not* acknowledged: they stay
//!   pending in the group, and another instance claims them once they are
//!   idle for `claim_after`. None is lost; a task whose backend call had
//!   already gone out may be called again (at-least-once).
//!
//! `claim_after` must be longer than any delivery can take, or a live
//! instance's task is claimed and run a second time (still one result). The
//! default per service is `2 × (timeout × (max_retries + 1) + backoff_max ×
//! max_retries) + 1 s`; a task line's own, longer `timeout` or `deadline`
//! needs a longer `claim_after`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script, Value};
use serde::Serialize;
use tokio::sync::Notify;

use crate::codec::{ResultLine, TaskLine, WireId};
use crate::config::{RedisConfig, ServiceConfig};
use crate::outcome::{Outcome, Rejection, TaskResult};
use crate::Dispatcher;

/// The script that records a result or a dead letter (see its header).
pub const RECORD_LUA: &str = include_str!("record.lua");

/// The field of a task entry that holds the task line.
pub const TASK_FIELD: &str = "task";

/// Options of [`Dispatcher::consume`](crate::Dispatcher::consume).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// This instance's consumer name in the group (default
    /// `<pid>-<random>`). Give a stable name to resume the same pending
    /// entries after a restart.
    pub consumer: String,
    /// The consumer group (default `dispatch`), created at the stream's
    /// start (`0`) if missing, so entries added before any instance started
    /// are read.
    pub group: String,
    /// Services to consume (default: every configured service).
    pub services: Vec<String>,
    /// Idle time after which a pending entry is claimed (default: computed
    /// per service, see the module docs).
    pub claim_after: Option<Duration>,
    /// How often to claim and refresh the stream's stats (default
    /// `claim_after / 4`, within 100 ms..=10 s).
    pub claim_every: Option<Duration>,
    /// Deliveries before an entry goes to the dead-letter stream (default 5).
    pub max_deliveries: u32,
    /// The header carrying the entry id to backends (default
    /// `Idempotency-Key`; `None`: not sent).
    pub idempotency_header: Option<String>,
    /// Longest block of one read (default 1 s; also how soon a shutdown
    /// stops the reader).
    pub block: Duration,
    /// Life of a done-marker (default 24 h): longer than a task can stay in
    /// flight at any instance.
    pub done_ttl: Duration,
    /// Entries in flight per service at most (default: the queue's capacity).
    pub max_in_flight: Option<usize>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            consumer: format!("{}-{:08x}", std::process::id(), rand::random::<u32>()),
            group: "dispatch".into(),
            services: Vec::new(),
            claim_after: None,
            claim_every: None,
            max_deliveries: 5,
            idempotency_header: Some("Idempotency-Key".into()),
            block: Duration::from_secs(1),
            done_ttl: Duration::from_secs(24 * 3600),
            max_in_flight: None,
        }
    }
}

impl StreamConfig {
    /// The default `claim_after` of `svc`: twice the longest a delivery's
    /// attempts and backoffs take, plus a second for the queue.
    pub fn default_claim_after(svc: &ServiceConfig) -> Duration {
        let r = &svc.retry;
        let work = svc.timeout.saturating_mul(r.max_retries.saturating_add(1))
            + r.backoff_max.saturating_mul(r.max_retries);
        work.saturating_mul(2) + Duration::from_secs(1)
    }
}

/// Why the stream could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
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

/// One service's stream, as `stats()` shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    /// Entries of the stream not yet delivered to the group (`XINFO GROUPS`
    /// lag), as last read.
    pub lag: u64,
    /// Entries delivered and not acknowledged, all consumers (`XINFO
    /// GROUPS` pending), as last read.
    pub pending: u64,
    /// Entries this instance has read and not finished.
    pub in_flight: u64,
    /// Entries read (new or own pending).
    pub read: u64,
    /// Entries claimed from idle consumers.
    pub claimed: u64,
    /// Results recorded by this instance.
    pub recorded: u64,
    /// Finished a second time; the result was already recorded.
    pub duplicates: u64,
    /// Deliveries that failed and were left pending for a later claim.
    pub failed_deliveries: u64,
    /// Entries this instance sent to the dead-letter stream.
    pub dead_lettered: u64,
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
    producer: tokio::sync::OnceCell<MultiplexedConnection>,
}

impl Streams {
    fn counters(&self, service: &str) -> Arc<Counters> {
        let mut m = self.counters.lock().expect("lock");
        m.entry(service.to_owned()).or_default().clone()
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
    ) -> Result<String, StreamError> {
        let con = self
            .producer
            .get_or_try_init(|| connect(redis, ops_timeout(redis)))
            .await?;
        Ok(enqueue(&mut con.clone(), &redis.prefix, service, line).await?)
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

async fn connect(
    redis: &RedisConfig,
    timeout: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(redis.url.as_str())?;
    let cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(redis.timeout.max(Duration::from_secs(1))))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
}

// === the consumer of one service ===

struct Consumer {
    d: Dispatcher,
    service: String,
    group: String,
    name: String,
    tasks: String,
    prefix: String,
    claim_after: Duration,
    claim_every: Duration,
    max_deliveries: u64,
    header: Option<String>,
    block: Duration,
    done_ttl: Duration,
    capacity: u64,
    ops: MultiplexedConnection,
    record: Script,
    counters: Arc<Counters>,
    room: Notify,
}

/// Starts consuming `svc`'s stream on the current arbiter.
pub(crate) async fn start(
    d: Dispatcher,
    streams: &Streams,
    redis: &RedisConfig,
    svc: &ServiceConfig,
    cfg: &StreamConfig,
) -> Result<(), StreamError> {
    let claim_after = cfg
        .claim_after
        .unwrap_or_else(|| StreamConfig::default_claim_after(svc));
    let block = cfg
        .block
        .clamp(Duration::from_millis(10), Duration::from_secs(60));
    let ops = connect(redis, ops_timeout(redis)).await?;
    let mut reader = connect(redis, block + ops_timeout(redis)).await?;
    let c = Consumer {
        d,
        service: svc.name.clone(),
        group: cfg.group.clone(),
        name: cfg.consumer.clone(),
        tasks: key(&redis.prefix, &svc.name, "tasks"),
        prefix: redis.prefix.clone(),
        claim_after,
        claim_every: cfg
            .claim_every
            .unwrap_or(claim_after / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(10)),
        max_deliveries: u64::from(cfg.max_deliveries.max(1)),
        header: cfg.idempotency_header.clone().filter(|h| !h.is_empty()),
        block,
        done_ttl: cfg.done_ttl.max(Duration::from_secs(1)),
        capacity: cfg
            .max_in_flight
            .unwrap_or(svc.queue.capacity)
            .clamp(1, 1_000_000) as u64,
        ops,
        record: Script::new(RECORD_LUA),
        counters: streams.counters(&svc.name),
        room: Notify::new(),
    };
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&c.tasks)
        .arg(&c.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut reader)
        .await;
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(e.into());
        }
    }
    log::info!(
        "service {}: consuming {} as {} in group {} (claim_after {:?})",
        c.service,
        c.tasks,
        c.name,
        c.group,
        c.claim_after
    );
    let c = std::rc::Rc::new(c);
    actix::spawn(c.clone().read_loop(reader));
    actix::spawn(c.claim_loop());
    Ok(())
}

impl Consumer {
    fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.counters.in_flight.load(Ordering::Relaxed))
    }

    /// Reads by credit until the dispatcher shuts down: first this
    /// consumer's own pending entries, then new ones.
    async fn read_loop(self: std::rc::Rc<Self>, mut con: MultiplexedConnection) {
        let mut own: Option<String> = Some("0".into());
        let mut failing = false;
        while !self.d.is_closed() {
            let free = self.free();
            if free == 0 {
                let _ = tokio::time::timeout(self.block, self.room.notified()).await;
                continue;
            }
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP").arg(&self.group).arg(&self.name);
            cmd.arg("COUNT").arg(free);
            if own.is_none() {
                cmd.arg("BLOCK").arg(self.block.as_millis() as u64);
            }
            cmd.arg("STREAMS")
                .arg(&self.tasks)
                .arg(own.as_deref().unwrap_or(">"));
            let v: Value = match cmd.query_async(&mut con).await {
                Ok(v) => v,
                Err(e) => {
                    if !failing {
                        log::warn!("service {}: stream read: {e}; retrying", self.service);
                    }
                    failing = true;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if failing {
                log::info!("service {}: stream reads answer again", self.service);
                failing = false;
            }
            let entries = read_reply(&v);
            if own.is_some() {
                own = entries.last().map(|e| e.0.clone());
            }
            for (id, fields) in entries {
                self.counters.read.fetch_add(1, Ordering::Relaxed);
                // A pending entry re-read at start has been delivered before.
                self.deliver(id, fields, 1);
            }
        }
        log::info!(
            "service {}: stream reader stopped; unfinished entries stay pending",
            self.service
        );
    }

    /// Claims idle entries and refreshes the stats until shutdown.
    async fn claim_loop(self: std::rc::Rc<Self>) {
        let mut con = self.ops.clone();
        let mut cursor = "0-0".to_string();
        while !self.d.is_closed() {
            tokio::time::sleep(self.claim_every).await;
            if self.d.is_closed() {
                break;
            }
            self.refresh(&mut con).await;
            let free = self.free();
            if free == 0 {
                continue;
            }
            let r: redis::RedisResult<Value> = redis::cmd("XAUTOCLAIM")
                .arg(&self.tasks)
                .arg(&self.group)
                .arg(&self.name)
                .arg(self.claim_after.as_millis() as u64)
                .arg(&cursor)
                .arg("COUNT")
                .arg(free)
                .query_async(&mut con)
                .await;
            let Ok(Value::Array(parts)) = r else {
                continue;
            };
            cursor = parts.first().and_then(text).unwrap_or_else(|| "0-0".into());
            let claimed = parts.get(1).map(entries).unwrap_or_default();
            if claimed.is_empty() {
                continue;
            }
            let mut pipe = redis::pipe();
            for (id, _) in &claimed {
                pipe.cmd("XPENDING")
                    .arg(&self.tasks)
                    .arg(&self.group)
                    .arg(id)
                    .arg(id)
                    .arg(1);
            }
            let counts: Vec<Value> = pipe.query_async(&mut con).await.unwrap_or_default();
            self.counters
                .claimed
                .fetch_add(claimed.len() as u64, Ordering::Relaxed);
            log::debug!(
                "service {}: claimed {} idle entries",
                self.service,
                claimed.len()
            );
            for (i, (id, fields)) in claimed.into_iter().enumerate() {
                let n = counts.get(i).and_then(delivery_count).unwrap_or(1);
                if n > self.max_deliveries {
                    let c = self.clone();
                    actix::spawn(async move {
                        let err = c.last_error(&id).await;
                        let raw = field(&fields, TASK_FIELD).unwrap_or_default();
                        c.dead_letter(&id, &raw, &err, n).await;
                    });
                } else {
                    self.deliver(id, fields, n);
                }
            }
        }
    }

    /// Reads `XINFO GROUPS` into the lag and pending counters.
    async fn refresh(&self, con: &mut MultiplexedConnection) {
        let r: redis::RedisResult<Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.tasks)
            .query_async(con)
            .await;
        let Ok(Value::Array(groups)) = r else { return };
        for g in groups {
            let kv = pairs(&g);
            let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v);
            if get("name").and_then(text).as_deref() != Some(self.group.as_str()) {
                continue;
            }
            let num = |k: &str| get(k).and_then(|v| text(v)?.parse().ok()).unwrap_or(0);
            self.counters.lag.store(num("lag"), Ordering::Relaxed);
            self.counters
                .pending
                .store(num("pending"), Ordering::Relaxed);
        }
    }

    /// Submits one entry's task; its end is recorded by [`Self::finish`].
    fn deliver(self: &std::rc::Rc<Self>, id: String, fields: Vec<(String, String)>, n: u64) {
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let raw = field(&fields, TASK_FIELD);
        let parsed = match &raw {
            None => Err(format!("the entry has no `{TASK_FIELD}` field")),
            Some(raw) => TaskLine::parse(raw).and_then(|l| Ok((l.to_task()?, l))),
        };
        let c = self.clone();
        let raw = raw.unwrap_or_default();
        match parsed {
            Err(e) => actix::spawn(async move {
                log::warn!("service {}: entry {id}: not a task: {e}", c.service);
                c.dead_letter(&id, &raw, &format!("invalid task: {e}"), n)
                    .await;
                c.done_with_one();
            }),
            Ok((mut task, line)) => {
                if let Some(h) = &self.header {
                    if !line.headers.keys().any(|k| k.eq_ignore_ascii_case(h)) {
                        task = task.header(h.clone(), id.clone());
                    }
                }
                let sub = self.d.submit_waiting(task);
                actix::spawn(async move {
                    let r = sub.await;
                    c.finish(&id, &raw, line.id, r, n).await;
                    c.done_with_one();
                })
            }
        };
    }

    fn done_with_one(&self) {
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.room.notify_one();
    }

    /// Records a done task, leaves a failed delivery pending (or sends it
    /// to the dead letters on its last delivery).
    async fn finish(&self, id: &str, raw: &str, wire: Option<WireId>, r: TaskResult, n: u64) {
        if matches!(&r.outcome, Outcome::Rejected(Rejection::ShuttingDown)) {
            // Left pending: another instance claims it.
            return;
        }
        let done = r.is_success()
            || matches!(&r.outcome, Outcome::Failure(f)
                if f.response.as_ref().is_some_and(|resp| resp.status < 500));
        if done {
            let wire = wire.unwrap_or_else(|| WireId::Text(id.to_owned()));
            let task_id = match &wire {
                WireId::Number(n) => n.to_string(),
                WireId::Text(t) => t.clone(),
            };
            let line = ResultLine::from_result(&r, Some(wire), None);
            let json = serde_json::to_string(&line).expect("a result line serialises");
            let fields = [("entry", id), ("id", task_id.as_str()), ("result", &json)];
            match self.run_record("results", id, &fields).await {
                Some(true) => self.counters.recorded.fetch_add(1, Ordering::Relaxed),
                Some(false) => self.counters.duplicates.fetch_add(1, Ordering::Relaxed),
                None => 0,
            };
            return;
        }
        let error = ResultLine::from_result(&r, None, None)
            .error
            .unwrap_or_else(|| "failed".into());
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        if n >= self.max_deliveries {
            self.dead_letter(id, raw, &error, n).await;
            return;
        }
        let mut con = self.ops.clone();
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(key(&self.prefix, &self.service, &format!("error:{id}")))
            .arg(&error)
            .arg("PX")
            .arg(self.done_ttl.as_millis() as u64)
            .query_async(&mut con)
            .await;
        if let Err(e) = set {
            log::debug!(
                "service {}: entry {id}: keeping its error: {e}",
                self.service
            );
        }
    }

    async fn last_error(&self, id: &str) -> String {
        let mut con = self.ops.clone();
        let e: Option<String> = redis::cmd("GET")
            .arg(key(&self.prefix, &self.service, &format!("error:{id}")))
            .query_async(&mut con)
            .await
            .ok()
            .flatten();
        e.unwrap_or_else(|| "no error recorded (the instance that had it stopped)".into())
    }

    async fn dead_letter(&self, id: &str, raw: &str, error: &str, n: u64) {
        let n = n.to_string();
        let fields = [
            ("entry", id),
            ("task", raw),
            ("error", error),
            ("deliveries", n.as_str()),
            ("consumer", self.name.as_str()),
        ];
        if self.run_record("dead", id, &fields).await == Some(true) {
            self.counters.dead.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "service {}: entry {id} dead-lettered after {n} deliveries: {error}",
                self.service
            );
        }
    }

    /// Runs `record.lua`; `None` when Redis did not answer (the entry stays
    /// pending and is claimed again: still one result).
    async fn run_record(&self, target: &str, id: &str, fields: &[(&str, &str)]) -> Option<bool> {
        let k = |rest: &str| key(&self.prefix, &self.service, rest);
        let mut inv = self.record.prepare_invoke();
        inv.key(&self.tasks)
            .key(k(target))
            .key(k(&format!("done:{id}")))
            .key(k(&format!("error:{id}")));
        inv.arg(&self.group)
            .arg(id)
            .arg(self.done_ttl.as_millis() as u64);
        for (f, v) in fields {
            inv.arg(*f).arg(*v);
        }
        let mut con = self.ops.clone();
        match inv.invoke_async::<i64>(&mut con).await {
            Ok(n) => Some(n == 1),
            Err(e) => {
                log::warn!(
                    "service {}: entry {id}: recording failed ({e}); it stays pending",
                    self.service
                );
                None
            }
        }
    }
}

// === reply parsing ===

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A flat `[k, v, k, v]` array or a map, as (name, value) pairs.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|c| Some((text(c.first()?)?, c.get(1)?.clone())))
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v.clone())))
            .collect(),
        _ => Vec::new(),
    }
}

fn field(fields: &[(String, String)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// `[[id, [f, v, ...]], ...]`; entries deleted meanwhile (nil fields) are
/// skipped.
fn entries(v: &Value) -> Vec<(String, Vec<(String, String)>)> {
    let Value::Array(list) = v else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            let id = text(e.first()?)?;
            let fields = pairs(e.get(1)?)
                .into_iter()
                .filter_map(|(k, v)| Some((k, text(&v)?)))
                .collect::<Vec<_>>();
            (!fields.is_empty()).then_some((id, fields))
        })
        .collect()
}

/// An `XREADGROUP` reply for one stream: its entries.
fn read_reply(v: &Value) -> Vec<(String, Vec<(String, String)>)> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .filter_map(|s| match s {
                Value::Array(kv) => kv.get(1).map(entries),
                _ => None,
            })
            .flatten()
            .collect(),
        Value::Map(m) => m.iter().flat_map(|(_, e)| entries(e)).collect(),
        _ => Vec::new(),
    }
}

/// The delivery count of a one-entry `XPENDING` reply.
fn delivery_count(v: &Value) -> Option<u64> {
    let Value::Array(rows) = v else { return None };
    let Value::Array(row) = rows.first()? else {
        return None;
    };
    text(row.get(3)?)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(field(&e[0].1, "task").as_deref(), Some("{}"));
        let pending = Value::Array(vec![Value::Array(vec![
            b("1-0"),
            b("c1"),
            Value::Int(1200),
            Value::Int(3),
        ])]);
        assert_eq!(delivery_count(&pending), Some(3));
        assert!(read_reply(&Value::Nil).is_empty());
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
