//! The gateway facing hostile clients and telling them nothing of its
//! backends (issue 33): a client that never reads its stream cannot hold a
//! node's slot past the send timeout; `TRACE` and `CONNECT` are refused
//! (a backend that echoes them would send the endpoint's credentials
//! back); error answers name no backend address; headers a proxy sets are
//! not the client's to send.
//!
//! The echoing backend is a raw socket server that answers every request
//! with the request's head as it arrived on the wire (Apache's `TRACE`).

#![cfg(feature = "web")]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::web::{forward, ForwardConfig, StreamWhen};
use actix_dispatch::{Config, Dispatcher, Method, Task};
use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::cfg::config;
use support::wait::stats_until;
use support::{init_logs, Backend};

/// A gateway on 127.0.0.1 forwarding every path under `/svc/` to service
/// `svc`.
struct Gateway {
    url: String,
    dispatcher: Dispatcher,
    server: ServerHandle,
}

impl Gateway {
    fn start(config: Config, fwd: ForwardConfig) -> Gateway {
        let dispatcher = Dispatcher::start(config).expect("inside a System");
        let data = web::Data::new(dispatcher.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(fwd.clone())
                .service(web::scope("/svc").default_service(forward("svc")))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind 127.0.0.1");
        let url = format!("http://127.0.0.1:{}", server.addrs()[0].port());
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Gateway {
            url,
            dispatcher,
            server: handle,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }

    async fn stop(self) {
        self.dispatcher.shutdown(Duration::ZERO).await;
        self.server.stop(false).await;
    }
}

fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(20))
        .finish()
}

/// Status, headers and body of `method` on `url`, with `headers`.
async fn call(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, awc::http::header::HeaderMap, String) {
    let mut req = client().request(method, url);
    for h in headers {
        req = req.insert_header(*h);
    }
    let mut res = req.send().await.expect("the gateway answers");
    let body = res.body().await.expect("the body");
    let body = String::from_utf8_lossy(&body).into_owned();
    (res.status(), res.headers().clone(), body)
}

fn one_node(url: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{url}"}}]{}{extra}}}]}}"#,
        if extra.is_empty() { "" } else { "," }
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

// === the echoing backend ===

/// A raw HTTP/1.1 backend that answers each request `200` with the
/// request's head, byte for byte, as its body (`message/http`, as Apache
/// answers `TRACE`).
struct EchoHead {
    port: u16,
    hits: Arc<AtomicU64>,
}

impl EchoHead {
    async fn start() -> EchoHead {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        actix_rt::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                actix_rt::spawn(echo_heads(conn, counter.clone()));
            }
        });
        EchoHead { port, hits }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Serves one connection: each request's head comes back as the body.
/// Bounded: 64 KiB a head, 30 s a read.
async fn echo_heads(mut conn: tokio::net::TcpStream, hits: Arc<AtomicU64>) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if buf.len() > 64 * 1024 {
                return;
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut chunk));
            match read.await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < length {
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut chunk));
            match read.await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        }
        buf.drain(..length);
        hits.fetch_add(1, Ordering::SeqCst);
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: message/http\r\ncontent-length: {}\r\n\r\n",
            head.len()
        )
        .into_bytes();
        answer.extend_from_slice(&head);
        if conn.write_all(&answer).await.is_err() {
            return;
        }
    }
}

// === a client that never reads ===

#[actix_rt::test]
async fn clients_that_never_read_their_stream_free_the_slots_after_the_send_timeout() {
    init_logs();
    let b = Backend::start();
    // A node of 2 slots, a service allowing long bodies, and nothing shed
    // by waiting: the ordinary request below waits for a free slot.
    let extra = r#""max_body":67108864,"timeout":"30s","queue":{"delay":{"enabled":false}}"#;
    let fwd = ForwardConfig::default()
        .stream(StreamWhen::EventStream)
        .stream_send_timeout(Duration::from_millis(300));
    let gw = Gateway::start(config("round_robin", &[(&b, 1, 2)], extra), fwd);
    // Two clients ask for a 60 MB stream and never read a byte: far more
    // than the sockets' buffers and the engine's channel hold.
    let request = "GET /svc/large/60000000 HTTP/1.1\r\nHost: gw\r\n\
        Accept: text/event-stream\r\n\r\n";
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(gw.addr())
            .await
            .expect("connect to the gateway");
        s.write_all(request.as_bytes()).await.expect("send");
        idle.push(s);
    }
    support::wait::wait_for("both streams at the backend", || b.hits() == 2).await;
    // An ordinary request gets a slot once a stalled stream's send times
    // out (before the fix: never, both slots held as long as the clients
    // keep their connections).
    let plain = gw.url("/svc/plain");
    let ordinary = call(Method::GET, &plain, &[]);
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(20), ordinary)
        .await
        .expect("an ordinary request is served while the idle clients stay");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(r#""path":"/plain""#), "{body}");
    // Both stalled streams were cut (their clients are still connected),
    // and a client that stops reading is not the node's failure.
    let stats = stats_until(&gw.dispatcher, |s| s.services[0].nodes[0].in_flight == 0).await;
    let node = &stats.services[0].nodes[0];
    assert_eq!((node.in_flight, node.errors), (0, 0), "{node:?}");
    assert_eq!(b.hits(), 3);
    drop(idle);
    gw.stop().await;
}

