//! The actor shell: one pipeline per service.
//!
//! [`QueueActor`] (the task stream, retries, results) → [`BalancerActor`]
//! (node choice, credit) → one [`NodeActor`] per endpoint (the HTTP attempt,
//! load counters, breaker; its token bucket is the balancer's, see `share`). See `protocol` for the messages and `pipeline` for the wiring.

pub(crate) mod balancer;
pub(crate) mod credit;
pub mod drill;
pub(crate) mod hedge;
pub(crate) mod inbox;
pub(crate) mod node;
pub(crate) mod nodeset;
pub(crate) mod pipeline;

pub(crate) mod protocol;
pub(crate) mod queue;
pub(crate) mod share;
pub(crate) mod timers;
pub(crate) mod view;

pub use balancer::BalancerActor;
pub use queue::QueueActor;
