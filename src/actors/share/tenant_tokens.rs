//! A tenant's shared rate (`tenants.rate` with `tenants.shared`), as this
//! instance's queue holds it.
//!
//! The tenant's bucket lives in the shared store (Redis,
//! `prefix:{service}:tn:<tenant>:rl`); the queue leases its tokens in small
//! batches (`rate · lease`, at least one, at most the burst), one call per
//! batch and never one per task, and checks each new task of the tenant
//! against the tokens in hand. The queue never waits on the store: a task
//! that finds no token in hand, while no answer said "none before then",
//! is let through on credit, and the call for a batch goes out; the batch
//! pays the credit first. Credit is given only up to one batch (`owed`
//! stays below the lease size): what this instance lets through is at
//! most what the store granted it plus one batch, so several instances
//! share one tenant's rate to within a batch each.
//!
//! While the store does not answer, the fallback is the node buckets'
//! (`redis.on_down`): `local` gives the tenant a local bucket at its rate
//! and burst split over the live instances, `allow` lets every task
//! through, `deny` refuses them; the store is asked again once per
//! `timeout`, and the first answer brings the shared bucket back.
//!
//! Pure: every method takes `now`.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::node_tokens::local_bucket;
use super::Settings;
use crate::algo::limiter::TokenBucket;
use crate::algo::time;
use crate::config::{BucketConfig, OnDown};

/// One tracked tenant's shared tokens, as this instance holds them.
#[derive(Debug, Clone)]
pub(crate) struct TenantLease {
    /// Tokens in hand, usable until `until`.
    tokens: u32,
    until: Instant,
    /// Tasks let through on credit, not paid for by a grant yet.
    owed: u32,
    /// A call for tokens is out.
    asking: bool,
    /// No call before this (the store said when tokens are due; or, while
    /// down, the next try).
    not_before: Option<Instant>,
    /// The store does not answer: the fallback (`on_down`).
    down: Option<Fallback>,
}

#[derive(Debug, Clone)]
enum Fallback {
    Local(TokenBucket),
    Open,
    Closed,
}

/// What a task of the tenant found, and whether to call the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checked {
    /// `Ok`: the task goes on; `Err(retry_after)`: over the rate.
    pub admit: Result<(), Duration>,
    /// Tokens to ask the store for now (a call is then out).
    pub ask: Option<u32>,
}

impl TenantLease {
    /// Nothing in hand, nothing owed, at `now`.
    pub fn new(now: Instant) -> Self {
        TenantLease {
            tokens: 0,
            until: now,
            owed: 0,
            asking: false,
            not_before: None,
            down: None,
        }
    }

    /// A new task of the tenant at `now`, its bucket `b`, the store's
    /// settings `s`.
    pub fn check(&mut self, b: BucketConfig, s: &Settings, now: Instant) -> Checked {
        let batch = batch_size(b, s.lease);
        let may_call = !self.asking && self.not_before.is_none_or(|t| t <= now);
        if let Some(fb) = &mut self.down {
            let admit = match fb {
                Fallback::Local(bucket) => bucket
                    .try_acquire(now)
                    .map_err(|at| at.saturating_duration_since(now)),
                Fallback::Open => Ok(()),
                Fallback::Closed => Err(self
                    .not_before
                    .map_or(s.timeout, |t| t.saturating_duration_since(now))
                    .max(Duration::from_millis(1))),
            };
            // Asked again once per timeout, to see the store back.
            let ask = may_call.then(|| {
                self.asking = true;
                batch
            });
            return Checked { admit, ask };
        }
        if self.tokens > 0 && self.until > now {
            self.tokens -= 1;
            return Checked {
                admit: Ok(()),
                ask: None,
            };
        }
        self.tokens = 0;
        if let Some(t) = self.not_before.filter(|t| *t > now) {
            return Checked {
                admit: Err(t.saturating_duration_since(now)),
                ask: None,
            };
        }
        if self.owed < batch {
            // On credit: the batch asked for pays it.
            self.owed += 1;
            let ask = may_call.then(|| {
                self.asking = true;
                batch
            });
            return Checked { admit: Ok(()), ask };
        }
        // A batch's worth let through on credit already: one token's time.
        let one = Duration::from_secs_f64((1.0 / b.rate).min(time::MAX_DURATION.as_secs_f64()));
        Checked {
            admit: Err(one.max(Duration::from_millis(1))),
            ask: None,
        }
    }

