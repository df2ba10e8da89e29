//! `Credit`: the one ledger of the routes the queue may send, kept on both
//! sides of the pipe.
//!
//! The balancer tells the queue how many routes it may send ([`Room`]'s
//! credit). On the balancer's side the ledger counts what is out, so that a
//! grant only adds what the nodes' room allows beyond it ([`Credit::grant`]);
//! a route that arrives spends one, and a route held for a shared store's
//! answer is refunded (it still counts as out until it is placed or
//! bounced, when it is spent again). On the queue's side the same type is
//! the credit in hand ([`Credit::receive`]), with the headroom of it that
//! only top-class tasks may spend (`algo::headroom`); a route sent spends
//! one. Hedges are never granted and never spend. This type is the only
//! writer of either count.
//!
//! [`Room`]: super::protocol::Room

/// Credit out (the balancer's view) or in hand (the queue's), and the
/// headroom of it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Credit {
    out: usize,
    /// Of `out`, the headroom (the balancer may state more headroom than
    /// the credit in hand; only the credit can be spent). Zero on the
    /// balancer's side.
    reserve: usize,
}

impl Credit {
    /// The balancer's side: tops the credit out up to `cap` (the nodes'
    /// room); returns how much more that grants (0 when as much is out).
    pub(crate) fn grant(&mut self, cap: usize) -> usize {
        if cap > self.out {
            let more = cap - self.out;
            self.out = cap;
            more
        } else {
            0
        }
    }

    /// The queue's side: the balancer granted `more`, and states the
    /// headroom.
    pub(crate) fn receive(&mut self, more: usize, reserve: usize) {
        self.out = self.out.saturating_add(more);
        self.reserve = reserve;
    }

    /// A route spends one (none when none is out: a route the balancer
    /// did not count, such as a hedge).
    pub(crate) fn spend(&mut self) {
        if self.out > 0 {
            self.out -= 1;
        }
        self.reserve = self.reserve.min(self.out);
    }

    /// A route held back comes back to the ledger.
    pub(crate) fn refund(&mut self) {
        self.out += 1;
    }

    /// Credit out (balancer) or in hand (queue).
    pub(crate) fn in_hand(&self) -> usize {
        self.out
    }

    /// The headroom stated (may exceed what is in hand).
    pub(crate) fn reserve(&self) -> usize {
        self.reserve
    }

    /// Credit in hand beyond the headroom: what tasks below the top class
    /// may spend.
    pub(crate) fn beyond_reserve(&self) -> usize {
        self.out - self.reserve.min(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_granted_once_and_spent_routes_are_granted_again() {
        let mut c = Credit::default();
        assert_eq!(c.grant(3), 3);
        assert_eq!(c.grant(3), 0);
        assert_eq!(c.grant(2), 0);
        assert_eq!(c.in_hand(), 3);
        c.spend();
        assert_eq!(c.in_hand(), 2);
        assert_eq!(c.grant(3), 1);
        c.refund();
        assert_eq!(c.in_hand(), 4);
        assert_eq!(c.grant(4), 0);
        c.spend();
        assert_eq!(c.grant(4), 1);
        let mut empty = Credit::default();
        empty.spend();
        assert_eq!(empty.in_hand(), 0);
        assert_eq!(empty.grant(1), 1);
    }

    #[test]
    fn a_route_spends_credit_and_the_headroom_never_exceeds_what_is_left() {
        let mut c = Credit::default();
        c.receive(3, 2);
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (3, 2, 1));
        c.spend();
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (2, 2, 0));
        c.spend();
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (1, 1, 0));
        c.receive(0, 5);
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (1, 5, 0));
        c.receive(usize::MAX, 0);
        assert_eq!(c.in_hand(), usize::MAX, "saturates, never wraps");
    }
}
