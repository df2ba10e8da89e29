//! The balancer's view of one node: what it knows, what it can place there.
//!
//! The view is kept exact for what the balancer itself changes (in-flight
//! count, the node's token bucket, which is the view's alone (see
//! [`super::share`]), probes handed out) and
//! refreshed from the node's [`LoadReport`] for the rest. From it comes the
//! node's *room*: how many more tasks it can take right now (slots, probes,
//! tokens). A node is eligible exactly when its room is positive, and the
//! service's capacity is the sum of the rooms, so credit handed to the queue
//! never exceeds what the nodes can take. Time only ever adds room (tokens
//! refill, open breakers expire), so a stale room errs on the safe side and
//! the balancer's timer catches up.
//!
//! Reports carry the node's version (a counter it bumps on every report), and
//! the view only ever moves forward: a `GetLoad` reply that was overtaken by
//! a later node report is dropped rather than rolling the breaker and tokens
//! back. The sums over all views (capacity, counts) and the candidates the
//! strategy sees are kept by [`super::nodeset::NodeSet`].

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use tokio::time::Instant;

use super::node::NodeActor;
use super::protocol::{LoadReport, NodeId};
use super::share::NodeTokens;
use crate::algo::breaker::BreakerState;
use crate::algo::headroom::DispatchTimes;
use crate::algo::limiter::TokenBucket;
use crate::algo::strategy::{Candidate, LeastLoad};
use crate::config::{EndpointConfig, ServiceConfig};
use crate::metrics::EndpointCounts;
use crate::stats::{BreakerStatus, LatencyHistogram, NodeStats};

/// The balancer's mirror of a node's breaker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Mirror {
    Closed,
    Open { until: Instant },
    HalfOpen { probes: Probes },
}

/// The probes a half-open node may still be sent: set when it half-opens,
/// one handed out per dispatch, never given back (the node's breaker
/// decides on their answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probes(u32);

impl Probes {
    pub fn new(n: u32) -> Probes {
        Probes(n)
    }

    /// Probes left.
    pub fn left(self) -> u32 {
        self.0
    }

    /// Hands one out, if one is left (a route paid for on its node goes
    /// there even with none left: it takes none).
    pub fn take(&mut self) -> bool {
        match self.0 {
            0 => false,
            n => {
                self.0 = n - 1;
                true
            }
        }
    }
}

impl Mirror {
    pub fn from_state(s: BreakerState, probes: u32) -> Mirror {
        match s {
            BreakerState::Closed => Mirror::Closed,
            BreakerState::Open { until } => Mirror::Open { until },
            BreakerState::HalfOpen => Mirror::HalfOpen {
                probes: Probes::new(probes),
            },
        }
    }

    pub fn same_kind(&self, other: &Mirror) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// The shared breaker's word on a node (always `Closed` unless the
/// service shares its breakers). A node's state is the more severe of this
/// and [`Mirror`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) enum SharedMirror {
    #[default]
    Closed,
    /// Another instance (or a quorum) tripped it.
    Open { until: Instant },
    /// Half-open for the cluster: only the instance holding the probe
    /// claim may send (one task).
    HalfOpen { claimed: bool },
}

/// Health as seen by active checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    Unknown,
    Healthy,
    Unhealthy,
}

pub(crate) struct NodeView {
    pub id: NodeId,
    pub address: Arc<str>,
    pub addr: Addr<NodeActor>,
    pub weight: u32,
    pub max_concurrent: u32,
    /// Configured or set at runtime.
    pub active: bool,
    /// Being removed: takes no new task, leaves once idle.
    pub draining: bool,
    pub health: Health,
    pub health_streak: (u32, u32),
    pub in_flight: u32,
    pub load: LoadReport,
    pub mirror: Mirror,
    /// Breaker open but used anyway (max_ejected_percent).
    pub overridden: bool,
    /// The node's bucket (`rate_limit.per_node`): this view is its one
    /// owner; the balancer takes a token when it places a dispatch.
    pub bucket: Option<TokenBucket>,
    /// Start of the slow-start ramp.
    pub ramp_from: Option<Instant>,
    /// The shared breaker (`Closed` unless shared).
    pub shared: SharedMirror,
    /// The node's shared bucket (`Off` unless shared): caps its room.
    pub shared_tokens: NodeTokens,
    /// Dispatches placed this turn, sent together when it ends.
    pub outbox: Vec<super::protocol::Dispatch>,
    /// When its attempts in flight were sent, for the wait a request sent
    /// now would have (`algo::headroom`).
    pub sent: DispatchTimes,
}

