//! The queue's mirror of the credit its balancer granted: how many routes
//! it may send now, and of those the headroom only top-class tasks may
//! spend (`algo::headroom`). The balancer grants (`Room`), a route spends.

/// Credit in hand and the headroom of it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(in crate::actors::queue) struct Credit {
    credit: usize,
    /// Of `credit`, the headroom (the balancer may state more headroom
    /// than the credit in hand; only the credit can be spent).
    reserve: usize,
}

impl Credit {
    /// The balancer granted `credit` more, and states the headroom.
    pub fn grant(&mut self, credit: usize, reserve: usize) {
        self.credit = self.credit.saturating_add(credit);
        self.reserve = reserve;
    }

    /// One route was sent: a top-class task sent out of the headroom
    /// spends it.
    pub fn spend(&mut self) {
        self.credit -= 1;
        self.reserve = self.reserve.min(self.credit);
    }

    /// Routes that may be sent now.
    pub fn in_hand(&self) -> usize {
        self.credit
    }

    /// The headroom stated.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Credit beyond the headroom: what any class may spend.
    pub fn beyond_reserve(&self) -> usize {
        self.credit - self.reserve.min(self.credit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_spends_credit_and_the_headroom_never_exceeds_what_is_left() {
        let mut c = Credit::default();
        c.grant(3, 2);
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (3, 2, 1));
        c.spend();
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (2, 2, 0));
        c.spend();
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (1, 1, 0));
        c.grant(0, 5);
        assert_eq!((c.in_hand(), c.reserve(), c.beyond_reserve()), (1, 5, 0));
        c.grant(usize::MAX, 0);
        assert_eq!(c.in_hand(), usize::MAX, "saturates, never wraps");
    }
}
