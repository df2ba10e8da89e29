//! actix-web integration (cargo feature `web`): an API gateway in a few lines.
//!
//! - [`forward`]`("inference")` is a route that turns the incoming request
//!   into a [`Task`] for that service and the task's result back into the
//!   response: method, the route's path tail and query, headers and body go
//!   out; the backend's status, headers and body come back. Hop-by-hop
//!   headers (RFC 9110 §7.6.1: `Connection` and the headers it names,
//!   `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`,
//!   `Upgrade`) are dropped both ways, as are `Host` and `Content-Length`
//!   (the engine sets them for the endpoint it picks). The client's address,
//!   taken from the socket and never from its own headers, is appended to
//!   `X-Forwarded-For` and `Forwarded` (RFC 7239), as nginx and Envoy do.
//! - `impl Responder for TaskResult` gives any handler that calls
//!   [`Dispatcher::submit`] the same mapping of outcomes to responses.
//! - [`configure`] serves `GET /stats` (the JSON of [`Dispatcher::stats`]),
//!   `GET /health` (200 while every service has an eligible node, else 503)
//!   and, with the `metrics` feature, `GET /metrics`.
//!
//! The handlers find the [`Dispatcher`] in the app data (as
//! `web::Data<Dispatcher>` or a plain `Dispatcher`), and their options in a
//! [`ForwardConfig`] there (defaults otherwise), as actix-web's own
//! extractors find `JsonConfig`.
//!
//! | outcome | response |
//! | --- | --- |
//! | `Success`, `Fallback` | the backend's (or the fallback's) status, headers, body |
//! | `Failure`, `not_retryable` with an answer | the backend's answer as it was (a 404 stays a 404) |
//! | `Failure`, `deadline_exceeded` | 504 |
//! | any other `Failure` (retries or budget exhausted, errors) | 502 |
//! | `Rejected(QueueFull)` | 503 (or [`ForwardConfig::queue_full_status`]) with `Retry-After` |
//! | `Rejected(RateLimited)` | 429 (or [`ForwardConfig::rate_limited_status`]) with `Retry-After` |
//! | `Rejected(CircuitOpen)` | 503 with `Retry-After` |
//! | `Rejected(ShuttingDown)`, `Rejected(UnknownService)`, `Rejected(Internal)` | 503 |
//! | `Rejected(DeadlinePassed)` | 504 |
//! | `Rejected(InvalidTask)` | 400 |
//!
//! The status codes follow Envoy's (429 for a local rate limit, 503 for an
//! overflowing queue or no healthy upstream, 502/504 for upstream failures
//! and timeouts). Every error the gateway makes itself has a small JSON body:
//! `{"error":"retries_exhausted","message":"...","service":"inference",...}`,
//! with the codes of [`crate::codec::reason_code`]. A request body over
//! [`ForwardConfig::max_body`] is answered 413 without being sent.
//!
//! **Streaming.** A request whose `Accept` names `text/event-stream` (a
//! client of server-sent events, as OpenAI-compatible chat completions with
//! `"stream": true` are) is forwarded as a streamed task
//! ([`Task::stream`]): the client gets the backend's status and headers as
//! soon as they arrive, then each chunk (each event) as the backend sends
//! it. [`ForwardConfig::stream`] streams every request, or none. A body
//! that breaks after its head cannot become an error status any more: the
//! gateway ends the client's response early (the connection closes), as a
//! proxy does; a client that leaves frees the backend's slot.
//!
//! ```no_run
//! use actix_dispatch::{web::{configure, forward, ForwardConfig}, Config, Dispatcher};
//! use actix_web::{web, App, HttpServer};
//!
//! #[actix_web::main]
//! async fn main() -> std::io::Result<()> {
//!     let config = Config::from_file("gateway.json").expect("valid config");
//!     let dispatcher = Dispatcher::start(config).expect("inside the actix System");
//!     let data = web::Data::new(dispatcher.clone());
//!     HttpServer::new(move || {
//!         App::new()
//!             .app_data(data.clone())
//!             .app_data(ForwardConfig::default().max_body(1 << 20))
//!             .route("/inference/{tail:.*}", forward("inference"))
//!             .configure(configure) // GET /stats, /health (and /metrics)
//!     })
//!     .bind(("127.0.0.1", 8080))?
//!     .run()
//!     .await?;
//!     dispatcher.shutdown(std::time::Duration::from_secs(10)).await;
//!     Ok(())
//! }
//! ```

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, Responder, Route};
use serde_json::json;

