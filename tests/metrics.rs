//! Prometheus metrics (feature `metrics`): scripted runs against real
//! loopback backends, then a scrape, with exact counts where the script
//! makes them exact, and a check that the exposition parses.
#![cfg(feature = "metrics")]

mod support;

#[cfg(feature = "web")]
#[path = "metrics/formats.rs"]
mod formats;

use std::collections::HashMap;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Task};
use support::cfg::config;
use support::{backends, init_logs, wait};

/// One sample line: metric name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Parses the text exposition strictly enough to catch a malformed one:
/// every sample belongs to a family declared by a `# TYPE` line before it,
/// label sets are well formed, values are numbers, and it ends with `# EOF`.
fn parse(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    let mut eof = false;
    for line in text.lines() {
        assert!(!eof, "text after # EOF: {line}");
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                ["counter", "gauge", "histogram"].contains(&ty),
                "unexpected type {ty}"
            );
            types.insert(name.to_owned(), ty.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment line: {line}");
        let (head, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = HashMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                    labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                }
                (name.to_owned(), labels)
            }
            None => (head.to_owned(), HashMap::new()),
        };
        let family = types
            .keys()
            .filter(|f| name.starts_with(f.as_str()))
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("sample without # TYPE: {line}"));
        let suffix = &name[family.len()..];
        let ok = match types[family].as_str() {
            "counter" => suffix == "_total",
            "gauge" => suffix.is_empty(),
            _ => ["_bucket", "_sum", "_count"].contains(&suffix),
        };
        assert!(ok, "sample {name} does not fit its family {family}");
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    assert!(eof, "no # EOF");
    (types, samples)
}

/// The value of the one sample `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0].value
}

fn scrape(d: &Dispatcher) -> Vec<Sample> {
    let text = actix_dispatch::metrics::encode(d);
    let (types, samples) = parse(&text);
    for family in [
        "dispatch_tasks",
        "dispatch_queue_depth",
        "dispatch_in_flight",
        "dispatch_upstream_requests",
        "dispatch_upstream_request_duration_seconds",
        "dispatch_task_duration_seconds",
        "dispatch_retries",
        "dispatch_retry_budget_exhausted",
        "dispatch_hedges",
        "dispatch_breaker_state",
        "dispatch_breaker_transitions",
        "dispatch_endpoints",
        "dispatch_rate_limited",
        "dispatch_shed",
        "dispatch_concurrency_limit",
    ] {
        assert!(types.contains_key(family), "no # TYPE for {family}\n{text}");
    }
    samples
}

/// A critical task displacing a sheddable one from a full queue is counted
/// by reason and class; every other series of the family exists at zero.
#[actix_rt::test]
async fn sheds_are_counted_by_reason_and_class() {
    init_logs();
    let bs = backends(1);
    let a = &bs[0];
    a.set_latency(Duration::from_secs(30));
    let d = Dispatcher::start(config(
        "round_robin",
        &[(a, 1, 1)],
        r#""queue":{"capacity":1,"delay":{"enabled":false}}"#,
    ))
    .unwrap();
    let held = d.submit(Task::get("svc", "/held"));
    let held = actix_rt::spawn(held);
    wait::until(|| a.in_flight() == 1).await;
    let low = actix_rt::spawn(
        d.submit(Task::get("svc", "/low").priority(actix_dispatch::Priority::Sheddable)),
    );
    wait::stats_until(&d, |s| s.services[0].queue.queued == 1).await;
    let high = actix_rt::spawn(
        d.submit(Task::get("svc", "/high").priority(actix_dispatch::Priority::Critical)),
    );
    let r = low.await.unwrap();
    assert!(
        matches!(
            r.outcome,
            actix_dispatch::Outcome::Rejected(actix_dispatch::Rejection::Overloaded { .. })
        ),
        "{r:?}"
    );
    let s = scrape(&d);
    let shed = |reason, class| {
        value(
            &s,
            "dispatch_shed_total",
            &[("service", "svc"), ("reason", reason), ("class", class)],
        )
    };
    assert_eq!(shed("displaced", "sheddable"), 1.0);
    for reason in ["intake", "queue_delay", "displaced"] {
        for class in ["critical", "default"] {
            assert_eq!(shed(reason, class), 0.0, "{reason} {class}");
        }
    }
    assert_eq!(shed("intake", "sheddable"), 0.0);
    d.shutdown(Duration::ZERO).await;
    let _ = (held.await, high.await);
}

