//! The tenants a queue tracks: a bounded book from tenant keys to the flow
//! numbers of [`crate::algo::fair`], with each tracked tenant's weight and
//! counts. Keys come from callers, so a hostile one may send a new key with
//! every task; memory stays bounded whatever they send:
//!
//! * At most `max_tracked` tenants have a flow of their own; [`UNNAMED`]
//!   holds tasks that name none, and [`OVERFLOW`] every tenant beyond the
//!   bound (with the default weight).
//! * A tracked tenant with no task queued is **idle**. A new key takes a
//!   free flow, else the longest-idle tenant's (its counts start again),
//!   else the overflow flow: busy tenants keep their flows, and a flood of
//!   one-off keys lands in the overflow queue.
//! * At most `max_tracked + 2` entries, each a key of at most
//!   [`MAX_KEY_BYTES`] and a few counters. A key is hashed once per lookup
//!   (std's SipHash, keyed per process) and each tracked key's hash is
//!   kept, so a flow handed to a new key hashes nothing again (two keys of
//!   one 64-bit hash would put the second in the overflow flow).
//!
//! Tenant keys are never metric labels: the counts are read with `stats()`.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::tenants::{TenantBook, TenantsConfig, OVERFLOW, UNNAMED};
//!
//! let mut config = TenantsConfig::default();
//! config.max_tracked = 1;
//! config.weights.insert("gold".into(), 4);
//! let mut book = TenantBook::new(&config);
//! assert_eq!(book.flow_of(None).0, UNNAMED);
//! let (gold, weight) = book.flow_of(Some("gold"));
//! assert_eq!(weight, Some(4)); // a new flow, with its weight
//! book.hold(gold); // "gold" has a task: it keeps its flow
//! assert_eq!(book.flow_of(Some("other")).0, OVERFLOW);
//! book.release(gold); // idle now: a new key may take its flow
//! assert_eq!(book.flow_of(Some("other")), (gold, Some(1)));
//! # }
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

use tokio::time::{Duration, Instant};

use crate::algo::fair::{Flow, MAX_WEIGHT};
use crate::algo::limiter::TokenBucket;

/// The flow of tasks that name no tenant.
pub const UNNAMED: Flow = 0;
/// The flow every tenant beyond `max_tracked` shares.
pub const OVERFLOW: Flow = 1;
/// The first flow of a tracked tenant.
const FIRST: Flow = 2;
/// Longest tenant key, in bytes.
pub const MAX_KEY_BYTES: usize = 128;
/// Most tenants `max_tracked` may ask for (the flows are `u16`).
pub const MAX_TRACKED: usize = (Flow::MAX - FIRST) as usize;

/// Checks a tenant key: 1 to [`MAX_KEY_BYTES`] bytes, each a printable
/// ASCII character other than space. The error says what is wrong.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("tenant key is empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "tenant key is {} bytes, over the limit of {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "tenant key must be printable ASCII without spaces or control characters".into(),
        );
    }
    Ok(())
}

/// A service's `tenants` section: weights and the bound on tracked tenants.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TenantsConfig {
    /// Weight per tenant key (1 to 1000); a tenant with weight 2 gets twice
    /// the dispatches of one with weight 1 while both have tasks waiting.
    pub weights: HashMap<String, u32>,
    /// Weight of every other tenant, of the overflow flow and of the tasks
    /// naming none.
    pub default_weight: u32,
    /// Most tenants tracked at once (the rest share one overflow flow).
    pub max_tracked: usize,
    /// A rate per tracked tenant (`rate`): each tracked tenant has a
    /// bucket of its own; a task over it is refused `RateLimited` at
    /// submit. `None`: no rate per tenant.
    pub rate: Option<TenantRate>,
    /// The rate per tenant is kept in the shared store (Redis, feature
    /// `redis`), one bucket per tenant for every instance, leased in
    /// batches (default false: a local bucket per instance).
    pub shared: bool,
}

/// A tenant's rate: `rate` tasks per second, bursts of `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct TenantRate {
    /// Tasks per second (> 0).
    pub rate: f64,
    /// Most tasks at once after a quiet spell (>= 1).
    pub burst: u32,
}

impl TenantRate {
    /// `rate` tasks per second, bursts of `burst`, as given (checked by
    /// [`TenantsConfig::validate`]).
    pub fn new(rate: f64, burst: u32) -> Self {
        TenantRate { rate, burst }
    }
}