    /// The store's answer to the call sent at `asked`: `granted` tokens,
    /// the next ones due in `due`; `None` when it did not answer (`live`
    /// instances sharing the bucket, for the local fallback).
    pub fn answered(
        &mut self,
        got: Option<(u32, Duration)>,
        b: BucketConfig,
        s: &Settings,
        live: u64,
        asked: Instant,
        now: Instant,
    ) {
        self.asking = false;
        match got {
            Some((granted, due)) => {
                self.down = None;
                let paid = granted.min(self.owed);
                self.owed -= paid;
                self.tokens = granted - paid;
                // Counted from when the call was sent: the tokens are never
                // used more than `lease` after the store gave them.
                self.until =
                    time::add(asked, s.lease).max(time::add(now, Duration::from_millis(1)));
                self.not_before = (!due.is_zero()).then(|| time::add(now, due));
            }
            None => {
                if self.down.is_none() {
                    self.down = Some(match s.on_down {
                        OnDown::Local => Fallback::Local(local_bucket(b, live, now)),
                        OnDown::Allow => Fallback::Open,
                        OnDown::Deny => Fallback::Closed,
                    });
                }
                self.tokens = 0;
                self.owed = 0;
                self.not_before = Some(time::add(now, s.timeout.max(Duration::from_millis(10))));
            }
        }
    }

    /// Whether the store is taken as down for this tenant.
    #[cfg(test)]
    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }
}

/// A batch: `rate · lease` tokens, at least one, at most the burst.
pub(crate) fn batch_size(b: BucketConfig, lease: Duration) -> u32 {
    ((b.rate * lease.as_secs_f64()).round() as u32).clamp(1, b.burst.max(1))
}

/// A shared store's tenant buckets.
pub(crate) trait TenantStore: Send + Sync {
    /// The settings the store runs on.
    fn settings(&self) -> Settings;

