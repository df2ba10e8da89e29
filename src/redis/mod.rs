//! Limits and breakers shared by several instances through Redis (feature `redis`).
//!
//! An application that embeds the engine often runs as several replicas.
//! Alone, each replica would enforce its own limits (a backend allowed
//! 20 requests/s would see 20·N from N replicas) and keep its own breakers
//! (a node one replica found dead would still get the others' traffic).
//! With a top-level `redis` section and a service's `rate_limit.shared` or
//! `breaker.shared`, the state that must agree lives in Redis and changes
//! only inside Lua scripts that read Redis `TIME`, so the instances' clocks
//! never matter:
//!
//! * **Token buckets** (`gcra.lua`): GCRA in integer microseconds, the same
//!   rule as the engine's own `TokenBucket`; keys are hash-tagged per
//!   service (`ad:{svc}:rl`, and each node's `ad:{svc}:rl:<address>`) so a
//!   Redis Cluster keeps a service's keys on one slot, and expire when the
//!   bucket is full again. One call serves several asks; each token of an
//!   ask is taken from all its buckets (a task's service and node buckets)
//!   or from none. Tokens are asked for only when tasks wait for them (an idle
//!   instance takes none), either with a short **lease** ahead (up to
//!   `rate · lease` more, usable for `lease`: the backends see at most
//!   `burst + rate · (T + lease)` over any window T, per bucket) or
//!   **exactly** (the routes of one balancer turn wait for one script call;
//!   at most `burst + rate · T`). Each answer says when the asked-for tokens
//!   are due again (half a burst at most); an instance does not ask before
//!   then (plus a jitter), so at saturation it asks once per batch.
//! * **Breakers** (`breaker.lua`): a trip is recorded as "open for d" (Redis
//!   `TIME` + d, the local breaker's doubling open time), shared once
//!   `quorum` instances reported it; the other instances read it at each
//!   `refresh_interval`. After it, exactly one instance probes (a
//!   `SET NX PX` claim expiring with the probe timeout); its success closes
//!   the node for all, its failure opens it again for twice as long.
//! * **Membership**: every instance heartbeats into a sorted set
//!   (`prefix:{members}`); the count of live ones is in `stats()` and
//!   divides the rate of the local fallback. A score in the future is set
//!   to now, so no foreign member counts for ever.
//! * **Tenant buckets** (`tenants.rs`): one rate per tenant across the
//!   instances, [`SharedLimits::take_tenant`], at
//!   `prefix:{svc}:tn:<tenant>:rl` (the tenant key checked and bounded
//!   first; the key expires when the bucket is full again).
//!
//! Every key starts with `prefix:` (an ACL user limited to `~prefix:*`
//! runs every call). Foreign content in a key is repaired and named in a
//! `warn` once a minute per key, and a `MOVED` answer on a connection
//! without `redis.cluster` is one configuration error (`repairs.rs`).
//!
//! [`SharedLimits`] is the engine's shared store: it implements the
//! balancer's two traits, `TokenStore` and `SharedBreaker` (the seam is
//! `actors/share`, where the balancer's bookkeeping of the answers lives).
//!
//! Nothing waits on Redis: calls run as tasks beside the actors, with
//! `timeout`, and their answers arrive as messages. While Redis does not
//! answer, `on_down` applies (`local`: the bucket at `rate / live`, local
//! breakers; `allow`; `deny`), logged once at `warn`, and at `info` when
//! Redis is back; the connection manager reconnects by itself.

mod conn;
mod gcra;
mod health;
mod repairs;
pub mod stream;
mod tenants;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use actix::prelude::*;
use redis::Script;
use tokio::time::Instant;

use crate::actors::share::{
    Grant, Granted, NodesGranted, ProbeClaimed, Settings, SharedBreaker, SharedBreakers,
    SharedState, TokenStore,
};
use crate::config::{BucketConfig, RedisConfig};
pub use crate::stats::SharedStats;
use conn::Conn;
pub use conn::{check, client, connect, Connection};
use health::{Change, Health, Kind};
use repairs::{parse_repairs, ClusterHint, Repair, RepairLog};

