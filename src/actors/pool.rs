//! A living pool: runtime membership changes and active health checks.
//!
//! Changes arrive as messages to the balancer (the [`crate::Dispatcher`] has
//! methods that send them): add an endpoint, remove one, change a weight,
//! mark one active or inactive, reload the whole endpoint list (diffed by
//! address, so kept nodes keep their counters and breaker). A removed node
//! drains: it takes no new task, its attempts in flight finish and are
//! answered as usual, and it leaves the pool when idle. The strategy is
//! rebuilt from the new membership each time.
//!
//! Health checks, when configured, GET a path on every node each interval
//! (through the node's own transport); `unhealthy_threshold` failures in a
//! row take a node out, `healthy_threshold` successes bring it back.

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::balancer::BalancerActor;
use super::node::NodeActor;
use super::view::Health;
use crate::config::EndpointConfig;
pub use crate::pool::{PoolError, ReloadSummary};
use crate::transport::HttpRequest;

/// Adds an endpoint to the pool (it starts with slow start, if configured).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), PoolError>")]
pub struct AddEndpoint(pub EndpointConfig);

/// Removes an endpoint: it drains, then leaves.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), PoolError>")]
pub struct RemoveEndpoint(pub String);

/// Changes an endpoint's weight (clamped to 1..=100).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), PoolError>")]
pub struct SetWeight {
    /// Endpoint address.
    pub address: String,
    /// New weight.
    pub weight: i64,
}

/// Marks an endpoint active (takes traffic) or inactive.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), PoolError>")]
pub struct SetActive {
    /// Endpoint address.
    pub address: String,
    /// Whether it takes traffic.
    pub active: bool,
}

/// Replaces the endpoint list, diffed by address.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<ReloadSummary, PoolError>")]
pub struct ReloadEndpoints(pub Vec<EndpointConfig>);

/// Stops one node's actor as a fault drill (its supervisor restarts it).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), PoolError>")]
pub struct CrashNode(pub String);

/// Node: GET `path` under `timeout`; answers whether it gave 2xx/3xx.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct HealthProbe {
    pub path: String,
    pub timeout: Duration,
}

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

impl BalancerActor {
    fn find(&self, address: &str) -> Result<usize, PoolError> {
        let a = crate::config::normalize_address(address).unwrap_or_else(|_| address.to_owned());
        self.nodes
            .iter()
            .position(|n| &*n.address == a.as_str() && !n.draining)
            .ok_or(PoolError::UnknownEndpoint(address.to_owned()))
    }

    fn add(&mut self, ep: EndpointConfig, ctx: &mut Context<Self>) -> Result<(), PoolError> {
        let ep = normalize(&ep)?;
        if self.find(&ep.address).is_ok() {
            return Err(PoolError::Duplicate(ep.address));
        }
        log::info!("service {}: endpoint {} added", self.service, ep.address);
        self.spawn_node(&ep, ctx, true);
        self.rebuild_strategy();
        Ok(())
    }

    fn remove(&mut self, i: usize) {
        debug_assert!(self.live_count() > 1);
        let n = self.nodes.node(i);
        log::info!(
            "service {}: endpoint {} removed; draining {} request(s) in flight",
            self.service,
            n.address,
            n.in_flight
        );
        self.nodes.update(i, Instant::now(), |n| n.draining = true);
        if self.nodes.node(i).in_flight == 0 {
            self.finish_removal(i);
        }
    }

    /// A drained node leaves the pool; its actor stops with its last address.
    pub(super) fn finish_removal(&mut self, i: usize) {
        let n = self.nodes.remove(i);
        if !n.outbox.is_empty() {
            n.addr.do_send(super::protocol::Dispatches(n.outbox));
        }
        log::info!(
            "service {}: endpoint {} left the pool",
            self.service,
            n.address
        );
        self.rebuild_strategy();
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

    fn set_active(&mut self, i: usize, active: bool) {
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
                n.ramp_from = Some(Instant::now());
            }
        }
    }

    fn live_count(&self) -> usize {
        self.nodes.iter().filter(|n| !n.draining).count()
    }

    /// One round of health checks.
    pub(super) fn run_health_checks(&mut self, ctx: &mut Context<Self>) {
        let Some(hc) = self.cfg.health_check.clone() else {
            return;
        };
        for n in self.nodes.iter().filter(|n| !n.draining) {
            let id = n.id;
            n.addr
                .send(HealthProbe {
                    path: hc.path.clone(),
                    timeout: hc.timeout,
                })
                .into_actor(self)
                .map(move |res, act, ctx| {
                    let ok = res.unwrap_or(false);
                    act.health_result(id, ok);
                    let now = Instant::now();
                    act.recompute_all(now);
                    act.settle(ctx, now);
                })
                .spawn(ctx);
        }
    }

    fn health_result(&mut self, id: super::protocol::NodeId, ok: bool) {
        let Some(hc) = self.cfg.health_check.clone() else {
            return;
        };
        let Some(i) = self.nodes.position(id) else {
            return;
        };
        let before = self.health_of(i);
        let n = self.nodes.node_mut(i);
        if ok {
            n.health_streak = (n.health_streak.0 + 1, 0);
        } else {
            n.health_streak = (0, n.health_streak.1 + 1);
        }
        let after = match before {
            Health::Unhealthy if n.health_streak.0 >= hc.healthy_threshold => Health::Healthy,
            Health::Unhealthy => Health::Unhealthy,
            _ if n.health_streak.1 >= hc.unhealthy_threshold => Health::Unhealthy,
            _ if ok => Health::Healthy,
            h => h,
        };
        if after == before {
            return;
        }
        n.health = after;
        let address = n.address.clone();
        match after {
            Health::Unhealthy => {
                log::warn!(
                    "service {}: node {address} failed {} health check(s) in a row; marked unhealthy",
                    self.service,
                    hc.unhealthy_threshold
                );
                let left = self
                    .nodes
                    .iter()
                    .filter(|n| n.active && !n.draining && n.health != Health::Unhealthy)
                    .count();
                if left == 0 {
                    log::warn!(
                        "service {}: every node is unhealthy; no node takes traffic until one recovers",
                        self.service
                    );
                }
            }
            Health::Healthy if before == Health::Unhealthy => {
                if self.cfg.balancer.slow_start.is_some() {
                    self.nodes.node_mut(i).ramp_from = Some(Instant::now());
                }
                log::info!(
                    "service {}: node {address} passed {} health check(s); back in service",
                    self.service,
                    hc.healthy_threshold
                );
            }
            _ => {}
        }
    }
}