use crate::codec::{reason_code, rejection_code};
use crate::outcome::{FailReason, Outcome, Rejection, Response, TaskResult};
use crate::stats::{NodeStats, Stats};
use crate::{Dispatcher, Task};

/// Options of [`forward`] and of the `TaskResult` responder, found in the
/// app data (`App::app_data(ForwardConfig::default().max_body(..))`).
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    max_body: usize,
    deadline: Option<Duration>,
    queue_full_status: StatusCode,
    rate_limited_status: StatusCode,
    queue_full_retry_after: Duration,
    stream: StreamWhen,
}

/// Which forwarded requests are streamed ([`ForwardConfig::stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamWhen {
    /// Requests whose `Accept` names `text/event-stream` (the default).
    #[default]
    EventStream,
    /// Every request: bodies pass through as they come, unbuffered.
    Always,
    /// None: every answer is read whole first (up to the service's
    /// `max_body`).
    Never,
}

impl Default for ForwardConfig {
    /// Bodies up to 2 MiB (the engine's default response limit), no
    /// deadline (each attempt is bounded by the service's timeout),
    /// `QueueFull` → 503 with `Retry-After: 1`, `RateLimited` → 429.
    fn default() -> Self {
        ForwardConfig {
            max_body: 2 * 1024 * 1024,
            deadline: None,
            queue_full_status: StatusCode::SERVICE_UNAVAILABLE,
            rate_limited_status: StatusCode::TOO_MANY_REQUESTS,
            queue_full_retry_after: Duration::from_secs(1),
            stream: StreamWhen::EventStream,
        }
    }
}

impl ForwardConfig {
    /// Largest request body forwarded, bytes; larger ones get a 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Deadline of each forwarded task, from when the request arrives
    /// (all attempts together; past it the client gets a 504).
    pub fn deadline(mut self, within: Duration) -> Self {
        self.deadline = Some(within);
        self
    }

    /// Status for a full queue: 503 (default) or 429.
    pub fn queue_full_status(mut self, status: StatusCode) -> Self {
        self.queue_full_status = status;
        self
    }

    /// Status for a rate-limited task: 429 (default) or 503.
    pub fn rate_limited_status(mut self, status: StatusCode) -> Self {
        self.rate_limited_status = status;
        self
    }

    /// `Retry-After` sent with a full queue's answer (default 1 s); a queue
    /// does not know when it will have room.
    pub fn queue_full_retry_after(mut self, after: Duration) -> Self {
        self.queue_full_retry_after = after;
        self
    }

    /// Which requests are streamed (default: those accepting
    /// `text/event-stream`).
    pub fn stream(mut self, when: StreamWhen) -> Self {
        self.stream = when;
        self
    }

    /// Whether `req` is forwarded as a streamed task.
    fn streams(&self, req: &HttpRequest) -> bool {
        match self.stream {
            StreamWhen::Always => true,
            StreamWhen::Never => false,
            StreamWhen::EventStream => req
                .headers()
                .get_all(header::ACCEPT)
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|m| {
                    m.split(';')
                        .next()
                        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
                }),
        }
    }

    fn of(req: &HttpRequest) -> ForwardConfig {
        req.app_data::<ForwardConfig>()
            .or_else(|| {
                req.app_data::<web::Data<ForwardConfig>>()
                    .map(|d| d.get_ref())
            })
            .cloned()
            .unwrap_or_default()
    }
}

fn dispatcher_of(req: &HttpRequest) -> Option<Dispatcher> {
    req.app_data::<web::Data<Dispatcher>>()
        .map(|d| d.get_ref().clone())
        .or_else(|| req.app_data::<Dispatcher>().cloned())
}

// === forward ===

/// A route (any method) that forwards each request to `service`. Mount it
/// on a path with a tail, `{tail:.*}` or `{tail}*`: the tail and the query
/// become the task's path. Without a `tail` parameter, the part of the path
/// the routing has not consumed is the path (a scope's default service).
pub fn forward(service: impl Into<String>) -> Route {
    let service: Arc<str> = service.into().into();
    web::to(move |req: HttpRequest, body: web::Payload| {
        let service = Arc::clone(&service);
        async move { forward_one(&service, req, body).await }
    })
}

