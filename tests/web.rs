//! The actix-web gateway (feature `web`): real requests through a gateway
//! server to real backends, every outcome mapping, the body limit, hop-by-hop
//! headers, `X-Forwarded-For`, and `/stats` and `/health`.

#![cfg(feature = "web")]

mod support;

#[path = "web/clients.rs"]
mod clients;

use std::collections::BTreeMap;
use std::time::Duration;

use actix_dispatch::web::{configure, forward, ForwardConfig};
use actix_dispatch::{
    Attempt, AttemptOutcome, Config, Dispatcher, FailReason, Failure, Outcome, Rejection, Response,
    Task, TaskResult,
};
use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer, Responder};
use bytes::Bytes;
use serde_json::Value;

use support::cfg::config;
use support::wait::{self, wait_for};
use support::Backend;

/// A gateway server on 127.0.0.1 over `config`: `/svc/{tail}` forwards to
/// service `svc`, `/nowhere/{tail}` to a service that does not exist,
/// `/direct` answers with a `TaskResult` (the Responder), plus `configure`.
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
                .route("/svc/{tail:.*}", forward("svc"))
                .route("/nowhere/{tail:.*}", forward("nowhere"))
                .route("/direct", web::get().to(direct))
                .configure(configure)
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

    async fn stop(self) {
        self.dispatcher.shutdown(Duration::ZERO).await;
        self.server.stop(false).await;
    }
}

/// A handler that returns the task's result as is.
async fn direct(d: web::Data<Dispatcher>) -> TaskResult {
    d.submit(Task::get("svc", "/items/direct")).await
}

fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
}

/// Status, headers and body of a GET.
async fn get(url: &str) -> (StatusCode, awc::http::header::HeaderMap, Bytes) {
    let mut res = client().get(url).send().await.expect("gateway answers");
    let body = res.body().await.expect("body");
    (res.status(), res.headers().clone(), body)
}

/// A GET running on its own.
fn spawn_get(
    url: String,
) -> actix_rt::task::JoinHandle<(StatusCode, awc::http::header::HeaderMap, Bytes)> {
    actix_rt::spawn(async move { get(&url).await })
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

fn retry_after(headers: &awc::http::header::HeaderMap) -> u64 {
    let v = headers.get("retry-after").expect("a Retry-After header");
    v.to_str().unwrap().parse().expect("Retry-After in seconds")
}

/// A backend that answers every request with what it received, as JSON, and
/// a hop-by-hop header of its own (`Proxy-Authenticate`) beside an
/// end-to-end one (`x-from-backend`).
fn mirror_backend() -> (String, ServerHandle) {
    async fn mirror(req: HttpRequest, body: Bytes) -> HttpResponse {
        let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in req.headers() {
            let v = v.to_str().unwrap_or("<binary>").to_owned();
            headers.entry(k.as_str().to_owned()).or_default().push(v);
        }
        let seen = serde_json::json!({
            "method": req.method().as_str(),
            "path": req.uri().path(),
            "query": req.query_string(),
            "headers": headers,
            "body": String::from_utf8_lossy(&body),
        });
        HttpResponse::Ok()
            .insert_header(("x-from-backend", "1"))
            .insert_header(("proxy-authenticate", "Basic realm=\"x\""))
            .json(seen)
    }
    let server = HttpServer::new(|| App::new().default_service(web::to(mirror)))
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind 127.0.0.1");
    let url = format!("http://127.0.0.1:{}/", server.addrs()[0].port());
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (url, handle)
}

fn one_node(url: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{url}"}}]{}{extra}}}]}}"#,
        if extra.is_empty() { "" } else { "," }
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// Sends `request` as written on a new connection (awc sets `Connection`
/// itself) and returns the status line, the headers (lowercase) and body.
async fn raw(addr: String, request: String) -> (String, BTreeMap<String, String>, String) {
    let text = actix_rt::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read the answer");
        String::from_utf8(out).expect("text")
    })
    .await
    .unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

#[actix_rt::test]
async fn forwards_method_tail_query_headers_and_body_without_hop_by_hop_headers() {
    let (backend, backend_server) = mirror_backend();
    let gw = Gateway::start(one_node(&backend, ""), ForwardConfig::default());
    let request = "POST /svc/a/b%20c/%3F?x=1&y=%20 HTTP/1.1\r\n\
        Host: gw.example\r\n\
        Connection: close, x-hop\r\n\
        X-Hop: dropped\r\n\
        Keep-Alive: timeout=5\r\n\
        Proxy-Authorization: Basic eA==\r\n\
        TE: trailers\r\n\
        Trailer: x-t\r\n\
        X-Custom: kept\r\n\
        X-Forwarded-For: 10.0.0.1\r\n\
        Content-Length: 5\r\n\r\nhello";
    let addr = gw.url.trim_start_matches("http://").to_owned();
    let (status, headers, body) = raw(addr, request.to_owned()).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(headers["x-from-backend"], "1");
    assert!(!headers.contains_key("proxy-authenticate"), "{headers:?}");
    let seen = json(body.as_bytes());
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["path"], "/a/b%20c/%3F");
    assert_eq!(seen["query"], "x=1&y=%20");
    assert_eq!(seen["body"], "hello");
    let h = &seen["headers"];
    assert_eq!(h["x-custom"][0], "kept");
    for dropped in [
        "x-hop",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
    ] {
        assert!(h.get(dropped).is_none(), "{dropped} was forwarded: {h}");
    }
    assert_eq!(
        h["host"][0],
        backend.trim_start_matches("http://").trim_end_matches('/')
    );
    assert_eq!(h["x-forwarded-for"][0], "10.0.0.1, 127.0.0.1");
    assert_eq!(
        h["forwarded"][0],
        "for=127.0.0.1;host=gw.example;proto=http"
    );
    gw.stop().await;
    backend_server.stop(false).await;
}