/// Adds an endpoint.
impl Handler<AddEndpoint> for BalancerActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, msg: AddEndpoint, ctx: &mut Self::Context) -> Self::Result {
        self.add(msg.0, ctx)?;
        self.settle(ctx, Instant::now());
        Ok(())
    }
}

/// Removes (drains) an endpoint.
impl Handler<RemoveEndpoint> for BalancerActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, msg: RemoveEndpoint, ctx: &mut Self::Context) -> Self::Result {
        let i = self.find(&msg.0)?;
        if self.live_count() <= 1 {
            return Err(PoolError::LastEndpoint);
        }
        self.remove(i);
        self.settle(ctx, Instant::now());
        Ok(())
    }
}

/// Changes a weight.
impl Handler<SetWeight> for BalancerActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, msg: SetWeight, ctx: &mut Self::Context) -> Self::Result {
        let i = self.find(&msg.address)?;
        self.set_weight(i, msg.weight);
        self.rebuild_strategy();
        self.settle(ctx, Instant::now());
        Ok(())
    }
}

/// Marks an endpoint active or inactive.
impl Handler<SetActive> for BalancerActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, msg: SetActive, ctx: &mut Self::Context) -> Self::Result {
        let i = self.find(&msg.address)?;
        self.set_active(i, msg.active);
        let now = Instant::now();
        self.recompute_all(now);
        self.settle(ctx, now);
        Ok(())
    }
}

/// Replaces the endpoint list, keeping the nodes whose address stays.
impl Handler<ReloadEndpoints> for BalancerActor {
    type Result = Result<ReloadSummary, PoolError>;

    fn handle(&mut self, msg: ReloadEndpoints, ctx: &mut Self::Context) -> Self::Result {
        if msg.0.is_empty() {
            return Err(PoolError::LastEndpoint);
        }
        let mut wanted = Vec::with_capacity(msg.0.len());
        for ep in &msg.0 {
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
                        n.addr
                            .do_send(super::protocol::NodeControl::SetMaxConcurrent(
                                ep.max_concurrent,
                            ));
                    }
                    self.nodes.node_mut(i).max_concurrent = ep.max_concurrent;
                    self.set_weight(i, ep.weight as i64);
                    self.set_active(i, ep.active);
                    if changed {
                        summary.updated.push(ep.address.clone());
                    } else {
                        summary.kept.push(ep.address.clone());
                    }
                }
                Err(_) => {
                    self.spawn_node(ep, ctx, true);
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
                self.remove(i);
                summary.removed.push(a);
            }
        }
        self.rebuild_strategy();
        self.settle(ctx, Instant::now());
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
}

/// Stops a node's actor; its supervisor restarts it.
impl Handler<CrashNode> for BalancerActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, msg: CrashNode, _ctx: &mut Self::Context) -> Self::Result {
        let i = self.find(&msg.0)?;
        self.nodes
            .node(i)
            .addr
            .do_send(super::protocol::NodeControl::Crash);
        Ok(())
    }
}

/// Runs one health check through the node's transport.
impl Handler<HealthProbe> for NodeActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: HealthProbe, _ctx: &mut Self::Context) -> Self::Result {
        let Some(t) = self.transport() else {
            return Box::pin(async { false });
        };
        let req = HttpRequest {
            method: awc::http::Method::GET,
            url: format!("{}{}", self.address(), msg.path),
            headers: Vec::new(),
            body: bytes::Bytes::new(),
            timeout: msg.timeout,
            max_body: 64 * 1024,
        };
        let fut = t.send(req);
        Box::pin(async move {
            matches!(
                tokio::time::timeout(msg.timeout, fut).await,
                Ok(Ok(r)) if (200..400).contains(&r.status)
            )
        })
    }
}
