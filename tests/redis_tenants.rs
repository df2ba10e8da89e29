//! Shared limits with a tenant scope through a real redis-server (feature
//! `redis`): two instances take from one tenant's bucket, and each tenant
//! has a bucket of its own, called directly and through two dispatchers'
//! queues (`tenants.shared`). The test starts its own `redis-server` (see
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

/// Answers every request at once with 200 (in-process: the test is about
/// the queues' intake, not the backends).
struct Ok200;

impl actix_dispatch::transport::Transport for Ok200 {
    fn send(
        &self,
        _req: actix_dispatch::transport::HttpRequest,
    ) -> futures::future::LocalBoxFuture<
        'static,
        Result<actix_dispatch::transport::HttpReply, actix_dispatch::transport::TransportError>,
    > {
        Box::pin(async move { Ok(actix_dispatch::transport::HttpReply::new(200)) })
    }
}

/// One instance: service `api` with a shared rate per tenant of 20/s,
/// bursts of 10, leased 250 ms at a time (batches of 5).
fn dispatcher(url: &str) -> actix_dispatch::Dispatcher {
    dispatcher_with(url, "")
}

/// As [`dispatcher`], with `extra` in the `redis` section.
fn dispatcher_with(url: &str, extra: &str) -> actix_dispatch::Dispatcher {
    use std::rc::Rc;
    use std::sync::Arc;
    let json = format!(
        r#"{{"services":[{{"name":"api","endpoints":[{{"address":"http://127.0.0.1:9","max_concurrent":1000}}],
            "tenants":{{"rate":{{"rate":20,"burst":10}},"shared":true}}}}],
            "redis":{{"url":"{url}","prefix":"td","timeout":"1s","lease":"250ms"{extra}}}}}"#
    );
    let cfg = Config::from_json(&json).unwrap();
    let factory: actix_dispatch::transport::TransportFactory =
        Arc::new(|_: &str| Rc::new(Ok200) as Rc<dyn actix_dispatch::transport::Transport>);
    actix_dispatch::Dispatcher::builder(cfg)
        .transport(factory)
        .start()
        .unwrap()
}

/// Two dispatchers sharing a Redis: tenant `acme`, sent 100 tasks a second
/// on each for 2 s, gets about its one rate in total (10 + 20 · 2 = 50,
/// not 50 on each); `globex`, sent on one only, gets its own rate beside.
#[actix_rt::test]
async fn two_dispatchers_share_a_tenants_rate_through_redis() {
    use actix_dispatch::{Outcome, Rejection, Task};
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let (a, b) = (dispatcher(&srv.url()), dispatcher(&srv.url()));
    let mut pending = Vec::new();
    let mut tick = actix_rt::time::interval(std::time::Duration::from_millis(10));
    for i in 0..200 {
        tick.tick().await;
        for (d, tenant) in [(&a, "acme"), (&b, "acme"), (&a, "globex")] {
            let sub = d.submit(Task::get("api", format!("/{i}")).tenant(tenant));
            pending.push((tenant, actix_rt::spawn(sub)));
        }
    }
    let mut passed = std::collections::BTreeMap::<&str, (u32, u32)>::new();
    for (tenant, p) in pending {
        let r = p.await.unwrap();
        let e = passed.entry(tenant).or_default();
        match r.outcome {
            Outcome::Success(_) => e.0 += 1,
            Outcome::Rejected(Rejection::RateLimited { .. }) => e.1 += 1,
            other => panic!("{tenant}: {other:?}"),
        }
    }
    println!("(passed, rate limited) per tenant: {passed:?}");
    // About 50 each (burst 10 and 20/s over 2 s), plus at most a batch of
    // credit per instance; wide margins for a busy machine, but well
    // below the 100 that two local buckets would pass for acme.
    let (acme, globex) = (passed["acme"], passed["globex"]);
    assert!((30..=75).contains(&acme.0), "acme: {passed:?}");
    assert_eq!(acme.0 + acme.1, 400);
    assert!((30..=75).contains(&globex.0), "globex: {passed:?}");
    // Each tenant's bucket is its own key in Redis.
    let client = redis::Client::open(srv.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("td:*:tn:*")
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(keys, ["td:{api}:tn:acme:rl", "td:{api}:tn:globex:rl"]);
    // Batches, not a call per task.
    let st = a.stats().await;
    let rows = &st.services[0].queue.tenants;
    let acme_a = rows
        .iter()
        .find(|r| r.tenant.as_deref() == Some("acme"))
        .unwrap();
    assert_eq!(acme_a.offered, 200);
    assert_eq!(
        u64::from(acme.1),
        acme_a.rate_limited + {
            let st = b.stats().await;
            let r = st.services[0]
                .queue
                .tenants
                .iter()
                .find(|r| r.tenant.as_deref() == Some("acme"))
                .map_or(0, |r| r.rate_limited);
            r
        }
    );
    // Instance a passed 200 acme and 200 globex tasks: a call per batch
    // (5) or per due time, far fewer than a call per task.
    let calls = st.shared.as_ref().unwrap().tenant_calls;
    println!("instance a: {calls} calls for its tenants' tokens");
    assert!(calls > 0 && calls < 200, "{calls} calls");
    a.shutdown(std::time::Duration::from_secs(1)).await;
    b.shutdown(std::time::Duration::from_secs(1)).await;
}

/// Redis stops answering: a tenant's tasks go on the credit of the call
/// out (one batch), then, once the call timed out, `on_down: local` gives
/// the tenant a local bucket (its rate and burst over the one live
/// instance: 10 at once). (Back to the shared bucket once Redis answers:
/// the unit tests of `TenantLease`.)
#[actix_rt::test]
async fn while_redis_is_down_a_tenant_has_a_local_bucket() {
    use actix_dispatch::{Outcome, Task};
    use std::time::Duration;
    let Some(srv) = RedisServer::start() else {
        return;
    };
    let d = dispatcher_with(&srv.url(), r#","on_down":"local","expected_instances":1"#);
    let passed = |n: usize| {
        let d = d.clone();
        async move {
            let tasks = (0..n).map(|i| d.submit(Task::get("api", format!("/{i}")).tenant("acme")));
            futures::future::join_all(tasks)
                .await
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::Success(_)))
                .count()
        }
    };
    // Redis answers: the burst of 10 (on credit, then leased).
    assert!((5..=12).contains(&passed(10).await));
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    srv.pause();
    // The call out has not answered: one batch (5) on its credit.
    let on_credit = passed(40).await;
    assert!((1..=10).contains(&on_credit), "{on_credit}");
    // Past the 1 s timeout: the local bucket, full (10), not everything
    // (`allow`) nor nothing (`deny`).
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    let local = passed(40).await;
    println!("passed: {on_credit} on credit, {local} by the local bucket");
    assert!((8..=14).contains(&local), "{local}");
    srv.resume();
    d.shutdown(Duration::from_secs(1)).await;
}
