//! Consistent hashing and a living pool changed under load, against real
//! loopback backends: counts only, no waiting. The timing-based balancing
//! (p2c under a slow node, slow start, health checks, hedging, a recovered
//! node tried again) is held exactly under paused time in `tests/timing.rs`
//! and `tests/decisions.rs`.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, EndpointConfig, Task, TaskResult};
use futures::StreamExt;
use support::cfg::{config, served_by};
use support::{backends, init_logs};

async fn run(d: &Dispatcher, n: usize, concurrency: usize, tag: &str) -> Vec<TaskResult> {
    futures::stream::iter(0..n)
        .map(|i| d.submit(Task::get("svc", format!("/{tag}/{i}"))))
        .buffer_unordered(concurrency)
        .collect()
        .await
}

#[actix_rt::test]
async fn consistent_hash_keeps_keys_and_moves_only_an_unavailable_nodes_keys() {
    init_logs();
    let bs = backends(4);
    let nodes: Vec<_> = bs.iter().map(|b| (b, 1, 32)).collect();
    let d = Dispatcher::start(config("consistent_hash", &nodes, "")).unwrap();
    async fn owners(d: &Dispatcher) -> HashMap<String, String> {
        let mut m = HashMap::new();
        for k in 0..200 {
            let key = format!("user-{k}");
            let r = d.submit(Task::get("svc", "/h").affinity(key.clone())).await;
            m.insert(key, served_by(&r));
        }
        m
    }
    let first = owners(&d).await;
    assert_eq!(first, owners(&d).await, "same key, same node");
    let per_node = |m: &HashMap<String, String>, n: &str| m.values().filter(|v| *v == n).count();
    for b in &bs {
        assert!(
            per_node(&first, &b.url()) > 20,
            "keys spread: {}",
            per_node(&first, &b.url())
        );
    }
    let out = bs[1].url();
    d.set_active("svc", &out, false).await.unwrap();
    let during = owners(&d).await;
    for (k, v) in &first {
        if *v == out {
            assert_ne!(during[k], out);
        } else {
            assert_eq!(&during[k], v, "a key of a healthy node moved");
        }
    }
    d.set_active("svc", &out, true).await.unwrap();
    assert_eq!(first, owners(&d).await, "keys come back");
    // Tasks without a key fall back to p2c and are spread.
    let results = run(&d, 200, 8, "nokey").await;
    assert!(results.iter().all(TaskResult::is_success));
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn add_remove_reweight_under_load_lose_nothing() {
    init_logs();
    let bs = backends(4);
    for b in &bs {
        b.set_latency(Duration::from_millis(2));
    }
    let d = Dispatcher::start(config(
        "weighted",
        &[(&bs[0], 1, 8), (&bs[1], 1, 8)],
        r#""queue":{"capacity":500}"#,
    ))
    .unwrap();
    const N: usize = 6000;
    let tasks = futures::stream::iter((0..N).map(|i| Task::get("svc", format!("/live/{i}"))));
    let mut results = d.feed(tasks);
    let mut ids = std::collections::HashSet::new();
    let mut ok = 0;
    let mut b0_at_removal = None;
    while let Some(r) = results.next().await {
        assert!(ids.insert(r.id));
        ok += r.is_success() as usize;
        match ids.len() {
            1000 => d
                .add_endpoint("svc", EndpointConfig::new(bs[2].url()).max_concurrent(8))
                .await
                .unwrap(),
            2000 => {
                d.remove_endpoint("svc", &bs[0].url()).await.unwrap();
                b0_at_removal = Some(bs[0].hits());
            }
            3000 => d.set_weight("svc", &bs[1].url(), 5).await.unwrap(),
            4000 => {
                let json = format!(
                    r#"{{"services":[{{"name":"svc","mode":"weighted","endpoints":[
                        {{"address":"{}","weight":5,"max_concurrent":8}},
                        {{"address":"{}","max_concurrent":8}},
                        {{"address":"{}","max_concurrent":8}}]}}]}}"#,
                    bs[1].url(),
                    bs[2].url(),
                    bs[3].url()
                );
                let rep = d.reload(Config::from_json(&json).unwrap()).await.unwrap();
                assert_eq!(rep.changed[0].1.added, vec![bs[3].url()]);
                assert_eq!(rep.changed[0].1.kept.len(), 2);
            }
            _ => {}
        }
    }
    assert_eq!(ok, N, "every task succeeded");
    // After removal, node 0 only finished what it had in flight.
    assert!(bs[0].hits() <= b0_at_removal.unwrap() + 8);
    assert!(bs[2].hits() > 0 && bs[3].hits() > 0);
    let s = d.stats().await;
    let svc = &s.services[0];
    assert!(svc.is_balanced());
    assert_eq!(svc.nodes.len(), 3);
    // Node 1 was kept through the reload: its counters survived.
    assert!(svc.node(&bs[1].url()).unwrap().total >= 1000);
    assert_eq!(
        d.remove_endpoint("svc", "http://127.0.0.1:1/").await,
        Err(actix_dispatch::PoolError::UnknownEndpoint(
            "http://127.0.0.1:1/".into()
        ))
    );
    d.shutdown(Duration::from_secs(1)).await;
}
