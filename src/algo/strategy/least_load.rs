//! Least load: the node with the lowest weighted score of load, latency and
//! errors.
//!
//! Least-connections balancing (nginx `least_conn`, HAProxy `leastconn`)
//! sends each request to the node with the fewest requests in flight. This
//! strategy generalises it with the two other signals the balancer tracks:
//!
//! ```text
//! score = w_in_flight * in_flight / max_concurrent
//!       + w_latency   * latency_ewma   (seconds)
//!       + w_errors    * error_rate     (0..=1)
//! ```
//!
//! The lowest score wins. Dividing by `max_concurrent` makes a big node with
//! 4 of 16 slots busy less loaded than a small one with 2 of 4. A node whose
//! slots are all taken (`in_flight >= max_concurrent`) is picked only when
//! every eligible node is full. Ties are broken by rotating the scan start
//! (just past the previous winner), so idle equal nodes share work in turn
//! instead of the first one taking everything. Each pick is O(n).
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let mut ll = LeastLoad::new(LeastLoadWeights::default());
//! let mut nodes = vec![Candidate::new(1, 4); 2];
//! nodes[0].in_flight = 2;
//! assert_eq!(ll.pick(&nodes, None), Some(1));
//! # }
//! ```

use super::{Candidate, Member, Strategy};

/// Weights of the three terms of the least-load score.
///
/// The default is `in_flight: 0.5, latency: 0.3, errors: 0.2`: load first,
/// then latency, then errors.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct LeastLoadWeights {
    /// Weight of the occupancy `in_flight / max_concurrent` (default 0.5).
    pub in_flight: f64,
    /// Weight of the latency EWMA in seconds (default 0.3).
    pub latency: f64,
    /// Weight of the recent error rate (default 0.2).
    pub errors: f64,
}

impl Default for LeastLoadWeights {
    fn default() -> Self {
        LeastLoadWeights {
            in_flight: 0.5,
            latency: 0.3,
            errors: 0.2,
        }
    }
}

/// Picks the eligible node with the lowest least-load score.
#[derive(Debug, Clone, Default)]
pub struct LeastLoad {
    weights: LeastLoadWeights,
    cursor: usize,
}

impl LeastLoad {
    /// A new strategy scoring with `weights`.
    pub fn new(weights: LeastLoadWeights) -> Self {
        LeastLoad { weights, cursor: 0 }
    }

    /// The score of one node; lower is better. NaN counts as +∞.
    pub fn score(&self, node: &Candidate) -> f64 {
        let w = &self.weights;
        let occupancy = f64::from(node.in_flight) / f64::from(node.max_concurrent.max(1));
        let s =
            w.in_flight * occupancy + w.latency * node.latency_ewma + w.errors * node.error_rate;
        if s.is_nan() {
            f64::INFINITY
        } else {
            s
        }
    }
}

impl Strategy for LeastLoad {
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn rebuild(&mut self, _members: &[Member]) {}

    fn pick(&mut self, nodes: &[Candidate], _affinity: Option<u64>) -> Option<usize> {
        let n = nodes.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor % n;
        // (full, score): any node with a free slot beats every full one.
        let mut best: Option<(usize, bool, f64)> = None;
        for i in (start..n).chain(0..start) {
            let node = &nodes[i];
            if !node.eligible {
                continue;
            }
            let full = node.in_flight >= node.max_concurrent.max(1);
            let score = self.score(node);
            let better = match best {
                None => true,
                Some((_, best_full, best_score)) => (full, score) < (best_full, best_score),
            };
            if better {
                best = Some((i, full, score));
            }
        }
        let (index, _, _) = best?;
        self.cursor = (index + 1) % n;
        Some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(in_flight: u32, max: u32, latency: f64, errors: f64) -> Candidate {
        Candidate {
            in_flight,
            latency_ewma: latency,
            error_rate: errors,
            ..Candidate::new(1, max)
        }
    }

    #[test]
    fn default_weights() {
        let w = LeastLoadWeights::default();
        assert_eq!((w.in_flight, w.latency, w.errors), (0.5, 0.3, 0.2));
    }

    #[test]
    fn exact_scores() {
        let ll = LeastLoad::default();
        assert_eq!(ll.score(&node(2, 4, 0.0, 0.0)), 0.25);
        assert_eq!(ll.score(&node(0, 4, 1.0, 0.0)), 0.3);
        assert_eq!(ll.score(&node(0, 4, 0.0, 0.5)), 0.1);
        assert_eq!(ll.score(&node(4, 0, 0.0, 0.0)), 2.0); // max 0 counts as 1
        assert_eq!(ll.score(&node(0, 4, f64::NAN, 0.0)), f64::INFINITY);
    }

    #[test]
    fn lowest_score_wins() {
        let mut ll = LeastLoad::default();
        // Scores 0.25, 0.3, 0.1 + 0.03 = 0.13, 0.125.
        let nodes = [
            node(2, 4, 0.0, 0.0),
            node(0, 4, 1.0, 0.0),
            node(0, 4, 0.1, 0.5),
            node(4, 16, 0.0, 0.0),
        ];
        assert_eq!(ll.pick(&nodes, None), Some(3));
        let weights = LeastLoadWeights {
            in_flight: 0.0,
            latency: 1.0,
            errors: 0.0,
        };
        let mut by_latency = LeastLoad::new(weights);
        assert_eq!(by_latency.pick(&nodes, None), Some(0));
    }

    #[test]
    fn ties_rotate() {
        let mut ll = LeastLoad::default();
        let mut nodes = vec![node(0, 4, 0.0, 0.0); 4];
        nodes[2].in_flight = 1;
        let got: Vec<usize> = (0..6).map(|_| ll.pick(&nodes, None).unwrap()).collect();
        assert_eq!(got, [0, 1, 3, 0, 1, 3]);
    }

    #[test]
    fn skips_ineligible_and_full() {
        let mut ll = LeastLoad::default();
        let mut nodes = vec![node(0, 4, 0.0, 0.0), node(1, 4, 0.0, 0.0)];
        nodes[0].eligible = false;
        assert_eq!(ll.pick(&nodes, None), Some(1));
        nodes[1].eligible = false;
        assert_eq!(ll.pick(&nodes, None), None);
        assert_eq!(ll.pick(&[], None), None);
        // A full node with a low score (0.5) loses to a free one (0.6)...
        let nodes = [node(4, 4, 0.0, 0.0), node(0, 4, 2.0, 0.0)];
        assert_eq!(ll.pick(&nodes, None), Some(1));
        // ...and is picked only when every eligible node is full.
        let nodes = [node(5, 4, 0.0, 0.0), node(4, 4, 0.0, 0.0)];
        assert_eq!(ll.pick(&nodes, None), Some(1));
    }
}
