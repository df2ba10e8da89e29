//! Active health checks: each interval, a GET of the configured path on
//! every node (through the node's own transport); `unhealthy_threshold`
//! failures in a row take a node out, `healthy_threshold` successes bring
//! it back.

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::super::node::NodeActor;
use super::super::view::Health;
use super::BalancerActor;
use crate::transport::HttpRequest;

/// Node: GET `path` under `timeout`; answers whether it gave 2xx/3xx.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct HealthProbe {
    pub path: String,
    pub timeout: Duration,
}

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

/// Runs one health check through the node's transport.
impl Handler<HealthProbe> for NodeActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: HealthProbe, ctx: &mut Self::Context) -> Self::Result {
        // A transport that panics on a probe fails the probe; the node
        // lives on.
        let failed = || -> ResponseFuture<bool> { Box::pin(async { false }) };
        self.guarded(ctx, failed, |act, _| act.probe(msg))
    }
}

impl NodeActor {
    /// Sends one health check; resolves to whether it answered 2xx/3xx.
    fn probe(&mut self, msg: HealthProbe) -> ResponseFuture<bool> {
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
        // A transport that panics fails the probe, as it fails an attempt.
        let Ok(fut) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.send(req))) else {
            return Box::pin(async { false });
        };
        Box::pin(async move {
            matches!(
                tokio::time::timeout(msg.timeout, fut).await,
                Ok(Ok(r)) if (200..400).contains(&r.status)
            )
        })
    }
}