async fn forward_one(service: &str, req: HttpRequest, body: web::Payload) -> HttpResponse {
    let Some(dispatcher) = dispatcher_of(&req) else {
        let msg = "no Dispatcher in the app data (App::app_data(web::Data::new(dispatcher)))";
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no_dispatcher",
            msg,
            service,
        );
    };
    let cfg = ForwardConfig::of(&req);
    let too_large = || {
        let msg = format!("request body over {} bytes", cfg.max_body);
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &msg,
            service,
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cfg.max_body as u64) {
        return too_large();
    }
    let body = match body.to_bytes_limited(cfg.max_body).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            let msg = format!("cannot read the request body: {e}");
            return error(StatusCode::BAD_REQUEST, "bad_body", &msg, service);
        }
        Err(_) => return too_large(),
    };
    let mut task = Task::new(service, req.method().clone(), task_path(&req)).body(body);
    match outgoing_headers(&req) {
        Ok(headers) => {
            for (k, v) in headers {
                task = task.header(k, v);
            }
        }
        Err(msg) => return error(StatusCode::BAD_REQUEST, "bad_header", &msg, service),
    }
    if let Some(d) = cfg.deadline {
        task = task.deadline_in(d);
    }
    if cfg.streams(&req) {
        task = task.stream(true);
    }
    let result = dispatcher.submit(task).await;
    respond(result, &cfg)
}

/// The task's path: the route's tail (re-encoded where actix decoded it)
/// and the raw query.
fn task_path(req: &HttpRequest) -> String {
    let info = req.match_info();
    let tail = info.get("tail").unwrap_or_else(|| info.unprocessed());
    let mut path = String::with_capacity(tail.len() + 1 + req.query_string().len() + 1);
    path.push('/');
    encode_path(tail.trim_start_matches('/'), &mut path);
    if !req.query_string().is_empty() {
        path.push('?');
        path.push_str(req.query_string());
    }
    path
}

/// Percent-encodes what a URI path may not hold. actix-web's router decodes
/// a path except `%`, `/` and `+` (kept as `%25`, `%2F`, `%2B`), so a `%`
/// here starts an escape and stays; a decoded `?`, `#` or space does not.
fn encode_path(tail: &str, out: &mut String) {
    for b in tail.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Whether a header is the connection's and not the message's (RFC 9110
/// §7.6.1), or one the engine sets for the endpoint (`Host`, `Content-Length`).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    ) || n.starts_with("proxy-")
}

/// The headers named in `Connection` (lowercase).
fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// The end-to-end headers of `headers`, each name once (repeated values
/// joined, as RFC 9110 §5.3 allows), in order of first appearance.
fn end_to_end(headers: &HeaderMap) -> Vec<(HeaderName, Vec<&HeaderValue>)> {
    let listed = connection_listed(headers);
    let mut out: Vec<(HeaderName, Vec<&HeaderValue>)> = Vec::new();
    for (name, value) in headers.iter() {
        if is_hop_by_hop(name) || listed.iter().any(|l| l == name.as_str()) {
            continue;
        }
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(value),
            None => out.push((name.clone(), vec![value])),
        }
    }
    out
}

/// The request's headers as the task carries them: end to end only, with
/// the client's address appended to `X-Forwarded-For` and `Forwarded`.
fn outgoing_headers(req: &HttpRequest) -> Result<Vec<(String, String)>, String> {
    let peer = req.peer_addr().map(|a| a.ip());
    let mut out = Vec::new();
    let (mut xff, mut fwd) = (None, None);
    for (name, values) in end_to_end(req.headers()) {
        let mut texts = Vec::with_capacity(values.len());
        for v in values {
            let text = v
                .to_str()
                .map_err(|_| format!("header {name} has a value that is not visible ASCII"))?;
            texts.push(text);
        }
        let sep = if name == header::COOKIE { "; " } else { ", " };
        let joined = texts.join(sep);
        if name.as_str() == "x-forwarded-for" {
            xff = Some(joined);
        } else if name == header::FORWARDED {
            fwd = Some(joined);
        } else {
            out.push((name.as_str().to_owned(), joined));
        }
    }
    if let Some(ip) = peer {
        let xff = match xff {
            Some(prev) => format!("{prev}, {ip}"),
            None => ip.to_string(),
        };
        out.push(("x-forwarded-for".into(), xff));
        let mut this = format!("for={}", forwarded_node(ip));
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if let Some(host) = host.filter(|h| is_token_or_host(h)) {
            this.push_str(&format!(";host={host}"));
        }
        let proto = if req.app_config().secure() {
            "https"
        } else {
            "http"
        };
        this.push_str(&format!(";proto={proto}"));
        let fwd = match fwd {
            Some(prev) => format!("{prev}, {this}"),
            None => this,
        };
        out.push(("forwarded".into(), fwd));
    } else {
        out.extend(xff.map(|v| ("x-forwarded-for".to_owned(), v)));
        out.extend(fwd.map(|v| ("forwarded".to_owned(), v)));
    }
    Ok(out)
}

