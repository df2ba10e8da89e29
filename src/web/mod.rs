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
//!   and, with the `metrics` feature, `GET /metrics` (Prometheus text 0.0.4
//!   or OpenMetrics, by the request's `Accept`); `HEAD` on each answers as
//!   `GET` without the body. They list every backend's address and state:
//!   serve them on a listener of their own (a second `HttpServer` bound to
//!   an address the public cannot reach, as in the example below) or behind
//!   a guard, never beside the public routes.
//! - [`status_page`] serves a live status page (`GET /status`, one
//!   self-contained HTML page) and its data (`GET /status.json`), read-only
//!   and read at request time only: mount it beside the admin routes.
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
//! `{"error":"retries_exhausted","message":"no backend served the request","service":"inference","attempts":4}`,
//! with the codes of [`crate::codec::reason_code`] and a short fixed text.
//! The text never carries the transport's detail (addresses, TLS peer
//! names, URLs: where the backends are is not the public's to learn); that
//! stays in the [`TaskResult`], `stats()` and the logs (the gateway logs
//! each error answer's detail at `debug`). Only a 400's text, which is
//! about the client's own request, says what was wrong.
//!
//! **At the boundary.** Before anything is read or sent:
//! - a method the route does not forward is answered 405
//!   (`method_not_allowed`) with an `Allow` field. By default every method
//!   but `TRACE` (a backend that echoes it, as Apache does, would return
//!   the endpoint's configured `Authorization` to the client) and
//!   `CONNECT`; [`ForwardConfig::allowed_methods`] sets the list.
//! - request headers over [`ForwardConfig::max_headers`] fields,
//!   [`ForwardConfig::max_header_line`] bytes in one field or
//!   [`ForwardConfig::max_header_bytes`] in all (defaults 100, 8 KiB and
//!   32 KiB, as nginx and Envoy) are answered 431 (`headers_too_large`),
//!   and a request body over [`ForwardConfig::max_body`] (2 MiB) 413.
//! - the client's `X-Forwarded-Host`, `X-Forwarded-Proto`, `X-Real-IP`,
//!   `X-Original-URL` and `X-Rewrite-URL` are dropped: a backend takes
//!   them for the request's true host, scheme, address or path (IIS and
//!   Symfony route by `X-Original-URL`, past the path the gateway
//!   checked). [`ForwardConfig::trust_proxy_headers`] passes them where a
//!   proxy in front sets them.
//!
//! **Streaming** is the route's choice ([`ForwardConfig::stream`]), off by
//! default: a streamed answer holds its node's slot until the body ends,
//! so a client must not be able to turn it on alone. With
//! [`StreamWhen::EventStream`], a request whose `Accept` names
//! `text/event-stream` (a client of server-sent events, as OpenAI-compatible
//! chat completions with `"stream": true` are) is forwarded as a streamed
//! task ([`Task::stream`]): the client gets the backend's status and
//! headers as soon as they arrive, then each chunk (each event) as the
//! backend sends it; [`StreamWhen::Always`] streams every request. A body
//! that breaks after its head cannot become an error status any more: the
//! gateway ends the client's response early (the connection closes, the
//! chunked body without its last chunk), as a proxy does. A client that
//! leaves frees the backend's slot; so does one that stops reading: each
//! chunk it leaves waiting longer than [`ForwardConfig::stream_send_timeout`]
//! (10 s) ends its stream. [`ForwardConfig::stream_max_duration`] (none by
//! default) bounds a stream's whole life.
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
//!     let public_data = data.clone();
//!     let public = HttpServer::new(move || {
//!         App::new()
//!             .app_data(public_data.clone())
//!             .app_data(ForwardConfig::default().max_body(1 << 20))
//!             // Every path under /inference/ (a prefix match; a
//!             // "/inference/{tail:.*}" route works too, at a regex's cost).
//!             .service(web::scope("/inference").default_service(forward("inference")))
//!     })
//!     .bind(("0.0.0.0", 8080))?
//!     .run();
//!     // GET /stats, /health (and /metrics): on loopback only.
//!     let admin = HttpServer::new(move || App::new().app_data(data.clone()).configure(configure))
//!         .workers(1)
//!         .bind(("127.0.0.1", 9090))?
//!         .run();
//!     futures::try_join!(public, admin)?;
//!     dispatcher.shutdown(std::time::Duration::from_secs(10)).await;
//!     Ok(())
//! }
//! ```

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::http::header::{self, HeaderMap, HeaderName};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, Responder, Route};
use serde_json::json;