#[actix_rt::test]
async fn tasks_attempts_and_retries_are_counted_exactly() {
    init_logs();
    let bs = backends(1);
    let a = &bs[0];
    let d = Dispatcher::start(config(
        "round_robin",
        &[(a, 1, 10)],
        r#""breaker":{"consecutive_failures":100},
           "retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"1ms"}"#,
    ))
    .unwrap();
    for i in 0..5 {
        assert!(d
            .submit(Task::get("svc", format!("/ok/{i}")))
            .await
            .is_success());
    }
    a.set_status(Some(503));
    let r = d.submit(Task::get("svc", "/fail")).await;
    assert_eq!(r.attempts.len(), 3, "{r:?}");
    a.set_status(Some(404));
    let r = d.submit(Task::get("svc", "/missing")).await;
    assert_eq!(r.attempts.len(), 1, "{r:?}");

    let s = scrape(&d);
    let node = a.url();
    let svc = ("service", "svc");
    let tasks = |outcome, reason| {
        value(
            &s,
            "dispatch_tasks_total",
            &[svc, ("outcome", outcome), ("reason", reason)],
        )
    };
    assert_eq!(tasks("success", "ok"), 5.0);
    assert_eq!(tasks("failure", "retries_exhausted"), 1.0);
    assert_eq!(tasks("failure", "not_retryable"), 1.0);
    assert_eq!(tasks("rejected", "queue_full"), 0.0, "created at zero");
    assert_eq!(value(&s, "dispatch_retries_total", &[svc]), 2.0);
    assert_eq!(value(&s, "dispatch_hedges_total", &[svc]), 0.0);
    assert_eq!(
        value(&s, "dispatch_retry_budget_exhausted_total", &[svc]),
        0.0
    );
    let class = |c| {
        value(
            &s,
            "dispatch_upstream_requests_total",
            &[svc, ("node", &node), ("class", c)],
        )
    };
    assert_eq!(class("2xx"), 5.0);
    assert_eq!(class("5xx"), 3.0);
    assert_eq!(class("4xx"), 1.0);
    assert_eq!(class("timeout"), 0.0);
    assert_eq!(
        value(
            &s,
            "dispatch_upstream_request_duration_seconds_count",
            &[svc, ("node", &node)]
        ),
        9.0
    );
    let task_count = |o| {
        value(
            &s,
            "dispatch_task_duration_seconds_count",
            &[svc, ("outcome", o)],
        )
    };
    assert_eq!(task_count("success"), 5.0);
    assert_eq!(task_count("failure"), 2.0);
    // Nothing is queued or in flight once every task is answered.
    assert_eq!(value(&s, "dispatch_queue_depth", &[svc]), 0.0);
    assert_eq!(
        value(&s, "dispatch_in_flight", &[svc, ("node", &node)]),
        0.0
    );
    assert_eq!(
        value(
            &s,
            "dispatch_breaker_state",
            &[svc, ("node", &node), ("state", "closed")]
        ),
        1.0
    );
    // The metrics agree with stats().
    let st = d.stats().await;
    let q = &st.service("svc").unwrap().queue;
    assert_eq!((q.succeeded, q.failed, q.retried), (5, 2, 2));
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn breaker_transitions_and_endpoint_states_are_counted() {
    init_logs();
    let bs = backends(1);
    let a = &bs[0];
    let d = Dispatcher::start(config(
        "round_robin",
        &[(a, 1, 10)],
        r#""balancer":{"refresh_interval":"20ms"},
           "breaker":{"consecutive_failures":3,"open_for":"500ms","max_open_for":"500ms",
                      "half_open_probes":1},
           "retry":{"max_retries":0}"#,
    ))
    .unwrap();
    a.set_status(Some(503));
    for i in 0..3 {
        let r = d.submit(Task::get("svc", format!("/f/{i}"))).await;
        assert!(!r.is_success());
    }
    let node = a.url();
    let svc = ("service", "svc");
    let s = scrape(&d);
    let to = |s: &[Sample], st| {
        value(
            s,
            "dispatch_breaker_transitions_total",
            &[svc, ("node", &node), ("to", st)],
        )
    };
    let state = |s: &[Sample], st| {
        value(
            s,
            "dispatch_breaker_state",
            &[svc, ("node", &node), ("state", st)],
        )
    };
    assert_eq!(to(&s, "open"), 1.0);
    assert_eq!(state(&s, "open"), 1.0);
    assert_eq!(state(&s, "closed"), 0.0);
    // The balancer publishes endpoint states when it refreshes its view
    // (every 20 ms here), well within the 500 ms the breaker stays open.
    let mut n = 0;
    while value(&scrape(&d), "dispatch_endpoints", &[svc, ("state", "open")]) != 1.0 {
        actix_rt::time::sleep(Duration::from_millis(10)).await;
        n += 1;
        assert!(n < 150, "endpoint never counted open");
    }
    // Recovered backend: after the open time a probe succeeds and closes it.
    a.set_status(None);
    let mut n = 0;
    loop {
        let s = scrape(&d);
        if state(&s, "closed") == 1.0 {
            break;
        }
        let _ = d.submit(Task::get("svc", format!("/p/{n}"))).await;
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        n += 1;
        assert!(n < 200, "breaker never closed");
    }
    let s = scrape(&d);
    assert_eq!(to(&s, "open"), 1.0);
    assert_eq!(to(&s, "half_open"), 1.0);
    assert_eq!(to(&s, "closed"), 1.0);
    assert_eq!(state(&s, "open") + state(&s, "half_open"), 0.0);
    assert_eq!(
        value(
            &s,
            "dispatch_tasks_total",
            &[svc, ("outcome", "failure"), ("reason", "not_retryable")]
        ) + value(
            &s,
            "dispatch_tasks_total",
            &[svc, ("outcome", "failure"), ("reason", "retries_exhausted")]
        ),
        3.0
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn added_endpoints_get_their_series_and_registration_is_per_registry() {
    init_logs();
    let bs = backends(2);
    let (a, b) = (&bs[0], &bs[1]);
    let d = Dispatcher::start(config("round_robin", &[(a, 1, 10)], "")).unwrap();
    d.add_endpoint("svc", actix_dispatch::EndpointConfig::new(b.url()))
        .await
        .unwrap();
    for i in 0..4 {
        assert!(d
            .submit(Task::get("svc", format!("/x/{i}")))
            .await
            .is_success());
    }
    let s = scrape(&d);
    let svc = ("service", "svc");
    let ok = |n: &str| {
        value(
            &s,
            "dispatch_upstream_requests_total",
            &[svc, ("node", n), ("class", "2xx")],
        )
    };
    assert_eq!(ok(&a.url()) + ok(&b.url()), 4.0);
    assert!(ok(&b.url()) > 0.0, "the added node served");
    // Two registries, one set of series: no global state, no double count.
    let mut r1 = prometheus_client::registry::Registry::default();
    let mut r2 = prometheus_client::registry::Registry::default();
    d.register_metrics(&mut r1);
    d.register_metrics(&mut r2);
    let mut t1 = String::new();
    let mut t2 = String::new();
    prometheus_client::encoding::text::encode(&mut t1, &r1).unwrap();
    prometheus_client::encoding::text::encode(&mut t2, &r2).unwrap();
    assert_eq!(t1, t2);
    d.shutdown(Duration::from_secs(1)).await;
}

#[cfg(feature = "web")]
#[actix_rt::test]
async fn get_metrics_serves_the_exposition() {
    use actix_web::{test, web, App};
    init_logs();
    let bs = backends(1);
    let d = Dispatcher::start(config("round_robin", &[(&bs[0], 1, 10)], "")).unwrap();
    assert!(d.submit(Task::get("svc", "/a")).await.is_success());
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(d.clone()))
            .configure(actix_dispatch::web::configure),
    )
    .await;
    let resp =
        test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await;
    assert_eq!(resp.status(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let body = test::read_body(resp).await;
    let (_, samples) = parse(std::str::from_utf8(&body).unwrap());
    let ok = value(
        &samples,
        "dispatch_tasks_total",
        &[("service", "svc"), ("outcome", "success")],
    );
    assert_eq!(ok, 1.0);
    d.shutdown(Duration::from_secs(1)).await;
}