/// A node's contribution to the balancer's counts, kept so that deciding
/// the service's gate is O(1) per event whatever the pool size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    pub in_service: bool,
    pub open: bool,
    pub token_blocked: bool,
}

/// Sums of [`Flags`] over the pool.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub in_service: usize,
    pub open: usize,
    pub token_blocked: usize,
}

impl Counts {
    pub fn swap(&mut self, old: Flags, new: Flags) {
        self.remove(old);
        self.in_service += new.in_service as usize;
        self.open += new.open as usize;
        self.token_blocked += new.token_blocked as usize;
    }

    pub fn remove(&mut self, old: Flags) {
        self.in_service -= old.in_service as usize;
        self.open -= old.open as usize;
        self.token_blocked -= old.token_blocked as usize;
    }
}

impl NodeView {
    pub fn new(
        id: NodeId,
        ep: &EndpointConfig,
        addr: Addr<NodeActor>,
        load: LoadReport,
        bucket: Option<TokenBucket>,
    ) -> Self {
        NodeView {
            id,
            address: ep.address.as_str().into(),
            addr,
            weight: ep.weight,
            max_concurrent: ep.max_concurrent,
            active: ep.active,
            draining: false,
            health: Health::Unknown,
            health_streak: (0, 0),
            in_flight: 0,
            mirror: Mirror::Closed,
            load,
            overridden: false,
            bucket,
            ramp_from: None,
            shared: SharedMirror::Closed,
            shared_tokens: NodeTokens::Off,
            outbox: Vec::new(),
            sent: DispatchTimes::default(),
        }
    }

    /// Whether the node takes traffic at all (configuration and health).
    pub fn in_service(&self) -> bool {
        self.active && !self.draining && self.health != Health::Unhealthy
    }

    /// An open breaker (time not yet up) that is not overridden.
    pub fn is_open(&self, now: Instant) -> bool {
        let shared = matches!(self.shared, SharedMirror::Open { until } if until > now);
        (shared || matches!(self.mirror, Mirror::Open { until } if until > now)) && !self.overridden
    }

    /// Turns an expired Open into HalfOpen with `probes` probes.
    pub fn expire(&mut self, now: Instant, probes: u32) {
        if let Mirror::Open { until } = self.mirror {
            if until <= now {
                self.mirror = Mirror::HalfOpen {
                    probes: Probes::new(probes),
                };
            }
        }
    }

    /// Room (see [`NodeView::compute_room`]), the part of it under the
    /// node's free limit (see [`NodeView::free_limit`]) and flags (see
    /// [`NodeView::flags`]) at `now`, reading the slots and tokens once.
    pub fn room_and_flags(&self, now: Instant) -> (usize, usize, Flags) {
        let slots = self.slots(now);
        let tokens = match &self.bucket {
            Some(b) if slots > 0 => Some(b.available(now) as usize),
            _ => None,
        };
        let capped = self.shared_tokens.cap(slots, now);
        // `capped > 0` means `slots > 0`: the tokens were read.
        let room = match tokens {
            Some(t) if capped > 0 => capped.min(t),
            _ => capped,
        };
        let in_service = self.in_service();
        let flags = Flags {
            in_service,
            open: in_service && self.is_open(now),
            token_blocked: tokens == Some(0),
        };
        let below = room.min(self.free_limit().saturating_sub(self.in_flight) as usize);
        (room, below, flags)
    }