#[actix_rt::test]
async fn success_and_a_not_retryable_answer_pass_through() {
    let b = Backend::named("b0");
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], ""),
        Default::default(),
    );

    let (status, headers, body) = get(&gw.url("/svc/items/1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get("x-backend").unwrap(), "b0");
    assert_eq!(json(&body)["path"], "/items/1");

    let (status, _, body) = get(&gw.url("/svc/status/404")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, "status 404");

    // The same mapping from a handler that returns the TaskResult.
    let (status, headers, body) = get(&gw.url("/direct")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get("x-backend").unwrap(), "b0");
    assert_eq!(json(&body)["path"], "/items/direct");
    assert_eq!(b.hits(), 3);
    gw.stop().await;
}

#[actix_rt::test]
async fn failure_after_retries_is_502_with_a_json_reason() {
    let b = Backend::start();
    b.set_status(Some(500));
    let extra = r#""breaker":{"enabled":false},
        "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}"#;
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], extra),
        Default::default(),
    );
    let (status, headers, body) = get(&gw.url("/svc/x")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers.get("content-type").unwrap(), "application/json");
    let e = json(&body);
    assert_eq!(e["error"], "retries_exhausted");
    assert_eq!(e["service"], "svc");
    assert_eq!(e["attempts"], 2);
    // The client gets the code and a generic text; the detail ("status
    // 500") stays in the result and the logs.
    assert_eq!(e["message"], "no backend served the request", "{e}");
    assert_eq!(b.hits(), 2);
    gw.stop().await;
}

#[actix_rt::test]
async fn a_passed_deadline_is_504() {
    let b = Backend::start();
    let fwd = ForwardConfig::default().deadline(Duration::from_millis(100));
    let gw = Gateway::start(config("round_robin", &[(&b, 1, 10)], ""), fwd);
    let (status, _, body) = get(&gw.url("/svc/sleep/10000")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let e = json(&body);
    assert!(
        e["error"] == "deadline_exceeded" || e["error"] == "deadline_passed",
        "{e}"
    );
    gw.stop().await;
}

#[actix_rt::test]
async fn rate_limited_is_429_with_retry_after_and_the_fallback_answers_when_set() {
    let b = Backend::start();
    let limit = r#""rate_limit":{"service":{"rate":0.01,"burst":1},"on_limit":"reject"}"#;
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], limit),
        Default::default(),
    );
    assert_eq!(get(&gw.url("/svc/a")).await.0, StatusCode::OK);
    let (status, headers, body) = get(&gw.url("/svc/b")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let after = retry_after(&headers);
    assert!((1..=100).contains(&after), "{after}");
    let e = json(&body);
    assert_eq!(e["error"], "rate_limited");
    assert_eq!(e["retry_after"], after);
    gw.stop().await;

    let fallback =
        r#""fallback":{"status":200,"headers":{"x-degraded":"1"},"body":"{\"hits\":[]}"}"#;
    let extra = format!("{limit},{fallback}");
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], &extra),
        Default::default(),
    );
    assert_eq!(get(&gw.url("/svc/a")).await.0, StatusCode::OK);
    let (status, headers, body) = get(&gw.url("/svc/b")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get("x-degraded").unwrap(), "1");
    assert_eq!(body, r#"{"hits":[]}"#);
    gw.stop().await;
}

