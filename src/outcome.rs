//! What a task ends in: exactly one [`TaskResult`] per accepted task.
//!
//! A leaf of the crate: the task, its reply slot, the engine and the wire
//! form all read these types, and this module imports none of them.
//!
//! The engine builds results; users read them. The types that may grow are
//! `#[non_exhaustive]`, and those a test of user code may want to build
//! have constructors ([`TaskResult::new`], [`Response::new`],
//! [`Attempt::new`], [`Failure::new`]), with the other fields public to set.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use awc::http::header::HeaderMap;
use bytes::Bytes;
use serde::Serialize;

/// Identifier of a task, unique within a dispatcher unless set by the caller.
pub type TaskId = u64;

/// The answer to one task: its outcome, every attempt made, total time.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskResult {
    /// The task's id.
    pub id: TaskId,
    /// The service it was for.
    pub service: Arc<str>,
    /// How it ended.
    pub outcome: Outcome,
    /// Every attempt, in order (hedged attempts included).
    pub attempts: Vec<Attempt>,
    /// From submit to result.
    pub total: Duration,
}

impl TaskResult {
    /// A result of task `id` for `service` that ended as `outcome`, with no
    /// attempts and no time taken (set `attempts` and `total` as needed).
    ///
    /// ```
    /// use actix_dispatch::{Outcome, Rejection, TaskResult};
    /// let r = TaskResult::new(7, "api", Outcome::Rejected(Rejection::QueueFull));
    /// assert!(r.is_rejected());
    /// assert_eq!(r.retries(), 0);
    /// ```
    pub fn new(id: TaskId, service: impl Into<Arc<str>>, outcome: Outcome) -> TaskResult {
        TaskResult {
            id,
            service: service.into(),
            outcome,
            attempts: Vec::new(),
            total: Duration::ZERO,
        }
    }

    /// True for [`Outcome::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self.outcome, Outcome::Success(_))
    }

    /// True for [`Outcome::Rejected`] and [`Outcome::Fallback`].
    pub fn is_rejected(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Rejected(_) | Outcome::Fallback { .. }
        )
    }

    /// The response that ended the task: the success, the fallback, or the
    /// last HTTP answer of a failure.
    pub fn response(&self) -> Option<&Response> {
        match &self.outcome {
            Outcome::Success(r) => Some(r),
            Outcome::Fallback { response, .. } => Some(response),
            Outcome::Failure(f) => f.response.as_ref(),
            Outcome::Rejected(_) => None,
        }
    }

    /// The response that ended the task, to take its [`BodyStream`] from.
    pub fn response_mut(&mut self) -> Option<&mut Response> {
        match &mut self.outcome {
            Outcome::Success(r) => Some(r),
            Outcome::Fallback { response, .. } => Some(response),
            Outcome::Failure(f) => f.response.as_mut(),
            Outcome::Rejected(_) => None,
        }
    }

    /// Takes the streamed body of a successful answer to a streamed task.
    pub fn take_stream(&mut self) -> Option<BodyStream> {
        self.response_mut().and_then(Response::take_stream)
    }

    /// The node that served a successful task.
    pub fn node(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Success(r) => Some(&r.node),
            _ => None,
        }
    }

    /// The rejection reason, if rejected (or answered by the fallback).
    pub fn rejection(&self) -> Option<&Rejection> {
        match &self.outcome {
            Outcome::Rejected(r) | Outcome::Fallback { reason: r, .. } => Some(r),
            _ => None,
        }
    }

    /// How many attempts were retries (attempts after the first, hedges excluded).
    pub fn retries(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| !a.hedge)
            .count()
            .saturating_sub(1)
    }
}

/// How a task ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Outcome {
    /// A 2xx or 3xx answer.
    Success(Response),
    /// No success after the retries allowed, or an answer not worth retrying.
    Failure(Failure),
    /// Refused without (further) attempts.
    Rejected(Rejection),
    /// Refused for open circuits or rate limits, answered by the service's
    /// configured fallback response.
    #[non_exhaustive]
    Fallback {
        /// The configured response (its `node` is `"fallback"`).
        response: Response,
        /// Why the task was not sent.
        reason: Rejection,
    },
}

impl Outcome {
    /// An [`Outcome::Fallback`]: the configured `response`, given for `reason`.
    pub fn fallback(response: Response, reason: Rejection) -> Outcome {
        Outcome::Fallback { response, reason }
    }
}