impl Default for TenantsConfig {
    /// No weights, `default_weight: 1` (equal shares), `max_tracked: 1024`:
    /// beyond the distinct callers a service usually has (API keys,
    /// customers) and small (a tracked tenant costs about 200 bytes, its
    /// flows' lists aside).
    fn default() -> Self {
        TenantsConfig {
            weights: HashMap::new(),
            default_weight: 1,
            max_tracked: 1024,
            rate: None,
            shared: false,
        }
    }
}

impl TenantsConfig {
    /// Checks the section; the error names the field (`weights.<key>`,
    /// `default_weight`, `max_tracked`, `rate.rate`, `rate.burst`).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if let Some(r) = self.rate {
            // At least one token per day: a slower rate is a typo.
            if !(r.rate.is_finite() && r.rate >= 1.0 / 86_400.0) {
                return Err((
                    "rate.rate".into(),
                    format!("must be at least one per day (1.2e-5), got {}", r.rate),
                ));
            }
            if r.burst == 0 {
                return Err(("rate.burst".into(), "must be at least 1".into()));
            }
        } else if self.shared {
            return Err((
                "shared".into(),
                "shares the rate per tenant: set tenants.rate".into(),
            ));
        }
        let weight = |field: String, w: u32| match w {
            1..=MAX_WEIGHT => Ok(()),
            _ => Err((field, format!("must be in 1..={MAX_WEIGHT}, got {w}"))),
        };
        weight("default_weight".into(), self.default_weight)?;
        if !(1..=MAX_TRACKED).contains(&self.max_tracked) {
            return Err((
                "max_tracked".into(),
                format!("must be in 1..={MAX_TRACKED}, got {}", self.max_tracked),
            ));
        }
        if self.weights.len() > self.max_tracked {
            return Err((
                "weights".into(),
                format!(
                    "names {} tenants, more than max_tracked ({})",
                    self.weights.len(),
                    self.max_tracked
                ),
            ));
        }
        let mut keys: Vec<_> = self.weights.iter().collect();
        keys.sort();
        for (k, &w) in keys {
            let field = format!("weights.{}", k.chars().take(64).collect::<String>());
            check_key(k).map_err(|m| (field.clone(), m))?;
            weight(field, w)?;
        }
        Ok(())
    }
}

/// What is counted for one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantCounts {
    /// Tasks that reached the queue.
    pub offered: u64,
    /// Tasks sent to a backend (first sends).
    pub served: u64,
    /// Tasks shed `Overloaded` (refused at intake, shed while waiting,
    /// displaced).
    pub shed: u64,
    /// Tasks refused `RateLimited` at submit: over the tenant's rate.
    pub rate_limited: u64,
}

/// A tracked tenant's key with its SipHash.
struct Keyed {
    hash: u64,
    key: Arc<str>,
}

/// The map's hasher: the key's SipHash as it is.
#[derive(Default)]
struct Passed(u64);

impl Hasher for Passed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); anything else is
        // still mixed in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

struct TenantEntry {
    key: Option<Keyed>,
    weight: u32,
    /// Tasks of this tenant the queue holds.
    held: u32,
    /// Whether the slot is in the idle list.
    in_idle: bool,
    counts: TenantCounts,
}

/// The tracked tenants. See the [module documentation](self).
pub struct TenantBook {
    slots: Vec<TenantEntry>,
    /// Tracked keys by their SipHash (the slot holds the key itself).
    by_key: HashMap<u64, Flow, BuildHasherDefault<Passed>>,
    /// The keyed SipHash of the keys.
    sip: RandomState,
    /// Tracked tenants that held no task when listed, the longest idle
    /// first (checked again when taken).
    idle: VecDeque<Flow>,
    weights: HashMap<String, u32>,
    default_weight: u32,
    max_tracked: usize,
    /// The last key looked up by [`flow_of_shared`](Self::flow_of_shared)
    /// and its flow: a task's key is looked up at intake and again when it
    /// enters, the same `Arc` both times, so the second costs no hash.
    last: Option<(Arc<str>, Flow)>,
}

