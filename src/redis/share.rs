//! One service's side of the shared state, as its balancer keeps it.
//!
//! The balancer asks (tokens, breaker states, probe claims) and never
//! waits; this type keeps what it knows between the answers: leased
//! tokens and until when they may be used, the routes held for an exact
//! admission, whether Redis is down and the local fallback bucket then,
//! and which probes this instance holds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Granted, SharedLimits};
use crate::actors::messages::Route;
use crate::algo::limiter::TokenBucket;
use crate::config::{BucketConfig, OnDown, ServiceConfig, SharedMode};

/// What to do with a route, given the shared bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A token is in hand: place it.
    Go,
    /// Wait for this turn's script call (exact mode).
    Hold,
    /// No token: back to the queue.
    Bounce,
}

/// A service's shared bucket and breakers, from its balancer's side.
pub(crate) struct ServiceShare {
    /// Set by the dispatcher right after the balancer starts; no token is
    /// handed out before.
    pub handle: Option<SharedLimits>,
    /// The shared service bucket (`rate_limit.shared`).
    pub bucket: Option<BucketConfig>,
    /// Breakers shared (`breaker.shared`), with their quorum.
    pub breakers: Option<u32>,
    /// Tokens in hand (lease mode) or paid for held routes (exact mode).
    tokens: u32,
    valid_until: Instant,
    asking: bool,
    /// No token before this (the script said when the next one is due).
    retry_at: Option<Instant>,
    down: bool,
    /// `on_down: local`: the bucket at `rate / live`, while down.
    local: Option<TokenBucket>,
    /// Routes waiting for this turn's exact admission.
    pub held: Vec<Route>,
    /// A call for tokens is set for the end of this turn.
    pub flush_armed: bool,
    /// Nodes whose probe claim this instance holds, or asked for.
    pub probing: HashSet<Arc<str>>,
    pub claiming: HashSet<Arc<str>>,
    /// Trips of each node's local breaker already reported.
    pub trips: HashMap<Arc<str>, u64>,
}

impl ServiceShare {
    /// The share of a service with shared limits or breakers, else `None`.
    pub fn new(cfg: &ServiceConfig) -> Option<ServiceShare> {
        let bucket = cfg.rate_limit.service.filter(|_| cfg.rate_limit.shared);
        let breakers = cfg
            .breaker
            .shared
            .then_some(cfg.breaker.quorum)
            .filter(|_| cfg.breaker.enabled);
        if bucket.is_none() && breakers.is_none() {
            return None;
        }
        let now = Instant::now();
        Some(ServiceShare {
            handle: None,
            bucket,
            breakers,
            tokens: 0,
            valid_until: now,
            asking: false,
            retry_at: None,
            down: false,
            local: None,
            held: Vec::new(),
            flush_armed: false,
            probing: HashSet::new(),
            claiming: HashSet::new(),
            trips: HashMap::new(),
        })
    }

    fn mode(&self) -> Option<(SharedMode, OnDown)> {
        self.handle
            .as_ref()
            .map(|h| (h.config().mode, h.config().on_down))
    }

    /// Whether Redis is taken as down for this service.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// `on_down: deny` while down: the service rejects.
    pub fn denies(&self) -> bool {
        self.down && self.mode().is_some_and(|(_, d)| d == OnDown::Deny)
    }

    /// How many tasks the shared bucket lets through now (a cap on credit).
    pub fn room(&self, now: Instant) -> usize {
        if self.bucket.is_none() {
            return usize::MAX;
        }
        let Some((mode, on_down)) = self.mode() else {
            return 0;
        };
        if self.down {
            return match on_down {
                OnDown::Local => self.local.as_ref().map_or(0, |b| b.available(now) as usize),
                OnDown::Allow => usize::MAX,
                OnDown::Deny => 0,
            };
        }
        match mode {
            SharedMode::Lease if self.valid_until > now => self.tokens as usize,
            SharedMode::Lease => 0,
            SharedMode::Exact if self.retry_at.is_some_and(|t| t > now) => 0,
            SharedMode::Exact => usize::MAX,
        }
    }