/// An HTTP answer.
///
/// A clone carries no [`BodyStream`]: a stream has one reader, so take it
/// with [`Response::take_stream`] before cloning if the clone should read it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, as the backend sent them.
    pub headers: HeaderMap,
    /// Body (up to the service's `max_body`); empty when the body is
    /// streamed (see `stream`).
    pub body: Bytes,
    /// Address of the node that answered (`"fallback"` for a fallback).
    pub node: Arc<str>,
    /// The body as a stream of chunks, for a successful answer to a task
    /// marked [`crate::Task::stream`]; `None` otherwise (and once taken).
    pub stream: Option<BodyStream>,
}

impl Clone for Response {
    fn clone(&self) -> Self {
        Self {
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            node: self.node.clone(),
            stream: None,
        }
    }
}

impl Response {
    /// An answer of `status` with `body`, no headers, not streamed, from no
    /// node in particular (`node` is empty; set it and `headers` as needed).
    ///
    /// ```
    /// use actix_dispatch::Response;
    /// let mut r = Response::new(200, "hello");
    /// r.node = "http://127.0.0.1:8081/".into();
    /// assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
    /// assert!(!r.is_streamed());
    /// ```
    pub fn new(status: u16, body: impl Into<Bytes>) -> Response {
        Response {
            status,
            headers: HeaderMap::new(),
            body: body.into(),
            node: "".into(),
            stream: None,
        }
    }

    /// First value of header `name` (case-insensitive), if it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Takes the streamed body, if the answer is streamed and it was not
    /// taken yet.
    pub fn take_stream(&mut self) -> Option<BodyStream> {
        self.stream.take()
    }

    /// Whether a body stream is here to take ([`Response::take_stream`]).
    pub fn is_streamed(&self) -> bool {
        self.stream.is_some()
    }
}

// === impl BodyStream ===

/// One item of the engine's chunk channel: the stream ends explicitly, so
/// that a channel closed without an end (the engine stopped under it) is
/// reported, never mistaken for a complete body.
#[derive(Debug)]
pub(crate) enum Frame {
    Data(Bytes),
    End,
    Error(StreamError),
}

/// A streamed response body: chunks as the backend sends them, then the
/// end, or one [`StreamError`] item and the end.
///
/// It is `Send + 'static`, so it can leave the node's thread with its
/// [`TaskResult`]. The node forwards chunks through a small bounded channel:
/// a reader that stops reading stops the backend (backpressure), and
/// dropping the stream closes the connection and frees the node's slot.
///
/// ```
/// # use futures::StreamExt;
/// # async fn read(mut r: actix_dispatch::TaskResult) {
/// if let Some(mut body) = r.response_mut().and_then(|resp| resp.take_stream()) {
///     while let Some(chunk) = body.next().await {
///         match chunk {
///             Ok(bytes) => println!("{} bytes", bytes.len()),
///             Err(e) => eprintln!("the body broke: {e}"),
///         }
///     }
/// }
/// # }
/// ```
pub struct BodyStream {
    rx: tokio::sync::mpsc::Receiver<Frame>,
    done: bool,
}

impl BodyStream {
    pub(crate) fn new(rx: tokio::sync::mpsc::Receiver<Frame>) -> Self {
        Self { rx, done: false }
    }

    /// Reads the whole body: its bytes, or the error that ended it. (Named
    /// apart from `StreamExt::collect`, which gathers the items.)
    pub async fn read_all(mut self) -> Result<Bytes, StreamError> {
        use futures::StreamExt;
        let mut all = bytes::BytesMut::new();
        while let Some(chunk) = self.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok(all.freeze())
    }
}

impl fmt::Debug for BodyStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyStream")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl futures::Stream for BodyStream {
    type Item = Result<Bytes, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Frame::Data(b))) => Poll::Ready(Some(Ok(b))),
            Poll::Ready(Some(Frame::End)) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Frame::Error(e))) => {
                self.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(StreamError::new(
                    ErrorKind::Lost,
                    "the engine stopped before the body ended",
                ))))
            }
        }
    }
}

/// Why a streamed body ended early: the stream's last item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
#[non_exhaustive]
pub struct StreamError {
    /// What happened: [`ErrorKind::Reset`] (the backend broke the
    /// connection; a node failure), [`ErrorKind::Timeout`] (no chunk within
    /// the attempt timeout; a node failure), [`ErrorKind::Body`] (over
    /// `max_body` in total; not the node's fault), [`ErrorKind::Panicked`],
    /// or [`ErrorKind::Lost`] (the engine stopped under the stream).
    pub kind: ErrorKind,
    /// The details, for people.
    pub detail: String,
}

