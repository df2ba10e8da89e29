//! Tasks in, results out.
//!
//! A [`Task`] is one HTTP request for a named service: method, a path
//! relative to whichever endpoint serves it, headers, body and limits. It is
//! an actix [`Message`] whose answer is a [`TaskResult`]. Building a task
//! never fails; it is checked when submitted, and an invalid one comes back
//! at once as [`Rejection::InvalidTask`] with the reason. A path must stay
//! relative and under its endpoint's prefix: absolute URLs, schemes, a
//! leading `//`, CR/LF/NUL and dot-segments in any spelling are refused, so
//! the engine only ever talks to configured endpoints; headers that change
//! routing or framing (`Host`, `Content-Length`, ...) are refused too (see
//! [`check_path`] and [`check_header_name`]). A timeout or deadline longer
//! than [`crate::MAX_DURATION`] (365 days) is refused, naming it.
//!
//! ```
//! use std::time::Duration;
//! use actix_dispatch::Task;
//! let t = Task::post_json("inference", "/v1/generate", &serde_json::json!({"prompt": "hi"}))
//!     .header("x-request-id", "42")
//!     .timeout(Duration::from_secs(2))
//!     .idempotent(true);
//! assert_eq!(t.path(), "/v1/generate");
//! ```

use std::fmt;
use std::time::Duration;

use actix::Message;
use awc::http::header::{HeaderName, HeaderValue};
use awc::http::Method;
use bytes::Bytes;
use tokio::time::Instant;

pub use crate::algo::priority::{ParsePriorityError, Priority};
use crate::algo::time;

#[cfg(test)]
mod props;
pub(crate) mod reply;
mod submission;
mod unfinished;

pub use crate::outcome::{
    Attempt, AttemptOutcome, ErrorKind, FailReason, Failure, Outcome, Rejection, Response, TaskId,
    TaskResult,
};
pub use crate::syntax::{check_header_name, check_path};
pub(crate) use reply::{ReplySlot, ReplyTx};
pub(crate) use submission::rejected;
pub use submission::Submission;
pub use unfinished::Unfinished;

/// How long the reader of a streamed answer may leave the next chunk
/// waiting when [`Task::stream_send_timeout`] is not set.
pub(crate) const STREAM_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// When a task must be finished by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    At(Instant),
    After(Duration),
}

/// One HTTP request to schedule on a service's pool.
#[derive(Debug, Clone)]
pub struct Task {
    service: String,
    /// Headers as given (checked and parsed at submit).
    headers: Vec<(String, String)>,
    /// Headers given already parsed ([`Task::typed_header`]): checked at
    /// submit, not parsed again, sent after `headers`.
    typed: Vec<(HeaderName, HeaderValue)>,
    req: Request,
}

/// What a task asks of a backend: the part of a [`Task`] a queued [`Job`]
/// keeps for its attempts. The service name is not in it (the queue holds it
/// once) nor are the header strings (parsed at submit), so a queued task is
/// that much smaller (`loadbench memory`).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    method: Method,
    path: String,
    body: Bytes,
    /// What most tasks leave unset (their id too), boxed together.
    extra: Option<Box<Extra>>,
}

/// The rarely-set parts of a [`Task`].
#[derive(Debug, Clone, Default)]
struct Extra {
    id: Option<TaskId>,
    timeout: Option<Duration>,
    deadline: Option<Deadline>,
    idempotent: Option<bool>,
    stream: bool,
    /// Limits of a streamed body: the reader's wait, the body's life.
    stream_send_timeout: Option<Duration>,
    stream_max_duration: Option<Duration>,
    affinity: Option<String>,
    priority: Option<Priority>,
    /// Whose task this is, for fair shares between tenants.
    tenant: Option<std::sync::Arc<str>>,
    build_error: Option<String>,
    /// A lease's task: where its node puts the lease.
    lease: Option<std::sync::Arc<crate::lease::LeaseHand>>,
}

impl Message for Task {
    type Result = TaskResult;
}