#[actix_rt::test]
async fn an_open_circuit_is_503_with_retry_after() {
    let b = Backend::start();
    b.set_status(Some(500));
    let extra = r#""breaker":{"consecutive_failures":1,"open_for":"30s","on_all_open":"fail_fast"},
        "retry":{"max_retries":0}"#;
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], extra),
        Default::default(),
    );
    assert_eq!(get(&gw.url("/svc/x")).await.0, StatusCode::BAD_GATEWAY);
    let (status, headers, body) = get(&gw.url("/svc/x")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let after = retry_after(&headers);
    assert!((1..=30).contains(&after), "{after}");
    assert_eq!(json(&body)["error"], "circuit_open");
    assert_eq!(b.hits(), 1);
    gw.stop().await;
}

#[actix_rt::test]
async fn a_full_queue_is_503_with_retry_after_and_shutdown_is_503() {
    let b = Backend::start();
    b.set_latency(Duration::from_secs(60));
    let extra = r#""queue":{"capacity":1}"#;
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 1)], extra),
        Default::default(),
    );
    let first = spawn_get(gw.url("/svc/1"));
    wait_for("the first request at the backend", || b.in_flight() == 1).await;
    let second = spawn_get(gw.url("/svc/2"));
    let d = gw.dispatcher.clone();
    wait::stats_until(&d, |s| s.services[0].queue.queued == 1).await;
    assert_eq!(d.stats().await.services[0].queue.queued, 1);
    let (status, headers, body) = get(&gw.url("/svc/3")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after(&headers), 1);
    assert_eq!(json(&body)["error"], "queue_full");

    // Shutting down answers the two waiting requests, and refuses new ones.
    d.shutdown(Duration::ZERO).await;
    for waiting in [first, second] {
        let (status, _, body) = waiting.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json(&body)["error"], "shutting_down");
    }
    let (status, _, body) = get(&gw.url("/svc/4")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json(&body)["error"], "shutting_down");
    gw.stop().await;
}

/// With a priority header set, a critical request displaces a sheddable
/// one from a full queue (answered 503 `overloaded` with `Retry-After`), a
/// value that is no class is 400, and the header is not forwarded.
#[actix_rt::test]
async fn the_priority_header_sets_the_class_and_is_not_forwarded() {
    let b = Backend::start();
    b.set_latency(Duration::from_secs(60));
    let extra = r#""queue":{"capacity":1,"delay":{"enabled":false}}"#;
    let fwd = ForwardConfig::default().priority_header(
        actix_web::http::header::HeaderName::from_static("x-priority"),
    );
    let gw = Gateway::start(config("round_robin", &[(&b, 1, 1)], extra), fwd.clone());
    let send = |path: &str, class: &'static str| {
        let url = gw.url(path);
        actix_rt::spawn(async move {
            let mut res = client()
                .get(url)
                .insert_header(("x-priority", class))
                .send()
                .await
                .expect("gateway answers");
            let body = res.body().await.expect("body");
            (res.status(), res.headers().clone(), body)
        })
    };
    let first = spawn_get(gw.url("/svc/1"));
    wait_for("the first request at the backend", || b.in_flight() == 1).await;
    let sheddable = send("/svc/2", "sheddable");
    let d = gw.dispatcher.clone();
    wait::stats_until(&d, |s| s.services[0].queue.queued == 1).await;
    let critical = send("/svc/3", "Critical");
    let (status, headers, body) = sheddable.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after(&headers), 1);
    assert_eq!(json(&body)["error"], "overloaded");
    let q = d.stats().await.services[0].queue.clone();
    assert_eq!((q.shed, q.shed_by_class.sheddable, q.queued), (1, 1, 1));
    let (status, _, body) = send("/svc/4", "urgent").await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"], "bad_priority");
    assert!(json(&body)["message"]
        .as_str()
        .unwrap()
        .contains("unknown priority `urgent`"));
    d.shutdown(Duration::ZERO).await;
    for waiting in [first, critical] {
        let (status, _, _) = waiting.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    gw.stop().await;

    let (url, mirror) = mirror_backend();
    let gw = Gateway::start(one_node(&url, ""), fwd);
    let mut res = client()
        .get(gw.url("/svc/x"))
        .insert_header(("x-priority", "critical"))
        .insert_header(("x-other", "kept"))
        .send()
        .await
        .unwrap();
    let seen = json(&res.body().await.unwrap());
    assert_eq!(seen["headers"]["x-other"][0], "kept");
    assert!(seen["headers"].get("x-priority").is_none(), "{seen}");
    gw.stop().await;
    mirror.stop(false).await;
}

