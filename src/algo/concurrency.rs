//! Learned concurrency limit of one node (`max_concurrent: "auto"`).
//!
//! A fixed `max_concurrent` is right for one backend at one moment: too low
//! and the backend idles, too high and the excess waits in the backend's own
//! queue, where no deadline, shedding or priority of ours can reach it.
//! [`LearnedLimit`] learns the limit from the latencies of the node's own
//! answers, so the queue stays on our side, where it is managed.
//!
//! # Algorithm: Vegas on window means, with slow start and a drain probe
//!
//! TCP Vegas (Brakmo and Peterson, 1994; Netflix concurrency-limits'
//! `VegasLimit`) estimates how many requests wait inside the backend:
//!
//! ```text
//! queue = limit * (1 - base / rtt)
//! ```
//!
//! where `base` is the mean latency with nothing queued and `rtt` the
//! current one. By Little's law `limit * base / rtt` is the concurrency the
//! backend actually serves at once, so `queue` counts requests, not a ratio.
//! The limit is steered to keep it between `alpha = max(0.5, limit / 20)` and
//! `beta = max(2 * alpha, alpha + 1)`: more than `beta` lowers the limit by
//! half the excess over the middle of the band (at least 1, at most halving
//! it), less than `alpha` raises it by the shortfall (at least 1), in
//! between it holds. For a small backend (a limit under 20) the band is
//! half a request to one and a half: one request waits inside the backend,
//! so a worker that ends finds the next at once, but not two, which every
//! request (a critical one too) would wait behind where no priority of ours
//! reaches. Measured with `loadbench overload` (3 backends of 4 workers),
//! the limit settles at 5, where a band of 1 to 2 held it at 6 or 7: the
//! successes' p50 at 2x fell from 37 to 30 ms, goodput held at 94 %; a
//! band of 0.5 to 1 held it at 4, with dips to 3, and cost 2 % of goodput
//! (each freed worker then waits for the engine's next dispatch).
//!
//! Vegas is chosen over a gradient (Gradient2, Envoy's
//! `minRTT * (1 + buffer) / sample`) because a gradient plus a headroom term
//! never stands still: under mild overload the term makes it creep up
//! (concurrency-limits #134). Vegas holds where the queue is small and
//! positive: the backend is fully used and its latency rises 5-10 %.
//!
//! Samples are grouped in windows. A window closes once it holds `limit`
//! outcomes (at least 4), one turn of the limit, or once it is a second old
//! with at least one; the limit changes at most once per window, about once
//! per round trip as in TCP. `rtt` is the window's mean latency of
//! successes: a mean, because a backend with fixed service times shows its
//! queue to only some of the requests, and Little's law holds for means.
//! `base` is the least window mean over the current and the previous probe
//! period (mean against mean, so a backend with variable service times is
//! not read as queueing). Only successes of requests *sent* at least one
//! base latency after the last change count: those sent in between are the
//! burst that filled a raised limit (or the drain of a lowered one) and
//! queue behind the old load, not the new one.
//!
//! # What it is careful about (the complaints of the anchors)
//!
//! * **Outcomes, not only latencies.** [`SampleKind::Ignore`] (shed,
//!   cancelled, cut by the task's deadline, a pushback answer) is no sample
//!   at all: such near-zero latencies would read as an idle backend
//!   (concurrency-limits #176). [`SampleKind::NodeFailure`] is no latency
//!   sample either, and a window mostly of failures holds the limit (a sick
//!   node is the breaker's business).
//! * **Steady timeouts never grow it** (concurrency-limits #137, where the
//!   timeouts' latency became the new normal). A timeout is no latency
//!   sample; a window with any timeout does not grow, and a window mostly of
//!   timeouts (a hung backend) cuts the limit by `backoff`, as pushback does.
//! * **No growth while the limit does not bind**: in slow start a window
//!   whose highest in-flight count stayed below `limit / 2` does not grow
//!   (Gradient2's rule), and past it one that never reached the limit
//!   does not (TCP's congestion window validation, RFC 7661), so a quiet
//!   period does not leave a huge limit behind, nor does a limit that only
//!   the top class may fill ([`crate::algo::headroom`]).
//! * **A free tier that queues comes down, and stays down.** Where the
//!   limit seldom binds (the window's mean in flight under `limit - 0.5`,
//!   as when lower classes fill only the free limit), the band's test at
//!   the whole limit says little; the queue at the mean in flight does.
//!   When more than `alpha + 0.25` wait there in two windows in a row (a
//!   free tier at the right level queues about 0.1, one a request too high
//!   about 1; one slow sample in a window of five reads as 0.6 to 0.7), one
//!   request of the free tier waits inside the backend most of the time, a
//!   critical task behind it, and the limit is lowered by one. A window
//!   that seldom binds and shows no queue says nothing about the level
//!   above (only the top class reaches it), so once a limit was lowered
//!   from a level, growth in such windows stays below that level for four
//!   probe intervals (20 s by default, at most a minute), as TCP keeps
//!   `ssthresh`. Measured with `loadbench overload` at the mixed level:
//!   without these, each backend of 4
//!   workers went from 5 to 6 and back about 16 times in 10 s, each time
//!   with a sheddable request waiting inside it, and the critical tasks'
//!   p99 was 36.6-38.8 ms, where a fixed limit of 4 got 29-32 ms; with
//!   them, a backend goes to 6 about once per 20 s, and `"auto"` is level
//!   with the fixed limit (32.8 against 31.3 ms in one run, 34.8-39.9
//!   against 34.7-40.8 ms in three on a busy machine).
//! * **Slow start** (vector #7371 ramps too slowly): from `initial`, the
//!   limit doubles each window until the first queue, timeout or pushback,
//!   as in TCP's slow start. In the simulation below (64 slots, 20 ms) it
//!   serves the best fixed limit's throughput from the second 100 ms on.
//! * **Base drift** (Envoy #11579: minRTT drifts up under sustained load). At
//!   the Vegas point every request waits behind a small queue, so no window
//!   shows the unloaded latency, and an expiring minimum would take the
//!   loaded one. Every `probe_interval` (default 5 s, jittered by ±15 % from
//!   the injected rng, so nodes do not probe in step) one window runs at the
//!   concurrency the backend serves without queueing, by the current
//!   estimate, less 1/32: `ceil((limit - queue) * 31 / 32)`. That drains the
//!   backend's queue and refreshes `base`; then the limit is restored. A
//!   backend that got slower is followed within two periods, when the old
//!   `base` expires.
//! * **Probe refusals** (Envoy #8337 and #9007: its probe pins the limit to
//!   a floor of 3 and answers 503 to the rest). The probe runs only 1/32
//!   under what the backend serves at once, for one window per period: with
//!   the load at 90 % of capacity it refuses nothing; at 110 %, where the
//!   excess is refused anyway, it refuses under 5 % more than the rest of
//!   the time.
//! * **Pushback**: [`LearnedLimit::on_pushback`] (a 429 or 503) multiplies
//!   the limit by `backoff` (default 0.9), at most once per `base` latency
//!   (at least 10 ms), so one burst of rejections is one cut, as one loss
//!   event is in TCP.
//!
//! The module is pure: it reads no clock; every method takes `now`; its
//! only randomness is the probe jitter, from a seedable rng.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! use actix_dispatch::algo::concurrency::{LearnedLimit, LearnedLimitConfig, SampleKind};
//! use tokio::time::{Duration, Instant};
//!
//! let t0 = Instant::now();
//! let mut limit = LearnedLimit::with_seed(LearnedLimitConfig::default(), 1, t0);
//! assert_eq!(limit.limit(), 20);
//! // Twenty answers of requests sent at t0, at 20 in flight, 50 ms each:
//! let now = t0 + Duration::from_millis(50);
//! for _ in 0..20 {
//!     limit.on_sample(Duration::from_millis(50), 20, SampleKind::Success, now);
//! }
//! assert_eq!(limit.limit(), 40); // slow start doubled it
//! # }
//! ```

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Duration, Instant};