impl Task {
    /// A request with any method.
    pub fn new(service: impl Into<String>, method: Method, path: impl Into<String>) -> Task {
        Task {
            service: service.into(),
            headers: Vec::new(),
            typed: Vec::new(),
            req: Request {
                method,
                path: path.into(),
                body: Bytes::new(),
                extra: None,
            },
        }
    }

    /// A GET request.
    pub fn get(service: impl Into<String>, path: impl Into<String>) -> Task {
        Task::new(service, Method::GET, path)
    }

    /// A POST with `value` as its JSON body and `content-type: application/json`.
    pub fn post_json<T: serde::Serialize + ?Sized>(
        service: impl Into<String>,
        path: impl Into<String>,
        value: &T,
    ) -> Task {
        let mut t =
            Task::new(service, Method::POST, path).header("content-type", "application/json");
        match serde_json::to_vec(value) {
            Ok(b) => t.req.body = b.into(),
            Err(e) => {
                t.extra_mut().build_error = Some(format!("body is not serializable as JSON: {e}"))
            }
        }
        t
    }

    /// Adds a header (checked at submit).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Task {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds a header already parsed, as a gateway has its request's: it is
    /// checked at submit as [`Task::header`]'s are (a name the engine sets,
    /// such as `Host`, is refused; so is a value holding CR, LF or NUL),
    /// but not parsed again. Typed headers are sent after the ones given as
    /// text, each kind in the order given.
    ///
    /// ```
    /// use actix_dispatch::Task;
    /// use awc::http::header::{HeaderName, HeaderValue};
    /// let t = Task::get("s", "/")
    ///     .typed_header(HeaderName::from_static("x-request-id"), HeaderValue::from_static("42"));
    /// assert_eq!(t.typed_headers_given().len(), 1);
    /// ```
    pub fn typed_header(mut self, name: HeaderName, value: HeaderValue) -> Task {
        self.typed.push((name, value));
        self
    }

    /// Adds headers already parsed, as [`Task::typed_header`] does for one
    /// (a `Vec` given to a task without typed headers is kept as it is).
    pub fn typed_headers(
        mut self,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
    ) -> Task {
        if self.typed.is_empty() {
            self.typed = headers.into_iter().collect();
        } else {
            self.typed.extend(headers);
        }
        self
    }

    /// The headers given with [`Task::typed_header`] and
    /// [`Task::typed_headers`], in order.
    pub fn typed_headers_given(&self) -> &[(HeaderName, HeaderValue)] {
        &self.typed
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Task {
        self.req.body = body.into();
        self
    }

    /// Per-attempt timeout (default: the service's `timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Task {
        self.extra_mut().timeout = Some(timeout);
        self
    }

    /// Absolute deadline bounding all attempts together.
    pub fn deadline(mut self, at: Instant) -> Task {
        self.extra_mut().deadline = Some(Deadline::At(at));
        self
    }

    /// Deadline relative to the moment the task is submitted.
    pub fn deadline_in(mut self, within: Duration) -> Task {
        self.extra_mut().deadline = Some(Deadline::After(within));
        self
    }

    /// Marks the task safe (or not) to retry after a timeout or reset. By
    /// default GET, HEAD, PUT, DELETE, OPTIONS and TRACE are idempotent.
    pub fn idempotent(mut self, yes: bool) -> Task {
        self.extra_mut().idempotent = Some(yes);
        self
    }

    /// Sets the task's id (default: a fresh sequential id).
    pub fn id(mut self, id: TaskId) -> Task {
        self.extra_mut().id = Some(id);
        self
    }

    /// Affinity key for `consistent_hash` services.
    pub fn affinity(mut self, key: impl Into<String>) -> Task {
        self.extra_mut().affinity = Some(key.into());
        self
    }

    /// The task's class under overload (default [`Priority::Default`]):
    /// `critical` tasks are served first and shed last, `sheddable` ones
    /// shed first; each class keeps its reserved share of the dispatches
    /// (`queue.priority`).
    pub fn priority(mut self, class: Priority) -> Task {
        if class != Priority::Default || self.req.extra.is_some() {
            self.extra_mut().priority = Some(class);
        }
        self
    }

