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
//!   `GET` without the body.
//! - [`status_page`] serves a live status page (`GET /status`, one
//!   self-contained HTML page) and its data (`GET /status.json`), read-only
//!   and read at request time only.
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
//! [`ForwardConfig::max_body`] is answered 413 without being sent, and
//! request headers over [`ForwardConfig::max_headers`] fields,
//! [`ForwardConfig::max_header_line`] bytes in one field or
//! [`ForwardConfig::max_header_bytes`] in all (defaults 100, 8 KiB and
//! 32 KiB, as nginx and Envoy) are answered 431 (`headers_too_large`).
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
//!             // Every path under /inference/ (a prefix match; a
//!             // "/inference/{tail:.*}" route works too, at a regex's cost).
//!             .service(web::scope("/inference").default_service(forward("inference")))
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
use actix_web::http::header::{self, HeaderMap, HeaderName};
use actix_web::http::StatusCode;
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
    headers: HeaderLimits,
    priority_header: Option<HeaderName>,
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
    /// `QueueFull` → 503 with `Retry-After: 1`, `RateLimited` → 429;
    /// request headers up to 100 fields, 8 KiB a field and 32 KiB in all
    /// (nginx's and Envoy's limits; see [`ForwardConfig::max_header_bytes`]).
    fn default() -> Self {
        ForwardConfig::DEFAULT
    }
}

impl ForwardConfig {
    /// What [`ForwardConfig::default`] gives, as a constant: a request to
    /// an app without a `ForwardConfig` borrows it instead of making one.
    const DEFAULT: ForwardConfig = ForwardConfig {
        max_body: 2 * 1024 * 1024,
        deadline: None,
        queue_full_status: StatusCode::SERVICE_UNAVAILABLE,
        rate_limited_status: StatusCode::TOO_MANY_REQUESTS,
        queue_full_retry_after: Duration::from_secs(1),
        stream: StreamWhen::EventStream,
        headers: HeaderLimits::DEFAULT,
        priority_header: None,
    };

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
