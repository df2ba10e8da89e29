//! Streamed responses through the actix-web gateway (issue 11, part 3):
//! server-sent events from a backend reach the gateway's client event by
//! event, a client that leaves frees the node's slot, a request that
//! does not ask for events is still buffered, streaming is the route's
//! choice (off by default), and a stream's lifetime is bounded.

#![cfg(feature = "web")]

mod support;

use std::time::Duration;

use actix_dispatch::web::{forward, ForwardConfig, StreamWhen};
use actix_dispatch::Dispatcher;
use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpServer};
use futures::StreamExt;

use support::cfg::config;
use support::{init_logs, Backend};

/// A gateway on 127.0.0.1 forwarding `/svc/{tail}` to service `svc`.
struct Gateway {
    url: String,
    dispatcher: Dispatcher,
    server: ServerHandle,
}

impl Gateway {
    fn start(b: &Backend, fwd: ForwardConfig) -> Gateway {
        let dispatcher =
            Dispatcher::start(config("round_robin", &[(b, 1, 4)], "")).expect("inside a System");
        let data = web::Data::new(dispatcher.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(fwd.clone())
                .route("/svc/{tail:.*}", forward("svc"))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind 127.0.0.1");
        let url = format!("http://127.0.0.1:{}", server.addrs()[0].port());
        let server = server.run();
        let server_handle = server.handle();
        actix_rt::spawn(server);
        Gateway {
            url,
            dispatcher,
            server: server_handle,
        }
    }

    async fn in_flight(&self) -> u32 {
        let stats = self.dispatcher.stats().await;
        stats.service("svc").unwrap().nodes[0].in_flight
    }

    /// Waits (bounded) until the node's slot is free again.
    async fn settle(&self) {
        for _ in 0..500 {
            if self.in_flight().await == 0 {
                return;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the node's slot was never freed");
    }

    async fn stop(self) {
        self.dispatcher.shutdown(Duration::ZERO).await;
        self.server.stop(false).await;
    }
}

/// A route of server-sent events: streams what asks for
/// `text/event-stream`.
fn events() -> ForwardConfig {
    ForwardConfig::default().stream(StreamWhen::EventStream)
}

fn client() -> awc::Client {
    awc::Client::builder().disable_timeout().finish()
}

#[actix_rt::test]
async fn sse_through_the_gateway_arrives_event_by_event() {
    init_logs();
    let b = Backend::start();
    let gw = Gateway::start(&b, events());
    let mut res = client()
        .get(format!("{}/svc/sse/20/50", gw.url))
        .insert_header(("accept", "text/event-stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(
        res.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    // The head came through before the backend was done.
    assert!(b.sse_sent() < 20);
    let first = res.next().await.unwrap().unwrap();
    let sent = b.sse_sent();
    assert!(
        sent < 20,
        "the first event reached the client only after the backend sent {sent}"
    );
    assert!(String::from_utf8_lossy(&first).contains("data: event 0"));
    // The rest, in order, to the end.
    let mut all = first.to_vec();
    let mut chunks = 1;
    while let Some(chunk) = res.next().await {
        all.extend_from_slice(&chunk.unwrap());
        chunks += 1;
    }
    let text = String::from_utf8(all).unwrap();
    let order: Vec<usize> = (0..20)
        .map(|i| text.find(&format!("data: event {i}\n")).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(chunks > 1, "the body came as one piece");
    gw.settle().await;
    gw.stop().await;
}

#[actix_rt::test]
async fn a_client_that_leaves_frees_the_slot() {
    init_logs();
    let b = Backend::start();
    let gw = Gateway::start(&b, events());
    let mut res = client()
        .get(format!("{}/svc/sse/20/50", gw.url))
        .insert_header(("accept", "text/event-stream"))
        .send()
        .await
        .unwrap();
    res.next().await.unwrap().unwrap();
    assert_eq!(gw.in_flight().await, 1);
    drop(res);
    gw.settle().await;
    let stats = gw.dispatcher.stats().await;
    assert_eq!(stats.service("svc").unwrap().nodes[0].errors, 0);
    gw.stop().await;
}

#[actix_rt::test]
async fn streaming_is_the_routes_choice_and_off_by_default() {
    init_logs();
    for fwd in [
        ForwardConfig::default(),
        ForwardConfig::default().stream(StreamWhen::Never),
    ] {
        let b = Backend::start();
        let gw = Gateway::start(&b, fwd);
        // Even a client of events gets the whole body at once when the
        // route does not stream: the answer is only sent after the
        // backend finished.
        let mut res = client()
            .get(format!("{}/svc/sse/5/10", gw.url))
            .insert_header(("accept", "text/event-stream"))
            .send()
            .await
            .unwrap();
        assert_eq!(b.sse_sent(), 5);
        let body = res.body().await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body)
                .matches("data: event")
                .count(),
            5
        );
        gw.settle().await;
        gw.stop().await;
    }
}

#[actix_rt::test]
async fn a_stream_past_its_lifetime_ends_early_and_frees_the_slot() {
    init_logs();
    let b = Backend::start();
    let fwd = events().stream_max_duration(Duration::from_millis(300));
    let gw = Gateway::start(&b, fwd);
    // 100 events 50 ms apart would take 5 s; the route gives a stream
    // 300 ms. Read on the wire: the chunked body must end without its
    // last chunk, so that the client knows it was cut.
    let addr = gw.url.trim_start_matches("http://").to_owned();
    let answer = actix_rt::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = "GET /svc/sse/100/50 HTTP/1.1\r\nHost: gw\r\nAccept: text/event-stream\r\n\r\n";
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read to the close");
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    assert!(body.contains("data: event 0\n"), "{body}");
    assert!(!body.contains("data: event 99\n"), "{body}");
    assert!(
        !body.ends_with("\r\n0\r\n\r\n"),
        "the body ended cleanly: {body}"
    );
    gw.settle().await;
    // The cut is the route's limit, not the node's failure.
    let stats = gw.dispatcher.stats().await;
    assert_eq!(stats.service("svc").unwrap().nodes[0].errors, 0);
    gw.stop().await;
}
