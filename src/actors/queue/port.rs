//! The queue's way to its balancer: recipients, so that the queue does not
//! name the balancer's type and a test can put a stand-in behind it.

use actix::dev::ToEnvelope;
use actix::prelude::*;

use super::super::protocol::{QueueTurn, Stop};

/// Where the queue's messages to its balancer go.
pub(crate) struct BalancerPort {
    pub turn: Recipient<QueueTurn>,
    pub stop: Recipient<Stop>,
}

impl BalancerPort {
    pub fn of<A>(balancer: &Addr<A>) -> Self
    where
        A: Actor + Handler<QueueTurn> + Handler<Stop>,
        A::Context: ToEnvelope<A, QueueTurn> + ToEnvelope<A, Stop>,
    {
        BalancerPort {
            turn: balancer.clone().recipient(),
            stop: balancer.clone().recipient(),
        }
    }
}
