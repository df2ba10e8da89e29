//! Runtime pool changes: endpoints added, removed, weighted, switched on and
//! off, fault drills, and [`Dispatcher::reload`] of a whole config.

use tokio::sync::oneshot;

use super::Dispatcher;
use crate::actors::protocol::*;
use crate::actors::BalancerActor;
use crate::config::{Config, EndpointConfig, ServiceConfig};
use crate::pool::{PoolError, ReloadSummary};

/// What [`Dispatcher::reload`] changed.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Services started by the reload.
    pub started: Vec<String>,
    /// Services no longer in the config: their intake is closed, they drain and stop.
    pub stopped: Vec<String>,
    /// Endpoint changes of the services kept.
    pub changed: Vec<(String, ReloadSummary)>,
}

/// Which actor of a service's pipeline panics in a fault drill
/// ([`Dispatcher::fault_drill`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub enum DrillTarget {
    /// The queue (the panic is caught inside it).
    Queue,
    /// The balancer (it dies; the pipeline is rebuilt).
    Balancer,
}

/// A fault drill.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
enum Drill<'a> {
    /// Stop the node at this address.
    Restart(&'a str),
    /// Make the node at this address panic in a handler.
    PanicNode(&'a str),
    /// Make the queue or the balancer panic.
    Panic(DrillTarget),
}

impl Dispatcher {
    async fn ask<M>(&self, service: &str, msg: M) -> Result<M::Result, PoolError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        BalancerActor: actix::Handler<M>,
    {
        let h = self
            .handle(service)
            .ok_or_else(|| PoolError::UnknownService(service.to_owned()))?;
        h.balancer.send(msg).await.map_err(|_| PoolError::Stopped)
    }

    /// Adds an endpoint to `service` (it ramps up if slow start is on).
    pub async fn add_endpoint(
        &self,
        service: &str,
        endpoint: EndpointConfig,
    ) -> Result<(), PoolError> {
        self.ask(service, PoolChange::Add(endpoint))
            .await?
            .map(drop)
    }

    /// Removes an endpoint: no new task goes to it, its attempts in flight
    /// finish and are answered, then it leaves the pool.
    pub async fn remove_endpoint(&self, service: &str, address: &str) -> Result<(), PoolError> {
        self.ask(service, PoolChange::Remove(address.to_owned()))
            .await?
            .map(drop)
    }

    /// Changes an endpoint's weight (clamped to 1..=100).
    pub async fn set_weight(
        &self,
        service: &str,
        address: &str,
        weight: u32,
    ) -> Result<(), PoolError> {
        self.ask(
            service,
            PoolChange::SetWeight {
                address: address.to_owned(),
                weight: weight as i64,
            },
        )
        .await?
        .map(drop)
    }

    /// Marks an endpoint active (takes traffic) or inactive.
    pub async fn set_active(
        &self,
        service: &str,
        address: &str,
        active: bool,
    ) -> Result<(), PoolError> {
        self.ask(
            service,
            PoolChange::SetActive {
                address: address.to_owned(),
                active,
            },
        )
        .await?
        .map(drop)
    }

    /// Stops the actor of one node as a fault drill; its supervisor restarts
    /// it with its counters and breaker, and the restart is logged.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub async fn restart_node(&self, service: &str, address: &str) -> Result<(), PoolError> {
        self.drill(service, Drill::Restart(address)).await
    }

    /// Fault drill: makes the actor of one node panic inside a handler (not
    /// inside an attempt), as a bug in the node would. The panic is caught,
    /// logged, and the node restarted by its supervisor with its state and
    /// its attempts in flight.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub async fn node_fault_drill(&self, service: &str, address: &str) -> Result<(), PoolError> {
        self.drill(service, Drill::PanicNode(address)).await
    }

    /// Fault drill: makes the queue or the balancer of `service` panic, to
    /// check that no caller is left waiting (see `actors::drill`).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub async fn fault_drill(&self, service: &str, target: DrillTarget) -> Result<(), PoolError> {
        self.drill(service, Drill::Panic(target)).await
    }

    /// The fault drills' one path. Only the tests call it (through the
    /// methods above, behind `internals`); it is compiled in every build
    /// so that the actors' drill messages are the same in all of them.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    async fn drill(&self, service: &str, drill: Drill<'_>) -> Result<(), PoolError> {
        use crate::actors::drill::PanicDrill;
        let target = match drill {
            Drill::Restart(address) => {
                return self
                    .ask(service, PoolChange::CrashNode(address.to_owned()))
                    .await?
                    .map(drop)
            }
            Drill::PanicNode(address) => {
                return self
                    .ask(service, PoolChange::PanicNode(address.to_owned()))
                    .await?
                    .map(drop)
            }
            Drill::Panic(target) => target,
        };
        let h = self
            .handle(service)
            .ok_or_else(|| PoolError::UnknownService(service.to_owned()))?;
        match target {
            DrillTarget::Queue => h.queue.send(PanicDrill).await,
            // The balancer dies with the panic: its answer never comes.
            DrillTarget::Balancer => {
                h.balancer.do_send(PanicDrill);
                Ok(())
            }
        }
        .map_err(|_| PoolError::Stopped)
    }

    /// Starts a service on the dispatcher's own arbiter, whichever thread
    /// asks.
    async fn start_at_home(&self, svc: ServiceConfig) {
        let (tx, rx) = oneshot::channel();
        let d = self.clone();
        let sent = self.inner.home.spawn_fn(move || {
            d.start_service(svc);
            let _ = tx.send(());
        });
        if !sent || rx.await.is_err() {
            log::error!("dispatcher: its arbiter has stopped; a reloaded service was not started");
        }
    }

    /// Applies a new config: services are matched by name; the endpoints of
    /// a kept service are diffed by address (kept nodes keep their counters
    /// and breaker; removed ones drain); new services start; services gone
    /// from the config stop taking tasks, drain and stop. Other settings of a
    /// kept service stay as they were started. New services start on the
    /// arbiter that started the dispatcher, whichever thread calls this (an
    /// actix-web worker, say), and so outlive the caller.
    pub async fn reload(&self, config: Config) -> Result<ReloadReport, PoolError> {
        let mut report = ReloadReport::default();
        let wanted: Vec<String> = config
            .services
            .iter()
            .map(|s| s.name.to_lowercase())
            .collect();
        for svc in config.services {
            if self.handle(&svc.name).is_some() {
                let name = svc.name.clone();
                let summary = self.ask(&name, PoolChange::Reload(svc.endpoints)).await??;
                report.changed.push((name, summary));
            } else {
                report.started.push(svc.name.clone());
                self.start_at_home(svc).await;
            }
        }
        let gone: Vec<String> = self
            .service_names()
            .into_iter()
            .filter(|n| !wanted.contains(&n.to_lowercase()))
            .collect();
        for name in gone {
            let h = {
                let mut map = self.inner.services.write().expect("lock");
                self.inner
                    .order
                    .write()
                    .expect("lock")
                    .retain(|n| n != &name);
                map.remove(&name.to_lowercase())
            };
            if let Some(h) = h {
                log::info!("service {name}: removed from the config; draining");
                h.queue.do_send(CloseIntake);
                let (tx, rx) = oneshot::channel();
                h.queue.do_send(Drain { reply: tx });
                // On the dispatcher's arbiter too: the caller's may stop first.
                self.inner.home.spawn(async move {
                    let _ = rx.await;
                    h.queue.do_send(Stop);
                });
                report.stopped.push(name);
            }
        }
        Ok(report)
    }
}
