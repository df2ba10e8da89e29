//! A node's shared bucket, as the balancer's view of the node holds it.
//!
//! With `rate_limit.shared` and `per_node`, each node's bucket lives in
//! the shared store (Redis); the balancer keeps what it knows of it in the node's view, where
//! it caps the node's room: tokens in hand
//! (a lease, or those paid for routes held on the node) until they expire;
//! none before the store said more are due; or, with nothing in hand and
//! nothing to wait for, "ask": a route placed there waits for one call.
//! While the store is down, `on_down` decides instead: a local bucket at the
//! node's rate over the live instances, everything, or nothing.

use tokio::time::Instant;

use super::Admit;
use crate::algo::limiter::TokenBucket;
use crate::config::BucketConfig;

/// A node's shared bucket as this instance holds it (`Off` unless shared),
/// kept in the balancer's view of the node: it caps the node's room.
#[derive(Debug, Clone, Default)]
pub(crate) enum NodeTokens {
    /// The node's bucket is not shared.
    #[default]
    Off,
    /// Redis answers: `tokens` in hand, usable until `until`; none asked
    /// for before `not_before`. Without tokens and past `not_before`, a
    /// task placed on the node waits for one call (it is asked for then).
    Up {
        tokens: u32,
        until: Instant,
        not_before: Option<Instant>,
    },
    /// Redis down, `on_down: local`: a local bucket at rate / live instances.
    Local(TokenBucket),
    /// Redis down, `on_down: allow`.
    Open,
    /// Redis down, `on_down: deny`.
    Closed,
}

impl NodeTokens {
    /// Shared, with nothing in hand yet.
    pub fn up(now: Instant) -> NodeTokens {
        NodeTokens::Up {
            tokens: 0,
            until: now,
            not_before: None,
        }
    }

    /// The node's `slots` as its shared bucket lets them be used at `now`.
    /// Inline: it is read for every node at every turn, and without a
    /// shared bucket it is the identity.
    #[inline]
    pub fn cap(&self, slots: usize, now: Instant) -> usize {
        match self {
            NodeTokens::Off | NodeTokens::Open => slots,
            _ => self.cap_shared(slots, now),
        }
    }

    fn cap_shared(&self, slots: usize, now: Instant) -> usize {
        match self {
            NodeTokens::Off | NodeTokens::Open => slots,
            NodeTokens::Closed => 0,
            NodeTokens::Local(b) => slots.min(b.available(now) as usize),
            NodeTokens::Up {
                tokens,
                until,
                not_before,
            } => {
                if *tokens > 0 && *until > now {
                    slots.min(*tokens as usize)
                } else if not_before.is_some_and(|t| t > now) {
                    0
                } else {
                    slots
                }
            }
        }
    }

