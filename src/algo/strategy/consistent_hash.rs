//! Consistent hashing on a ketama-style hash ring, for affinity (Karger et
//! al., 1997; libketama; nginx's `hash ... consistent`).
//!
//! Every member is hashed onto a 64-bit ring at many virtual points; a key
//! belongs to the first point at or after its hash, clockwise.
//!
//! * A member of weight `w` gets `w ×` [`POINTS_PER_WEIGHT`] (160, as
//!   ketama) points whatever the others weigh, so a change to one member
//!   moves only keys to or from it (adding weight `w` to a pool of `W`
//!   moves about `w / (W + w)` of the keys). Weights count up to
//!   [`MAX_RING_WEIGHT`]; past [`MAX_POINTS`] every member gets fewer.
//! * Point `i` of a member sits at `hash_key("{key}#{i}")`: stable across
//!   rebuilds and reorderings.
//! * An ineligible owner is skipped: its keys go to its ring neighbours and
//!   come back when it recovers; no other key moves.
//! * Without affinity, or on an empty ring, an inner [`P2c`] picks.
//!
//! A pick is a binary search and a short walk.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let members: Vec<Member> = (0..3)
//!     .map(|i| Member { key: format!("10.0.0.{i}:80"), weight: 1 })
//!     .collect();
//! let mut ring = ConsistentHash::with_seed(1);
//! ring.rebuild(&members);
//! let nodes = vec![Candidate::new(1, 8); 3];
//! let owner = ring.pick(&nodes, Some(hash_key("user-42")));
//! assert_eq!(ring.pick(&nodes, Some(hash_key("user-42"))), owner); // sticky
//! # }
//! ```

use std::fmt::Write as _;

use super::{hash_key, Candidate, Member, P2c, Strategy};

/// Virtual points per unit of weight (as in ketama).
pub const POINTS_PER_WEIGHT: usize = 160;

/// Weights above this count as this on the ring.
pub const MAX_RING_WEIGHT: u32 = 100;

/// Bound on the points of the ring (16 MB): a pool whose total weight would
/// need more gets `MAX_POINTS / total weight` points per unit of weight.
pub const MAX_POINTS: usize = 1_000_000;

/// Points walked before checking, in O(members), whether any owner is
/// eligible at all.
const QUICK_WALK: usize = 64;

/// A weighted hash ring; tasks without affinity go to an inner [`P2c`].
#[derive(Debug, Clone)]
pub struct ConsistentHash {
    /// `(point, member index)`, sorted.
    ring: Vec<(u64, usize)>,
    members: usize,
    fallback: P2c,
}

impl Default for ConsistentHash {
    fn default() -> Self {
        ConsistentHash::new()
    }
}

impl ConsistentHash {
    /// An empty ring whose fallback is seeded from entropy.
    pub fn new() -> Self {
        ConsistentHash::with_fallback(P2c::new())
    }

    /// An empty ring whose fallback has reproducible randomness, for tests.
    pub fn with_seed(seed: u64) -> Self {
        ConsistentHash::with_fallback(P2c::with_seed(seed))
    }

    fn with_fallback(fallback: P2c) -> Self {
        ConsistentHash {
            ring: Vec::new(),
            members: 0,
            fallback,
        }
    }

    /// The number of points on the ring.
    #[cfg(any(test, feature = "internals"))]
    pub fn points(&self) -> usize {
        self.ring.len()
    }
}

impl Strategy for ConsistentHash {
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn rebuild(&mut self, members: &[Member]) {
        self.ring.clear();
        self.members = members.len();
        let weight = |m: &Member| u64::from(m.weight.clamp(1, MAX_RING_WEIGHT));
        let total: u64 = members.iter().map(weight).sum();
        if total == 0 {
            return;
        }
        // Fixed points per unit of weight: one member's change never moves
        // another member's points.
        let per_weight = (MAX_POINTS as u64 / total).clamp(1, POINTS_PER_WEIGHT as u64);
        let mut label = String::new();
        for (index, member) in members.iter().enumerate() {
            for i in 0..weight(member) * per_weight {
                label.clear();
                // Writing to a String cannot fail.
                let _ = write!(label, "{}#{i}", member.key);
                self.ring.push((hash_key(&label), index));
            }
        }
        self.ring.sort_unstable();
    }