    /// Of [`NodeView::limit`], what the backend serves without queueing,
    /// as the node last reported it: the rest is headroom.
    pub fn free_limit(&self) -> u32 {
        self.load.free_limit.clamp(1, self.limit())
    }

    /// What a request takes on this node with nothing queued: the learned
    /// base latency, else the latency EWMA; `None` before any answer.
    pub fn service_time(&self) -> Option<Duration> {
        let t = if self.load.base_rtt.is_zero() {
            Duration::try_from_secs_f64(self.load.latency_ewma).unwrap_or(Duration::ZERO)
        } else {
            self.load.base_rtt
        };
        (!t.is_zero()).then_some(t)
    }

    /// What an attempt sent now is expected to take here: the mean of its
    /// recent answers (the latency EWMA, which holds the wait inside the
    /// backend at the load it runs at); `None` while the node is idle (no
    /// wait inside: the service's own figure applies) or before an answer.
    pub fn expected_latency(&self) -> Option<Duration> {
        if self.in_flight == 0 {
            return None;
        }
        Duration::try_from_secs_f64(self.load.latency_ewma)
            .ok()
            .filter(|t| !t.is_zero())
    }

    /// Attempts the node may have in flight: `max_concurrent`, or the
    /// learned limit under it as the node last reported it.
    pub fn limit(&self) -> u32 {
        self.load.limit.clamp(1, self.max_concurrent.max(1))
    }

    /// Free request slots, ignoring tokens.
    pub fn slots(&self, now: Instant) -> usize {
        if !self.in_service() {
            return 0;
        }
        let mut free = self.limit().saturating_sub(self.in_flight) as usize;
        // The more severe of the shared breaker and the local one.
        match self.shared {
            // Also once `until` is over: half-open for the cluster, closed
            // to traffic until the next read gives this instance the probe.
            SharedMirror::Open { .. } if !self.overridden => return 0,
            SharedMirror::HalfOpen { claimed: false } if !self.overridden => return 0,
            SharedMirror::HalfOpen { claimed: true } => free = free.min(1),
            _ => {}
        }
        match self.mirror {
            Mirror::Closed => free,
            Mirror::HalfOpen { probes } => free.min(probes.left() as usize),
            Mirror::Open { until } if until > now && !self.overridden => 0,
            Mirror::Open { .. } => free,
        }
    }

    /// Slots limited by the node's tokens: the plain definition, which the
    /// node set's invariant test holds [`NodeView::room_and_flags`] to.
    #[cfg(test)]
    pub fn compute_room(&self, now: Instant) -> usize {
        let slots = self.slots(now);
        let slots = self.shared_tokens.cap(slots, now);
        match &self.bucket {
            Some(b) if slots > 0 => slots.min(b.available(now) as usize),
            _ => slots,
        }
    }

    /// Whether it has slots but no token.
    pub fn token_blocked(&self, now: Instant) -> bool {
        self.slots(now) > 0 && self.bucket.as_ref().is_some_and(|b| b.available(now) == 0)
    }

    /// What this node adds to the pool's [`Counts`] at `now` (the plain
    /// definition, as [`NodeView::compute_room`]).
    #[cfg(test)]
    pub fn flags(&self, now: Instant) -> Flags {
        let in_service = self.in_service();
        Flags {
            in_service,
            open: in_service && self.is_open(now),
            token_blocked: self.token_blocked(now),
        }
    }

    /// Takes the node's report into the view, unless a newer one is already
    /// in (reports can arrive out of order: a `GetLoad` reply overtaken by a
    /// node report). Returns whether the breaker changed kind.
    pub fn apply_load(
        &mut self,
        load: LoadReport,
        probes: u32,
        slow_start: bool,
        now: Instant,
    ) -> bool {
        if load.version <= self.load.version {
            return false;
        }
        let mirror = Mirror::from_state(load.breaker, probes);
        let changed = !self.mirror.same_kind(&mirror);
        if changed {
            if slow_start && mirror == Mirror::Closed {
                self.ramp_from = Some(now);
            }
            self.mirror = match (self.mirror, mirror) {
                // Probes already handed out stay counted.
                (Mirror::HalfOpen { probes }, Mirror::HalfOpen { .. }) => {
                    Mirror::HalfOpen { probes }
                }
                (_, m) => m,
            };
        } else if let Mirror::Open { .. } = mirror {
            self.mirror = mirror;
        }
        self.load = load;
        changed
    }

