//! The Prometheus families (feature `metrics`), registered in the
//! application's own registry, and the text encoding.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::*;

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Bucket bounds (seconds) of an upstream request: 1 ms .. ~33 s.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Bucket bounds (seconds) of a whole task: 1 ms .. ~65 s.
fn task_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every family of one dispatcher; clones share the series.
#[derive(Clone)]
pub(crate) struct Families {
    tasks: Family<Labels, Counter>,
    task_duration: HistogramFamily,
    queue_depth: Family<Labels, Gauge>,
    in_flight: Family<Labels, Gauge>,
    limit: Family<Labels, Gauge>,
    upstream: Family<Labels, Counter>,
    upstream_duration: HistogramFamily,
    retries: Family<Labels, Counter>,
    budget_exhausted: Family<Labels, Counter>,
    hedges: Family<Labels, Counter>,
    breaker_state: Family<Labels, Gauge>,
    breaker_transitions: Family<Labels, Counter>,
    endpoints: Family<Labels, Gauge>,
    rate_limited: Family<Labels, Counter>,
    shed: Family<Labels, Counter>,
    stream_entries: Family<Labels, Gauge>,
    stream_events: Family<Labels, Counter>,
    leases: Family<Labels, Counter>,
    leases_out: Family<Labels, Gauge>,
    /// Off: every handle is a no-op (benchmarks compare both in one run).
    enabled: bool,
}

impl Default for Families {
    fn default() -> Self {
        Self {
            enabled: true,
            tasks: Family::default(),
            task_duration: Family::new_with_constructor(task_histogram),
            queue_depth: Family::default(),
            in_flight: Family::default(),
            limit: Family::default(),
            upstream: Family::default(),
            upstream_duration: Family::new_with_constructor(request_histogram),
            retries: Family::default(),
            budget_exhausted: Family::default(),
            hedges: Family::default(),
            breaker_state: Family::default(),
            breaker_transitions: Family::default(),
            endpoints: Family::default(),
            rate_limited: Family::default(),
            shed: Family::default(),
            stream_entries: Family::default(),
            stream_events: Family::default(),
            leases: Family::default(),
            leases_out: Family::default(),
        }
    }
}

fn svc(service: &str) -> Labels {
    vec![("service", service.to_owned())]
}

fn with(mut l: Labels, key: &'static str, value: &str) -> Labels {
    l.push((key, value.to_owned()));
    l
}