#[actix_rt::test]
async fn invalid_tasks_are_400_and_an_unknown_service_503() {
    let b = Backend::start();
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], ""),
        Default::default(),
    );
    let (status, _, body) = get(&gw.url("/svc/a/%2e%2e/%2e%2e/etc/passwd")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"], "invalid_task");
    let (status, _, body) = get(&gw.url("/nowhere/x")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json(&body)["error"], "unknown_service");
    assert_eq!(b.hits(), 0);
    gw.stop().await;
}

#[actix_rt::test]
async fn a_body_over_the_limit_is_413_and_never_sent() {
    let b = Backend::start();
    let fwd = ForwardConfig::default().max_body(1024);
    let gw = Gateway::start(config("round_robin", &[(&b, 1, 10)], ""), fwd);
    let c = client();

    let mut res = c
        .post(gw.url("/svc/echo"))
        .send_body(vec![b'a'; 1024])
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body().await.unwrap().len(), 1024);

    // Declared too large (Content-Length)...
    let mut res = c
        .post(gw.url("/svc/echo"))
        .send_body(vec![b'a'; 1025])
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(&res.body().await.unwrap())["error"], "body_too_large");

    // ... or found too large while reading a chunked body.
    let chunks = futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 512]))),
    );
    let mut res = c
        .post(gw.url("/svc/echo"))
        .send_stream(chunks)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(&res.body().await.unwrap())["error"], "body_too_large");
    assert_eq!(b.hits(), 1);
    gw.stop().await;
}

#[actix_rt::test]
async fn stats_and_health_follow_the_nodes() {
    let (b0, b1) = (Backend::named("b0"), Backend::named("b1"));
    let gw = Gateway::start(
        config("round_robin", &[(&b0, 1, 10), (&b1, 1, 10)], ""),
        Default::default(),
    );
    assert_eq!(get(&gw.url("/svc/x")).await.0, StatusCode::OK);
    let (status, _, body) = get(&gw.url("/stats")).await;
    assert_eq!(status, StatusCode::OK);
    let s = json(&body);
    assert_eq!(s["services"][0]["name"], "svc");
    assert_eq!(s["services"][0]["succeeded"], 1);
    assert_eq!(s["services"][0]["nodes"].as_array().unwrap().len(), 2);

    let (status, _, body) = get(&gw.url("/health")).await;
    assert_eq!(status, StatusCode::OK);
    let h = json(&body);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["services"]["svc"]["eligible"], 2);

    let d = &gw.dispatcher;
    d.set_active("svc", &b0.url(), false).await.unwrap();
    let (status, _, body) = get(&gw.url("/health")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["services"]["svc"]["eligible"], 1);

    d.set_active("svc", &b1.url(), false).await.unwrap();
    let (status, _, body) = get(&gw.url("/health")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let h = json(&body);
    assert_eq!(h["status"], "unavailable");
    assert_eq!(h["services"]["svc"]["status"], "unavailable");
    assert_eq!(h["services"]["svc"]["unavailable"][1]["why"], "inactive");
    gw.stop().await;
}

// === the Responder, outcome by outcome ===

fn result(outcome: Outcome) -> TaskResult {
    let mut r = TaskResult::new(1, "svc", outcome);
    r.attempts = vec![Attempt::new(
        "http://127.0.0.1:1/",
        AttemptOutcome::Status(503),
        Duration::from_millis(1),
    )];
    r.total = Duration::from_millis(2);
    r
}

fn response(status: u16, body: &'static str) -> Response {
    let mut r = Response::new(status, Bytes::from_static(body.as_bytes()));
    r.headers.insert(
        awc::http::header::HeaderName::from_static("x-upstream"),
        awc::http::header::HeaderValue::from_static("1"),
    );
    r.headers.insert(
        awc::http::header::HeaderName::from_static("connection"),
        awc::http::header::HeaderValue::from_static("close"),
    );
    r.node = "http://127.0.0.1:1/".into();
    r
}

