//! Zero-sized stand-ins: without the feature every update compiles away.

use super::*;

/// Zero-sized, but not a unit struct: built with `default()` like the real one.
#[derive(Clone, Default)]
pub(crate) struct Families {
    _none: (),
}

impl Families {
    pub(crate) fn disabled() -> Self {
        Self::default()
    }
    pub(crate) fn service(&self, _service: &str) -> ServiceMetrics {
        ServiceMetrics::default()
    }
    #[cfg(feature = "redis")]
    pub(crate) fn stream(&self, _service: &str) -> PromStream {
        PromStream
    }
    pub(crate) fn leases(&self, _service: &str) -> PromLeases {
        PromLeases
    }
}

#[derive(Clone, Default)]
pub(crate) struct PromLeases;

impl PromLeases {
    #[inline(always)]
    pub(crate) fn granted(&self, _out: usize) {}
    #[inline(always)]
    pub(crate) fn out(&self, _out: usize) {}
    #[inline(always)]
    pub(crate) fn outcome(&self, _outcome: Option<&AttemptOutcome>) {}
    #[inline(always)]
    pub(crate) fn cancelled(&self) {}
}

#[derive(Clone, Default)]
pub(crate) struct PromService;

impl PromService {
    #[inline(always)]
    pub(crate) fn task_finished(&self, _outcome: &Outcome, _total: Duration) {}
    #[inline(always)]
    pub(crate) fn retried(&self) {}
    #[inline(always)]
    pub(crate) fn budget_exhausted(&self) {}
    #[inline(always)]
    pub(crate) fn hedged(&self) {}
    #[inline(always)]
    pub(crate) fn shed(&self, _why: Shed, _class: crate::Priority) {}
    #[inline(always)]
    pub(crate) fn queue_depth(&self, _n: usize) {}
    #[inline(always)]
    pub(crate) fn endpoints(&self, _count: impl FnOnce() -> EndpointCounts) {}
    pub(crate) fn node(&self, _address: &str) -> PromNode {
        PromNode
    }
}

#[derive(Clone, Default)]
pub(crate) struct PromStream;

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl PromStream {
    #[inline(always)]
    pub(crate) fn entries(&self, _lag: u64, _pending: u64) {}
    #[inline(always)]
    pub(crate) fn event(&self, _event: StreamEvent, _n: u64) {}
}

#[derive(Clone, Default)]
pub(crate) struct PromNode;

impl PromNode {
    #[inline(always)]
    pub(crate) fn attempt(&self, _outcome: &AttemptOutcome, _latency: Duration) {}
    #[inline(always)]
    pub(crate) fn in_flight(&self, _n: u32) {}
    #[inline(always)]
    pub(crate) fn limit(&self, _n: u32) {}
    #[inline(always)]
    pub(crate) fn transition(&self, _from: &BreakerState, _to: &BreakerState) {}
    #[inline(always)]
    pub(crate) fn rate_limited(&self) {}
}
