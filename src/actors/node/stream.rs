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
//! backend back instead of filling memory. A reader that stops reading
//! does not hold the node's slot for long: every chunk it leaves waiting
//! for room longer than the task's `stream_send_timeout` (10 s by default)
//! ends the stream, and so does the body's optional lifetime
//! (`stream_max_duration`, from the head). Either ends the stream with one
//! `Timeout` item and frees the slot; neither is the node's fault (the
//! reader, or the route's limit, stopped it). One slot of the channel is
//! kept from the start for the stream's last word (its end, or its error
//! item), so that last word never waits on the reader either.

use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use futures::stream::LocalBoxStream;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::in_flight::InFlightGuard;
use super::{panicked, NodeCore};
use crate::actors::inbox::InboxSender;
use crate::actors::protocol::{NodeReport, Seq};
use crate::algo::breaker::Permit;
use crate::algo::time;
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
    /// The reader left a chunk waiting past the send timeout (the reader
    /// got a `Timeout` item; not the node's fault).
    Stalled,
    /// The body outlived its lifetime (the reader got a `Timeout` item;
    /// not the node's fault).
    Expired,
    /// Ended by an error item of this kind.
    Failed(ErrorKind),
}

/// The bounds of one streamed body.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Most bytes in total.
    max_body: usize,
    /// Longest wait for the backend's next chunk (the attempt timeout).
    idle: Duration,
    /// Longest wait for the reader to make room for a chunk.
    send: Duration,
    /// When the body's lifetime ends, if it has one.
    until: Option<Instant>,
}

impl Limits {
    /// The earlier of `now + wait` and the lifetime's end, and whether the
    /// lifetime's end is the one.
    fn within(&self, now: Instant, wait: Duration) -> (Instant, bool) {
        let at = time::add(now, wait);
        match self.until {
            Some(until) if until <= at => (until, true),
            _ => (at, false),
        }
    }
}

/// One streamed attempt, from sending to the body's end.
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempt(
    core: Rc<std::cell::RefCell<NodeCore>>,
    to_balancer: InboxSender<NodeReport>,
    transport: Rc<dyn Transport>,
    job: std::sync::Arc<crate::task::Job>,
    req: HttpRequest,
    seq: Seq,
    hedge: bool,
    permit: Option<Permit>,
    slot: InFlightGuard,
    cancel: Option<oneshot::Receiver<()>>,
    timeout: Duration,
    deadline: super::AttemptDeadline,
    started: Instant,
) {
    let max_body = req.max_body;
    let (send, lifetime) = job.task.stream_limits();
    let send = send.unwrap_or(crate::task::STREAM_SEND_TIMEOUT);
    let head = super::cancellable(run_head(&*transport, req, deadline), cancel, &job).await;
    // The head ends the caller's wait: the body's reader decides from here.
    drop(job);
    let at_head = Instant::now();
    let latency = at_head.saturating_duration_since(started);
    let reply = match head {
        Ok(Head::Streaming(reply)) => Ok(reply),
        Ok(Head::Whole(reply)) => Err(Ok(reply)),
        Err(e) => Err(Err(e)),
    };
    // Not streamed: an ordinary attempt's end.
    let reply = match reply {
        Ok(reply) => reply,
        Err(result) => {
            let held = (permit, slot);
            let r = core
                .borrow_mut()
                .finish_one(seq, hedge, held, latency, result, at_head);
            return to_balancer.send(r);
        }
    };
    // One slot more than the chunks: the stream's last word's.
    let (tx, rx) = mpsc::channel(CHUNKS + 1);
    let status = reply.head.status;
    let r = core.borrow_mut().stream_head(
        seq,
        hedge,
        latency,
        reply.head,
        BodyStream::new(rx),
        at_head,
    );
    to_balancer.send(r);
    let limits = Limits {
        max_body,
        idle: timeout,
        send,
        until: lifetime.map(|d| time::add(at_head, d)),
    };
    let end = match AssertUnwindSafe(pump(reply.body, tx, limits))
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
    let outcome = outcome_of(end, status);
    if matches!(end, End::Stalled | End::Expired) {
        let core = core.borrow();
        log::debug!(
            "service {}: node {}: streamed body cut: {}",
            core.service(),
            core.address(),
            if end == End::Stalled {
                "the reader took no chunk within the send timeout"
            } else {
                "its lifetime passed"
            }
        );
    }
    let r = core
        .borrow_mut()
        .stream_ended(permit, slot, latency, outcome, Instant::now());
    to_balancer.send(r);
}

