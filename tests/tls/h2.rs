//! HTTP/2 connections (issue 23, item 10): a node's concurrent requests
//! are streams on one connection (or the few of `http2.connections`),
//! counted at the server; h2c with `http2.prior_knowledge`.

use super::*;

/// A service over `echo` with `max_concurrent` 10 and `extra` fields.
fn service(url: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","timeout":"10s",
            "queue":{{"delay":{{"enabled":false}}}},
            "endpoints":[{{"address":"{url}","max_concurrent":10}}]{extra}}}]}}"#
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// 100 requests at once, 10 in flight at a time: every one a success over
/// `protocol`.
async fn hundred(d: &Dispatcher, protocol: Protocol) {
    let tasks = (0..100).map(|i| d.submit(Task::get("svc", format!("/{i}"))));
    for r in futures::future::join_all(tasks).await {
        assert!(r.is_success(), "{:?}", r.outcome);
        assert_eq!(r.attempts[0].protocol, Some(protocol));
    }
}

#[actix_rt::test]
async fn a_nodes_h2_requests_share_one_connection() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH2(pki.server_config(LOCAL)));
    let d = Dispatcher::start(service(&echo.url(true), &trusting(&pki))).unwrap();
    hundred(&d, Protocol::H2).await;
    assert_eq!(echo.hits(), 100);
    assert_eq!(echo.connections(), 1, "one connection for 100 streams");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn http2_connections_spreads_streams_over_a_configured_few() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH2(pki.server_config(LOCAL)));
    let extra = format!(r#"{},"http2":{{"connections":3}}"#, trusting(&pki));
    let d = Dispatcher::start(service(&echo.url(true), &extra)).unwrap();
    for _ in 0..3 {
        hundred(&d, Protocol::H2).await;
    }
    assert_eq!(echo.hits(), 300);
    let n = echo.connections();
    assert!((1..=3).contains(&n), "{n} connections for 3 allowed");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_http1_server_over_tls_still_gets_http1() {
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH1(pki.server_config(LOCAL)));
    let d = Dispatcher::start(service(&echo.url(true), &trusting(&pki))).unwrap();
    hundred(&d, Protocol::Http1).await;
    // awc's keep-alive pool: at most one per slot, and the one handshake
    // that learned the server's choice.
    assert!(echo.connections() <= 11, "{}", echo.connections());
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn h2c_with_prior_knowledge_shares_one_connection() {
    let echo = Echo::start(Mode::PlainH2c);
    let extra = r#","http2":{"prior_knowledge":true}"#;
    let d = Dispatcher::start(service(&echo.url(false), extra)).unwrap();
    hundred(&d, Protocol::H2).await;
    assert_eq!(echo.connections(), 1);
    d.shutdown(Duration::from_secs(1)).await;
    // Without it, plain HTTP stays HTTP/1.1.
    let d = Dispatcher::start(service(&echo.url(false), "")).unwrap();
    hundred(&d, Protocol::Http1).await;
    d.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn http2_connections_out_of_range_is_refused_by_name() {
    for bad in ["0", "65"] {
        let json = format!(
            r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"https://127.0.0.1:1/"}}],
                "http2":{{"connections":{bad}}}}}]}}"#
        );
        let e = Config::from_json(&json).unwrap_err().to_string();
        assert!(e.contains("svc") && e.contains("http2.connections"), "{e}");
        assert!(e.contains("1 to 64"), "{e}");
    }
}
