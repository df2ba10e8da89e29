//! The seed format, modes and the errors of bad configs, end to end.

use super::*;

fn err(json: &str) -> String {
    Config::from_json(json).unwrap_err().to_string()
}

#[test]
fn seed_config_loads_unchanged() {
    let c = Config::from_json(
        r#"{"ApiServers":[{"Name":"Did","Mode":"Poll","ApiEndPoints":[{"Address":"http://localhost:10100/","Weight":1}]}]}"#,
    )
    .unwrap();
    let s = &c.services[0];
    assert_eq!(s.name, "Did");
    assert_eq!(s.mode, Mode::RoundRobin);
    assert_eq!(s.endpoints[0].address, "http://localhost:10100/");
    assert_eq!(s.endpoints[0].weight, 1);
    assert!(s.endpoints[0].active);
    assert_eq!(s.timeout, Duration::from_secs(5));
    assert_eq!(s.retry.max_retries, 3);
    assert_eq!(s.queue.capacity, 10_000);
}

#[test]
fn modes_are_case_insensitive_with_aliases() {
    for (m, want) in [
        ("poll", Mode::RoundRobin),
        ("ROUND_ROBIN", Mode::RoundRobin),
        ("Weight", Mode::Weighted),
        ("weighted", Mode::Weighted),
        ("Least_Load", Mode::LeastLoad),
        ("P2C", Mode::P2c),
        ("consistent_hash", Mode::ConsistentHash),
    ] {
        assert_eq!(Mode::parse(m), Some(want), "{m}");
    }
    assert_eq!(Mode::parse("random"), None);
}

#[test]
fn weights_clamped_and_a_repeated_address_keeps_its_first_entry() {
    let c = Config::from_json(
        r#"{"services":[{"name":"a","endpoints":[
            {"address":"http://127.0.0.1:1","weight":0},
            {"address":"http://127.0.0.1:2/","weight":500},
            {"address":"http://127.0.0.1:1/","weight":3,"max_concurrent":5}]}]}"#,
    )
    .unwrap();
    let e = &c.services[0].endpoints;
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].address, "http://127.0.0.1:1/");
    assert_eq!(e[0].weight, 1);
    assert_eq!(e[0].max_concurrent, 10);
    assert_eq!(e[1].weight, 100);
}