    /// When time alone changes the node's room: its fallback bucket's next
    /// token, the next batch due, or a lease's end (after which the node
    /// asks again: its room may grow back to its slots).
    pub fn wake(&self, now: Instant) -> Option<Instant> {
        let future = |t: &Instant| *t > now;
        match self {
            NodeTokens::Local(b) if b.available(now) == 0 => b.check(now).err().filter(future),
            NodeTokens::Up {
                tokens,
                until,
                not_before,
            } => {
                let lease = (*tokens > 0).then_some(*until).filter(future);
                match (not_before.filter(future), lease) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            _ => None,
        }
    }

    /// Until when the node has no token for this instance at `now`: none
    /// in hand and the next ones not due before (or its fallback bucket's
    /// next token while Redis is down); `None` when a task could take or
    /// ask for one now.
    pub fn blocked_until(&self, now: Instant) -> Option<Instant> {
        match self {
            NodeTokens::Local(b) if b.available(now) == 0 => b.check(now).err(),
            NodeTokens::Up {
                tokens,
                until,
                not_before,
            } if *tokens == 0 || *until <= now => not_before.filter(|t| *t > now),
            _ => None,
        }
    }

    /// The node's tokens as `stats()` shows them when its bucket is
    /// shared: those this instance holds and may still use (a lease, or
    /// those paid for held routes), not the bucket in Redis, which this
    /// instance does not read; while Redis is down, the fallback bucket's
    /// (`on_down: local`), none (`deny`) or no limit (`allow`, `None`).
    /// `None` when the bucket is not shared.
    pub fn shown(&self, now: Instant) -> Option<u32> {
        match self {
            NodeTokens::Off | NodeTokens::Open => None,
            NodeTokens::Closed => Some(0),
            NodeTokens::Local(b) => Some(b.available(now)),
            NodeTokens::Up { tokens, until, .. } => Some(if *until > now { *tokens } else { 0 }),
        }
    }

    /// A task placed on the node at `now`: `Go` takes a token, `Hold`
    /// waits for a call to Redis, `Bounce` sends it back to the queue.
    pub fn take(&mut self, now: Instant) -> Admit {
        match self {
            NodeTokens::Off | NodeTokens::Open => Admit::Go,
            NodeTokens::Closed => Admit::Bounce,
            NodeTokens::Local(b) => match b.try_acquire(now) {
                Ok(()) => Admit::Go,
                Err(_) => Admit::Bounce,
            },
            NodeTokens::Up {
                tokens,
                until,
                not_before,
            } => {
                if *tokens > 0 && *until > now {
                    *tokens -= 1;
                    Admit::Go
                } else if not_before.is_some_and(|t| t > now) {
                    Admit::Bounce
                } else {
                    Admit::Hold
                }
            }
        }
    }
}

/// The local fallback of a shared bucket: its rate and burst split over
/// the `live` instances last counted.
pub(super) fn local_bucket(b: BucketConfig, live: u64, now: Instant) -> TokenBucket {
    let live = live.max(1);
    let rate = b.rate / live as f64;
    let burst = (u64::from(b.burst) / live).max(1) as u32;
    TokenBucket::new(rate, burst, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn node_tokens_cap_the_room_and_say_when_to_ask() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Nothing in hand, nothing due: the node's slots, and a task waits
        // for one call.
        let mut n = NodeTokens::up(t0);
        assert_eq!(n.cap(4, t0), 4);
        assert_eq!(n.take(t0), Admit::Hold);
        // Two in hand for 100 ms, the next batch due in 300 ms.
        n = NodeTokens::Up {
            tokens: 2,
            until: t0 + ms(100),
            not_before: Some(t0 + ms(300)),
        };
        assert_eq!(n.cap(4, t0), 2);
        assert_eq!(n.blocked_until(t0), None, "tokens in hand");
        assert_eq!(n.shown(t0), Some(2));
        assert_eq!(n.shown(t0 + ms(100)), Some(0), "a lease over");
        assert_eq!(NodeTokens::Off.shown(t0), None);
        assert_eq!(n.wake(t0), Some(t0 + ms(100)), "the lease's end");
        assert_eq!(n.take(t0), Admit::Go);
        assert_eq!(n.take(t0), Admit::Go);
        // Used up: no room, and no task, until the batch is due.
        assert_eq!(n.cap(4, t0), 0);
        assert_eq!(n.take(t0), Admit::Bounce);
        assert_eq!(n.wake(t0), Some(t0 + ms(300)));
        assert_eq!(n.blocked_until(t0), Some(t0 + ms(300)), "on_limit: reject");
        assert_eq!(n.blocked_until(t0 + ms(300)), None);
        assert_eq!(n.cap(4, t0 + ms(300)), 4);
        assert_eq!(n.take(t0 + ms(300)), Admit::Hold);
        // A lease over is not used.
        let mut n = NodeTokens::Up {
            tokens: 3,
            until: t0 + ms(100),
            not_before: None,
        };
        assert_eq!(n.cap(4, t0 + ms(100)), 4, "asked for again");
        assert_eq!(n.take(t0 + ms(100)), Admit::Hold);
    }

    #[test]
    fn node_tokens_while_redis_is_down() {
        let t0 = Instant::now();
        let mut n = NodeTokens::Local(local_bucket(
            BucketConfig {
                rate: 20.0,
                burst: 6,
            },
            3,
            t0,
        ));
        // Rate and burst split over three live instances: 2 now, then one
        // each 150 ms.
        assert_eq!(n.cap(5, t0), 2);
        assert_eq!(n.take(t0), Admit::Go);
        assert_eq!(n.take(t0), Admit::Go);
        assert_eq!(n.take(t0), Admit::Bounce);
        assert_eq!(n.wake(t0), Some(t0 + Duration::from_millis(150)));
        assert_eq!(NodeTokens::Open.cap(5, t0), 5);
        assert_eq!(NodeTokens::Closed.cap(5, t0), 0);
        assert_eq!(NodeTokens::Closed.clone().take(t0), Admit::Bounce);
    }
}