/// RFC 7239 §6: an IPv6 node is quoted and bracketed.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// A `Host` value that can go into `Forwarded` unquoted.
fn is_token_or_host(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

// === the outcome mapping ===

impl Responder for TaskResult {
    type Body = BoxBody;

    fn respond_to(self, req: &HttpRequest) -> HttpResponse {
        respond(self, &ForwardConfig::of(req))
    }
}

/// The response for a task's result (see the module docs' table).
fn respond(r: TaskResult, cfg: &ForwardConfig) -> HttpResponse {
    let code = reason_code(&r.outcome).unwrap_or("ok");
    let service = r.service.clone();
    let attempts = r.attempts.len();
    let (status, message, retry_after) = match r.outcome {
        Outcome::Success(mut resp)
        | Outcome::Fallback {
            response: mut resp, ..
        } => return proxied(&mut resp),
        Outcome::Failure(f) => {
            let message = match &f.last {
                Some(last) => format!("{}; last attempt: {last}", f.reason),
                None => f.reason.to_string(),
            };
            match (f.reason, f.response) {
                (FailReason::NotRetryable, Some(mut resp)) => return proxied(&mut resp),
                (FailReason::DeadlineExceeded, _) => (StatusCode::GATEWAY_TIMEOUT, message, None),
                _ => (StatusCode::BAD_GATEWAY, message, None),
            }
        }
        Outcome::Rejected(why) => {
            let (status, after) = match &why {
                Rejection::QueueFull => (cfg.queue_full_status, Some(cfg.queue_full_retry_after)),
                Rejection::RateLimited { retry_after } => {
                    (cfg.rate_limited_status, Some(*retry_after))
                }
                Rejection::CircuitOpen { retry_after } => {
                    (StatusCode::SERVICE_UNAVAILABLE, Some(*retry_after))
                }
                Rejection::ShuttingDown | Rejection::UnknownService(_) | Rejection::Internal(_) => {
                    (StatusCode::SERVICE_UNAVAILABLE, None)
                }
                Rejection::DeadlinePassed => (StatusCode::GATEWAY_TIMEOUT, None),
                Rejection::InvalidTask(_) => (StatusCode::BAD_REQUEST, None),
            };
            debug_assert_eq!(code, rejection_code(&why));
            (status, why.to_string(), after)
        }
    };
    let mut body = json!({"error": code, "message": message, "service": &*service});
    if attempts > 0 {
        body["attempts"] = attempts.into();
    }
    let mut res = HttpResponse::build(status);
    if let Some(after) = retry_after {
        // Whole seconds, rounded up: never tell a client to come back early.
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        let secs = secs.max(1);
        body["retry_after"] = secs.into();
        res.insert_header((header::RETRY_AFTER, secs));
    }
    res.content_type("application/json").body(body.to_string())
}

/// The backend's answer, end-to-end headers only; a streamed body passes
/// through chunk by chunk (an error item ends the client's response early).
fn proxied(resp: &mut Response) -> HttpResponse {
    let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut res = HttpResponse::build(status);
    for (name, values) in end_to_end(&resp.headers) {
        for v in values {
            res.append_header((name.clone(), v.clone()));
        }
    }
    match resp.take_stream() {
        Some(stream) => res.streaming(stream),
        None => res.body(resp.body.clone()),
    }
}

/// A JSON error the gateway makes itself.
fn error(status: StatusCode, code: &str, message: &str, service: &str) -> HttpResponse {
    let body = json!({"error": code, "message": message, "service": service});
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_string())
}

// === configure: /stats, /health, /metrics ===

