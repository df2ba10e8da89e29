//! Active health checks: each interval, a GET of the configured path on
//! every node (through the node's own transport); `unhealthy_threshold`
//! failures in a row take a node out, `healthy_threshold` successes bring
//! it back.

use actix::prelude::*;
use tokio::time::Instant;

use super::super::protocol::HealthProbe;
use super::super::view::Health;
use super::BalancerActor;

impl BalancerActor {
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

    fn health_result(&mut self, id: crate::actors::protocol::NodeId, ok: bool) {
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
