//! The connection to the master that Redis Sentinel names, found again
//! whenever it is lost.
//!
//! redis-rs's `SentinelClient` asks the sentinels for the master's address
//! on every call of `async_get_client` (`SENTINEL MASTERS`, skipping a
//! master flagged `s_down`/`o_down`, then `ROLE` on the node it names, which
//! must answer `master`); it caches only its connections to the sentinels,
//! not the address. But the connection it returns is a plain multiplexed
//! one, bound to that address for good, and redis-rs's `ConnectionManager`
//! reconnects to the address of a fixed `Client`: after a failover it would
//! keep dialling the dead master. So this module holds the connection and
//! asks the sentinels again each time it is lost (`link.rs`, pure):
//!
//! * a call that fails because the connection broke (an I/O error, a
//!   dropped connection, a failed `AUTH`) or because the node is no longer
//!   the master (`READONLY`, `MASTERDOWN`) drops it;
//! * so do `NO_ANSWER_LIMIT` (3) calls in a row without an answer (a master
//!   cut off without a reset: the sentinels promote another meanwhile);
//! * the next call starts a resolve (one at a time, in a task of its own,
//!   so a caller's short timeout never cancels it, and bounded in time);
//! * a failed resolve is retried after a backoff (50 ms doubling, at most
//!   `RESOLVE_BACKOFF_MAX` (1 s));
//! * a call waits for the connection (through resolves and backoffs) for
//!   at most the connection's response timeout, the bound it has once
//!   connected, and fails with the last resolve's error after it (at once
//!   when the next resolve is due only after it).
//!
//! No call is retried here: a failed call is the caller's failure (the
//! shared state's `on_down`, the stream's retry), as with the single
//! Redis's connection manager.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisFuture, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::link::{verdict, Link, Step, Verdict};

/// The state behind the lock: the link, its connection, the last error.
struct LinkState {
    link: Link,
    con: Option<MultiplexedConnection>,
    /// The address of the master last connected to (for the log line).
    master: Option<String>,
    /// The last resolve's error, redacted.
    last_err: Option<(ErrorKind, String)>,
}

struct Shared {
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The bound of one resolve, all sentinels and the master's check.
    limit: Duration,
    /// The longest a call waits for a connection.
    response: Duration,
    db: i64,
    master_name: String,
    slot: Mutex<LinkState>,
    changed: Notify,
    scrub: Box<dyn Fn(&str) -> String + Send + Sync>,
}

/// A connection to the master the sentinels name. Cheap to clone (one
/// connection shared by the clones).
#[derive(Clone)]
pub(crate) struct SentinelConn(Arc<Shared>);

impl SentinelConn {
    /// Lazy: no round trip until the first call. `limit` bounds each
    /// resolve, `response` a call's wait for a connection; `scrub` redacts
    /// error texts.
    pub fn new(
        client: SentinelClient,
        config: AsyncConnectionConfig,
        limit: Duration,
        response: Duration,
        db: i64,
        master_name: String,
        scrub: Box<dyn Fn(&str) -> String + Send + Sync>,
    ) -> SentinelConn {
        SentinelConn(Arc::new(Shared {
            client: tokio::sync::Mutex::new(client),
            config,
            limit,
            response,
            db,
            master_name,
            slot: Mutex::new(LinkState {
                link: Link::new(Instant::now()),
                con: None,
                master: None,
                last_err: None,
            }),
            changed: Notify::new(),
            scrub,
        }))
    }