    /// Weight after slow start.
    pub fn effective_weight(&self, now: Instant, ramp: Option<(Duration, f64)>) -> u32 {
        ramp_weight(self.weight, self.ramp_from, now, ramp)
    }

    pub fn candidate(
        &self,
        eligible: bool,
        weight: u32,
        now: Instant,
        decay: Duration,
    ) -> Candidate {
        // Latency and error figures of a node that gets no answers decay
        // toward zero with the idle time, so that one bad spell does not
        // starve it for good: it is tried again, and its answers count.
        let idle = now.saturating_duration_since(self.load.rtt_at);
        // One factor for the three figures (1 while the node is busy).
        let factor = crate::algo::ewma::decay_idle(1.0, idle, decay);
        let fade = |x: f64| x * factor;
        Candidate {
            eligible,
            weight,
            in_flight: self.in_flight,
            max_concurrent: self.limit(),
            latency_ewma: fade(self.load.latency_ewma),
            error_rate: fade(self.load.error_rate),
            rtt_estimate: fade(self.load.rtt),
        }
    }
}

/// Slow start (Envoy's): the weight grows linearly from `floor` of itself to
/// all of it over the ramp's length, from `from`; at least 1.
pub(crate) fn ramp_weight(
    weight: u32,
    from: Option<Instant>,
    now: Instant,
    ramp: Option<(Duration, f64)>,
) -> u32 {
    let (Some(from), Some((len, floor))) = (from, ramp) else {
        return weight;
    };
    let t = now.saturating_duration_since(from).as_secs_f64() / len.as_secs_f64();
    if t >= 1.0 {
        return weight;
    }
    let share = floor + (1.0 - floor) * t;
    ((weight as f64 * share).round() as u32).max(1)
}

/// Counts `nodes` by state for `dispatch_endpoints`, each in one state:
/// inactive (or draining) first, then unhealthy, then breaker open, else
/// healthy.
pub(crate) fn endpoint_counts<'a>(
    nodes: impl Iterator<Item = &'a NodeView>,
    now: Instant,
) -> EndpointCounts {
    let mut c = EndpointCounts::default();
    for n in nodes {
        if !n.active || n.draining {
            c.inactive += 1;
        } else if n.health == Health::Unhealthy {
            c.unhealthy += 1;
        } else if matches!(n.mirror, Mirror::Open { until } if until > now) {
            c.open += 1;
        } else {
            c.healthy += 1;
        }
    }
    c
}