// === methods ===

/// A service whose endpoint adds a secret `Authorization` to every attempt.
fn with_secret(url: &str) -> Config {
    one_node(
        url,
        r#""headers":{"authorization":{"value":"Bearer s3cret-key","fixed":true}}"#,
    )
}

#[actix_rt::test]
async fn trace_is_refused_405_and_the_endpoints_credentials_are_never_echoed() {
    init_logs();
    let echo = EchoHead::start().await;
    let gw = Gateway::start(with_secret(&echo.url()), ForwardConfig::default());
    // The echo works, and does carry the secret, for a method that is
    // forwarded: what TRACE would have returned.
    let (status, _, body) = call(Method::GET, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("Bearer s3cret-key"), "{body}");
    assert_eq!(echo.hits(), 1);

    let (status, headers, body) = call(Method::TRACE, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(
        headers.get("allow").unwrap(),
        "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH"
    );
    assert!(!body.contains("s3cret"), "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"], "method_not_allowed");
    assert_eq!(echo.hits(), 1, "TRACE reached the backend");

    // CONNECT, on the wire (awc makes no such request).
    let (head, body) = raw(
        &gw.addr(),
        "CONNECT /svc/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    assert!(!body.contains("s3cret"), "{body}");
    assert_eq!(echo.hits(), 1, "CONNECT reached the backend");
    gw.stop().await;
}

#[actix_rt::test]
async fn the_allowed_methods_are_the_routes_list() {
    init_logs();
    let echo = EchoHead::start().await;
    let fwd = ForwardConfig::default().allowed_methods([Method::GET, Method::TRACE]);
    let gw = Gateway::start(one_node(&echo.url(), ""), fwd);
    let (status, headers, _) = call(Method::POST, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers.get("allow").unwrap(), "GET, TRACE");
    assert_eq!(echo.hits(), 0);
    // Listed, TRACE is forwarded (to a backend trusted not to echo it).
    let (status, _, body) = call(Method::TRACE, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("TRACE /x HTTP/1.1\r\n"), "{body}");
    assert_eq!(echo.hits(), 1);
    gw.stop().await;
}

/// Sends `request` as written and reads the answer to the connection's
/// close (30 s at most): the head and the body.
async fn raw(addr: &str, request: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out));
    read.await.expect("the answer in time").expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    (head.to_owned(), body.to_owned())
}

// === error bodies ===

#[actix_rt::test]
async fn error_bodies_name_no_backend_while_the_result_keeps_the_detail() {
    init_logs();
    // A port nothing listens on: every connect is refused.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/");
    let extra =
        r#""retry":{"max_retries":0},"breaker":{"consecutive_failures":1,"open_for":"60s"}"#;
    let gw = Gateway::start(one_node(&url, extra), ForwardConfig::default());
    let (status, _, body) = call(Method::GET, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"], "retries_exhausted");
    assert_eq!(e["message"], "no backend served the request");
    for secret in ["127.0.0.1", &port.to_string(), "http://"] {
        assert!(!body.contains(secret), "{secret} in {body}");
    }
    // The breaker opened on it: its rejection's words name the last error
    // (the address) in the result, not in the answer.
    let (status, _, body) = call(Method::GET, &gw.url("/svc/x"), &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"], "circuit_open");
    for secret in ["127.0.0.1", &port.to_string(), "http://"] {
        assert!(!body.contains(secret), "{secret} in {body}");
    }
    let r = gw.dispatcher.submit(Task::get("svc", "/x")).await;
    let detail = actix_dispatch::codec::error_message(&r).unwrap();
    assert!(detail.contains(&format!("127.0.0.1:{port}")), "{detail}");
    gw.stop().await;
}

// === headers a proxy sets ===

const PROXY_SET: [(&str, &str); 5] = [
    ("x-forwarded-host", "admin.internal"),
    ("x-forwarded-proto", "https"),
    ("x-real-ip", "10.0.0.1"),
    ("x-original-url", "/admin/delete"),
    ("x-rewrite-url", "/admin/delete"),
];

#[actix_rt::test]
async fn headers_a_proxy_sets_are_dropped_from_clients_unless_trusted() {
    init_logs();
    let echo = EchoHead::start().await;
    let mut sent: Vec<(&str, &str)> = PROXY_SET.to_vec();
    sent.push(("x-custom", "kept"));
    for trusted in [false, true] {
        let fwd = ForwardConfig::default().trust_proxy_headers(trusted);
        let gw = Gateway::start(one_node(&echo.url(), ""), fwd);
        let (status, _, body) = call(Method::GET, &gw.url("/svc/x"), &sent).await;
        assert_eq!(status, StatusCode::OK);
        let seen = body.to_ascii_lowercase();
        assert!(seen.contains("\r\nx-custom: kept\r\n"), "{seen}");
        for (name, value) in PROXY_SET {
            let line = format!("\r\n{name}: {value}\r\n");
            assert_eq!(seen.contains(&line), trusted, "{name} (trusted: {trusted})");
        }
        // The client's address is still appended where it belongs.
        assert!(
            seen.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
            "{seen}"
        );
        gw.stop().await;
    }
}