impl StreamError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

/// A failed task: why, and what the last attempt gave.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Failure {
    /// Why no more attempts were made.
    pub reason: FailReason,
    /// The last attempt's status or error.
    pub last: Option<AttemptOutcome>,
    /// The last HTTP answer, when there was one (a 404's body, say).
    pub response: Option<Response>,
}

impl Failure {
    /// A failure for `reason`, after `last`, with the last HTTP answer if
    /// there was one.
    pub fn new(
        reason: FailReason,
        last: Option<AttemptOutcome>,
        response: Option<Response>,
    ) -> Self {
        Failure {
            reason,
            last,
            response,
        }
    }
}

/// Why a task failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailReason {
    /// The last answer is never retried (a 4xx other than 429, a body error,
    /// or an ambiguous error on a non-idempotent task).
    NotRetryable,
    /// `max_retries` retries were made.
    RetriesExhausted,
    /// The task's deadline came before another attempt could finish.
    DeadlineExceeded,
    /// The service's retry budget refused the retry.
    BudgetExhausted,
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailReason::NotRetryable => "not retryable",
            FailReason::RetriesExhausted => "retries exhausted",
            FailReason::DeadlineExceeded => "deadline exceeded",
            FailReason::BudgetExhausted => "retry budget exhausted",
        })
    }
}

/// Why a task was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The service's queue was full (`on_full: reject`).
    #[error("queue full")]
    QueueFull,
    /// The dispatcher is shutting down or stopped.
    #[error("shutting down")]
    ShuttingDown,
    /// The task's deadline passed before it could be sent.
    #[error("deadline passed")]
    DeadlinePassed,
    /// No service of that name.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// The task is malformed; the reason says how.
    #[error("invalid task: {0}")]
    InvalidTask(String),
    /// Every node's breaker is open (`on_all_open: fail_fast`).
    #[error(
        "circuit open on every node; first half-opens in {retry_after:?}{}",
        cause(last_error)
    )]
    #[non_exhaustive]
    CircuitOpen {
        /// Time until the first breaker half-opens.
        retry_after: Duration,
        /// What the node whose breaker half-opens first last failed with,
        /// in words (`TLS with host:443: certificate expired (...)`,
        /// `status 503`): why the breakers opened.
        last_error: Option<Arc<str>>,
    },
    /// The service's pipeline failed inside the engine (a bug, logged at
    /// `error`); the task was not finished and may be submitted again.
    #[error("internal error: {0}")]
    Internal(String),
    /// Out of tokens (`on_limit: reject`).
    #[error("rate limited; next token in {retry_after:?}")]
    #[non_exhaustive]
    RateLimited {
        /// Time until the next token.
        retry_after: Duration,
    },
    /// Shed by the queue's delay control: the service is overloaded (its
    /// queue has not drained for a whole interval) and the task waited
    /// longer than the target (`queue.delay`).
    #[error("overloaded; shed after waiting in the queue; retry in {retry_after:?}")]
    #[non_exhaustive]
    Overloaded {
        /// A hint of when the overload may have passed.
        retry_after: Duration,
    },
    /// The caller dropped its [`crate::Submission`] before the answer (a
    /// gateway client that disconnected): the attempt in flight was
    /// cancelled. Nobody receives this result; the stats count it.
    #[error("cancelled: the caller left before the answer")]
    Cancelled,
}

impl Rejection {
    /// A [`Rejection::CircuitOpen`]: the first breaker half-opens in
    /// `retry_after`; `last_error` is what its node last failed with.
    pub fn circuit_open(retry_after: Duration, last_error: Option<Arc<str>>) -> Rejection {
        Rejection::CircuitOpen {
            retry_after,
            last_error,
        }
    }

    /// A [`Rejection::RateLimited`]: the next token comes in `retry_after`.
    pub fn rate_limited(retry_after: Duration) -> Rejection {
        Rejection::RateLimited { retry_after }
    }

    /// A [`Rejection::Overloaded`], with the hint `retry_after`.
    pub fn overloaded(retry_after: Duration) -> Rejection {
        Rejection::Overloaded { retry_after }
    }
}

/// `"; last error: {e}"`, or nothing.
fn cause(last_error: &Option<Arc<str>>) -> String {
    last_error
        .as_deref()
        .map_or_else(String::new, |e| format!("; last error: {e}"))
}