    /// The tenant the task is counted to (an API key, a customer, a batch
    /// job): within each priority class the queue shares its dispatches
    /// between tenants by their weights (`tenants` in the service's
    /// config), so one tenant's flood cannot take the others' capacity,
    /// and sheds first from the tenants most over their share. A task
    /// without one shares the dispatches with the others as one tenant.
    ///
    /// The key is 1 to 128 printable ASCII characters without spaces; any
    /// other is refused at submit (`InvalidTask`, naming the tenant).
    /// An `Arc<str>` the caller keeps per tenant is shared as it is: no
    /// allocation per task.
    pub fn tenant(mut self, key: impl Into<std::sync::Arc<str>>) -> Task {
        self.extra_mut().tenant = Some(key.into());
        self
    }

    /// The task's tenant ([`Task::tenant`]), if named.
    pub fn tenant_key(&self) -> Option<&str> {
        self.req.tenant()
    }

    /// The task's class ([`Task::priority`]).
    pub fn priority_class(&self) -> Priority {
        self.req.priority()
    }

    /// Streams the answer: the task resolves as soon as the backend's
    /// status and headers arrive, and a successful answer's body comes as a
    /// [`crate::BodyStream`] of chunks ([`crate::Response::take_stream`]).
    /// Retries, hedges and the breaker apply up to the answer's head; after
    /// it, a broken body is an error item of the stream (and a failure of
    /// the node), never retried. The node's slot stays taken until the body
    /// ends, the stream is dropped, or the reader leaves a chunk waiting
    /// longer than [`Task::stream_send_timeout`] (10 s by default; see also
    /// [`Task::stream_max_duration`]). A failed answer (4xx, 5xx) is read
    /// whole, as without streaming, so retries see it as usual.
    pub fn stream(mut self, yes: bool) -> Task {
        if yes || self.req.extra.is_some() {
            self.extra_mut().stream = yes;
        }
        self
    }

    /// Whether the answer is streamed ([`Task::stream`]).
    pub fn is_stream(&self) -> bool {
        self.req.is_stream()
    }

    /// Longest wait for the reader of a streamed answer ([`Task::stream`])
    /// to make room for the next chunk (default 10 s). Past it the stream ends with
    /// an [`ErrorKind::Timeout`] item and the node's slot is freed: a
    /// reader that stopped reading cannot hold a backend. Not the node's
    /// fault (no breaker, no error rate).
    pub fn stream_send_timeout(mut self, within: Duration) -> Task {
        self.extra_mut().stream_send_timeout = Some(within);
        self
    }

    /// Longest life of a streamed answer's body, from its head (default:
    /// none, each chunk bounded by the attempt timeout). Past it the stream
    /// ends with an [`ErrorKind::Timeout`] item and the node's slot is
    /// freed; not the node's fault.
    pub fn stream_max_duration(mut self, within: Duration) -> Task {
        self.extra_mut().stream_max_duration = Some(within);
        self
    }

    /// The task of a lease ([`crate::Dispatcher::lease`]): no request, its
    /// node puts the lease in `hand`. Not idempotent, so never hedged.
    pub(crate) fn lease(
        service: &str,
        hand: std::sync::Arc<crate::lease::LeaseHand>,
        opts: crate::lease::LeaseOptions,
    ) -> Task {
        let mut t = Task::get(service, "/");
        let x = t.extra_mut();
        x.lease = Some(hand);
        x.idempotent = Some(false);
        x.affinity = opts.affinity;
        x.deadline = match (opts.deadline, opts.deadline_in) {
            (Some(at), _) => Some(Deadline::At(at)),
            (None, Some(d)) => Some(Deadline::After(d)),
            (None, None) => None,
        };
        t.priority(opts.priority)
    }

    /// The service it is for.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The method.
    pub fn method(&self) -> &Method {
        self.req.method()
    }

    /// The path as given.
    pub fn path(&self) -> &str {
        &self.req.path
    }

    /// The id given with [`Task::id`], if any.
    pub fn given_id(&self) -> Option<TaskId> {
        self.req.extra().and_then(|x| x.id)
    }

