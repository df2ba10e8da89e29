//! [`Dispatcher::lease`]: an endpoint lent to the caller's own client (see
//! [`crate::lease`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Dispatcher;
use crate::lease::{Lease, LeaseHand, LeaseOptions};
use crate::outcome::{FailReason, Outcome, Rejection};
use crate::task::Task;

impl Dispatcher {
    /// Borrows one endpoint of `service`, picked by the service's mode
    /// (round robin, weighted, p2c, ... as for its HTTP tasks), for the
    /// caller's own client: a gRPC channel, a websocket, a database
    /// connection, an HTTP client of its own ([`Lease::client`]).
    ///
    /// The lease waits in the queue as a task does and is admitted the
    /// same way: queue capacity and `on_full`, the delay control and the
    /// priority classes (with the deadline, affinity key and class of
    /// `opts`), the node's `max_concurrent` or learned limit, its token
    /// bucket and breaker. It is refused with the same
    /// rejections ([`Rejection::QueueFull`], [`Rejection::CircuitOpen`],
    /// [`Rejection::RateLimited`], [`Rejection::Overloaded`],
    /// [`Rejection::DeadlinePassed`], ...; a service's fallback response
    /// does not apply: its reason is the error). The lease holds the node's
    /// slot until it is dropped; report the outcome with
    /// [`Lease::complete`] so the node's breaker, EWMA and limit learn
    /// from it. Dropping this future while it waits gives the lease up:
    /// its task still takes its turn, and the lease made for it is
    /// returned at once (cancelled, nothing counted at the node).
    pub async fn lease(&self, service: &str, opts: LeaseOptions) -> Result<Lease, Rejection> {
        let Some(h) = self.handle(service) else {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Rejection::UnknownService(service.to_owned()));
        };
        let hand = Arc::new(LeaseHand::new(h.leases.clone()));
        let task = Task::lease(&h.name, hand.clone(), opts);
        let result = self.submit(task).await;
        match result.outcome {
            Outcome::Success(_) => hand.take().ok_or_else(|| {
                Rejection::Internal("the node answered the lease without lending".into())
            }),
            Outcome::Rejected(why) | Outcome::Fallback { reason: why, .. } => Err(why),
            // Its time left was below what the service's calls take.
            Outcome::Failure(f) if f.reason == FailReason::DeadlineExceeded => {
                Err(Rejection::DeadlinePassed)
            }
            Outcome::Failure(f) => Err(Rejection::Internal(format!(
                "no endpoint was lent ({:?}{})",
                f.reason,
                f.last.map(|l| format!(", last: {l}")).unwrap_or_default()
            ))),
        }
    }
}
