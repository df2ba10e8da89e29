//! A living pool: runtime membership changes.
//!
//! Changes arrive as messages to the balancer (the [`crate::Dispatcher`] has
//! methods that send them): add an endpoint, remove one, change a weight,
//! mark one active or inactive, reload the whole endpoint list (diffed by
//! address, so kept nodes keep their counters and breaker). A removed node
//! drains: it takes no new task, its attempts in flight finish and are
//! answered as usual, and it leaves the pool when idle. The strategy is
//! rebuilt from the new membership each time.

use tokio::time::Instant;

use super::{Effect, Placement};
use crate::actors::protocol::{self, PoolChange};
use crate::config::EndpointConfig;
use crate::pool::{PoolError, ReloadSummary};

fn normalize(ep: &EndpointConfig) -> Result<EndpointConfig, PoolError> {
    let address =
        crate::config::normalize_address(&ep.address).map_err(|m| PoolError::Invalid {
            field: "address".into(),
            message: m,
        })?;
    if ep.max_concurrent == 0 {
        return Err(PoolError::Invalid {
            field: "max_concurrent".into(),
            message: "must be greater than zero".into(),
        });
    }
    Ok(EndpointConfig {
        address,
        weight: ep.weight.clamp(1, 100),
        ..ep.clone()
    })
}

impl Placement {
    fn find(&self, address: &str) -> Result<usize, PoolError> {
        let a = crate::config::normalize_address(address).unwrap_or_else(|_| address.to_owned());
        self.nodes
            .iter()
            .position(|n| &*n.address == a.as_str() && !n.draining)
            .ok_or(PoolError::UnknownEndpoint(address.to_owned()))
    }

    fn add(&mut self, ep: EndpointConfig, now: Instant) -> Result<(), PoolError> {
        let ep = normalize(&ep)?;
        if self.find(&ep.address).is_ok() {
            return Err(PoolError::Duplicate(ep.address));
        }
        log::info!("service {}: endpoint {} added", self.service, ep.address);
        self.spawn_node(&ep, true, now);
        self.rebuild_strategy(now);
        Ok(())
    }

    fn remove(&mut self, i: usize, now: Instant) {
        debug_assert!(self.live_count() > 1);
        let n = self.nodes.node(i);
        log::info!(
            "service {}: endpoint {} removed; draining {} request(s) in flight",
            self.service,
            n.address,
            n.in_flight
        );
        self.nodes.update(i, now, |n| n.draining = true);
        if self.nodes.node(i).in_flight == 0 {
            self.finish_removal(i, now);
        }
    }

    /// A drained node leaves the pool; its actor stops with its last address.
    pub(super) fn finish_removal(&mut self, i: usize, now: Instant) {
        let n = self.nodes.remove(i);
        if !n.outbox.is_empty() {
            let d = protocol::Dispatches(n.outbox.into());
            self.effect(Effect::Dispatches(n.addr, d));
        }
        log::info!(
            "service {}: endpoint {} left the pool",
            self.service,
            n.address
        );
        self.rebuild_strategy(now);
    }

    fn set_weight(&mut self, i: usize, weight: i64) {
        let w = crate::config::clamp_weight(&self.service, &self.nodes.node(i).address, weight);
        self.nodes.node_mut(i).weight = w;
        log::info!(
            "service {}: endpoint {} weight set to {w}",
            self.service,
            self.nodes.node(i).address
        );
    }

    fn set_active(&mut self, i: usize, active: bool, now: Instant) {
        let slow_start = self.cfg.balancer.slow_start.is_some();
        let n = self.nodes.node_mut(i);
        if n.active != active {
            log::info!(
                "service {}: endpoint {} marked {}",
                self.service,
                n.address,
                if active { "active" } else { "inactive" }
            );
            n.active = active;
            if active && slow_start {
                n.ramp_from = Some(now);
            }
        }
    }

    fn live_count(&self) -> usize {
        self.nodes.iter().filter(|n| !n.draining).count()
    }
}

