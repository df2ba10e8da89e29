//! Active health checks' verdicts: each interval, a GET of the configured
//! path on every node (the shell sends it; the node makes it through its
//! own transport); `unhealthy_threshold`
//! failures in a row take a node out, `healthy_threshold` successes bring
//! it back.

use actix::Addr;
use tokio::time::Instant;

use super::super::super::node::NodeActor;
use super::super::super::protocol::NodeId;
use super::super::super::view::Health;
use super::Placement;

impl Placement {
    /// The nodes to check this round (every node not draining).
    pub(crate) fn health_targets(&self) -> Vec<(NodeId, Addr<NodeActor>)> {
        self.nodes
            .iter()
            .filter(|n| !n.draining)
            .map(|n| (n.id, n.addr.clone()))
            .collect()
    }

    /// One node's health check answered (`ok`: it passed).
    pub(crate) fn on_health(&mut self, id: NodeId, ok: bool, now: Instant) {
        self.health_result(id, ok, now);
        self.recompute_all(now);
        self.settle(now);
    }

    fn health_result(&mut self, id: NodeId, ok: bool, now: Instant) {
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
                    self.nodes.node_mut(i).ramp_from = Some(now);
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
