//! The queue's way to its balancer: a port of recipients, so that a test
//! can put a stand-in balancer behind it.

use actix::prelude::*;

use super::super::balancer::BalancerActor;
use super::super::hedge::CancelTask;
use super::super::messages::*;

/// Where the queue's messages to its balancer go (a stand-in, in tests;
/// the balancer's [`QueuePort`](super::balancer::QueuePort) is the other way).
pub(crate) struct BalancerPort {
    pub route: Recipient<Route>,
    pub routes: Recipient<Routes>,
    pub cancel: Recipient<CancelTask>,
    pub lost: Recipient<AttemptLost>,
    pub stop: Recipient<Stop>,
}

impl BalancerPort {
    pub fn of(balancer: &Addr<BalancerActor>) -> Self {
        BalancerPort {
            route: balancer.clone().recipient(),
            routes: balancer.clone().recipient(),
            cancel: balancer.clone().recipient(),
            lost: balancer.clone().recipient(),
            stop: balancer.clone().recipient(),
        }
    }
}

/// A message the queue sends its balancer, and the port's way for it.
pub(crate) trait ToBalancer: Message<Result = ()> + Send + Sized + 'static {
    fn to(port: &BalancerPort) -> &Recipient<Self>;
}

impl ToBalancer for Route {
    fn to(port: &BalancerPort) -> &Recipient<Self> {
        &port.route
    }
}

impl ToBalancer for Routes {
    fn to(port: &BalancerPort) -> &Recipient<Self> {
        &port.routes
    }
}

impl ToBalancer for CancelTask {
    fn to(port: &BalancerPort) -> &Recipient<Self> {
        &port.cancel
    }
}

impl ToBalancer for AttemptLost {
    fn to(port: &BalancerPort) -> &Recipient<Self> {
        &port.lost
    }
}
