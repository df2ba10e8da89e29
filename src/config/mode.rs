//! The balancing mode of a service, and the one place a mode becomes its
//! strategy.
//!
//! [`MODES`] holds one row per mode: how the mode is written in a config
//! file (the seed's aliases included) and how its strategy is built from the
//! service's [`BalancerConfig`]. Parsing, the error listing the valid modes,
//! and the balancer's strategy all read that table, so a new strategy is its
//! own file under `algo/strategy/`, a variant here, and one row.

use super::BalancerConfig;
use crate::algo::strategy::{ConsistentHash, LeastLoad, P2c, RoundRobin, SmoothWeighted, Strategy};

/// How a service picks the node for each task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mode {
    /// Each eligible node in turn (seed alias `Poll`).
    RoundRobin,
    /// nginx's smooth weighted round robin (seed alias `Weight`).
    Weighted,
    /// Lowest `0.5·in_flight/max + 0.3·EWMA latency + 0.2·error rate`.
    LeastLoad,
    /// Power of two choices on peak-EWMA cost (the default).
    P2c,
    /// Hash ring on the task's affinity key; p2c for tasks without one.
    ConsistentHash,
}

/// One mode's row of [`MODES`].
struct Row {
    mode: Mode,
    /// As the mode is named in the error listing the valid modes.
    shown: &'static str,
    /// The spellings it parses from, lower case, without `_`, `-` or spaces.
    names: &'static [&'static str],
    /// Its strategy, from the service's balancer settings. With a `seed`,
    /// every random draw is reproducible; without, it is seeded from entropy.
    build: fn(&BalancerConfig) -> Box<dyn Strategy>,
}

/// Every mode, once.
const MODES: [Row; 5] = [
    Row {
        mode: Mode::RoundRobin,
        shown: "round_robin/Poll",
        names: &["roundrobin", "poll", "rr"],
        build: |_| Box::new(RoundRobin::new()),
    },
    Row {
        mode: Mode::Weighted,
        shown: "weighted/Weight",
        names: &["weighted", "weight", "weightedroundrobin"],
        build: |_| Box::new(SmoothWeighted::new()),
    },
    Row {
        mode: Mode::LeastLoad,
        shown: "least_load",
        names: &["leastload", "leastloaded"],
        build: |b| Box::new(LeastLoad::new(b.least_load)),
    },
    Row {
        mode: Mode::P2c,
        shown: "p2c",
        names: &["p2c", "poweroftwochoices"],
        build: |b| Box::new(b.seed.map_or_else(P2c::new, P2c::with_seed)),
    },
    Row {
        mode: Mode::ConsistentHash,
        shown: "consistent_hash",
        names: &["consistenthash", "hash"],
        build: |b| {
            Box::new(
                b.seed
                    .map_or_else(ConsistentHash::new, ConsistentHash::with_seed),
            )
        },
    },
];

impl Mode {
    /// Parses a mode name, case-insensitively, with the seed's aliases.
    pub fn parse(s: &str) -> Option<Mode> {
        let norm: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-' && *c != ' ')
            .collect::<String>()
            .to_ascii_lowercase();
        MODES
            .iter()
            .find(|row| row.names.contains(&norm.as_str()))
            .map(|row| row.mode)
    }

    /// The valid modes, as an error lists them.
    pub(crate) fn expected() -> String {
        let shown: Vec<&str> = MODES.iter().map(|row| row.shown).collect();
        shown.join(", ")
    }

    /// A new strategy of this mode, built from the service's balancer
    /// settings, with no members yet.
    pub(crate) fn strategy(self, balancer: &BalancerConfig) -> Box<dyn Strategy> {
        let row = MODES.iter().find(|row| row.mode == self);
        // Every variant has a row (`every_mode_has_one_row`); were one
        // missing, the default mode beats a panic.
        debug_assert!(row.is_some(), "{self:?} has no row in MODES");
        let build = row.map_or(MODES[3].build, |row| row.build);
        build(balancer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balancer(seed: Option<u64>) -> BalancerConfig {
        let json = r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#;
        let mut b = crate::Config::from_json(json).unwrap().services[0]
            .balancer
            .clone();
        b.seed = seed;
        b
    }

    /// The mode as it is serialized (stats, the web API): snake case.
    fn serialized(m: Mode) -> String {
        serde_json::to_value(m)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn every_mode_has_one_row() {
        let all = [
            Mode::RoundRobin,
            Mode::Weighted,
            Mode::LeastLoad,
            Mode::P2c,
            Mode::ConsistentHash,
        ];
        for m in all {
            // A new variant stops this match compiling until it is listed
            // above and given a row.
            match m {
                Mode::RoundRobin
                | Mode::Weighted
                | Mode::LeastLoad
                | Mode::P2c
                | Mode::ConsistentHash => {}
            }
            assert_eq!(MODES.iter().filter(|row| row.mode == m).count(), 1, "{m:?}");
        }
        assert_eq!(MODES.len(), all.len());
        assert_eq!(MODES[3].mode, Mode::P2c, "the fallback of `strategy`");
    }

    #[test]
    fn each_mode_builds_the_strategy_of_its_name() {
        for row in &MODES {
            let name = serialized(row.mode);
            for seed in [None, Some(1)] {
                assert_eq!(row.mode.strategy(&balancer(seed)).name(), name);
            }
            assert_eq!(Mode::parse(&name), Some(row.mode));
        }
    }

    #[test]
    fn the_error_lists_every_mode_with_the_seed_aliases() {
        assert_eq!(
            Mode::expected(),
            "round_robin/Poll, weighted/Weight, least_load, p2c, consistent_hash"
        );
    }

    #[test]
    fn seeded_p2c_draws_the_same_picks() {
        use crate::algo::strategy::Candidate;
        let nodes = vec![Candidate::new(1, 4); 8];
        let picks = |seed| {
            let mut s = Mode::P2c.strategy(&balancer(seed));
            (0..32).map(|_| s.pick(&nodes, None)).collect::<Vec<_>>()
        };
        // The same draws made by hand: two distinct indices from a SmallRng
        // of the seed, the second drawn among the other 7; on equal costs the
        // first wins.
        use rand::{Rng, SeedableRng};
        let by_hand = |seed| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            (0..32)
                .map(|_| {
                    let first = rng.random_range(0..8usize);
                    let _second = rng.random_range(0..7usize);
                    Some(first)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(Some(7)), by_hand(7));
        assert_eq!(picks(Some(8)), by_hand(8));
        assert_ne!(by_hand(7), by_hand(8), "the seed matters");
        let distinct: std::collections::HashSet<_> = by_hand(7).into_iter().collect();
        assert!(distinct.len() > 4, "spread over the nodes: {distinct:?}");
    }
}