impl Families {
    /// Registers every family in `registry` (names without the
    /// `dispatch_` prefix are given it here).
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("dispatch");
        r.register(
            "tasks",
            "Tasks answered, by outcome and reason",
            self.tasks.clone(),
        );
        r.register(
            "queue_depth",
            "Tasks waiting in the queue (ready or in retry backoff)",
            self.queue_depth.clone(),
        );
        r.register(
            "in_flight",
            "Requests in flight on a node",
            self.in_flight.clone(),
        );
        r.register(
            "concurrency_limit",
            "Requests a node may have in flight now (max_concurrent, or the learned limit under it)",
            self.limit.clone(),
        );
        r.register(
            "upstream_requests",
            "Attempts sent to a node, by class (status class or error kind)",
            self.upstream.clone(),
        );
        r.register_with_unit(
            "upstream_request_duration",
            "Time from send to answer of an attempt",
            prometheus_client::registry::Unit::Seconds,
            self.upstream_duration.clone(),
        );
        r.register_with_unit(
            "task_duration",
            "Time from submit to answer of a task",
            prometheus_client::registry::Unit::Seconds,
            self.task_duration.clone(),
        );
        r.register("retries", "Retries scheduled", self.retries.clone());
        r.register(
            "retry_budget_exhausted",
            "Retries refused by the retry budget",
            self.budget_exhausted.clone(),
        );
        r.register("hedges", "Hedged attempts sent", self.hedges.clone());
        r.register(
            "breaker_state",
            "Breaker state of a node (1 for the current state)",
            self.breaker_state.clone(),
        );
        r.register(
            "breaker_transitions",
            "Breaker transitions of a node, by the state entered",
            self.breaker_transitions.clone(),
        );
        r.register(
            "endpoints",
            "Endpoints of a service by state (healthy, unhealthy, inactive, open)",
            self.endpoints.clone(),
        );
        r.register(
            "rate_limited",
            "Dispatches or tasks refused for want of a token, by scope",
            self.rate_limited.clone(),
        );
        r.register(
            "shed",
            "Tasks shed `overloaded`, by reason (intake, queue_delay, displaced) and priority class",
            self.shed.clone(),
        );
        r.register(
            "stream_entries",
            "Entries of a service's durable stream: lag (not yet read by the group) and pending (read, not acknowledged)",
            self.stream_entries.clone(),
        );
        r.register(
            "stream_events",
            "Durable stream entries of this instance by event (read, claimed, recorded, duplicate, failed, dead_lettered)",
            self.stream_events.clone(),
        );
        self.register_leases(r);
    }

    /// Registered with the others, kept apart for their length.
    fn register_leases(&self, r: &mut Registry) {
        r.register(
            "leases",
            "Leases of a service's endpoints by event: granted, the outcomes reported (success, failure, ignored), and cancelled (dropped without an outcome)",
            self.leases.clone(),
        );
        r.register(
            "leases_out",
            "Leases of a service's endpoints held now",
            self.leases_out.clone(),
        );
    }

    /// The lease series of `service`, created at zero.
    pub(crate) fn leases(&self, service: &str) -> PromLeases {
        if !self.enabled {
            return PromLeases(None);
        }
        let s = svc(service);
        PromLeases(Some(Arc::new(LeasesInner {
            events: LEASE_EVENTS
                .iter()
                .map(|e| {
                    self.leases
                        .get_or_create(&with(s.clone(), "event", e))
                        .clone()
                })
                .collect(),
            out: self.leases_out.get_or_create(&s).clone(),
        })))
    }

    /// The durable stream series of `service` (feature `redis`).
    #[cfg(feature = "redis")]
    pub(crate) fn stream(&self, service: &str) -> PromStream {
        if !self.enabled {
            return PromStream(None);
        }
        let s = svc(service);
        let gauge = |state| {
            self.stream_entries
                .get_or_create(&with(s.clone(), "state", state))
                .clone()
        };
        let (lag, pending) = (gauge("lag"), gauge("pending"));
        let events = STREAM_EVENTS
            .iter()
            .map(|e| {
                self.stream_events
                    .get_or_create(&with(s.clone(), "event", e))
                    .clone()
            })
            .collect();
        PromStream(Some(Arc::new((lag, pending, events))))
    }

    /// Resolves (and creates at zero) every series of service `service`.
    /// Families whose handles are all no-ops.
    pub(crate) fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    pub(crate) fn service(&self, service: &str) -> ServiceMetrics {
        if !self.enabled {
            return ServiceMetrics::default();
        }
        let s = svc(service);
        let inner = ServiceInner {
            families: self.clone(),
            service: service.to_owned(),
            tasks: TASK_KINDS
                .iter()
                .map(|(o, r)| {
                    self.tasks
                        .get_or_create(&with(with(s.clone(), "outcome", o), "reason", r))
                        .clone()
                })
                .collect(),
            task_duration: OUTCOMES
                .iter()
                .map(|o| {
                    self.task_duration
                        .get_or_create(&with(s.clone(), "outcome", o))
                        .clone()
                })
                .collect(),
            queue_depth: self.queue_depth.get_or_create(&s).clone(),
            retries: self.retries.get_or_create(&s).clone(),
            budget_exhausted: self.budget_exhausted.get_or_create(&s).clone(),
            hedges: self.hedges.get_or_create(&s).clone(),
            endpoints: ENDPOINT_STATES
                .iter()
                .map(|e| {
                    self.endpoints
                        .get_or_create(&with(s.clone(), "state", e))
                        .clone()
                })
                .collect(),
            rejected_rate_limited: self
                .rate_limited
                .get_or_create(&with(s.clone(), "scope", "service"))
                .clone(),
            shed: SHED_REASONS
                .iter()
                .flat_map(|r| {
                    crate::Priority::ALL.map(|c| {
                        let l = with(with(s.clone(), "reason", r), "class", c.as_str());
                        self.shed.get_or_create(&l).clone()
                    })
                })
                .collect(),
        };
        ServiceMetrics {
            prom: PromService(Some(Arc::new(inner))),
            latencies: Default::default(),
        }
    }
}