impl TenantBook {
    /// An empty book.
    ///
    /// # Panics
    ///
    /// If `config` fails [`TenantsConfig::validate`].
    pub fn new(config: &TenantsConfig) -> Self {
        if let Err((f, m)) = config.validate() {
            panic!("invalid TenantsConfig: {f}: {m}");
        }
        let fixed = |_| TenantEntry {
            key: None,
            weight: config.default_weight,
            held: 0,
            in_idle: false,
            counts: TenantCounts::default(),
        };
        TenantBook {
            slots: (0..FIRST).map(fixed).collect(),
            by_key: HashMap::default(),
            sip: RandomState::new(),
            idle: VecDeque::new(),
            weights: config.weights.clone(),
            default_weight: config.default_weight,
            max_tracked: config.max_tracked,
            last: None,
        }
    }

    /// Tenants tracked now (the unnamed and overflow flows aside).
    #[cfg(any(test, feature = "internals"))]
    pub fn tracked(&self) -> usize {
        self.by_key.len()
    }

    /// The flow of tasks of tenant `key` (none: [`UNNAMED`]), and, when
    /// the flow was just given to this tenant, its weight (the caller's
    /// fair lists must take it).
    #[cfg(any(test, feature = "internals"))]
    pub fn flow_of(&mut self, key: Option<&str>) -> (Flow, Option<u32>) {
        match key {
            None => (UNNAMED, None),
            Some(key) => self.resolve(key, || Arc::from(key)),
        }
    }

    /// As [`flow_of`](Self::flow_of) for a key held in an `Arc` (a task's):
    /// the same `Arc` as the last lookup's is answered without hashing, and
    /// a new tenant's key is shared, not copied.
    pub fn flow_of_shared(&mut self, key: &Arc<str>) -> (Flow, Option<u32>) {
        if let Some((last, f)) = &self.last {
            if Arc::ptr_eq(last, key) {
                return (*f, None);
            }
        }
        let found = self.resolve(key, || key.clone());
        self.last = Some((key.clone(), found.0));
        found
    }

    fn resolve(&mut self, key: &str, shared: impl FnOnce() -> Arc<str>) -> (Flow, Option<u32>) {
        let hash = self.sip.hash_one(key);
        if let Some(&f) = self.by_key.get(&hash) {
            let slot = &self.slots[usize::from(f)];
            return match slot.key.as_ref().is_some_and(|k| *k.key == *key) {
                true => (f, None),
                // Two keys with one 64-bit keyed hash (a chance of about
                // n² / 2⁶⁵, not one a caller can aim for): the new one
                // shares the overflow flow.
                false => (OVERFLOW, None),
            };
        }
        let weight = self
            .weights
            .get(key)
            .copied()
            .unwrap_or(self.default_weight);
        // A flow may change hands below: the remembered lookup may be stale.
        self.last = None;
        let f = if self.by_key.len() < self.max_tracked {
            let f = self.slots.len() as Flow;
            self.slots.push(TenantEntry {
                key: None,
                weight,
                held: 0,
                in_idle: false,
                counts: TenantCounts::default(),
            });
            f
        } else {
            match self.take_idle() {
                Some(f) => f,
                None => return (OVERFLOW, None),
            }
        };
        let slot = &mut self.slots[usize::from(f)];
        let key = Keyed {
            hash,
            key: shared(),
        };
        if let Some(old) = slot.key.replace(key) {
            self.by_key.remove(&old.hash);
        }
        slot.weight = weight;
        slot.counts = TenantCounts::default();
        self.by_key.insert(hash, f);
        // Idle until it holds a task: a key that only ever sends refused
        // tasks gives its flow back first.
        self.list_idle(f);
        (f, Some(weight))
    }

    /// The longest-idle tracked tenant's flow that still holds no task.
    fn take_idle(&mut self) -> Option<Flow> {
        while let Some(f) = self.idle.pop_front() {
            let slot = &mut self.slots[usize::from(f)];
            slot.in_idle = false;
            if slot.held == 0 {
                return Some(f);
            }
        }
        None
    }

    fn list_idle(&mut self, f: Flow) {
        let slot = &mut self.slots[usize::from(f)];
        if f >= FIRST && !slot.in_idle {
            slot.in_idle = true;
            self.idle.push_back(f);
        }
    }

    /// Flow `f`'s weight.
    #[cfg(any(test, feature = "internals"))]
    pub fn weight(&self, f: Flow) -> u32 {
        self.slots.get(usize::from(f)).map_or(1, |s| s.weight)
    }

