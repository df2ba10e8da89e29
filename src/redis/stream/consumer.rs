//! The consumer of one service's stream: a reader by credit, a claimer,
//! and the recording of each delivery's end.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::redis::conn::Conn;
use crate::redis::repairs::{parse_repairs, ClusterHint, RepairLog};
use redis::{Script, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::reply::{delivery_count, entries, field, pairs, read_reply, text, FieldValue, Fields};
use super::{connect, key, ops_timeout, Counters, DurableStreamError, StreamConfig, Streams};
use super::{RECORD_LUA, TASK_FIELD};
use crate::codec::{ResultLine, TaskLine, WireId};
use crate::config::{RedisConfig, ServiceConfig};
use crate::metrics::{PromStream, StreamEvent};
use crate::outcome::{Outcome, Rejection, TaskResult};
use crate::task::{Submission, Task};

/// What the consumer feeds: the engine (a [`crate::Dispatcher`]), named by
/// what it does so that the stream does not depend on the dispatcher.
pub(crate) trait Intake {
    /// Whether the engine has closed its intake (shutting down).
    fn is_closed(&self) -> bool;
    /// Submits a task, waiting for room when its queue is full.
    fn submit_waiting(&self, task: Task) -> Submission;
}

struct Consumer {
    d: Box<dyn Intake>,
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
    /// The largest entry taken as a task (`max_entry_bytes`).
    max_entry_bytes: usize,
    /// What a line may ask of the service (`lines`).
    limits: crate::config::LineLimits,
    /// The settings a read's count comes from (`read_count`).
    cfg: StreamConfig,
    ops: Conn,
    record: Script,
    counters: Arc<Counters>,
    prom: PromStream,
    room: Notify,
    /// Keys whose repair was logged (once a minute per key).
    repairs: RefCell<RepairLog>,
    /// Told when a standalone connection met a Cluster (`MOVED`).
    cluster_hint: ClusterHint,
    /// The URL as logs show it.
    url: String,
}

/// Starts consuming `svc`'s stream on the current arbiter.
pub(crate) async fn start(
    d: Box<dyn Intake>,
    streams: &Streams,
    redis: &RedisConfig,
    svc: &ServiceConfig,
    cfg: &StreamConfig,
    prom: PromStream,
) -> Result<(), DurableStreamError> {
    // Bounded where it enters: 100 ms ..= 7 days.
    let claim_after = cfg
        .claim_after
        .unwrap_or_else(|| StreamConfig::default_claim_after(svc))
        .clamp(
            Duration::from_millis(100),
            Duration::from_secs(7 * 24 * 3600),
        );
    let block = cfg
        .block
        .clamp(Duration::from_millis(10), Duration::from_secs(60));
    let ops = connect(redis, ops_timeout(redis)).await?;
    // A record call ends within the connection's time limit; twice it
    // with the reload of a lost script.
    streams.settle_within(2 * ops_timeout(redis));
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
        max_entry_bytes: cfg.max_entry_bytes,
        limits: svc.lines.clone(),
        cfg: cfg.clone(),
        ops,
        record: Script::new(RECORD_LUA),
        counters: streams.counters(&svc.name),
        prom,
        room: Notify::new(),
        repairs: RefCell::new(RepairLog::default()),
        cluster_hint: ClusterHint::default(),
        url: redis.redacted_url(),
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
    let c = Rc::new(c);
    actix::spawn(c.clone().read_loop(reader));
    actix::spawn(c.stats_loop());
    Ok(())
}

impl Consumer {
    fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.counters.in_flight.load(Ordering::Relaxed))
    }

    /// Reads and claims by credit until the dispatcher shuts down: first
    /// this consumer's own pending entries, then new ones, with a claim
    /// every `claim_every`. One loop does both, one call at a time, so the
    /// entries held never exceed the credit.
    async fn read_loop(self: Rc<Self>, mut con: Conn) {
        let mut own: Option<String> = Some("0".into());
        let mut failing = false;
        let mut cursor = "0-0".to_string();
        let mut next_claim = Instant::now() + self.claim_every;
        while !self.d.is_closed() {
            let now = Instant::now();
            let until_claim = next_claim.saturating_duration_since(now);
            let free = self.free();
            if free == 0 {
                let wait = self.block.min(until_claim).max(Duration::from_millis(1));
                let _ = tokio::time::timeout(wait, self.room.notified()).await;
                continue;
            }
            if until_claim.is_zero() {
                next_claim = now + self.claim_every;
                self.claim(&mut con, free, &mut cursor).await;
                continue;
            }
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP").arg(&self.group).arg(&self.name);
            cmd.arg("COUNT").arg(self.cfg.read_count(free));
            if own.is_none() {
                let block = self.block.min(until_claim).max(Duration::from_millis(1));
                cmd.arg("BLOCK").arg(block.as_millis() as u64);
            }
            cmd.arg("STREAMS")
                .arg(&self.tasks)
                .arg(own.as_deref().unwrap_or(">"));
            let v: Value = match cmd.query_async(&mut con).await {
                Ok(v) => v,
                Err(e) => {
                    self.cluster_hint.check(&self.url, &e);
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
            self.counters
                .read
                .fetch_add(entries.len() as u64, Ordering::Relaxed);
            self.prom.event(StreamEvent::Read, entries.len() as u64);
            if own.is_some() {
                own = entries.last().map(|e| e.0.clone());
                // Re-read own entries have been delivered before: their
                // counts decide, as for claimed ones.
                self.deliver_counted(&mut con, entries).await;
            } else {
                for (id, fields) in entries {
                    self.deliver(id, fields, 1);
                }
            }
        }
        log::info!(
            "service {}: stream reader stopped; unfinished entries stay pending",
            self.service
        );
    }

    /// Refreshes the stream's stats every `claim_every` until shutdown.
    async fn stats_loop(self: Rc<Self>) {
        let mut con = self.ops.clone();
        while !self.d.is_closed() {
            self.refresh(&mut con).await;
            tokio::time::sleep(self.claim_every).await;
        }
    }

    /// Claims up to `free` entries idle longer than `claim_after`
    /// (`XAUTOCLAIM`, resuming at `cursor`) and delivers them.
    async fn claim(self: &Rc<Self>, con: &mut Conn, free: u64, cursor: &mut String) {
        let r: redis::RedisResult<Value> = redis::cmd("XAUTOCLAIM")
            .arg(&self.tasks)
            .arg(&self.group)
            .arg(&self.name)
            .arg(self.claim_after.as_millis() as u64)
            .arg(cursor.as_str())
            .arg("COUNT")
            .arg(self.cfg.read_count(free))
            .query_async(con)
            .await;
        let parts = match r {
            Ok(Value::Array(parts)) => parts,
            Ok(_) => return,
            Err(e) => {
                log::debug!("service {}: claim: {e}", self.service);
                return;
            }
        };
        *cursor = parts.first().and_then(text).unwrap_or_else(|| "0-0".into());
        let claimed = parts.get(1).map(entries).unwrap_or_default();
        if claimed.is_empty() {
            return;
        }
        self.counters
            .claimed
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        self.prom.event(StreamEvent::Claimed, claimed.len() as u64);
        log::info!(
            "service {}: claimed {} entries idle for over {:?}",
            self.service,
            claimed.len(),
            self.claim_after
        );
        self.deliver_counted(con, claimed).await;
    }

    /// Delivers entries read before, by their delivery count (`XPENDING`):
    /// those delivered more than `max_deliveries` times go to the dead
    /// letters with their last error.
    async fn deliver_counted(self: &Rc<Self>, con: &mut Conn, batch: Vec<(String, Fields)>) {
        if batch.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for (id, _) in &batch {
            pipe.cmd("XPENDING")
                .arg(&self.tasks)
                .arg(&self.group)
                .arg(id)
                .arg(id)
                .arg(1);
        }
        let counts: Vec<Value> = pipe.query_async(con).await.unwrap_or_default();
        for (i, (id, fields)) in batch.into_iter().enumerate() {
            let n = counts.get(i).and_then(delivery_count).unwrap_or(1);
            if n > self.max_deliveries {
                // Counted in flight until written (a shutdown waits for it).
                self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
                let c = self.clone();
                actix::spawn(async move {
                    let err = c.last_error(&id).await;
                    c.dead_letter(&id, raw_bytes(&fields), &err, n).await;
                    c.done_with_one();
                });
            } else {
                self.deliver(id, fields, n);
            }
        }
    }

    /// Reads `XINFO GROUPS` into the lag and pending counters.
    async fn refresh(&self, con: &mut Conn) {
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
            let (lag, pending) = (num("lag"), num("pending"));
            self.counters.lag.store(lag, Ordering::Relaxed);
            self.counters.pending.store(pending, Ordering::Relaxed);
            self.prom.entries(lag, pending);
        }
    }

    /// Submits one entry's task; its end is recorded by [`Self::finish`].
    /// An entry that can never run (see [`parse_entry`]) goes to the dead
    /// letters at once, whatever its delivery count.
    fn deliver(self: &Rc<Self>, id: String, fields: Fields, n: u64) {
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let c = self.clone();
        let size = entry_bytes(&fields);
        if size > self.max_entry_bytes {
            // Never parsed; the dead letter keeps its first KiB.
            let error = format!(
                "the entry is {size} bytes, over redis.stream.max_entry_bytes ({})",
                self.max_entry_bytes
            );
            actix::spawn(async move {
                let raw = raw_bytes(&fields);
                let kept = &raw[..raw.len().min(DEAD_KEEP_BYTES)];
                log::warn!("service {}: entry {}: {error}", c.service, esc(&id));
                c.dead_letter(&id, kept, &error, n).await;
                c.done_with_one();
            });
            return;
        }
        match parse_entry(&fields, &self.service, &self.limits) {
            Err(e) => actix::spawn(async move {
                log::warn!(
                    "service {}: entry {}: not a task: {}",
                    c.service,
                    esc(&id),
                    esc(&e)
                );
                c.dead_letter(&id, raw_bytes(&fields), &format!("invalid task: {e}"), n)
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
                    c.finish(&id, raw_bytes(&fields), line.id, r, n).await;
                    c.done_with_one();
                })
            }
        };
    }

    /// An entry's delivery is over, its writes done.
    fn done_with_one(&self) {
        if self.counters.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.counters.idle.notify_waiters();
        }
        self.room.notify_one();
    }

    /// Records a done task, leaves a failed delivery pending (or sends it
    /// to the dead letters on its last delivery).
    async fn finish(&self, id: &str, raw: &[u8], wire: Option<WireId>, r: TaskResult, n: u64) {
        if matches!(&r.outcome, Outcome::Rejected(Rejection::ShuttingDown)) {
            // Left pending: another instance claims it.
            return;
        }
        if let Outcome::Rejected(why @ Rejection::InvalidTask(_)) = &r.outcome {
            // No delivery can change it: dead now, not after max_deliveries.
            // (`UnknownService` is not: the line names its stream's
            // service, configured when it was read; a pool changed at
            // runtime, or torn down at shutdown, is for a later delivery.)
            let error = format!("{why}");
            log::warn!(
                "service {}: entry {}: refused: {}",
                self.service,
                esc(id),
                esc(&error)
            );
            self.dead_letter(id, raw, &error, n).await;
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
            let fields: [(&str, &[u8]); 3] = [
                ("entry", id.as_bytes()),
                ("id", task_id.as_bytes()),
                ("result", json.as_bytes()),
            ];
            let (counter, event) = match self.run_record("results", id, &fields).await {
                Some(true) => (&self.counters.recorded, StreamEvent::Recorded),
                Some(false) => (&self.counters.duplicates, StreamEvent::Duplicate),
                None => return,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            self.prom.event(event, 1);
            return;
        }
        let error = ResultLine::from_result(&r, None, None)
            .error
            .unwrap_or_else(|| "failed".into());
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.prom.event(StreamEvent::Failed, 1);
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
                "service {}: entry {}: keeping its error: {e}",
                self.service,
                esc(id)
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

    async fn dead_letter(&self, id: &str, raw: &[u8], error: &str, n: u64) {
        let n = n.to_string();
        let fields: [(&str, &[u8]); 5] = [
            ("entry", id.as_bytes()),
            ("task", raw),
            ("error", error.as_bytes()),
            ("deliveries", n.as_bytes()),
            ("consumer", self.name.as_bytes()),
        ];
        if self.run_record("dead", id, &fields).await == Some(true) {
            self.counters.dead.fetch_add(1, Ordering::Relaxed);
            self.prom.event(StreamEvent::DeadLettered, 1);
            log::warn!(
                "service {}: entry {} dead-lettered after {n} deliveries: {}",
                self.service,
                esc(id),
                esc(error)
            );
        }
    }

    /// Runs `record.lua`; `None` when Redis did not answer (the entry stays
    /// pending and is claimed again: still one result).
    async fn run_record(&self, target: &str, id: &str, fields: &[(&str, &[u8])]) -> Option<bool> {
        let k = |rest: &str| key(&self.prefix, &self.service, rest);
        let keys = [
            self.tasks.clone(),
            k(target),
            k(&format!("done:{id}")),
            k(&format!("error:{id}")),
        ];
        let max_len = match target {
            "dead" => self.cfg.dead_max_len,
            _ => self.cfg.results_max_len,
        };
        let mut inv = self.record.prepare_invoke();
        for key in &keys {
            inv.key(key);
        }
        inv.arg(&self.group)
            .arg(id)
            .arg(self.done_ttl.as_millis() as u64)
            .arg(max_len.max(1));
        for (f, v) in fields {
            inv.arg(*f).arg(*v);
        }
        let mut con = self.ops.clone();
        match inv.invoke_async::<Vec<Value>>(&mut con).await {
            Ok(v) => {
                let repaired = parse_repairs(v.get(1));
                if !repaired.is_empty() {
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let scope = format!("service {}: stream", self.service);
                    let now = Instant::now();
                    self.repairs
                        .borrow_mut()
                        .warn(&scope, &keys, &repaired, now);
                }
                Some(matches!(v.first(), Some(Value::Int(1))))
            }
            Err(e) => {
                self.cluster_hint.check(&self.url, &e);
                log::warn!(
                    "service {}: entry {}: recording failed ({e}); it stays pending",
                    self.service,
                    esc(id)
                );
                None
            }
        }
    }
}

/// What a dead letter keeps of an entry over `max_entry_bytes`.
const DEAD_KEEP_BYTES: usize = 1024;

/// An entry's size: its fields' names and values, in bytes.
fn entry_bytes(fields: &Fields) -> usize {
    fields
        .iter()
        .map(|(k, v)| {
            k.len()
                + match v {
                    Ok(t) => t.len(),
                    Err(b) => b.len(),
                }
        })
        .fold(0usize, usize::saturating_add)
}

/// Text from a stream entry (or an error quoting it) as a log line shows
/// it: newlines and other control characters escaped, so an entry cannot
/// forge a line of its own.
fn esc(text: &str) -> std::str::EscapeDebug<'_> {
    text.escape_debug()
}

