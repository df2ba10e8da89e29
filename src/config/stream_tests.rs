//! The `redis.stream` object: every field parsed, the defaults, and each
//! refusal naming its field.

use super::Config;

const SVCS: &str = r#"[{"name":"api","endpoints":[{"address":"http://h/"}]},
    {"name":"Jobs","endpoints":[{"address":"http://h/"}]}]"#;

fn with_stream(stream: &str) -> Result<Config, String> {
    Config::from_json(&format!(
        r#"{{"redis":{{"url":"redis://127.0.0.1:6379/0","stream":{stream}}},"services":{SVCS}}}"#
    ))
    .map_err(|e| e.to_string())
}

#[cfg(feature = "redis")]
mod with_feature {
    use std::time::Duration;

    use super::*;
    use crate::redis::stream::StreamConfig;

    #[test]
    fn every_field_is_parsed() {
        let c = with_stream(
            r#"{"consumer":"worker-1","group":"g","services":["api","jobs"],
                "claim_after":"30s","claim_every":"2s","max_deliveries":7,
                "idempotency_header":"X-Entry","block":"250ms","done_ttl":"2h",
                "max_in_flight":64,"max_entry_bytes":4096,"max_read_bytes":65536,
                "results_max_len":50,"dead_max_len":7}"#,
        )
        .unwrap();
        let r = c.redis.unwrap();
        let want = StreamConfig {
            consumer: "worker-1".into(),
            group: "g".into(),
            services: vec!["api".into(), "jobs".into()],
            claim_after: Some(Duration::from_secs(30)),
            claim_every: Some(Duration::from_secs(2)),
            max_deliveries: 7,
            idempotency_header: Some("X-Entry".into()),
            block: Duration::from_millis(250),
            done_ttl: Duration::from_secs(7200),
            max_in_flight: Some(64),
            max_entry_bytes: 4096,
            max_read_bytes: 65536,
            results_max_len: 50,
            dead_max_len: 7,
        };
        assert_eq!(want.read_count(100), 16, "64 KiB / 4 KiB");
        assert_eq!(want.read_count(3), 3, "the credit binds");
        assert_eq!(r.stream.as_ref(), Some(&want));
        assert_eq!(r.stream_config(), want);
    }

    #[test]
    fn an_empty_object_has_the_defaults() {
        let r = with_stream("{}").unwrap().redis.unwrap();
        let got = r.stream.unwrap();
        let d = StreamConfig::default();
        // The consumer name is `<pid>-<random>` as the default's.
        let pid = format!("{}-", std::process::id());
        assert!(got.consumer.starts_with(&pid), "{}", got.consumer);
        assert_eq!(got.consumer.len(), d.consumer.len());
        assert_eq!(
            StreamConfig {
                consumer: d.consumer.clone(),
                ..got
            },
            d
        );
        assert_eq!(d.group, "dispatch");
        assert_eq!((d.max_entry_bytes, d.max_read_bytes), (1 << 20, 64 << 20));
        assert_eq!((d.results_max_len, d.dead_max_len), (100_000, 100_000));
        assert_eq!(d.read_count(10_000), 64);
        assert_eq!(d.idempotency_header.as_deref(), Some("Idempotency-Key"));
    }

    #[test]
    fn nulls_are_defaults_and_a_null_header_sends_none() {
        let s = with_stream(
            r#"{"consumer":null,"claim_after":null,"claim_every":null,
                "idempotency_header":null,"max_in_flight":null}"#,
        )
        .unwrap()
        .redis
        .unwrap()
        .stream
        .unwrap();
        assert_eq!(s.idempotency_header, None);
        assert_eq!(
            (s.claim_after, s.claim_every, s.max_in_flight),
            (None, None, None)
        );
        assert!(!s.consumer.is_empty());
    }

    #[test]
    fn without_the_object_the_defaults_are_used() {
        let c = Config::from_json(&format!(
            r#"{{"redis":{{"url":"redis://r/"}},"services":{SVCS}}}"#
        ))
        .unwrap();
        let r = c.redis.unwrap();
        assert!(r.stream.is_none());
        let s = r.stream_config();
        assert_eq!(
            StreamConfig {
                consumer: String::new(),
                ..s
            },
            StreamConfig {
                consumer: String::new(),
                ..StreamConfig::default()
            }
        );
    }

    #[test]
    fn services_match_case_insensitively() {
        let s = with_stream(r#"{"services":["API"," Jobs "]}"#)
            .unwrap()
            .redis
            .unwrap()
            .stream
            .unwrap();
        assert_eq!(s.services, ["API", "Jobs"]);
    }

    #[test]
    fn an_unknown_service_is_refused_by_name() {
        let e = with_stream(r#"{"services":["api","nope"]}"#).unwrap_err();
        assert!(e.contains("field `redis.stream.services[1]`"), "{e}");
        assert!(e.contains(r#"unknown service "nope""#), "{e}");
    }
}

/// Refusals come from the checks every build runs (a build without the
/// feature then refuses the section as a whole).
#[cfg(feature = "redis")]
#[test]
fn hostile_values_are_refused_naming_the_field() {
    let huge = r#""18446744073709551615s""#;
    let cases = [
        (r#"{"max_deliveries":0}"#.to_owned(), "max_deliveries"),
        (r#"{"max_deliveries":-1}"#.to_owned(), "max_deliveries"),
        (r#"{"max_in_flight":0}"#.to_owned(), "max_in_flight"),
        (r#"{"max_in_flight":1000001}"#.to_owned(), "max_in_flight"),
        (r#"{"block":"0s"}"#.to_owned(), "block"),
        (r#"{"block":"1ms"}"#.to_owned(), "block"),
        (r#"{"block":"61s"}"#.to_owned(), "block"),
        (format!(r#"{{"block":{huge}}}"#), "block"),
        (r#"{"block":"soon"}"#.to_owned(), "block"),
        (r#"{"claim_after":"0s"}"#.to_owned(), "claim_after"),
        (r#"{"claim_after":"8days"}"#.to_owned(), "claim_after"),
        (format!(r#"{{"claim_after":{huge}}}"#), "claim_after"),
        (r#"{"claim_every":"0s"}"#.to_owned(), "claim_every"),
        (r#"{"claim_every":"11s"}"#.to_owned(), "claim_every"),
        (format!(r#"{{"claim_every":{huge}}}"#), "claim_every"),
        (r#"{"done_ttl":"0s"}"#.to_owned(), "done_ttl"),
        (format!(r#"{{"done_ttl":{huge}}}"#), "done_ttl"),
        (r#"{"group":""}"#.to_owned(), "group"),
        (r#"{"group":"  "}"#.to_owned(), "group"),
        (r#"{"consumer":""}"#.to_owned(), "consumer"),
        (
            r#"{"idempotency_header":""}"#.to_owned(),
            "idempotency_header",
        ),
        (
            r#"{"idempotency_header":"Bad Header"}"#.to_owned(),
            "idempotency_header",
        ),
        (r#"{"services":["nope"]}"#.to_owned(), "services[0]"),
        (r#"{"services":["api","API"]}"#.to_owned(), "services[1]"),
        (r#"{"services":"api"}"#.to_owned(), "services"),
        (r#"{"max_delivery":3}"#.to_owned(), "max_delivery"),
        (r#"{"max_entry_bytes":0}"#.to_owned(), "max_entry_bytes"),
        (
            r#"{"max_entry_bytes":1073741824}"#.to_owned(),
            "max_entry_bytes",
        ),
        (
            r#"{"max_entry_bytes":4096,"max_read_bytes":1024}"#.to_owned(),
            "max_read_bytes",
        ),
        (r#"{"results_max_len":0}"#.to_owned(), "results_max_len"),
        (r#"{"dead_max_len":0}"#.to_owned(), "dead_max_len"),
    ];
    for (stream, field) in cases {
        let e = with_stream(&stream).unwrap_err();
        let want = format!("field `redis.stream.{field}`");
        assert!(e.contains(&want), "{stream}\n  gave: {e}\n  want: {want}");
    }
    // The unknown field is named in the message.
    let e = with_stream(r#"{"max_delivery":3}"#).unwrap_err();
    assert!(e.contains("unknown field `max_delivery`"), "{e}");
    // Not an object.
    let e = with_stream("5").unwrap_err();
    assert!(e.contains("field `redis.stream`"), "{e}");
}

#[cfg(not(feature = "redis"))]
#[test]
fn a_build_without_the_feature_refuses_it() {
    let e = with_stream(r#"{"group":"g"}"#).unwrap_err();
    assert!(e.contains("no `redis` cargo feature"), "{e}");
    // A bad field is named first, as with the feature.
    let e = with_stream(r#"{"max_deliveries":0}"#).unwrap_err();
    assert!(e.contains("redis.stream.max_deliveries"), "{e}");
}
