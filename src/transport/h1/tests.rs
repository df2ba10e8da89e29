//! The HTTP/1 path: its classification of failures, and its pool against
//! real sockets (a scripted HTTP/1.1 server on a thread of its own, which
//! counts the connections it accepted and the requests it read).

use super::body::classify_payload;
use super::*;
use crate::outcome::ErrorKind;
use crate::transport::{AwcTransport, Transport};
use ::awc::http::Method;
use actix_http::error::PayloadError;
use futures::StreamExt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

// === classification ===

#[test]
fn closed_before_the_answer_is_not_sent_only_on_a_reused_connection() {
    let reset = || Failure::Read(io::Error::from(io::ErrorKind::ConnectionReset));
    assert_eq!(kind(&Failure::Eof, true, true, false), ErrorKind::NotSent);
    assert_eq!(kind(&Failure::Eof, false, true, false), ErrorKind::Reset);
    assert_eq!(kind(&reset(), true, false, false), ErrorKind::NotSent);
    assert_eq!(kind(&reset(), false, true, false), ErrorKind::Reset);
    // Part of the answer's head came: the server read the request.
    assert_eq!(kind(&Failure::Eof, true, true, true), ErrorKind::Reset);
    assert_eq!(kind(&reset(), true, true, true), ErrorKind::Reset);
    // A garbled answer is the node's doing, reused or not.
    assert_eq!(
        kind(&Failure::Garbled(ParseError::Status), true, true, false),
        ErrorKind::Reset
    );
}

#[test]
fn a_failed_write_is_not_sent_when_nothing_can_have_left() {
    let write = || Failure::Write(io::Error::from(io::ErrorKind::BrokenPipe));
    assert_eq!(kind(&write(), false, true, false), ErrorKind::NotSent);
    assert_eq!(kind(&write(), true, false, false), ErrorKind::NotSent);
    assert_eq!(kind(&write(), false, false, false), ErrorKind::Reset);
}

#[test]
fn payload_errors_split_body_from_reset() {
    assert_eq!(
        classify_payload(PayloadError::Overflow).kind,
        ErrorKind::Body
    );
    assert_eq!(
        classify_payload(PayloadError::Incomplete(None)).kind,
        ErrorKind::Reset
    );
    let bad_size = || io::Error::new(io::ErrorKind::InvalidInput, "Invalid chunk size line");
    for e in [
        PayloadError::Incomplete(Some(bad_size())),
        PayloadError::Io(bad_size()),
    ] {
        let e = classify_payload(e);
        assert_eq!(e.kind, ErrorKind::Reset);
        assert!(e.detail.starts_with("a malformed chunked body"), "{e}");
    }
    assert_eq!(
        classify_payload(PayloadError::Io(io::Error::from(
            io::ErrorKind::ConnectionReset
        )))
        .kind,
        ErrorKind::Reset
    );
}

// === a scripted server ===