    fn pick(&mut self, nodes: &[Candidate], affinity: Option<u64>) -> Option<usize> {
        let Some(hash) = affinity else {
            return self.fallback.pick(nodes, None);
        };
        let len = self.ring.len();
        let start = self.ring.partition_point(|&(point, _)| point < hash);
        let usable = |m: usize| nodes.get(m).is_some_and(|n| n.eligible);
        let mut walk = (start..len).chain(0..start).map(|i| self.ring[i].1);
        if let Some(m) = walk.by_ref().take(QUICK_WALK).find(|&m| usable(m)) {
            return Some(m);
        }
        if (0..self.members).any(usable) {
            // The walk ends at an eligible owner.
            return walk.find(|&m| usable(m));
        }
        // No owner on the ring is eligible (or the ring is empty): any other
        // eligible node will do.
        self.fallback.pick(nodes, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[u32]) -> Vec<Member> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Member {
                key: format!("10.0.0.{i}:80"),
                weight,
            })
            .collect()
    }

    fn nodes(n: usize) -> Vec<Candidate> {
        vec![Candidate::new(1, 8); n]
    }

    /// The owner's key of each of `keys` test keys.
    fn owners<'a>(
        ring: &mut ConsistentHash,
        ms: &'a [Member],
        nodes: &[Candidate],
        keys: usize,
    ) -> Vec<&'a str> {
        (0..keys)
            .map(|k| {
                let m = ring
                    .pick(nodes, Some(hash_key(&format!("user-{k}"))))
                    .unwrap();
                ms[m].key.as_str()
            })
            .collect()
    }

    #[test]
    fn points_follow_weights_and_stay_bounded() {
        let mut ring = ConsistentHash::with_seed(1);
        ring.rebuild(&members(&[2, 1, 1]));
        assert_eq!(ring.points(), 320 + 160 + 160);
        ring.rebuild(&members(&[1000, 1]));
        assert_eq!(ring.points(), 100 * 160 + 160, "weights count up to 100");
        ring.rebuild(&members(&[1; 1000]));
        assert_eq!(ring.points(), 160_000);
        ring.rebuild(&members(&[1; 6250]));
        assert_eq!(ring.points(), 1_000_000);
        ring.rebuild(&members(&[1; 10_000]));
        assert_eq!(ring.points(), 1_000_000, "bounded: 100 points each");
        ring.rebuild(&[]);
        assert_eq!(ring.points(), 0);
        assert_eq!(ring.pick(&nodes(2), Some(1)).map(|i| i < 2), Some(true));
        assert_eq!(ring.pick(&[], Some(1)), None);
    }

    #[test]
    fn equal_members_share_evenly() {
        let ms = members(&[1; 10]);
        let mut ring = ConsistentHash::with_seed(2);
        ring.rebuild(&ms);
        let owned = owners(&mut ring, &ms, &nodes(10), 100_000);
        for m in &ms {
            let share = owned.iter().filter(|&&o| o == m.key).count();
            assert!((7_000..13_000).contains(&share), "{}: {share}", m.key);
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_keys() {
        let ms = members(&[1; 10]);
        let mut ring = ConsistentHash::with_seed(3);
        ring.rebuild(&ms);
        let before = owners(&mut ring, &ms, &nodes(10), 100_000);
        let mut fewer = ms.clone();
        let gone = fewer.remove(3);
        ring.rebuild(&fewer);
        let after = owners(&mut ring, &fewer, &nodes(9), 100_000);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if *b == gone.key {
                moved += 1;
                assert_ne!(*a, gone.key);
            } else {
                assert_eq!(a, b);
            }
        }
        assert!((7_000..13_000).contains(&moved), "{moved}");
    }

    #[test]
    fn ineligible_member_lends_its_keys_and_gets_them_back() {
        let ms = members(&[1; 10]);
        let mut ring = ConsistentHash::with_seed(4);
        ring.rebuild(&ms);
        let mut ns = nodes(10);
        let before = owners(&mut ring, &ms, &ns, 100_000);
        ns[6].eligible = false;
        let during = owners(&mut ring, &ms, &ns, 100_000);
        let mut moved = 0;
        for (b, d) in before.iter().zip(&during) {
            if *b == ms[6].key {
                moved += 1;
                assert_ne!(*d, ms[6].key);
            } else {
                assert_eq!(d, b);
            }
        }
        assert!(moved > 7_000, "{moved}");
        ns[6].eligible = true;
        assert_eq!(owners(&mut ring, &ms, &ns, 100_000), before);
    }

    #[test]
    fn weights_2_to_1_give_about_2_to_1_keys() {
        let ms = members(&[2, 1]);
        let mut ring = ConsistentHash::with_seed(5);
        ring.rebuild(&ms);
        let owned = owners(&mut ring, &ms, &nodes(2), 100_000);
        let heavy = owned.iter().filter(|&&o| o == ms[0].key).count();
        assert!((58_000..75_000).contains(&heavy), "{heavy}");
    }

    #[test]
    fn long_walks_and_no_eligible_owner() {
        let ms = members(&[1; 100]);
        let mut ring = ConsistentHash::with_seed(6);
        ring.rebuild(&ms);
        let mut ns = nodes(100);
        for n in ns.iter_mut() {
            n.eligible = false;
        }
        assert_eq!(ring.pick(&ns, Some(42)), None);
        ns[77].eligible = true;
        for k in 0..1000 {
            assert_eq!(ring.pick(&ns, Some(hash_key(&format!("k{k}")))), Some(77));
        }
        // A node beyond the ring's members is reached through the fallback.
        ns[77].eligible = false;
        ns.push(Candidate::new(1, 8));
        assert_eq!(ring.pick(&ns, Some(42)), Some(100));
    }

    #[test]
    fn without_affinity_it_is_p2c() {
        let ms = members(&[1; 6]);
        let mut ring = ConsistentHash::with_seed(7);
        ring.rebuild(&ms);
        let mut p2c = P2c::with_seed(7);
        let mut ns = nodes(6);
        for (i, n) in ns.iter_mut().enumerate() {
            n.in_flight = (i as u32 * 5) % 7;
        }
        for _ in 0..500 {
            assert_eq!(ring.pick(&ns, None), p2c.pick(&ns, None));
        }
    }

    /// Keys whose owner differs between `before` and `after`, as
    /// `(from, to)` pairs.
    fn moves<'a>(before: &[&'a str], after: &[&'a str]) -> Vec<(&'a str, &'a str)> {
        before
            .iter()
            .zip(after)
            .filter(|(b, a)| b != a)
            .map(|(b, a)| (*b, *a))
            .collect()
    }

    /// Regression: points scaled to the largest weight
    /// moved keys between old members whenever a heavier member arrived.
    #[test]
    fn adding_a_member_moves_its_share_of_keys_all_to_it() {
        const KEYS: usize = 10_000;
        for (n, new_weight) in [(3usize, 1u32), (9, 1), (4, 5), (2, 100)] {
            let ms = members(&vec![1; n]);
            let mut ring = ConsistentHash::with_seed(8);
            ring.rebuild(&ms);
            let before = owners(&mut ring, &ms, &nodes(n), KEYS);
            let mut more = ms.clone();
            more.push(Member {
                key: "10.0.1.1:80".into(),
                weight: new_weight,
            });
            ring.rebuild(&more);
            let after = owners(&mut ring, &more, &nodes(n + 1), KEYS);
            let moved = moves(&before, &after);
            assert!(
                moved.iter().all(|&(_, to)| to == "10.0.1.1:80"),
                "n = {n}, weight {new_weight}: a key moved between old members"
            );
            // Expected share w / (n + w); the ring's spread is a few percent.
            let expected = KEYS as f64 * new_weight as f64 / (n as f64 + new_weight as f64);
            let got = moved.len() as f64;
            assert!(
                (expected * 0.7..expected * 1.3).contains(&got),
                "n = {n}, weight {new_weight}: {got} moved, about {expected} expected"
            );
        }
    }

    /// Regression: raising one weight to a new maximum
    /// changed every other member's points.
    #[test]
    fn reweighting_a_member_moves_keys_only_to_or_from_it() {
        const KEYS: usize = 10_000;
        let ms = members(&[2, 1, 1, 1]);
        let mut ring = ConsistentHash::with_seed(9);
        ring.rebuild(&ms);
        let before = owners(&mut ring, &ms, &nodes(4), KEYS);
        let target = ms[2].key.clone();
        for weight in [5, 100, 3] {
            let mut heavier = ms.clone();
            heavier[2].weight = weight;
            ring.rebuild(&heavier);
            let after = owners(&mut ring, &heavier, &nodes(4), KEYS);
            let moved = moves(&before, &after);
            assert!(
                moved.iter().all(|&(_, to)| to == target),
                "weight {weight}: a key moved between other members"
            );
            let expected = KEYS as f64 * (weight as f64 / (weight as f64 + 4.0) - 1.0 / 5.0);
            let got = moved.len() as f64;
            assert!(
                (expected * 0.7..expected * 1.3).contains(&got),
                "weight {weight}: {got} moved, about {expected} expected"
            );
            // And back: lowering it again gives away only its own keys.
            let lighter = owners(&mut ring, &heavier, &nodes(4), KEYS);
            ring.rebuild(&ms);
            let back = owners(&mut ring, &ms, &nodes(4), KEYS);
            assert!(moves(&lighter, &back)
                .iter()
                .all(|&(from, _)| from == target));
            assert_eq!(back, before);
        }
    }
}
