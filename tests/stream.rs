//! Streamed responses (issue 11, part 3): a task marked `.stream(true)`
//! resolves at the answer's head with the body as a stream of chunks; the
//! node's slot stays taken until the body ends or the stream is dropped; a
//! body that breaks after the head is an error item and a node failure,
//! never retried; `max_body` bounds the stream's total.
//!
//! Assertions are on order and counts (the backend's count of events sent
//! when the first chunk arrives), never on wall-clock latency.

mod support;

use std::time::Duration;

use actix_dispatch::{
    AttemptOutcome, BodyStream, Dispatcher, ErrorKind, FailReason, NodeStats, Outcome, StreamError,
    Task, TaskResult,
};
use bytes::Bytes;
use futures::StreamExt;
use support::cfg::config;
use support::{init_logs, Backend};

/// One service over `nodes` (each with `max_concurrent`), with `extra`
/// service fields.
fn start(nodes: &[&Backend], max_concurrent: u32, extra: &str) -> Dispatcher {
    let nodes: Vec<(&Backend, u32, u32)> = nodes.iter().map(|b| (*b, 1, max_concurrent)).collect();
    Dispatcher::start(config("round_robin", &nodes, extra)).unwrap()
}

async fn nodes(d: &Dispatcher) -> Vec<NodeStats> {
    d.stats().await.service("svc").unwrap().nodes.clone()
}

/// Waits (bounded) until every node's in-flight count is zero: the
/// balancer learns a body's end by a message of its own.
async fn settle_in_flight(d: &Dispatcher) -> Vec<NodeStats> {
    for _ in 0..500 {
        let n = nodes(d).await;
        if n.iter().all(|n| n.in_flight == 0) {
            return n;
        }
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("slots never freed: {:?}", nodes(d).await);
}

fn take_stream(r: &mut TaskResult) -> BodyStream {
    assert!(r.is_success(), "{:?}", r.outcome);
    let resp = r.response_mut().unwrap();
    assert!(resp.body.is_empty(), "a streamed body is not buffered");
    resp.take_stream()
        .expect("a streamed success carries its stream")
}

/// Reads a stream to its end: the chunks, and the error item if one ended it
/// (which must then be the last item).
async fn drain(mut s: BodyStream) -> (Vec<Bytes>, Option<StreamError>) {
    let mut chunks = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(c) => chunks.push(c),
            Err(e) => {
                assert!(s.next().await.is_none(), "an error item is the last");
                return (chunks, Some(e));
            }
        }
    }
    (chunks, None)
}

fn events(chunks: &[Bytes]) -> usize {
    let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    String::from_utf8(all)
        .unwrap()
        .matches("data: event ")
        .count()
}