use crate::algo::time;

/// A window closes after this long even with few outcomes (if it has any).
const MAX_WINDOW: Duration = Duration::from_secs(1);
/// Fewest outcomes a window waits for.
const MIN_WINDOW_SAMPLES: usize = 4;
/// The probe runs this fraction under the estimated queue-free concurrency.
const PROBE_UNDERSHOOT: f64 = 1.0 / 32.0;
/// The least queue (in requests) the limit is steered to keep inside the
/// backend (see the module docs: one request waiting, not two).
const MIN_ALPHA: f64 = 0.5;
/// Pushback cuts are at least this far apart.
const MIN_CUT_GAP: Duration = Duration::from_millis(10);
/// How long growth where the limit seldom binds stays below a level the
/// limit was lowered from, in probe intervals (20 s by default). Each try
/// of that level again keeps a lower class's request waiting inside the
/// backend for two windows; a backend that got more workers is found by
/// then.
const TIER_CEILING_PROBES: u32 = 4;
/// ...and at most this long, whatever the probe interval.
const TIER_CEILING_MAX: Duration = Duration::from_secs(60);

/// Requests waiting inside a backend that holds `in_flight` at a mean
/// latency `rtt` against `base` with nothing queued (Little's law: it
/// serves `in_flight * base / rtt` at once); 0 for a zero `rtt`.
fn waiting(in_flight: f64, base: Duration, rtt: Duration) -> f64 {
    if rtt.is_zero() {
        return 0.0;
    }
    (in_flight * (1.0 - base.as_secs_f64() / rtt.as_secs_f64())).max(0.0)
}
/// Largest accepted `max`.
pub const MAX_LIMIT: u32 = 1_000_000;

/// Tuning of a [`LearnedLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedLimitConfig {
    /// The limit never goes below this (at least 1).
    pub min: u32,
    /// The limit never goes above this (at most [`MAX_LIMIT`]).
    pub max: u32,
    /// The limit to start from, in `min..=max`.
    pub initial: u32,
    /// Factor applied on pushback, in `(0, 1)`.
    pub backoff: f64,
    /// Time between two drain probes (greater than zero).
    pub probe_interval: Duration,
    /// Each probe interval is drawn uniformly in `interval * (1 ± jitter)`;
    /// in `[0, 1)`.
    pub probe_jitter: f64,
}

impl Default for LearnedLimitConfig {
    /// `min: 1`, `max: 1000`, `initial: 20` (Gradient2's initial limit),
    /// `backoff: 0.9` (AIMD's), `probe_interval: 5 s`, `probe_jitter: 0.15`
    /// (Envoy's). Five seconds: the probe costs little (see the module
    /// docs), and `base` follows a backend that got slower within two
    /// periods, 10 s.
    fn default() -> Self {
        LearnedLimitConfig {
            min: 1,
            max: 1000,
            initial: 20,
            backoff: 0.9,
            probe_interval: Duration::from_secs(5),
            probe_jitter: 0.15,
        }
    }
}

impl LearnedLimitConfig {
    /// Checks the fields; the error names the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.min == 0 {
            return Err("min must be at least 1".into());
        }
        if self.max > MAX_LIMIT {
            return Err(format!("max must be at most {MAX_LIMIT}"));
        }
        if self.min > self.max {
            return Err(format!(
                "min ({}) must not be above max ({})",
                self.min, self.max
            ));
        }
        if !(self.min..=self.max).contains(&self.initial) {
            return Err(format!(
                "initial ({}) must be within min..=max ({}..={})",
                self.initial, self.min, self.max
            ));
        }
        if !(self.backoff > 0.0 && self.backoff < 1.0) {
            return Err(format!("backoff must be in (0, 1), got {}", self.backoff));
        }
        if self.probe_interval.is_zero() {
            return Err("probe_interval must be greater than zero".into());
        }
        time::bounded("probe_interval", self.probe_interval)?;
        if !(self.probe_jitter >= 0.0 && self.probe_jitter < 1.0) {
            return Err(format!(
                "probe_jitter must be in [0, 1), got {}",
                self.probe_jitter
            ));
        }
        Ok(())
    }
}

/// What an ended attempt says about the node, for [`LearnedLimit::on_sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SampleKind {
    /// The node answered (any status that is not pushback): a latency sample.
    Success,
    /// The node failed (connection refused or reset, a 5xx): no latency.
    NodeFailure,
    /// The node's own attempt timeout fired: a sample at its full latency.
    Timeout,
    /// Says nothing about the node: shed, cancelled, cut by the task's
    /// deadline, or a pushback answer (report that with `on_pushback`).
    Ignore,
}

/// Where the limit is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Doubling each window until the first sign of congestion.
    SlowStart,
    /// Steering the estimated queue into the Vegas band.
    Avoidance,
    /// Running one window at the probe limit to measure `base`.
    Probe,
}

/// Outcomes of the current window.
#[derive(Debug, Clone, Default)]
struct Window {
    /// Sum of the latencies of the fresh successes.
    rtt_sum: Duration,
    successes: usize,
    timeouts: usize,
    failures: usize,
    max_in_flight: u32,
    /// Sum of the in-flight counts the outcomes ended at.
    in_flight_sum: u64,
}

impl Window {
    fn outcomes(&self) -> usize {
        self.successes + self.timeouts + self.failures
    }
}

