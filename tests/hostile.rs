//! Hostile input end to end: headers that would re-route a request, paths
//! that would leave the endpoint's prefix, extreme durations, repeated
//! headers, and the seed's case-insensitive service names, against real
//! actix-web backends on loopback.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Outcome, Rejection, Task, TaskResult};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use support::cfg::config;
use support::{init_logs, Backend};

/// A backend that echoes what it received: the `host` and every `accept`
/// value, each on its own; and answers two `set-cookie` headers.
struct HeaderEcho {
    url: String,
    hits: Arc<AtomicU64>,
    handle: actix_web::dev::ServerHandle,
}

impl HeaderEcho {
    /// Starts on the current actix system (its worker runs on its own thread).
    fn start() -> HeaderEcho {
        let hits = Arc::new(AtomicU64::new(0));
        let h = hits.clone();
        let server = HttpServer::new(move || {
            let h = h.clone();
            App::new().default_service(web::to(move |req: HttpRequest| {
                h.fetch_add(1, Ordering::SeqCst);
                async move {
                    let accepts: Vec<&str> = (req.headers().get_all("accept"))
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    let host = (req.headers().get("host"))
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    HttpResponse::Ok()
                        .append_header(("set-cookie", "a=1"))
                        .append_header(("set-cookie", "b=2"))
                        .body(format!(
                            "path={} host={host} accept={}",
                            req.path(),
                            accepts.join("|")
                        ))
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        HeaderEcho {
            url: format!("http://127.0.0.1:{port}/v1/"),
            hits,
            handle,
        }
    }

    fn config(&self) -> Config {
        let json = format!(
            r#"{{"services":[{{"name":"svc","endpoints":[{{"address":"{}"}}]}}]}}"#,
            self.url
        );
        Config::from_json(&json).unwrap()
    }
}

fn invalid_reason(r: &TaskResult) -> &str {
    match &r.outcome {
        Outcome::Rejected(Rejection::InvalidTask(why)) => why,
        other => panic!("expected InvalidTask, got {other:?}"),
    }
}

#[actix_rt::test]
async fn host_header_is_refused_and_repeated_headers_reach_the_backend_and_come_back() {
    init_logs();
    let b = HeaderEcho::start();
    let d = Dispatcher::start(b.config()).unwrap();

    // Host (and every header that re-routes or re-frames) is refused at submit.
    for (k, v) in [
        ("Host", "evil.example"),
        ("transfer-encoding", "chunked"),
        ("Content-Length", "0"),
        ("Proxy-Authorization", "x"),
    ] {
        let r = d.submit(Task::get("svc", "/x").header(k, v)).await;
        assert!(invalid_reason(&r).contains(k), "{k}: {:?}", r.outcome);
    }
    assert_eq!(
        b.hits.load(Ordering::SeqCst),
        0,
        "nothing reached the backend"
    );

    // Repeated request headers are all sent; repeated response headers all kept.
    let r = d
        .submit(
            Task::get("svc", "/x")
                .header("accept", "text/html")
                .header("accept", "application/json"),
        )
        .await;
    let resp = r.response().unwrap_or_else(|| panic!("{:?}", r.outcome));
    let body = String::from_utf8_lossy(&resp.body);
    assert!(
        body.contains("accept=text/html|application/json")
            || body.contains("accept=text/html, application/json"),
        "{body}"
    );
    assert!(body.contains("path=/v1/x"), "{body}");
    assert!(body.contains("host=127.0.0.1:"), "{body}");
    let cookies: Vec<&str> = (resp.headers.get_all("set-cookie"))
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);

    d.shutdown(Duration::from_secs(1)).await;
    b.handle.stop(false).await;
}

#[actix_rt::test]
async fn dot_segment_paths_never_reach_the_backend_but_colon_slash_slash_in_a_query_does() {
    init_logs();
    let b = HeaderEcho::start();
    let d = Dispatcher::start(b.config()).unwrap();
    for p in [
        "../../admin",
        "/%2e%2e/admin",
        "..%2f..%2fadmin",
        "/.%2e/admin",
        r"\..\..\admin",
        "/a/%5c..%5c..%5cadmin",
        "/./admin",
        // A trailing space (Windows and IIS drop it), fullwidth dots.
        "/..%20/admin",
        "/.%09/admin",
        "/\u{ff0e}\u{ff0e}/admin",
        "/%EF%BC%8E%EF%BC%8E/admin",
    ] {
        let r = d.submit(Task::get("svc", p)).await;
        assert!(invalid_reason(&r).contains("dot-segment"), "{p}");
    }
    for p in ["/admin%00.png", "/a%0d%0aSet-Cookie:%20x"] {
        let r = d.submit(Task::get("svc", p)).await;
        assert!(invalid_reason(&r).contains("CR, LF or NUL"), "{p}");
    }
    assert_eq!(b.hits.load(Ordering::SeqCst), 0);
    let r = d
        .submit(Task::get("svc", "/login?next=https://app.example/"))
        .await;
    let body = String::from_utf8_lossy(&r.response().expect("answered").body).into_owned();
    assert!(body.contains("path=/v1/login"), "{body}");
    d.shutdown(Duration::from_secs(1)).await;
    b.handle.stop(false).await;
}

#[actix_rt::test]
async fn duration_max_deadline_and_timeout_are_rejected_not_a_panic() {
    init_logs();
    let b = Backend::start();
    let d = Dispatcher::start(config("p2c", &[(&b, 1, 10)], "")).unwrap();
    let r = d
        .submit(Task::get("svc", "/x").deadline_in(Duration::MAX))
        .await;
    assert!(invalid_reason(&r).contains("deadline_in"));
    let r = d
        .submit(Task::get("svc", "/x").timeout(Duration::MAX))
        .await;
    assert!(invalid_reason(&r).contains("timeout"));
    // The service still works afterwards.
    let r = d.submit(Task::get("svc", "/x")).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    let s = d.stats().await;
    assert_eq!(s.refused, 2);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_task_for_did_reaches_service_did_case_insensitively() {
    init_logs();
    let b = Backend::start();
    let json = format!(
        r#"{{"ApiServers":[{{"Name":"Did","Mode":"Poll","ApiEndPoints":[{{"Address":"{}","Weight":1,"IsActive":true}}]}}]}}"#,
        b.url()
    );
    let d = Dispatcher::start(Config::from_json(&json).unwrap()).unwrap();
    for name in ["did", "Did", "DID"] {
        let r = d.submit(Task::get(name, "/hello")).await;
        assert!(r.is_success(), "{name}: {:?}", r.outcome);
    }
    assert_eq!(b.hits(), 3);
    let s = d.stats().await;
    assert_eq!(s.services.len(), 1);
    assert_eq!(s.services[0].name, "Did");
    assert!(d.recipient("dId").is_some());
    // A reload that spells the name differently keeps the same service.
    let report = d
        .reload(Config::from_json(&json.replace("\"Did\"", "\"did\"")).unwrap())
        .await
        .unwrap();
    assert!(
        report.started.is_empty() && report.stopped.is_empty(),
        "{report:?}"
    );
    let r = d.submit(Task::get("did", "/again")).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

/// `queue.max_bytes`: the bodies of the tasks held (in flight included)
/// are bounded in bytes, not only in count. With 1000 bytes, a 600-byte
/// task in flight leaves room for 300 more, not 600; a body larger than
/// the bound alone is refused; room comes back when a task is answered.
/// Before, only `queue.capacity` (a count) bounded the queue.
#[actix_rt::test]
async fn the_queue_is_bounded_in_bytes_of_bodies() {
    init_logs();
    let b = Backend::start();
    b.set_latency(Duration::from_millis(300));
    let d = Dispatcher::start(config(
        "round_robin",
        &[(&b, 1, 4)],
        r#""queue":{"max_bytes":1000}"#,
    ))
    .unwrap();
    let post = |n: usize| Task::new("svc", actix_dispatch::Method::POST, "/b").body(vec![b'x'; n]);
    let a = d.submit(post(600));
    let over = d.submit(post(600)).await;
    let c = d.submit(post(300));
    let alone = d.submit(post(1001)).await;
    for r in [&over, &alone] {
        assert!(
            matches!(r.outcome, Outcome::Rejected(Rejection::QueueFull)),
            "{:?}",
            r.outcome
        );
    }
    let (a, c) = (a.await, c.await);
    assert!(
        a.is_success() && c.is_success(),
        "{:?} {:?}",
        a.outcome,
        c.outcome
    );
    // Both answered: the bytes are free again.
    let again = d.submit(post(1000)).await;
    assert!(again.is_success(), "{:?}", again.outcome);
    assert_eq!(b.hits(), 3);
    d.shutdown(Duration::from_secs(1)).await;
}

/// Answers with the `authorization` header it received (`none` without).
fn auth_echo() -> (u16, actix_web::dev::ServerHandle) {
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(|req: HttpRequest| async move {
            let auth = (req.headers().get("authorization"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            HttpResponse::Ok().body(auth)
        }))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (port, handle)
}

/// A lease client carries the endpoint's configured credentials to the
/// endpoint only: a URL of another host (a `Location` followed by hand, a
/// link from a body) gets none of them. Before, they were default headers
/// of the client, sent to whatever host it was pointed at.
#[actix_rt::test]
async fn a_lease_client_keeps_the_endpoints_credentials_to_the_endpoint() {
    init_logs();
    let (ep, ep_handle) = auth_echo();
    let (other, other_handle) = auth_echo();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin",
            "headers":{{"authorization":"Bearer s3cret"}},
            "endpoints":[{{"address":"http://127.0.0.1:{ep}/v1/"}}]}}]}}"#
    );
    let d = Dispatcher::start(Config::from_json(&json).unwrap()).unwrap();
    let lease = d
        .lease("svc", actix_dispatch::LeaseOptions::new())
        .await
        .unwrap();
    let client = lease.client();
    let mut to_endpoint = client.get(lease.url("/who").unwrap()).send().await.unwrap();
    assert_eq!(to_endpoint.body().await.unwrap(), "Bearer s3cret");
    let url = format!("http://127.0.0.1:{other}/v1/who");
    let mut res = client.get(&url).send().await.unwrap();
    assert_eq!(res.body().await.unwrap(), "none", "{url}");
    drop(lease);
    d.shutdown(Duration::from_secs(1)).await;
    ep_handle.stop(false).await;
    other_handle.stop(false).await;
}