impl NodeView {
    /// What `stats()` shows of this node.
    pub(crate) fn stats(
        &self,
        c: &Candidate,
        cfg: &ServiceConfig,
        latencies: Option<&LatencyHistogram>,
        now: Instant,
    ) -> NodeStats {
        let n = self;
        let score = LeastLoad::new(cfg.balancer.least_load).score(c);
        let [p50, p90, p99] = latencies.map_or([0.0; 3], |h| h.quantiles_ms([0.5, 0.9, 0.99]));
        NodeStats {
            address: n.address.to_string(),
            weight: n.weight,
            effective_weight: c.weight,
            active: n.active,
            health: match n.health {
                Health::Unknown => "unknown",
                Health::Healthy => "healthy",
                Health::Unhealthy => "unhealthy",
            },
            draining: n.draining,
            in_flight: n.in_flight,
            max_concurrent: n.max_concurrent,
            concurrency_limit: n.limit(),
            free_limit: n.free_limit(),
            total: n.load.total,
            errors: n.load.errors,
            error_rate: n.load.error_rate,
            ewma_latency_ms: n.load.latency_ewma * 1e3,
            last_latency_ms: n.load.last_latency.as_secs_f64() * 1e3,
            rtt_ms: n.load.rtt * 1e3,
            score,
            breaker: match n.mirror {
                Mirror::Closed => BreakerStatus::Closed,
                Mirror::Open { until } if until > now => BreakerStatus::Open,
                _ => BreakerStatus::HalfOpen,
            },
            open_for_ms: match n.mirror {
                Mirror::Open { until } if until > now => {
                    Some(until.saturating_duration_since(now).as_millis() as u64)
                }
                _ => None,
            },
            trips: n.load.trips,
            tokens: n
                .shared_tokens
                .shown(now)
                .or_else(|| n.bucket.as_ref().map(|b| b.available(now))),
            restarts: n.load.restarts,
            latency_p50_ms: p50,
            latency_p90_ms: p90,
            latency_p99_ms: p99,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A report of `version` with breaker state `breaker`.
    pub(crate) fn report(version: u64, breaker: BreakerState, now: Instant) -> LoadReport {
        LoadReport {
            version,
            in_flight: 0,
            total: version,
            errors: 0,
            latency_ewma: 0.0,
            last_latency: Duration::ZERO,
            error_rate: 0.0,
            rtt: 0.03,
            rtt_at: now,
            breaker,
            trips: 0,
            restarts: 0,
            last_error: None,
            // No learned limit: `max_concurrent` (the view clamps to it).
            limit: u32::MAX,
            free_limit: u32::MAX,
            base_rtt: Duration::ZERO,
        }
    }

    /// A view of a node whose actor never runs (its address is only a handle).
    pub(crate) fn view(id: u32, weight: u32, max_concurrent: u32, now: Instant) -> NodeView {
        let ep = EndpointConfig {
            weight,
            max_concurrent,
            ..EndpointConfig::new(format!("http://10.0.0.{id}:80/"))
        };
        let addr = actix::AsyncContext::address(&actix::Context::<NodeActor>::new());
        NodeView::new(
            NodeId(id),
            &ep,
            addr,
            report(0, BreakerState::Closed, now),
            None,
        )
    }

    /// Regression: a `GetLoad` reply older than a later
    /// node report rolled the view's breaker back.
    #[test]
    fn an_older_report_never_overrides_a_newer_one() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(5);
        let mut n = view(0, 1, 4, t0);
        assert!(n.apply_load(report(2, BreakerState::Open { until }, t0), 3, false, t0));
        assert_eq!(n.mirror, Mirror::Open { until });
        // The GetLoad reply taken before the trip arrives last: dropped.
        assert!(!n.apply_load(report(1, BreakerState::Closed, t0), 3, false, t0));
        assert_eq!(n.mirror, Mirror::Open { until });
        assert_eq!(n.load.version, 2);
        assert!(!n.apply_load(report(2, BreakerState::Closed, t0), 3, false, t0));
        assert_eq!(n.mirror, Mirror::Open { until });
        // A newer one is taken.
        assert!(n.apply_load(report(3, BreakerState::Closed, t0), 3, false, t0));
        assert_eq!(n.mirror, Mirror::Closed);
        assert_eq!(n.load.total, 3);
    }

    #[test]
    fn slow_start_ramps_linearly_from_the_floor() {
        let t0 = Instant::now();
        let ramp = Some((Duration::from_secs(10), 0.1));
        let w = |secs: u64| ramp_weight(50, Some(t0), t0 + Duration::from_secs(secs), ramp);
        assert_eq!(w(0), 5);
        assert_eq!(w(5), 28); // 50 * (0.1 + 0.9 * 0.5) = 27.5
        assert_eq!(w(9), 46); // 50 * 0.91 = 45.5
        assert_eq!(w(10), 50);
        assert_eq!(w(60), 50);
        assert_eq!(ramp_weight(1, Some(t0), t0, ramp), 1, "never below 1");
        assert_eq!(ramp_weight(50, None, t0, ramp), 50, "not ramping");
        assert_eq!(ramp_weight(50, Some(t0), t0, None), 50, "slow start off");
    }
}