use crate::codec::{error_message, reason_code};
use crate::outcome::{FailReason, Outcome, Rejection, Response, TaskResult};
use crate::stats::{NodeStats, Stats};
use crate::{Dispatcher, Task};

mod admin;
mod forward;
mod limits;
mod respond;
mod status;

pub use admin::{configure, health_of};
pub use forward::{forward, is_hop_by_hop};
pub use status::{status_page, StatusPage};

use forward::connection_listed;
use limits::HeaderLimits;
use respond::{error, respond};

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
    stream_send_timeout: Duration,
    stream_max_duration: Option<Duration>,
    headers: HeaderLimits,
    priority_header: Option<HeaderName>,
    tenant: TenantFrom,
    /// `None`: every method but `TRACE` and `CONNECT`.
    allowed_methods: Option<Arc<[Method]>>,
    trust_proxy_headers: bool,
}

/// Where a forwarded request's tenant comes from.
#[derive(Clone)]
enum TenantFrom {
    Off,
    Header(HeaderName),
    With(TenantFn),
}

/// A function naming a request's tenant ([`ForwardConfig::tenant_with`]).
type TenantFn = Arc<dyn Fn(&HttpRequest) -> Option<String> + Send + Sync>;

impl std::fmt::Debug for TenantFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TenantFrom::Off => f.write_str("Off"),
            TenantFrom::Header(h) => f.debug_tuple("Header").field(h).finish(),
            TenantFrom::With(_) => f.write_str("With(..)"),
        }
    }
}

/// Which forwarded requests are streamed ([`ForwardConfig::stream`]): the
/// route's choice, which a client's `Accept` can only use, not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamWhen {
    /// Requests whose `Accept` names `text/event-stream` (a route of
    /// server-sent events, as an OpenAI-compatible chat completion).
    EventStream,
    /// Every request: bodies pass through as they come, unbuffered.
    Always,
    /// None (the default): every answer is read whole first (up to the
    /// service's `max_body`), and the node's slot is free once it is.
    #[default]
    Never,
}

/// A forwarded task's deadline when [`ForwardConfig::deadline`] is not set.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(15);

/// The methods a route forwards when [`ForwardConfig::allowed_methods`] is
/// not set, as an `Allow` field lists them: every method but `TRACE` (a
/// backend that echoes it sends the configured credentials back to the
/// client) and `CONNECT` (a tunnel, not a request). Other extension
/// methods (WebDAV's, say) pass too.
const DEFAULT_ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH";

impl Default for ForwardConfig {
    /// Bodies up to 2 MiB (the engine's default response limit), a
    /// deadline of 15 s for each request (Envoy's default route timeout:
    /// a client of an online service has a time it waits, so a request
    /// that cannot be served within it is refused at once, 503, rather
    /// than queued; [`ForwardConfig::without_deadline`] turns it off),
    /// `QueueFull` → 503 with `Retry-After: 1`, `RateLimited` → 429;
    /// request headers up to 100 fields, 8 KiB a field and 32 KiB in all
    /// (nginx's and Envoy's limits; see [`ForwardConfig::max_header_bytes`]);
    /// no streaming ([`StreamWhen::Never`]; a streamed body's reader gets
    /// 10 s to take each chunk, with no lifetime); every method but `TRACE`
    /// and `CONNECT`; the client's `X-Forwarded-Host`, `X-Forwarded-Proto`,
    /// `X-Real-IP`, `X-Original-URL` and `X-Rewrite-URL` dropped.
    fn default() -> Self {
        ForwardConfig::DEFAULT
    }
}

impl ForwardConfig {
    /// What [`ForwardConfig::default`] gives, as a constant: a request to
    /// an app without a `ForwardConfig` borrows it instead of making one.
    const DEFAULT: ForwardConfig = ForwardConfig {
        max_body: 2 * 1024 * 1024,
        deadline: Some(DEFAULT_DEADLINE),
        queue_full_status: StatusCode::SERVICE_UNAVAILABLE,
        rate_limited_status: StatusCode::TOO_MANY_REQUESTS,
        queue_full_retry_after: Duration::from_secs(1),
        stream: StreamWhen::Never,
        stream_send_timeout: Duration::from_secs(10),
        stream_max_duration: None,
        headers: HeaderLimits::DEFAULT,
        priority_header: None,
        tenant: TenantFrom::Off,
        allowed_methods: None,
        trust_proxy_headers: false,
    };

