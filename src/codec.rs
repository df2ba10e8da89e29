//! The wire form of tasks and results: one JSON object per line (JSONL).
//!
//! The command-line runner (`actix-dispatch run`, feature `cli`) reads
//! [`TaskLine`]s and writes [`ResultLine`]s; a durable task stream (Redis)
//! stores the same shapes, so a task file, a stream entry and a list of
//! unfinished tasks are interchangeable. The shapes follow what HTTP
//! command-line tools take (vegeta's JSON targets, xh's `key:=json`): a
//! method, a path, headers, and a body given either as JSON (`json`) or as a
//! string (`body`, UTF-8 or base64 as `body_encoding` says).
//!
//! A task line:
//!
//! ```json
//! {"id": 7, "service": "inference", "method": "POST", "path": "/v1/generate",
//!  "headers": {"x-request-id": "7"}, "json": {"prompt": "hi"},
//!  "timeout": "2s", "deadline": "10s", "idempotent": true, "affinity": "user-42",
//!  "priority": "critical", "tenant": "acme"}
//! ```
//!
//! Only `service` and `path` are required. `method` defaults to `GET`, or to
//! `POST` when the line has a body (as xh does). A `json` body gets
//! `content-type: application/json` unless the headers set one. Durations are
//! human strings (`"250ms"`); `deadline` counts from submission. Unknown
//! fields are refused, so a misspelt `idempotnet` is an error, not silently
//! dropped.
//!
//! A line is untrusted input (anyone who writes the file or the stream
//! writes it): [`TaskLine::to_task_within`] builds it within its service's
//! [`LineLimits`] (`lines` in the config: the longest timeout and deadline,
//! the largest body and headers, whether a priority is taken), as the CLI
//! and the stream consumer do.
//!
//! A result line names the outcome (`success`, `failure`, `rejected`,
//! `fallback`, or `invalid` for a line that could not be read), a `reason`
//! code for everything but success (the same codes [`reason_code`] gives the
//! gateway's error bodies), the status, serving node, attempts and total
//! time, and the body as UTF-8 text when it is, else base64.
//!
//! ```
//! use actix_dispatch::codec::{ResultLine, TaskLine};
//! let line = r#"{"id":"a1","service":"api","path":"/items/1","timeout":"2s"}"#;
//! let t: TaskLine = serde_json::from_str(line).unwrap();
//! let task = t.to_task().unwrap();
//! assert_eq!(task.method().as_str(), "GET");
//! assert_eq!(task.path(), "/items/1");
//!
//! let bad = ResultLine::invalid(3, "expected value at line 1 column 1");
//! let out = serde_json::to_string(&bad).unwrap();
//! assert!(out.contains(r#""outcome":"invalid""#) && out.contains(r#""line":3"#));
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

pub use crate::config::LineLimits;
use crate::outcome::{Outcome, Rejection, TaskResult};
use crate::task::{Priority, Task};
use crate::Method;

/// A task's id as the line gave it: a number or a string, echoed back
/// unchanged in its result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum WireId {
    /// A numeric id.
    Number(u64),
    /// Any other id.
    Text(String),
}

/// How a body string is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BodyEncoding {
    /// The body is the string's UTF-8 bytes (the default).
    #[default]
    Utf8,
    /// The body is the string, base64-decoded (standard alphabet, padded).
    Base64,
}

/// One task as written in a JSONL file or stream entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TaskLine {
    /// Caller's id, echoed in the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<WireId>,
    /// Service name.
    pub service: String,
    /// HTTP method; default `GET`, or `POST` when there is a body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Path relative to the endpoint (may carry a query).
    pub path: String,
    /// Request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A JSON body (exclusive with `body`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    /// A body string (exclusive with `json`), encoded as `body_encoding` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Encoding of `body`.
    #[serde(default, skip_serializing_if = "is_utf8")]
    pub body_encoding: BodyEncoding,
    /// Per-attempt timeout (`"2s"`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// Deadline for all attempts together, from submission (`"10s"`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub deadline: Option<Duration>,
    /// Whether retries after timeouts and resets are safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Affinity key for `consistent_hash` services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
    /// The task's class under overload: `critical`, `default` (when
    /// absent) or `sheddable` ([`Task::priority`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::task::Priority>,
    /// The tenant the task counts to, for fair shares between tenants
    /// ([`Task::tenant`]): 1 to 128 printable ASCII characters without
    /// spaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Stream the answer ([`Task::stream`]). A result line is made from the
    /// answer's head: a streamed success's line carries no body (the body
    /// is the caller's to read from the [`crate::BodyStream`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