impl Placement {
    /// Adds, removes, reweights, switches, reloads or crashes endpoints.
    pub(crate) fn on_pool_change(
        &mut self,
        msg: PoolChange,
        now: Instant,
    ) -> Result<ReloadSummary, PoolError> {
        let none = |r: Result<(), PoolError>| r.map(|()| ReloadSummary::default());
        match msg {
            PoolChange::Add(ep) => none(self.on_add(ep, now)),
            PoolChange::Remove(address) => none(self.on_remove(&address, now)),
            PoolChange::SetWeight { address, weight } => {
                none(self.on_set_weight(&address, weight, now))
            }
            PoolChange::SetActive { address, active } => {
                none(self.on_set_active(&address, active, now))
            }
            PoolChange::Reload(eps) => self.on_reload(eps, now),
            PoolChange::CrashNode(address) => {
                none(self.on_control(&address, protocol::NodeControl::Crash))
            }
            PoolChange::PanicNode(address) => {
                none(self.on_control(&address, protocol::NodeControl::Panic))
            }
        }
    }
}

impl Placement {
    /// Adds an endpoint.
    fn on_add(&mut self, ep: EndpointConfig, now: Instant) -> Result<(), PoolError> {
        self.add(ep, now)?;
        self.settle(now);
        Ok(())
    }

    /// Removes (drains) an endpoint.
    fn on_remove(&mut self, address: &str, now: Instant) -> Result<(), PoolError> {
        let i = self.find(address)?;
        if self.live_count() <= 1 {
            return Err(PoolError::LastEndpoint);
        }
        self.remove(i, now);
        self.settle(now);
        Ok(())
    }

    /// Changes a weight.
    fn on_set_weight(&mut self, address: &str, weight: i64, now: Instant) -> Result<(), PoolError> {
        let i = self.find(address)?;
        self.set_weight(i, weight);
        self.rebuild_strategy(now);
        self.settle(now);
        Ok(())
    }

    /// Marks an endpoint active or inactive.
    fn on_set_active(
        &mut self,
        address: &str,
        active: bool,
        now: Instant,
    ) -> Result<(), PoolError> {
        let i = self.find(address)?;
        self.set_active(i, active, now);
        self.recompute_all(now);
        self.settle(now);
        Ok(())
    }

    /// Replaces the endpoint list, keeping the nodes whose address stays.
    fn on_reload(
        &mut self,
        eps: Vec<EndpointConfig>,
        now: Instant,
    ) -> Result<ReloadSummary, PoolError> {
        if eps.is_empty() {
            return Err(PoolError::LastEndpoint);
        }
        let mut wanted = Vec::with_capacity(eps.len());
        for ep in &eps {
            let ep = normalize(ep)?;
            if wanted
                .iter()
                .any(|w: &EndpointConfig| w.address == ep.address)
            {
                return Err(PoolError::Duplicate(ep.address));
            }
            wanted.push(ep);
        }
        let mut summary = ReloadSummary::default();
        for ep in &wanted {
            match self.find(&ep.address) {
                Ok(i) => {
                    let n = self.nodes.node(i);
                    let changed = n.weight != ep.weight
                        || n.max_concurrent != ep.max_concurrent
                        || n.active != ep.active;
                    if n.max_concurrent != ep.max_concurrent {
                        let c = protocol::NodeControl::SetMaxConcurrent(ep.max_concurrent);
                        let addr = n.addr.clone();
                        self.effect(Effect::Control(addr, c));
                    }
                    self.nodes.node_mut(i).max_concurrent = ep.max_concurrent;
                    self.set_weight(i, ep.weight as i64);
                    self.set_active(i, ep.active, now);
                    if changed {
                        summary.updated.push(ep.address.clone());
                    } else {
                        summary.kept.push(ep.address.clone());
                    }
                }
                Err(_) => {
                    self.spawn_node(ep, true, now);
                    summary.added.push(ep.address.clone());
                }
            }
        }
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| !n.draining && !wanted.iter().any(|w| w.address == *n.address))
            .map(|n| n.address.to_string())
            .collect();
        for a in gone {
            if let Ok(i) = self.find(&a) {
                self.remove(i, now);
                summary.removed.push(a);
            }
        }
        self.rebuild_strategy(now);
        self.settle(now);
        log::info!(
            "service {}: endpoints reloaded: {} added, {} removed, {} updated, {} kept",
            self.service,
            summary.added.len(),
            summary.removed.len(),
            summary.updated.len(),
            summary.kept.len()
        );
        Ok(summary)
    }

    /// A fault drill for one node: stop it or make it panic (either way
    /// its supervisor restarts it).
    fn on_control(&mut self, address: &str, drill: protocol::NodeControl) -> Result<(), PoolError> {
        let i = self.find(address)?;
        let addr = self.nodes.node(i).addr.clone();
        self.effect(Effect::Control(addr, drill));
        Ok(())
    }
}