    /// Largest request body forwarded, bytes; larger ones get a 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Deadline of each forwarded task, from when the request arrives
    /// (all attempts together; past it the client gets a 504; default
    /// 15 s). A request that cannot be served within it is refused at once
    /// (503 with `Retry-After`) or shed from the queue (see
    /// `docs/overload.md`).
    pub fn deadline(mut self, within: Duration) -> Self {
        self.deadline = Some(within);
        self
    }

    /// No deadline: a forwarded task waits until it is served, bounded
    /// only by the queue's capacity (and each attempt by the service's
    /// timeout), as a task submitted without one does.
    pub fn without_deadline(mut self) -> Self {
        self.deadline = None;
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

    /// Which requests are streamed (default [`StreamWhen::Never`]; a route
    /// of server-sent events sets [`StreamWhen::EventStream`]). A streamed
    /// answer holds its node's slot until its body ends, so the route, not
    /// the client, decides; [`ForwardConfig::stream_send_timeout`] and
    /// [`ForwardConfig::stream_max_duration`] bound how long.
    pub fn stream(mut self, when: StreamWhen) -> Self {
        self.stream = when;
        self
    }

    /// Longest wait for a streaming client to take the next chunk (default
    /// 10 s; [`crate::Task::stream_send_timeout`]). A client that stops
    /// reading fills its socket's buffers, then the engine's small channel;
    /// a chunk left waiting longer ends the stream (the client's response
    /// ends early) and frees the node's slot, so clients that never read
    /// cannot take the pool.
    pub fn stream_send_timeout(mut self, within: Duration) -> Self {
        self.stream_send_timeout = within;
        self
    }

    /// Longest life of a streamed body, from the backend's head (default:
    /// none; [`crate::Task::stream_max_duration`]). Past it the client's
    /// response ends early and the node's slot is freed, however fast the
    /// client reads.
    pub fn stream_max_duration(mut self, within: Duration) -> Self {
        self.stream_max_duration = Some(within);
        self
    }

    /// The only methods forwarded; any other is answered 405 (`method_not_allowed`)
    /// with an `Allow` field listing these, without being sent. Default:
    /// every method but `TRACE` (a backend that echoes it, as Apache does
    /// by default, would send the endpoint's configured `Authorization`
    /// back to the client) and `CONNECT`. List `TRACE` here only for
    /// backends that do not echo it.
    pub fn allowed_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.allowed_methods = Some(methods.into_iter().collect());
        self
    }

    /// Passes the client's `X-Forwarded-Host`, `X-Forwarded-Proto`,
    /// `X-Real-IP`, `X-Original-URL` and `X-Rewrite-URL` on to the backend
    /// (default: dropped). Backends and frameworks take these for the
    /// request's true host, scheme, address or path (IIS and Symfony route
    /// by `X-Original-URL`), so a client could forge them past the
    /// gateway's checks; set this only where a proxy in front of the
    /// gateway sets them and drops the clients' own.
    pub fn trust_proxy_headers(mut self, yes: bool) -> Self {
        self.trust_proxy_headers = yes;
        self
    }

    /// Whether `method` is forwarded.
    fn allows(&self, method: &Method) -> bool {
        match &self.allowed_methods {
            None => *method != Method::TRACE && *method != Method::CONNECT,
            Some(list) => list.contains(method),
        }
    }

