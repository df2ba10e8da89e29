//! [`Dispatcher::shutdown`]: close intake, drain for a grace period, answer
//! what is left, and report it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::{Dispatcher, ServiceHandle};
use crate::actors::protocol::*;
use crate::lease::LeaseOut;
use crate::stats::Stats;
use crate::task::Unfinished;

/// What [`Dispatcher::shutdown`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Whether everything finished within the grace period (leases
    /// returned too).
    pub drained: bool,
    /// Every task that was not finished (each also answered `ShuttingDown`).
    pub unfinished: Vec<Unfinished>,
    /// The leases still held when the grace period ended
    /// ([`Dispatcher::lease`]), oldest first. Their nodes have stopped:
    /// what they report now is dropped.
    pub leases_out: Vec<LeaseOut>,
    /// Final counters.
    pub stats: Stats,
}

impl Dispatcher {
    /// Stops intake, lets queued and in-flight tasks finish and held
    /// leases be returned for up to `grace`, then answers every remaining
    /// task `ShuttingDown`, stops the actors and returns the report (which
    /// lists those tasks and the leases still held).
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.inner.closed.store(true, Ordering::Release);
        let handles: Vec<Arc<ServiceHandle>> = self
            .inner
            .services
            .read()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        let mut drains = Vec::new();
        for h in &handles {
            h.queue.do_send(CloseIntake);
            let (tx, rx) = oneshot::channel();
            h.queue.do_send(Drain { reply: tx });
            drains.push(rx);
        }
        let leases: Vec<_> = handles.iter().map(|h| h.leases.clone()).collect();
        let returned = futures::future::join_all(leases.iter().map(|b| b.all_returned()));
        let drained = tokio::time::timeout(grace, async {
            futures::future::join_all(drains).await;
            returned.await;
        })
        .await
        .is_ok();
        let now = tokio::time::Instant::now();
        let leases_out: Vec<LeaseOut> = leases.iter().flat_map(|b| b.held(now)).collect();
        let mut unfinished = Vec::new();
        for h in &handles {
            if let Ok(left) = h.queue.send(Abort).await {
                unfinished.extend(left);
            }
        }
        // Every task answered: the stream's result writes finish.
        #[cfg(feature = "redis")]
        self.inner.streams.settle().await;
        let stats = self.stats().await;
        for h in &handles {
            h.queue.do_send(Stop);
        }
        for a in self.inner.node_threads.lock().expect("lock").drain(..) {
            a.stop();
        }
        let done: u64 = stats
            .services
            .iter()
            .map(|s| s.queue.succeeded + s.queue.failed)
            .sum();
        let submitted: u64 = stats.services.iter().map(|s| s.queue.submitted).sum();
        log::info!(
            "dispatcher shut down: {} submitted, {} finished, {} unfinished, {} lease(s) held{}",
            submitted,
            done,
            unfinished.len(),
            leases_out.len(),
            if drained {
                ""
            } else {
                " (grace period ran out)"
            }
        );
        ShutdownReport {
            drained,
            unfinished,
            leases_out,
            stats,
        }
    }
}
