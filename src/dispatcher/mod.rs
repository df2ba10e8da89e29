//! The [`Dispatcher`] handle: start the pipelines, submit, feed, observe, stop.
//!
//! One pipeline (QueueActor → BalancerActor → NodeActors) per service, all on
//! the arbiter that calls [`Dispatcher::start`]. The handle is `Clone + Send`:
//! it can be shared with actix-web handlers on other workers.
//!
//! The handle's work is split by concern: [`DispatcherBuilder`] and the start
//! (`builder.rs`), submitting and feeding tasks and the [`Submission`] future
//! (`submit.rs`), runtime pool changes and [`Dispatcher::reload`]
//! (`pool.rs`), [`Dispatcher::lease`] (`lease.rs`), [`Dispatcher::shutdown`]
//! (`shutdown.rs`) and the durable task
//! streams (`stream.rs`, feature `redis`). This file holds the handle's
//! state, the start and rebuild of one pipeline, and the observers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use actix::{Addr, Recipient};

use crate::actors::protocol::*;
use crate::actors::{BalancerActor, QueueActor};
use crate::config::ServiceConfig;
use crate::stats::{ServiceStats, Stats};
use crate::task::Task;
use crate::transport::TransportFactory;

mod builder;
mod lease;
mod pool;
mod shutdown;
#[cfg(feature = "redis")]
mod stream;
mod submit;

#[cfg(feature = "metrics")]
impl crate::metrics::Register for Dispatcher {
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        Dispatcher::register_metrics(self, registry);
    }
}

#[cfg(test)]
mod tests;

pub use crate::task::Submission;
pub use crate::task::Unfinished;
pub use builder::{DispatcherBuilder, StartError};
#[cfg(feature = "internals")]
pub use pool::DrillTarget;
pub use pool::ReloadReport;
pub use shutdown::ShutdownReport;

pub(crate) struct ServiceHandle {
    pub name: Arc<str>,
    pub cfg: Arc<ServiceConfig>,
    pub queue: Addr<QueueActor>,
    /// Where `submit` puts tasks for the queue (one message per burst).
    pub inbox: crate::actors::inbox::InboxSender<Submit>,
    pub balancer: Addr<BalancerActor>,
    /// Set once a rebuild of this (dead) pipeline is under way.
    pub rebuilding: AtomicBool,
    /// The service's leases ([`Dispatcher::lease`]).
    pub leases: Arc<crate::lease::LeaseBook>,
}

impl ServiceHandle {
    /// Whether the pipeline's queue and balancer are both alive.
    fn alive(&self) -> bool {
        self.queue.connected() && self.balancer.connected()
    }
}

/// The services by name, looked up on every submit ([`crate::FastMap`]:
/// SipHash took about 260 instructions per submit, callgrind).
pub(super) type Services = crate::FastMap<String, Arc<ServiceHandle>>;

struct Inner {
    services: RwLock<Services>,
    order: RwLock<Vec<String>>,
    factory: TransportFactory,
    ids: Arc<AtomicU64>,
    refused: AtomicU64,
    closed: AtomicBool,
    /// Threads that run node actors (see [`DispatcherBuilder::node_threads`]).
    node_threads: std::sync::Mutex<Vec<actix::Arbiter>>,
    /// The arbiter `start` ran on: every pipeline runs there, whoever starts
    /// it (a reload may come from an actix-web worker, which can stop).
    home: actix::dev::ArbiterHandle,
    /// The Prometheus families (zero-sized without the `metrics` feature).
    metrics: crate::metrics::Families,
    /// The Redis connection shared limits and breakers go through.
    #[cfg(feature = "redis")]
    shared: Option<crate::redis::SharedLimits>,
    /// The durable task streams consumed ([`Dispatcher::consume`]).
    #[cfg(feature = "redis")]
    streams: crate::redis::stream::Streams,
}

/// Handle to a running engine. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

