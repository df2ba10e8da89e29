//! A store in this process (tests only): the two traits' rules without
//! Redis, so that the balancer's shared path runs under `cargo test --lib`
//! with paused time. Buckets are the engine's own [`TokenBucket`] (the rule
//! `gcra.lua` follows); breakers keep an open-until, a tripped flag and one
//! probe claim, as `breaker.lua` does. Answers go out at once, as messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Recipient;
use tokio::time::Instant;

use super::{Settings, SharedBreaker, TokenStore};
use crate::actors::protocol::{
    Grant, Granted, NodesGranted, ProbeClaimed, SharedBreakers, SharedState,
};
use crate::algo::limiter::TokenBucket;
use crate::algo::time;
use crate::config::BucketConfig;

/// One node's shared breaker.
#[derive(Debug, Clone, Copy, Default)]
struct Breaker {
    open_until: Option<Instant>,
    /// Tripped and not closed since: half-open once the open time is over.
    tripped: bool,
    /// The last open time, doubled by a failed probe.
    open_for: Duration,
    /// Trips reported since the last close.
    reports: u32,
    claimed: bool,
}

#[derive(Default)]
struct State {
    buckets: HashMap<String, TokenBucket>,
    breakers: HashMap<String, Breaker>,
}

/// The in-process store.
pub(crate) struct LocalStore {
    settings: Settings,
    state: Mutex<State>,
}

impl LocalStore {
    pub fn new(settings: Settings) -> Arc<LocalStore> {
        Arc::new(LocalStore {
            settings,
            state: Mutex::default(),
        })
    }

    /// Takes up to `want` tokens at `now`, each from every bucket of
    /// `keys` or from none; `due`: until the next token of every bucket
    /// when fewer than `want` were there (zero otherwise).
    pub fn take_at(&self, keys: &[(String, BucketConfig)], want: u32, now: Instant) -> Grant {
        let mut st = self.state.lock().unwrap();
        for (k, b) in keys {
            st.buckets
                .entry(k.clone())
                .or_insert_with(|| TokenBucket::new(b.rate, b.burst, now));
        }
        let mut granted = 0;
        while granted < want {
            let all = keys.iter().all(|(k, _)| st.buckets[k].check(now).is_ok());
            if !all {
                break;
            }
            for (k, _) in keys {
                let _ = st.buckets.get_mut(k).unwrap().try_acquire(now);
            }
            granted += 1;
        }
        let due = if granted < want {
            keys.iter()
                .filter_map(|(k, _)| st.buckets[k].check(now).err())
                .max()
                .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
        } else {
            Duration::ZERO
        };
        Grant { granted, due }
    }

    /// What a refresh reads of `node`'s breaker at `now`.
    pub fn state_at(&self, key: &str, now: Instant) -> SharedState {
        let st = self.state.lock().unwrap();
        match st.breakers.get(key) {
            Some(Breaker {
                open_until: Some(t),
                ..
            }) if *t > now => SharedState::Open(t.saturating_duration_since(now)),
            Some(b) if b.tripped => SharedState::HalfOpen,
            _ => SharedState::Closed,
        }
    }

    fn breaker(&self, key: String, f: impl FnOnce(&mut Breaker)) {
        f(self.state.lock().unwrap().breakers.entry(key).or_default());
    }
}

fn key(service: &str, node: &str) -> String {
    format!("{service}:{node}")
}

impl TokenStore for LocalStore {
    fn settings(&self) -> Settings {
        self.settings
    }

    fn live(&self) -> u64 {
        1
    }

    fn take(&self, service: &str, bucket: BucketConfig, want: u32, reply: Recipient<Granted>) {
        let asked = Instant::now();
        let g = self.take_at(&[(service.to_owned(), bucket)], want.max(1), asked);
        reply.do_send(Granted {
            taken: Some(g),
            asked,
        });
    }