#[test]
fn bad_configs_name_service_and_field() {
    let cases = [
        (
            r#"{"services":[{"name":"a","mode":"random","endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `mode`"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[]}]}"#,
            r#"service "a": field `endpoints`"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[{"address":"ftp://h/"}]}]}"#,
            r#"service "a": field `endpoints[0].address`"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[{"address":"not a url"}]}]}"#,
            r#"service "a": field `endpoints[0].address`"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]},{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `name`: duplicate"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/","max_concurrent":0}]}]}"#,
            r#"service "a": field `endpoints[0].max_concurrent`"#,
        ),
        (
            r#"{"services":[{"name":"a","queue":{"capacity":0},"endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `queue.capacity`"#,
        ),
        (
            r#"{"services":[{"name":"a","colour":"red","endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `colour`"#,
        ),
        (
            r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/","wieght":2}]}]}"#,
            r#"service "a": field `endpoints[0].wieght`"#,
        ),
        (
            r#"{"services":[{"name":"a","retry":{"max_retries":"x"},"endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `retry.max_retries`"#,
        ),
        (
            r#"{"services":[{"name":"a","timeout":"soon","endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `timeout`"#,
        ),
        (
            r#"{"services":[{"name":"a","breaker":{"failure_rate":1.5},"endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `breaker.failure_rate`"#,
        ),
        (
            r#"{"services":[{"name":"a","rate_limit":{"per_node":{"rate":0,"burst":1}},"endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `rate_limit.per_node.rate`"#,
        ),
        (
            r#"{"services":[{"name":"a","rate_limit":{"service":{"rate":5,"burst":0}},"endpoints":[{"address":"http://h/"}]}]}"#,
            r#"service "a": field `rate_limit.service.burst`"#,
        ),
        (r#"{"services":[{"name":"a","#, "malformed config JSON"),
        (r#"{"servers":[]}"#, "field `servers`"),
        (r#"{"services":[]}"#, "field `services`"),
    ];
    for (json, want) in cases {
        let e = err(json);
        assert!(e.contains(want), "{json}\n  gave: {e}\n  want: {want}");
    }
}

#[test]
fn durations_are_human_strings() {
    let c = Config::from_json(
        r#"{"services":[{"name":"a","timeout":"250ms","retry":{"backoff_base":"10ms","backoff_max":"2s"},"endpoints":[{"address":"https://h:8443/v1"}]}]}"#,
    )
    .unwrap();
    let s = &c.services[0];
    assert_eq!(s.timeout, Duration::from_millis(250));
    assert_eq!(s.retry.backoff_base, Duration::from_millis(10));
    assert_eq!(s.endpoints[0].address, "https://h:8443/v1/");
    assert_eq!(s.mode, Mode::P2c);
}

#[test]
fn an_unknown_mode_lists_the_modes() {
    let e =
        err(r#"{"services":[{"name":"a","mode":"random","endpoints":[{"address":"http://h/"}]}]}"#);
    assert_eq!(
        e,
        r#"service "a": field `mode`: unknown mode "random" (expected round_robin/Poll, weighted/Weight, least_load, p2c, consistent_hash)"#
    );
}

#[test]
fn every_duration_is_bounded_before_any_section_is_checked() {
    // A zero backoff (retry) and an unbounded breaker duration: the bound,
    // checked for every section first, is the error reported.
    let e = err(
        r#"{"services":[{"name":"a","retry":{"backoff_base":"0s"},"breaker":{"open_for":"18446744073709551615s"},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `breaker.open_for`"), "{e}");
    // Then section by section: retry before breaker.
    let e = err(
        r#"{"services":[{"name":"a","retry":{"backoff_base":"0s"},"breaker":{"open_for":"0s"},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `retry.backoff_base`"), "{e}");
}

#[test]
fn endpoint_builders_set_their_fields() {
    let e = EndpointConfig::new("http://h/")
        .weight(3)
        .max_concurrent(7)
        .active(false);
    assert_eq!((e.weight, e.max_concurrent, e.active), (3, 7, false));
    let b = BucketConfig::new(2.5, 4);
    assert_eq!((b.rate, b.burst), (2.5, 4));
}

#[test]
fn priority_shares_default_and_are_checked_by_field() {
    let cfg =
        Config::from_json(r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#)
            .unwrap();
    assert_eq!(
        cfg.services[0].queue.priority,
        crate::algo::priority::PriorityConfig::default()
    );
    let e = err(
        r#"{"services":[{"name":"a","queue":{"priority":{"default":1.5}},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `queue.priority.default`"), "{e}");
    let e = err(
        r#"{"services":[{"name":"a","queue":{"priority":{"critical":0.9,"default":0.2}},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `queue.priority`"), "{e}");
    let e = err(
        r#"{"services":[{"name":"a","queue":{"priority":{"urgent":0.1}},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("urgent"), "{e}");
}

#[test]
fn throttle_is_off_by_default_and_checked_by_field() {
    let cfg =
        Config::from_json(r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#)
            .unwrap();
    assert_eq!(cfg.services[0].throttle, None);
    let on = Config::from_json(
        r#"{"services":[{"name":"a","throttle":{},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        on.services[0].throttle,
        Some(crate::algo::throttle::ThrottleConfig::default())
    );
    let e = err(
        r#"{"services":[{"name":"a","throttle":{"k":0.5},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `throttle.k`"), "{e}");
    let e = err(
        r#"{"services":[{"name":"a","throttle":{"window":"0s"},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("throttle.window") || e.contains("window"), "{e}");
}

#[test]
fn queue_delay_control_is_off_unless_given_and_checked_by_field() {
    let cfg =
        Config::from_json(r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#)
            .unwrap();
    let q = &cfg.services[0].queue;
    assert_eq!((&q.delay, q.deadline, q.slo), (&None, None, None));
    let on = Config::from_json(
        r#"{"services":[{"name":"a","queue":{"delay":{}},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    let d = on.services[0].queue.delay.clone().expect("on when given");
    assert_eq!(d, crate::algo::codel::CodelConfig::default());
    let off = Config::from_json(
        r#"{"services":[{"name":"a","queue":{"delay":{"enabled":false}},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    assert_eq!(off.services[0].queue.delay, None);
    let e = err(
        r#"{"services":[{"name":"a","queue":{"delay":{"target":"200ms"}},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `queue.delay.target`"), "{e}");
    let e = err(
        r#"{"services":[{"name":"a","queue":{"delay":{"max_wait":"0s"}},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `queue.delay.max_wait`"), "{e}");
    let t = Config::from_json(
        r#"{"services":[{"name":"a","queue":{"deadline":"250ms","slo":"100ms"},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    let q = &t.services[0].queue;
    assert_eq!(
        (q.deadline, q.slo),
        (
            Some(std::time::Duration::from_millis(250)),
            Some(std::time::Duration::from_millis(100))
        )
    );
    for (field, json) in [
        ("queue.deadline", r#""deadline":"0s""#),
        ("queue.slo", r#""slo":"0s""#),
        ("queue.slo", r#""slo":"400days""#),
    ] {
        let e = err(&format!(
            r#"{{"services":[{{"name":"a","queue":{{{json}}},"endpoints":[{{"address":"http://h/"}}]}}]}}"#
        ));
        assert!(e.contains(&format!("field `{field}`")), "{e}");
    }
}

#[test]
fn max_concurrent_auto_learns_within_the_service_bounds() {
    let cfg = Config::from_json(
        r#"{"services":[{"name":"a","concurrency":{"min":2,"max":64,"initial":8},
            "endpoints":[{"address":"http://h/","max_concurrent":"auto"},{"address":"http://g/","max_concurrent":5}]}]}"#,
    )
    .unwrap();
    let s = &cfg.services[0];
    assert!(s.endpoints[0].learned);
    assert_eq!(
        s.endpoints[0].max_concurrent, 64,
        "the hard cap is the learned max"
    );
    assert!(!s.endpoints[1].learned);
    assert_eq!(s.endpoints[1].max_concurrent, 5);
    assert_eq!(
        (s.concurrency.min, s.concurrency.max, s.concurrency.initial),
        (2, 64, 8)
    );
    let e = err(
        r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/","max_concurrent":"lots"}]}]}"#,
    );
    assert!(e.contains("field `endpoints[0].max_concurrent`"), "{e}");
    let e = err(
        r#"{"services":[{"name":"a","concurrency":{"initial":5000},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("field `concurrency.initial`"), "{e}");
}

/// An address with `user:password@` is refused, naming the field and
/// never echoing the password: addresses appear in stats, metric labels,
/// logs and HTTP/2's `:authority`.
#[test]
fn an_address_with_userinfo_is_refused_without_echoing_it() {
    for address in [
        "http://admin:s3cret-pw@10.0.0.1:8080/",
        "https://s3cret-pw@api.example/v1/",
        "http://admin:s3cret-pw@h",
    ] {
        let e = err(&format!(
            r#"{{"services":[{{"name":"a","endpoints":[{{"address":"http://ok/"}},{{"address":"{address}"}}]}}]}}"#
        ));
        assert!(e.contains("endpoints[1].address"), "{e}");
        assert!(e.contains("user or password"), "{e}");
        assert!(!e.contains("s3cret-pw"), "{e}");
    }
    assert!(crate::config::normalize_address("http://u:p@h/").is_err());
    assert!(crate::config::normalize_address("http://h/a@b/").is_ok());
}

/// `lines`: the defaults come from the service; set values are taken;
/// bad ones name the field.
#[test]
fn lines_default_to_the_service_and_are_checked_by_field() {
    let c = Config::from_json(
        r#"{"services":[{"name":"a","timeout":"3s","endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    let l = &c.services[0].lines;
    assert_eq!(l.max_timeout, Duration::from_secs(3));
    // 3 s × 4 attempts + 1 s × 3 backoffs (the default retry policy).
    assert_eq!(l.max_deadline, Duration::from_secs(15));
    assert_eq!(
        (l.max_body, l.max_header_bytes, l.allow_priority),
        (1 << 20, 16 << 10, false)
    );
    let c = Config::from_json(
        r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}],
            "lines":{"max_timeout":"1m","max_deadline":"1h","max_body":10,"max_header_bytes":20,"allow_priority":true}}]}"#,
    )
    .unwrap();
    let l = &c.services[0].lines;
    assert_eq!(
        (l.max_timeout, l.max_deadline),
        (Duration::from_secs(60), Duration::from_secs(3600))
    );
    assert_eq!(
        (l.max_body, l.max_header_bytes, l.allow_priority),
        (10, 20, true)
    );
    for (lines, field) in [
        (r#"{"max_timeout":"0s"}"#, "lines.max_timeout"),
        (r#"{"max_deadline":"400days"}"#, "lines.max_deadline"),
        (r#"{"max_body":2147483648}"#, "lines.max_body"),
        (
            r#"{"max_header_bytes":2147483648}"#,
            "lines.max_header_bytes",
        ),
        (r#"{"max_bodyy":1}"#, "lines"),
    ] {
        let e = err(&format!(
            r#"{{"services":[{{"name":"a","endpoints":[{{"address":"http://h/"}}],"lines":{lines}}}]}}"#
        ));
        assert!(e.contains(field), "{lines}: {e}");
    }
}

#[test]
fn queue_max_bytes_defaults_to_256_mib_and_zero_is_refused() {
    let ok = |q: &str| {
        Config::from_json(&format!(
            r#"{{"services":[{{"name":"a","endpoints":[{{"address":"http://h/"}}],"queue":{q}}}]}}"#
        ))
    };
    assert_eq!(ok("{}").unwrap().services[0].queue.max_bytes, 256 << 20);
    assert_eq!(
        ok(r#"{"max_bytes":1000}"#).unwrap().services[0]
            .queue
            .max_bytes,
        1000
    );
    let e = ok(r#"{"max_bytes":0}"#).unwrap_err().to_string();
    assert!(e.contains("queue.max_bytes"), "{e}");
}

#[test]
fn tenants_default_and_are_checked_by_field() {
    let cfg =
        Config::from_json(r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#)
            .unwrap();
    assert_eq!(
        cfg.services[0].tenants,
        crate::algo::tenants::TenantsConfig::default()
    );
    let cfg = Config::from_json(
        r#"{"services":[{"name":"a","tenants":{"weights":{"gold":4},"default_weight":2,"max_tracked":8},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    let t = &cfg.services[0].tenants;
    assert_eq!(
        (t.weights["gold"], t.default_weight, t.max_tracked),
        (4, 2, 8)
    );
    assert_eq!(t.rate, None);
    let cfg = Config::from_json(
        r#"{"services":[{"name":"a","tenants":{"rate":{"rate":2.5,"burst":4}},"endpoints":[{"address":"http://h/"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        cfg.services[0].tenants.rate,
        Some(crate::algo::tenants::TenantRate {
            rate: 2.5,
            burst: 4
        })
    );
    for (json, field) in [
        (r#"{"weights":{"gold":0}}"#, "tenants.weights.gold"),
        (r#"{"weights":{"a b":1}}"#, "tenants.weights.a b"),
        (r#"{"default_weight":5000000000}"#, "tenants.default_weight"),
        (r#"{"max_tracked":0}"#, "tenants.max_tracked"),
        (r#"{"max_tracked":70000}"#, "tenants.max_tracked"),
        (r#"{"rate":{"rate":0,"burst":1}}"#, "tenants.rate.rate"),
        (r#"{"rate":{"rate":5,"burst":0}}"#, "tenants.rate.burst"),
        (r#"{"shared":true}"#, "tenants.shared"),
        (
            r#"{"rate":{"rate":5,"burst":1},"shared":true}"#,
            "tenants.shared",
        ),
    ] {
        let e = err(&format!(
            r#"{{"services":[{{"name":"a","tenants":{json},"endpoints":[{{"address":"http://h/"}}]}}]}}"#
        ));
        assert!(e.contains(&format!("field `{field}`")), "{json}: {e}");
    }
    let e = err(
        r#"{"services":[{"name":"a","tenants":{"quota":1},"endpoints":[{"address":"http://h/"}]}]}"#,
    );
    assert!(e.contains("quota"), "{e}");
}