    /// The current connection and its generation, resolving the master
    /// first when there is none.
    pub async fn connection(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        let deadline = Instant::now() + self.0.response;
        loop {
            let notified = self.0.changed.notified();
            tokio::pin!(notified);
            // Registered before the state is read: a resolve ending in
            // between still wakes this caller.
            notified.as_mut().enable();
            let step = {
                let mut s = self.0.slot.lock().expect("lock");
                let step = s.link.want(Instant::now());
                match step {
                    Step::Use(gen) => {
                        let con = s.con.clone().expect("a connection when up");
                        return Ok((gen, con));
                    }
                    Step::Refuse(at) if at >= deadline => return Err(self.no_master(&s)),
                    s => s,
                }
            };
            match step {
                Step::Resolve => {
                    tokio::spawn(resolve(self.0.clone()));
                }
                Step::Refuse(at) => {
                    tokio::time::sleep_until(at).await;
                    continue;
                }
                _ => {}
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let s = self.0.slot.lock().expect("lock");
                return Err(self.no_master(&s));
            }
        }
    }

    /// The error of a call that found no master in time: the last
    /// resolve's.
    fn no_master(&self, s: &LinkState) -> redis::RedisError {
        let (kind, text) = s.last_err.clone().unwrap_or((
            ErrorKind::Io,
            format!("no master within {:?}", self.0.response),
        ));
        (kind, "redis sentinel", text).into()
    }
}

/// Asks the sentinels for the master and connects to it, within the
/// limit; records the outcome and wakes the waiting callers.
async fn resolve(sh: Arc<Shared>) {
    let found = tokio::time::timeout(sh.limit, async {
        let mut client = sh.client.lock().await;
        let master = client.async_get_client().await?;
        let addr = master.get_connection_info().addr().to_string();
        let con = master
            .get_multiplexed_async_connection_with_config(&sh.config)
            .await?;
        Ok::<_, redis::RedisError>((addr, con))
    })
    .await
    .unwrap_or_else(|_| {
        Err((
            ErrorKind::Io,
            "redis sentinel",
            format!("no master found within {:?}", sh.limit),
        )
            .into())
    });
    let mut s = sh.slot.lock().expect("lock");
    let now = Instant::now();
    match found {
        Ok((addr, con)) => {
            s.link.resolved(true, now);
            if s.master.as_deref() != Some(addr.as_str()) {
                match &s.master {
                    Some(old) => log::warn!(
                        "redis sentinel: master {} moved from {old} to {addr}",
                        sh.master_name
                    ),
                    None => log::info!("redis sentinel: master {} at {addr}", sh.master_name),
                }
            }
            s.master = Some(addr);
            s.con = Some(con);
            s.last_err = None;
        }
        Err(e) => {
            s.link.resolved(false, now);
            s.con = None;
            let text = (sh.scrub)(&e.to_string());
            if s.last_err.is_none() {
                log::warn!(
                    "redis sentinel: no usable master {}: {text}; asking again",
                    sh.master_name
                );
            }
            s.last_err = Some((e.kind(), text));
        }
    }
    drop(s);
    sh.changed.notify_waiters();
}

/// Reports a call's end to the link; a call dropped before its end (the
/// caller's timeout) counts as no answer.
struct Report<'a> {
    sh: &'a Shared,
    gen: u64,
    verdict: Option<Verdict>,
}

impl<'a> Report<'a> {
    /// The report of one call on connection generation `gen`; no verdict
    /// yet (dropped so, the call got no answer).
    fn on(sh: &'a Shared, gen: u64) -> Self {
        Report {
            sh,
            gen,
            verdict: None,
        }
    }
}

impl Drop for Report<'_> {
    fn drop(&mut self) {
        let v = self.verdict.unwrap_or(Verdict::NoAnswer);
        let mut s = self.sh.slot.lock().expect("lock");
        if s.link.ended(self.gen, v, Instant::now()) {
            s.con = None;
            log::debug!(
                "redis sentinel: connection to master {} dropped ({v:?}); asking the sentinels again",
                self.sh.master_name
            );
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (gen, mut con) = self.connection().await?;
            let mut report = Report::on(&self.0, gen);
            let r = con.req_packed_command(cmd).await;
            report.verdict = Some(verdict(&r));
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (gen, mut con) = self.connection().await?;
            let mut report = Report::on(&self.0, gen);
            let r = con.req_packed_commands(pipeline, offset, count).await;
            report.verdict = Some(verdict(&r));
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}