/// Serves `GET /stats`, `GET /health` and, with the `metrics` feature,
/// `GET /metrics`; mount it at the root or in a scope
/// (`web::scope("/admin").configure(configure)`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/stats", web::get().to(stats))
        .route("/health", web::get().to(health));
    // The Prometheus exposition (issue 10, part 2) plugs in here.
    #[cfg(feature = "metrics")]
    cfg.route("/metrics", web::get().to(crate::metrics::serve));
}

/// `GET /stats`: the JSON of [`Dispatcher::stats`].
async fn stats(req: HttpRequest) -> HttpResponse {
    let Some(d) = dispatcher_of(&req) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_dispatcher", "", "");
    };
    HttpResponse::Ok().json(d.stats().await)
}

/// `GET /health`: 200 while every service has an eligible node, else 503.
async fn health(req: HttpRequest) -> HttpResponse {
    let Some(d) = dispatcher_of(&req) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_dispatcher", "", "");
    };
    let (ok, body) = health_of(&d.stats().await);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    HttpResponse::build(status).json(body)
}

/// Why a node cannot take a task now, if it cannot.
fn unavailable(n: &NodeStats) -> Option<&'static str> {
    if !n.active {
        Some("inactive")
    } else if n.draining {
        Some("draining")
    } else if n.health == "unhealthy" {
        Some("unhealthy")
    } else if n.breaker == "open" {
        Some("breaker open")
    } else {
        None
    }
}

/// Whether every service has an eligible node (active, not draining, not
/// unhealthy, breaker not open), and the per-service report.
pub fn health_of(stats: &Stats) -> (bool, serde_json::Value) {
    let mut all_ok = true;
    let mut services = serde_json::Map::new();
    for s in &stats.services {
        let down: Vec<serde_json::Value> = s
            .nodes
            .iter()
            .filter_map(|n| unavailable(n).map(|why| json!({"address": n.address, "why": why})))
            .collect();
        let eligible = s.nodes.len() - down.len();
        let ok = eligible > 0;
        all_ok &= ok;
        let entry = json!({
            "status": if ok { "ok" } else { "unavailable" },
            "eligible": eligible,
            "nodes": s.nodes.len(),
            "queued": s.queue.queued,
            "in_flight": s.queue.in_flight,
            "unavailable": down,
        });
        services.insert(s.name.clone(), entry);
    }
    let status = if all_ok { "ok" } else { "unavailable" };
    (all_ok, json!({"status": status, "services": services}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn decoded_specials_are_encoded_again() {
        let mut out = String::new();
        encode_path("a b/c?d#e/%2F/ü/x:y@z", &mut out);
        assert_eq!(out, "a%20b/c%3Fd%23e/%2F/%C3%BC/x:y@z");
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_dropped() {
        let req = TestRequest::default()
            .insert_header(("connection", "keep-alive, x-hop"))
            .insert_header(("x-hop", "1"))
            .insert_header(("keep-alive", "timeout=5"))
            .insert_header(("proxy-authorization", "Basic eA=="))
            .insert_header(("te", "trailers"))
            .insert_header(("trailer", "x-t"))
            .insert_header(("upgrade", "h2c"))
            .insert_header(("host", "gw.example"))
            .insert_header(("content-length", "0"))
            .insert_header(("x-keep", "yes"))
            .append_header(("x-many", "a"))
            .append_header(("x-many", "b"))
            .insert_header(("x-forwarded-for", "10.0.0.1"))
            .peer_addr("192.0.2.7:5000".parse().unwrap())
            .to_http_request();
        let h: std::collections::BTreeMap<String, String> =
            outgoing_headers(&req).unwrap().into_iter().collect();
        let names: Vec<&str> = h.keys().map(String::as_str).collect();
        assert_eq!(names, ["forwarded", "x-forwarded-for", "x-keep", "x-many"]);
        assert_eq!(h["x-many"], "a, b");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(h["forwarded"], "for=192.0.2.7;host=gw.example;proto=http");
    }

    #[test]
    fn ipv6_clients_are_quoted_in_forwarded() {
        let req = TestRequest::default()
            .peer_addr("[2001:db8::1]:443".parse().unwrap())
            .to_http_request();
        let h = outgoing_headers(&req).unwrap();
        assert_eq!(h[0], ("x-forwarded-for".into(), "2001:db8::1".into()));
        assert_eq!(h[1].1, "for=\"[2001:db8::1]\";proto=http");
    }
}
