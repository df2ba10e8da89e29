//! Bounds at load, the seed's semantics, and a fuzz of `Config::from_json`.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::*;
use crate::algo::time::MAX_DURATION;

fn svc(extra: &str) -> String {
    format!(
        r#"{{"services":[{{"name":"a","endpoints":[{{"address":"http://h/"}}]{}{extra}}}]}}"#,
        if extra.is_empty() { "" } else { "," }
    )
}

fn err(json: &str) -> String {
    Config::from_json(json).unwrap_err().to_string()
}

// === bounds ===

#[test]
fn timeout_of_u64_max_seconds_is_refused_not_a_panic() {
    let e = err(&svc(r#""timeout":"18446744073709551615s""#));
    assert!(e.contains(r#"service "a": field `timeout`"#), "{e}");
    assert!(e.contains("365 days"), "{e}");
}

#[test]
fn every_duration_field_is_bounded_and_named() {
    let huge = r#""18446744073709551615s""#;
    let cases = [
        ("timeout", format!(r#""timeout":{huge}"#)),
        (
            "retry.backoff_base",
            format!(r#""retry":{{"backoff_base":{huge}}}"#),
        ),
        (
            "retry.backoff_max",
            format!(r#""retry":{{"backoff_max":{huge}}}"#),
        ),
        (
            "retry.max_retry_after",
            format!(r#""retry":{{"max_retry_after":{huge}}}"#),
        ),
        (
            "balancer.refresh_interval",
            format!(r#""balancer":{{"refresh_interval":{huge}}}"#),
        ),
        (
            "balancer.decay",
            format!(r#""balancer":{{"decay":{huge}}}"#),
        ),
        (
            "balancer.default_rtt",
            format!(r#""balancer":{{"default_rtt":{huge}}}"#),
        ),
        (
            "balancer.failure_penalty",
            format!(r#""balancer":{{"failure_penalty":{huge}}}"#),
        ),
        (
            "balancer.slow_start",
            format!(r#""balancer":{{"slow_start":{huge}}}"#),
        ),
        (
            "breaker.slow_call",
            format!(r#""breaker":{{"slow_call":{huge}}}"#),
        ),
        (
            "breaker.open_for",
            format!(r#""breaker":{{"open_for":{huge}}}"#),
        ),
        (
            "breaker.max_open_for",
            format!(r#""breaker":{{"max_open_for":{huge}}}"#),
        ),
        (
            "breaker.reset_after",
            format!(r#""breaker":{{"reset_after":{huge}}}"#),
        ),
        (
            "breaker.probe_timeout",
            format!(r#""breaker":{{"probe_timeout":{huge}}}"#),
        ),
        (
            "health_check.interval",
            format!(r#""health_check":{{"interval":{huge}}}"#),
        ),
        (
            "health_check.timeout",
            format!(r#""health_check":{{"timeout":{huge}}}"#),
        ),
        ("hedge.after", format!(r#""hedge":{{"after":{huge}}}"#)),
    ];
    for (field, extra) in cases {
        let e = err(&svc(&extra));
        assert!(
            e.contains(&format!(r#"service "a": field `{field}`"#)) && e.contains("365 days"),
            "{field}: {e}"
        );
    }
    // Just past the bound is refused too; the bound itself loads.
    let e = err(&svc(r#""hedge":{"after":"365days 1s"}"#));
    assert!(e.contains("`hedge.after`"), "{e}");
    let c = Config::from_json(&svc(r#""timeout":"365days""#)).unwrap();
    assert_eq!(c.services[0].timeout, MAX_DURATION);
    assert_eq!(
        c.services[0].breaker.breaker.probe_timeout,
        MAX_DURATION * 2
    );
}

#[test]
fn a_rate_slower_than_one_token_a_year_is_refused() {
    let e = err(&svc(
        r#""rate_limit":{"per_node":{"rate":1e-300,"burst":1}}"#,
    ));
    assert!(e.contains("`rate_limit.per_node.rate`"), "{e}");
    assert!(Config::from_json(&svc(r#""rate_limit":{"service":{"rate":1e-6,"burst":1}}"#)).is_ok());
}

// === the seed's semantics ===

#[test]
fn repeated_address_keeps_first_entry_so_a3_b1_a2_splits_3_to_1() {
    let c = Config::from_json(
        r#"{"ApiServers":[{"Name":"Did","Mode":"Weight","ApiEndPoints":[
            {"Address":"http://a:1/","Weight":3},
            {"Address":"http://b:1/","Weight":1},
            {"Address":"http://a:1","Weight":2,"IsActive":false}]}]}"#,
    )
    .unwrap();
    let e = &c.services[0].endpoints;
    let weights: Vec<(&str, u32, bool)> = e
        .iter()
        .map(|e| (e.address.as_str(), e.weight, e.active))
        .collect();
    assert_eq!(
        weights,
        [("http://a:1/", 3, true), ("http://b:1/", 1, true)]
    );
}

#[test]
fn service_names_match_case_insensitively() {
    let c = Config::from_json(
        r#"{"ApiServers":[{"Name":"Did","ApiEndPoints":[{"Address":"http://h/"}]}]}"#,
    )
    .unwrap();
    assert_eq!(c.service("did").map(|s| s.name.as_str()), Some("Did"));
    assert_eq!(c.service("DID").map(|s| s.name.as_str()), Some("Did"));
    let e = err(
        r#"{"services":[{"name":"Did","endpoints":[{"address":"http://h/"}]},
                        {"name":"did","endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(
        e.contains(r#"service "did": field `name`: duplicate"#),
        "{e}"
    );
}

#[test]
fn seed_is_active_flag_is_an_alias_of_active() {
    let c = Config::from_json(
        r#"{"ApiServers":[{"Name":"Did","ApiEndPoints":[
            {"Address":"http://a/","IsActive":false},{"Address":"http://b/","IsActive":true}]}]}"#,
    )
    .unwrap();
    let active: Vec<bool> = c.services[0].endpoints.iter().map(|e| e.active).collect();
    assert_eq!(active, [false, true]);
}

// === fuzz ===

/// Valid configs to start from: the seed's format, the design's example,
/// and one with every field set.
fn seeds() -> Vec<Value> {
    vec![
        json!({"ApiServers":[{"Name":"Did","Mode":"Poll","ApiEndPoints":[
            {"Address":"http://localhost:10100/","Weight":1},
            {"Address":"http://localhost:10101/","Weight":3,"IsActive":false}]}]}),
        json!({"services":[{"name":"inference","mode":"p2c","timeout":"5s",
            "endpoints":[{"address":"http://127.0.0.1:8080/","weight":5,"max_concurrent":10}],
            "retry":{"max_retries":3,"backoff_base":"25ms","backoff_max":"1s"},
            "queue":{"capacity":10000,"on_full":"reject"}}]}),
        json!({"services":[{"name":"all","mode":"least_load","timeout":"800ms","max_body":1024,
            "endpoints":[{"address":"http://10.0.0.1:9200/v1","weight":2,"max_concurrent":32,"active":true},
                         {"address":"https://10.0.0.2:9200/","weight":100}],
            "retry":{"max_retries":2,"backoff_base":"20ms","backoff_max":"200ms","max_retry_after":"10s",
                     "budget_percent":0.1,"min_retries_per_sec":10},
            "queue":{"capacity":5,"on_full":"wait"},
            "balancer":{"refresh_interval":"1s","least_load":{"in_flight":0.5,"latency":0.3,"errors":0.2},
                        "decay":"10s","default_rtt":"30ms","failure_penalty":"1s","slow_start":"30s",
                        "slow_start_floor":0.1,"seed":7},
            "breaker":{"enabled":true,"consecutive_failures":3,"failure_rate":0.5,"window":20,"min_calls":10,
                       "slow_call":"2s","open_for":"2s","max_open_for":"30s","reset_after":"60s",
                       "half_open_probes":1,"probe_timeout":"3s","on_all_open":"fail_fast",
                       "max_ejected_percent":50},
            "rate_limit":{"per_node":{"rate":200,"burst":50},"service":{"rate":0.5,"burst":1},"on_limit":"reject"},
            "fallback":{"status":200,"headers":{"x-degraded":"1"},"body":"{}"},
            "health_check":{"path":"health","interval":"5s","timeout":"1s","unhealthy_threshold":3,"healthy_threshold":2},
            "hedge":{"after":"50ms"}},
            {"name":"b","endpoints":[{"address":"http://h/"}],"hedge":{"percentile":95}}]}),
    ]
}

/// Replacement values: huge, negative and odd numbers, extreme durations,
/// wrong types.
fn replacement(k: usize) -> Option<Value> {
    let vals = [
        json!(u64::MAX),
        json!(i64::MIN),
        json!(-1),
        json!(0),
        json!(0.5),
        json!(1e308),
        json!(-1e308),
        json!(4294967296u64),
        json!("18446744073709551615s"),
        json!("584942417355y"),
        json!("99999999999999999999999h"),
        json!("365days 1ns"),
        json!("-1s"),
        json!("0s"),
        json!("1ns"),
        json!("weight"),
        json!(""),
        json!(true),
        json!(null),
        json!([]),
        json!({}),
        json!("http://h/../x"),
        json!("Poll"),
    ];
    vals.get(k % (vals.len() + 1)).cloned() // the last slot deletes
}

/// Paths (object keys and array indexes) of every node of `v`.
fn paths(v: &Value, here: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(here.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                here.push(json!(k));
                paths(c, here, out);
                here.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                here.push(json!(i));
                paths(c, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

/// Replaces (or deletes, `None`) the node at `path`.
fn mutate(root: &mut Value, path: &[Value], with: Option<Value>) {
    let Some((last, parents)) = path.split_last() else {
        if let Some(w) = with {
            *root = w;
        }
        return;
    };
    let mut cur = root;
    for step in parents {
        cur = match (cur, step) {
            (Value::Object(m), Value::String(k)) => m.get_mut(k.as_str()).expect("path"),
            (Value::Array(a), Value::Number(i)) => &mut a[i.as_u64().expect("index") as usize],
            _ => return,
        };
    }
    match (cur, last, with) {
        (Value::Object(m), Value::String(k), Some(w)) => {
            m.insert(k.clone(), w);
        }
        (Value::Object(m), Value::String(k), None) => {
            m.remove(k.as_str());
        }
        (Value::Array(a), Value::Number(i), Some(w)) => a[i.as_u64().expect("index") as usize] = w,
        (Value::Array(a), Value::Number(i), None) => {
            a.remove(i.as_u64().expect("index") as usize);
        }
        _ => {}
    }
}

/// What the engine builds from a loaded config must not panic either.
fn build_parts(c: &Config) {
    let now = Instant::now();
    for s in &c.services {
        assert!(s.timeout <= MAX_DURATION && !s.timeout.is_zero());
        for d in [
            s.retry.backoff_base,
            s.retry.backoff_max,
            s.retry.max_retry_after,
            s.balancer.refresh_interval,
            s.balancer.decay,
            s.balancer.default_rtt,
            s.balancer.failure_penalty,
            s.breaker.breaker.open_for,
            s.breaker.breaker.max_open_for,
            s.breaker.breaker.reset_after,
        ] {
            assert!(d <= MAX_DURATION, "{} {d:?}", s.name);
        }
        let _ = crate::algo::breaker::Breaker::new(s.breaker.breaker.clone());
        let _ = crate::algo::budget::RetryBudget::new(s.retry.budget.clone(), now);
        let _ = crate::algo::backoff::Backoff::new(s.retry.backoff_base, s.retry.backoff_max);
        for b in [s.rate_limit.per_node, s.rate_limit.service]
            .into_iter()
            .flatten()
        {
            let _ = crate::algo::limiter::TokenBucket::new(b.rate, b.burst, now);
        }
        let _ = crate::algo::ewma::PeakEwma::new(s.balancer.default_rtt, s.balancer.decay, now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn from_json_never_panics_on_mutated_configs(
        seed in 0usize..3,
        edits in prop::collection::vec((any::<usize>(), any::<usize>()), 1..5),
    ) {
        let mut v = seeds().swap_remove(seed);
        for (at, k) in edits {
            let mut all = Vec::new();
            paths(&v, &mut Vec::new(), &mut all);
            let path = all[at % all.len()].clone();
            mutate(&mut v, &path, replacement(k));
        }
        if let Ok(c) = Config::from_json(&v.to_string()) {
            build_parts(&c);
        }
    }

    #[test]
    fn from_json_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = Config::from_json(&text);
    }

    #[test]
    fn from_json_never_panics_on_any_duration_string(
        field in prop::sample::select(vec![
            "timeout", "retry.backoff_base", "retry.backoff_max", "hedge.after",
            "breaker.open_for", "health_check.interval", "balancer.decay",
        ]),
        n in any::<u64>(),
        unit in prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "w", "y"]),
    ) {
        let value = format!(r#""{n}{unit}""#);
        let extra = match field.split_once('.') {
            None => format!(r#""{field}":{value}"#),
            Some((a, b)) => format!(r#""{a}":{{"{b}":{value}}}"#),
        };
        if let Ok(c) = Config::from_json(&svc(&extra)) {
            build_parts(&c);
        }
    }
}

#[test]
fn the_seeds_load() {
    for s in seeds() {
        let c = Config::from_json(&s.to_string()).unwrap_or_else(|e| panic!("{e}\n{s}"));
        build_parts(&c);
    }
    assert!(Config::from_json(&svc("")).is_ok());
    let _ = Duration::ZERO;
}