/// One service's durable stream series.
#[derive(Clone, Default)]
pub(crate) struct PromStream(Option<Arc<(Gauge, Gauge, Vec<Counter>)>>);

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl PromStream {
    /// The lag and pending counts read from `XINFO GROUPS`.
    pub(crate) fn entries(&self, lag: u64, pending: u64) {
        if let Some(m) = &self.0 {
            m.0.set(i64::try_from(lag).unwrap_or(i64::MAX));
            m.1.set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
    }

    /// `n` entries had `event` (an index of [`STREAM_EVENTS`]).
    pub(crate) fn event(&self, event: StreamEvent, n: u64) {
        if let Some(m) = &self.0 {
            m.2[event as usize].inc_by(n);
        }
    }
}

struct ServiceInner {
    families: Families,
    service: String,
    tasks: Vec<Counter>,
    task_duration: Vec<Histogram>,
    queue_depth: Gauge,
    retries: Counter,
    budget_exhausted: Counter,
    hedges: Counter,
    endpoints: Vec<Gauge>,
    rejected_rate_limited: Counter,
    /// By [`Shed`] reason, then class.
    shed: Vec<Counter>,
}

/// One service's series; a no-op when built by `default()` (tests that
/// start a pipeline by hand).
#[derive(Clone, Default)]
pub(crate) struct PromService(Option<Arc<ServiceInner>>);

impl PromService {
    /// A task answered with `outcome`, `total` after its submit.
    #[inline]
    pub(crate) fn task_finished(&self, outcome: &Outcome, total: Duration) {
        if let Some(m) = &self.0 {
            m.tasks[task_index(outcome)].inc();
            m.task_duration[outcome_index(outcome)].observe(total.as_secs_f64());
            if matches!(outcome, Outcome::Rejected(Rejection::RateLimited { .. })) {
                m.rejected_rate_limited.inc();
            }
        }
    }

    /// A retry scheduled.
    #[inline]
    pub(crate) fn retried(&self) {
        if let Some(m) = &self.0 {
            m.retries.inc();
        }
    }

    /// A retry refused by the budget.
    #[inline]
    pub(crate) fn budget_exhausted(&self) {
        if let Some(m) = &self.0 {
            m.budget_exhausted.inc();
        }
    }

    /// A task of `class` shed `Overloaded`, for `why`.
    #[inline]
    pub(crate) fn shed(&self, why: Shed, class: crate::Priority) {
        if let Some(m) = &self.0 {
            m.shed[why as usize * 3 + class.index()].inc();
        }
    }

    /// A hedged attempt sent.
    #[inline]
    pub(crate) fn hedged(&self) {
        if let Some(m) = &self.0 {
            m.hedges.inc();
        }
    }

    /// Tasks waiting in the queue now.
    #[inline]
    pub(crate) fn queue_depth(&self, n: usize) {
        if let Some(m) = &self.0 {
            m.queue_depth.set(n as i64);
        }
    }

    /// The service's endpoints by state now.
    /// `count` is called only when metrics are on.
    pub(crate) fn endpoints(&self, count: impl FnOnce() -> EndpointCounts) {
        if let Some(m) = &self.0 {
            let c = count();
            for (g, v) in m
                .endpoints
                .iter()
                .zip([c.healthy, c.unhealthy, c.inactive, c.open])
            {
                g.set(v);
            }
        }
    }

    /// Resolves (and creates at zero) the series of node `address`.
    pub(crate) fn node(&self, address: &str) -> PromNode {
        let Some(m) = &self.0 else {
            return PromNode(None);
        };
        let f = &m.families;
        let n = with(svc(&m.service), "node", address);
        let breaker_state: Vec<Gauge> = STATES
            .iter()
            .map(|st| {
                f.breaker_state
                    .get_or_create(&with(n.clone(), "state", st))
                    .clone()
            })
            .collect();
        // A node (re)starts closed.
        for (i, g) in breaker_state.iter().enumerate() {
            g.set(i64::from(i == 0));
        }
        PromNode(Some(Arc::new(NodeInner {
            in_flight: f.in_flight.get_or_create(&n).clone(),
            limit: f.limit.get_or_create(&n).clone(),
            classes: CLASSES
                .iter()
                .map(|c| {
                    f.upstream
                        .get_or_create(&with(n.clone(), "class", c))
                        .clone()
                })
                .collect(),
            duration: f.upstream_duration.get_or_create(&n).clone(),
            breaker_state,
            transitions: STATES
                .iter()
                .map(|st| {
                    f.breaker_transitions
                        .get_or_create(&with(n.clone(), "to", st))
                        .clone()
                })
                .collect(),
            rate_limited: f
                .rate_limited
                .get_or_create(&with(svc(&m.service), "scope", "node"))
                .clone(),
        })))
    }
}

struct LeasesInner {
    /// In [`LEASE_EVENTS`] order.
    events: Vec<Counter>,
    out: Gauge,
}

/// One service's lease series.
#[derive(Clone, Default)]
pub(crate) struct PromLeases(Option<Arc<LeasesInner>>);

impl PromLeases {
    /// A lease handed out; `out` are held now.
    pub(crate) fn granted(&self, out: usize) {
        if let Some(m) = &self.0 {
            m.events[0].inc();
            m.out.set(i64::try_from(out).unwrap_or(i64::MAX));
        }
    }

    /// A lease returned; `out` are held now.
    pub(crate) fn out(&self, out: usize) {
        if let Some(m) = &self.0 {
            m.out.set(i64::try_from(out).unwrap_or(i64::MAX));
        }
    }

    /// An outcome reported (`None`: ignored).
    pub(crate) fn outcome(&self, outcome: Option<&AttemptOutcome>) {
        if let Some(m) = &self.0 {
            m.events[lease_outcome_index(outcome)].inc();
        }
    }

    /// A lease dropped without an outcome.
    pub(crate) fn cancelled(&self) {
        if let Some(m) = &self.0 {
            m.events[4].inc();
        }
    }
}

struct NodeInner {
    in_flight: Gauge,
    limit: Gauge,
    classes: Vec<Counter>,
    duration: Histogram,
    breaker_state: Vec<Gauge>,
    transitions: Vec<Counter>,
    rate_limited: Counter,
}

/// One node's series (`Send + Sync`: nodes may run on other threads).
#[derive(Clone, Default)]
pub(crate) struct PromNode(Option<Arc<NodeInner>>);

impl PromNode {
    /// One attempt ended with `outcome` after `latency` (a cancelled
    /// hedge or a request not sent has no duration worth recording).
    #[inline]
    pub(crate) fn attempt(&self, outcome: &AttemptOutcome, latency: Duration) {
        if let Some(m) = &self.0 {
            m.classes[class_index(outcome)].inc();
            if !matches!(
                outcome,
                AttemptOutcome::Error(
                    ErrorKind::Cancelled
                        | ErrorKind::NotSent
                        | ErrorKind::Deadline
                        | ErrorKind::Throttled
                )
            ) {
                m.duration.observe(latency.as_secs_f64());
            }
        }
    }

    /// Requests in flight on the node now.
    #[inline]
    pub(crate) fn in_flight(&self, n: u32) {
        if let Some(m) = &self.0 {
            m.in_flight.set(i64::from(n));
        }
    }

    /// The node's concurrency limit now.
    #[inline]
    pub(crate) fn limit(&self, n: u32) {
        if let Some(m) = &self.0 {
            m.limit.set(i64::from(n));
        }
    }

    /// The breaker went from `from` to `to`.
    pub(crate) fn transition(&self, from: &BreakerState, to: &BreakerState) {
        if let Some(m) = &self.0 {
            m.breaker_state[state_index(from)].set(0);
            m.breaker_state[state_index(to)].set(1);
            m.transitions[state_index(to)].inc();
        }
    }

    /// The node's bucket refused a dispatch.
    #[inline]
    pub(crate) fn rate_limited(&self) {
        if let Some(m) = &self.0 {
            m.rate_limited.inc();
        }
    }
}

/// What holds `dispatch_*` families to register: a
/// [`Dispatcher`](crate::Dispatcher) (the one implementation).
pub trait Register {
    /// Registers its families in `registry`, as
    /// [`Dispatcher::register_metrics`](crate::Dispatcher::register_metrics).
    fn register_metrics(&self, registry: &mut Registry);
}

/// The OpenMetrics exposition of `dispatcher`'s metrics, ending with
/// `# EOF` ([`encode_as`] for the text format 0.0.4).
pub fn encode(dispatcher: &impl Register) -> String {
    let mut registry = Registry::default();
    dispatcher.register_metrics(&mut registry);
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// The exposition of `dispatcher`'s metrics in `format`.
pub fn encode_as(dispatcher: &impl Register, format: super::Format) -> String {
    match format {
        super::Format::OpenMetrics => encode(dispatcher),
        super::Format::Text => super::format::openmetrics_to_text(&encode(dispatcher)),
    }
}

/// The content type of [`encode`]'s text (OpenMetrics, which Prometheus
/// scrapes natively).
pub const CONTENT_TYPE: &str = super::format::OPENMETRICS_CONTENT_TYPE;
