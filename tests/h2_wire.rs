//! HTTP/2 faults on the engine's own path (issue 33), over h2c with
//! `prior_knowledge`: a server's `GOAWAY` and `REFUSED_STREAM` mean the
//! request was not processed (retried as `NotSent`, even a POST), an
//! answer's header list over 128 KiB fails its attempt without harming the
//! connection, and a dropped attempt resets only its own stream.
//!
//! Two backends on 127.0.0.1, each on a thread of its own: [`Frames`]
//! writes HTTP/2 frames byte for byte (a `GOAWAY` whose last stream is
//! before the request's, a `RST_STREAM` at a chosen moment), and [`H2`] is
//! the h2 crate's server, for answers whose size or timing matters.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix_dispatch::{
    AttemptOutcome, Config, Dispatcher, ErrorKind, Method, Outcome, Protocol, Task, TaskResult,
};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::wait::wait_for;

/// Starts `serve` for each connection accepted on 127.0.0.1, on a thread
/// with a runtime of its own; the address, and the count of connections.
fn listen<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream, usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            while let Ok((conn, _)) = listener.accept().await {
                let n = a.fetch_add(1, Ordering::SeqCst);
                tokio::task::spawn_local(serve(conn, n));
            }
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).expect("started");
    (addr, accepted)
}

/// A dispatcher of one service `svc` speaking h2c to `addr`: `slots`
/// attempts at once over one connection, `retries` retries with a short
/// backoff, no breaker.
fn dispatcher(addr: SocketAddr, slots: u32, retries: u32) -> Dispatcher {
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","timeout":"3s",
            "keep_alive":"30s",
            "endpoints":[{{"address":"http://{addr}/","max_concurrent":{slots}}}],
            "http2":{{"prior_knowledge":true,"connections":1}},
            "retry":{{"max_retries":{retries},"backoff_base":"1ms","backoff_max":"5ms"}},
            "breaker":{{"enabled":false}}}}]}}"#
    );
    let cfg = Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    Dispatcher::start(cfg).expect("inside a System")
}

fn body(r: &TaskResult) -> &str {
    let resp = r
        .response()
        .unwrap_or_else(|| panic!("no answer: {:?}", r.outcome));
    std::str::from_utf8(&resp.body).expect("UTF-8")
}

fn attempt_error(r: &TaskResult, i: usize) -> (ErrorKind, String) {
    let a = &r.attempts[i];
    let AttemptOutcome::Error(kind) = a.outcome else {
        panic!("attempt {i} is not an error: {a:?}");
    };
    (kind, a.error.as_deref().unwrap_or("").to_owned())
}

// === a server of raw frames ===

