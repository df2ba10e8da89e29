//! Power of two choices on peak-EWMA cost.
//!
//! Picking the least-loaded node out of the whole pool needs a full scan and
//! makes every balancer herd onto the same node; picking at random ignores
//! load. Mitzenmacher's "power of two choices" draws two distinct nodes at
//! random and keeps the better one, which brings the maximum load down
//! exponentially compared with one random choice, in O(1). This is the
//! balancer of tower (`tower::balance::p2c` with the `PeakEwma` load), linkerd
//! and Finagle (`P2CPeakEwma`).
//!
//! The cost of a node, as in tower, is its peak-EWMA round-trip estimate times
//! its requests in flight plus one: `rtt_estimate * (in_flight + 1)`. When the
//! two drawn nodes have different weights the cost is divided by the weight,
//! so a node of weight 2 takes about twice the load of a node of weight 1;
//! with equal weights there is no division (the order would not change). The
//! lower cost wins; on a tie the first drawn node wins.
//!
//! Drawing is O(1) at any pool size: a random index is redrawn while it is
//! ineligible, up to [`MAX_TRIES`] times; only then (most nodes ineligible)
//! does it fall back to an O(n) uniform choice among the eligible nodes. Both
//! paths give every eligible node the same probability. With a single
//! eligible node, that node is picked.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let mut p2c = P2c::with_seed(7);
//! let mut nodes = vec![Candidate::new(1, 8); 2];
//! nodes[0].rtt_estimate = 0.3; // ten times slower
//! assert_eq!(p2c.pick(&nodes, None), Some(1));
//! # }
//! ```

use rand::{rngs::SmallRng, Rng, SeedableRng};

use super::{Candidate, Member, Strategy};

/// How many random indices a draw tries before scanning for eligible nodes.
pub const MAX_TRIES: usize = 8;

/// Power of two choices on `rtt_estimate * (in_flight + 1) / weight`.
#[derive(Debug, Clone)]
pub struct P2c {
    rng: SmallRng,
}

impl Default for P2c {
    fn default() -> Self {
        P2c::new()
    }
}

impl P2c {
    /// A new balancer with randomness seeded from the OS entropy source.
    pub fn new() -> Self {
        P2c {
            rng: SmallRng::from_os_rng(),
        }
    }

