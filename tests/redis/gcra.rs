//! The GCRA script on Redis against the local `TokenBucket`, under a forced `now`.

use std::time::Duration;

use actix_dispatch::algo::limiter::TokenBucket;
use actix_dispatch::config::BucketConfig;
use actix_dispatch::redis::{take_many, take_tokens, Ask};

use crate::redis_server::RedisServer;

/// The script decides exactly as `TokenBucket` does, under a forced `now`:
/// every arrival of a sequence is admitted or refused alike.
#[actix_rt::test]
async fn gcra_script_is_exact_under_a_forced_now() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let base: u64 = 1_700_000_000_000_000;

    // A fresh bucket admits exactly its burst at one instant (rate 10,
    // burst 5); the next token is due one interval (100 ms) later.
    let b = BucketConfig::new(10.0, 5);
    let keys = vec![("t:{a}:rl".to_string(), b)];
    let t = take_tokens(&mut con, &keys, 7, Some(base)).await.unwrap();
    assert_eq!(t.granted, 5);
    // Due again when the wanted tokens are, at most half the burst (3):
    // three intervals.
    assert_eq!(t.retry_in, Duration::from_millis(300));
    let t = take_tokens(&mut con, &keys, 1, Some(base + 99_999))
        .await
        .unwrap();
    assert_eq!((t.granted, t.retry_in), (0, Duration::from_micros(1)));
    let t = take_tokens(&mut con, &keys, 1, Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(t.granted, 1);
    // TTL (on Redis's own clock): the time until the bucket is full again,
    // here 3 intervals after taking 3 tokens.
    let ttl_keys = vec![("t:{ttl}:rl".to_string(), b)];
    let t = take_tokens(&mut con, &ttl_keys, 3, None).await.unwrap();
    assert_eq!(t.granted, 3);
    let pttl: i64 = redis::cmd("PTTL")
        .arg("t:{ttl}:rl")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 200 && pttl <= 300, "pttl {pttl}");

    // Steady overload (arrivals every T/2): burst + n admitted, as the
    // local bucket's test says; and arrival by arrival the same answers.
    for (i, burst) in [1u32, 4, 25].into_iter().enumerate() {
        let b = BucketConfig::new(100.0, burst);
        let keys = vec![(format!("t:{{s{i}}}:rl"), b)];
        let t0 = tokio::time::Instant::now();
        let mut local = TokenBucket::new(100.0, burst, t0);
        let n = 100u64;
        let mut admitted = 0;
        for k in 0..=2 * n {
            let us = k * 5_000;
            let remote = take_tokens(&mut con, &keys, 1, Some(base + us))
                .await
                .unwrap();
            let here = local.try_acquire(t0 + Duration::from_micros(us)).is_ok();
            assert_eq!(remote.granted == 1, here, "burst {burst}, arrival {k}");
            admitted += remote.granted as u64;
        }
        assert_eq!(admitted, u64::from(burst) + n, "burst {burst}");
    }

    // Irregular gaps (rate 250/s: T = 4 ms exactly in µs and ns).
    let b = BucketConfig::new(250.0, 3);
    let keys = vec![("t:{g}:rl".to_string(), b)];
    let t0 = tokio::time::Instant::now();
    let mut local = TokenBucket::new(250.0, 3, t0);
    let mut us = 0u64;
    for k in 0..300u64 {
        us += (k * 7_919) % 9_000;
        let remote = take_tokens(&mut con, &keys, 1, Some(base + us))
            .await
            .unwrap();
        let here = local.try_acquire(t0 + Duration::from_micros(us));
        assert_eq!(remote.granted == 1, here.is_ok(), "arrival {k} at {us} µs");
    }

    // Atomic over several buckets (a service's and a node's): tokens are
    // taken from both or neither.
    let svc = BucketConfig::new(10.0, 2);
    let node = BucketConfig::new(100.0, 5);
    let keys = vec![
        ("t:{m}:rl".to_string(), svc),
        ("t:{m}:node".to_string(), node),
    ];
    let t = take_tokens(&mut con, &keys, 4, Some(base)).await.unwrap();
    assert_eq!(t.granted, 2);
    let t = take_tokens(&mut con, &keys[1..], 4, Some(base))
        .await
        .unwrap();
    assert_eq!(t.granted, 3, "the node bucket gave exactly 2 before");
}