    /// The `Allow` field of a 405.
    fn allow_field(&self) -> String {
        match &self.allowed_methods {
            None => DEFAULT_ALLOW.to_owned(),
            Some(list) => list
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Largest total of the request's header fields, bytes, each counted
    /// as `name: value\r\n` (default 32 KiB, nginx's 4 × 8 KiB; Envoy
    /// allows 60 KiB). A request over it is answered 431 without being
    /// sent.
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.headers.total = bytes;
        self
    }

    /// Largest single header field, bytes, `name: value\r\n` (default
    /// 8 KiB, nginx's); over it, 431.
    pub fn max_header_line(mut self, bytes: usize) -> Self {
        self.headers.line = bytes;
        self
    }

    /// Most request header fields, a repeated name counting once per
    /// field (default 100, Envoy's); over it, 431. actix-http's HTTP/1
    /// parser answers a request of more than 96 fields 400 itself.
    pub fn max_headers(mut self, count: usize) -> Self {
        self.headers.count = count;
        self
    }

    /// The request header that sets a forwarded task's priority class
    /// (`critical`, `default` or `sheddable`, any case; see
    /// [`crate::Priority`]), for example `x-priority`. Off by default: on
    /// a gateway that faces the public, a client could mark all its
    /// requests critical, so set it where the callers are trusted (or
    /// where a proxy in front sets the header). The header is not
    /// forwarded; a value that is no class is answered 400
    /// (`bad_priority`), a request without it is `default`.
    pub fn priority_header(mut self, name: HeaderName) -> Self {
        self.priority_header = Some(name);
        self
    }

    /// The request header whose value names a forwarded task's tenant
    /// ([`crate::Task::tenant`]: the queue shares the dispatches between
    /// tenants by weight and sheds first from those over their share), for
    /// example `x-api-key` or `x-tenant`. Off by default. The header is
    /// forwarded as it came (it may be the backend's credential too); a
    /// value that is no valid key (1 to 128 printable ASCII characters, no
    /// spaces) is answered 400 (`bad_tenant`); a request without it counts
    /// to no tenant. Memory stays bounded whatever clients send (the
    /// service's `tenants.max_tracked`).
    pub fn tenant_header(mut self, name: HeaderName) -> Self {
        self.tenant = TenantFrom::Header(name);
        self
    }

    /// Names a forwarded task's tenant by a function of the request (a
    /// claim of a token already checked by a middleware, a path segment,
    /// the client's address): `None` counts it to no tenant. Replaces
    /// [`ForwardConfig::tenant_header`]; an invalid key is answered 400
    /// (`bad_tenant`).
    pub fn tenant_with(
        mut self,
        f: impl Fn(&HttpRequest) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = TenantFrom::With(Arc::new(f));
        self
    }

    /// The tenant the request names, if the route reads one.
    fn tenant(&self, req: &HttpRequest) -> Result<Option<String>, String> {
        let key = match &self.tenant {
            TenantFrom::Off => return Ok(None),
            TenantFrom::Header(name) => match req.headers().get(name) {
                None => return Ok(None),
                Some(v) => v
                    .to_str()
                    .map_err(|_| format!("header {name} is not visible ASCII"))?
                    .to_owned(),
            },
            TenantFrom::With(f) => match f(req) {
                None => return Ok(None),
                Some(k) => k,
            },
        };
        crate::algo::tenants::check_key(&key).map_err(|m| format!("tenant: {m}"))?;
        Ok(Some(key))
    }

    /// The class the request's priority header asks for.
    fn priority(&self, req: &HttpRequest) -> Result<crate::Priority, String> {
        let Some(name) = &self.priority_header else {
            return Ok(crate::Priority::Default);
        };
        match req.headers().get(name) {
            None => Ok(crate::Priority::Default),
            Some(v) => v
                .to_str()
                .map_err(|_| format!("header {name} is not visible ASCII"))?
                .parse::<crate::Priority>()
                .map_err(|e| format!("header {name}: {e}")),
        }
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

    fn of(req: &HttpRequest) -> &ForwardConfig {
        static DEFAULT: ForwardConfig = ForwardConfig::DEFAULT;
        req.app_data::<ForwardConfig>()
            .or_else(|| {
                req.app_data::<web::Data<ForwardConfig>>()
                    .map(|d| d.get_ref())
            })
            .unwrap_or(&DEFAULT)
    }
}

fn dispatcher_of(req: &HttpRequest) -> Option<Dispatcher> {
    req.app_data::<web::Data<Dispatcher>>()
        .map(|d| d.get_ref().clone())
        .or_else(|| req.app_data::<Dispatcher>().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_task_is_due_in_15_s_unless_set() {
        assert_eq!(
            ForwardConfig::default().deadline,
            Some(Duration::from_secs(15))
        );
        let d = ForwardConfig::default().deadline(Duration::from_millis(250));
        assert_eq!(d.deadline, Some(Duration::from_millis(250)));
        assert_eq!(ForwardConfig::default().without_deadline().deadline, None);
    }

    #[test]
    fn trace_and_connect_are_refused_unless_listed() {
        let cfg = ForwardConfig::default();
        for m in [
            "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "PROPFIND",
        ] {
            assert!(
                cfg.allows(&Method::from_bytes(m.as_bytes()).unwrap()),
                "{m}"
            );
        }
        assert!(!cfg.allows(&Method::TRACE));
        assert!(!cfg.allows(&Method::CONNECT));
        assert_eq!(cfg.allow_field(), DEFAULT_ALLOW);
        let cfg = cfg.allowed_methods([Method::POST, Method::TRACE]);
        assert!(cfg.allows(&Method::TRACE));
        assert!(!cfg.allows(&Method::GET));
        assert_eq!(cfg.allow_field(), "POST, TRACE");
    }
}
