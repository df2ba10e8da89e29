//! Runs with tenants: each arrival names a tenant (or none), the same
//! engine and modelled backends as `run`, and the figures per tenant.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Instant, Outcome, Task};

use super::load::{arrivals, Arrivals};
use super::model::{BackendSpec, Backends};
use super::run::{Kind, Limit, Scenario};

/// One tenant's arrivals: a Poisson process at `rate` tasks per second.
#[derive(Debug, Clone)]
pub struct TenantLoad {
    pub name: String,
    pub rate: f64,
}

/// A run with tenants.
#[derive(Debug, Clone)]
pub struct TenantScenario {
    pub backends: Vec<BackendSpec>,
    pub tenants: Vec<TenantLoad>,
    pub length: Duration,
    /// Every task's deadline, from its arrival.
    pub deadline: Option<Duration>,
    /// Whether tasks name their tenant (else none does: the same arrivals
    /// without fair shares).
    pub named: bool,
    /// Extra service config (JSON members, each starting with a comma).
    pub extra: String,
}

/// One task's fate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRecord {
    pub tenant: usize,
    pub at: Duration,
    pub done: Duration,
    pub kind: Kind,
}

/// What a run left.
pub struct TenantRun {
    pub records: Vec<TenantRecord>,
    pub stats: actix_dispatch::ServiceStats,
}

/// Per tenant: offered, and successes within the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TenantFigures {
    pub offered: usize,
    pub in_time: usize,
    pub refused: usize,
}

impl TenantFigures {
    pub fn share_in_time(&self) -> f64 {
        self.in_time as f64 / self.offered.max(1) as f64
    }
}

/// Every arrival of `s` under `seed`, in time order: `(at, tenant)`.
pub fn tenant_arrivals(s: &TenantScenario, seed: u64) -> Vec<(Duration, usize)> {
    let mut all: Vec<(Duration, usize)> = s
        .tenants
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            arrivals(
                Arrivals::Poisson(t.rate),
                s.length,
                0.0,
                seed.wrapping_mul(1_000).wrapping_add(i as u64),
            )
            .into_iter()
            .map(move |a| (a.at, i))
        })
        .collect();
    all.sort_by_key(|&(at, i)| (at, i));
    all
}

/// Runs the engine through `s` (each node limited to its true worker
/// count). Must be called inside an actix system whose clock is paused.
pub async fn run_tenants(s: &TenantScenario, seed: u64) -> TenantRun {
    let list = tenant_arrivals(s, seed);
    let scenario = Scenario {
        name: "tenants".into(),
        backends: s.backends.clone(),
        arrivals: Arrivals::Constant(1.0),
        length: s.length,
        deadline: s.deadline,
        critical: 0.0,
        extra: s.extra.clone(),
    };
    let backends = Backends::start(&s.backends, seed);
    let d = Dispatcher::builder(scenario.config(Limit::True, seed))
        .transport(Backends::factory())
        .start()
        .expect("the dispatcher starts");
    let t0 = Instant::now();
    let records: Rc<RefCell<Vec<Option<TenantRecord>>>> =
        Rc::new(RefCell::new(vec![None; list.len()]));
    let mut jobs = Vec::with_capacity(list.len());
    for (i, &(at, tenant)) in list.iter().enumerate() {
        tokio::time::sleep_until(t0 + at).await;
        let mut task = Task::get("sim", format!("/{i}"));
        if let Some(dl) = s.deadline {
            task = task.deadline(t0 + at + dl);
        }
        if s.named {
            task = task.tenant(s.tenants[tenant].name.clone());
        }
        let sub = d.submit(task);
        let records = records.clone();
        jobs.push(actix_rt::spawn(async move {
            let r = sub.await;
            let kind = match r.outcome {
                Outcome::Success(_) => Kind::Success,
                Outcome::Rejected(_) => Kind::Refused,
                _ => Kind::Failure,
            };
            records.borrow_mut()[i] = Some(TenantRecord {
                tenant,
                at,
                done: t0.elapsed(),
                kind,
            });
        }));
    }
    for j in jobs {
        j.await.expect("a submit's task ran");
    }
    let stats = d.stats().await.services.remove(0);
    d.shutdown(Duration::from_secs(1)).await;
    drop(backends);
    let records = Rc::try_unwrap(records)
        .map(RefCell::into_inner)
        .unwrap_or_else(|r| r.borrow().clone())
        .into_iter()
        .map(|r| r.expect("every task answered"))
        .collect();
    TenantRun { records, stats }
}

/// The figures of each tenant of a run.
pub fn per_tenant(
    records: &[TenantRecord],
    tenants: usize,
    deadline: Option<Duration>,
) -> Vec<TenantFigures> {
    let mut out = vec![TenantFigures::default(); tenants];
    for r in records {
        let f = &mut out[r.tenant];
        f.offered += 1;
        if r.kind == Kind::Success && deadline.is_none_or(|d| r.done - r.at <= d) {
            f.in_time += 1;
        }
        if r.kind == Kind::Refused {
            f.refused += 1;
        }
    }
    out
}

/// A table of two runs' figures per tenant, side by side.
pub fn table(names: &[String], fair: &[TenantFigures], plain: &[TenantFigures]) -> String {
    let mut s = String::from(
        "| tenant | offered | in time (fair) | share | in time (no tenants) | share |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (i, n) in names.iter().enumerate() {
        s.push_str(&format!(
            "| {n} | {} | {} | {:.1} % | {} | {:.1} % |\n",
            fair[i].offered,
            fair[i].in_time,
            100.0 * fair[i].share_in_time(),
            plain[i].in_time,
            100.0 * plain[i].share_in_time(),
        ));
    }
    s
}
