//! HTTPS end to end (issue 11, part 1): rustls backends on 127.0.0.1 with a
//! CA and certificates made at test time, trusted through the config's
//! `tls.ca_file`. Which protocol each attempt used (h2 where the server
//! offers it over ALPN), and TLS failures (unknown CA, wrong host, expired)
//! classified as `ErrorKind::Tls`, sent to another node, and counted against
//! the node's breaker.

#![cfg(feature = "tls")]

mod support;

#[path = "tls/clients.rs"]
mod clients;

#[path = "tls/h2.rs"]
mod h2;

use std::time::Duration;

use actix_dispatch::{
    AttemptOutcome, Config, Dispatcher, ErrorKind, Outcome, Protocol, Task, TaskResult,
};
use support::echo::{Echo, Mode};
use support::pki::{Leaf, Pki};

const LOCAL: Leaf<'static> = Leaf::For(&["127.0.0.1"]);

/// A service `svc` over `endpoints` (JSON objects), with `extra` fields.
fn config(endpoints: &[String], extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","timeout":"10s",
            "breaker":{{"consecutive_failures":2}},
            "endpoints":[{}]{extra}}}]}}"#,
        endpoints.join(",")
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn endpoint(echo: &Echo) -> String {
    format!(r#"{{"address":"{}"}}"#, echo.url(true))
}

fn trusting(pki: &Pki) -> String {
    format!(r#","tls":{{"ca_file":{:?}}}"#, pki.ca_file())
}

/// A dispatcher over `echo` alone that trusts `ca`'s certificates and
/// retries nothing.
fn no_retries(echo: &Echo, ca: &Pki) -> Dispatcher {
    Dispatcher::start(config(
        &[endpoint(echo)],
        &format!(r#"{},"retry":{{"max_retries":0}}"#, trusting(ca)),
    ))
    .unwrap()
}

async fn get(d: &Dispatcher) -> TaskResult {
    d.submit(Task::get("svc", "/hello")).await
}

fn body(r: &TaskResult) -> String {
    let resp = r
        .response()
        .unwrap_or_else(|| panic!("no response: {:?}", r.outcome));
    String::from_utf8_lossy(&resp.body).into_owned()
}

fn tls_error(r: &TaskResult) -> bool {
    matches!(&r.outcome, Outcome::Failure(f) if f.last == Some(AttemptOutcome::Error(ErrorKind::Tls)))
}

#[actix_rt::test]
async fn a_trusted_ca_is_served_over_h2() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH2(pki.server_config(LOCAL)));
    let d = Dispatcher::start(config(&[endpoint(&echo)], &trusting(&pki))).unwrap();
    for _ in 0..3 {
        let r = get(&d).await;
        assert!(r.is_success(), "{:?}", r.outcome);
        assert_eq!(r.attempts[0].protocol, Some(Protocol::H2));
        assert!(body(&r).ends_with("version: HTTP/2.0"), "{}", body(&r));
    }
    assert_eq!(
        serde_json::to_string(&Protocol::H2).unwrap(),
        r#""h2""#,
        "serialized by its ALPN name"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_server_offering_only_http1_is_served_over_http1() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH1(pki.server_config(LOCAL)));
    let d = Dispatcher::start(config(&[endpoint(&echo)], &trusting(&pki))).unwrap();
    let r = get(&d).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    assert_eq!(r.attempts[0].protocol, Some(Protocol::Http1));
    assert!(body(&r).ends_with("version: HTTP/1.1"), "{}", body(&r));
    assert_eq!(
        serde_json::to_string(&Protocol::Http1).unwrap(),
        r#""http/1.1""#
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_unknown_ca_is_a_tls_error_counted_by_the_breaker() {
    support::logs::capture();
    let trusted = Pki::new("trusted CA");
    let stranger = Pki::new("stranger CA");
    let echo = Echo::start(Mode::TlsH2(stranger.server_config(LOCAL)));
    let d = no_retries(&echo, &trusted);
    for _ in 0..2 {
        let r = get(&d).await;
        assert!(tls_error(&r), "{:?}", r.outcome);
        assert_eq!(r.attempts[0].protocol, None);
    }
    assert_eq!(echo.hits(), 0, "no request reached the server");
    let stats = d.stats().await;
    let node = &stats.service("svc").unwrap().nodes[0];
    assert_eq!(node.errors, 2);
    assert_eq!(node.breaker, "open", "2 consecutive TLS failures trip it");
    // The message names the endpoint and the reason.
    let authority = echo.url(true)["https://".len()..]
        .trim_end_matches('/')
        .to_owned();
    let lines = support::logs::lines();
    assert!(
        lines.iter().any(
            |l| l.contains(&format!("TLS with {authority}")) && l.contains("unknown authority")
        ),
        "no log line names the endpoint and the reason"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_tls_failure_is_retried_on_another_node_not_the_same() {
    let trusted = Pki::new("trusted CA");
    let stranger = Pki::new("stranger CA");
    let bad = Echo::start(Mode::TlsH2(stranger.server_config(LOCAL)));
    let good = Echo::start(Mode::TlsH2(trusted.server_config(LOCAL)));
    let d = Dispatcher::start(config(
        &[endpoint(&bad), endpoint(&good)],
        &format!(r#"{},"retry":{{"max_retries":3}}"#, trusting(&trusted)),
    ))
    .unwrap();
    let mut tls_attempts = 0;
    for _ in 0..4 {
        let r = get(&d).await;
        assert!(r.is_success(), "{:?}", r.outcome);
        assert_eq!(r.node(), Some(good.url(true).as_str()));
        let on_bad: Vec<_> = r
            .attempts
            .iter()
            .filter(|a| *a.node == bad.url(true))
            .collect();
        assert!(
            on_bad.len() <= 1,
            "the failed node is avoided: {:?}",
            r.attempts
        );
        for a in on_bad {
            assert_eq!(a.outcome, AttemptOutcome::Error(ErrorKind::Tls));
            tls_attempts += 1;
        }
    }
    assert!(tls_attempts >= 1, "round robin tried the bad node");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_certificate_for_another_host_is_a_tls_error() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH2(
        pki.server_config(Leaf::For(&["other.example"])),
    ));
    let d = no_retries(&echo, &pki);
    let r = get(&d).await;
    assert!(tls_error(&r), "{:?}", r.outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_expired_certificate_is_a_tls_error() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH2(pki.server_config(Leaf::Expired)));
    let d = no_retries(&echo, &pki);
    let r = get(&d).await;
    assert!(tls_error(&r), "{:?}", r.outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn skip_verify_succeeds_with_a_warning() {
    support::logs::capture();
    let stranger = Pki::new("stranger CA");
    let echo = Echo::start(Mode::TlsH2(stranger.server_config(LOCAL)));
    let d = Dispatcher::start(config(
        &[endpoint(&echo)],
        r#","tls":{"insecure_skip_verify":true}"#,
    ))
    .unwrap();
    let r = get(&d).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    let addr = echo.url(true);
    assert!(
        support::logs::lines().iter().any(|l| l.starts_with("WARN")
            && l.contains(&addr)
            && l.contains("verification is OFF")),
        "no warning for {addr}"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_endpoints_tls_replaces_the_services() {
    let a = Pki::new("CA a");
    let b = Pki::new("CA b");
    let echo = Echo::start(Mode::TlsH2(b.server_config(LOCAL)));
    let ep = format!(
        r#"{{"address":"{}","tls":{{"ca_file":{:?}}}}}"#,
        echo.url(true),
        b.ca_file()
    );
    let d = Dispatcher::start(config(&[ep], &trusting(&a))).unwrap();
    let r = get(&d).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn a_bad_ca_file_is_a_config_error_naming_the_field() {
    let pki = Pki::new("test CA");
    let garbage = pki.file("garbage.pem", "not a certificate");
    let bad_der = pki.file(
        "bad.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let missing = format!("{garbage}.missing");
    for (tls, field) in [
        (format!(r#"{{"ca_file":{missing:?}}}"#), "tls.ca_file"),
        (format!(r#"{{"ca_file":{garbage:?}}}"#), "tls.ca_file"),
        (format!(r#"{{"ca_file":{bad_der:?}}}"#), "tls.ca_file"),
        (
            format!(
                r#"{{"ca_file":{:?},"insecure_skip_verify":true}}"#,
                pki.ca_file()
            ),
            "tls",
        ),
        (r#"{"ca_fil":"x"}"#.to_owned(), "tls.ca_fil"),
    ] {
        let json = format!(
            r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"https://127.0.0.1:1/","tls":{tls}}}]}}]}}"#
        );
        let e = Config::from_json(&json).unwrap_err().to_string();
        let want = format!("field `endpoints[0].{field}`");
        assert!(e.contains(&want), "{tls}: {e}");
    }
}
