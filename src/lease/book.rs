//! One service's leases ([`LeaseBook`]: counters, Prometheus series, the
//! leases held now) and the hand a lease's task carries to its node
//! ([`LeaseHand`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::{Lease, LeaseOut, LeaseStats};
use crate::outcome::AttemptOutcome;

// === impl LeaseHand ===

/// Where the node puts the lease for the caller: carried by the lease's
/// task. The caller takes it once the task is answered; a lease left in it
/// (the caller gave up waiting) is dropped with it, which frees the slot.
pub(crate) struct LeaseHand {
    lease: Mutex<Option<Lease>>,
    pub book: Arc<LeaseBook>,
}

impl LeaseHand {
    pub(crate) fn new(book: Arc<LeaseBook>) -> Self {
        Self {
            lease: Mutex::new(None),
            book,
        }
    }

    /// The node's lease for the caller. A second one (the task was sent
    /// twice) is dropped at once: cancelled, its slot freed.
    pub(crate) fn put(&self, lease: Lease) {
        let mut slot = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(lease);
        }
    }

    /// The lease, once the task is answered.
    pub(crate) fn take(&self) -> Option<Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl fmt::Debug for LeaseHand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseHand")
    }
}

// === impl LeaseBook ===

/// One service's leases: the counters of [`LeaseStats`], the Prometheus
/// series, and the leases held now (for the shutdown report).
pub(crate) struct LeaseBook {
    pub(super) service: Arc<str>,
    ids: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    ignored: AtomicU64,
    cancelled: AtomicU64,
    out: Mutex<crate::FastMap<u64, (Arc<str>, Instant)>>,
    /// Woken when the last lease held is returned.
    idle: tokio::sync::Notify,
    prom: crate::metrics::PromLeases,
}

impl LeaseBook {
    pub(crate) fn new(service: Arc<str>, prom: crate::metrics::PromLeases) -> Self {
        Self {
            service,
            ids: AtomicU64::new(0),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            ignored: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            out: Mutex::new(Default::default()),
            idle: tokio::sync::Notify::new(),
            prom,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::FastMap<u64, (Arc<str>, Instant)>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lease of `address` handed out at `now`: its id.
    pub(super) fn granted(&self, address: &Arc<str>, now: Instant) -> u64 {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let out = {
            let mut out = self.lock();
            out.insert(id, (address.clone(), now));
            out.len()
        };
        self.prom.granted(out);
        id
    }

    /// Lease `id` was returned (completed or dropped).
    pub(super) fn returned(&self, id: u64) {
        let out = {
            let mut out = self.lock();
            out.remove(&id);
            out.len()
        };
        self.prom.out(out);
        if out == 0 {
            self.idle.notify_waiters();
        }
    }

    pub(super) fn outcome(&self, outcome: Option<&AttemptOutcome>) {
        let counter = match outcome {
            None => &self.ignored,
            Some(o) if o.is_success() => &self.succeeded,
            Some(_) => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.prom.outcome(outcome);
    }

    pub(super) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        self.prom.cancelled();
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let out = self.lock().len() as u64;
        LeaseStats {
            granted: self.ids.load(Ordering::Relaxed),
            out,
            succeeded: self.succeeded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
        }
    }

    /// The leases held now, oldest first.
    pub(crate) fn held(&self, now: Instant) -> Vec<LeaseOut> {
        let mut out: Vec<_> = self
            .lock()
            .iter()
            .map(|(id, (address, since))| (*id, address.clone(), *since))
            .collect();
        out.sort_by_key(|(id, _, _)| *id);
        out.into_iter()
            .map(|(_, address, since)| LeaseOut {
                service: self.service.to_string(),
                address: address.to_string(),
                held: now.saturating_duration_since(since),
            })
            .collect()
    }

    /// Resolves once no lease is held.
    pub(crate) async fn all_returned(&self) {
        loop {
            let idle = self.idle.notified();
            futures::pin_mut!(idle);
            // Registered before the check: a return in between wakes it.
            idle.as_mut().enable();
            if self.lock().is_empty() {
                return;
            }
            idle.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ErrorKind;
    use std::time::Duration;

    #[test]
    fn the_book_counts_and_lists_what_is_held() {
        let book = LeaseBook::new("svc".into(), Default::default());
        let t0 = Instant::now();
        let (a, b): (Arc<str>, Arc<str>) = ("http://a/".into(), "http://b/".into());
        let first = book.granted(&a, t0);
        let second = book.granted(&b, t0 + Duration::from_secs(1));
        book.outcome(Some(&AttemptOutcome::Status(204)));
        book.outcome(Some(&AttemptOutcome::Error(ErrorKind::Timeout)));
        book.outcome(None);
        book.returned(first);
        let held = book.held(t0 + Duration::from_secs(3));
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].address, "http://b/");
        assert_eq!(held[0].held, Duration::from_secs(2));
        book.cancelled();
        book.returned(second);
        assert_eq!(
            book.stats(),
            LeaseStats {
                granted: 2,
                out: 0,
                succeeded: 1,
                failed: 1,
                ignored: 1,
                cancelled: 1,
            }
        );
    }

    #[tokio::test]
    async fn all_returned_resolves_when_the_last_one_is() {
        let book = Arc::new(LeaseBook::new("svc".into(), Default::default()));
        book.all_returned().await;
        let id = book.granted(&"http://a/".into(), Instant::now());
        let b = book.clone();
        let wait = tokio::spawn(async move { b.all_returned().await });
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        book.returned(id);
        wait.await.unwrap();
    }
}
