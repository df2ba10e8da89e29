//! One service's side of the shared state, as its balancer keeps it.
//!
//! The balancer asks (tokens, breaker states, probe claims) and never
//! waits; [`ServiceShare`] keeps what it knows between the answers: leased
//! tokens and until when they may be used, the routes held for an exact
//! admission, whether Redis is down and the local fallback bucket then,
//! and which probes this instance holds. A node's shared bucket is kept as
//! [`NodeTokens`] in the balancer's view of that node (`node_tokens.rs`),
//! where it caps the node's room: a node with no shared token is not
//! picked.
//!
//! Every answer says when the asked-for tokens are due again
//! ([`super::Grant::due`]); until then (plus a jitter of up to a quarter of
//! it, so that instances do not all ask at the same instant) the bucket is
//! not asked again. At saturation each instance thus asks once per batch
//! (half a burst) instead of once per token.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::node_tokens::{local_bucket, NodeTokens};
use super::Admit;
use super::{Granted, Store};
use crate::actors::protocol::{NodeId, Route, Seq};
use crate::algo::limiter::TokenBucket;
use crate::algo::time;
use crate::config::{BucketConfig, OnDown, ServiceConfig, SharedMode};

/// A service's shared bucket and breakers, from its balancer's side.
pub(crate) struct ServiceShare {
    /// Set by the dispatcher right after the balancer starts; no token is
    /// handed out before.
    pub handle: Option<Store>,
    /// The shared service bucket (`rate_limit.shared` with `service`).
    pub bucket: Option<BucketConfig>,
    /// The shared per-node buckets (`rate_limit.shared` with `per_node`):
    /// the service's token, if shared, is taken with the node's.
    pub node_bucket: Option<BucketConfig>,
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
    /// Routes waiting for their node's tokens (shared node buckets), each
    /// holding a slot of the node it was placed on.
    pub node_held: Vec<(Route, NodeId)>,
    /// A call for node tokens is out.
    pub node_asking: bool,
    /// Routes paid for on their node, replayed to it.
    pub pinned: HashMap<(Seq, bool), NodeId>,
    /// Spreads the instances' asks (a jitter on `due`).
    rng: SmallRng,
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
        let node_bucket = cfg.rate_limit.per_node.filter(|_| cfg.rate_limit.shared);
        let breakers = cfg
            .breaker
            .shared
            .then_some(cfg.breaker.quorum)
            .filter(|_| cfg.breaker.enabled);
        if bucket.is_none() && node_bucket.is_none() && breakers.is_none() {
            return None;
        }
        let now = Instant::now();
        Some(ServiceShare {
            handle: None,
            bucket,
            node_bucket,
            breakers,
            tokens: 0,
            valid_until: now,
            asking: false,
            retry_at: None,
            down: false,
            local: None,
            held: Vec::new(),
            node_held: Vec::new(),
            node_asking: false,
            pinned: HashMap::new(),
            rng: SmallRng::seed_from_u64(rand::random()),
            flush_armed: false,
            probing: HashSet::new(),
            claiming: HashSet::new(),
            trips: HashMap::new(),
        })
    }

    fn mode(&self) -> Option<(SharedMode, OnDown)> {
        self.handle
            .as_ref()
            .map(|h| (h.settings().mode, h.settings().on_down))
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
        if self.bucket.is_none() && self.node_bucket.is_none() {
            return usize::MAX;
        }
        let Some((mode, on_down)) = self.mode() else {
            return 0;
        };
        // With shared node buckets the service's token comes with the
        // node's: the nodes' rooms cap the credit.
        if self.bucket.is_none() || (self.node_bucket.is_some() && !self.down) {
            return usize::MAX;
        }
        if self.down {
            return match on_down {
                OnDown::Local => self.local.as_ref().map_or(0, |b| b.available(now) as usize),
                OnDown::Allow => usize::MAX,
                OnDown::Deny => 0,
            };
        }
        // Tokens in hand; none before the next batch is due; else "ask":
        // routes come and wait for one call (so an idle instance takes no
        // tokens).
        if mode == SharedMode::Lease && self.tokens > 0 && self.valid_until > now {
            self.tokens as usize
        } else if self.retry_at.is_some_and(|t| t > now) {
            0
        } else {
            usize::MAX
        }
    }

    /// Until when the shared service bucket has no token for this
    /// instance at `now`: none in hand and the next ones not due before
    /// (or, Redis down under `on_down: local`, the fallback bucket's next
    /// token). `None` when a task could be placed or asked for now, and
    /// with shared node buckets up (their tokens say it, see
    /// [`NodeTokens::blocked_until`]).
    pub fn limited_until(&self, now: Instant) -> Option<Instant> {
        self.bucket?;
        if self.down {
            return self.local.as_ref().and_then(|b| b.check(now).err());
        }
        if self.node_bucket.is_some() {
            return None;
        }
        let (mode, _) = self.mode()?;
        let in_hand = self.tokens > 0 && (mode == SharedMode::Exact || self.valid_until > now);
        if in_hand {
            return None;
        }
        self.retry_at.filter(|t| *t > now)
    }

    /// Decides for one route at `now` (takes the token when it says `Go`).
    pub fn admit(&mut self, now: Instant) -> Admit {
        if self.bucket.is_none() && self.node_bucket.is_none() {
            return Admit::Go;
        }
        let Some((mode, on_down)) = self.mode() else {
            return Admit::Bounce;
        };
        if self.bucket.is_none() || (self.node_bucket.is_some() && !self.down) {
            return Admit::Go;
        }
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
            SharedMode::Lease if self.retry_at.is_some_and(|t| t > now) => Admit::Bounce,
            _ => Admit::Hold,
        }
    }

    /// How many tokens to ask for now, if any (and marks the call out).
    pub fn ask(&mut self, now: Instant) -> Option<u32> {
        let b = self.bucket.filter(|_| self.node_bucket.is_none())?;
        let (mode, _) = self.mode()?;
        if self.asking || self.retry_at.is_some_and(|t| t > now) {
            return None;
        }
        let lease = lease_size(b, self.handle.as_ref()?.settings().lease);
        let held = u32::try_from(self.held.len()).unwrap_or(u32::MAX);
        let want = match mode {
            // A lease: the routes waiting, and at least `rate · lease`
            // tokens (at least one, at most the burst), asked for only when
            // routes wait for it (an idle instance takes none).
            SharedMode::Lease if held > 0 => held.max(lease),
            SharedMode::Exact if held > 0 => held,
            // While down, keep asking once per timeout to see it come back.
            SharedMode::Lease if self.down => lease,
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
        let Some(lease) = self.handle.as_ref().map(|h| h.settings().lease) else {
            return 0;
        };
        match g.taken {
            Some(t) => {
                self.come_up();
                // Not asked again before the next batch is due.
                self.retry_at = self.due_at(t.due, now);
                match mode {
                    SharedMode::Lease => {
                        // Counted from when the call was sent: the tokens
                        // were taken after that, so they are never used
                        // more than `lease` after Redis gave them (the
                        // routes they pay for go at once in any case).
                        self.tokens = t.granted;
                        self.valid_until =
                            time::add(g.asked, lease).max(time::add(now, Duration::from_millis(1)));
                        t.granted
                            .min(u32::try_from(self.held.len()).unwrap_or(u32::MAX))
                    }
                    SharedMode::Exact => {
                        self.tokens = t.granted;
                        t.granted
                    }
                }
            }
            None => {
                self.go_down(now);
                0
            }
        }
    }

    /// `now + due` and a jitter of up to a quarter of `due` (instances that
    /// learnt the same `due` do not all ask at once); `None` for zero.
    pub fn due_at(&mut self, due: Duration, now: Instant) -> Option<Instant> {
        if due.is_zero() {
            return None;
        }
        let jitter = due.mul_f64(self.rng.random::<f64>() * 0.25);
        Some(time::add(now, time::sum(due, jitter)))
    }

    /// Redis answered: shared limits apply again. Returns whether it was
    /// taken as down.
    pub fn come_up(&mut self) -> bool {
        let was = self.down;
        self.down = false;
        self.local = None;
        if was {
            self.retry_at = None;
        }
        was
    }

    /// Redis did not answer: `on_down` applies; asked again after
    /// `timeout`. Returns whether it was up until now.
    pub fn go_down(&mut self, now: Instant) -> bool {
        let Some(h) = self.handle.as_ref() else {
            return false;
        };
        let (timeout, live) = (h.settings().timeout, h.live());
        let was_up = !self.down;
        if was_up {
            self.down = true;
            self.tokens = 0;
            if let Some(b) = self.bucket {
                self.local = Some(local_bucket(b, live, now));
            }
        }
        self.retry_at = Some(time::add(now, timeout.max(Duration::from_millis(10))));
        was_up
    }

    /// A node's tokens while Redis is down, under `on_down`.
    pub fn node_fallback(&self, now: Instant) -> NodeTokens {
        let (Some(b), Some(h)) = (self.node_bucket, self.handle.as_ref()) else {
            return NodeTokens::Off;
        };
        match h.settings().on_down {
            OnDown::Local => NodeTokens::Local(local_bucket(b, h.live(), now)),
            OnDown::Allow => NodeTokens::Open,
            OnDown::Deny => NodeTokens::Closed,
        }
    }

    /// Whether a call for node tokens may go now (none out; while down,
    /// once per `timeout`).
    pub fn may_ask_nodes(&self, now: Instant) -> bool {
        let waiting = self.down && self.retry_at.is_some_and(|t| t > now);
        !self.node_asking && !waiting
    }

    /// The tokens to ask for a node with `held` routes waiting: those, and
    /// in lease mode at least a lease (`rate · lease`, at most the burst).
    pub fn node_want(&self, held: u32) -> u32 {
        let (Some(b), Some(h)) = (self.node_bucket, self.handle.as_ref()) else {
            return held;
        };
        match h.settings().mode {
            SharedMode::Exact => held,
            SharedMode::Lease => held.max(lease_size(b, h.settings().lease)),
        }
    }

    /// Until when tokens handed to a node (the call sent at `asked`,
    /// answered at `now`) may be used: a lease in lease mode; otherwise,
    /// and at least, just long enough for the held routes they paid for
    /// to go back through the handler (at once).
    pub fn node_until(&self, asked: Instant, now: Instant) -> Instant {
        let replay = time::add(now, Duration::from_millis(1));
        match self
            .handle
            .as_ref()
            .map(|h| (h.settings().mode, h.settings().lease))
        {
            Some((SharedMode::Lease, lease)) => (asked + lease).max(replay),
            _ => replay,
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

/// A lease: `rate · lease` tokens, at least one, at most the burst.
fn lease_size(b: BucketConfig, lease: Duration) -> u32 {
    ((b.rate * lease.as_secs_f64()).round() as u32).clamp(1, b.burst.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::share::local::LocalStore;
    use crate::actors::share::{Grant, Settings};
    use crate::config::Config;

    /// A service sharing its bucket (rate 10/s, burst 5) with a store
    /// in `mode` (lease 100 ms, `on_down: local`).
    fn share(mode: SharedMode) -> ServiceShare {
        let mut cfg = Config::from_json(
            r#"{"services":[{"name":"svc","endpoints":[{"address":"http://h/"}],
                "rate_limit":{"service":{"rate":10,"burst":5}}}]}"#,
        )
        .unwrap()
        .services
        .remove(0);
        cfg.rate_limit.shared = true;
        let mut s = ServiceShare::new(&cfg).unwrap();
        s.handle = Some(LocalStore::new(Settings {
            mode,
            on_down: OnDown::Local,
            lease: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
        }));
        s
    }

    fn route(task: u64, at: Instant) -> Route {
        Route::first(task, at)
    }

    #[test]
    fn a_lease_is_asked_for_by_waiting_routes_and_used_until_it_ends() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = share(SharedMode::Lease);
        // Nothing in hand, nothing due: routes come and wait for one call.
        assert_eq!(s.room(t0), usize::MAX);
        assert_eq!(s.admit(t0), Admit::Hold);
        assert_eq!(
            s.ask(t0),
            None,
            "no route waits: an idle instance asks for none"
        );
        s.held.push(route(1, t0));
        s.held.push(route(2, t0));
        assert_eq!(s.ask(t0), Some(2), "the routes waiting (a lease is 1)");
        assert_eq!(s.ask(t0), None, "one call out at a time");
        let g = Granted {
            taken: Some(Grant {
                granted: 3,
                due: Duration::ZERO,
            }),
            asked: t0,
        };
        assert_eq!(s.granted(g, t0), 2, "both held routes paid for");
        // Three in hand for 100 ms.
        assert_eq!(s.room(t0), 3);
        assert_eq!(s.next_wake(t0), Some(t0 + ms(100)), "the lease's end");
        assert_eq!(s.limited_until(t0), None);
        assert_eq!(s.admit(t0), Admit::Go);
        assert_eq!(s.room(t0), 2);
        // The lease over: asked for again.
        assert_eq!(s.room(t0 + ms(100)), usize::MAX);
        assert_eq!(s.admit(t0 + ms(100)), Admit::Hold);
    }

    #[test]
    fn an_answer_with_nothing_left_holds_routes_back_until_it_is_due() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = share(SharedMode::Lease);
        s.held.push(route(1, t0));
        assert_eq!(s.ask(t0), Some(1));
        let g = Granted {
            taken: Some(Grant {
                granted: 0,
                due: ms(400),
            }),
            asked: t0,
        };
        assert_eq!(s.granted(g, t0), 0);
        // Due in 400 ms, plus a jitter of up to a quarter of it.
        let until = s.limited_until(t0).unwrap();
        assert!(until >= t0 + ms(400) && until <= t0 + ms(500), "{until:?}");
        assert_eq!(s.room(t0), 0);
        assert_eq!(s.admit(t0), Admit::Bounce);
        assert_eq!(s.next_wake(t0), Some(until));
        assert_eq!(s.room(until), usize::MAX);
    }

    #[test]
    fn while_the_store_is_down_a_local_bucket_applies() {
        let t0 = Instant::now();
        let mut s = share(SharedMode::Exact);
        assert!(s.go_down(t0), "it was up");
        assert!(s.is_down() && !s.denies());
        // `rate / live` and `burst / live` with one live instance.
        assert_eq!(s.room(t0), 5);
        for _ in 0..5 {
            assert_eq!(s.admit(t0), Admit::Go);
        }
        assert_eq!(s.admit(t0), Admit::Bounce);
        assert_eq!(
            s.limited_until(t0),
            Some(t0 + Duration::from_millis(100)),
            "the fallback's next token"
        );
        // Asked again once per timeout, to see it back.
        assert_eq!(s.ask(t0), None);
        assert_eq!(s.ask(t0 + Duration::from_millis(50)), Some(1));
        assert!(s.come_up(), "it was down");
        assert_eq!(
            s.room(t0),
            usize::MAX,
            "exact: every route waits for a call"
        );
    }
}