/// A node's learned concurrency limit. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct LearnedLimit {
    config: LearnedLimitConfig,
    rng: SmallRng,
    /// The limit, kept fractional so that small steps add up.
    limit: f64,
    phase: Phase,
    /// The probe's limit while probing.
    probe_limit: u32,
    /// The phase to go back to after the probe.
    after_probe: Phase,
    /// Samples of requests sent before this are stale: one base latency
    /// after the last change.
    epoch: Instant,
    window_start: Instant,
    window: Window,
    /// Least window mean of this probe period and of the one before.
    base_now: Option<Duration>,
    base_before: Option<Duration>,
    /// The latest window mean and queue estimate, for stats.
    last_rtt: Option<Duration>,
    last_queue: f64,
    next_probe: Instant,
    last_cut: Option<Instant>,
    /// Windows in a row whose free tier queued (see the module docs).
    tier_queued: u8,
    /// The level the limit was last lowered from, and until when: where the
    /// limit seldom binds it grows only below it
    /// ([`TIER_CEILING_PROBES`] probe intervals).
    tier_ceiling: Option<(f64, Instant)>,
}

impl LearnedLimit {
    /// Starts at `config.initial` at `now`, with probe jitter seeded from
    /// the OS.
    ///
    /// # Panics
    ///
    /// If `config` fails [`LearnedLimitConfig::validate`].
    pub fn new(config: LearnedLimitConfig, now: Instant) -> Self {
        Self::with_rng(config, SmallRng::from_os_rng(), now)
    }

    /// As [`new`](Self::new), with reproducible jitter, for tests.
    pub fn with_seed(config: LearnedLimitConfig, seed: u64, now: Instant) -> Self {
        Self::with_rng(config, SmallRng::seed_from_u64(seed), now)
    }