    /// A new balancer with reproducible randomness, for tests.
    pub fn with_seed(seed: u64) -> Self {
        P2c {
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// Draws two distinct eligible indices uniformly at random: `None` when no
    /// node is eligible, `Some((i, None))` when only node `i` is.
    pub fn draw(&mut self, nodes: &[Candidate]) -> Option<(usize, Option<usize>)> {
        let first = self.sample(nodes, None)?;
        Some((first, self.sample(nodes, Some(first))))
    }

    /// A uniformly random eligible index other than `exclude`.
    fn sample(&mut self, nodes: &[Candidate], exclude: Option<usize>) -> Option<usize> {
        let range = nodes.len() - usize::from(exclude.is_some());
        if range == 0 {
            return None;
        }
        // Draw from the indices other than `exclude`: skip over it. No
        // branch on the drawn index (it is random, so always mispredicted
        // half the time, more in a large pool than in a small one).
        let skip = exclude.unwrap_or(usize::MAX);
        for _ in 0..MAX_TRIES {
            let r = self.rng.random_range(0..range);
            let i = r + usize::from(r >= skip);
            if nodes[i].eligible {
                return Some(i);
            }
        }
        let is_candidate = |&(i, node): &(usize, &Candidate)| node.eligible && Some(i) != exclude;
        let count = nodes.iter().enumerate().filter(is_candidate).count();
        if count == 0 {
            return None;
        }
        let nth = self.rng.random_range(0..count);
        nodes
            .iter()
            .enumerate()
            .filter(is_candidate)
            .nth(nth)
            .map(|(i, _)| i)
    }
}

/// `rtt_estimate * (in_flight + 1)`, with NaN as +∞.
fn cost(node: &Candidate) -> f64 {
    let c = node.rtt_estimate * (f64::from(node.in_flight) + 1.0);
    if c.is_nan() {
        f64::INFINITY
    } else {
        c
    }
}

/// Whether `b` is strictly cheaper than `a`.
///
/// Both comparisons are computed and one is kept without a branch: which
/// node wins is random, and a mispredicted branch per pick would cost more
/// in a large pool (where the predictor cannot learn the few pairs of a
/// small one) than the division does.
fn cheaper(b: &Candidate, a: &Candidate) -> bool {
    let (cb, ca) = (cost(b), cost(a));
    let plain = cb < ca;
    let weighted = cb / f64::from(b.weight.max(1)) < ca / f64::from(a.weight.max(1));
    let same = a.weight == b.weight;
    (same & plain) | (!same & weighted)
}

impl Strategy for P2c {
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str {
        "p2c"
    }

    fn rebuild(&mut self, _members: &[Member]) {}

    fn pick(&mut self, nodes: &[Candidate], _affinity: Option<u64>) -> Option<usize> {
        match self.draw(nodes)? {
            // Index by the comparison rather than branch on it (see `cheaper`).
            (a, Some(b)) => Some([a, b][usize::from(cheaper(&nodes[b], &nodes[a]))]),
            (a, None) => Some(a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn with_eligible(eligible: &[bool]) -> Vec<Candidate> {
        eligible
            .iter()
            .map(|&e| Candidate {
                eligible: e,
                ..Candidate::new(1, 8)
            })
            .collect()
    }

    #[test]
    fn pairs_are_distinct() {
        let mut p = P2c::with_seed(1);
        let mut nodes = with_eligible(&[true; 5]);
        for _ in 0..10_000 {
            let (a, b) = p.draw(&nodes).unwrap();
            assert_ne!(Some(a), b);
            assert!(b.is_some());
        }
        nodes[1].eligible = false;
        nodes[3].eligible = false;
        for _ in 0..10_000 {
            let (a, b) = p.draw(&nodes).unwrap();
            let b = b.unwrap();
            assert_ne!(a, b);
            assert!(nodes[a].eligible && nodes[b].eligible);
        }
    }

    #[test]
    fn zero_or_one_eligible() {
        let mut p = P2c::with_seed(2);
        assert_eq!(p.draw(&[]), None);
        assert_eq!(p.pick(&[], None), None);
        assert_eq!(p.draw(&with_eligible(&[false; 4])), None);
        let mut one = with_eligible(&[false; 50]);
        one[37].eligible = true;
        for _ in 0..100 {
            assert_eq!(p.draw(&one), Some((37, None)));
            assert_eq!(p.pick(&one, None), Some(37));
        }
        assert_eq!(p.draw(&with_eligible(&[true])), Some((0, None)));
    }

    #[test]
    fn two_nodes_always_the_lower_cost() {
        let mut p = P2c::with_seed(3);
        let mut rng = SmallRng::seed_from_u64(99);
        let mut nodes = with_eligible(&[true; 2]);
        for _ in 0..1000 {
            for n in nodes.iter_mut() {
                n.in_flight = rng.random_range(0..8);
                n.rtt_estimate = rng.random_range(0.001..0.1);
            }
            let want = if cost(&nodes[1]) < cost(&nodes[0]) {
                1
            } else {
                0
            };
            assert_eq!(p.pick(&nodes, None), Some(want));
        }
    }

    #[test]
    fn weights_divide_only_when_they_differ() {
        let mut p = P2c::with_seed(4);
        let mut nodes = with_eligible(&[true; 2]);
        nodes[1].in_flight = 2; // cost 0.09 against 0.03
        assert_eq!(p.pick(&nodes, None), Some(0));
        nodes[0].weight = 4;
        nodes[1].weight = 4;
        assert_eq!(p.pick(&nodes, None), Some(0));
        nodes[0].weight = 1; // 0.03 / 1 against 0.09 / 4
        assert_eq!(p.pick(&nodes, None), Some(1));
    }

    #[test]
    fn never_ineligible_when_most_are() {
        let mut p = P2c::with_seed(5);
        let mut nodes = with_eligible(&[false; 100]);
        for i in [3, 50, 97] {
            nodes[i].eligible = true;
        }
        let mut seen = [0usize; 100];
        for _ in 0..3000 {
            seen[p.pick(&nodes, None).unwrap()] += 1;
        }
        // Equal costs: the first drawn wins, uniformly over the three.
        for i in [3, 50, 97] {
            assert!((850..1150).contains(&seen[i]), "{i}: {}", seen[i]);
        }
        assert_eq!(seen.iter().sum::<usize>(), seen[3] + seen[50] + seen[97]);
    }

    #[test]
    fn equal_nodes_share_evenly() {
        let mut p = P2c::with_seed(6);
        let nodes = with_eligible(&[true; 10]);
        let mut seen = [0usize; 10];
        for _ in 0..100_000 {
            seen[p.pick(&nodes, None).unwrap()] += 1;
        }
        // Expected 10 000 each, standard deviation about 95.
        for (i, &s) in seen.iter().enumerate() {
            assert!((9_500..10_500).contains(&s), "{i}: {s}");
        }
    }

    #[test]
    fn slow_node_gets_a_small_share() {
        let mut p = P2c::with_seed(7);
        let mut nodes = with_eligible(&[true; 4]);
        nodes[0].rtt_estimate = 0.3;
        // Up to 16 requests outstanding; the oldest completes first.
        let mut outstanding = VecDeque::new();
        let mut seen = [0usize; 4];
        for _ in 0..20_000 {
            let i = p.pick(&nodes, None).unwrap();
            seen[i] += 1;
            nodes[i].in_flight += 1;
            outstanding.push_back(i);
            if outstanding.len() > 16 {
                let done = outstanding.pop_front().unwrap();
                nodes[done].in_flight -= 1;
            }
        }
        assert!(seen[0] < 20_000 / 40, "slow node got {}", seen[0]);
        for &s in &seen[1..] {
            assert!(s > 5_000, "{seen:?}");
        }
    }

    #[test]
    fn same_seed_same_picks() {
        let nodes = with_eligible(&[true; 7]);
        let mut a = P2c::with_seed(8);
        let mut b = P2c::with_seed(8);
        let pa: Vec<_> = (0..50).map(|_| a.draw(&nodes)).collect();
        let pb: Vec<_> = (0..50).map(|_| b.draw(&nodes)).collect();
        assert_eq!(pa, pb);
        let mut c = P2c::new();
        assert!(c.pick(&nodes, None).is_some());
    }
}