#[actix_rt::test]
async fn sse_events_reach_the_caller_before_the_backend_finishes() {
    init_logs();
    let b = Backend::start();
    let d = start(&[&b], 4, "");
    let mut r = d.submit(Task::get("svc", "/sse/20/50").stream(true)).await;
    // The task is answered at the head, while the backend is still sending.
    assert!(b.sse_sent() < 20, "answered only after the whole body");
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(
        r.response().unwrap().header("content-type"),
        Some("text/event-stream")
    );
    let mut s = take_stream(&mut r);
    let first = s.next().await.unwrap().unwrap();
    let sent_at_first = b.sse_sent();
    assert!(
        sent_at_first < 20,
        "the first event must arrive before the backend sent all 20 ({sent_at_first})"
    );
    assert!(String::from_utf8_lossy(&first).starts_with("id: 0\ndata: event 0"));
    // While the body flows, the attempt holds its slot.
    assert_eq!(nodes(&d).await[0].in_flight, 1);

    let (rest, err) = drain(s).await;
    assert_eq!(err, None);
    assert_eq!(events(&[vec![first], rest].concat()), 20);
    assert_eq!(b.sse_sent(), 20);

    let n = settle_in_flight(&d).await;
    assert_eq!((n[0].total, n[0].errors), (1, 0), "{:?}", n[0]);
    let q = d.stats().await.service("svc").unwrap().queue.clone();
    assert_eq!((q.submitted, q.succeeded, q.in_flight), (1, 1, 0));
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_dropped_stream_frees_the_slot_it_held() {
    init_logs();
    let b = Backend::start();
    // One slot: while the stream holds it, nothing else is sent.
    // A standing queue on purpose: the delay control would shed it.
    let d = start(&[&b], 1, r#""queue":{"delay":{"enabled":false}}"#);
    let mut r = d.submit(Task::get("svc", "/sse/20/50").stream(true)).await;
    let mut s = take_stream(&mut r);
    let d2 = d.clone();
    let waiting = actix_rt::spawn(async move { d2.submit(Task::get("svc", "/after")).await });
    for _ in 0..3 {
        s.next().await.unwrap().unwrap();
    }
    assert!(!waiting.is_finished(), "the stream's slot was given away");
    assert_eq!(b.hits(), 1, "only the streamed request reached the backend");
    assert_eq!(nodes(&d).await[0].in_flight, 1);

    drop(s);
    let after = waiting.await.unwrap();
    assert!(after.is_success(), "{:?}", after.outcome);
    assert_eq!(b.hits(), 2);
    let n = settle_in_flight(&d).await;
    assert_eq!(n[0].errors, 0, "a reader leaving is not the node's fault");
    assert_eq!(n[0].total, 2);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_stream_cut_midway_is_an_error_item_and_a_node_error() {
    init_logs();
    let b = Backend::start();
    let d = start(
        &[&b],
        4,
        r#""retry":{"max_retries":3,"backoff_base":"1ms","backoff_max":"5ms"}"#,
    );
    let mut r = d
        .submit(Task::get("svc", "/sse/20/10/cut/5").stream(true))
        .await;
    let (chunks, err) = drain(take_stream(&mut r)).await;
    assert_eq!(events(&chunks), 5);
    let err = err.expect("a cut body ends with an error item");
    assert_eq!(err.kind, ErrorKind::Reset, "{err}");
    // Never retried behind the caller's back.
    assert_eq!(b.hits(), 1);
    assert_eq!(r.attempts.len(), 1);
    let n = settle_in_flight(&d).await;
    assert_eq!((n[0].total, n[0].errors), (1, 1), "{:?}", n[0]);
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_stream_over_max_body_ends_with_a_body_error_item() {
    init_logs();
    let b = Backend::start();
    let d = start(&[&b], 4, r#""max_body":100"#);
    let mut r = d.submit(Task::get("svc", "/sse/20/5").stream(true)).await;
    let (chunks, err) = drain(take_stream(&mut r)).await;
    let err = err.expect("over max_body ends with an error item");
    assert_eq!(err.kind, ErrorKind::Body, "{err}");
    assert!(err.detail.contains("max_body (100 bytes)"), "{err}");
    let passed: usize = chunks.iter().map(Bytes::len).sum();
    assert!(passed <= 100, "{passed} bytes passed a 100-byte limit");
    let n = settle_in_flight(&d).await;
    assert_eq!(n[0].errors, 0, "a large body is not a sick node");
    assert_eq!(n[0].breaker, "closed");
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_failed_head_is_retried_like_any_answer() {
    init_logs();
    let b = Backend::start();
    let d = start(
        &[&b],
        4,
        r#""retry":{"max_retries":2,"backoff_base":"1ms","backoff_max":"5ms"}"#,
    );
    let r = d.submit(Task::get("svc", "/status/503").stream(true)).await;
    match &r.outcome {
        Outcome::Failure(f) => {
            assert_eq!(f.reason, FailReason::RetriesExhausted);
            assert_eq!(f.last, Some(AttemptOutcome::Status(503)));
            let resp = f.response.as_ref().unwrap();
            assert_eq!(resp.body, Bytes::from_static(b"status 503"));
            assert!(resp.stream.is_none());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.attempts.len(), 3);
    let n = settle_in_flight(&d).await;
    assert_eq!(n[0].total, 3);
    d.shutdown(Duration::from_secs(1)).await;
}

/// Many streams at once over two nodes: a third are cut by their backend,
/// some are dropped by their reader after one chunk. Every task has one
/// result, every stream ends with its end or one error item, the cut ones
/// are the nodes' only errors, and every slot comes back.
#[actix_rt::test]
async fn chaos_many_streams_some_cut_none_lost() {
    init_logs();
    let (b0, b1) = (Backend::named("b0"), Backend::named("b1"));
    let d = start(
        &[&b0, &b1],
        3,
        r#""breaker":{"enabled":false},"queue":{"capacity":1000,"delay":{"enabled":false}}"#,
    );
    const N: usize = 36;
    let runs = (0..N).map(|i| {
        let d = d.clone();
        async move {
            let cut = i % 3 == 0;
            let path = if cut {
                format!("/sse/8/5/cut/{}", i % 5 + 1)
            } else {
                "/sse/8/5".to_owned()
            };
            let mut r = d.submit(Task::get("svc", path).stream(true)).await;
            let mut s = take_stream(&mut r);
            if !cut && i % 4 == 1 {
                // A reader that leaves after the first chunk.
                s.next().await.unwrap().unwrap();
                return (i, None);
            }
            let (chunks, err) = drain(s).await;
            (i, Some((events(&chunks), err)))
        }
    });
    let ends = futures::future::join_all(runs).await;
    assert_eq!(ends.len(), N);
    let mut cuts = 0;
    for (i, end) in ends {
        let cut = i % 3 == 0;
        match end {
            None => assert!(!cut),
            Some((n, None)) => {
                assert!(!cut, "stream {i} was cut but ended cleanly");
                assert_eq!(n, 8, "stream {i}");
            }
            Some((n, Some(e))) => {
                assert!(cut, "stream {i}: unexpected {e}");
                assert_eq!(e.kind, ErrorKind::Reset);
                assert_eq!(n, i % 5 + 1, "stream {i}");
                cuts += 1;
            }
        }
    }
    assert_eq!(cuts, N / 3);
    let n = settle_in_flight(&d).await;
    let (total, errors) = n
        .iter()
        .fold((0, 0), |(t, e), n| (t + n.total, e + n.errors));
    assert_eq!((total, errors), (N as u64, cuts as u64), "{n:?}");
    let q = d.stats().await.service("svc").unwrap().queue.clone();
    assert_eq!(
        (
            q.submitted,
            q.succeeded,
            q.failed,
            q.rejected,
            q.queued,
            q.in_flight
        ),
        (N as u64, N as u64, 0, 0, 0, 0)
    );
    d.shutdown(Duration::from_secs(1)).await;
}

/// A body framed by its length streams whole, on kept-alive connections
/// that are reused: the end of a complete body is never taken for a cut.
#[actix_rt::test]
async fn a_plain_body_streams_whole_on_reused_connections() {
    init_logs();
    let b = Backend::start();
    let d = start(&[&b], 1, "");
    for i in 0..10 {
        let mut r = d
            .submit(Task::get("svc", format!("/plain/{i}")).stream(true))
            .await;
        let body = take_stream(&mut r).read_all().await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains(&format!(r#""path":"/plain/{i}""#)), "{text}");
    }
    let n = settle_in_flight(&d).await;
    assert_eq!((n[0].total, n[0].errors), (10, 0));
    d.shutdown(Duration::from_secs(1)).await;
}

/// A hedged streamed task: the first head wins, the task has one result
/// with the whole body, and every slot (the loser's too) comes back.
#[actix_rt::test]
async fn a_hedged_stream_has_one_result_and_frees_every_slot() {
    init_logs();
    let (slow, fast) = (Backend::named("slow"), Backend::named("fast"));
    slow.set_latency(Duration::from_millis(300));
    let d = start(&[&slow, &fast], 2, r#""hedge":{"after":"20ms"}"#);
    let mut hedges = 0;
    for i in 0..4 {
        let mut r = d.submit(Task::get("svc", "/sse/5/5").stream(true)).await;
        let (chunks, err) = drain(take_stream(&mut r)).await;
        assert_eq!((events(&chunks), err), (5, None), "task {i}");
        // However the race went, one answer and the whole body.
        assert!(r.attempts.len() <= 2, "task {i}: {:?}", r.attempts);
        hedges += r.attempts.iter().filter(|a| a.hedge).count();
    }
    settle_in_flight(&d).await;
    let q = d.stats().await.service("svc").unwrap().queue.clone();
    assert_eq!(
        (q.submitted, q.succeeded, q.failed, q.rejected, q.in_flight),
        (4, 4, 0, 0, 0)
    );
    // Round robin sends a task to the slow node first at least every
    // other time, and its head comes 300 ms later: hedges went out (none
    // would with hedging off), each listed in its task's attempts.
    assert!(q.hedged > 0, "{q:?}");
    assert_eq!(q.hedged as usize, hedges, "{q:?}");
    d.shutdown(Duration::from_secs(1)).await;
}

/// A transport without streaming of its own (a stand-in, as benchmarks
/// plug) still serves streamed tasks: its buffered body is one chunk.
#[actix_rt::test]
async fn a_transport_without_streaming_gives_its_body_as_one_chunk() {
    use actix_dispatch::transport::{HttpReply, HttpRequest, Transport, TransportError};
    use futures::future::LocalBoxFuture;
    use std::rc::Rc;
    use std::sync::Arc;

    struct Fixed;
    impl Transport for Fixed {
        fn send(
            &self,
            _req: HttpRequest,
        ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
            Box::pin(std::future::ready(Ok(
                HttpReply::new(200).with_body(Bytes::from_static(b"all at once"))
            )))
        }
    }
    init_logs();
    let b = Backend::start(); // only its address is used
    let d = Dispatcher::builder(config("round_robin", &[(&b, 1, 2)], ""))
        .transport(Arc::new(|_: &str| Rc::new(Fixed) as Rc<dyn Transport>))
        .start()
        .unwrap();
    let mut r = d.submit(Task::get("svc", "/x").stream(true)).await;
    let (chunks, err) = drain(take_stream(&mut r)).await;
    assert_eq!(
        (chunks, err),
        (vec![Bytes::from_static(b"all at once")], None)
    );
    settle_in_flight(&d).await;
    assert_eq!(b.hits(), 0);
    d.shutdown(Duration::from_secs(1)).await;
}

/// A body that stalls longer than the attempt timeout between chunks ends
/// with a `Timeout` item, a node failure (the backend waits 3 s between
/// its two events; the timeout is 0.5 s).
#[actix_rt::test]
async fn a_stalled_stream_ends_with_a_timeout_item() {
    init_logs();
    let b = Backend::start();
    let d = start(&[&b], 2, "");
    let task = Task::get("svc", "/sse/2/3000")
        .timeout(Duration::from_millis(500))
        .stream(true);
    let mut r = d.submit(task).await;
    let (chunks, err) = drain(take_stream(&mut r)).await;
    assert_eq!(events(&chunks), 1);
    let err = err.expect("a stall ends with an error item");
    assert_eq!(err.kind, ErrorKind::Timeout, "{err}");
    assert_eq!(b.sse_sent(), 1, "the second event came after the stall");
    let n = settle_in_flight(&d).await;
    assert_eq!((n[0].total, n[0].errors), (1, 1), "{:?}", n[0]);
    d.shutdown(Duration::from_secs(1)).await;
}