    /// A task of flow `f` entered the queue. (Only a tracked tenant's
    /// tasks are counted: the fixed flows are never handed over.)
    pub fn hold(&mut self, f: Flow) {
        if f < FIRST {
            return;
        }
        if let Some(s) = self.slots.get_mut(usize::from(f)) {
            s.held += 1;
        }
    }

    /// A task of flow `f` left the queue; a tenant left with none is idle.
    pub fn release(&mut self, f: Flow) {
        if f < FIRST {
            return;
        }
        let Some(s) = self.slots.get_mut(usize::from(f)) else {
            return;
        };
        s.held = s.held.saturating_sub(1);
        if s.held == 0 {
            self.list_idle(f);
        }
    }

    /// Every task left at once (the queue was cleared).
    pub fn release_all(&mut self) {
        for f in 0..self.slots.len() {
            if self.slots[f].held > 0 {
                self.slots[f].held = 0;
                self.list_idle(f as Flow);
            }
        }
    }

    /// Flow `f`'s counts, to bump; none for the tasks naming no tenant
    /// (they are not counted per tenant).
    pub fn counts_mut(&mut self, f: Flow) -> Option<&mut TenantCounts> {
        if f == UNNAMED {
            return None;
        }
        self.slots.get_mut(usize::from(f)).map(|s| &mut s.counts)
    }

    /// The counts of each tracked tenant (its key), then the overflow
    /// flow's (no key), when anything was counted there.
    pub fn counts(&self) -> impl Iterator<Item = (Option<&str>, TenantCounts)> + '_ {
        let overflow = &self.slots[usize::from(OVERFLOW)];
        let tracked = self.slots[usize::from(FIRST)..]
            .iter()
            .filter_map(|s| s.key.as_ref().map(|k| (Some(&*k.key), s.counts)));
        tracked
            .chain((overflow.counts != TenantCounts::default()).then_some((None, overflow.counts)))
    }
}

/// What each tracked tenant holds beside the book: a limit of type `L` (a
/// token bucket, a lease of shared tokens) kept on the tenant's flow with
/// the key it was made for, so a flow handed to another tenant starts
/// afresh. At most one per flow: `max_tracked` of them.
pub struct PerTenant<L> {
    slots: Vec<Option<(Arc<str>, L)>>,
}

impl<L> Default for PerTenant<L> {
    fn default() -> Self {
        PerTenant { slots: Vec::new() }
    }
}

impl<L> PerTenant<L> {
    /// The limit of tenant `key` on flow `f`, made by `make` when the flow
    /// holds none for that key; `None` for the tasks naming no tenant and
    /// for the overflow flow (untracked tenants hold nothing).
    pub fn get(&mut self, f: Flow, key: &Arc<str>, make: impl FnOnce() -> L) -> Option<&mut L> {
        if f < FIRST {
            return None;
        }
        let i = usize::from(f);
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let slot = &mut self.slots[i];
        let same = slot
            .as_ref()
            .is_some_and(|(k, _)| Arc::ptr_eq(k, key) || **k == **key);
        if !same {
            *slot = Some((key.clone(), make()));
        }
        slot.as_mut().map(|(_, l)| l)
    }

    /// The limit held for `key` on flow `f`, if any.
    pub fn find(&mut self, f: Flow, key: &str) -> Option<&mut L> {
        match self.slots.get_mut(usize::from(f)) {
            Some(Some((k, l))) if **k == *key => Some(l),
            _ => None,
        }
    }
}

/// A local token bucket per tracked tenant (`tenants.rate`), each full
/// when its tenant is first seen on its flow.
pub struct TenantBuckets {
    rate: TenantRate,
    buckets: PerTenant<TokenBucket>,
}

impl TenantBuckets {
    /// Buckets of `rate` for every tracked tenant.
    pub fn new(rate: TenantRate) -> Self {
        TenantBuckets {
            rate,
            buckets: PerTenant::default(),
        }
    }