/// One attempt of a task on one node.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Attempt {
    /// Address of the node.
    pub node: Arc<str>,
    /// Status or error.
    pub outcome: AttemptOutcome,
    /// Time from send to answer (or error).
    pub latency: Duration,
    /// Whether this was a hedged extra attempt.
    pub hedge: bool,
    /// The HTTP version the answer came over; `None` when there was no
    /// answer (or the transport does not say).
    pub protocol: Option<Protocol>,
    /// A failed attempt's error in words, when the transport said more
    /// than its kind (`TLS with host:443: certificate signed by an unknown
    /// authority (...)`); `None` for an answer.
    pub error: Option<Arc<str>>,
}

impl Attempt {
    /// A first (not hedged) attempt on `node` that gave `outcome` after
    /// `latency`, over no known protocol and with no error words (set
    /// `hedge`, `protocol` and `error` as needed).
    pub fn new(node: impl Into<Arc<str>>, outcome: AttemptOutcome, latency: Duration) -> Self {
        Attempt {
            node: node.into(),
            outcome,
            latency,
            hedge: false,
            protocol: None,
            error: None,
        }
    }
}

/// The HTTP version of an answer: HTTP/2 where the server offered it over
/// TLS (ALPN), HTTP/1.1 otherwise. Serialized by its ALPN name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub enum Protocol {
    /// HTTP/1.0 or HTTP/1.1.
    #[serde(rename = "http/1.1")]
    Http1,
    /// HTTP/2.
    #[serde(rename = "h2")]
    H2,
}

impl Protocol {
    /// The protocol of an answer of HTTP `version` (HTTP/3 is not spoken).
    pub fn of(version: awc::http::Version) -> Option<Protocol> {
        match version {
            awc::http::Version::HTTP_10 | awc::http::Version::HTTP_11 => Some(Protocol::Http1),
            awc::http::Version::HTTP_2 => Some(Protocol::H2),
            _ => None,
        }
    }

    /// The ALPN name: `"http/1.1"` or `"h2"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::H2 => "h2",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one attempt gave: a status, or no usable answer. Complete as it
/// is (new kinds of error go into [`ErrorKind`]), so it is matched
/// exhaustively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// An HTTP status.
    Status(u16),
    /// No usable answer.
    Error(ErrorKind),
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptOutcome::Status(s) => write!(f, "status {s}"),
            AttemptOutcome::Error(e) => write!(f, "{e}"),
        }
    }
}

/// Kinds of attempt errors, by what they mean for retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Could not connect: the request was never sent (always retryable).
    Connect,
    /// Connected, but no byte of the request can have been acted on: the
    /// write failed before anything left, or a reused keep-alive connection
    /// was closed or reset before any byte of the answer (the race with a
    /// server closing an idle connection; see [`crate::transport`]). Always
    /// retryable, and not the node's fault.
    NotSent,
    /// No answer within the attempt timeout (retryable if idempotent).
    Timeout,
    /// The connection broke after sending (retryable if idempotent).
    Reset,
    /// The response body was over `max_body` or could not be decoded (not
    /// retried, and not the node's fault). A connection that breaks while
    /// the body is read is [`ErrorKind::Reset`].
    Body,
    /// The request could not be built (not retried).
    Invalid,
    /// The attempt panicked inside the engine (retryable if idempotent).
    Panicked,
    /// The node never reported back (retryable if idempotent).
    Lost,
    /// The attempt was cancelled: a hedged twin answered first, or the
    /// caller dropped its [`crate::Submission`]. Never counted against the
    /// node.
    Cancelled,
    /// The TLS handshake failed: a certificate from an unknown authority,
    /// expired, or for another host name, or no common protocol. Nothing
    /// was sent, so the task may go to another node (never this one: when
    /// only this node could take it, the task fails `NotRetryable`), and it
    /// counts against this node's breaker: the node stays misconfigured
    /// until someone fixes it. The attempt's [`Attempt::error`] says why.
    Tls,
    /// The task's own deadline cut the attempt before the node's timeout
    /// would have. Not retried (the task has no time left), and never the
    /// node's fault: under overload tasks wait long in the queue, and
    /// blaming the node for that would open the breakers of healthy nodes.
    Deadline,
    /// Dropped by the client before it was sent: the node's backend has
    /// refused most of what it was sent lately (client-side throttling,
    /// `throttle`). Retried elsewhere like a request not sent, and never
    /// the node's fault.
    Throttled,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Connect => "connect error",
            ErrorKind::NotSent => "not sent (connection closed before the request)",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Reset => "connection reset",
            ErrorKind::Body => "body error",
            ErrorKind::Invalid => "invalid request",
            ErrorKind::Panicked => "panicked",
            ErrorKind::Lost => "lost",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Tls => "TLS error",
            ErrorKind::Deadline => "cut by the task's deadline",
            ErrorKind::Throttled => "throttled by the client (the backend refuses most requests)",
        })
    }
}

