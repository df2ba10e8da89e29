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
//! asks the sentinels again each time it is lost ([`Link`], pure):
//!
//! * a call that fails because the connection broke (an I/O error, a
//!   dropped connection, a failed `AUTH`) or because the node is no longer
//!   the master (`READONLY`, `MASTERDOWN`) drops it;
//! * so do [`NO_ANSWER_LIMIT`] calls in a row without an answer (a master
//!   cut off without a reset: the sentinels promote another meanwhile);
//! * the next call starts a resolve (one at a time, in a task of its own,
//!   so a caller's short timeout never cancels it, and bounded in time);
//! * a failed resolve is retried after a backoff (50 ms doubling, at most
//!   [`RESOLVE_BACKOFF_MAX`]);
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

/// Calls in a row without an answer after which the connection is
/// dropped and the master asked for again.
pub(crate) const NO_ANSWER_LIMIT: u32 = 3;
/// The first wait after a failed resolve (doubling).
const RESOLVE_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest wait between two resolves.
pub(crate) const RESOLVE_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What one call's end says of the connection it went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// An answer, or an error of the command itself (a script's error,
    /// `WRONGTYPE`): the connection is fine.
    Answered,
    /// No answer in time (the response timeout, or the caller gave up).
    NoAnswer,
    /// The connection broke, or its node is no longer the master.
    Lost,
}

/// The verdict on a call's result.
pub(crate) fn verdict<T>(r: &redis::RedisResult<T>) -> Verdict {
    let Err(e) = r else {
        return Verdict::Answered;
    };
    if e.is_timeout() {
        return Verdict::NoAnswer;
    }
    let demoted = matches!(e.code(), Some("READONLY" | "MASTERDOWN"));
    if demoted || e.is_io_error() || e.is_unrecoverable_error() {
        return Verdict::Lost;
    }
    // A server-side error of the command (NOSCRIPT is handled by the
    // script invocation itself): the node answered.
    Verdict::Answered
}

/// What a caller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Use the connection of this generation.
    Use(u64),
    /// Start a resolve (the caller was chosen), then wait for it.
    Resolve,
    /// A resolve is running: wait for it.
    Wait,
    /// The last resolve failed; the next may start at this instant.
    Refuse(Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection, none being made.
    Idle,
    Resolving,
    /// A connection of generation `gen`.
    Up,
}

/// The connection's life, pure: which generation is current, when the next
/// resolve may start, when a connection is dropped.
#[derive(Debug)]
pub(crate) struct Link {
    state: State,
    gen: u64,
    no_answers: u32,
    failed: u32,
    next_resolve: Instant,
}

impl Link {
    pub fn new(now: Instant) -> Link {
        Link {
            state: State::Idle,
            gen: 0,
            no_answers: 0,
            failed: 0,
            next_resolve: now,
        }
    }

    /// A caller wants the connection at `now`.
    pub fn want(&mut self, now: Instant) -> Step {
        match self.state {
            State::Up => Step::Use(self.gen),
            State::Resolving => Step::Wait,
            State::Idle if now >= self.next_resolve => {
                self.state = State::Resolving;
                Step::Resolve
            }
            State::Idle => Step::Refuse(self.next_resolve),
        }
    }

    /// The resolve ended at `now`; on success, the new connection's
    /// generation.
    pub fn resolved(&mut self, ok: bool, now: Instant) -> Option<u64> {
        if ok {
            self.gen += 1;
            self.state = State::Up;
            self.no_answers = 0;
            self.failed = 0;
            Some(self.gen)
        } else {
            self.state = State::Idle;
            self.failed = self.failed.saturating_add(1);
            let backoff = RESOLVE_BACKOFF_MIN
                .saturating_mul(1 << (self.failed - 1).min(16))
                .min(RESOLVE_BACKOFF_MAX);
            self.next_resolve = now + backoff;
            None
        }
    }

    /// A call over generation `gen` ended with `v`; true when it dropped
    /// the connection (the next call resolves again). Reports of an older
    /// generation change nothing.
    pub fn ended(&mut self, gen: u64, v: Verdict, now: Instant) -> bool {
        if self.state != State::Up || gen != self.gen {
            return false;
        }
        let drop = match v {
            Verdict::Answered => {
                self.no_answers = 0;
                false
            }
            Verdict::NoAnswer => {
                self.no_answers += 1;
                self.no_answers >= NO_ANSWER_LIMIT
            }
            Verdict::Lost => true,
        };
        if drop {
            self.state = State::Idle;
            self.next_resolve = now;
        }
        drop
    }
}

