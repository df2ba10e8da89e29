//! Per-endpoint headers and secrets (issue 11, part 2): the config's
//! `headers` reach every attempt (the endpoint's over the service's; a
//! task's own header wins unless the config's is fixed), `${VAR}` values
//! come from the environment at load, and a secret never shows in logs,
//! `Debug` output, `stats()`, attempt lists or error messages.

mod support;

use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Task};
use support::echo::{Echo, Mode};

/// Secret values, set in this process's environment (each test its own
/// variables, so tests running in parallel do not meet).
fn secret(var: &str, value: &str) -> String {
    std::env::set_var(var, value);
    value.to_owned()
}

#[actix_rt::test]
async fn endpoint_keys_reach_their_endpoints_and_never_show() {
    support::logs::capture();
    let key_a = secret("ACTIX_DISPATCH_TEST_KEY_A", "sk-aaaa-0123456789-SECRET");
    let key_b = secret("ACTIX_DISPATCH_TEST_KEY_B", "sk-bbbb-9876543210-SECRET");
    let a = Echo::start(Mode::Plain);
    let b = Echo::start(Mode::Plain);
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin",
            "retry":{{"max_retries":1,"backoff_base":"1ms"}},
            "headers":{{"x-team":"search","x-org":{{"value":"acme","fixed":true}}}},
            "endpoints":[
              {{"address":"{}","headers":{{"authorization":{{"value":"Bearer ${{ACTIX_DISPATCH_TEST_KEY_A}}","fixed":true}}}}}},
              {{"address":"{}","headers":{{"authorization":"Bearer ${{ACTIX_DISPATCH_TEST_KEY_B}}","x-team":"ranking"}}}},
              {{"address":"http://127.0.0.1:1/","headers":{{"authorization":"Bearer ${{ACTIX_DISPATCH_TEST_KEY_A}}"}}}}
            ]}}]}}"#,
        a.url(false),
        b.url(false)
    );
    let config = Config::from_json(&json).unwrap();
    let config_debug = format!("{config:?}");
    let d = Dispatcher::start(config).unwrap();

    let mut results = Vec::new();
    for i in 0..9 {
        let task = Task::get("svc", format!("/t/{i}"))
            .header("authorization", "Bearer task-own")
            .header("x-org", "task-org");
        results.push(d.submit(task).await);
    }
    // What each backend received: a's fixed key replaces the task's; b's
    // key is not fixed, so the task's own wins there; the service's fixed
    // x-org always replaces the task's; b's x-team is b's own.
    let mut seen = [0, 0];
    for r in &results {
        assert!(r.is_success(), "{:?}", r.attempts);
        let body = String::from_utf8_lossy(&r.response().unwrap().body).into_owned();
        assert!(body.contains("x-org: acme\n"), "{body}");
        assert!(!body.contains("task-org"), "{body}");
        if r.node() == Some(a.url(false).as_str()) {
            seen[0] += 1;
            assert!(
                body.contains(&format!("authorization: Bearer {key_a}\n")),
                "{body}"
            );
            assert!(body.contains("x-team: search\n"), "{body}");
        } else {
            seen[1] += 1;
            assert!(body.contains("authorization: Bearer task-own\n"), "{body}");
            assert!(body.contains("x-team: ranking\n"), "{body}");
        }
        assert_eq!(body.matches("authorization:").count(), 1, "{body}");
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");

    // Nothing the engine prints carries a secret: logs (debug level, with
    // the refused third endpoint's connect errors among them), the config's
    // Debug, stats, attempt lists and outcomes other than the backends' own
    // bodies.
    let stats = serde_json::to_string(&d.stats().await).unwrap();
    d.shutdown(Duration::from_secs(1)).await;
    let mut printed = vec![config_debug, stats];
    printed.extend(support::logs::lines());
    for r in &results {
        printed.push(format!("{:?}", r.attempts));
        printed.push(format!("{:?}", r.rejection()));
    }
    assert!(
        support::logs::lines()
            .iter()
            .any(|l| l.contains("127.0.0.1:1")),
        "the refused endpoint was tried and logged"
    );
    for text in &printed {
        for key in [&key_a, &key_b] {
            assert!(!text.contains(key.as_str()), "secret printed in: {text}");
        }
    }
}

#[test]
fn a_missing_variable_is_a_config_error_naming_field_and_variable() {
    let value = secret("ACTIX_DISPATCH_TEST_KEY_C", "sk-cccc-SECRET");
    std::env::remove_var("ACTIX_DISPATCH_TEST_NOT_SET");
    let json = r#"{"services":[{"name":"svc","endpoints":[
        {"address":"http://127.0.0.1:1/","headers":{
            "x-a":"${ACTIX_DISPATCH_TEST_KEY_C}",
            "x-b":"Bearer ${ACTIX_DISPATCH_TEST_NOT_SET}"}}]}]}"#;
    let e = Config::from_json(json).unwrap_err().to_string();
    assert!(e.contains("field `endpoints[0].headers.x-b`"), "{e}");
    assert!(e.contains("ACTIX_DISPATCH_TEST_NOT_SET"), "{e}");
    assert!(!e.contains(&value), "{e}");
}

#[test]
fn routing_and_framing_headers_are_refused_in_config_too() {
    for (name, field) in [
        ("host", "headers.host"),
        ("Content-Length", "headers.Content-Length"),
        ("proxy-authorization", "headers.proxy-authorization"),
    ] {
        let json = format!(
            r#"{{"services":[{{"name":"svc","headers":{{"{name}":"x"}},"endpoints":[{{"address":"http://127.0.0.1:1/"}}]}}]}}"#
        );
        let e = Config::from_json(&json).unwrap_err().to_string();
        assert!(e.contains(&format!("field `{field}`")), "{e}");
    }
    // A value with CR/LF is refused without repeating it.
    let json = r#"{"services":[{"name":"svc","headers":{"x-a":"ok\r\nx-evil: 1"},"endpoints":[{"address":"http://127.0.0.1:1/"}]}]}"#;
    let e = Config::from_json(json).unwrap_err().to_string();
    assert!(
        e.contains("field `headers.x-a`") && !e.contains("evil"),
        "{e}"
    );
}

#[cfg(not(feature = "tls"))]
#[test]
fn tls_settings_without_the_tls_feature_are_a_config_error() {
    let json = r#"{"services":[{"name":"svc","tls":{"insecure_skip_verify":true},"endpoints":[{"address":"https://127.0.0.1:1/"}]}]}"#;
    let e = Config::from_json(json).unwrap_err().to_string();
    assert!(
        e.contains("field `tls`") && e.contains("`tls` cargo feature"),
        "{e}"
    );
}
