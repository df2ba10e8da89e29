//! The wiring of one service's pipeline, in one place: the queue, its
//! balancer and the balancer's nodes. The queue and the balancer know each
//! other only as recipients of their protocol's messages
//! ([`BalancerPort`], `Recipient<BalancerTurn>`), so neither imports the
//! other.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use actix::prelude::*;

use super::balancer::BalancerActor;
use super::inbox::{Inbox, InboxReady, InboxSender};
use super::protocol::Submit;
use super::queue::{BalancerPort, QueueActor};
use crate::config::ServiceConfig;
use crate::transport::TransportFactory;

/// A running pipeline's handles.
pub(crate) struct Pipeline {
    pub queue: Addr<QueueActor>,
    pub balancer: Addr<BalancerActor>,
    /// Where submits go (the queue's inbox).
    pub inbox: InboxSender<Submit>,
}

/// Starts the queue, its balancer and the balancer's nodes (on `arbiters`,
/// round robin; on this thread if empty).
pub(crate) fn start(
    cfg: Arc<ServiceConfig>,
    factory: TransportFactory,
    ids: Arc<AtomicU64>,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    metrics: crate::metrics::ServiceMetrics,
) -> Pipeline {
    // The queue's context first, so that the balancer can be built with
    // the queue's address and the queue with the balancer's.
    let queue_ctx = Context::<QueueActor>::new();
    let queue_addr = queue_ctx.address();
    let bcfg = cfg.clone();
    let bmetrics = metrics.clone();
    let balancer = BalancerActor::create(move |bctx| {
        BalancerActor::new(
            bcfg,
            queue_addr.recipient(),
            factory,
            arbiters,
            bmetrics,
            bctx,
        )
    });
    let q = QueueActor::new(cfg, BalancerPort::of(&balancer), ids, metrics);
    let inbox: Arc<Inbox<Submit>> = q.inbox();
    let queue = queue_ctx.run(q);
    let inbox = InboxSender::new(&inbox, queue.clone().recipient::<InboxReady>());
    Pipeline {
        queue,
        balancer,
        inbox,
    }
}