    /// Takes a token of tenant `key`'s bucket (its flow `f`) at `now`:
    /// `Ok`, or `Err(retry_after)` when the tenant is over its rate. The
    /// tasks of untracked tenants (the overflow flow) are not limited.
    pub fn take(&mut self, f: Flow, key: &Arc<str>, now: Instant) -> Result<(), Duration> {
        let r = self.rate;
        match self
            .buckets
            .get(f, key, || TokenBucket::new(r.rate, r.burst, now))
        {
            Some(b) => b
                .try_acquire(now)
                .map_err(|at| at.saturating_duration_since(now)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max: usize) -> TenantsConfig {
        TenantsConfig {
            max_tracked: max,
            ..Default::default()
        }
    }

    #[test]
    fn keys_are_bounded_and_printable() {
        assert!(check_key("acme-42").is_ok());
        assert!(check_key(&"k".repeat(128)).is_ok());
        assert!(check_key(&"k".repeat(129))
            .unwrap_err()
            .contains("over the limit"));
        assert!(check_key("").unwrap_err().contains("empty"));
        for bad in ["a b", "a\nb", "é", "a\0"] {
            assert!(check_key(bad).unwrap_err().contains("printable"), "{bad:?}");
        }
    }

    #[test]
    fn the_config_is_checked_by_field() {
        let mut c = TenantsConfig::default();
        assert_eq!(c.validate(), Ok(()));
        c.default_weight = 0;
        assert_eq!(c.validate().unwrap_err().0, "default_weight");
        c.default_weight = 1;
        c.max_tracked = 0;
        assert_eq!(c.validate().unwrap_err().0, "max_tracked");
        c.max_tracked = MAX_TRACKED + 1;
        assert_eq!(c.validate().unwrap_err().0, "max_tracked");
        c.max_tracked = 2;
        c.weights.insert("a".into(), 1001);
        assert_eq!(c.validate().unwrap_err().0, "weights.a");
        c.weights.insert("a".into(), 2);
        c.weights.insert("b c".into(), 2);
        assert_eq!(c.validate().unwrap_err().0, "weights.b c");
        c.weights.remove("b c");
        c.weights.insert("b".into(), 2);
        c.weights.insert("c".into(), 2);
        assert_eq!(c.validate().unwrap_err().0, "weights");
    }

    #[test]
    fn a_flood_of_keys_stays_within_the_bound() {
        let mut book = TenantBook::new(&config(16));
        let mut flows = std::collections::HashSet::new();
        for i in 0..100_000 {
            let (f, _) = book.flow_of(Some(&format!("k{i}")));
            // Every key holds a task for good: no flow is ever freed.
            if f != OVERFLOW {
                book.hold(f);
            }
            flows.insert(f);
            assert!(book.tracked() <= 16);
        }
        assert_eq!(book.tracked(), 16);
        assert_eq!(flows.len(), 17, "16 tenants and the overflow");
        assert!(book.slots.len() <= 16 + 2 && book.idle.len() <= 16);
        // The first 16 keys kept their flows.
        assert_eq!(book.flow_of(Some("k3")), (5, None));
    }

    #[test]
    fn idle_tenants_give_their_flows_to_new_keys_longest_idle_first() {
        let mut book = TenantBook::new(&config(2));
        let (a, _) = book.flow_of(Some("a"));
        let (b, _) = book.flow_of(Some("b"));
        book.hold(a);
        book.hold(b);
        assert_eq!(book.flow_of(Some("c")), (OVERFLOW, None));
        book.release(b);
        book.release(a);
        // b went idle first.
        assert_eq!(book.flow_of(Some("c")), (b, Some(1)));
        assert_eq!(book.flow_of(Some("b")), (a, Some(1)));
        assert_eq!(book.tracked(), 2);
        book.hold(a);
        book.hold(b);
        assert_eq!(book.flow_of(Some("a")), (OVERFLOW, None));
    }

    #[test]
    fn a_shared_key_is_looked_up_once_and_never_stale() {
        let mut book = TenantBook::new(&config(1));
        let a: Arc<str> = Arc::from("a");
        let (fa, w) = book.flow_of_shared(&a);
        assert_eq!(w, Some(1));
        // The same Arc again: remembered.
        assert_eq!(book.flow_of_shared(&a), (fa, None));
        // "a" idle, a new key takes its flow: the remembered "a" is gone.
        let b: Arc<str> = Arc::from("b");
        assert_eq!(book.flow_of_shared(&b), (fa, Some(1)));
        book.hold(fa);
        assert_eq!(book.flow_of_shared(&a), (OVERFLOW, None));
        assert_eq!(book.flow_of_shared(&b), (fa, None));
        // An equal key in another Arc finds the same flow by hash.
        assert_eq!(book.flow_of_shared(&Arc::from("b")), (fa, None));
        assert!(
            Arc::ptr_eq(&book.slots[usize::from(fa)].key.as_ref().unwrap().key, &b),
            "shared, not copied"
        );
    }

    #[test]
    fn a_key_whose_hash_is_taken_shares_the_overflow_flow() {
        let mut book = TenantBook::new(&config(4));
        let (a, _) = book.flow_of(Some("a"));
        // As if "b" hashed as "a" does.
        let hash = book.sip.hash_one("b");
        book.by_key.insert(hash, a);
        assert_eq!(book.flow_of(Some("b")), (OVERFLOW, None));
        assert_eq!(book.flow_of(Some("a")), (a, None));
    }

    #[test]
    fn weights_and_counts_follow_the_key() {
        let mut c = config(4);
        c.weights.insert("gold".into(), 3);
        c.default_weight = 2;
        let mut book = TenantBook::new(&c);
        let (g, w) = book.flow_of(Some("gold"));
        assert_eq!((w, book.weight(g)), (Some(3), 3));
        assert_eq!(book.flow_of(Some("x")).1, Some(2));
        assert_eq!(book.weight(UNNAMED), 2);
        book.counts_mut(g).unwrap().offered += 5;
        book.counts_mut(OVERFLOW).unwrap().shed += 1;
        let all: Vec<_> = book.counts().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].0, Some("gold"));
        assert_eq!(all[0].1.offered, 5);
        assert_eq!(
            all[2],
            (
                None,
                TenantCounts {
                    shed: 1,
                    ..Default::default()
                }
            )
        );
    }