    fn with_rng(config: LearnedLimitConfig, rng: SmallRng, now: Instant) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid LearnedLimitConfig: {e}");
        }
        let mut this = LearnedLimit {
            limit: f64::from(config.initial),
            config,
            rng,
            phase: Phase::SlowStart,
            probe_limit: 0,
            after_probe: Phase::SlowStart,
            epoch: now,
            window_start: now,
            window: Window::default(),
            base_now: None,
            base_before: None,
            last_rtt: None,
            last_queue: 0.0,
            next_probe: now,
            last_cut: None,
            tier_queued: 0,
            tier_ceiling: None,
        };
        this.next_probe = this.draw_probe_time(now);
        this
    }

    /// The configuration this limit was made with.
    pub fn config(&self) -> &LearnedLimitConfig {
        &self.config
    }

    /// How many attempts may be in flight to the node now.
    pub fn limit(&self) -> u32 {
        match self.phase {
            Phase::Probe => self.probe_limit,
            _ => self.steady_limit(),
        }
    }

    /// The part of the limit that tasks below the top class may fill
    /// (see [`crate::algo::headroom`]): the limit less the least queue the
    /// band keeps inside the backend, `alpha` rounded up (1 for a limit
    /// under 20, 3 at 50); the whole limit when it is 1. At the Vegas point
    /// the backend serves about `limit - queue` at once, so a node filled
    /// to this queues next to nothing inside its backend, and the rest of
    /// the limit is the top class's.
    pub fn free_limit(&self) -> u32 {
        let limit = self.limit();
        let headroom = (f64::from(limit) / 20.0).max(MIN_ALPHA).ceil() as u32;
        limit.saturating_sub(headroom).max(1)
    }

    /// The current phase, for stats.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The latency with nothing queued, as measured so far.
    pub fn base_rtt(&self) -> Option<Duration> {
        match (self.base_now, self.base_before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The mean latency of the successes of the last closed window.
    pub fn last_rtt(&self) -> Option<Duration> {
        self.last_rtt
    }

    /// The estimated number of requests queued inside the backend at the
    /// last closed window.
    pub fn queue_estimate(&self) -> f64 {
        self.last_queue
    }

    /// Records one ended attempt: its latency `rtt`, the node's attempts in
    /// flight counting this one (`in_flight`), and what it says about the
    /// node. Returns the new [`limit`](Self::limit) when it changed.
    pub fn on_sample(
        &mut self,
        rtt: Duration,
        in_flight: u32,
        kind: SampleKind,
        now: Instant,
    ) -> Option<u32> {
        let sent = now.checked_sub(rtt);
        match kind {
            SampleKind::Ignore => return None,
            // A request sent before the last change settled judges an older
            // limit.
            SampleKind::Success if sent.is_none_or(|s| s < self.epoch) => return None,
            SampleKind::Success => {
                self.window.successes += 1;
                self.window.rtt_sum = time::sum(self.window.rtt_sum, rtt);
            }
            // A timeout counts however long ago it was sent: it says the node
            // hangs requests, whatever the limit was.
            SampleKind::Timeout => self.window.timeouts += 1,
            SampleKind::NodeFailure => self.window.failures += 1,
        }
        self.window.max_in_flight = self.window.max_in_flight.max(in_flight);
        self.window.in_flight_sum += u64::from(in_flight);
        let needed = (self.limit() as usize).max(MIN_WINDOW_SAMPLES);
        let long = now.saturating_duration_since(self.window_start) >= MAX_WINDOW;
        if self.window.outcomes() < needed && !long {
            return None;
        }
        let before = self.limit();
        self.close_window(now);
        let after = self.limit();
        (after != before).then_some(after)
    }

    /// The node pushed back (a 429 or 503) at `now`: multiplies the limit by
    /// `backoff`, at most once per base latency (at least 10 ms). Returns the
    /// new limit when it changed.
    pub fn on_pushback(&mut self, now: Instant) -> Option<u32> {
        let before = self.limit();
        self.cut(now);
        let after = self.limit();
        (after != before).then_some(after)
    }

    /// When the next drain probe is due (it starts with the first window
    /// closing after it).
    pub fn next_probe(&self) -> Instant {
        self.next_probe
    }

    /// Multiplies the limit by `backoff`, unless the last cut was less than
    /// a base latency (at least 10 ms) ago.
    fn cut(&mut self, now: Instant) {
        let gap = self.base_rtt().unwrap_or(MIN_CUT_GAP).max(MIN_CUT_GAP);
        // An instant earlier than the last cut is within its gap too.
        if self.last_cut.is_some_and(|c| now < time::add(c, gap)) {
            return;
        }
        self.last_cut = Some(now);
        self.set_limit(self.limit * self.config.backoff);
        if self.phase == Phase::Probe {
            // The cut applies to the limit restored after the probe, and the
            // probe goes on no higher than it.
            self.probe_limit = self.probe_limit.min(self.steady_limit());
            self.after_probe = Phase::Avoidance;
        } else {
            self.phase = Phase::Avoidance;
        }
        self.new_epoch(now);
    }

    fn steady_limit(&self) -> u32 {
        // In min..=max by construction; `as` saturates.
        (self.limit.floor() as u32).clamp(self.config.min, self.config.max)
    }

    fn set_limit(&mut self, limit: f64) {
        self.limit = limit.clamp(f64::from(self.config.min), f64::from(self.config.max));
    }

    fn new_epoch(&mut self, now: Instant) {
        // The requests sent in the first round trip after a change are the
        // burst that fills a raised limit (or the drain of a lowered one):
        // they queue behind the old load, not the new, so they are skipped.
        self.epoch = time::add(now, self.base_rtt().unwrap_or(Duration::ZERO));
        self.window_start = now;
        self.window = Window::default();
    }

    fn draw_probe_time(&mut self, now: Instant) -> Instant {
        let j = self.config.probe_jitter;
        let factor = if j > 0.0 {
            self.rng.random_range(1.0 - j..=1.0 + j)
        } else {
            1.0
        };
        time::add(now, self.config.probe_interval.mul_f64(factor))
    }

    fn close_window(&mut self, now: Instant) {
        let window = std::mem::take(&mut self.window);
        self.window_start = now;
        let mean = u32::try_from(window.successes)
            .ok()
            .filter(|&n| n > 0)
            .map(|n| window.rtt_sum / n);
        if let Some(m) = mean {
            self.last_rtt = Some(m);
            self.base_now = Some(self.base_now.map_or(m, |b| b.min(m)));
        }
        if self.phase == Phase::Probe {
            // The probe window only measures: roll the base periods (this
            // window's mean opens the new one) and restore the limit.
            self.base_before = self.base_now;
            self.base_now = mean;
            self.phase = self.after_probe;
            self.next_probe = self.draw_probe_time(now);
            self.new_epoch(now);
            return;
        }
        if window.timeouts * 2 > window.outcomes() {
            // Mostly timeouts: the node hangs; back off as on pushback.
            self.cut(now);
            return;
        }
        let (Some(rtt), Some(base)) = (mean, self.base_rtt()) else {
            return;
        };
        let limit = self.limit;
        let queue = waiting(limit, base, rtt);
        self.last_queue = queue;
        let alpha = (limit / 20.0).max(MIN_ALPHA);
        let beta = (2.0 * alpha).max(alpha + 1.0);
        let healthy = window.timeouts == 0 && window.failures * 2 <= window.outcomes();
        // Slow start explores: it doubles while the node is at least half
        // used (Gradient2's rule). Past it the limit grows only when the
        // window reached it (TCP's congestion window validation, RFC 7661):
        // a limit that did not bind, as when only the top class may take
        // the headroom, says nothing about one above it.
        let used = f64::from(window.max_in_flight);
        let may_grow = healthy
            && match self.phase {
                Phase::SlowStart => used * 2.0 >= limit,
                _ => used >= limit.floor(),
            };
        // A limit reached only now and then, as when only the top class
        // may fill its headroom, grows only on no sign of a queue at all:
        // the few requests at the limit that waited are the sign.
        let mean_in_flight = window.in_flight_sum as f64 / window.outcomes().max(1) as f64;
        let seldom_binds = mean_in_flight < limit.floor() - 0.5;
        let alpha_up = match seldom_binds {
            true => alpha / 4.0,
            false => alpha,
        };
        // Where the limit seldom binds, the queue the backend holds is the
        // one at what is in flight (Little's law, as above, with the mean
        // in flight for the limit). The tier below the free limit should
        // queue next to nothing; when a request of it waits most of the
        // time, the limit (and with it the free limit) is one too high: a
        // lower class would keep a request waiting inside every backend,
        // where a critical task waits behind it.
        let queued = waiting(mean_in_flight, base, rtt);
        // Two windows in a row: one slow sample in a window of five reads
        // as a queue of 0.6 to 0.7.
        self.tier_queued = match seldom_binds && queued > alpha + 0.25 {
            true => self.tier_queued.saturating_add(1),
            false => 0,
        };
        let free_tier_queues = self.tier_queued >= 2;
        // Below the limit the free tier queued at, a window of no queue
        // says nothing new: the tier that was one too high is not tried
        // again for a while.
        let ceiling = self
            .tier_ceiling
            .filter(|&(_, until)| seldom_binds && now < until);
        let under_ceiling = |next: f64| ceiling.is_none_or(|(c, _)| next.floor() < c.floor());
        let next = if queue > beta {
            self.phase = Phase::Avoidance;
            let step = ((queue - (alpha + beta) / 2.0) / 2.0).max(1.0);
            (limit - step).max(limit / 2.0)
        } else if window.failures * 2 > window.outcomes() {
            limit
        } else if self.phase == Phase::SlowStart {
            if queue >= alpha || window.timeouts > 0 {
                self.phase = Phase::Avoidance;
                limit
            } else if may_grow {
                limit * 2.0
            } else {
                limit
            }
        } else if free_tier_queues && self.phase == Phase::Avoidance {
            self.tier_queued = 0;
            limit - 1.0
        } else if queue < alpha_up && may_grow && under_ceiling(limit + (alpha - queue).max(1.0)) {
            limit + (alpha - queue).max(1.0)
        } else {
            limit
        };
        // A limit that queued is not tried again where the limit seldom
        // binds for a while, however it came down.
        if next.floor() < limit.floor() {
            let hold =
                time::mul(self.config.probe_interval, TIER_CEILING_PROBES).min(TIER_CEILING_MAX);
            self.tier_ceiling = Some((limit, time::add(now, hold)));
        }
        self.set_limit(next);
        if self.limit != limit {
            self.new_epoch(now);
        }
        if now >= self.next_probe {
            self.start_probe(queue, now);
        }
    }

    fn start_probe(&mut self, queue: f64, now: Instant) {
        let free = (self.limit - queue).max(0.0) * (1.0 - PROBE_UNDERSHOOT);
        // `as` saturates; the probe never runs above the steady limit.
        let probe = (free.ceil() as u32).clamp(self.config.min, self.steady_limit());
        self.after_probe = self.phase;
        self.phase = Phase::Probe;
        self.probe_limit = probe;
        self.new_epoch(now);
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const US: Duration = Duration::from_micros(1);

    fn cfg() -> LearnedLimitConfig {
        LearnedLimitConfig {
            probe_jitter: 0.0,
            ..LearnedLimitConfig::default()
        }
    }

    /// `n` successes of `rtt` sent at `sent`, at `in_flight`; returns when
    /// they ended and what the last one returned.
    fn feed(
        l: &mut LearnedLimit,
        n: u32,
        rtt: Duration,
        in_flight: u32,
        sent: Instant,
    ) -> (Instant, Option<u32>) {
        let now = sent + rtt;
        let mut last = None;
        for _ in 0..n {
            last = l.on_sample(rtt, in_flight, SampleKind::Success, now);
        }
        (now, last)
    }

    #[test]
    fn default_numbers() {
        let c = LearnedLimitConfig::default();
        assert_eq!((c.min, c.max, c.initial), (1, 1000, 20));
        assert_eq!(c.backoff, 0.9);
        assert_eq!(c.probe_interval, Duration::from_secs(5));
        assert_eq!(c.probe_jitter, 0.15);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut LearnedLimitConfig)| {
            let mut c = LearnedLimitConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.min = 0).contains("min"));
        assert!(bad(|c| c.max = MAX_LIMIT + 1).contains("max"));
        assert!(bad(|c| c.min = 2000).contains("min"));
        assert!(bad(|c| c.initial = 0).contains("initial"));
        assert!(bad(|c| c.initial = 1001).contains("initial"));
        assert!(bad(|c| c.backoff = 1.0).contains("backoff"));
        assert!(bad(|c| c.backoff = f64::NAN).contains("backoff"));
        assert!(bad(|c| c.probe_interval = Duration::ZERO).contains("probe_interval"));
        assert!(bad(|c| c.probe_interval = Duration::MAX).contains("probe_interval"));
        assert!(bad(|c| c.probe_jitter = 1.0).contains("probe_jitter"));
        assert!(bad(|c| c.probe_jitter = -0.1).contains("probe_jitter"));
    }

    #[test]
    fn slow_start_doubles_until_the_first_queue() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let rtt = 50 * MS;
        // 20 -> 40 -> 80 -> 160 while the latency stays at its base. Each
        // window takes one limit's worth of answers, from requests sent a
        // base latency after the last change.
        let mut sent = t0;
        for (limit, next) in [(20u32, 40u32), (40, 80), (80, 160)] {
            assert_eq!(l.limit(), limit);
            let (_, last) = feed(&mut l, limit - 1, rtt, limit, sent);
            assert_eq!(last, None);
            let (now, last) = feed(&mut l, 1, rtt, limit, sent);
            assert_eq!(last, Some(next));
            assert_eq!(l.phase(), Phase::SlowStart);
            sent = now + rtt;
        }
        // Sent before the window settled: not counted.
        assert_eq!(feed(&mut l, 500, rtt, 160, sent - MS).1, None);
        // At 160 the mean is 100 ms: queue = 160 * (1 - 50/100) = 80,
        // beta = 16: the limit drops by (80 - 12) / 2 = 34, and slow start
        // is over.
        feed(&mut l, 160, 100 * MS, 160, sent);
        assert_eq!(l.phase(), Phase::Avoidance);
        assert_eq!(l.limit(), 126);
        assert_eq!(l.queue_estimate(), 80.0);
        assert_eq!(l.base_rtt(), Some(rtt));
        assert_eq!(l.last_rtt(), Some(100 * MS));
    }

    #[test]
    fn vegas_band_holds_raises_and_lowers() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let (now, _) = feed(&mut l, 20, 100 * MS, 20, t0); // base 100 ms, limit 40
        assert_eq!(l.limit(), 40);
        // queue = 40 * (1 - 100/110) = 3.6 in [alpha 2, beta 4]: slow start
        // ends, limit holds.
        let (now, _) = feed(&mut l, 40, 110 * MS, 40, now + 100 * MS);
        assert_eq!((l.phase(), l.limit()), (Phase::Avoidance, 40));
        // The same again: held (no creep in the band).
        let (now, last) = feed(&mut l, 40, 110 * MS, 40, now);
        assert_eq!((last, l.limit()), (None, 40));
        // No queue: raised by alpha - 0 = 2.
        let (now, last) = feed(&mut l, 40, 100 * MS, 40, now);
        assert_eq!(last, Some(42));
        // queue = 42 * (1 - 100/200) = 21 > beta 4.2: minus (21 - 3.15)/2.
        feed(&mut l, 42, 200 * MS, 42, now + 100 * MS);
        assert_eq!(l.limit(), 33); // 42 - 8.925 = 33.075
    }

    /// A limit from 2 on a backend of 4 workers and 20 ms a request, kept
    /// full for `windows` windows: at `limit` in flight a request takes
    /// 20 ms * max(limit, 4) / 4 (Little's law). Returns it, when the next
    /// window's requests are sent, and the limit after each window.
    fn small_backend(windows: usize) -> (LearnedLimit, Instant, Vec<u32>) {
        small_backend_with(cfg(), windows)
    }

    fn small_backend_with(
        config: LearnedLimitConfig,
        windows: usize,
    ) -> (LearnedLimit, Instant, Vec<u32>) {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(
            LearnedLimitConfig {
                initial: 2,
                ..config
            },
            1,
            t0,
        );
        let rtt_at = |limit: u32| 20 * MS * limit.max(4) / 4;
        let mut sent = t0;
        let mut limits = Vec::new();
        for _ in 0..windows {
            let limit = l.limit();
            let (now, _) = feed(&mut l, limit.max(4), rtt_at(limit), limit, sent);
            limits.push(l.limit());
            sent = now + rtt_at(limit);
        }
        (l, sent, limits)
    }

    #[test]
    fn a_small_backend_keeps_one_request_waiting() {
        let t0 = Instant::now();
        let (l, _, limits) = small_backend(12);
        // Slow start to 8 (a queue of 4), lowered to 6, then to 5, where
        // one request waits (queue about 5 * (1 - 20/25) = 1, inside
        // [0.5, 1.5]) and the limit holds: not 4, where a worker that ends
        // would wait for the next dispatch, nor 6, where two wait.
        assert_eq!(limits, [4, 8, 6, 5, 5, 5, 5, 5, 5, 5, 5, 5]);
        let queue = l.queue_estimate();
        assert!((0.5..=1.5).contains(&queue), "{queue}");
        // The backend serves 4 at once: the fifth slot is headroom.
        assert_eq!(l.free_limit(), 4);

        // At 6 in flight two wait: queue 6 * (1 - 21.5/31.5) = 1.9 (with
        // 1.5 ms of the way there and back), over 1.5, so it is lowered to
        // 5 (a band of 1 to 2 would hold it at 6).
        let mut m = LearnedLimit::with_seed(
            LearnedLimitConfig {
                initial: 6,
                ..cfg()
            },
            1,
            t0,
        );
        let base = 21_500 * US;
        let (now, _) = feed(&mut m, 6, base, 2, t0); // too few in flight to grow
        assert_eq!(
            (m.phase(), m.limit(), m.base_rtt()),
            (Phase::SlowStart, 6, Some(base))
        );
        let (now, _) = feed(&mut m, 6, base + 10 * MS, 6, now + base);
        assert_eq!((m.phase(), m.limit()), (Phase::Avoidance, 5));
        // At 5 one waits: queue 5 * (1 - 21.5/26.5) = 0.94, held.
        let (_, last) = feed(&mut m, 6, base + 5 * MS, 5, now + base);
        assert_eq!((last, m.limit()), (None, 5));
        // The one request the band keeps waiting is headroom: 4 are free.
        assert_eq!(m.free_limit(), 4);
    }

    #[test]
    fn a_limit_only_the_top_class_reaches_does_not_creep_up() {
        // A backend of 4 workers, 20 ms a request, at its learned 5.
        let (mut l, mut sent, _) = small_backend(8);
        assert_eq!((l.limit(), l.free_limit()), (5, 4));
        // Lower classes fill it to 4; now and then a critical task takes
        // the fifth slot and waits 5 ms for a worker. The limit was
        // reached and the queue (5 * (1 - 20/21) = 0.24) is under alpha,
        // but it binds only now and then: it holds.
        for _ in 0..6 {
            let now = sent + 25 * MS;
            for _ in 0..4 {
                l.on_sample(20 * MS, 4, SampleKind::Success, now);
            }
            l.on_sample(25 * MS, 5, SampleKind::Success, now);
            sent = now + 25 * MS;
        }
        assert_eq!(l.limit(), 5);
        // Cut to 4 (pushback), lower classes fill 3 and the top class the
        // fourth, and nothing ever waits: it grows back.
        l.on_pushback(sent);
        assert_eq!((l.limit(), l.free_limit()), (4, 3));
        sent += 25 * MS;
        for _ in 0..3 {
            let now = sent + 20 * MS;
            for _ in 0..3 {
                l.on_sample(20 * MS, 3, SampleKind::Success, now);
            }
            l.on_sample(20 * MS, 4, SampleKind::Success, now);
            sent = now + 20 * MS;
        }
        assert_eq!(l.limit(), 5);
    }

    /// One window where lower classes hold `low` in flight, each request
    /// taking `rtt`, and one top-class request the slot above; when the
    /// next window may start.
    fn tiered(l: &mut LearnedLimit, sent: Instant, rtt: Duration, low: u32) -> Instant {
        let now = sent + rtt;
        for _ in 0..5 {
            l.on_sample(rtt, low, SampleKind::Success, now);
        }
        l.on_sample(rtt, low + 1, SampleKind::Success, now);
        now + rtt
    }

    /// A backend of 4 workers, 20 ms a request, at its learned 5, then a
    /// window where nothing waited at 5 raises it to 6 (noise, or the
    /// backend was faster for a while): lower classes may fill 5.
    fn raised_to_six(config: LearnedLimitConfig) -> (LearnedLimit, Instant) {
        let (mut l, sent, _) = small_backend_with(config, 8);
        assert_eq!(l.limit(), 5);
        let now = sent + 20 * MS;
        for _ in 0..5 {
            l.on_sample(20 * MS, 5, SampleKind::Success, now);
        }
        assert_eq!((l.limit(), l.free_limit()), (6, 5));
        (l, now + 20 * MS)
    }

    #[test]
    fn a_free_tier_that_queues_inside_the_backend_comes_down() {
        let (mut l, mut sent) = raised_to_six(cfg());
        // Lower classes fill 5, so one waits inside the backend and each
        // takes 25 ms; a critical task now and then takes the sixth slot.
        // The limit seldom binds and its queue (6 * (1 - 20/25) = 1.2) is
        // inside the band, but at what is in flight one request waits
        // (5.17 * (1 - 20/25) = 1.03, over alpha + 0.25). Once is noise;
        // twice in a row, it comes down.
        sent = tiered(&mut l, sent, 25 * MS, 5);
        assert_eq!(l.limit(), 6);
        sent = tiered(&mut l, sent, 25 * MS, 5);
        assert_eq!((l.limit(), l.free_limit()), (5, 4));
        // Back at 4 below, with no queue to see: it holds at 5, and does
        // not try 6 again for four probe intervals (20 s)...
        let cut_at = sent;
        while sent < cut_at + Duration::from_secs(19) {
            sent = tiered(&mut l, sent, 20 * MS, 4);
            assert!(l.limit() <= 5, "{}", l.limit());
        }
        // ...and then does.
        let mut grown = false;
        for _ in 0..100 {
            sent = tiered(&mut l, sent, 20 * MS, 4);
            grown |= l.limit() == 6;
        }
        assert!(grown, "tried again after 20 s");
    }

    #[test]
    fn a_free_tier_ceiling_lasts_at_most_a_minute() {
        // A probe interval of an hour: four of them would be four hours.
        let config = LearnedLimitConfig {
            probe_interval: Duration::from_secs(3600),
            ..cfg()
        };
        let (mut l, mut sent) = raised_to_six(config);
        sent = tiered(&mut l, sent, 25 * MS, 5);
        sent = tiered(&mut l, sent, 25 * MS, 5);
        assert_eq!(l.limit(), 5);
        let cut_at = sent;
        while sent < cut_at + Duration::from_secs(59) {
            sent = tiered(&mut l, sent, 20 * MS, 4);
            assert!(l.limit() <= 5, "{}", l.limit());
        }
        let mut grown = false;
        for _ in 0..100 {
            sent = tiered(&mut l, sent, 20 * MS, 4);
            grown |= l.limit() == 6;
        }
        assert!(grown, "tried again after a minute");
    }

    #[test]
    fn the_free_limit_leaves_the_least_queue_of_the_band_as_headroom() {
        let t0 = Instant::now();
        let free = |limit: u32| {
            let c = LearnedLimitConfig {
                initial: limit,
                ..cfg()
            };
            LearnedLimit::with_seed(c, 1, t0).free_limit()
        };
        // The limit less alpha = max(0.5, limit / 20), rounded up.
        let seen: Vec<u32> = [1, 2, 5, 20, 21, 50, 1000].map(free).to_vec();
        assert_eq!(seen, [1, 1, 4, 19, 19, 47, 950]);
    }

    #[test]
    fn ignored_stale_and_failed_samples_do_not_move_it() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let now = t0 + 10 * MS;
        // Shed, cancelled, deadline-cut: near-zero latencies, not samples.
        for _ in 0..100 {
            assert_eq!(l.on_sample(MS, 20, SampleKind::Ignore, now), None);
        }
        // Sent before t0 (the epoch): stale.
        for _ in 0..100 {
            l.on_sample(20 * MS, 20, SampleKind::Success, now);
        }
        assert_eq!((l.limit(), l.base_rtt()), (20, None));
        // A window mostly of failures holds, even with fast successes in it.
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        feed(&mut l, 9, 10 * MS, 20, t0);
        for _ in 0..11 {
            l.on_sample(MS, 20, SampleKind::NodeFailure, now);
        }
        assert_eq!(l.limit(), 20);
        assert_eq!(l.phase(), Phase::SlowStart);
        assert_eq!(l.base_rtt(), Some(10 * MS));
    }

    #[test]
    fn no_growth_while_the_node_is_under_half_used() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        feed(&mut l, 20, 10 * MS, 9, t0);
        assert_eq!(l.limit(), 20);
        feed(&mut l, 20, 10 * MS, 10, t0);
        assert_eq!(l.limit(), 40);
    }

    #[test]
    fn timeouts_stop_growth_and_a_hung_backend_pulls_it_down() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let mut now = t0 + 500 * MS;
        // One timeout among nineteen fast answers: slow start ends, no growth.
        feed(&mut l, 19, 10 * MS, 20, now - 10 * MS);
        l.on_sample(Duration::from_secs(1), 20, SampleKind::Timeout, now);
        assert_eq!((l.phase(), l.limit()), (Phase::Avoidance, 20));
        // Everything times out: each window of timeouts cuts by `backoff`.
        let mut seen = vec![l.limit()];
        for _ in 0..6 {
            now += Duration::from_secs(1);
            for _ in 0..l.limit() {
                l.on_sample(Duration::from_secs(1), 20, SampleKind::Timeout, now);
            }
            seen.push(l.limit());
        }
        assert_eq!(seen, [20, 18, 16, 14, 13, 11, 10]);
    }

    #[test]
    fn a_backend_that_only_times_out_never_grows() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let mut now = t0;
        for _ in 0..50 {
            now += Duration::from_secs(1);
            for _ in 0..10 {
                l.on_sample(Duration::from_secs(1), 20, SampleKind::Timeout, now);
                assert!(l.limit() <= 20);
            }
        }
    }

    #[test]
    fn pushback_cuts_once_per_base_latency() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        let (now, _) = feed(&mut l, 20, 50 * MS, 20, t0); // base 50 ms, limit 40
        assert_eq!(l.on_pushback(now), Some(36));
        assert_eq!(l.phase(), Phase::Avoidance);
        // The rest of the burst, within 50 ms: no further cut.
        assert_eq!(l.on_pushback(now + 49 * MS), None);
        assert_eq!(l.on_pushback(now - 10 * MS), None);
        assert_eq!(l.on_pushback(now + 50 * MS), Some(32)); // 32.4
        assert_eq!(l.on_pushback(now + 100 * MS), Some(29)); // 29.16
                                                             // Never under min.
        let mut t = now + 100 * MS;
        for _ in 0..100 {
            t += 50 * MS;
            l.on_pushback(t);
        }
        assert_eq!(l.limit(), 1);
    }

    #[test]
    fn probe_runs_one_window_under_the_queue_free_concurrency() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(cfg(), 1, t0);
        assert_eq!(l.next_probe(), t0 + Duration::from_secs(5));
        let (now, _) = feed(&mut l, 20, 100 * MS, 20, t0); // limit 40, base 100 ms
                                                           // The backend serves 36 at once: a queue of 4 (beta), held.
        feed(&mut l, 40, 111 * MS, 40, now + 100 * MS);
        assert_eq!((l.phase(), l.limit()), (Phase::Avoidance, 40));
        // At 5 s a window closes into a probe: queue = 40 * (1 - 100/111)
        // = 3.96; ceil((40 - 3.96) * 31 / 32) = 35.
        let five = t0 + Duration::from_secs(5);
        // (The window is over a second old: its first answer closes it.)
        let (now, _) = feed(&mut l, 40, 111 * MS, 40, five - 111 * MS);
        assert_eq!(now, five);
        assert_eq!((l.limit(), l.phase()), (35, Phase::Probe));
        // Sent before the probe settled (one base latency): not counted.
        feed(&mut l, 100, 111 * MS, 40, five + 99 * MS);
        assert_eq!(l.phase(), Phase::Probe);
        // The probe window sees the unloaded latency; the limit is back.
        let (now, last) = feed(&mut l, 35, 100 * MS, 35, five + 100 * MS);
        assert_eq!((last, l.phase()), (Some(40), Phase::Avoidance));
        assert_eq!(l.base_rtt(), Some(100 * MS));
        assert_eq!(l.next_probe(), now + Duration::from_secs(5));
    }

    #[test]
    fn probe_jitter_is_seeded_and_bounded() {
        let t0 = Instant::now();
        let draw = |seed| {
            LearnedLimit::with_seed(LearnedLimitConfig::default(), seed, t0).next_probe() - t0
        };
        assert_eq!(draw(7), draw(7));
        for seed in 0..200 {
            let d = draw(seed);
            assert!(d >= Duration::from_millis(4250) && d <= Duration::from_millis(5750));
        }
    }

    // === the simulation ===

    /// A backend of `slots` workers with a fixed `service` time and an
    /// unbounded FIFO queue in front of them, as a worker pool is.
    struct Backend {
        service: u64,
        free_at: BinaryHeap<Reverse<u64>>,
    }

    impl Backend {
        fn new(slots: usize, service_us: u64) -> Self {
            Backend {
                service: service_us,
                free_at: (0..slots).map(|_| Reverse(0)).collect(),
            }
        }

        /// When a request arriving at `t` is answered.
        fn answer_at(&mut self, t: u64) -> u64 {
            let Reverse(free) = self.free_at.pop().expect("slots");
            let end = t.max(free) + self.service;
            self.free_at.push(Reverse(end));
            end
        }
    }

    #[derive(Default)]
    struct Run {
        /// Answers per 100 ms of virtual time.
        answers: Vec<u64>,
        limits: Vec<u32>,
        arrivals: u64,
        refused: u64,
        probe_arrivals: u64,
        probe_refused: u64,
        probes: u64,
    }

    /// Drives `limit` against `backend` for `secs` of virtual time. With
    /// `arrival_us`, open-loop arrivals that far apart, refused when the
    /// limit is full; without, a backlog that always fills the limit. Every
    /// `timeout_every`-th request hangs and times out after 1 s.
    fn simulate(
        limit: &mut LearnedLimit,
        backend: &mut Backend,
        arrival_us: Option<u64>,
        timeout_every: Option<u64>,
        secs: u64,
        t0: Instant,
    ) -> Run {
        let end = secs * 1_000_000;
        let mut run = Run {
            answers: vec![0; (secs * 10) as usize],
            ..Run::default()
        };
        // (answered at, sent at, timed out)
        let mut pending: BinaryHeap<Reverse<(u64, u64, bool)>> = BinaryHeap::new();
        let mut in_flight = 0u32;
        let mut sent = 0u64;
        let mut next_arrival = 0u64;
        let mut was_probe = false;
        let mut send = |t: u64, backend: &mut Backend, pending: &mut BinaryHeap<_>| {
            sent += 1;
            if timeout_every.is_some_and(|k| sent % k == 0) {
                pending.push(Reverse((t + 1_000_000, t, true)));
            } else {
                pending.push(Reverse((backend.answer_at(t), t, false)));
            }
        };
        if arrival_us.is_none() {
            // The backlog fills the initial limit at once.
            while in_flight < limit.limit() {
                in_flight += 1;
                send(0, backend, &mut pending);
            }
        }
        loop {
            let answer = pending.peek().map(|Reverse((a, _, _))| *a);
            let arrival = arrival_us.map(|_| next_arrival);
            let t = match (answer, arrival) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(end),
            };
            if t >= end {
                break;
            }
            let now = t0 + Duration::from_micros(t);
            if answer == Some(t) {
                let Reverse((at, from, timed_out)) = pending.pop().unwrap();
                let kind = if timed_out {
                    SampleKind::Timeout
                } else {
                    run.answers[(at / 100_000) as usize] += 1;
                    SampleKind::Success
                };
                limit.on_sample(Duration::from_micros(at - from), in_flight, kind, now);
                in_flight -= 1;
                if arrival_us.is_none() {
                    while in_flight < limit.limit() {
                        in_flight += 1;
                        send(t, backend, &mut pending);
                    }
                }
            } else {
                next_arrival += arrival_us.unwrap();
                let probe = limit.phase() == Phase::Probe;
                run.arrivals += 1;
                run.probe_arrivals += u64::from(probe);
                if in_flight < limit.limit() {
                    in_flight += 1;
                    send(t, backend, &mut pending);
                } else {
                    run.refused += 1;
                    run.probe_refused += u64::from(probe);
                }
            }
            let probe = limit.phase() == Phase::Probe;
            run.probes += u64::from(probe && !was_probe);
            was_probe = probe;
            let slot = (t / 100_000) as usize;
            if run.limits.len() <= slot {
                run.limits.resize(slot + 1, limit.limit());
            }
            run.limits[slot] = limit.limit();
        }
        run
    }

    /// A 64-slot backend at 20 ms: the best fixed limit answers 3200/s.
    const SLOTS: usize = 64;
    const SERVICE_US: u64 = 20_000;
    const BEST_PER_100MS: u64 = 320;

    fn start_backlog(l: &mut LearnedLimit, b: &mut Backend, secs: u64, t0: Instant) -> Run {
        // The first requests go out at t0 with the initial limit; the
        // simulation refills after each answer.
        simulate(l, b, None, None, secs, t0)
    }

    #[test]
    fn reaches_the_best_fixed_throughput_and_stays_near_it() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 11, t0);
        let mut b = Backend::new(SLOTS, SERVICE_US);
        let run = start_backlog(&mut l, &mut b, 60, t0);
        // At least 80 % of the best throughput in every 100 ms from 1 s on
        // (well within the 10 s asked for), and at least 95 % overall after.
        let first = run
            .answers
            .iter()
            .position(|&n| n * 10 >= BEST_PER_100MS * 8)
            .unwrap();
        assert!(first <= 5, "80 % first reached at {first}00 ms");
        assert!(run.answers[10..]
            .iter()
            .all(|&n| n * 10 >= BEST_PER_100MS * 8));
        let total: u64 = run.answers[10..].iter().sum();
        assert!(total * 100 >= BEST_PER_100MS * 500 * 95, "{total}");
        // No creep and no drift: the limit stays within a small queue of
        // the 64 slots for the whole minute, probes included.
        let late = &run.limits[20..];
        assert!(late.iter().all(|&x| (60..=72).contains(&x)), "{late:?}");
        assert!(run.probes >= 10, "{} probes", run.probes);
        assert_eq!(l.base_rtt(), Some(Duration::from_micros(SERVICE_US)));
    }

    #[test]
    fn steady_timeouts_do_not_grow_it() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 3, t0);
        let mut b = Backend::new(SLOTS, SERVICE_US);
        // One request in ten hangs.
        let run = simulate(&mut l, &mut b, None, Some(10), 30, t0);
        // The first hung requests time out at 1 s; from then on (and one
        // more window for the answers on their way) the limit never grows.
        let at_first = run.limits[11];
        let later = &run.limits[11..];
        assert!(later.iter().all(|&x| x <= at_first), "{later:?}");
    }

    #[test]
    fn pushback_lowers_it_in_the_simulation() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 5, t0);
        let mut b = Backend::new(SLOTS, SERVICE_US);
        start_backlog(&mut l, &mut b, 5, t0);
        let before = l.limit();
        let now = t0 + Duration::from_secs(5);
        // A burst of 429s answered at once: one cut.
        for _ in 0..50 {
            l.on_pushback(now);
        }
        assert_eq!(l.limit(), (f64::from(before) * 0.9) as u32);
    }

    #[test]
    fn probes_refuse_at_most_five_percent_under_the_capacity() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 9, t0);
        let mut b = Backend::new(SLOTS, SERVICE_US);
        // Open loop at 90 % of capacity: one arrival every 347 us.
        let run = simulate(&mut l, &mut b, Some(347), None, 60, t0);
        assert!(run.probes >= 10, "{} probes", run.probes);
        assert!(run.probe_arrivals > 0);
        assert!(
            run.probe_refused * 20 <= run.probe_arrivals,
            "{} of {} refused in probes",
            run.probe_refused,
            run.probe_arrivals
        );
        // After the first second (slow start), nearly nothing is refused.
        assert!(
            run.refused * 100 <= run.arrivals,
            "{} of {}",
            run.refused,
            run.arrivals
        );
    }

    #[test]
    fn mild_overload_does_not_creep() {
        let t0 = Instant::now();
        let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 13, t0);
        let mut b = Backend::new(SLOTS, SERVICE_US);
        // Open loop at 110 % of capacity.
        let run = simulate(&mut l, &mut b, Some(284), None, 60, t0);
        let late = &run.limits[20..];
        assert!(late.iter().all(|&x| (60..=72).contains(&x)), "{late:?}");
        // The excess is refused anyway; a probe window refuses at most 5 %
        // of its arrivals more than the rest of the time does.
        assert!(run.probes >= 10, "{} probes", run.probes);
        let inside = run.probe_refused as f64 / run.probe_arrivals as f64;
        let outside =
            (run.refused - run.probe_refused) as f64 / (run.arrivals - run.probe_arrivals) as f64;
        assert!(inside - outside <= 0.05, "{inside} against {outside}");
    }
}
