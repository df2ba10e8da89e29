//! Fault drills: make a pipeline actor panic on purpose, to show (and test)
//! that a bug inside the engine never leaves callers waiting. The queue's
//! handler of [`PanicDrill`] is with its others, in `queue/actor.rs`, the
//! balancer's in `balancer.rs`.
//!
//! A panic in the queue is caught where it happens: every task the queue
//! holds is answered `Internal` and the queue goes on. A panic in the
//! balancer kills it (actix does not restart panicking actors): the queue
//! finds it gone on its next send and answers its tasks, and the dispatcher
//! rebuilds the service's pipeline on the next submit (see
//! [`crate::Dispatcher::fault_drill`]).

pub(crate) use super::protocol::PanicDrill;
