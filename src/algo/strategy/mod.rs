//! Load-balancing strategies: which node of a pool gets the next request.
//!
//! The balancer owns the pool and all the bookkeeping (health, circuit
//! breakers, concurrency slots, rate-limit tokens). At every pick it hands a
//! strategy one [`Candidate`] per node — a plain snapshot of that node, in a
//! stable order — and the strategy returns the index of one *eligible*
//! candidate. Strategies are pure: no I/O, no clock, randomness injected
//! through a seed, so each can be tested with exact expected sequences.
//!
//! | [`Mode`](crate::Mode) | struct | origin |
//! | --- | --- | --- |
//! | `RoundRobin` | [`RoundRobin`] | classic rotation |
//! | `Weighted` | [`SmoothWeighted`] | nginx smooth weighted round robin |
//! | `LeastLoad` | [`LeastLoad`] | weighted score of load, latency, errors |
//! | `P2c` | [`P2c`] | power of two choices (Mitzenmacher; tower, linkerd, Finagle) |
//! | `ConsistentHash` | [`ConsistentHash`] | ketama hash ring (Karger et al.) |
//!
//! A service's mode becomes its strategy in one place, the mode table of
//! `config/mode.rs`, which builds each from the service's balancer settings
//! (least-load weights, the seed).
//!
//! Strategies that keep per-node state learn the pool through
//! [`Strategy::rebuild`] with one [`Member`] per node, in the same order as
//! the candidates of later picks. [`hash_key`] turns an affinity key into the
//! stable 64-bit hash that [`Strategy::pick`] takes.
//!
//! ```
//! # #[cfg(feature = "internals")] {
//! # use actix_dispatch::algo::strategy::*;
//! let members = vec![
//!     Member { key: "10.0.0.1:80".into(), weight: 5 },
//!     Member { key: "10.0.0.2:80".into(), weight: 1 },
//! ];
//! let mut strategy = SmoothWeighted::new();
//! strategy.rebuild(&members);
//! let nodes = vec![Candidate::new(5, 10), Candidate::new(1, 10)];
//! let index = strategy.pick(&nodes, None); // Some(0) five times in six
//! let sticky = strategy.pick(&nodes, Some(hash_key("user-42")));
//! # }
//! ```

mod consistent_hash;
mod least_load;
mod p2c;
mod round_robin;
mod weighted;

pub use consistent_hash::ConsistentHash;
pub use least_load::{LeastLoad, LeastLoadWeights};
pub use p2c::P2c;
pub use round_robin::RoundRobin;
pub use weighted::SmoothWeighted;

/// What a strategy sees of one node at pick time. The balancer fills one per
/// node, in a stable order (index = position).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Whether the node may take a request now (active, breaker admits, free
    /// slot, rate-limit token): the balancer decides; strategies must never
    /// pick an ineligible node.
    pub eligible: bool,
    /// Effective weight, at least 1 (after slow start).
    pub weight: u32,
    /// Requests currently in flight on the node.
    pub in_flight: u32,
    /// Concurrency limit of the node, at least 1.
    pub max_concurrent: u32,
    /// Recent latency in seconds (classic EWMA).
    pub latency_ewma: f64,
    /// Recent error rate in `0.0..=1.0`.
    pub error_rate: f64,
    /// Round-trip-time estimate in seconds (peak EWMA), the P2C cost basis.
    pub rtt_estimate: f64,
}

impl Candidate {
    /// An eligible, idle node with the given weight and concurrency limit, no
    /// latency or errors recorded, and the default RTT estimate of 30ms.
    pub fn new(weight: u32, max_concurrent: u32) -> Self {
        Candidate {
            eligible: true,
            weight,
            in_flight: 0,
            max_concurrent,
            latency_ewma: 0.0,
            error_rate: 0.0,
            rtt_estimate: 0.03,
        }
    }
}

/// Identity of a pool member for strategies that keep per-node state
/// (weighted round robin's current weights, the hash ring).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The endpoint address; identifies the member across rebuilds.
    pub key: String,
    /// Configured weight.
    pub weight: u32,
}

/// A load-balancing strategy.
pub trait Strategy: Send + std::fmt::Debug {
    /// Short name for logs and metrics, e.g. `"round_robin"`.
    #[cfg(any(test, feature = "internals"))]
    fn name(&self) -> &'static str;

    /// Pool membership changed (or first build): `members` are in the same
    /// order as the candidates of later picks. Keeps the state of members
    /// whose key survives.
    fn rebuild(&mut self, members: &[Member]);

    /// Picks the index of one eligible candidate, or `None` when none is
    /// eligible. `affinity` is the task's hashed affinity key, if any (only
    /// consistent hashing uses it). Never returns an ineligible index.
    fn pick(&mut self, nodes: &[Candidate], affinity: Option<u64>) -> Option<usize>;
}