/// An HTTP/1.1 server answering by path:
/// - `/ok`: 200, `hello`, kept alive;
/// - `/big`: 200 with a body of 200 000 bytes;
/// - `/huge`: announces 1 000 000 bytes and sends none;
/// - `/stall`: announces 10 bytes, sends 3, and waits;
/// - `/cut`: announces 100 bytes, sends 10, and closes;
/// - `/chunked-cut`: one chunk, then closes;
/// - `/close-after`: 200 `bye` (keep-alive said), then closes;
/// - `/drop`: closes without answering;
/// - `/http10`: an HTTP/1.0 answer ended by the close;
/// - `/early-hints`: a `103` before its 200;
/// - `/refuse-expect`: 417 to an `Expect` request, its body unread;
/// - `/interim-expect`: to an `Expect` request, a `103` that declares a
///   body, then `100 Continue`, then the body echoed.
///
/// A request with `Expect: 100-continue` gets `100 Continue` before its
/// body is read.
struct Server {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, r, s) = (accepted.clone(), requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                std::thread::spawn(move || serve(conn, &r));
            }
        });
        Server {
            addr,
            accepted,
            requests,
            stop,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves one connection until the client closes it or a path says to.
fn serve(mut conn: TcpStream, requests: &AtomicUsize) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_until_head(&mut conn, &mut buf) else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end);
        let path = head.split(' ').nth(1).unwrap_or("").to_owned();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let expect = head.contains("\r\nexpect: 100-continue");
        requests.fetch_add(1, Ordering::SeqCst);
        if expect {
            if path == "/refuse-expect" {
                let _ =
                    conn.write_all(b"HTTP/1.1 417 Expectation Failed\r\ncontent-length: 0\r\n\r\n");
                // The body was never asked for: wait for the close.
                while conn.read(&mut [0; 64]).is_ok_and(|n| n > 0) {}
                return;
            }
            if path == "/interim-expect" {
                // An interim answer that declares a body, before the 100.
                let _ = conn.write_all(b"HTTP/1.1 103 Early Hints\r\ncontent-length: 7\r\n\r\n");
            }
            let _ = conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        while buf.len() < length {
            let mut chunk = [0_u8; 4096];
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..length).collect();
        let ok = |b: &[u8]| {
            let mut r =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", b.len()).into_bytes();
            r.extend_from_slice(b);
            r
        };
        let (answer, then_close): (Vec<u8>, bool) = match path.as_str() {
            "/ok" => (ok(b"hello"), false),
            "/echo" | "/interim-expect" => (ok(&body), false),
            "/big" => (ok(&vec![b'x'; 200_000]), false),
            "/huge" => (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n".to_vec(),
                false,
            ),
            "/stall" => (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(),
                false,
            ),
            "/cut" => (
                [
                    &b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"[..],
                    &[b'y'; 10],
                ]
                .concat(),
                true,
            ),
            "/chunked-cut" => (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
                true,
            ),
            "/close-after" => (ok(b"bye"), true),
            "/drop" => (Vec::new(), true),
            "/http10" => (b"HTTP/1.0 200 OK\r\n\r\nto the end".to_vec(), true),
            "/early-hints" => (
                [
                    &b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"[..],
                    &ok(b"final"),
                ]
                .concat(),
                false,
            ),
            _ => (
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
                false,
            ),
        };
        if conn.write_all(&answer).is_err() {
            return;
        }
        if then_close {
            let _ = conn.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// Reads into `buf` until it holds a whole head; the head's length with
/// its blank line. `None` at the client's close.
fn read_until_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i + 4);
        }
        let mut chunk = [0_u8; 4096];
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn get(url: String) -> HttpRequest {
    HttpRequest {
        method: Method::GET,
        url,
        headers: Vec::new(),
        body: Bytes::new(),
        timeout: Duration::from_secs(5),
        max_body: 1 << 20,
    }
}

fn transport(keep_alive: Duration) -> (AwcTransport, H1Pool) {
    let t = AwcTransport::new(Duration::from_secs(1));
    t.configure(&ConnectionSettings {
        keep_alive,
        ..Default::default()
    });
    let pool = t.h1_pool();
    (t, pool)
}

/// Sends with a bound, so that a hang fails the test rather than stalls it.
async fn send(t: &AwcTransport, req: HttpRequest) -> Result<HttpReply, TransportError> {
    tokio::time::timeout(Duration::from_secs(10), t.send(req))
        .await
        .expect("answered within 10 s")
}

fn text(r: &HttpReply) -> &str {
    std::str::from_utf8(&r.body).unwrap()
}

// === the pool ===

#[actix_rt::test]
async fn a_connection_is_reused() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    for _ in 0..3 {
        let r = send(&t, get(srv.url("/ok"))).await.unwrap();
        assert_eq!((r.status, text(&r)), (200, "hello"));
        assert_eq!(r.protocol, Some(Protocol::Http1));
        assert_eq!(pool.idle(), 1);
    }
    // A large body read to its end gives its connection back too.
    let r = send(&t, get(srv.url("/big"))).await.unwrap();
    assert_eq!(r.body.len(), 200_000);
    assert_eq!((srv.accepted(), srv.requests(), pool.idle()), (1, 4, 1));
}

#[actix_rt::test]
async fn concurrent_requests_each_get_a_connection_and_all_are_kept() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let sends = (0..4).map(|_| send(&t, get(srv.url("/ok"))));
    for r in futures::future::join_all(sends).await {
        assert_eq!(text(&r.unwrap()), "hello");
    }
    assert_eq!((srv.accepted(), pool.idle()), (4, 4));
    // Then one at a time: the last to go idle serves them all.
    for _ in 0..3 {
        send(&t, get(srv.url("/ok"))).await.unwrap();
    }
    assert_eq!((srv.accepted(), srv.requests(), pool.idle()), (4, 7, 4));
}

