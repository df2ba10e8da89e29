//! Plain round robin: every eligible node in turn.
//!
//! The simplest fair strategy, and the right one for a pool of identical
//! nodes with uniform requests. A cursor remembers where the last pick ended;
//! the next pick scans from the cursor for the first eligible node and moves
//! the cursor just past it, so ineligible nodes are skipped without breaking
//! the rotation of the others. When every node is eligible a pick looks at one
//! node only; skipped nodes cost one step each.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let mut rr = RoundRobin::new();
//! let nodes = vec![Candidate::new(1, 4); 3];
//! let picks: Vec<_> = (0..4).map(|_| rr.pick(&nodes, None).unwrap()).collect();
//! assert_eq!(picks, [0, 1, 2, 0]);
//! # }
//! ```

use super::{Candidate, Member, Strategy};

/// Round robin over the eligible nodes, weights ignored.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    cursor: usize,
}

impl RoundRobin {
    /// A new rotation starting at node 0.
    pub fn new() -> Self {
        RoundRobin { cursor: 0 }
    }
}

impl Strategy for RoundRobin {
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str {
        "round_robin"
    }

    /// Keeps the cursor: it wraps onto the new pool size at the next pick.
    fn rebuild(&mut self, _members: &[Member]) {}

    fn pick(&mut self, nodes: &[Candidate], _affinity: Option<u64>) -> Option<usize> {
        let n = nodes.len();
        if n == 0 {
            return None;
        }
        // The cursor is below `n` unless the pool shrank: no division then.
        let start = if self.cursor < n {
            self.cursor
        } else {
            self.cursor % n
        };
        let index = (start..n).chain(0..start).find(|&i| nodes[i].eligible)?;
        self.cursor = if index + 1 < n { index + 1 } else { 0 };
        Some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(eligible: &[bool]) -> Vec<Candidate> {
        eligible
            .iter()
            .map(|&e| Candidate {
                eligible: e,
                ..Candidate::new(1, 4)
            })
            .collect()
    }

    fn picks(rr: &mut RoundRobin, nodes: &[Candidate], n: usize) -> Vec<Option<usize>> {
        (0..n).map(|_| rr.pick(nodes, None)).collect()
    }

    #[test]
    fn even_rotation() {
        let mut rr = RoundRobin::new();
        let got = picks(&mut rr, &nodes(&[true; 3]), 7);
        let want: Vec<_> = [0, 1, 2, 0, 1, 2, 0].into_iter().map(Some).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn skips_ineligible() {
        let mut rr = RoundRobin::new();
        let got = picks(&mut rr, &nodes(&[true, false, true, false]), 5);
        let want: Vec<_> = [0, 2, 0, 2, 0].into_iter().map(Some).collect();
        assert_eq!(got, want);
        // A node that becomes eligible again rejoins the rotation in place.
        let got = picks(&mut rr, &nodes(&[true; 4]), 5);
        let want: Vec<_> = [1, 2, 3, 0, 1].into_iter().map(Some).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn all_ineligible_is_none() {
        let mut rr = RoundRobin::new();
        assert_eq!(picks(&mut rr, &nodes(&[false; 3]), 2), vec![None, None]);
        assert_eq!(rr.pick(&[], None), None);
        // The cursor did not move.
        assert_eq!(rr.pick(&nodes(&[true; 3]), None), Some(0));
    }

    #[test]
    fn survives_rebuild_with_fewer_nodes() {
        let mut rr = RoundRobin::new();
        let five = nodes(&[true; 5]);
        assert_eq!(
            picks(&mut rr, &five, 4),
            vec![Some(0), Some(1), Some(2), Some(3)]
        );
        rr.rebuild(&[]);
        // The cursor (4) wraps onto a pool of 3: 4 % 3 = 1.
        let got = picks(&mut rr, &nodes(&[true; 3]), 4);
        assert_eq!(got, vec![Some(1), Some(2), Some(0), Some(1)]);
    }
}
