//! Tenants at the queue's edges: the flow a new task counts to (its
//! `offered`), the sheds counted to its tenant, and the per-tenant stats.
//! The fair order itself is the task table's ([`crate::algo::fair`]); the
//! bounded book of tenants is [`crate::algo::tenants`].

use super::{QueueCore, TaskNo};
use crate::algo::fair::Flow;
use crate::outcome::Rejection;
use crate::stats::TenantStats;
use crate::task::Job;

impl QueueCore {
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
            })
            .collect()
    }
}