impl AttemptOutcome {
    /// Whether this counts against a node's health (breaker, error rate):
    /// connect and TLS errors, timeouts, resets, panics, lost attempts and 5xx.
    /// Never 4xx, nor what is the task's or the race's doing: a body over
    /// `max_body` (a large resource is not a sick node), an invalid request,
    /// a cancelled hedge, a request not sent because a keep-alive
    /// connection closed under it, or an attempt cut by its task's deadline.
    pub fn is_node_failure(&self) -> bool {
        match self {
            AttemptOutcome::Status(s) => *s >= 500,
            AttemptOutcome::Error(
                ErrorKind::Connect
                | ErrorKind::Tls
                | ErrorKind::Timeout
                | ErrorKind::Reset
                | ErrorKind::Panicked
                | ErrorKind::Lost,
            ) => true,
            AttemptOutcome::Error(
                ErrorKind::NotSent
                | ErrorKind::Body
                | ErrorKind::Invalid
                | ErrorKind::Cancelled
                | ErrorKind::Deadline
                | ErrorKind::Throttled,
            ) => false,
        }
    }

    /// Whether a task that ended with this may be tried again (the engine's
    /// retry policy): 429 and 5xx, connect and TLS errors and
    /// requests not sent, always (on another node for TLS);
    /// timeouts, resets, panics and lost attempts only when `idempotent`
    /// (the server may have acted); other statuses, body errors, invalid
    /// requests, cancelled attempts and attempts cut by the task's deadline
    /// never.
    pub fn is_retryable(&self, idempotent: bool) -> bool {
        match self {
            AttemptOutcome::Status(s) => *s == 429 || *s >= 500,
            AttemptOutcome::Error(
                ErrorKind::Connect | ErrorKind::NotSent | ErrorKind::Tls | ErrorKind::Throttled,
            ) => true,
            AttemptOutcome::Error(
                ErrorKind::Timeout | ErrorKind::Reset | ErrorKind::Panicked | ErrorKind::Lost,
            ) => idempotent,
            AttemptOutcome::Error(
                ErrorKind::Body | ErrorKind::Invalid | ErrorKind::Cancelled | ErrorKind::Deadline,
            ) => false,
        }
    }

    /// Whether the task succeeded with this answer (2xx, 3xx).
    pub fn is_success(&self) -> bool {
        matches!(self, AttemptOutcome::Status(s) if (200..400).contains(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::sync::mpsc;

    #[actix_rt::test]
    async fn a_body_stream_ends_cleanly_only_at_its_end() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Frame::Data(Bytes::from_static(b"a")))
            .await
            .unwrap();
        tx.send(Frame::End).await.unwrap();
        drop(tx);
        let items: Vec<_> = BodyStream::new(rx).collect().await;
        assert_eq!(items, vec![Ok(Bytes::from_static(b"a"))]);
    }

    #[actix_rt::test]
    async fn a_channel_closed_without_an_end_is_a_lost_item_then_the_end() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Frame::Data(Bytes::from_static(b"a")))
            .await
            .unwrap();
        drop(tx);
        let mut s = BodyStream::new(rx);
        assert_eq!(s.next().await, Some(Ok(Bytes::from_static(b"a"))));
        let e = s.next().await.unwrap().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Lost);
        assert_eq!(s.next().await, None);
    }

    #[actix_rt::test]
    async fn an_error_item_is_the_last() {
        let (tx, rx) = mpsc::channel(4);
        let e = StreamError::new(ErrorKind::Reset, "cut");
        tx.send(Frame::Error(e.clone())).await.unwrap();
        tx.send(Frame::Data(Bytes::from_static(b"late")))
            .await
            .unwrap();
        let items: Vec<_> = BodyStream::new(rx).collect().await;
        assert_eq!(items, vec![Err(e)]);
    }

    #[test]
    fn a_clone_of_a_response_carries_no_stream() {
        let (_tx, rx) = mpsc::channel(1);
        let mut r = Response {
            status: 200,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            node: Arc::from("n"),
            stream: Some(BodyStream::new(rx)),
        };
        assert!(r.clone().stream.is_none());
        assert!(r.is_streamed());
        assert!(r.take_stream().is_some());
        assert!(!r.is_streamed());
    }
}