fn is_utf8(e: &BodyEncoding) -> bool {
    *e == BodyEncoding::Utf8
}

/// Refuses a body of `len` bytes over the line bound.
fn body_within(len: usize, limits: &LineLimits) -> Result<(), String> {
    if len > limits.max_body {
        return Err(format!(
            "body: {len} bytes, over the service's lines.max_body ({})",
            limits.max_body
        ));
    }
    Ok(())
}

impl TaskLine {
    /// Parses one line; an error names the field (`timeout: invalid value ...`).
    pub fn parse(line: &str) -> Result<TaskLine, String> {
        let de = &mut serde_json::Deserializer::from_str(line);
        let t: TaskLine = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            match path.as_str() {
                "." => e.into_inner().to_string(),
                _ => format!("{path}: {}", e.into_inner()),
            }
        })?;
        Ok(t)
    }

    /// Builds the engine's [`Task`] as the line asks, unbounded: for lines
    /// the application trusts. Lines from files and streams go through
    /// [`TaskLine::to_task_within`]. Errors name the field; the engine's
    /// own checks (path, headers, limits) still run at submit.
    pub fn to_task(&self) -> Result<Task, String> {
        self.build(None)
    }

    /// Builds the engine's [`Task`] within what a line may ask of its
    /// service ([`LineLimits`], the service's `lines`): a `timeout` or
    /// `deadline` longer than the bound, a body or headers larger, are
    /// refused naming the field and the bound; a `priority` is taken only
    /// when the service allows it (else the task is of the default class,
    /// logged at debug level).
    ///
    /// ```
    /// use actix_dispatch::codec::TaskLine;
    /// let cfg = actix_dispatch::Config::from_json(
    ///     r#"{"services":[{"name":"api","timeout":"2s","endpoints":[{"address":"http://h/"}]}]}"#,
    /// ).unwrap();
    /// let limits = &cfg.services[0].lines;
    /// let line = TaskLine::parse(r#"{"service":"api","path":"/a","timeout":"365days"}"#).unwrap();
    /// let e = line.to_task_within(limits).unwrap_err();
    /// assert!(e.starts_with("timeout: ") && e.contains("lines.max_timeout"), "{e}");
    /// ```
    pub fn to_task_within(&self, limits: &LineLimits) -> Result<Task, String> {
        self.build(Some(limits))
    }

    /// The refusals of [`TaskLine::to_task_within`] that need no body
    /// decoded: timeout, deadline, headers, and a body string too long
    /// whatever its encoding.
    fn check_within(&self, limits: &LineLimits) -> Result<(), String> {
        let over = |field: &str, d: Duration, bound: &str, max: Duration| {
            format!("{field}: {d:?} is over the service's lines.{bound} ({max:?})")
        };
        if let Some(t) = self.timeout.filter(|t| *t > limits.max_timeout) {
            return Err(over("timeout", t, "max_timeout", limits.max_timeout));
        }
        if let Some(d) = self.deadline.filter(|d| *d > limits.max_deadline) {
            return Err(over("deadline", d, "max_deadline", limits.max_deadline));
        }
        let header_bytes = self
            .headers
            .iter()
            .map(|(k, v)| k.len().saturating_add(v.len()))
            .fold(0usize, usize::saturating_add);
        if header_bytes > limits.max_header_bytes {
            return Err(format!(
                "headers: {header_bytes} bytes, over the service's lines.max_header_bytes ({})",
                limits.max_header_bytes
            ));
        }
        if let Some(b) = &self.body {
            // Base64 decodes to 3 bytes per 4 at most: refused before any
            // decoding when even that is too much.
            let at_least = match self.body_encoding {
                BodyEncoding::Utf8 => b.len(),
                BodyEncoding::Base64 => b.trim_end_matches('=').len() / 4 * 3,
            };
            body_within(at_least, limits)?;
        }
        Ok(())
    }

    fn build(&self, limits: Option<&LineLimits>) -> Result<Task, String> {
        if let Some(l) = limits {
            self.check_within(l)?;
        }
        let body: Option<Vec<u8>> = match (&self.json, &self.body) {
            (Some(_), Some(_)) => return Err("`json` and `body` are exclusive".into()),
            (Some(v), None) => Some(serde_json::to_vec(v).map_err(|e| format!("json: {e}"))?),
            (None, Some(b)) => Some(match self.body_encoding {
                BodyEncoding::Utf8 => b.clone().into_bytes(),
                BodyEncoding::Base64 => BASE64
                    .decode(b)
                    .map_err(|e| format!("body: not base64: {e}"))?,
            }),
            (None, None) => None,
        };
        if let (Some(l), Some(b)) = (limits, &body) {
            body_within(b.len(), l).map_err(|e| match self.json {
                Some(_) => e.replacen("body", "json", 1),
                None => e,
            })?;
        }
        let method = match &self.method {
            Some(m) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("method {m:?} is not an HTTP method"))?,
            None if body.is_some() => Method::POST,
            None => Method::GET,
        };
        let mut task = Task::new(self.service.clone(), method, self.path.clone());
        for (k, v) in &self.headers {
            task = task.header(k.clone(), v.clone());
        }
        if self.json.is_some()
            && !self
                .headers
                .keys()
                .any(|k| k.eq_ignore_ascii_case("content-type"))
        {
            task = task.header("content-type", "application/json");
        }
        if let Some(b) = body {
            task = task.body(b);
        }
        if let Some(t) = self.timeout {
            task = task.timeout(t);
        }
        if let Some(d) = self.deadline {
            task = task.deadline_in(d);
        }
        if let Some(i) = self.idempotent {
            task = task.idempotent(i);
        }
        if let Some(a) = &self.affinity {
            task = task.affinity(a.clone());
        }
        match (self.priority, limits) {
            (Some(p), Some(l)) if !l.allow_priority && p != Priority::Default => {
                log::debug!(
                    "task line {:?}: priority {p} not taken (the service's \
                     lines.allow_priority is false); default class",
                    self.id
                );
            }
            (Some(p), _) => task = task.priority(p),
            (None, _) => {}
        }
        if let Some(t) = &self.tenant {
            crate::algo::tenants::check_key(t).map_err(|m| format!("tenant: {m}"))?;
            task = task.tenant(t.clone());
        }
        if self.stream {
            task = task.stream(true);
        }
        Ok(task)
    }
}