impl Dispatcher {
    fn start_service(&self, svc: ServiceConfig) {
        let cfg = Arc::new(svc);
        let arbiters = self
            .inner
            .node_threads
            .lock()
            .expect("lock")
            .iter()
            .map(|a| a.handle())
            .collect();
        let crate::actors::pipeline::Pipeline {
            queue,
            balancer,
            inbox,
        } = crate::actors::pipeline::start(
            cfg.clone(),
            self.inner.factory.clone(),
            self.inner.ids.clone(),
            arbiters,
            self.inner.metrics.service(&cfg.name),
        );
        #[cfg(feature = "redis")]
        if let Some(s) = &self.inner.shared {
            balancer.do_send(crate::actors::share::UseShared(Arc::new(s.clone())));
            if cfg.tenants.shared {
                let store: Arc<dyn crate::actors::share::TenantStore> = Arc::new(s.clone());
                queue.do_send(crate::actors::protocol::UseTenantStore(store));
            }
        }
        let name = cfg.name.clone();
        #[cfg(not(feature = "tls"))]
        for ep in cfg
            .endpoints
            .iter()
            .filter(|e| e.address.starts_with("https:"))
        {
            log::warn!(
                "service {name}: endpoint {}: this build has no TLS (cargo feature `tls`); \
                 attempts to it will fail to connect",
                ep.address
            );
        }
        log::info!(
            "service {name}: started, mode {:?}, {} endpoint(s)",
            cfg.mode,
            cfg.endpoints.len()
        );
        // Keyed lower-cased: names match case-insensitively, as the seed's.
        self.inner.services.write().expect("lock").insert(
            name.to_lowercase(),
            Arc::new(ServiceHandle {
                name: name.as_str().into(),
                cfg,
                queue,
                inbox,
                balancer,
                rebuilding: AtomicBool::new(false),
                leases: Arc::new(crate::lease::LeaseBook::new(
                    name.as_str().into(),
                    self.inner.metrics.leases(&name),
                )),
            }),
        );
        let mut order = self.inner.order.write().expect("lock");
        if !order.contains(&name) {
            order.push(name);
        }
    }

    /// A dead pipeline (its balancer or queue stopped: a bug inside the
    /// engine) is logged at `error`, its tasks are answered `Internal`, and
    /// a new pipeline is started from the service's config on the
    /// dispatcher's arbiter, once. Endpoint changes made at runtime since
    /// the start or the last reload are not carried over.
    fn rebuild(&self, h: &Arc<ServiceHandle>) {
        if h.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!(
            "service {}: its pipeline has stopped (a bug inside the engine); rebuilding it",
            h.name
        );
        h.queue.do_send(PipelineDown(
            "the service's pipeline stopped; it is being rebuilt",
        ));
        let d = self.clone();
        let cfg = (*h.cfg).clone();
        if !self.inner.home.spawn_fn(move || d.start_service(cfg)) {
            log::error!(
                "dispatcher: its arbiter has stopped; service {} not rebuilt",
                h.name
            );
        }
    }

    /// The service named `service`, case-insensitively.
    pub(crate) fn handle(&self, service: &str) -> Option<Arc<ServiceHandle>> {
        let map = self.inner.services.read().expect("lock");
        map.get(service)
            .or_else(|| map.get(&service.to_lowercase()))
            .cloned()
    }

    /// Names of the services, in config order.
    pub fn service_names(&self) -> Vec<String> {
        self.inner.order.read().expect("lock").clone()
    }

    /// Where to send `service`'s tasks as actix messages: a [`Task`] sent to
    /// this recipient is answered with its [`crate::TaskResult`] exactly as
    /// [`Dispatcher::submit`] answers it (checked the same way; a task for
    /// another service is rejected). `None` for an unknown service. The
    /// recipient is the service's pipeline as it is now: after a rebuild of
    /// a dead pipeline, ask again.
    pub fn recipient(&self, service: &str) -> Option<Recipient<Task>> {
        self.handle(service).map(|h| h.queue.clone().recipient())
    }

    /// Registers the `dispatch_*` Prometheus families in the application's
    /// own `registry` (feature `metrics`; see [`crate::metrics`]). The
    /// series are updated in place by the pipelines, never by a message per
    /// task, so a scrape reads atomics and never waits on an actor.
    #[cfg(feature = "metrics")]
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.metrics.register(registry);
    }

    /// Counters of every service and the view of every node.
    pub async fn stats(&self) -> Stats {
        let handles: Vec<Arc<ServiceHandle>> = {
            let map = self.inner.services.read().expect("lock");
            self.service_names()
                .iter()
                .filter_map(|n| map.get(&n.to_lowercase()).cloned())
                .collect()
        };
        let mut services = Vec::with_capacity(handles.len());
        for h in handles {
            let queue = h.queue.send(GetQueueStats).await.unwrap_or_default();
            let nodes = h.balancer.send(GetNodeStats).await.unwrap_or_default();
            services.push(ServiceStats {
                name: h.cfg.name.clone(),
                mode: h.cfg.mode,
                queue,
                nodes,
                leases: h.leases.stats(),
                #[cfg(feature = "redis")]
                stream: self.inner.streams.stats(&h.cfg.name),
            });
        }
        Stats {
            services,
            refused: self.inner.refused.load(Ordering::Relaxed),
            #[cfg(feature = "redis")]
            shared: self.inner.shared.as_ref().map(|s| s.stats()),
        }
    }
}
