//! Shared limits with a tenant scope through a real redis-server (feature
//! `redis`): two instances take from one tenant's bucket, and each tenant
//! has a bucket of its own. The test starts its own `redis-server` (see
//! `tests/support/redis.rs`; it skips when none is installed, unless
//! `REDIS_REQUIRED` or `CI` is set).

#![cfg(feature = "redis")]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "support/redis.rs"]
mod redis_server;

use actix_dispatch::config::{BucketConfig, Config};
use actix_dispatch::redis::{tenant_key, SharedLimits};

use redis_server::RedisServer;

/// One instance's shared store on `url`, prefix `tt`.
fn instance(url: &str) -> SharedLimits {
    let json = format!(
        r#"{{"services":[{{"name":"api","endpoints":[{{"address":"http://127.0.0.1:9"}}]}}],
            "redis":{{"url":"{url}","prefix":"tt","timeout":"5s"}}}}"#
    );
    let cfg = Config::from_json(&json).unwrap().redis.unwrap();
    SharedLimits::start(&cfg).unwrap()
}

/// A burst of 10 and one token per 100 s: nothing refills while the test
/// runs, so the grants are exact.
fn bucket() -> BucketConfig {
    BucketConfig::new(0.01, 10)
}

#[actix_rt::test]
async fn two_instances_share_one_tenants_rate_and_not_another_tenants() {
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let (a, b) = (instance(&srv.url()), instance(&srv.url()));
    let take = |s: &SharedLimits, tenant: &'static str, want: u32| {
        let s = s.clone();
        async move {
            s.take_tenant("api", tenant, bucket(), want)
                .await
                .expect("a valid key")
                .expect("redis answers")
        }
    };

    // One tenant's burst of 10, across both instances: 6, then the 4 left.
    assert_eq!(take(&a, "acme", 6).await.granted, 6);
    let g = take(&b, "acme", 6).await;
    assert_eq!(g.granted, 4);
    assert!(!g.retry_in.is_zero(), "{g:?}");
    assert_eq!(take(&a, "acme", 1).await.granted, 0);
    assert_eq!(take(&b, "acme", 1).await.granted, 0);

    // Another tenant has its own 10, on either instance.
    assert_eq!(take(&b, "globex", 7).await.granted, 7);
    assert_eq!(take(&a, "globex", 7).await.granted, 3);

    // The keys: under the prefix, on the service's slot, one per tenant,
    // expiring when the bucket would be full again (at most burst / rate).
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("tt:*:tn:*")
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(keys, ["tt:{api}:tn:acme:rl", "tt:{api}:tn:globex:rl"]);
    assert_eq!(keys[0], tenant_key("tt", "api", "acme").unwrap());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 1_000_000, "pttl {pttl}");

    // A key no tenant may have is refused before any call.
    let before = a.stats().tenant_calls;
    for bad in ["", "a b", "é", &"k".repeat(129)] {
        let r = a.take_tenant("api", bad, bucket(), 1).await;
        assert!(r.is_err(), "{bad:?}: {r:?}");
    }
    assert_eq!(a.stats().tenant_calls, before);
    assert_eq!((a.stats().tenant_calls, b.stats().tenant_calls), (3, 3));
}