// === impl ResultLine ===

/// One result as written: `outcome` is `success`, `failure`, `rejected`,
/// `fallback` or `invalid`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResultLine {
    /// The task line's id, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<WireId>,
    /// Input line number (1-based), where the task came from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// Service name (empty for a line that could not be read).
    pub service: String,
    /// How the task ended.
    pub outcome: String,
    /// A code for why it did not succeed ([`reason_code`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason in words (rejections and invalid lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Status of the answer that ended the task, if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Node that answered last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Attempts made (hedges included).
    pub attempts: u32,
    /// HTTP version of the answer that ended the task: `h2` or `http/1.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// From submit to result, milliseconds.
    pub total_ms: f64,
    /// Response body, if there was a response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Encoding of `body`: `utf8` or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_encoding: Option<BodyEncoding>,
}

impl ResultLine {
    /// The line for a finished task.
    pub fn from_result(r: &TaskResult, id: Option<WireId>, line: Option<u64>) -> ResultLine {
        let response = r.response();
        let (body, body_encoding) = match response {
            Some(resp) => {
                let (b, e) = encode_body(&resp.body);
                (Some(b), Some(e))
            }
            None => (None, None),
        };
        let error = error_message(r);
        ResultLine {
            id,
            line,
            service: r.service.to_string(),
            outcome: outcome_name(&r.outcome).to_owned(),
            reason: reason_code(&r.outcome).map(str::to_owned),
            error,
            status: response.map(|resp| resp.status),
            node: response
                .map(|resp| resp.node.to_string())
                .or_else(|| r.attempts.last().map(|a| a.node.to_string())),
            attempts: u32::try_from(r.attempts.len()).unwrap_or(u32::MAX),
            protocol: response.and_then(|resp| {
                let a = r.attempts.iter().rev().find(|a| a.node == resp.node)?;
                a.protocol.map(|p| p.as_str().to_owned())
            }),
            total_ms: (r.total.as_secs_f64() * 1e6).round() / 1e3,
            body,
            body_encoding,
        }
    }

