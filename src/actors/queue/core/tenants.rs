//! Tenants at the queue's edges: the flow a new task counts to (its
//! `offered`), its tenant's rate (`tenants.rate`), the sheds counted to
//! its tenant, and the per-tenant stats.
//! The fair order itself is the task table's ([`crate::algo::fair`]); the
//! bounded book of tenants is [`crate::algo::tenants`].

use std::time::Duration;

use tokio::time::Instant;

use super::{QueueCore, TaskNo};
use crate::algo::fair::Flow;
use crate::algo::tenants::{TenantBuckets, TenantsConfig};
use crate::outcome::Rejection;
use crate::stats::TenantStats;
use crate::task::Job;

/// The rate per tenant, as this queue checks it.
pub(crate) enum TenantLimits {
    /// No `tenants.rate`.
    Off,
    /// A local bucket per tracked tenant.
    Local(TenantBuckets),
}

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
        };
        if r.is_err() {
            if let Some(c) = self.tasks.tenant_counts(flow) {
                c.rate_limited += 1;
            }
        }
        r
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
