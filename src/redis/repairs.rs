//! Foreign content found in the library's keys, and a `MOVED` answer from
//! a Redis that is a Cluster node: said once in the log, not every call.
//!
//! The scripts (`gcra.lua`, `breaker.lua`, `record.lua`, the heartbeat's)
//! replace a key that holds what they never write (a list where a bucket
//! is, a string in a breaker's `reports`) and say which key and what they
//! found: `{index, what, index, what, ...}`, the index 1-based among the
//! call's keys. Something else writes under the prefix, and an operator
//! must learn of it, so each repair is a `warn!` naming the key and what
//! was there; at most once per key per minute ([`RepairLog`]), or a writer
//! that keeps at it would fill the log.
//!
//! A standalone connection (`redis.cluster` false) to a node of a Redis
//! Cluster gets `MOVED <slot> <addr>` for every key of another node's
//! slots; redis-rs does not follow it there, so every call fails and
//! `on_down` holds for ever. [`ClusterHint`] turns the first such answer
//! into one `error!` naming the setting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

/// How often one key's repair is logged at most.
pub(crate) const REPAIR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Keys remembered at most; past it the oldest minute is forgotten first,
/// so a flood of distinct keys cannot grow the map without bound.
const MAX_KEYS: usize = 4096;

/// Repairs read from a script's answer at most (a hostile or confused
/// answer is bounded where it enters).
const MAX_REPAIRS: usize = 64;

/// One key a script replaced: its position among the call's keys
/// (0-based) and what it found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repair {
    /// The key's index in the call's `KEYS` (0-based).
    pub index: usize,
    /// What the key held (`a list`, `a string that is not a number`, ...).
    pub found: String,
}

/// Reads a script's `{index, what, ...}` list (1-based indexes); anything
/// else reads as no repair.
pub(crate) fn parse_repairs(v: Option<&Value>) -> Vec<Repair> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .chunks(2)
        .take(MAX_REPAIRS)
        .filter_map(|pair| {
            let index = match pair.first()? {
                Value::Int(i) => usize::try_from(*i).ok()?.checked_sub(1)?,
                _ => return None,
            };
            let found = match pair.get(1)? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let found: String = found.chars().take(80).collect();
            Some(Repair { index, found })
        })
        .collect()
}

/// When each key's repair was last logged: at most once per key per
/// [`REPAIR_LOG_EVERY`].
#[derive(Debug, Default)]
pub(crate) struct RepairLog {
    last: HashMap<String, Instant>,
}

impl RepairLog {
    /// Whether a repair of `key` at `now` is logged (and, if so, noted).
    pub fn admit(&mut self, key: &str, now: Instant) -> bool {
        if let Some(t) = self.last.get(key) {
            if now.saturating_duration_since(*t) < REPAIR_LOG_EVERY {
                return false;
            }
        }
        if self.last.len() >= MAX_KEYS && !self.last.contains_key(key) {
            self.last
                .retain(|_, t| now.saturating_duration_since(*t) < REPAIR_LOG_EVERY);
            if self.last.len() >= MAX_KEYS {
                // Every key repaired within the minute: one line more is
                // not worth an unbounded map.
                return false;
            }
        }
        self.last.insert(key.to_owned(), now);
        true
    }

    /// Logs each repair of `repairs` (indexes into `keys`) that
    /// [`RepairLog::admit`] lets through, naming the key and what it held.
    pub fn warn(&mut self, scope: &str, keys: &[&str], repairs: &[Repair], now: Instant) {
        for r in repairs {
            let Some(key) = keys.get(r.index) else {
                continue;
            };
            if self.admit(key, now) {
                log::warn!(
                    "{scope}: redis key {key:?} held {}; replaced (something else writes \
                     under this prefix; logged at most once a minute per key)",
                    r.found.escape_debug()
                );
            }
        }
    }
}

/// Says once that a standalone connection reached a Cluster node.
#[derive(Debug, Default)]
pub(crate) struct ClusterHint {
    told: AtomicBool,
}