    /// Whether retries after ambiguous errors are allowed.
    pub fn is_idempotent(&self) -> bool {
        self.req
            .extra()
            .and_then(|x| x.idempotent)
            .unwrap_or(matches!(
                self.req.method,
                Method::GET
                    | Method::HEAD
                    | Method::PUT
                    | Method::DELETE
                    | Method::OPTIONS
                    | Method::TRACE
            ))
    }

    /// Checks the task and freezes it into the engine's form.
    pub(crate) fn prepare(mut self, id: TaskId, now: Instant) -> Result<Job, (TaskId, String)> {
        let typed = std::mem::take(&mut self.typed);
        let has_typed = !typed.is_empty();
        match self.check(typed, now) {
            Ok((headers, deadline)) => {
                // The header strings are dropped when the parsed headers
                // give them back exactly (names in lower case, as is usual)
                // and alone (with typed ones too, the strings say how many
                // of the job's headers were text).
                let rebuilt = (!has_typed || self.headers.is_empty())
                    && self
                        .headers
                        .iter()
                        .all(|(k, _)| !k.bytes().any(|b| b.is_ascii_uppercase()));
                let id = self.given_id().unwrap_or(id);
                let idempotent = self.is_idempotent();
                let affinity = self
                    .req
                    .extra()
                    .and_then(|x| x.affinity.as_deref())
                    .map(crate::algo::strategy::hash_key);
                let slash = self.req.path.starts_with('/');
                let priority = self.req.priority();
                let raw_headers = (!rebuilt).then(|| Box::new(self.headers));
                Ok(Job {
                    id,
                    idempotent,
                    priority,
                    affinity,
                    slash,
                    has_typed,
                    headers,
                    raw_headers,
                    deadline,
                    submitted: now,
                    task: self.req,
                    reply: ReplySlot::default(),
                })
            }
            Err(reason) => Err((self.given_id().unwrap_or(id), reason)),
        }
    }

    #[allow(clippy::type_complexity)]
    fn check(
        &self,
        typed: Vec<(HeaderName, HeaderValue)>,
        now: Instant,
    ) -> Result<(Vec<(HeaderName, HeaderValue)>, Option<Instant>), String> {
        let extra = self.req.extra();
        if let Some(e) = extra.and_then(|x| x.build_error.as_ref()) {
            return Err(e.clone());
        }
        if self.service.is_empty() {
            return Err("service name is empty".into());
        }
        if let Some(t) = self.req.tenant() {
            crate::algo::tenants::check_key(t).map_err(|m| format!("tenant: {m}"))?;
        }
        check_path(&self.req.path)?;
        for (k, v) in &typed {
            check_header_name(k.as_str())?;
            // A `HeaderValue` made without its checks
            // (`from_maybe_shared_unchecked`) could hold them.
            if v.as_bytes()
                .iter()
                .any(|b| matches!(b, b'\r' | b'\n' | b'\0'))
            {
                return Err(format!("header {:?} contains CR, LF or NUL", k.as_str()));
            }
        }
        if self.headers.is_empty() {
            return Ok((typed, self.checked_deadline(now)?));
        }
        let mut headers = Vec::with_capacity(self.headers.len() + typed.len());
        for (k, v) in &self.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("header name {k:?} is not a valid HTTP header name"))?;
            check_header_name(k)?;
            if v.contains(['\r', '\n', '\0']) {
                return Err(format!("header {k:?} contains CR, LF or NUL"));
            }
            let value = HeaderValue::from_str(v)
                .map_err(|_| format!("header {k:?} has a value that is not valid in HTTP"))?;
            headers.push((name, value));
        }
        headers.extend(typed);
        Ok((headers, self.checked_deadline(now)?))
    }

    /// The task's timeout checked, and its deadline resolved at `now`.
    fn checked_deadline(&self, now: Instant) -> Result<Option<Instant>, String> {
        let extra = self.req.extra();
        if let Some(t) = extra.and_then(|x| x.timeout) {
            if t.is_zero() {
                return Err("timeout must be greater than zero".into());
            }
            time::bounded("timeout", t)?;
        }
        let deadline = match extra.and_then(|x| x.deadline) {
            None => None,
            Some(Deadline::After(d)) => Some(time::add(now, time::bounded("deadline_in", d)?)),
            Some(Deadline::At(t)) => {
                time::bounded("deadline", t.saturating_duration_since(now))?;
                Some(t)
            }
        };
        Ok(deadline)
    }

    fn extra_mut(&mut self) -> &mut Extra {
        self.req.extra.get_or_insert_with(Default::default)
    }

    #[cfg(test)]
    pub(crate) fn body_bytes(&self) -> &Bytes {
        self.req.body_bytes()
    }
}