#[cfg(not(feature = "internals"))]
use gcra::Ask;
use gcra::{gcra_args, gcra_decode};
#[cfg(not(feature = "internals"))]
use wire::{members_key, BREAKER_LUA, GCRA_LUA, MAX_SHARED_OPEN};
// The scripts and their wire helpers, for the tests that drive the scripts
// directly: unstable, outside semver (feature `internals`).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use gcra::{gcra_params, take_many, take_tokens, Ask, Got, Taken};
pub use tenants::{tenant_key, TenantGrant};
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use wire::{members_key, BREAKER_LUA, GCRA_LUA, MAX_SHARED_OPEN};

/// The Lua sources and key names on the wire.
mod wire {
    use std::time::Duration;

    /// The GCRA script (see its header for keys and arguments).
    pub const GCRA_LUA: &str = include_str!("gcra.lua");
    /// The shared-breaker script.
    pub const BREAKER_LUA: &str = include_str!("breaker.lua");

    /// The longest a shared breaker's `open` key is believed (a foreign key
    /// with a longer expiry would keep a node shut for every instance).
    pub const MAX_SHARED_OPEN: Duration = Duration::from_secs(600);

    /// The membership key, `prefix:{members}`: under the prefix as every key
    /// is (an ACL user limited to `~prefix:*` reaches it), hash-tagged so the
    /// script's one key has a slot in a Redis Cluster.
    pub fn members_key(prefix: &str) -> String {
        format!("{prefix}:{{members}}")
    }
}

/// The most live instances believed from the membership count.
const MAX_LIVE: u64 = 100_000;