fn failure(reason: FailReason, response: Option<Response>) -> Outcome {
    Outcome::Failure(Failure::new(
        reason,
        Some(AttemptOutcome::Status(503)),
        response,
    ))
}

/// Status, `Retry-After`, JSON error code (or the body) of `r`'s response.
async fn mapped(r: TaskResult, fwd: Option<ForwardConfig>) -> (u16, Option<String>, String) {
    let mut req = actix_web::test::TestRequest::default();
    if let Some(fwd) = fwd {
        req = req.app_data(fwd);
    }
    let res = r.respond_to(&req.to_http_request());
    let status = res.status().as_u16();
    let after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(res.headers().get("connection").is_none());
    let body = actix_web::body::to_bytes(res.into_body()).await.unwrap();
    let text = match serde_json::from_slice::<Value>(&body) {
        Ok(v) if v.get("error").is_some() => v["error"].as_str().unwrap().to_owned(),
        _ => String::from_utf8_lossy(&body).into_owned(),
    };
    (status, after, text)
}

/// Status, `Retry-After` and error code (or body) a result should map to.
type Expected = (u16, Option<String>, &'static str);

#[actix_rt::test]
async fn every_outcome_maps_to_its_response() {
    let secs = Duration::from_millis;
    let s = |v: &str| Some(v.to_owned());
    let cases: Vec<(Outcome, Expected)> = vec![
        (Outcome::Success(response(201, "made")), (201, None, "made")),
        (
            Outcome::fallback(
                response(200, "fallback"),
                Rejection::circuit_open(secs(10), None),
            ),
            (200, None, "fallback"),
        ),
        (
            failure(FailReason::NotRetryable, Some(response(404, "no"))),
            (404, None, "no"),
        ),
        (
            failure(FailReason::NotRetryable, None),
            (502, None, "not_retryable"),
        ),
        (
            failure(FailReason::RetriesExhausted, Some(response(503, "x"))),
            (502, None, "retries_exhausted"),
        ),
        (
            failure(FailReason::BudgetExhausted, None),
            (502, None, "budget_exhausted"),
        ),
        (
            failure(FailReason::DeadlineExceeded, None),
            (504, None, "deadline_exceeded"),
        ),
        (
            Outcome::Rejected(Rejection::QueueFull),
            (503, s("1"), "queue_full"),
        ),
        (
            Outcome::Rejected(Rejection::rate_limited(secs(1500))),
            (429, s("2"), "rate_limited"),
        ),
        (
            Outcome::Rejected(Rejection::circuit_open(secs(1), None)),
            (503, s("1"), "circuit_open"),
        ),
        (
            Outcome::Rejected(Rejection::circuit_open(secs(0), None)),
            (503, s("1"), "circuit_open"),
        ),
        (
            Outcome::Rejected(Rejection::ShuttingDown),
            (503, None, "shutting_down"),
        ),
        (
            Outcome::Rejected(Rejection::DeadlinePassed),
            (504, None, "deadline_passed"),
        ),
        (
            Outcome::Rejected(Rejection::InvalidTask("bad".into())),
            (400, None, "invalid_task"),
        ),
        (
            Outcome::Rejected(Rejection::UnknownService("x".into())),
            (503, None, "unknown_service"),
        ),
    ];
    for (outcome, (status, after, text)) in cases {
        let what = format!("{outcome:?}");
        let got = mapped(result(outcome), None).await;
        assert_eq!(got, (status, after, text.to_owned()), "{what}");
    }

    // The overload statuses are the app's choice.
    let fwd = ForwardConfig::default()
        .queue_full_status(StatusCode::TOO_MANY_REQUESTS)
        .rate_limited_status(StatusCode::SERVICE_UNAVAILABLE)
        .queue_full_retry_after(Duration::from_secs(5));
    let got = mapped(
        result(Outcome::Rejected(Rejection::QueueFull)),
        Some(fwd.clone()),
    )
    .await;
    assert_eq!(got, (429, s("5"), "queue_full".to_owned()));
    let limited = Outcome::Rejected(Rejection::rate_limited(secs(10)));
    let got = mapped(result(limited), Some(fwd)).await;
    assert_eq!(got, (503, s("1"), "rate_limited".to_owned()));
}