    /// Decides for one route at `now` (takes the token when it says `Go`).
    pub fn admit(&mut self, now: Instant) -> Admit {
        if self.bucket.is_none() {
            return Admit::Go;
        }
        let Some((mode, on_down)) = self.mode() else {
            return Admit::Bounce;
        };
        if self.down {
            return match on_down {
                OnDown::Local => match self.local.as_mut().map(|b| b.try_acquire(now)) {
                    Some(Ok(())) => Admit::Go,
                    _ => Admit::Bounce,
                },
                OnDown::Allow => Admit::Go,
                OnDown::Deny => Admit::Bounce,
            };
        }
        let valid = mode == SharedMode::Exact || self.valid_until > now;
        if self.tokens > 0 && valid {
            self.tokens -= 1;
            return Admit::Go;
        }
        match mode {
            SharedMode::Exact => Admit::Hold,
            SharedMode::Lease => Admit::Bounce,
        }
    }

    /// How many tokens to ask for now, if any (and marks the call out).
    pub fn ask(&mut self, now: Instant) -> Option<u32> {
        let b = self.bucket?;
        let (mode, _) = self.mode()?;
        if self.asking || self.retry_at.is_some_and(|t| t > now) {
            return None;
        }
        let want = match mode {
            // A lease: `rate · lease` tokens (at least one), asked for when
            // the last one is used or the lease is over.
            SharedMode::Lease if self.tokens == 0 || self.valid_until <= now || self.down => {
                let lease = self.handle.as_ref()?.config().lease;
                ((b.rate * lease.as_secs_f64()).round() as u32).clamp(1, b.burst.max(1))
            }
            SharedMode::Exact if !self.held.is_empty() => self.held.len() as u32,
            // While down, keep asking once per timeout to see it come back.
            SharedMode::Exact if self.down => 1,
            _ => return None,
        };
        self.asking = true;
        Some(want)
    }

    /// Takes an answer; returns how many held routes were paid for.
    pub fn granted(&mut self, g: Granted, now: Instant) -> u32 {
        self.asking = false;
        let Some((mode, _)) = self.mode() else {
            return 0;
        };
        let Some(h) = self.handle.as_ref() else {
            return 0;
        };
        let (lease, timeout, live) = (h.config().lease, h.config().timeout, h.live());
        match g.taken {
            Some(t) => {
                self.down = false;
                self.local = None;
                self.retry_at = (!t.retry_in.is_zero()).then(|| now + t.retry_in);
                match mode {
                    SharedMode::Lease => {
                        // Counted from when the call was sent: the tokens
                        // were taken after that, so they are never used
                        // more than `lease` after Redis gave them.
                        self.tokens = t.granted;
                        self.valid_until = g.asked + lease;
                        0
                    }
                    SharedMode::Exact => {
                        self.tokens = t.granted;
                        t.granted
                    }
                }
            }
            None => {
                if !self.down {
                    self.down = true;
                    self.tokens = 0;
                    if let Some(b) = self.bucket {
                        let rate = b.rate / live as f64;
                        let burst = (b.burst / live as u32).max(1);
                        self.local = Some(TokenBucket::new(rate, burst, now));
                    }
                }
                self.retry_at = Some(now + timeout.max(Duration::from_millis(10)));
                0
            }
        }
    }

    /// When time alone changes the room (a token due, a lease over, a
    /// retry of Redis).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let mut t = self.retry_at.filter(|t| *t > now);
        if self.tokens > 0 && self.valid_until > now {
            t = Some(t.map_or(self.valid_until, |x| x.min(self.valid_until)));
        }
        if let Some(Err(due)) = self.local.as_ref().map(|b| b.check(now)) {
            t = Some(t.map_or(due, |x| x.min(due)));
        }
        t
    }
}