/// The heartbeat: KEYS[1] the membership set, ARGV[1] this instance,
/// ARGV[2] the window (ms). Scores are Redis `TIME` in ms. A score in the
/// future (a foreign write, or a master whose clock is behind the one it
/// replaced) would count as live for ever and divide every instance's
/// fallback rate: up to 1000 of them per call are set to now, so they
/// expire after one window, and only scores in `[now - window, now]` are
/// counted. Returns `{ live, repaired, clamped }`, `repaired` as the other
/// scripts name a replaced key (`{ 1, what }`).
const MEMBERS_LUA: &str = r#"
local repaired = {}
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'zset' then
  redis.call('DEL', KEYS[1])
  repaired = { 1, 'a ' .. kind }
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
local ahead = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, 1000)
for i = 1, #ahead do redis.call('ZADD', KEYS[1], now, ahead[i]) end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], window)
return { redis.call('ZCOUNT', KEYS[1], now - window, now), repaired, #ahead }
"#;

struct Inner {
    cfg: RedisConfig,
    instance: String,
    conn: Conn,
    gcra: Script,
    breaker: Script,
    live: AtomicU64,
    health: Mutex<Health>,
    round_trips: AtomicU64,
    failures: AtomicU64,
    tenant_calls: AtomicU64,
    /// Keys whose repair was logged, and when (once a minute per key).
    repairs: Mutex<RepairLog>,
    /// Told when a standalone connection met a Cluster (`MOVED`).
    cluster_hint: ClusterHint,
}

/// One instance's Redis connection and its calls. Cheap to clone.
#[derive(Clone)]
pub struct SharedLimits {
    inner: Arc<Inner>,
}

impl SharedLimits {
    /// Opens the (lazy) connection for `cfg` and starts the heartbeat on
    /// the current arbiter. Fails only on a malformed URL (the message
    /// redacted): a Redis that does not answer, or refuses the password,
    /// leaves `on_down` in force, with `expected_instances` as the live
    /// count until a heartbeat is answered. Call [`check`] first to refuse
    /// to start instead.
    pub fn start(cfg: &RedisConfig) -> redis::RedisResult<SharedLimits> {
        let conn = Conn::open(cfg)?;
        let instance = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
        let s = SharedLimits {
            inner: Arc::new(Inner {
                cfg: cfg.clone(),
                instance,
                conn,
                gcra: Script::new(GCRA_LUA),
                breaker: Script::new(BREAKER_LUA),
                live: AtomicU64::new(cfg.expected_instances.clamp(1, MAX_LIVE)),
                health: Mutex::new(Health::default()),
                round_trips: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                tenant_calls: AtomicU64::new(0),
                repairs: Mutex::new(RepairLog::default()),
                cluster_hint: ClusterHint::default(),
            }),
        };
        actix::spawn(heartbeat(Arc::downgrade(&s.inner)));
        Ok(s)
    }

    /// The config it runs on.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.cfg
    }

    /// Live instances, as last read (at least 1; `expected_instances`
    /// before the first heartbeat answered).
    pub fn live(&self) -> u64 {
        self.inner.live.load(Ordering::Relaxed).max(1)
    }

    /// The stats snapshot.
    pub fn stats(&self) -> SharedStats {
        let i = &self.inner;
        let health = i.health.lock().expect("lock");
        SharedStats {
            live_instances: self.live(),
            down: health.any_down(),
            down_scopes: health.scopes(),
            round_trips: i.round_trips.load(Ordering::Relaxed),
            failures: i.failures.load(Ordering::Relaxed),
            tenant_calls: i.tenant_calls.load(Ordering::Relaxed),
        }
    }

    /// The hash-tagged key `prefix:{service}:rest`.
    fn key(&self, service: &str, rest: &str) -> String {
        format!("{}:{{{service}}}:{rest}", self.inner.cfg.prefix)
    }

    /// The key of `node`'s shared bucket: `prefix:{service}:rl:<address>`,
    /// on the service's slot.
    fn node_key(&self, service: &str, node: &str) -> String {
        self.key(service, &format!("rl:{node}"))
    }

    fn breaker_keys(&self, service: &str, node: &str) -> [String; 4] {
        ["open", "tripped", "probe", "reports"]
            .map(|k| self.key(service, &format!("br:{node}:{k}")))
    }

    /// Logs the keys a script replaced (`keys` are the call's), at most
    /// once a minute per key.
    fn log_repairs(&self, scope: &str, keys: &[&str], repaired: &[Repair]) {
        if repaired.is_empty() {
            return;
        }
        let mut log = self.inner.repairs.lock().expect("lock");
        log.warn(scope, keys, repaired, Instant::now());
    }

    /// Runs `breaker.lua` with `args` after the operation; fire and forget,
    /// or the integer answer to `then` (a repair the script made is logged
    /// here, naming the key).
    fn breaker_op(
        &self,
        service: &str,
        node: &str,
        op: &'static str,
        args: Vec<u64>,
        then: impl FnOnce(Option<i64>) + 'static,
    ) {
        let s = self.clone();
        let keys = self.breaker_keys(service, node);
        let (svc, n) = (service.to_owned(), node.to_owned());
        actix::spawn(async move {
            let mut con = s.inner.conn.clone();
            let mut inv = s.inner.breaker.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(op).arg(&s.inner.instance);
            for a in args {
                inv.arg(a);
            }
            let r = s
                .call(Kind::Breakers, &svc, async move {
                    let v: Vec<redis::Value> = inv.invoke_async(&mut con).await?;
                    Ok(v)
                })
                .await;
            then(r.map(|v| {
                let (v, repaired) = breaker_answer(&v);
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let scope = format!("service {svc}: node {n}: shared breaker");
                s.log_repairs(&scope, &keys, &repaired);
                v
            }));
        });
    }

    /// Runs one call of `kind` for `service` with the timeout; counts it,
    /// tracks its scope up or down (see `health.rs`) and logs the change,
    /// the URL and the error redacted.
    async fn call<T>(
        &self,
        kind: Kind,
        service: &str,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        let i = &self.inner;
        i.round_trips.fetch_add(1, Ordering::Relaxed);
        let r = match tokio::time::timeout(i.cfg.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                i.cluster_hint.check(&i.cfg.redacted_url(), &e);
                Err(i.cfg.scrub(&e.to_string()))
            }
            Err(_) => Err(format!("no answer within {:?}", i.cfg.timeout)),
        };
        if r.is_err() {
            i.failures.fetch_add(1, Ordering::Relaxed);
        }
        let change = i
            .health
            .lock()
            .expect("lock")
            .record(kind, service, r.is_ok());
        let scope = match service {
            "" => kind.to_string(),
            s => format!("{kind} of service {s}"),
        };
        let url = i.cfg.redacted_url();
        match (&r, change) {
            (Ok(_), Change::CameBack) => {
                log::info!("redis {url}: {scope} answer again; shared state back");
            }
            (Err(e), Change::WentDown) => {
                log::warn!(
                    "redis {url}: {scope}: {e}; on_down {:?} applies until they answer",
                    i.cfg.on_down
                );
            }
            _ => {}
        }
        r.ok()
    }
}

/// Redis's token buckets: `gcra.lua`, one call per ask batch.
impl TokenStore for SharedLimits {
    fn settings(&self) -> Settings {
        let c = self.config();
        Settings {
            mode: c.mode,
            on_down: c.on_down,
            lease: c.lease,
            timeout: c.timeout,
        }
    }