/// The bytes of an entry's `task` field as read (empty when missing): what
/// a dead letter keeps.
fn raw_bytes(fields: &Fields) -> &[u8] {
    match field(fields, TASK_FIELD) {
        Some(Ok(t)) => t.as_bytes(),
        Some(Err(b)) => b,
        None => &[],
    }
}

/// The task of an entry of `service`'s stream, or why it can never run:
/// no `task` field, a value that is not UTF-8, not a task line, a line
/// that names another service (an entry belongs to its stream's service),
/// a line that asks more than the service allows (`limits`), or a task
/// that does not build (an invalid path or header).
pub(super) fn parse_entry(
    fields: &Fields,
    service: &str,
    limits: &crate::config::LineLimits,
) -> Result<(Task, TaskLine), String> {
    let raw: &FieldValue = field(fields, TASK_FIELD)
        .ok_or_else(|| format!("the entry has no `{TASK_FIELD}` field"))?;
    let raw = raw
        .as_ref()
        .map_err(|b| format!("the `{TASK_FIELD}` field is not UTF-8 ({} bytes)", b.len()))?;
    let line = TaskLine::parse(raw)?;
    if !line.service.trim().eq_ignore_ascii_case(service) {
        return Err(format!(
            "the line names service {:?}, not this stream's {service:?}",
            line.service
        ));
    }
    crate::syntax::check_path(&line.path)?;
    let task = line.to_task_within(limits)?;
    Ok((task, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(v: FieldValue) -> Fields {
        vec![(TASK_FIELD.to_string(), v)]
    }

    #[test]
    fn an_entry_is_sized_by_its_fields_and_logged_escaped() {
        let f = vec![
            ("task".to_string(), Ok("abc".to_string())),
            ("x".to_string(), Err(vec![0xff; 4])),
        ];
        assert_eq!(entry_bytes(&f), 4 + 3 + 1 + 4);
        let forged = "bad\n[2026-01-01 WARN] forged line\u{1b}[31m";
        let shown = esc(forged).to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert!(shown.contains("\\n"), "{shown}");
    }

    fn limits() -> crate::config::LineLimits {
        let cfg = crate::Config::from_json(
            r#"{"services":[{"name":"api","endpoints":[{"address":"http://h/"}]}]}"#,
        )
        .unwrap();
        cfg.services[0].lines.clone()
    }

    #[test]
    fn entries_that_can_never_run_are_refused_at_once() {
        let ok = one(Ok(r#"{"id":1,"service":"API","path":"/a"}"#.into()));
        let (task, line) = parse_entry(&ok, "api", &limits()).expect("a task");
        assert_eq!(line.id, Some(WireId::Number(1)));
        assert_eq!(task.path(), "/a");
        for (fields, want) in [
            (Vec::new(), "no `task` field"),
            (one(Err(vec![0xff, 0xfe])), "not UTF-8 (2 bytes)"),
            (one(Ok("not json".into())), ""),
            (
                one(Ok(r#"{"service":"jobs","path":"/a"}"#.into())),
                "names service \"jobs\", not this stream's \"api\"",
            ),
            (one(Ok(r#"{"service":"api","path":"/../etc"}"#.into())), ""),
            (
                one(Ok(
                    r#"{"service":"api","path":"/a","timeout":"365days"}"#.into()
                )),
                "lines.max_timeout",
            ),
        ] {
            let e = parse_entry(&fields, "api", &limits())
                .map(|_| ())
                .unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