#[actix_rt::test]
async fn an_idle_connection_past_keep_alive_is_not_reused() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_millis(50));
    send(&t, get(srv.url("/ok"))).await.unwrap();
    assert_eq!(pool.idle(), 1);
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    send(&t, get(srv.url("/ok"))).await.unwrap();
    assert_eq!((srv.accepted(), pool.idle()), (2, 1), "a new connection");
}

#[actix_rt::test]
async fn keep_alive_zero_reuses_nothing() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::ZERO);
    for _ in 0..3 {
        send(&t, get(srv.url("/ok"))).await.unwrap();
        assert_eq!(pool.idle(), 0);
    }
    assert_eq!(srv.accepted(), 3);
}

#[actix_rt::test]
async fn a_connection_past_max_connection_age_is_not_reused() {
    let srv = Server::start();
    let t = AwcTransport::new(Duration::from_secs(1));
    t.configure(&ConnectionSettings {
        keep_alive: Duration::from_secs(10),
        max_connection_age: Duration::from_millis(50),
        ..Default::default()
    });
    send(&t, get(srv.url("/ok"))).await.unwrap();
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    send(&t, get(srv.url("/ok"))).await.unwrap();
    assert_eq!(srv.accepted(), 2);
}

#[actix_rt::test]
async fn a_half_read_body_closes_its_connection() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    // A streamed body dropped after its first chunk.
    let streamed = t.send_streaming(get(srv.url("/big")));
    let mut reply = tokio::time::timeout(Duration::from_secs(10), streamed)
        .await
        .unwrap()
        .unwrap();
    let first = reply.body.next().await.unwrap().unwrap();
    assert!(!first.is_empty() && first.len() < 200_000);
    drop(reply);
    assert_eq!(pool.idle(), 0, "not pooled");
    // An attempt dropped mid-body (its timeout).
    let cut = tokio::time::timeout(Duration::from_millis(200), t.send(get(srv.url("/stall"))));
    assert!(cut.await.is_err(), "the stalled body never ends");
    assert_eq!(pool.idle(), 0, "not pooled");
    send(&t, get(srv.url("/ok"))).await.unwrap();
    assert_eq!((srv.accepted(), pool.idle()), (3, 1));
}

#[actix_rt::test]
async fn a_server_closing_an_idle_connection_does_not_cost_the_next_request() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    // The server says nothing of closing, then closes.
    let r = send(&t, get(srv.url("/close-after"))).await.unwrap();
    assert_eq!(text(&r), "bye");
    assert_eq!(pool.idle(), 1);
    // Time for its FIN to arrive; the connection is then found closed
    // before reuse. Had the FIN not been seen yet, the request would fail
    // as not sent, which the engine retries whatever the method.
    actix_rt::time::sleep(Duration::from_millis(50)).await;
    let r = match send(&t, get(srv.url("/ok"))).await {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::NotSent, "{e}");
            send(&t, get(srv.url("/ok"))).await.unwrap()
        }
    };
    assert_eq!(text(&r), "hello");
    assert_eq!(srv.accepted(), 2);
}

#[actix_rt::test]
async fn eof_before_the_answer_is_not_sent_on_a_reused_connection_only() {
    let srv = Server::start();
    let (t, _pool) = transport(Duration::from_secs(10));
    // A new connection: ambiguous.
    let e = send(&t, get(srv.url("/drop"))).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Reset, "{e}");
    assert!(e.detail.contains("new connection"), "{e}");
    // A reused one: the race with a server closing it.
    send(&t, get(srv.url("/ok"))).await.unwrap();
    let e = send(&t, get(srv.url("/drop"))).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotSent, "{e}");
    assert!(e.detail.contains("reused connection"), "{e}");
    assert_eq!(srv.accepted(), 2);
}

#[actix_rt::test]
async fn a_connect_failure_is_connect() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (t, _pool) = transport(Duration::from_secs(10));
    let e = send(&t, get(format!("http://127.0.0.1:{port}/")))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Connect, "{e}");
}

// === bodies ===

