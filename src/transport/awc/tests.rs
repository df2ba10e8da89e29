//! Classification of awc's errors, and the body limit at the head.

use super::*;
use std::io;

fn kind(e: SendRequestError, reused: bool, one_write: bool) -> ErrorKind {
    classify_send(e, reused, one_write).kind
}

#[test]
fn closed_before_the_answer_is_not_sent_only_on_a_reused_connection() {
    let eof = || SendRequestError::Connect(ConnectError::Disconnected);
    let reset =
        || SendRequestError::Response(io::Error::from(io::ErrorKind::ConnectionReset).into());
    assert_eq!(kind(eof(), true, true), ErrorKind::NotSent);
    assert_eq!(kind(eof(), false, true), ErrorKind::Reset);
    assert_eq!(kind(reset(), true, false), ErrorKind::NotSent);
    assert_eq!(kind(reset(), false, true), ErrorKind::Reset);
    // A garbled answer is the node's doing, reused or not.
    let bytes = vec![0xff_u8];
    let utf8 = std::str::from_utf8(&bytes).unwrap_err();
    assert_eq!(
        kind(SendRequestError::Response(utf8.into()), true, true),
        ErrorKind::Reset
    );
}

#[test]
fn a_failed_write_is_not_sent_when_nothing_can_have_left() {
    let write = || SendRequestError::Send(io::Error::from(io::ErrorKind::BrokenPipe));
    assert_eq!(kind(write(), false, true), ErrorKind::NotSent);
    assert_eq!(kind(write(), true, false), ErrorKind::NotSent);
    assert_eq!(kind(write(), false, false), ErrorKind::Reset);
}

#[test]
fn connect_errors_and_timeouts_keep_their_kinds() {
    let refused = SendRequestError::Connect(ConnectError::Io(io::Error::from(
        io::ErrorKind::ConnectionRefused,
    )));
    assert_eq!(kind(refused, false, true), ErrorKind::Connect);
    assert_eq!(
        kind(
            SendRequestError::Connect(ConnectError::Timeout),
            false,
            true
        ),
        ErrorKind::Connect
    );
    assert_eq!(
        kind(SendRequestError::Timeout, true, true),
        ErrorKind::Timeout
    );
}

#[actix_rt::test]
async fn a_declared_length_over_max_body_fails_before_the_body() {
    use std::io::{Read, Write};
    // A server that announces more than `max_body` and sends none of it,
    // then waits for the client to close.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0_u8; 1024];
        let _ = conn.read(&mut buf);
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
            .unwrap();
        while conn.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    let transport = AwcTransport::new(Duration::from_secs(1));
    let req = HttpRequest {
        method: awc::http::Method::GET,
        url: format!("http://{addr}/big"),
        headers: Vec::new(),
        body: Bytes::new(),
        timeout: Duration::from_secs(5),
        max_body: 1024,
    };
    let sent = tokio::time::timeout(Duration::from_secs(5), transport.send(req)).await;
    let err = sent.expect("refused at the head").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Body);
    drop(transport);
    server.join().unwrap();
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
    assert_eq!(
        classify_payload(PayloadError::Io(io::Error::from(
            io::ErrorKind::ConnectionReset
        )))
        .kind,
        ErrorKind::Reset
    );
}