impl ClusterHint {
    /// Whether `e` is a `MOVED` answer seen for the first time (so the
    /// caller logs the configuration error).
    pub fn first_moved(&self, e: &redis::RedisError) -> bool {
        is_moved(e) && !self.told.swap(true, Ordering::Relaxed)
    }

    /// Logs the configuration error once, when `e` is the first `MOVED`.
    pub fn check(&self, url: &str, e: &redis::RedisError) {
        if self.first_moved(e) {
            log::error!("{}", moved_message(url));
        }
    }
}

/// Whether `e` is a Cluster's `MOVED` redirection.
pub(crate) fn is_moved(e: &redis::RedisError) -> bool {
    e.code() == Some("MOVED")
}

/// The configuration error of a `MOVED` answer on a standalone connection.
pub(crate) fn moved_message(url: &str) -> String {
    format!(
        "redis {url}: configuration error: the server is a node of a Redis Cluster \
         (it answered MOVED) but `redis.cluster` is not true; every call to a key of \
         another node fails and `on_down` applies until `redis.cluster: true` is set"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn repairs_are_read_bounded_and_one_based() {
        let v = Value::Array(vec![
            Value::Int(2),
            b("a list"),
            Value::Int(0), // not a 1-based index: dropped
            b("x"),
            Value::Int(1),
            Value::Int(7), // not text: dropped
            Value::Int(1),
            b(&"y".repeat(500)),
        ]);
        let r = parse_repairs(Some(&v));
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            Repair {
                index: 1,
                found: "a list".into()
            }
        );
        assert_eq!((r[1].index, r[1].found.len()), (0, 80));
        assert!(parse_repairs(Some(&Value::Int(3))).is_empty());
        assert!(parse_repairs(None).is_empty());
        let many = Value::Array((0..1000).flat_map(|_| [Value::Int(1), b("z")]).collect());
        assert_eq!(parse_repairs(Some(&many)).len(), MAX_REPAIRS);
    }

    #[test]
    fn a_key_is_logged_at_most_once_a_minute() {
        let t0 = Instant::now();
        let mut log = RepairLog::default();
        assert!(log.admit("ad:{a}:rl", t0));
        assert!(!log.admit("ad:{a}:rl", t0 + Duration::from_secs(59)));
        assert!(log.admit("ad:{b}:rl", t0 + Duration::from_secs(59)));
        assert!(log.admit("ad:{a}:rl", t0 + Duration::from_secs(60)));
        assert!(!log.admit("ad:{a}:rl", t0 + Duration::from_secs(61)));
    }

    #[test]
    fn the_map_of_logged_keys_stays_bounded() {
        let t0 = Instant::now();
        let mut log = RepairLog::default();
        for i in 0..MAX_KEYS {
            assert!(log.admit(&format!("k{i}"), t0));
        }
        // Full within the minute: a new key is not logged, nothing grows.
        assert!(!log.admit("new", t0 + Duration::from_secs(1)));
        assert_eq!(log.last.len(), MAX_KEYS);
        // A minute on, the old ones are forgotten and the new one logged.
        assert!(log.admit("new", t0 + Duration::from_secs(61)));
        assert_eq!(log.last.len(), 1);
    }

    #[test]
    fn moved_is_told_once() {
        let moved = redis::RedisError::from((redis::ErrorKind::Io, "x", "not moved".to_string()));
        let hint = ClusterHint::default();
        assert!(!hint.first_moved(&moved));
        let moved = redis::parse_redis_value(b"-MOVED 3999 127.0.0.1:6381\r\n")
            .and_then(|v| v.extract_error())
            .expect_err("an error reply");
        assert!(is_moved(&moved), "{moved:?}");
        assert!(hint.first_moved(&moved));
        assert!(!hint.first_moved(&moved), "told once");
        assert!(moved_message("redis://h:1/").contains("`redis.cluster`"));
    }
}