/// What the raw server does with a request.
#[derive(Debug, Clone, Copy)]
enum Raw {
    /// `200` with this body, once the request's end came.
    Answer(&'static str),
    /// `RST_STREAM REFUSED_STREAM` at once (RFC 9113 §8.7: not processed).
    Refuse,
    /// `GOAWAY` whose last stream is the one before this request's (§6.8:
    /// this one was not processed), then nothing more.
    GoAway,
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A backend of raw frames: the `k`th request on connection `n` gets
/// `script(n, k)`.
struct Frames {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Frames {
    fn start(script: fn(usize, usize) -> Raw) -> Frames {
        let (addr, accepted) = listen(move |conn, n| serve_frames(conn, n, script));
        Frames { addr, accepted }
    }
}

async fn serve_frames(mut conn: TcpStream, n: usize, script: fn(usize, usize) -> Raw) {
    let mut preface = [0_u8; 24];
    if conn.read_exact(&mut preface).await.is_err() {
        return;
    }
    if conn.write_all(&frame(SETTINGS, 0, 0, &[])).await.is_err() {
        return;
    }
    let mut k = 0;
    // Streams answered once their request ends.
    let mut waiting: Vec<(u32, &'static str)> = Vec::new();
    loop {
        let mut head = [0_u8; 9];
        if conn.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0_u8; len];
        if conn.read_exact(&mut payload).await.is_err() {
            return;
        }
        let mut out = Vec::new();
        match kind {
            SETTINGS if flags & ACK == 0 => out = frame(SETTINGS, ACK, 0, &[]),
            HEADERS => {
                let todo = script(n, k);
                k += 1;
                match todo {
                    Raw::Answer(body) => waiting.push((stream, body)),
                    Raw::Refuse => out = frame(RST_STREAM, 0, stream, &7_u32.to_be_bytes()),
                    Raw::GoAway => {
                        let last = stream.saturating_sub(2);
                        let mut p = last.to_be_bytes().to_vec();
                        p.extend_from_slice(&0_u32.to_be_bytes());
                        out = frame(GOAWAY, 0, 0, &p);
                    }
                }
            }
            _ => {}
        }
        if (kind == HEADERS || kind == DATA) && flags & END_STREAM != 0 {
            if let Some(i) = waiting.iter().position(|(s, _)| *s == stream) {
                let (s, body) = waiting.remove(i);
                // `:status: 200` is entry 8 of HPACK's static table.
                out.extend(frame(HEADERS, END_HEADERS, s, &[0x88]));
                out.extend(frame(DATA, END_STREAM, s, body.as_bytes()));
            }
        }
        if !out.is_empty() && conn.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// A server's GOAWAY that leaves a request's stream out: the request was
/// not processed, so even a POST goes again, on a new connection.
#[actix_rt::test]
async fn a_stream_past_a_goaway_is_retried_as_not_sent() {
    let b = Frames::start(|conn, _| match conn {
        0 => Raw::GoAway,
        _ => Raw::Answer("for /post"),
    });
    let d = dispatcher(b.addr, 1, 1);
    let post = Task::new("svc", Method::POST, "/post")
        .body("payload")
        .idempotent(false);
    let r = d.submit(post).await;
    assert_eq!(body(&r), "for /post", "{:?}", r.attempts);
    assert_eq!(r.attempts.len(), 2);
    let (kind, words) = attempt_error(&r, 0);
    assert_eq!(kind, ErrorKind::NotSent, "{words}");
    assert!(words.contains("GOAWAY"), "{words}");
    assert_eq!(r.attempts[1].protocol, Some(Protocol::H2));
    assert_eq!(b.accepted.load(Ordering::SeqCst), 2);
    d.shutdown(Duration::ZERO).await;
}

/// `REFUSED_STREAM` from the server: not processed, retried (a POST too),
/// on the same connection.
#[actix_rt::test]
async fn a_refused_stream_is_retried_as_not_sent_on_the_same_connection() {
    let b = Frames::start(|_, k| match k {
        0 => Raw::Refuse,
        _ => Raw::Answer("for /post"),
    });
    let d = dispatcher(b.addr, 1, 1);
    let post = Task::new("svc", Method::POST, "/post")
        .body("payload")
        .idempotent(false);
    let r = d.submit(post).await;
    assert_eq!(body(&r), "for /post", "{:?}", r.attempts);
    let (kind, words) = attempt_error(&r, 0);
    assert_eq!(kind, ErrorKind::NotSent, "{words}");
    assert!(words.contains("refused by the server"), "{words}");
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1);
    d.shutdown(Duration::ZERO).await;
}

// === the h2 crate's server ===

/// A backend on the h2 crate's server, answering by path:
/// - `/big-head`: `200` with 18 headers of 10 000 bytes each (about
///   180 KB decoded, about 113 KB as HPACK sends it);
/// - `/slow`: no answer; the reason of the stream's reset is kept;
/// - `/fast`: `200 for /fast` after 300 ms;
/// - `/late`: `200 for /late` after 1 s, counted in `late_done` once sent
///   whole (a stream reset before then is not);
/// - anything else: `200 for {path}`.
struct H2 {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    resets: Arc<Mutex<Vec<String>>>,
    late_done: Arc<AtomicUsize>,
}

impl H2 {
    fn start() -> H2 {
        let resets = Arc::new(Mutex::new(Vec::new()));
        let late_done = Arc::new(AtomicUsize::new(0));
        let (r, l) = (resets.clone(), late_done.clone());
        let (addr, accepted) = listen(move |conn, _| serve_h2(conn, r.clone(), l.clone()));
        H2 {
            addr,
            accepted,
            resets,
            late_done,
        }
    }

    fn resets(&self) -> Vec<String> {
        self.resets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve_h2(conn: TcpStream, resets: Arc<Mutex<Vec<String>>>, late: Arc<AtomicUsize>) {
    let Ok(mut h2) = h2::server::handshake(conn).await else {
        return;
    };
    while let Some(Ok((req, respond))) = h2.accept().await {
        let path = req.uri().path().to_owned();
        tokio::task::spawn_local(answer(path, respond, resets.clone(), late.clone()));
    }
}

async fn answer(
    path: String,
    mut respond: h2::server::SendResponse<Bytes>,
    resets: Arc<Mutex<Vec<String>>>,
    late: Arc<AtomicUsize>,
) {
    let _ = match path.as_str() {
        "/big-head" => {
            let mut res = http::Response::builder();
            for i in 0..18 {
                res = res.header(format!("x-big-{i}"), "a".repeat(10_000));
            }
            respond
                .send_response(res.body(()).expect("a response"), true)
                .map(drop)
        }
        "/slow" => {
            let reset = std::future::poll_fn(|cx| respond.poll_reset(cx));
            let why = match tokio::time::timeout(Duration::from_secs(10), reset).await {
                Ok(Ok(reason)) => format!("{reason:?}"),
                Ok(Err(e)) => format!("error: {e}"),
                Err(_) => "never reset".to_owned(),
            };
            resets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(why);
            Ok(())
        }
        "/fast" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ok(&mut respond, "for /fast")
        }
        "/late" => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let sent = ok(&mut respond, "for /late");
            if sent.is_ok() {
                late.fetch_add(1, Ordering::SeqCst);
            }
            sent
        }
        _ => ok(&mut respond, &format!("for {path}")),
    };
}

fn ok(respond: &mut h2::server::SendResponse<Bytes>, body: &str) -> Result<(), h2::Error> {
    let mut send = respond.send_response(http::Response::new(()), false)?;
    send.send_data(Bytes::copy_from_slice(body.as_bytes()), true)
}

/// h2's default would take a header list of 16 MiB; the engine takes what
/// its HTTP/1 path takes for a head, 128 KiB. Past it the attempt fails
/// (its stream refused by h2, the node's doing) and the connection serves
/// the next request.
#[actix_rt::test]
async fn an_answer_whose_header_list_is_over_128_kib_fails_its_attempt_only() {
    let b = H2::start();
    let d = dispatcher(b.addr, 1, 0);
    let r = d.submit(Task::get("svc", "/big-head")).await;
    assert!(
        matches!(r.outcome, Outcome::Failure(_)),
        "not a failure: an answer of status {:?}",
        r.response().map(|a| a.status)
    );
    let (kind, words) = attempt_error(&r, 0);
    assert_eq!(kind, ErrorKind::Reset, "{words}");
    assert!(words.contains("header list is over 128 KiB"), "{words}");
    let r = d.submit(Task::get("svc", "/next")).await;
    assert_eq!(body(&r), "for /next");
    assert_eq!(r.attempts[0].protocol, Some(Protocol::H2));
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1, "the same connection");
    d.shutdown(Duration::ZERO).await;
}

/// An attempt dropped by its timeout resets its own stream (`CANCEL`); the
/// stream beside it on the same connection completes.
#[actix_rt::test]
async fn a_dropped_attempt_resets_only_its_own_stream() {
    let b = H2::start();
    let d = dispatcher(b.addr, 2, 0);
    let slow = d.submit(Task::get("svc", "/slow").timeout(Duration::from_millis(100)));
    let fast = d.submit(Task::get("svc", "/fast"));
    let (slow, fast) = futures::join!(slow, fast);
    let (kind, words) = attempt_error(&slow, 0);
    assert_eq!(kind, ErrorKind::Timeout, "{words}");
    assert_eq!(body(&fast), "for /fast");
    wait_for("the slow stream's reset", || !b.resets().is_empty()).await;
    assert_eq!(b.resets(), ["CANCEL"]);
    let r = d.submit(Task::get("svc", "/next")).await;
    assert_eq!(body(&r), "for /next");
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1, "one connection");
    d.shutdown(Duration::ZERO).await;
}

/// An attempt cut by its task's deadline answers the task at once but keeps
/// its stream open and its slot taken until the backend answers (the
/// backend is still working on it): the stream is not reset, its answer
/// arrives whole, and only then is the node's one slot free.
#[actix_rt::test]
async fn a_cut_attempt_keeps_its_stream_and_slot_until_the_answer() {
    let b = H2::start();
    let d = dispatcher(b.addr, 1, 0);
    let cut = d
        .submit(Task::get("svc", "/late").deadline_in(Duration::from_millis(100)))
        .await;
    let (kind, words) = attempt_error(&cut, 0);
    assert_eq!(kind, ErrorKind::Deadline, "{words}");
    // Answered at 100 ms, the backend answers at 1 s: the slot is held.
    let s = d.stats().await;
    assert_eq!(s.services[0].nodes[0].in_flight, 1);
    let next = d.submit(Task::get("svc", "/next")).await;
    assert_eq!(body(&next), "for /next");
    // The next task went out once the late answer had come, whole.
    assert_eq!(b.late_done.load(Ordering::SeqCst), 1);
    assert!(b.resets().is_empty(), "{:?}", b.resets());
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1, "one connection");
    d.shutdown(Duration::ZERO).await;
}