#[actix_rt::test]
async fn a_declared_length_over_max_body_fails_before_the_body() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let mut req = get(srv.url("/huge"));
    req.max_body = 1024;
    let e = send(&t, req).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Body);
    assert_eq!(pool.idle(), 0);
    // And a body that passes the limit as it comes.
    let mut req = get(srv.url("/big"));
    req.max_body = 100_000;
    let e = send(&t, req).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Body);
    assert!(e.detail.contains("max_body (100000 bytes)"), "{e}");
}

#[actix_rt::test]
async fn a_framed_body_cut_by_the_close_is_reset() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    for path in ["/cut", "/chunked-cut"] {
        let e = send(&t, get(srv.url(path))).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Reset, "{path}: {e}");
        let streamed = t.send_streaming(get(srv.url(path))).await.unwrap();
        let items: Vec<_> = streamed.body.collect().await;
        let (last, chunks) = items.split_last().unwrap();
        assert!(chunks.iter().all(Result::is_ok), "{path}");
        assert_eq!(
            last.as_ref().unwrap_err().kind,
            ErrorKind::Reset,
            "{path}: the stream ends in an error"
        );
    }
    assert_eq!(pool.idle(), 0);
}

#[actix_rt::test]
async fn an_http10_body_ends_at_the_close() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let r = send(&t, get(srv.url("/http10"))).await.unwrap();
    assert_eq!(text(&r), "to the end");
    let streamed = t.send_streaming(get(srv.url("/http10"))).await.unwrap();
    let items: Vec<_> = streamed.body.collect().await;
    assert!(items.iter().all(Result::is_ok));
    assert_eq!(pool.idle(), 0);
}

#[actix_rt::test]
async fn a_streamed_body_read_to_its_end_gives_its_connection_back() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let streamed = t.send_streaming(get(srv.url("/big"))).await.unwrap();
    let mut len = 0;
    for chunk in streamed.body.collect::<Vec<_>>().await {
        len += chunk.unwrap().len();
    }
    assert_eq!(len, 200_000);
    assert_eq!(pool.idle(), 1);
    send(&t, get(srv.url("/ok"))).await.unwrap();
    assert_eq!(srv.accepted(), 1);
}

#[actix_rt::test]
async fn a_body_and_headers_reach_the_server() {
    let srv = Server::start();
    let (t, _pool) = transport(Duration::from_secs(10));
    let mut req = get(srv.url("/echo"));
    req.method = Method::POST;
    req.body = Bytes::from(vec![b'z'; 20_000]);
    let r = send(&t, req).await.unwrap();
    assert_eq!(r.body.len(), 20_000);
}

#[actix_rt::test]
async fn informational_answers_before_the_final_one_are_skipped() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let r = send(&t, get(srv.url("/early-hints"))).await.unwrap();
    assert_eq!((r.status, text(&r)), (200, "final"));
    assert_eq!(pool.idle(), 1);
}

#[actix_rt::test]
async fn expect_continue_sends_the_body_only_when_asked() {
    let srv = Server::start();
    let (t, pool) = transport(Duration::from_secs(10));
    let expect = |path: &str, body: &'static [u8]| {
        let mut req = get(srv.url(path));
        req.method = Method::POST;
        req.headers
            .push((EXPECT, HeaderValue::from_static("100-continue")));
        req.body = Bytes::from_static(body);
        req
    };
    let r = send(&t, expect("/echo", b"payload")).await.unwrap();
    assert_eq!((r.status, text(&r)), (200, "payload"));
    assert_eq!(pool.idle(), 1);
    // An interim answer before the 100, declaring a body it cannot have:
    // skipped, and the body still goes after the 100.
    let r = send(&t, expect("/interim-expect", b"payload"))
        .await
        .unwrap();
    assert_eq!((r.status, text(&r)), (200, "payload"));
    assert_eq!(pool.idle(), 1);
    // Refused: the final answer, and a connection out of step is not kept.
    let r = send(&t, expect("/refuse-expect", b"payload"))
        .await
        .unwrap();
    assert_eq!(r.status, 417);
    assert_eq!(pool.idle(), 0);
    // Without a body, refused before anything is sent.
    let e = send(&t, expect("/echo", b"")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
    assert_eq!(srv.requests(), 3);
}
