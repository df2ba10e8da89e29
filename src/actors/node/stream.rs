//! Streamed attempts ([`crate::Task::stream`]): the answer's head goes to
//! the queue at once, the body follows chunk by chunk, and the slot stays
//! taken until the body ends.
//!
//! ```text
//!  attempt task ──head──► NodeReport.done (with the stream) ──► balancer (slot kept, no credit) ──► queue answers the caller
//!       │ chunks ──bounded mpsc──► BodyStream (the caller's; Send)
//!       └─ body ends / breaks / reader drops ──► NodeCore::stream_ended ──NodeReport.streams_ended──► balancer frees the slot
//! ```
//!
//! Up to the head an attempt is an ordinary one: the attempt timeout, the
//! task's deadline, hedge cancels, panics, retries and the breaker apply,
//! and an answer that is not a success (4xx, 5xx) is read whole under
//! `max_body` and decided on as usual. After the head the task's result is
//! final: a body that breaks, stalls longer than the attempt timeout
//! between chunks, or passes `max_body` in total ends the stream with one
//! error item, and the node accounts the attempt only then (a break or a
//! stall is a node failure for its breaker and error rate; an oversized
//! body is not). A reader that drops the stream ends the attempt as a
//! success: the body is dropped unread, which closes the connection.
//!
//! The chunk channel is bounded ([`CHUNKS`]): a slow reader holds the
//! backend back instead of filling memory.

use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use futures::stream::LocalBoxStream;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{panicked, NodeCore};
use crate::actors::protocol::{AttemptEnded, AttemptReport, Seq};
use crate::algo::breaker::Permit;
use crate::outcome::{AttemptOutcome, BodyStream, ErrorKind, Frame, StreamError};
use crate::transport::{HttpReply, HttpRequest, StreamedReply, Transport, TransportError};

/// Chunks buffered between the backend and a reader that lags.
pub(super) const CHUNKS: usize = 16;

/// What a streamed attempt's head gave.
enum Head {
    /// A success: its body is streamed.
    Streaming(StreamedReply),
    /// Not a success: read whole, decided on like any answer.
    Whole(HttpReply),
}

/// How a streamed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Read to its end.
    Complete,
    /// The reader dropped the stream.
    Dropped,
    /// Ended by an error item of this kind.
    Failed(ErrorKind),
}

/// One streamed attempt, from sending to the body's end.
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempt(
    core: Rc<std::cell::RefCell<NodeCore>>,
    transport: Rc<dyn Transport>,
    job: std::sync::Arc<crate::task::Job>,
    req: HttpRequest,
    seq: Seq,
    hedge: bool,
    permit: Option<Permit>,
    cancel: Option<oneshot::Receiver<()>>,
    timeout: Duration,
    deadline: super::AttemptDeadline,
) {
    let started = Instant::now();
    let max_body = req.max_body;
    let head = super::cancellable(run_head(&*transport, req, deadline), cancel, &job).await;
    // The head ends the caller's wait: the body's reader decides from here.
    drop(job);
    let at_head = Instant::now();
    let latency = at_head.saturating_duration_since(started);
    let reply = match head {
        Ok(Head::Streaming(reply)) => reply,
        Ok(Head::Whole(reply)) => {
            return core
                .borrow_mut()
                .finish_one(seq, hedge, permit, latency, Ok(reply), at_head)
        }
        Err(e) => {
            return core
                .borrow_mut()
                .finish_one(seq, hedge, permit, latency, Err(e), at_head)
        }
    };
    let (tx, rx) = mpsc::channel(CHUNKS);
    let status = reply.head.status;
    core.borrow_mut().stream_head(
        seq,
        hedge,
        latency,
        reply.head,
        BodyStream::new(rx),
        at_head,
    );
    let end = match AssertUnwindSafe(pump(reply.body, tx, max_body, timeout))
        .catch_unwind()
        .await
    {
        Ok(end) => end,
        // The sender went with the panic: the reader sees `Lost`.
        Err(p) => {
            log::debug!("streamed body: {}", panicked(p));
            End::Failed(ErrorKind::Panicked)
        }
    };
    let outcome = match end {
        End::Complete | End::Dropped => AttemptOutcome::Status(status),
        End::Failed(kind) => AttemptOutcome::Error(kind),
    };
    core.borrow_mut()
        .stream_ended(permit, latency, outcome, Instant::now());
}