    /// Takes up to `want` tokens of `tenant`'s bucket in `service`; the
    /// answer goes to `reply` as [`TenantGranted`](crate::actors::protocol::TenantGranted) (with `flow` as given).
    fn lease_tenant(
        &self,
        service: &str,
        tenant: Arc<str>,
        flow: u16,
        bucket: BucketConfig,
        want: u32,
        reply: Recipient<crate::actors::protocol::TenantGranted>,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SharedMode;

    fn settings(on_down: OnDown) -> Settings {
        Settings {
            mode: SharedMode::Lease,
            on_down,
            lease: Duration::from_millis(500),
            timeout: Duration::from_millis(50),
        }
    }

    #[test]
    fn a_batch_is_leased_credit_is_paid_and_bounded() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // 10/s, burst 8: batches of 5 (10 · 0.5 s).
        let b = BucketConfig::new(10.0, 8);
        let s = settings(OnDown::Local);
        let mut l = TenantLease::new(t0);
        // Nothing in hand: the first task goes on credit and a batch is
        // asked for; four more on credit while it is out, then refused.
        assert_eq!(
            l.check(b, &s, t0),
            Checked {
                admit: Ok(()),
                ask: Some(5)
            }
        );
        for _ in 0..4 {
            assert_eq!(
                l.check(b, &s, t0),
                Checked {
                    admit: Ok(()),
                    ask: None
                }
            );
        }
        assert_eq!(l.check(b, &s, t0).admit, Err(ms(100)));
        // The store gives 5: the 5 owed are paid, none left in hand, the
        // next due in 500 ms.
        l.answered(Some((5, ms(500))), b, &s, 1, t0, t0 + ms(1));
        assert_eq!(l.check(b, &s, t0 + ms(2)).admit, Err(ms(499)));
        // Due: on credit again, a new batch asked for.
        let c = l.check(b, &s, t0 + ms(501));
        assert_eq!(
            c,
            Checked {
                admit: Ok(()),
                ask: Some(5)
            }
        );
        // A short grant (2 of 5, another instance took the rest): 1 owed
        // paid, 1 in hand.
        l.answered(Some((2, ms(300))), b, &s, 1, t0 + ms(501), t0 + ms(502));
        assert_eq!(l.check(b, &s, t0 + ms(503)).admit, Ok(()));
        assert_eq!(l.check(b, &s, t0 + ms(503)).admit, Err(ms(299)));
        // A grant short of what is owed: the debt stays and bounds the
        // next credit.
        let c = l.check(b, &s, t0 + ms(802));
        assert_eq!(
            c,
            Checked {
                admit: Ok(()),
                ask: Some(5)
            }
        );
        for _ in 0..4 {
            assert_eq!(l.check(b, &s, t0 + ms(802)).admit, Ok(()));
        }
        l.answered(Some((2, ms(300))), b, &s, 1, t0 + ms(802), t0 + ms(803));
        assert_eq!((l.owed, l.tokens), (3, 0));
        let c = l.check(b, &s, t0 + ms(1103));
        assert_eq!(
            c,
            Checked {
                admit: Ok(()),
                ask: Some(5)
            }
        );
        assert_eq!(l.check(b, &s, t0 + ms(1103)).admit, Ok(()));
        assert_eq!(l.check(b, &s, t0 + ms(1103)).admit, Err(ms(100)), "5 owed");
        // Tokens in hand go unasked, until the lease ends.
        l.answered(Some((8, ms(0))), b, &s, 1, t0 + ms(1103), t0 + ms(1104));
        assert_eq!((l.owed, l.tokens), (0, 3));
        for _ in 0..3 {
            assert_eq!(
                l.check(b, &s, t0 + ms(1200)),
                Checked {
                    admit: Ok(()),
                    ask: None
                }
            );
        }
        let c = l.check(b, &s, t0 + ms(1200));
        assert_eq!(
            c,
            Checked {
                admit: Ok(()),
                ask: Some(5)
            }
        );
    }

    #[test]
    fn while_the_store_is_down_on_down_applies() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let b = BucketConfig::new(10.0, 8);
        let s = settings(OnDown::Local);
        let mut l = TenantLease::new(t0);
        assert_eq!(l.check(b, &s, t0).ask, Some(5));
        // No answer; two instances live: 5/s, bursts of 4.
        l.answered(None, b, &s, 2, t0, t0 + ms(50));
        assert!(l.is_down());
        let now = t0 + ms(50);
        for _ in 0..4 {
            assert_eq!(l.check(b, &s, now).admit, Ok(()));
        }
        assert_eq!(l.check(b, &s, now).admit, Err(ms(200)));
        // Asked again once per timeout; the answer brings it back.
        let c = l.check(b, &s, t0 + ms(100));
        assert_eq!(c.ask, Some(5));
        l.answered(Some((5, ms(0))), b, &s, 2, t0 + ms(100), t0 + ms(101));
        assert!(!l.is_down());
        assert_eq!((l.owed, l.tokens), (0, 5));
        // `deny` refuses until the next try; `allow` lets all through.
        let mut l = TenantLease::new(t0);
        let deny = settings(OnDown::Deny);
        l.check(b, &deny, t0);
        l.answered(None, b, &deny, 1, t0, t0);
        assert_eq!(l.check(b, &deny, t0 + ms(20)).admit, Err(ms(30)));
        let mut l = TenantLease::new(t0);
        let allow = settings(OnDown::Allow);
        l.check(b, &allow, t0);
        l.answered(None, b, &allow, 1, t0, t0);
        for _ in 0..100 {
            assert_eq!(l.check(b, &allow, t0).admit, Ok(()));
        }
    }

    #[test]
    fn a_batch_is_rate_times_lease_within_one_and_the_burst() {
        let ms = Duration::from_millis;
        assert_eq!(batch_size(BucketConfig::new(10.0, 8), ms(500)), 5);
        assert_eq!(batch_size(BucketConfig::new(100.0, 8), ms(500)), 8);
        assert_eq!(batch_size(BucketConfig::new(0.1, 8), ms(500)), 1);
    }
}
