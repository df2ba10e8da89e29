//! `Credit`: the balancer's ledger of the routes the queue may send.
//!
//! The balancer tells the queue how many routes it may send ([`Room`]'s
//! credit); the ledger counts what is out, so that a grant only adds what
//! the nodes' room allows beyond it. A route that arrives spends one; a
//! route held for a shared store's answer is refunded (it still counts as
//! out until it is placed or bounced, when it is spent again). Hedges are
//! never granted and never spend. This type is the only writer of the
//! count.
//!
//! [`Room`]: super::protocol::Room

/// Credit handed to the queue and not yet used.
#[derive(Debug, Default)]
pub(crate) struct Credit {
    out: usize,
}

impl Credit {
    /// Hands out what `cap` (the room the nodes have now) allows beyond the
    /// credit already out; returns the new credit (zero when none).
    pub(crate) fn grant(&mut self, cap: usize) -> usize {
        if cap > self.out {
            let more = cap - self.out;
            self.out = cap;
            more
        } else {
            0
        }
    }

    /// A route sent with credit arrived (or a held one was bounced): one
    /// credit used. A route beyond the credit (none is sent) leaves it at
    /// zero.
    pub(crate) fn spend(&mut self) {
        if self.out > 0 {
            self.out -= 1;
        }
    }

    /// A route that spent its credit waits for the shared store's answer:
    /// it counts as out again until it is placed or bounced.
    pub(crate) fn refund(&mut self) {
        self.out += 1;
    }

    /// Credit out now.
    #[cfg(test)]
    pub(crate) fn out(&self) -> usize {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_granted_once_and_spent_routes_are_granted_again() {
        let mut c = Credit::default();
        assert_eq!(c.grant(3), 3);
        // The same room again: nothing new.
        assert_eq!(c.grant(3), 0);
        assert_eq!(c.grant(2), 0);
        assert_eq!(c.out(), 3);
        c.spend();
        assert_eq!(c.out(), 2);
        assert_eq!(c.grant(3), 1);
        // A held route counts as out again; its bounce spends it.
        c.refund();
        assert_eq!(c.out(), 4);
        assert_eq!(c.grant(4), 0);
        c.spend();
        assert_eq!(c.grant(4), 1);
        // Spending past zero stays at zero.
        let mut empty = Credit::default();
        empty.spend();
        assert_eq!(empty.out(), 0);
        assert_eq!(empty.grant(1), 1);
    }
}