    fn live(&self) -> u64 {
        SharedLimits::live(self)
    }

    /// Takes up to `want` tokens of `service`'s shared bucket; the answer
    /// goes to `reply` as [`Granted`].
    fn take(&self, service: &str, bucket: BucketConfig, want: u32, reply: Recipient<Granted>) {
        let s = self.clone();
        let svc = service.to_owned();
        let keys = vec![(self.key(service, "rl"), bucket)];
        let asked = Instant::now();
        actix::spawn(async move {
            let mut con = s.inner.conn.clone();
            let asks = [Ask {
                buckets: vec![0],
                want: want.max(1),
            }];
            let mut inv = s.inner.gcra.prepare_invoke();
            gcra_args(&mut inv, &keys, &asks, None);
            let r = s
                .call(Kind::Tokens, &svc, async move {
                    let v: Vec<redis::Value> = inv.invoke_async(&mut con).await?;
                    Ok(v)
                })
                .await;
            let taken = r.map(|v| {
                let (got, _, repaired) = gcra_decode(&v, &asks);
                s.log_bucket_repairs(&svc, &keys, &repaired);
                Grant {
                    granted: got[0].granted,
                    due: got[0].due,
                }
            });
            reply.do_send(Granted { taken, asked });
        });
    }

    /// Takes tokens for several nodes in one call: for each `(node, want)`,
    /// up to `want` tokens each from the node's bucket and, when `service`
    /// is set, the service's bucket together. The answer goes to `reply`
    /// as [`NodesGranted`]. An ask of 0 only reads the clock (a ping while
    /// Redis is taken as down).
    fn take_nodes(
        &self,
        service: &str,
        service_bucket: Option<BucketConfig>,
        node_bucket: BucketConfig,
        asks: Vec<(Arc<str>, u32)>,
        reply: Recipient<NodesGranted>,
    ) {
        let s = self.clone();
        let svc = service.to_owned();
        let mut keys = Vec::with_capacity(asks.len() + 1);
        if let Some(b) = service_bucket {
            keys.push((self.key(service, "rl"), b));
        }
        let first = keys.len();
        let calls: Vec<Ask> = asks
            .iter()
            .enumerate()
            .map(|(k, (node, want))| {
                keys.push((self.node_key(service, node), node_bucket));
                let mut buckets: Vec<usize> = (0..first).collect();
                buckets.push(first + k);
                Ask {
                    buckets,
                    want: *want,
                }
            })
            .collect();
        let asked = Instant::now();
        actix::spawn(async move {
            let mut con = s.inner.conn.clone();
            let mut inv = s.inner.gcra.prepare_invoke();
            gcra_args(&mut inv, &keys, &calls, None);
            let r = s
                .call(Kind::Tokens, &svc, async move {
                    let v: Vec<redis::Value> = inv.invoke_async(&mut con).await?;
                    Ok(v)
                })
                .await;
            let got = r.map(|v| {
                let (got, _, repaired) = gcra_decode(&v, &calls);
                s.log_bucket_repairs(&svc, &keys, &repaired);
                got.iter()
                    .map(|g| Grant {
                        granted: g.granted,
                        due: g.due,
                    })
                    .collect()
            });
            reply.do_send(NodesGranted { asks, got, asked });
        });
    }
}

/// Redis's shared breakers: `breaker.lua`.
impl SharedBreaker for SharedLimits {
    /// This instance's breaker of `node` tripped, open for `open_for`.
    fn trip(&self, service: &str, node: &str, open_for: Duration, quorum: u32) {
        let window = self.inner.cfg.heartbeat.max(open_for) * 3;
        let (svc, n) = (service.to_string(), node.to_string());
        let args = vec![millis(open_for), u64::from(quorum.max(1)), millis(window)];
        self.breaker_op(service, node, "trip", args, move |r| {
            if let Some(ms) = r.filter(|ms| *ms > 0) {
                log::info!("service {svc}: node {n}: shared breaker open for {ms} ms");
            }
        });
    }

    /// The probe this instance sent to `node` failed: open again, longer.
    fn reopen(&self, service: &str, node: &str, open_for: Duration, max: Duration) {
        let args = vec![millis(open_for), millis(max)];
        self.breaker_op(service, node, "reopen", args, |_| {});
    }