// === impl Request ===

impl Request {
    /// The method.
    pub(crate) fn method(&self) -> &Method {
        &self.method
    }

    /// Whether the answer is streamed ([`Task::stream`]).
    pub(crate) fn is_stream(&self) -> bool {
        self.extra().is_some_and(|x| x.stream)
    }

    /// The limits of a streamed body: the reader's longest wait for room
    /// ([`Task::stream_send_timeout`], when set) and the body's longest
    /// life ([`Task::stream_max_duration`]).
    pub(crate) fn stream_limits(&self) -> (Option<Duration>, Option<Duration>) {
        self.extra().map_or((None, None), |x| {
            (x.stream_send_timeout, x.stream_max_duration)
        })
    }

    /// The task's class ([`Task::priority`]).
    pub(crate) fn priority(&self) -> Priority {
        self.extra().and_then(|x| x.priority).unwrap_or_default()
    }

    /// The task's tenant ([`Task::tenant`]), if named.
    pub(crate) fn tenant(&self) -> Option<&str> {
        self.extra().and_then(|x| x.tenant.as_deref())
    }

    /// The task's tenant's key as held (shared with the tenant book).
    pub(crate) fn tenant_shared(&self) -> Option<&std::sync::Arc<str>> {
        self.extra().and_then(|x| x.tenant.as_ref())
    }

    /// A lease's hand, when this is a lease's task.
    pub(crate) fn lease(&self) -> Option<&crate::lease::LeaseHand> {
        self.extra().and_then(|x| x.lease.as_deref())
    }

    /// The per-attempt timeout set on the task, if any.
    pub(crate) fn attempt_timeout(&self) -> Option<Duration> {
        self.extra().and_then(|x| x.timeout)
    }

    pub(crate) fn body_bytes(&self) -> &Bytes {
        &self.body
    }

    fn extra(&self) -> Option<&Extra> {
        self.extra.as_deref()
    }
}

/// A checked task as the engine carries it (shared by `Arc` between
/// attempts), with the slot its one result goes to: one allocation per
/// task holds both (see [`reply`]).
#[derive(Debug)]
pub(crate) struct Job {
    pub id: TaskId,
    pub task: Request,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The headers as given, kept only when `headers` cannot give them
    /// back exactly (a name not in lower case). A thin box: one word in
    /// every job instead of the three of a `Vec` (or two of a boxed slice).
    #[allow(clippy::box_collection)]
    raw_headers: Option<Box<Vec<(String, String)>>>,
    pub deadline: Option<Instant>,
    pub affinity: Option<u64>,
    pub submitted: Instant,
    pub idempotent: bool,
    /// Its class under overload.
    pub priority: Priority,
    /// Whether `task.path` starts with `/` (dropped when appended).
    slash: bool,
    /// Whether some of `headers` were given typed: those after the text
    /// ones (as many as `raw_headers` holds, or none without it).
    has_typed: bool,
    /// Where the task's result goes (the caller's `Submission` waits on it).
    pub reply: ReplySlot,
}

impl Job {
    /// The path without its leading `/`, to append to an endpoint address.
    pub fn path(&self) -> &str {
        &self.task.path[usize::from(self.slash)..]
    }