    fn take_nodes(
        &self,
        service: &str,
        service_bucket: Option<BucketConfig>,
        node_bucket: BucketConfig,
        asks: Vec<(Arc<str>, u32)>,
        reply: Recipient<NodesGranted>,
    ) {
        let asked = Instant::now();
        let got = asks
            .iter()
            .map(|(node, want)| {
                let mut keys: Vec<_> = service_bucket
                    .map(|b| (service.to_owned(), b))
                    .into_iter()
                    .collect();
                keys.push((key(service, node), node_bucket));
                self.take_at(&keys, *want, asked)
            })
            .collect();
        reply.do_send(NodesGranted {
            asks,
            got: Some(got),
            asked,
        });
    }
}

impl SharedBreaker for LocalStore {
    fn trip(&self, service: &str, node: &str, open_for: Duration, quorum: u32) {
        let now = Instant::now();
        self.breaker(key(service, node), |b| {
            b.reports += 1;
            if b.reports >= quorum.max(1) {
                b.open_until = Some(time::add(now, open_for));
                b.open_for = open_for;
                b.tripped = true;
            }
        });
    }

    fn reopen(&self, service: &str, node: &str, open_for: Duration, max: Duration) {
        let now = Instant::now();
        self.breaker(key(service, node), |b| {
            let d = time::sum(b.open_for.max(open_for), b.open_for.max(open_for)).min(max);
            b.open_until = Some(time::add(now, d));
            b.open_for = d;
            b.tripped = true;
            b.claimed = false;
        });
    }

    fn close(&self, service: &str, node: &str) {
        self.breaker(key(service, node), |b| *b = Breaker::default());
    }

    fn claim(&self, service: &str, node: Arc<str>, _ttl: Duration, reply: Recipient<ProbeClaimed>) {
        let mut won = false;
        self.breaker(key(service, &node), |b| {
            won = !b.claimed;
            b.claimed = true;
        });
        reply.do_send(ProbeClaimed { node, won });
    }

    fn poll(&self, service: &str, nodes: Vec<Arc<str>>, reply: Recipient<SharedBreakers>) {
        let now = Instant::now();
        let states = nodes
            .into_iter()
            .map(|n| {
                let s = self.state_at(&key(service, &n), now);
                (n, s)
            })
            .collect();
        reply.do_send(SharedBreakers(states));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnDown, SharedMode};

    fn store() -> Arc<LocalStore> {
        LocalStore::new(Settings {
            mode: SharedMode::Lease,
            on_down: OnDown::Local,
            lease: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
        })
    }

    #[test]
    fn a_token_comes_from_every_bucket_of_the_ask_or_none() {
        let t0 = Instant::now();
        let s = store();
        let service = (
            "svc".to_owned(),
            BucketConfig {
                rate: 10.0,
                burst: 3,
            },
        );
        let node = (
            "svc:a".to_owned(),
            BucketConfig {
                rate: 1.0,
                burst: 2,
            },
        );
        let both = [service.clone(), node.clone()];
        // The node's burst binds: two, the next one in a second.
        assert_eq!(
            s.take_at(&both, 5, t0),
            Grant {
                granted: 2,
                due: Duration::from_secs(1)
            }
        );
        // The service's bucket lost only those two.
        assert_eq!(s.take_at(std::slice::from_ref(&service), 5, t0).granted, 1);
        let ms = Duration::from_millis;
        assert_eq!(s.take_at(&[service], 1, t0).due, ms(100));
        assert_eq!(s.take_at(&both, 1, t0 + ms(999)).granted, 0);
        assert_eq!(
            s.take_at(&both, 1, t0 + Duration::from_secs(1)),
            Grant {
                granted: 1,
                due: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_trip_opens_then_half_opens_and_a_close_ends_it() {
        let s = store();
        let t0 = Instant::now();
        let k = key("svc", "a");
        assert_eq!(s.state_at(&k, t0), SharedState::Closed);
        s.trip("svc", "a", Duration::from_secs(1), 2);
        assert_eq!(s.state_at(&k, t0), SharedState::Closed, "below quorum");
        s.trip("svc", "a", Duration::from_secs(1), 2);
        assert!(matches!(
            s.state_at(&k, Instant::now()),
            SharedState::Open(_)
        ));
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(s.state_at(&k, later), SharedState::HalfOpen);
        s.close("svc", "a");
        assert_eq!(s.state_at(&k, later), SharedState::Closed);
    }
}
