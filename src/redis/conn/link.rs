//! The life of the connection to Sentinel's master, pure: which
//! generation of connection is current, when a call's end drops it, when
//! the next resolve may start (`now` passed in; the shell in
//! `sentinel.rs` reads the clock and holds the connection).

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, Value};

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