    /// The task as submitted to `service` (for the shutdown report).
    pub(crate) fn to_task(&self, service: &str) -> Task {
        let text = match (&self.raw_headers, self.has_typed) {
            (Some(raw), _) => raw.len(),
            (None, true) => 0,
            (None, false) => self.headers.len(),
        };
        let (given_as_text, typed) = self.headers.split_at(text);
        let headers = match &self.raw_headers {
            Some(raw) => (**raw).clone(),
            None => given_as_text
                .iter()
                .map(|(k, v)| {
                    // Checked at submit: made from a `&str`, so UTF-8.
                    let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (k.as_str().to_owned(), v)
                })
                .collect(),
        };
        Task {
            service: service.to_owned(),
            headers,
            typed: typed.to_vec(),
            req: self.task.clone(),
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.service, self.req.method, self.req.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(t: Task) -> String {
        t.prepare(1, Instant::now()).unwrap_err().1
    }

    #[test]
    fn paths_must_stay_relative() {
        assert!(reason(Task::get("s", "http://evil.example/")).contains("absolute URL"));
        assert!(reason(Task::get("s", "//evil.example/x")).contains("`//`"));
        assert!(reason(Task::get("s", "javascript:alert(1)")).contains("scheme"));
        assert!(reason(Task::get("s", "/a\r\nHost: x")).contains("CR, LF"));
        assert!(reason(Task::get("s", "/a b")).contains("not a valid URI path"));
        assert!(reason(Task::get("s", "/a#frag")).contains("fragment"));
        assert!(Task::get("s", "/v1/models:predict?x=1")
            .prepare(1, Instant::now())
            .is_ok());
        assert!(Task::get("s", "v1/x").prepare(1, Instant::now()).is_ok());
    }

    #[test]
    fn headers_are_checked() {
        assert!(reason(Task::get("s", "/").header("x", "a\r\nb: c")).contains("CR, LF"));
        assert!(reason(Task::get("s", "/").header("bad name", "v")).contains("header name"));
        let j = Task::get("s", "/")
            .header("x-a", "1")
            .prepare(1, Instant::now())
            .unwrap();
        assert_eq!(j.headers.len(), 1);
    }

    #[test]
    fn idempotency_defaults_by_method() {
        assert!(Task::get("s", "/").is_idempotent());
        assert!(Task::new("s", Method::PUT, "/").is_idempotent());
        assert!(!Task::new("s", Method::POST, "/").is_idempotent());
        assert!(Task::new("s", Method::POST, "/")
            .idempotent(true)
            .is_idempotent());
        assert!(!Task::new("s", Method::PATCH, "/").is_idempotent());
    }

    #[test]
    fn job_strips_leading_slash_and_resolves_deadline() {
        let now = Instant::now();
        let j = Task::get("s", "/a/b?c=1")
            .deadline_in(Duration::from_secs(1))
            .prepare(7, now)
            .unwrap();
        assert_eq!(j.path(), "a/b?c=1");
        assert_eq!(j.id, 7);
        assert_eq!(j.deadline, Some(now + Duration::from_secs(1)));
    }

    #[test]
    fn deadline_in_duration_max_is_refused_not_a_panic() {
        let e = reason(Task::get("s", "/").deadline_in(Duration::MAX));
        assert!(e.contains("deadline_in") && e.contains("365 days"), "{e}");
        let e =
            reason(Task::get("s", "/").deadline_in(time::MAX_DURATION + Duration::from_secs(1)));
        assert!(e.contains("deadline_in"), "{e}");
        let now = Instant::now();
        let far = now + time::MAX_DURATION + Duration::from_secs(1);
        let e = reason(Task::get("s", "/").deadline(far));
        assert!(e.contains("deadline"), "{e}");
        let j = Task::get("s", "/")
            .deadline_in(time::MAX_DURATION)
            .prepare(1, now)
            .unwrap();
        assert_eq!(j.deadline, Some(now + time::MAX_DURATION));
    }

    #[test]
    fn timeout_duration_max_is_refused() {
        let e = reason(Task::get("s", "/").timeout(Duration::MAX));
        assert!(e.contains("timeout") && e.contains("365 days"), "{e}");
        assert!(Task::get("s", "/")
            .timeout(time::MAX_DURATION)
            .prepare(1, Instant::now())
            .is_ok());
    }

    #[test]
    fn dot_segment_paths_are_invalid_tasks() {
        for p in [
            "../../admin",
            "/%2e%2e/admin",
            "..%2f..%2fadmin",
            "/.%2e/admin",
            r"\..\..\admin",
        ] {
            assert!(reason(Task::get("s", p)).contains("dot-segment"), "{p}");
        }
    }

    #[test]
    fn colon_slash_slash_in_query_is_accepted() {
        let j = Task::get("s", "/login?next=https://app.example/home")
            .prepare(1, Instant::now())
            .unwrap();
        assert_eq!(j.path(), "login?next=https://app.example/home");
    }

    /// The shutdown report gives the task back as submitted: its headers
    /// exactly, whether the job kept their strings or rebuilt them.
    #[test]
    fn a_job_gives_back_its_task() {
        for t in [
            Task::get("s", "/a")
                .header("x-id", "1")
                .header("accept", "*/*"),
            Task::get("s", "/a").header("X-Id", "\u{e9}t\u{e9}"),
            Task::post_json("s", "b", &1).id(9).stream(true),
        ] {
            let back = t.clone().prepare(1, Instant::now()).unwrap().to_task("S");
            assert_eq!(back.service(), "S");
            assert_eq!(back.headers, t.headers);
            assert_eq!(back.to_string(), format!("S {} {}", t.method(), t.path()));
            assert_eq!(back.body_bytes(), t.body_bytes());
            assert_eq!(back.given_id(), t.given_id());
            assert_eq!(back.is_stream(), t.is_stream());
        }
    }

    /// Typed headers: the engine's own names refused as in text, sent
    /// after the text ones, and given back as they were given (typed
    /// alone, or with text headers in any case).
    #[test]
    fn typed_headers_are_checked_ordered_and_given_back() {
        let name = |n: &'static str| HeaderName::from_static(n);
        let value = |v: &'static str| HeaderValue::from_static(v);
        let e = reason(Task::get("s", "/").typed_header(awc::http::header::HOST, value("x")));
        assert!(e.contains("host") && e.contains("routed or framed"), "{e}");
        let e = reason(Task::get("s", "/").typed_header(name("proxy-x"), value("1")));
        assert!(e.contains("proxy-x"), "{e}");
        let j = Task::get("s", "/")
            .typed_header(name("x-b"), value("2"))
            .header("x-a", "1")
            .typed_headers([(name("x-c"), value("3"))])
            .prepare(1, Instant::now())
            .unwrap();
        let got: Vec<(&str, &[u8])> = j
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        assert_eq!(got, [("x-a", &b"1"[..]), ("x-b", b"2"), ("x-c", b"3")]);
        for t in [
            Task::get("s", "/").typed_headers(vec![(name("x-b"), value("2"))]),
            Task::get("s", "/")
                .header("x-a", "1")
                .typed_header(name("x-b"), value("2")),
            Task::get("s", "/")
                .header("X-A", "1")
                .typed_header(name("x-b"), value("2")),
        ] {
            let back = t.clone().prepare(1, Instant::now()).unwrap().to_task("s");
            assert_eq!(back.headers, t.headers);
            assert_eq!(back.typed, t.typed);
        }
    }

    #[test]
    fn host_header_is_refused_and_repeats_are_kept() {
        let e = reason(Task::get("s", "/").header("Host", "evil.example"));
        assert!(e.contains("Host") && e.contains("routed or framed"), "{e}");
        for h in [
            "Transfer-Encoding",
            "content-length",
            "Proxy-Authorization",
            "TE",
        ] {
            assert!(
                reason(Task::get("s", "/").header(h, "x")).contains(h),
                "{h}"
            );
        }
        let j = Task::get("s", "/")
            .header("accept", "text/html")
            .header("accept", "application/json")
            .prepare(1, Instant::now())
            .unwrap();
        assert_eq!(j.headers.len(), 2);
    }
}