/// Stable 64-bit hash of an affinity key: FNV-1a over the UTF-8 bytes,
/// followed by the MurmurHash3 `fmix64` finalizer so that similar keys
/// (`"node#1"`, `"node#2"`) land far apart. Unlike std's `DefaultHasher`,
/// whose algorithm may change between Rust releases, this is the same in
/// every process run and every build.
pub fn hash_key(key: &str) -> u64 {
    fmix64(fnv1a(key.as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop, prop_assert, proptest};
    use proptest::strategy::Strategy as _;

    /// One of each strategy, seeded when `seed` is given, knowing `members`.
    fn each(members: &[Member], seed: Option<u64>) -> Vec<Box<dyn Strategy>> {
        let mut all: Vec<Box<dyn Strategy>> = vec![
            Box::new(RoundRobin::new()),
            Box::new(SmoothWeighted::new()),
            Box::new(LeastLoad::new(LeastLoadWeights::default())),
            Box::new(seed.map_or_else(P2c::new, P2c::with_seed)),
            Box::new(seed.map_or_else(ConsistentHash::new, ConsistentHash::with_seed)),
        ];
        for s in &mut all {
            s.rebuild(members);
        }
        all
    }

    fn members(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                key: format!("10.0.0.{i}:80"),
                weight: 1,
            })
            .collect()
    }

    #[test]
    fn fnv1a_known_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_key_is_stable_and_spreads() {
        assert_eq!(hash_key("user-42"), hash_key("user-42"));
        assert_eq!(hash_key(""), fmix64(0xcbf2_9ce4_8422_2325));
        assert_eq!(fmix64(0), 0);
        // Neighbouring keys differ in about half their bits.
        let d = (hash_key("node#1") ^ hash_key("node#2")).count_ones();
        assert!((16..=48).contains(&d), "{d}");
    }

    #[test]
    fn candidate_new_defaults() {
        let c = Candidate::new(3, 8);
        assert!(c.eligible);
        assert_eq!((c.weight, c.in_flight, c.max_concurrent), (3, 0, 8));
        assert_eq!(
            (c.latency_ewma, c.error_rate, c.rtt_estimate),
            (0.0, 0.0, 0.03)
        );
    }

    #[test]
    fn each_strategy_picks_only_the_eligible() {
        let names: Vec<&str> = each(&members(3), Some(1))
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(
            names,
            [
                "round_robin",
                "weighted",
                "least_load",
                "p2c",
                "consistent_hash"
            ]
        );
        for mut s in each(&members(3), None) {
            let nodes = vec![Candidate::new(1, 4); 3];
            assert!(s.pick(&nodes, Some(hash_key("k"))).is_some());
            assert!(s.pick(&nodes, None).is_some());
            assert_eq!(s.pick(&[], None), None);
            let none = vec![
                Candidate {
                    eligible: false,
                    ..Candidate::new(1, 4)
                };
                3
            ];
            assert_eq!(s.pick(&none, Some(7)), None, "{}", s.name());
        }
    }

    fn candidate() -> impl proptest::strategy::Strategy<Value = Candidate> {
        (
            any::<bool>(),
            1u32..10,
            0u32..8,
            1u32..8,
            0.0f64..2.0,
            0.0f64..=1.0,
            0.001f64..1.0,
        )
            .prop_map(
                |(eligible, weight, in_flight, max, lat, err, rtt)| Candidate {
                    eligible,
                    weight,
                    in_flight,
                    max_concurrent: max,
                    latency_ewma: lat,
                    error_rate: err,
                    rtt_estimate: rtt,
                },
            )
    }

    proptest! {
        #[test]
        fn picks_are_always_eligible(
            rounds in prop::collection::vec(
                (prop::collection::vec(candidate(), 0..24), prop::option::of(any::<u64>())),
                1..12,
            ),
            seed in any::<u64>(),
        ) {
            for mut s in each(&members(rounds[0].0.len()), Some(seed)) {
                for (nodes, affinity) in &rounds {
                    // Membership changes between rounds, as in a live pool.
                    let ms: Vec<Member> = members(nodes.len())
                        .into_iter()
                        .zip(nodes)
                        .map(|(m, c)| Member { weight: c.weight, ..m })
                        .collect();
                    s.rebuild(&ms);
                    for _ in 0..4 {
                        let any_eligible = nodes.iter().any(|c| c.eligible);
                        match s.pick(nodes, *affinity) {
                            Some(i) => prop_assert!(nodes[i].eligible, "{} picked {}", s.name(), i),
                            None => prop_assert!(!any_eligible, "{} found none", s.name()),
                        }
                    }
                }
            }
        }
    }
}
