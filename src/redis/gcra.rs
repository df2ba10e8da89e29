//! Calls of `gcra.lua`: the shared token buckets' one script.
//!
//! A call carries several asks; each names the buckets one of its tokens
//! needs (a task's service and node buckets) and how many it wants, and
//! gets back how many it was granted and when its buckets hold that many
//! again (`due`). The arguments are laid out as the script's header says;
//! the answer is bounded where it enters.

use std::time::Duration;

#[cfg(feature = "internals")]
use redis::Script;
use redis::Value;

use super::repairs::{parse_repairs, Repair};
#[cfg(feature = "internals")]
use super::wire::GCRA_LUA;
use crate::config::BucketConfig;

/// A bucket's GCRA parameters in µs: (emission interval, tolerance).
pub fn gcra_params(b: BucketConfig) -> (u64, u64) {
    let interval = ((1e6 / b.rate).round() as u64).max(1);
    (interval, interval.saturating_mul(u64::from(b.burst - 1)))
}

/// One ask of a `gcra.lua` call: `want` tokens, each taken from every
/// bucket of `buckets` (positions in the call's keys) together, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The buckets one token of this ask needs (a service's, a node's).
    pub buckets: Vec<usize>,
    /// Tokens wanted (0: only read the clock).
    pub want: u32,
}

/// What one ask got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Got {
    /// Tokens granted (0..=want).
    pub granted: u32,
    /// How long until the ask's buckets hold its tokens again (`want`, at
    /// most half of each bucket's burst, rounded up); zero when they do now.
    /// Asking before then gets less: an instance waits this long.
    pub due: Duration,
}

#[cfg(feature = "internals")]
/// The answer of one `gcra.lua` call with a single ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Tokens granted (0..=wanted).
    pub granted: u32,
    /// [`Got::due`]: when the wanted tokens are there again (zero: now).
    pub retry_in: Duration,
    /// Redis's clock at the call, µs.
    pub now_us: u64,
}

/// Fills a `gcra.lua` invocation: `keys` with their buckets, the asks, and
/// in tests a forced `now`.
pub(super) fn gcra_args(
    inv: &mut redis::ScriptInvocation<'_>,
    keys: &[(String, BucketConfig)],
    asks: &[Ask],
    now_us: Option<u64>,
) {
    inv.arg(asks.len());
    for (k, b) in keys {
        let (iv, tol) = gcra_params(*b);
        inv.key(k).arg(iv).arg(tol);
    }
    for a in asks {
        inv.arg(a.want).arg(a.buckets.len());
        for b in &a.buckets {
            inv.arg(b + 1);
        }
    }
    if let Some(now) = now_us {
        inv.arg(now);
    }
}

/// Reads `{ now, granted_1, due_1, ... }`, bounded where it enters: an ask
/// is never granted more than it wanted (a confused or hostile answer must
/// not hand out a lease past the limit), a due time is at most a minute.
pub(super) fn gcra_answer(v: &[u64], asks: &[Ask]) -> (Vec<Got>, u64) {
    let now = v.first().copied().unwrap_or(0);
    let got = (0..asks.len())
        .map(|a| Got {
            granted: v.get(1 + 2 * a).map_or(0, |g| {
                u32::try_from(*g).unwrap_or(u32::MAX).min(asks[a].want)
            }),
            due: Duration::from_micros(v.get(2 + 2 * a).copied().unwrap_or(0).min(60_000_000)),
        })
        .collect();
    (got, now)
}

/// Reads the script's whole answer: each ask's [`Got`], the script's
/// clock (µs), and the bucket keys it replaced (its last element, after
/// the asks'). A number that is not a non-negative integer reads as 0.
pub(super) fn gcra_decode(v: &[Value], asks: &[Ask]) -> (Vec<Got>, u64, Vec<Repair>) {
    let n = 1 + 2 * asks.len();
    let ints: Vec<u64> = v
        .iter()
        .take(n)
        .map(|x| match x {
            Value::Int(i) => u64::try_from(*i).unwrap_or(0),
            _ => 0,
        })
        .collect();
    let (got, now) = gcra_answer(&ints, asks);
    (got, now, parse_repairs(v.get(n)))
}

#[cfg(feature = "internals")]
/// Runs `gcra.lua` once over `keys` (each with its bucket) for `asks`, at
/// Redis `TIME` or, in tests, at `now_us`; returns each ask's answer and
/// the script's clock (µs).
pub async fn take_many<C: redis::aio::ConnectionLike>(
    con: &mut C,
    keys: &[(String, BucketConfig)],
    asks: &[Ask],
    now_us: Option<u64>,
) -> redis::RedisResult<(Vec<Got>, u64)> {
    let script = Script::new(GCRA_LUA);
    let mut inv = script.prepare_invoke();
    gcra_args(&mut inv, keys, asks, now_us);
    let v: Vec<Value> = inv.invoke_async(con).await?;
    let (got, now, _) = gcra_decode(&v, asks);
    Ok((got, now))
}

#[cfg(feature = "internals")]
/// Runs `gcra.lua` once: `want` tokens from every bucket of `keys` (each
/// with its config) together, at Redis `TIME` or, in tests, at `now_us`.
pub async fn take_tokens<C: redis::aio::ConnectionLike>(
    con: &mut C,
    keys: &[(String, BucketConfig)],
    want: u32,
    now_us: Option<u64>,
) -> redis::RedisResult<Taken> {
    let ask = Ask {
        buckets: (0..keys.len()).collect(),
        want: want.max(1),
    };
    let (got, now) = take_many(con, keys, &[ask], now_us).await?;
    Ok(Taken {
        granted: got[0].granted,
        retry_in: got[0].due,
        now_us: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(want: u32) -> Ask {
        Ask {
            buckets: vec![0],
            want,
        }
    }

    /// Redis's answer is input from outside: a grant is capped at what was
    /// asked, a due time at a minute, and a short answer reads as nothing.
    #[test]
    fn a_hostile_answer_is_bounded_where_it_enters() {
        let (got, now) = gcra_answer(&[7, u64::MAX, u64::MAX, 3, 5], &[ask(4), ask(2)]);
        assert_eq!(now, 7);
        assert_eq!(got[0].granted, 4, "never more than asked");
        assert_eq!(got[0].due, Duration::from_secs(60));
        assert_eq!(got[1].granted, 2);
        assert_eq!(got[1].due, Duration::from_micros(5));
        let (got, now) = gcra_answer(&[], &[ask(3)]);
        assert_eq!((now, got[0].granted, got[0].due), (0, 0, Duration::ZERO));
    }

    /// The whole answer: the asks' numbers, then the keys replaced.
    #[test]
    fn the_answer_names_the_keys_replaced() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let v = vec![
            Value::Int(9),
            Value::Int(2),
            Value::Int(-4),
            Value::Array(vec![Value::Int(1), b("a list")]),
        ];
        let (got, now, repaired) = gcra_decode(&v, &[ask(3)]);
        assert_eq!((now, got[0].granted, got[0].due), (9, 2, Duration::ZERO));
        assert_eq!(
            repaired,
            vec![Repair {
                index: 0,
                found: "a list".into()
            }]
        );
        let (_, _, none) = gcra_decode(&v[..3], &[ask(3)]);
        assert!(none.is_empty());
    }
}
