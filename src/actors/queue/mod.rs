//! The queue of one service: the continuous task stream, and the one place
//! where a task is answered.
//!
//! - [`QueueCore`](self::core::QueueCore) (`core/`) is the queue with no
//!   runtime: every task held, the counts, the ready lists, shedding,
//!   tenants, the credit mirror; each input comes with its `now`, and what
//!   it leads to (results, the balancer's turn, timers) is its output.
//! - [`QueueActor`] (`actor.rs`) is the shell: one file of handlers that
//!   read the clock, call the core and send its output.
//! - [`BalancerPort`] (`port.rs`) is the queue's way to its balancer.
//!
//! The core lives under the actor's module, not beside `algo`: it speaks
//! the pipeline's messages (`Submit`, `Route`, `QueueTurn`), so it belongs
//! to the actors, and `algo` stays free of them.

mod actor;
mod core;
mod port;
#[cfg(test)]
mod tests;

pub use self::actor::QueueActor;
pub(crate) use self::port::BalancerPort;
