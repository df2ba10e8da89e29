//! The node's own HTTP/1.1 pool, through the engine: its connections are
//! reused, over plain TCP and over TLS when the server chose http/1.1 over
//! ALPN, and an idle one past `keep_alive` is not. Counts of the
//! connections the backend accepted, never latencies.

mod support;

use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Protocol, Task};
use support::echo::{Echo, Mode};

fn config(address: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","timeout":"10s",
            "endpoints":[{{"address":"{address}","max_concurrent":4}}]{extra}}}]}}"#
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

async fn get_n(d: &Dispatcher, n: usize, protocol: Protocol) {
    for _ in 0..n {
        let r = d.submit(Task::get("svc", "/hello")).await;
        assert!(r.is_success(), "{:?}", r.outcome);
        assert_eq!(r.attempts[0].protocol, Some(protocol));
    }
}

#[actix_rt::test]
async fn sequential_requests_share_one_connection() {
    let echo = Echo::start(Mode::Plain);
    let d = Dispatcher::start(config(&echo.url(false), r#","keep_alive":"10s""#)).unwrap();
    get_n(&d, 10, Protocol::Http1).await;
    assert_eq!(echo.hits(), 10);
    assert_eq!(echo.connections(), 1);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn an_idle_connection_past_keep_alive_is_replaced() {
    let echo = Echo::start(Mode::Plain);
    // 300 ms: the two requests of a pair share their connection even on a
    // machine that stalls the test between them; the sleep is twice that.
    let d = Dispatcher::start(config(&echo.url(false), r#","keep_alive":"300ms""#)).unwrap();
    get_n(&d, 2, Protocol::Http1).await;
    assert_eq!(echo.connections(), 1);
    actix_rt::time::sleep(Duration::from_millis(600)).await;
    get_n(&d, 2, Protocol::Http1).await;
    assert_eq!(echo.connections(), 2);
    d.shutdown(Duration::from_secs(1)).await;
}

#[cfg(feature = "tls")]
#[actix_rt::test]
async fn https_over_http1_reuses_its_connections() {
    use support::pki::{Leaf, Pki};
    let pki = Pki::new("test CA");
    let echo = Echo::start(Mode::TlsH1(pki.server_config(Leaf::For(&["127.0.0.1"]))));
    let extra = format!(
        r#","keep_alive":"10s","tls":{{"ca_file":{:?}}}"#,
        pki.ca_file()
    );
    let d = Dispatcher::start(config(&echo.url(true), &extra)).unwrap();
    get_n(&d, 10, Protocol::Http1).await;
    assert_eq!(echo.hits(), 10);
    // The first connection learnt the server's choice over ALPN, and every
    // request went over it.
    assert_eq!(echo.connections(), 1);
    d.shutdown(Duration::from_secs(1)).await;
}
