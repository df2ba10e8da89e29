//! Smooth weighted round robin, as in nginx.
//!
//! Plain weighted round robin sends a node of weight 5 five requests in a
//! row; nginx's smooth variant (`ngx_http_upstream_get_peer` in
//! `ngx_http_upstream_round_robin.c`) interleaves them instead, so weights
//! 5, 1, 1 give `a a b a c a a`. At every pick, for each eligible node:
//! `current += weight` and `total += weight`; the node with the highest
//! `current` wins (the first one on ties) and its `current -= total`.
//! Over any window of `total` picks with a steady pool every node gets exactly
//! its weight, and all current weights return to zero.
//!
//! The weight is read from the [`Candidate`] at every pick, so slow start and
//! reweighting apply at once. Ineligible nodes are skipped and keep their
//! current weight. Current weights are stored per node and survive
//! [`Strategy::rebuild`] for members whose key survives; new members start
//! at 0.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let mut swrr = SmoothWeighted::new();
//! let nodes = vec![Candidate::new(5, 10), Candidate::new(1, 10), Candidate::new(1, 10)];
//! let picks: Vec<_> = (0..7).map(|_| swrr.pick(&nodes, None).unwrap()).collect();
//! assert_eq!(picks, [0, 0, 1, 0, 2, 0, 0]);
//! # }
//! ```

use std::collections::HashMap;

use super::{Candidate, Member, Strategy};

/// nginx's smooth weighted round robin.
#[derive(Debug, Clone, Default)]
pub struct SmoothWeighted {
    /// Current weight per node, by index.
    current: Vec<i64>,
    /// Member key per node, by index, to carry `current` across rebuilds.
    keys: Vec<String>,
}

impl SmoothWeighted {
    /// A new balancer with every current weight at 0.
    pub fn new() -> Self {
        SmoothWeighted::default()
    }

    /// The current weight of every node, by index (for tests and metrics).
    #[cfg(any(test, feature = "internals"))]
    pub fn current_weights(&self) -> &[i64] {
        &self.current
    }
}

impl Strategy for SmoothWeighted {
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str {
        "weighted"
    }

    fn rebuild(&mut self, members: &[Member]) {
        let old: HashMap<&str, i64> = self
            .keys
            .iter()
            .map(String::as_str)
            .zip(self.current.iter().copied())
            .collect();
        let current = members
            .iter()
            .map(|m| old.get(m.key.as_str()).copied().unwrap_or(0))
            .collect();
        self.current = current;
        self.keys = members.iter().map(|m| m.key.clone()).collect();
    }

    fn pick(&mut self, nodes: &[Candidate], _affinity: Option<u64>) -> Option<usize> {
        // Without a matching rebuild, extra nodes start at 0.
        self.current.resize(nodes.len(), 0);
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for (i, node) in nodes.iter().enumerate() {
            if !node.eligible {
                continue;
            }
            let weight = i64::from(node.weight.max(1));
            self.current[i] += weight;
            total += weight;
            match best {
                Some(b) if self.current[b] >= self.current[i] => {}
                _ => best = Some(i),
            }
        }
        let best = best?;
        self.current[best] -= total;
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(weights: &[u32]) -> Vec<Candidate> {
        weights.iter().map(|&w| Candidate::new(w, 10)).collect()
    }

    fn members(weights: &[u32], keys: &[&str]) -> Vec<Member> {
        keys.iter()
            .zip(weights)
            .map(|(k, &w)| Member {
                key: (*k).to_string(),
                weight: w,
            })
            .collect()
    }

    #[test]
    fn nginx_sequence_5_1_1() {
        let mut s = SmoothWeighted::new();
        s.rebuild(&members(&[5, 1, 1], &["a", "b", "c"]));
        let n = nodes(&[5, 1, 1]);
        let got: Vec<usize> = (0..7).map(|_| s.pick(&n, None).unwrap()).collect();
        assert_eq!(got, [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(s.current_weights(), [0, 0, 0]);
        // And the cycle repeats exactly.
        let again: Vec<usize> = (0..7).map(|_| s.pick(&n, None).unwrap()).collect();
        assert_eq!(again, got);
    }

    #[test]
    fn hundred_picks_3_2_1() {
        let mut s = SmoothWeighted::new();
        let n = nodes(&[3, 2, 1]);
        let got: Vec<usize> = (0..100).map(|_| s.pick(&n, None).unwrap()).collect();
        // The cycle is a b a c b a; 100 = 16 cycles + a b a c.
        assert_eq!(got[..6], [0, 1, 0, 2, 1, 0]);
        let count = |i| got.iter().filter(|&&g| g == i).count();
        assert_eq!((count(0), count(1), count(2)), (50, 33, 17));
    }

    #[test]
    fn skips_ineligible_and_keeps_its_current() {
        let mut s = SmoothWeighted::new();
        let mut n = nodes(&[5, 1, 1]);
        s.pick(&n, None); // a: currents -2, 1, 1
        assert_eq!(s.current_weights(), [-2, 1, 1]);
        n[0].eligible = false;
        // Only b and c compete (total 2): b, then c.
        assert_eq!(s.pick(&n, None), Some(1));
        assert_eq!(s.current_weights(), [-2, 0, 2]);
        assert_eq!(s.pick(&n, None), Some(2));
        assert_eq!(s.current_weights(), [-2, 1, 1]);
        let none = vec![
            Candidate {
                eligible: false,
                ..Candidate::new(1, 1)
            };
            3
        ];
        assert_eq!(s.pick(&none, None), None);
        assert_eq!(s.current_weights(), [-2, 1, 1]);
    }

    #[test]
    fn weight_read_at_every_pick() {
        let mut s = SmoothWeighted::new();
        // Slow start: b at weight 1, then at full weight 5 like a.
        let slow = nodes(&[5, 1]);
        assert_eq!(s.pick(&slow, None), Some(0)); // 5-6=-1, 1
        let full = nodes(&[5, 5]);
        assert_eq!(s.pick(&full, None), Some(1)); // 4, 6-10=-4
        assert_eq!(s.current_weights(), [4, -4]);
    }

    #[test]
    fn rebuild_keeps_surviving_members() {
        let mut s = SmoothWeighted::new();
        s.rebuild(&members(&[5, 1, 1], &["a", "b", "c"]));
        s.pick(&nodes(&[5, 1, 1]), None);
        assert_eq!(s.current_weights(), [-2, 1, 1]);
        // b leaves, d joins in front.
        s.rebuild(&members(&[1, 5, 1], &["d", "a", "c"]));
        assert_eq!(s.current_weights(), [0, -2, 1]);
        s.rebuild(&[]);
        assert!(s.current_weights().is_empty());
    }
}