    #[test]
    fn each_tracked_tenant_has_its_own_bucket() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut book = TenantBook::new(&config(2));
        let mut rates = TenantBuckets::new(TenantRate {
            rate: 10.0,
            burst: 2,
        });
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let (fa, _) = book.flow_of_shared(&a);
        let (fb, _) = book.flow_of_shared(&b);
        // Two at once, then one each 100 ms, exactly.
        assert_eq!(rates.take(fa, &a, t0), Ok(()));
        assert_eq!(rates.take(fa, &a, t0), Ok(()));
        assert_eq!(rates.take(fa, &a, t0), Err(ms(100)));
        assert_eq!(rates.take(fa, &a, t0 + ms(40)), Err(ms(60)));
        assert_eq!(rates.take(fa, &a, t0 + ms(100)), Ok(()));
        assert_eq!(rates.take(fa, &a, t0 + ms(100)), Err(ms(100)));
        // Another tenant: a bucket of its own, full.
        assert_eq!(rates.take(fb, &b, t0 + ms(100)), Ok(()));
        assert_eq!(rates.take(fb, &b, t0 + ms(100)), Ok(()));
        assert_eq!(rates.take(fb, &b, t0 + ms(100)), Err(ms(100)));
        // No tenant, or untracked (the overflow flow): not limited.
        for _ in 0..10 {
            assert_eq!(rates.take(UNNAMED, &a, t0), Ok(()));
            assert_eq!(rates.take(OVERFLOW, &a, t0), Ok(()));
        }
        // "a" idle, its flow handed to "c": "c" starts with a full bucket.
        let c: Arc<str> = Arc::from("c");
        assert_eq!(book.flow_of_shared(&c), (fa, Some(1)));
        assert_eq!(rates.take(fa, &c, t0 + ms(100)), Ok(()));
        assert_eq!(rates.take(fa, &c, t0 + ms(100)), Ok(()));
        assert_eq!(rates.take(fa, &c, t0 + ms(100)), Err(ms(100)));
        assert_eq!(rates.buckets.slots.len(), usize::from(fb) + 1);
    }

    #[test]
    fn a_rate_is_checked_by_field() {
        let mut c = TenantsConfig {
            rate: Some(TenantRate {
                rate: 0.0,
                burst: 1,
            }),
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "rate.rate");
        c.rate = Some(TenantRate {
            rate: f64::NAN,
            burst: 1,
        });
        assert_eq!(c.validate().unwrap_err().0, "rate.rate");
        c.rate = Some(TenantRate {
            rate: 5.0,
            burst: 0,
        });
        assert_eq!(c.validate().unwrap_err().0, "rate.burst");
        c.rate = Some(TenantRate {
            rate: 5.0,
            burst: 10,
        });
        assert_eq!(c.validate(), Ok(()));
    }
}