/// Two buckets in one ask (a service's and a node's) under a forced
/// `now`: a token is taken from both or from neither, arrival by arrival
/// exactly as two local buckets checked together; asks sharing the
/// service bucket take turns; `due` says when the wanted tokens are there.
#[actix_rt::test]
async fn gcra_script_takes_from_both_buckets_or_neither() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let base: u64 = 1_700_000_000_000_000;
    let both = |want| Ask {
        buckets: vec![0, 1],
        want,
    };
    let one = |b, want| Ask {
        buckets: vec![b],
        want,
    };

    // The node's bucket is empty: nothing is taken from the service's.
    let keys = vec![
        ("n:{e}:rl".to_string(), BucketConfig::new(100.0, 10)),
        ("n:{e}:rl:node".to_string(), BucketConfig::new(10.0, 1)),
    ];
    let (g, _) = take_many(&mut con, &keys, &[one(1, 1)], Some(base))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 1, "the node's one token");
    let (g, _) = take_many(&mut con, &keys, &[both(3)], Some(base + 1_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 0, "node empty: neither bucket gives");
    // Due when the node's next token is: 100 ms after the first, 99 ms on.
    assert_eq!(g[0].due, Duration::from_millis(99));
    let (g, _) = take_many(&mut con, &keys, &[one(0, 20)], Some(base + 1_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 10, "the service's bucket is still full");
    // Now the service's is emptied: the node's next token stays.
    let (g, _) = take_many(&mut con, &keys, &[one(0, 20)], Some(base + 100_000))
        .await
        .unwrap();
    assert!(g[0].granted >= 1, "the service's refilled tokens taken");
    let (g, _) = take_many(&mut con, &keys, &[both(1)], Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 0, "service empty: neither bucket gives");
    let (g, _) = take_many(&mut con, &keys, &[one(1, 1)], Some(base + 100_000))
        .await
        .unwrap();
    assert_eq!(g[0].granted, 1, "the node's token was not taken");

    // Two nodes' asks share the service's bucket (burst 4): turns, 2 each.
    let keys = vec![
        ("n:{t}:rl".to_string(), BucketConfig::new(10.0, 4)),
        ("n:{t}:rl:a".to_string(), BucketConfig::new(100.0, 10)),
        ("n:{t}:rl:b".to_string(), BucketConfig::new(100.0, 10)),
    ];
    let asks = [
        Ask {
            buckets: vec![0, 1],
            want: 5,
        },
        Ask {
            buckets: vec![0, 2],
            want: 5,
        },
    ];
    let (g, _) = take_many(&mut con, &keys, &asks, Some(base)).await.unwrap();
    assert_eq!((g[0].granted, g[1].granted), (2, 2));

    // Arrival by arrival, the same answers as two local buckets checked
    // together (service 50/s burst 3, node 20/s burst 2, every 7 ms).
    let svc = BucketConfig::new(50.0, 3);
    let node = BucketConfig::new(20.0, 2);
    let keys = vec![
        ("n:{s}:rl".to_string(), svc),
        ("n:{s}:rl:node".to_string(), node),
    ];
    let t0 = tokio::time::Instant::now();
    let mut ls = TokenBucket::new(50.0, 3, t0);
    let mut ln = TokenBucket::new(20.0, 2, t0);
    let mut admitted = 0;
    for k in 0..300u64 {
        let us = k * 7_000;
        let at = t0 + Duration::from_micros(us);
        let (g, _) = take_many(&mut con, &keys, &[both(1)], Some(base + us))
            .await
            .unwrap();
        let here = ls.check(at).is_ok() && ln.check(at).is_ok();
        if here {
            ls.try_acquire(at).unwrap();
            ln.try_acquire(at).unwrap();
        }
        assert_eq!(g[0].granted == 1, here, "arrival {k} at {us} µs");
        admitted += g[0].granted;
    }
    // The node's bucket binds: burst + 20/s over 2.093 s.
    assert!((2 + 40..=2 + 42).contains(&admitted), "{admitted}");
}