    /// The line for input line `line` that is not a task.
    pub fn invalid(line: u64, reason: impl Into<String>) -> ResultLine {
        ResultLine {
            id: None,
            line: Some(line),
            service: String::new(),
            outcome: "invalid".into(),
            reason: Some("invalid_line".into()),
            error: Some(reason.into()),
            status: None,
            node: None,
            attempts: 0,
            protocol: None,
            total_ms: 0.0,
            body: None,
            body_encoding: None,
        }
    }

    /// The body's bytes, decoded.
    pub fn body_bytes(&self) -> Option<Vec<u8>> {
        let b = self.body.as_ref()?;
        match self.body_encoding.unwrap_or_default() {
            BodyEncoding::Utf8 => Some(b.clone().into_bytes()),
            BodyEncoding::Base64 => BASE64.decode(b).ok(),
        }
    }
}

/// A body as text when it is UTF-8, else as base64.
pub fn encode_body(body: &[u8]) -> (String, BodyEncoding) {
    match std::str::from_utf8(body) {
        Ok(s) => (s.to_owned(), BodyEncoding::Utf8),
        Err(_) => (BASE64.encode(body), BodyEncoding::Base64),
    }
}

/// `success`, `failure`, `rejected` or `fallback`.
pub fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Success(_) => "success",
        Outcome::Failure(_) => "failure",
        Outcome::Rejected(_) => "rejected",
        Outcome::Fallback { .. } => "fallback",
    }
}

/// Why a task did not succeed, in words (`None` for a success): a
/// failure's reason and its last attempt, with the transport's detail when
/// it gave one (`retries exhausted; last attempt: TLS error: TLS with
/// host:443: certificate expired (...)`); a rejection's reason (a
/// `circuit_open` one names the error that opened the breakers).
pub fn error_message(r: &crate::TaskResult) -> Option<String> {
    match &r.outcome {
        Outcome::Success(_) => None,
        Outcome::Failure(f) => Some(match &f.last {
            Some(last) => {
                let detail = r.attempts.last().and_then(|a| a.error.as_deref());
                match detail {
                    Some(d) => format!("{}; last attempt: {last}: {d}", f.reason),
                    None => format!("{}; last attempt: {last}", f.reason),
                }
            }
            None => f.reason.to_string(),
        }),
        Outcome::Rejected(why) | Outcome::Fallback { reason: why, .. } => Some(why.to_string()),
    }
}

/// A stable snake_case code for why a task did not succeed: the
/// [`crate::FailReason`] of a failure (`retries_exhausted`, ...) or
/// [`rejection_code`] of a rejection; `None` for a success.
pub fn reason_code(o: &Outcome) -> Option<&'static str> {
    use crate::outcome::FailReason::*;
    match o {
        Outcome::Success(_) => None,
        Outcome::Failure(f) => Some(match f.reason {
            NotRetryable => "not_retryable",
            RetriesExhausted => "retries_exhausted",
            DeadlineExceeded => "deadline_exceeded",
            BudgetExhausted => "budget_exhausted",
        }),
        Outcome::Rejected(r) | Outcome::Fallback { reason: r, .. } => Some(rejection_code(r)),
    }
}