    /// A probe to `node` succeeded: closed for every instance.
    fn close(&self, service: &str, node: &str) {
        let (svc, n) = (service.to_string(), node.to_string());
        self.breaker_op(service, node, "close", vec![], move |r| {
            if r.is_some() {
                log::info!("service {svc}: node {n}: shared breaker closed");
            }
        });
    }

    /// Asks for the half-open probe claim of `node` for `ttl`.
    fn claim(&self, service: &str, node: Arc<str>, ttl: Duration, reply: Recipient<ProbeClaimed>) {
        let n = node.clone();
        self.breaker_op(service, &n, "claim", vec![millis(ttl)], move |r| {
            reply.do_send(ProbeClaimed {
                node,
                won: r == Some(1),
            });
        });
    }

    /// Reads the shared breakers of `nodes`; the answer goes to `reply`
    /// (nothing when Redis does not answer: the views keep their state).
    fn poll(&self, service: &str, nodes: Vec<Arc<str>>, reply: Recipient<SharedBreakers>) {
        let s = self.clone();
        let svc = service.to_owned();
        let mut pipe = redis::pipe();
        for n in &nodes {
            let [open, tripped, _, _] = self.breaker_keys(service, n);
            pipe.cmd("PTTL").arg(open).cmd("EXISTS").arg(tripped);
        }
        actix::spawn(async move {
            let mut con = s.inner.conn.clone();
            let r = s
                .call(Kind::Breakers, &svc, async move {
                    let v: Vec<i64> = pipe.query_async(&mut con).await?;
                    Ok(v)
                })
                .await;
            let Some(v) = r else { return };
            let states = nodes
                .into_iter()
                .zip(v.chunks(2))
                .map(|(n, c)| {
                    let state = match (c[0], c.get(1).copied().unwrap_or(0)) {
                        (pttl, _) if pttl > 0 => SharedState::Open(
                            Duration::from_millis(pttl as u64).min(MAX_SHARED_OPEN),
                        ),
                        (_, 1) => SharedState::HalfOpen,
                        _ => SharedState::Closed,
                    };
                    (n, state)
                })
                .collect();
            reply.do_send(SharedBreakers(states));
        });
    }
}

impl SharedLimits {
    /// Logs the bucket keys `gcra.lua` replaced for `service` (by a full
    /// bucket).
    fn log_bucket_repairs(&self, service: &str, keys: &[(String, BucketConfig)], r: &[Repair]) {
        if r.is_empty() {
            return;
        }
        let keys: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let scope = format!("service {service}: shared bucket held foreign content");
        self.log_repairs(&scope, &keys, r);
    }
}

/// Decodes `breaker.lua`'s answer `{ answer, repaired }`.
fn breaker_answer(v: &[redis::Value]) -> (i64, Vec<Repair>) {
    let answer = match v.first() {
        Some(redis::Value::Int(i)) => *i,
        _ => 0,
    };
    (answer, parse_repairs(v.get(1)))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Heartbeats until the handle is dropped (one call per period).
async fn heartbeat(inner: Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else { return };
        let s = SharedLimits { inner: i };
        let period = s.inner.cfg.heartbeat;
        let key = members_key(&s.inner.cfg.prefix);
        let mut con = s.inner.conn.clone();
        let script = Script::new(MEMBERS_LUA);
        let mut inv = script.prepare_invoke();
        inv.key(&key).arg(&s.inner.instance).arg(millis(period * 3));
        let r = s
            .call(Kind::Members, "", async move {
                let v: Vec<redis::Value> = inv.invoke_async(&mut con).await?;
                Ok(v)
            })
            .await;
        if let Some(v) = r {
            let (n, repaired, ahead) = members_answer(&v);
            s.log_repairs("heartbeat", &[key.as_str()], &repaired);
            if ahead > 0 {
                let what = format!("{ahead} member(s) scored in the future (set to now)");
                let r = [Repair {
                    index: 0,
                    found: what,
                }];
                s.log_repairs("heartbeat", &[key.as_str()], &r);
            }
            s.inner.live.store(n.clamp(1, MAX_LIVE), Ordering::Relaxed);
        }
        drop(s);
        tokio::time::sleep(period).await;
    }
}

/// Decodes the heartbeat's `{ live, repaired, clamped }`.
fn members_answer(v: &[redis::Value]) -> (u64, Vec<Repair>, u64) {
    let int = |i: usize| match v.get(i) {
        Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    (int(0), parse_repairs(v.get(1)), int(2))
}