/// What a streamed attempt counts as for its node: the head's status,
/// unless the backend broke the body. A reader that stopped or left, or
/// a lifetime that passed, is not the node's doing.
fn outcome_of(end: End, status: u16) -> AttemptOutcome {
    match end {
        End::Complete | End::Dropped | End::Stalled | End::Expired => {
            AttemptOutcome::Status(status)
        }
        End::Failed(kind) => AttemptOutcome::Error(kind),
    }
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
/// `max_body`, stalls for `idle`, outlives its lifetime, the reader leaves
/// a chunk waiting past `send`, or the reader drops the stream.
async fn pump(
    mut body: LocalBoxStream<'static, Result<bytes::Bytes, TransportError>>,
    tx: mpsc::Sender<Frame>,
    limits: Limits,
) -> End {
    // The last word's slot, taken while the channel is empty: the end or
    // the error item goes out without waiting on the reader.
    let Ok(last) = tx.clone().try_reserve_owned() else {
        return End::Dropped;
    };
    let mut total = 0usize;
    let (end, detail) = loop {
        let now = Instant::now();
        // A body that always has a chunk ready never meets a timer.
        if limits.until.is_some_and(|until| until <= now) {
            break (End::Expired, expired());
        }
        let (at, lifetime) = limits.within(now, limits.idle);
        let next = {
            let closed = tx.closed();
            let item = tokio::time::timeout_at(at, body.next());
            futures::pin_mut!(closed, item);
            match futures::future::select(item, closed).await {
                futures::future::Either::Left((r, _)) => r,
                futures::future::Either::Right(_) => return End::Dropped,
            }
        };
        let err = match next {
            Ok(Some(Ok(chunk))) => {
                total = total.saturating_add(chunk.len());
                if total > limits.max_body {
                    over_limit(limits.max_body)
                } else {
                    if chunk.is_empty() {
                        continue;
                    }
                    match give(&tx, Frame::Data(chunk), &limits).await {
                        Ok(()) => continue,
                        Err(End::Dropped) => return End::Dropped,
                        Err(End::Stalled) => break (End::Stalled, stalled(limits.send)),
                        Err(_) => break (End::Expired, expired()),
                    }
                }
            }
            Ok(Some(Err(e))) => e,
            Ok(None) => {
                last.send(Frame::End);
                return End::Complete;
            }
            Err(_) if lifetime => break (End::Expired, expired()),
            Err(_) => TransportError::new(
                ErrorKind::Timeout,
                format!("no chunk of the body within {:?}", limits.idle),
            ),
        };
        break (End::Failed(err.kind), err.detail);
    };
    let kind = match end {
        End::Failed(kind) => kind,
        _ => ErrorKind::Timeout,
    };
    last.send(Frame::Error(StreamError::new(kind, detail)));
    end
}

/// Puts `frame` in the reader's channel: at once when there is room, else
/// within the send timeout and the body's lifetime. The error says which
/// ended the wait ([`End::Dropped`], [`End::Stalled`] or [`End::Expired`]).
async fn give(tx: &mpsc::Sender<Frame>, frame: Frame, limits: &Limits) -> Result<(), End> {
    let frame = match tx.try_send(frame) {
        Ok(()) => return Ok(()),
        Err(mpsc::error::TrySendError::Closed(_)) => return Err(End::Dropped),
        Err(mpsc::error::TrySendError::Full(frame)) => frame,
    };
    let (at, lifetime) = limits.within(Instant::now(), limits.send);
    match tokio::time::timeout_at(at, tx.send(frame)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(End::Dropped),
        Err(_) if lifetime => Err(End::Expired),
        Err(_) => Err(End::Stalled),
    }
}

fn stalled(send: Duration) -> String {
    format!("the reader took no chunk within {send:?} (stream_send_timeout)")
}

fn expired() -> String {
    "the body outlived its lifetime (stream_max_duration)".to_owned()
}

// === impl NodeCore ===

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::BodyStream;
    use bytes::Bytes;
    use futures::stream;

    type Body = LocalBoxStream<'static, Result<Bytes, TransportError>>;

    fn limits(send_ms: u64, lifetime_ms: Option<u64>) -> Limits {
        Limits {
            max_body: usize::MAX,
            idle: Duration::from_secs(5),
            send: Duration::from_millis(send_ms),
            until: lifetime_ms.map(|ms| Instant::now() + Duration::from_millis(ms)),
        }
    }

    fn channel() -> (mpsc::Sender<Frame>, BodyStream) {
        let (tx, rx) = mpsc::channel(CHUNKS + 1);
        (tx, BodyStream::new(rx))
    }

    /// Everything `reader` gives: the data chunks, then the error's kind.
    async fn read(mut reader: BodyStream) -> (usize, Option<ErrorKind>) {
        let (mut chunks, mut error) = (0, None);
        while let Some(item) = reader.next().await {
            match item {
                Ok(_) => chunks += 1,
                Err(e) => error = Some(e.kind),
            }
        }
        (chunks, error)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_is_cut_after_the_send_timeout() {
        let body: Body = stream::repeat_with(|| Ok(Bytes::from_static(b"x"))).boxed_local();
        let (tx, reader) = channel();
        let start = Instant::now();
        let end = pump(body, tx, limits(300, None)).await;
        assert_eq!(end, End::Stalled);
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        // The reader finds the chunks that had room, then the cut.
        assert_eq!(read(reader).await, (CHUNKS, Some(ErrorKind::Timeout)));
        assert!(!outcome_of(end, 200).is_node_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_a_body_never_waits_on_its_reader() {
        let chunks = (0..CHUNKS).map(|_| Ok(Bytes::from_static(b"x")));
        let body: Body = stream::iter(chunks).boxed_local();
        let (tx, reader) = channel();
        let start = Instant::now();
        let end = pump(body, tx, limits(300, None)).await;
        assert_eq!(end, End::Complete);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(read(reader).await, (CHUNKS, None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_past_its_lifetime_ends_with_a_timeout_item() {
        // A chunk every 300 ms, for ever; the lifetime is 1 s.
        let body: Body = stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Some((Ok(Bytes::from_static(b"x")), ()))
        })
        .boxed_local();
        let (tx, reader) = channel();
        let start = Instant::now();
        let (end, got) = futures::join!(pump(body, tx, limits(300, Some(1000))), read(reader));
        assert_eq!(end, End::Expired);
        assert_eq!(start.elapsed(), Duration::from_millis(1000));
        assert_eq!(got, (3, Some(ErrorKind::Timeout)));
        assert!(!outcome_of(end, 200).is_node_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lifetime_that_passes_while_the_reader_stalls_is_an_expiry() {
        let body: Body = stream::repeat_with(|| Ok(Bytes::from_static(b"x"))).boxed_local();
        let (tx, reader) = channel();
        let start = Instant::now();
        let end = pump(body, tx, limits(10_000, Some(500))).await;
        assert_eq!(end, End::Expired);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        assert_eq!(read(reader).await, (CHUNKS, Some(ErrorKind::Timeout)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_that_stalls_is_still_the_nodes_failure() {
        let first = stream::iter([Ok(Bytes::from_static(b"x"))]);
        let body: Body = first.chain(stream::pending()).boxed_local();
        let (tx, reader) = channel();
        let (end, got) = futures::join!(pump(body, tx, limits(300, None)), read(reader));
        assert_eq!(end, End::Failed(ErrorKind::Timeout));
        assert_eq!(got, (1, Some(ErrorKind::Timeout)));
        assert!(outcome_of(end, 200).is_node_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_leaves_ends_the_stream_at_once() {
        let body: Body = stream::pending().boxed_local();
        let (tx, reader) = channel();
        drop(reader);
        assert_eq!(pump(body, tx, limits(300, None)).await, End::Dropped);
    }
}
