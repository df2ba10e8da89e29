//! Tenants at the queue's edges: the flow a new task counts to (its
//! `offered`), its tenant's rate (`tenants.rate`), the sheds counted to
//! its tenant, and the per-tenant stats.
//! The fair order itself is the task table's ([`crate::algo::fair`]); the
//! bounded book of tenants is [`crate::algo::tenants`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{QueueCore, TaskNo};
use crate::actors::share::{Settings, TenantGranted, TenantLease};
use crate::algo::fair::Flow;
use crate::algo::tenants::{PerTenant, TenantBuckets, TenantsConfig};
use crate::config::BucketConfig;
use crate::outcome::Rejection;
use crate::stats::TenantStats;
use crate::task::Job;

/// The rate per tenant, as this queue checks it.
pub(crate) enum TenantLimits {
    /// No `tenants.rate`.
    Off,
    /// A local bucket per tracked tenant (also a shared rate's until the
    /// dispatcher hands the queue its store).
    Local(TenantBuckets),
    /// Each tracked tenant's bucket in the shared store, leased in batches
    /// (`tenants.shared`, see [`TenantLease`]).
    Shared(Box<SharedRates>),
}

/// The tracked tenants' leases of their shared buckets.
pub(crate) struct SharedRates {
    bucket: BucketConfig,
    settings: Settings,
    leases: PerTenant<TenantLease>,
    /// Calls to make.
    asks: Vec<TenantAsk>,
}

/// A call for a tenant's shared tokens: the tenant, its flow, the tokens
/// wanted.
pub(crate) type TenantAsk = (Arc<str>, Flow, u32);

impl TenantLimits {
    pub fn new(cfg: &TenantsConfig) -> Self {
        match cfg.rate {
            Some(r) => TenantLimits::Local(TenantBuckets::new(r)),
            None => TenantLimits::Off,
        }
    }
}

impl QueueCore {
    /// Takes a token of the rate of a new task's tenant (flow `flow`) at
    /// `now`; `Err(retry_after)` when the tenant is over it (counted to
    /// the tenant). Without `tenants.rate`, or for a task naming no tenant,
    /// no lookup is made.
    #[inline]
    pub(super) fn tenant_rate(
        &mut self,
        job: &Job,
        flow: Flow,
        now: Instant,
    ) -> Result<(), Duration> {
        if matches!(self.rates, TenantLimits::Off) || flow == crate::algo::tenants::UNNAMED {
            return Ok(());
        }
        self.tenant_rate_of(job, flow, now)
    }

    fn tenant_rate_of(&mut self, job: &Job, flow: Flow, now: Instant) -> Result<(), Duration> {
        let Some(key) = job.task.tenant_shared() else {
            return Ok(());
        };
        let r = match &mut self.rates {
            TenantLimits::Off => Ok(()),
            TenantLimits::Local(b) => b.take(flow, key, now),
            TenantLimits::Shared(s) => {
                let (bucket, settings) = (s.bucket, s.settings);
                match s.leases.get(flow, key, || TenantLease::new(now)) {
                    Some(l) => {
                        let c = l.check(bucket, &settings, now);
                        if let Some(want) = c.ask {
                            s.asks.push((key.clone(), flow, want));
                        }
                        c.admit
                    }
                    None => Ok(()),
                }
            }
        };
        if r.is_err() {
            if let Some(c) = self.tasks.tenant_counts(flow) {
                c.rate_limited += 1;
            }
        }
        r
    }

    /// The dispatcher's shared store, with its `settings`: a shared rate
    /// per tenant (`tenants.shared`) is leased from it from now on.
    pub fn use_tenant_store(&mut self, settings: Settings) {
        if let (true, Some(r)) = (self.cfg.tenants.shared, self.cfg.tenants.rate) {
            self.rates = TenantLimits::Shared(Box::new(SharedRates {
                bucket: BucketConfig::new(r.rate, r.burst),
                settings,
                leases: PerTenant::default(),
                asks: Vec::new(),
            }));
        }
    }

    /// The calls for tenants' tokens to make now (each tenant, its flow,
    /// the tokens wanted); the answers come back as [`TenantGranted`].
    pub fn tenant_asks(&mut self) -> Option<(BucketConfig, Vec<TenantAsk>)> {
        match &mut self.rates {
            TenantLimits::Shared(s) if !s.asks.is_empty() => {
                Some((s.bucket, std::mem::take(&mut s.asks)))
            }
            _ => None,
        }
    }

    /// The store's answer for a tenant, at `now`; dropped when the
    /// tenant's flow went to another tenant since.
    pub fn tenant_granted(&mut self, g: TenantGranted, now: Instant) {
        if let TenantLimits::Shared(s) = &mut self.rates {
            let (bucket, settings) = (s.bucket, s.settings);
            if let Some(l) = s.leases.find(g.flow, &g.tenant) {
                l.answered(g.got, bucket, &settings, g.live, g.asked, now);
            }
        }
    }

    /// The flow of a new task's tenant, counting the task offered. A task
    /// naming no tenant costs one branch.
    pub(super) fn offered(&mut self, job: &Job) -> Flow {
        let Some(key) = job.task.tenant_shared() else {
            return crate::algo::tenants::UNNAMED;
        };
        let f = self.tasks.flow_of_shared(key);
        if let Some(c) = self.tasks.tenant_counts(f) {
            c.offered += 1;
        }
        f
    }

    /// Counts a shed (`Overloaded`) of a task of `job`'s tenant.
    pub(super) fn count_tenant_shed(&mut self, job: &Job, reason: &Rejection) {
        if !matches!(reason, Rejection::Overloaded { .. }) {
            return;
        }
        let Some(key) = job.task.tenant_shared() else {
            return;
        };
        let f = self.tasks.flow_of_shared(key);
        if let Some(c) = self.tasks.tenant_counts(f) {
            c.shed += 1;
        }
    }

    /// Counts a shed (`Overloaded`) of queued task `no` to its tenant.
    pub(super) fn count_queued_shed(&mut self, no: TaskNo, reason: &Rejection) {
        if !matches!(reason, Rejection::Overloaded { .. }) {
            return;
        }
        if let Some(c) = self
            .tasks
            .flow_of_task(no)
            .and_then(|f| self.tasks.tenant_counts(f))
        {
            c.shed += 1;
        }
    }

    /// Each tracked tenant's counts, then the overflow queue's: at most
    /// `tenants.max_tracked + 1` rows, built when read.
    pub(super) fn tenant_stats(&self) -> Vec<TenantStats> {
        self.tasks
            .tenants()
            .counts()
            .map(|(key, c)| TenantStats {
                tenant: key.map(str::to_owned),
                offered: c.offered,
                served: c.served,
                shed: c.shed,
                rate_limited: c.rate_limited,
            })
            .collect()
    }
}