/// Sends the request and waits for the head under the attempt's deadline;
/// an answer that is not a success is read whole (under `max_body`) too.
async fn run_head(
    transport: &dyn Transport,
    req: HttpRequest,
    deadline: super::AttemptDeadline,
) -> Result<Head, TransportError> {
    let max_body = req.max_body;
    let sent = Instant::now();
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| transport.send_streaming(req))) {
        Ok(f) => f,
        Err(p) => return Err(panicked(p)),
    };
    let work = async move {
        let r = fut.await?;
        if AttemptOutcome::Status(r.head.status).is_success() {
            return Ok(Head::Streaming(r));
        }
        let (mut head, mut body) = (r.head, r.body);
        let mut all = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            if all.len().saturating_add(chunk.len()) > max_body {
                return Err(over_limit(max_body));
            }
            all.extend_from_slice(&chunk);
        }
        head.body = all.freeze();
        Ok(Head::Whole(head))
    };
    match AssertUnwindSafe(tokio::time::timeout_at(deadline.at, work))
        .catch_unwind()
        .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(deadline.error(sent)),
        Err(p) => Err(panicked(p)),
    }
}

fn over_limit(max_body: usize) -> TransportError {
    TransportError::new(
        ErrorKind::Body,
        format!("response body over max_body ({max_body} bytes)"),
    )
}

/// Forwards the body's chunks to the reader until it ends, breaks, passes
/// `max_body`, stalls for `idle`, or the reader drops the stream.
async fn pump(
    mut body: LocalBoxStream<'static, Result<bytes::Bytes, TransportError>>,
    tx: mpsc::Sender<Frame>,
    max_body: usize,
    idle: Duration,
) -> End {
    let mut total = 0usize;
    loop {
        let next = {
            let closed = tx.closed();
            let item = tokio::time::timeout(idle, body.next());
            futures::pin_mut!(closed, item);
            match futures::future::select(item, closed).await {
                futures::future::Either::Left((r, _)) => r,
                futures::future::Either::Right(_) => return End::Dropped,
            }
        };
        let err = match next {
            Ok(Some(Ok(chunk))) => {
                total = total.saturating_add(chunk.len());
                if total > max_body {
                    over_limit(max_body)
                } else {
                    if !chunk.is_empty() && tx.send(Frame::Data(chunk)).await.is_err() {
                        return End::Dropped;
                    }
                    continue;
                }
            }
            Ok(Some(Err(e))) => e,
            Ok(None) => {
                let _ = tx.send(Frame::End).await;
                return End::Complete;
            }
            Err(_) => TransportError::new(
                ErrorKind::Timeout,
                format!("no chunk of the body within {idle:?}"),
            ),
        };
        let kind = err.kind;
        let _ = tx
            .send(Frame::Error(StreamError::new(kind, err.detail)))
            .await;
        return End::Failed(kind);
    }
}

// === impl NodeCore ===

impl NodeCore {
    /// A streamed attempt's head arrived: the queue gets it (and the body's
    /// stream) now; the slot stays taken until [`NodeCore::stream_ended`].
    fn stream_head(
        &mut self,
        seq: Seq,
        hedge: bool,
        latency: Duration,
        head: HttpReply,
        body: BodyStream,
        now: Instant,
    ) {
        // The race is over: a cancel for this round no longer applies.
        if !self.cancels.is_empty() {
            self.cancels.remove(&(seq, hedge));
        }
        let done = AttemptEnded {
            seq,
            hedge,
            report: AttemptReport {
                outcome: AttemptOutcome::Status(head.status),
                latency,
                reply: Some(head),
                retry_after: None,
                detail: None,
                stream: Some(body),
            },
        };
        self.send_report(vec![done], Vec::new(), 0, now);
    }

    /// A streamed attempt's body ended: free the slot, account the attempt
    /// (latency to the head; the body's end decides failure), tell the
    /// balancer.
    fn stream_ended(
        &mut self,
        permit: Option<Permit>,
        latency: Duration,
        outcome: AttemptOutcome,
        now: Instant,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.metrics.in_flight(self.in_flight);
        self.metrics.attempt(&outcome, latency);
        if outcome.is_node_failure() {
            log::debug!(
                "service {}: node {}: streamed body ended by {outcome}",
                self.service,
                self.address
            );
        }
        self.record_health(&outcome, permit, latency, now);
        self.send_report(Vec::new(), Vec::new(), 1, now);
    }
}