/// A stable snake_case code for a rejection (`queue_full`, `rate_limited`, ...).
pub fn rejection_code(r: &Rejection) -> &'static str {
    match r {
        Rejection::QueueFull => "queue_full",
        Rejection::ShuttingDown => "shutting_down",
        Rejection::DeadlinePassed => "deadline_passed",
        Rejection::UnknownService(_) => "unknown_service",
        Rejection::InvalidTask(_) => "invalid_task",
        Rejection::CircuitOpen { .. } => "circuit_open",
        Rejection::RateLimited { .. } => "rate_limited",
        Rejection::Overloaded { .. } => "overloaded",
        Rejection::Cancelled => "cancelled",
        Rejection::Internal(_) => "internal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Attempt, AttemptOutcome, FailReason, Failure, Response};
    use std::sync::Arc;

    #[test]
    fn a_line_with_json_is_a_post_with_its_content_type() {
        let t = TaskLine::parse(r#"{"service":"s","path":"/g","json":{"a":1}}"#).unwrap();
        let task = t.to_task().unwrap();
        assert_eq!(task.method(), &Method::POST);
        assert_eq!(task.body_bytes().as_ref(), br#"{"a":1}"#);
    }

    #[test]
    fn base64_bodies_decode_and_bad_ones_are_named() {
        let t = TaskLine::parse(
            r#"{"service":"s","method":"put","path":"/b","body":"/w==","body_encoding":"base64"}"#,
        )
        .unwrap();
        let task = t.to_task().unwrap();
        assert_eq!(task.method(), &Method::PUT);
        assert_eq!(task.body_bytes().as_ref(), [0xffu8]);
        let bad =
            TaskLine::parse(r#"{"service":"s","path":"/b","body":"%%","body_encoding":"base64"}"#)
                .unwrap();
        assert!(bad.to_task().unwrap_err().contains("base64"));
    }

    #[test]
    fn unknown_fields_and_both_bodies_are_refused() {
        let e = TaskLine::parse(r#"{"service":"s","path":"/","idempotnet":true}"#).unwrap_err();
        assert!(e.contains("idempotnet"), "{e}");
        let t = TaskLine::parse(r#"{"service":"s","path":"/","json":1,"body":"x"}"#).unwrap();
        assert!(t.to_task().unwrap_err().contains("exclusive"));
        let e = TaskLine::parse(r#"{"service":"s","path":"/","timeout":"soon"}"#).unwrap_err();
        assert!(e.starts_with("timeout: "), "{e}");
    }

    #[test]
    fn a_stream_field_marks_the_task_streamed() {
        let line = TaskLine::parse(r#"{"service":"s","path":"/v1/chat","stream":true}"#).unwrap();
        assert!(line.stream);
        assert!(line.to_task().unwrap().is_stream());
        // Written only when set.
        assert!(serde_json::to_string(&line)
            .unwrap()
            .contains(r#""stream":true"#));
        let plain = TaskLine::parse(r#"{"service":"s","path":"/"}"#).unwrap();
        assert!(!plain.to_task().unwrap().is_stream());
        assert!(!serde_json::to_string(&plain).unwrap().contains("stream"));
    }

    #[test]
    fn a_tenant_field_names_the_tenant_and_a_bad_one_is_refused() {
        let line = TaskLine::parse(r#"{"service":"s","path":"/","tenant":"acme"}"#).unwrap();
        assert_eq!(line.to_task().unwrap().tenant_key(), Some("acme"));
        assert!(serde_json::to_string(&line)
            .unwrap()
            .contains(r#""tenant":"acme""#));
        let long = format!(
            r#"{{"service":"s","path":"/","tenant":"{}"}}"#,
            "k".repeat(129)
        );
        let err = TaskLine::parse(&long).unwrap().to_task().unwrap_err();
        assert!(err.starts_with("tenant: ") && err.contains("128"), "{err}");
        let spaced = TaskLine::parse(r#"{"service":"s","path":"/","tenant":"a b"}"#).unwrap();
        assert!(spaced.to_task().unwrap_err().starts_with("tenant: "));
    }

    #[test]
    fn a_priority_field_sets_the_class_and_an_unknown_one_is_named() {
        let line = TaskLine::parse(r#"{"service":"s","path":"/","priority":"critical"}"#).unwrap();
        assert_eq!(
            line.to_task().unwrap().priority_class(),
            crate::task::Priority::Critical
        );
        assert!(serde_json::to_string(&line)
            .unwrap()
            .contains(r#""priority":"critical""#));
        let plain = TaskLine::parse(r#"{"service":"s","path":"/"}"#).unwrap();
        assert_eq!(
            plain.to_task().unwrap().priority_class(),
            crate::task::Priority::Default
        );
        let err = TaskLine::parse(r#"{"service":"s","path":"/","priority":"urgent"}"#).unwrap_err();
        assert!(err.starts_with("priority:"), "{err}");
        assert!(err.contains("urgent") && err.contains("sheddable"), "{err}");
    }

    fn limits() -> LineLimits {
        let cfg = crate::Config::from_json(
            r#"{"services":[{"name":"s","timeout":"2s","retry":{"max_retries":1,"backoff_max":"1s"},
                "endpoints":[{"address":"http://h/"}],
                "lines":{"max_body":8,"max_header_bytes":10}}]}"#,
        )
        .unwrap();
        cfg.services[0].lines.clone()
    }

    #[test]
    fn a_line_within_its_services_bounds_builds() {
        let l = limits();
        // The defaults: the service's timeout, its attempts' time (2 s × 2 + 1 s).
        assert_eq!(l.max_timeout, Duration::from_secs(2));
        assert_eq!(l.max_deadline, Duration::from_secs(5));
        assert!(!l.allow_priority);
        let t = TaskLine::parse(
            r#"{"service":"s","path":"/","timeout":"2s","deadline":"5s","body":"12345678","headers":{"a":"123456789"}}"#,
        )
        .unwrap();
        let task = t.to_task_within(&l).unwrap();
        assert_eq!(task.body_bytes().len(), 8);
    }

    #[test]
    fn a_line_over_its_services_bounds_is_refused_naming_the_field() {
        let l = limits();
        for (line, field, bound) in [
            (
                r#""timeout":"2001ms""#,
                "timeout: 2.001s",
                "lines.max_timeout (2s)",
            ),
            (r#""timeout":"365days""#, "timeout: ", "lines.max_timeout"),
            (
                r#""deadline":"6s""#,
                "deadline: 6s",
                "lines.max_deadline (5s)",
            ),
            (
                r#""body":"123456789""#,
                "body: 9 bytes",
                "lines.max_body (8)",
            ),
            (
                r#""body":"AAAAAAAAAAAA","body_encoding":"base64""#,
                "body: 9 bytes",
                "lines.max_body (8)",
            ),
            (r#""json":[1,2,3,4]"#, "json: 9 bytes", "lines.max_body (8)"),
            (
                r#""headers":{"abc":"12345678"}"#,
                "headers: 11 bytes",
                "lines.max_header_bytes (10)",
            ),
        ] {
            let t = TaskLine::parse(&format!(r#"{{"service":"s","path":"/",{line}}}"#)).unwrap();
            let e = t.to_task_within(&l).unwrap_err();
            assert!(e.starts_with(field) && e.contains(bound), "{line}: {e}");
            // The unbounded form (trusted lines) takes it.
            assert!(t.to_task().is_ok(), "{line}");
        }
    }

    #[test]
    fn a_lines_priority_is_taken_only_when_the_service_allows_it() {
        let line = TaskLine::parse(r#"{"service":"s","path":"/","priority":"critical"}"#).unwrap();
        let mut l = limits();
        let task = line.to_task_within(&l).unwrap();
        assert_eq!(task.priority_class(), crate::task::Priority::Default);
        l.allow_priority = true;
        let task = line.to_task_within(&l).unwrap();
        assert_eq!(task.priority_class(), crate::task::Priority::Critical);
    }

    #[test]
    fn a_task_line_round_trips() {
        let line = r#"{"id":"x","service":"s","method":"POST","path":"/p?q=1","headers":{"a":"b"},"body":"hi","timeout":"2s","deadline":"10s","idempotent":true,"affinity":"k"}"#;
        let t = TaskLine::parse(line).unwrap();
        assert_eq!(t.id, Some(WireId::Text("x".into())));
        assert_eq!(t.deadline, Some(Duration::from_secs(10)));
        let again = TaskLine::parse(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(again, t);
    }

    #[test]
    fn results_carry_reason_status_and_a_binary_body_as_base64() {
        let response = Response {
            status: 503,
            headers: Default::default(),
            body: bytes::Bytes::from_static(&[0xff, 0x00]),
            node: Arc::from("http://n/"),
            stream: None,
        };
        let r = TaskResult {
            id: 1,
            service: Arc::from("s"),
            outcome: Outcome::Failure(Failure {
                reason: FailReason::RetriesExhausted,
                last: Some(AttemptOutcome::Status(503)),
                response: Some(response),
            }),
            attempts: vec![Attempt {
                node: Arc::from("http://n/"),
                outcome: AttemptOutcome::Status(503),
                latency: Duration::from_millis(3),
                hedge: false,
                protocol: None,
                error: None,
            }],
            total: Duration::from_micros(4_321),
        };
        let l = ResultLine::from_result(&r, Some(WireId::Number(9)), Some(2));
        assert_eq!(l.outcome, "failure");
        assert_eq!(l.reason.as_deref(), Some("retries_exhausted"));
        assert_eq!(l.status, Some(503));
        assert_eq!(l.attempts, 1);
        assert_eq!(l.total_ms, 4.321);
        assert_eq!(l.body_encoding, Some(BodyEncoding::Base64));
        assert_eq!(l.body_bytes().unwrap(), vec![0xff, 0x00]);
        let json = serde_json::to_string(&l).unwrap();
        assert!(json.starts_with(r#"{"id":9,"line":2,"service":"s","outcome":"failure""#));
    }
}