/// The state behind the lock: the link, its connection, the last error.
struct Slot {
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
    slot: Mutex<Slot>,
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
            slot: Mutex::new(Slot {
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
    fn no_master(&self, s: &Slot) -> redis::RedisError {
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
            let mut report = Report {
                sh: &self.0,
                gen,
                verdict: None,
            };
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
            let mut report = Report {
                sh: &self.0,
                gen,
                verdict: None,
            };
            let r = con.req_packed_commands(pipeline, offset, count).await;
            report.verdict = Some(verdict(&r));
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn verdicts() {
        let ok: redis::RedisResult<()> = Ok(());
        assert_eq!(verdict(&ok), Verdict::Answered);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost: redis::RedisResult<()> = Err(io.into());
        assert_eq!(verdict(&lost), Verdict::Lost);
        let t = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow");
        let slow: redis::RedisResult<()> = Err(t.into());
        assert_eq!(verdict(&slow), Verdict::NoAnswer);
        let closed: redis::RedisResult<()> = Err((ErrorKind::Io, "closed").into());
        assert_eq!(verdict(&closed), Verdict::Lost);
        let auth: redis::RedisResult<()> = Err((ErrorKind::AuthenticationFailed, "no").into());
        assert_eq!(verdict(&auth), Verdict::Lost);
        // A script's own error: the node answered.
        let script: redis::RedisResult<()> = Err((ErrorKind::UnexpectedReturnType, "x").into());
        assert_eq!(verdict(&script), Verdict::Answered);
    }

    #[test]
    fn server_errors_of_a_demoted_master_lose_the_connection() {
        let parse = |line: &str| -> redis::RedisResult<Value> {
            let v = redis::parse_redis_value(line.as_bytes())?;
            v.extract_error()
        };
        let ro = parse("-READONLY You can't write against a read only replica.\r\n");
        assert!(ro.is_err(), "{ro:?}");
        assert_eq!(verdict(&ro), Verdict::Lost);
        let down = parse("-MASTERDOWN Link with MASTER is down\r\n");
        assert_eq!(verdict(&down), Verdict::Lost);
        let wrong = parse("-WRONGTYPE Operation against a key holding the wrong kind\r\n");
        assert_eq!(verdict(&wrong), Verdict::Answered);
    }

    #[test]
    fn one_resolve_at_a_time_then_the_connection() {
        let t0 = Instant::now();
        let mut l = Link::new(t0);
        assert_eq!(l.want(t0), Step::Resolve);
        assert_eq!(l.want(t0), Step::Wait);
        assert_eq!(l.resolved(true, t0), Some(1));
        assert_eq!(l.want(t0), Step::Use(1));
        assert!(!l.ended(1, Verdict::Answered, t0));
        assert_eq!(l.want(t0), Step::Use(1));
    }

    #[test]
    fn a_lost_connection_resolves_again_at_once() {
        let t0 = Instant::now();
        let mut l = Link::new(t0);
        l.want(t0);
        l.resolved(true, t0);
        assert!(l.ended(1, Verdict::Lost, t0));
        // A second report of the same loss changes nothing.
        assert!(!l.ended(1, Verdict::Lost, t0));
        assert_eq!(l.want(t0), Step::Resolve);
        assert_eq!(l.resolved(true, t0), Some(2));
        // A late report of the old connection does not drop the new one.
        assert!(!l.ended(1, Verdict::Lost, t0));
        assert_eq!(l.want(t0), Step::Use(2));
    }

    #[test]
    fn no_answers_in_a_row_drop_the_connection() {
        let t0 = Instant::now();
        let mut l = Link::new(t0);
        l.want(t0);
        l.resolved(true, t0);
        for _ in 0..NO_ANSWER_LIMIT - 1 {
            assert!(!l.ended(1, Verdict::NoAnswer, t0));
        }
        // An answer in between starts the count again.
        assert!(!l.ended(1, Verdict::Answered, t0));
        for _ in 0..NO_ANSWER_LIMIT - 1 {
            assert!(!l.ended(1, Verdict::NoAnswer, t0));
        }
        assert!(l.ended(1, Verdict::NoAnswer, t0));
        assert_eq!(l.want(t0), Step::Resolve);
    }

    #[test]
    fn failed_resolves_back_off_to_a_bound() {
        let t0 = Instant::now();
        let mut l = Link::new(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            assert_eq!(l.want(now), Step::Resolve);
            assert_eq!(l.resolved(false, now), None);
            let Step::Refuse(at) = l.want(now) else {
                panic!("refused until the backoff ends")
            };
            // Just before: still refused; at it: a resolve.
            assert_eq!(l.want(at - ms(1)), Step::Refuse(at));
            waits.push(at - now);
            now = at;
        }
        assert_eq!(
            waits,
            [50, 100, 200, 400, 800, 1000, 1000, 1000].map(ms).to_vec()
        );
        // A success resets the backoff.
        assert_eq!(l.want(now), Step::Resolve);
        l.resolved(true, now);
        l.ended(1, Verdict::Lost, now);
        assert_eq!(l.want(now), Step::Resolve);
        l.resolved(false, now);
        assert_eq!(l.want(now), Step::Refuse(now + ms(50)));
    }
}
