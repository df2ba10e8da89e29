//! HTTP/2 with the node's requests multiplexed as streams over one
//! connection (or the few of `http2.connections`).
//!
//! awc's pool lends a connection to one request at a time, HTTP/2 or not,
//! so on its own it opens a connection per concurrent request: ten for a
//! node with `max_concurrent` 10. This module keeps a node's HTTP/2
//! connections itself, with the `h2` crate (already in awc's tree):
//!
//! - An `https://` endpoint's first connection is made here (TCP, rustls
//!   with ALPN `h2` then `http/1.1`). If the server chose `h2`, the
//!   connection is kept and every later request of the node is a stream on
//!   it; requests that come while it is being made wait for it rather than
//!   open their own. If the server chose `http/1.1`, the node's requests
//!   go over its HTTP/1 pool (module `h1`) from then on, and that first
//!   connection is handed to it.
//! - An `http://` endpoint speaks h2c (HTTP/2 without TLS, "prior
//!   knowledge") only when `http2.prior_knowledge` says so; otherwise the
//!   node's HTTP/1 pool speaks HTTP/1.1 to it.
//! - With `http2.connections` above 1, a new connection is opened only when
//!   every open one has a stream in flight and none is being made, so an
//!   idle node keeps one. A stream goes on the connection with the fewest.
//! - A connection is not used again once it is older than
//!   `max_connection_age`, idle longer than `keep_alive`, or closed (its
//!   driver ended, a connection error, a GOAWAY); its streams in flight
//!   finish on it.
//!
//! Errors, by what they mean for a retry: a request the server refused
//! (its `RST_STREAM REFUSED_STREAM`), one on a stream past the last one a
//! server's `GOAWAY` says it processed, and one that could not be queued
//! on its connection (closed, GOAWAY) were not processed
//! ([`ErrorKind::NotSent`], RFC 9113 §8.7 and §6.8); a connection or
//! stream broken after the request left is [`ErrorKind::Reset`]; a failed
//! handshake is [`ErrorKind::Tls`] with the same words as the HTTP/1
//! path's (module `connect` makes both). Dropping an attempt (its timeout,
//! a cancel) resets its stream (`RST_STREAM CANCEL`), never the connection.
//!
//! What a server may send is bounded as on the HTTP/1 path: an answer's
//! decoded header list at most [`MAX_HEAD`] (128 KiB, where h2's default
//! is 16 MiB; a larger one fails its attempt as [`ErrorKind::Reset`], the
//! connection kept), no server push (`SETTINGS_ENABLE_PUSH` 0: a
//! `PUSH_PROMISE` is a connection error), no stream the server opens
//! (`SETTINGS_MAX_CONCURRENT_STREAMS` 0 for its side), at most
//! [`MAX_SEND_STREAMS`] of ours before the server's own limit is known,
//! and at most [`MAX_RESET_STREAMS`] streams we reset remembered at once.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

use ::awc::http::header::HeaderMap;
use ::awc::http::Uri;
use bytes::{Bytes, BytesMut};
use futures::future::{FutureExt, LocalBoxFuture, Shared};
use futures::stream::StreamExt;
use tokio::time::Instant;

use super::{ConnectionSettings, HttpReply, HttpRequest, StreamedReply, TransportError, MAX_HEAD};
use crate::outcome::{ErrorKind, Protocol};

/// Flow-control windows: a stream may have 1 MiB unread, the connection
/// 2 MiB (the h2 defaults of 64 KiB would stall a large answer on a round
/// trip per 64 KiB).
const STREAM_WINDOW: u32 = 1 << 20;
const CONN_WINDOW: u32 = 2 << 20;

/// Streams of ours open at once before the server's SETTINGS say how many
/// it takes (h2's default has no bound): RFC 9113 §6.5.2 asks servers to
/// allow at least 100.
const MAX_SEND_STREAMS: usize = 100;

/// Streams we reset (dropped attempts) whose late frames are still
/// recognised, h2's default of 10 kept explicit: a bound on what a burst of
/// timeouts leaves in memory.
const MAX_RESET_STREAMS: usize = 10;

// The words of an answer over it ([`meaning`]) name this bound.
const _: () = assert!(MAX_HEAD == 128 * 1024);

/// The node's HTTP/2 connections.
#[derive(Clone)]
pub(super) struct H2Pool {
    inner: Rc<Inner>,
}

struct Inner {
    prior_knowledge: bool,
    connect_timeout: Duration,
    keep_alive: Duration,
    max_age: Duration,
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// What an `https://` endpoint chose over ALPN, once known.
    speaks: Cell<Speaks>,
    slots: RefCell<Vec<PoolEntry>>,
    /// The connection that learnt the server chose HTTP/1.1, left for the
    /// node's HTTP/1 pool to take ([`H2Pool::take_http1`]).
    http1: RefCell<Option<super::connect::Io>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    Unknown,
    H2,
    Http1,
}

type Connecting = Shared<LocalBoxFuture<'static, Result<Option<Conn>, TransportError>>>;

/// One of the pool's connections, as far as it is made.
enum PoolEntry {
    Empty,
    /// Being made; those who wait share it. `None` when done: the server
    /// chose HTTP/1.1.
    Connecting(Connecting),
    Ready(Conn),
}

/// One HTTP/2 connection: its handle (a clone per stream) and its state.
#[derive(Clone)]
pub(super) struct Conn {
    send: h2::client::SendRequest<Bytes>,
    created: Instant,
    state: Rc<ConnState>,
}

struct ConnState {
    /// Streams in flight on it.
    streams: Cell<u32>,
    /// When its last stream ended.
    idle_since: Cell<Instant>,
    /// Closed: its driver ended or an error said so.
    dead: Cell<bool>,
}

/// What a request goes through.
pub(super) enum Route {
    /// A stream on this connection.
    H2(Conn),
    /// The node's HTTP/1 pool: the server chose HTTP/1.1.
    Http1,
}

enum Checkout {
    Ready(Conn),
    Wait(Connecting),
    Http1,
}

impl H2Pool {
    /// The pool of a node with `settings` (feature `tls`: `tls` is the
    /// node's rustls config, `None` when there is none).
    pub(super) fn new(
        settings: &ConnectionSettings,
        connect_timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Self {
        H2Pool {
            inner: Rc::new(Inner {
                prior_knowledge: settings.http2.prior_knowledge,
                connect_timeout,
                keep_alive: settings.keep_alive,
                max_age: settings.max_connection_age,
                #[cfg(feature = "tls")]
                tls,
                speaks: Cell::new(Speaks::Unknown),
                http1: RefCell::new(None),
                slots: RefCell::new(
                    (0..settings.http2.connections.max(1))
                        .map(|_| PoolEntry::Empty)
                        .collect(),
                ),
            }),
        }
    }

    /// Whether a request to `url` may go over HTTP/2 here (else over
    /// HTTP/1.1): `https://` until the server chose HTTP/1.1 (feature `tls`),
    /// `http://` with `prior_knowledge`.
    pub(super) fn takes(&self, url: &str) -> bool {
        if url.starts_with("https://") {
            cfg!(feature = "tls") && self.inner.speaks.get() != Speaks::Http1
        } else {
            self.inner.prior_knowledge && url.starts_with("http://")
        }
    }

    /// The connection on which the server chose HTTP/1.1 over ALPN, once:
    /// it is new and unused, so the HTTP/1 path may send on it.
    pub(super) fn take_http1(&self) -> Option<super::connect::Io> {
        self.inner.http1.borrow_mut().take()
    }

    /// The connection for a request to `uri`, made if need be; `Http1`
    /// when the server chose HTTP/1.1.
    pub(super) fn route(
        &self,
        uri: &Uri,
    ) -> impl std::future::Future<Output = Result<Route, TransportError>> {
        let checkout = self.checkout(uri, Instant::now());
        async move {
            match checkout {
                Checkout::Ready(c) => Ok(Route::H2(c)),
                Checkout::Http1 => Ok(Route::Http1),
                Checkout::Wait(f) => Ok(match f.await? {
                    Some(c) => Route::H2(c),
                    None => Route::Http1,
                }),
            }
        }
    }

    fn checkout(&self, uri: &Uri, now: Instant) -> Checkout {
        let inner = &self.inner;
        if inner.speaks.get() == Speaks::Http1 && uri.scheme_str() == Some("https") {
            return Checkout::Http1;
        }
        let mut slots = inner.slots.borrow_mut();
        for s in slots.iter_mut() {
            if let PoolEntry::Ready(c) = s {
                if !inner.usable(c, now) {
                    *s = PoolEntry::Empty;
                }
            }
        }
        let views: Vec<View> = slots.iter().map(PoolEntry::view).collect();
        let at = |i: usize| match &slots[i] {
            PoolEntry::Ready(c) => Some(c.clone()),
            _ => None,
        };
        match choose(&views) {
            Choice::Use(i) => at(i).map_or(Checkout::Http1, Checkout::Ready),
            Choice::Connect { at: i, meanwhile } => {
                let f = connect(Rc::downgrade(inner), i, uri.clone())
                    .boxed_local()
                    .shared();
                // Driven on its own: the request that started it may go on
                // an older connection, or be dropped.
                actix_rt::spawn(f.clone().map(drop));
                let now = meanwhile.and_then(at);
                slots[i] = PoolEntry::Connecting(f.clone());
                match now {
                    // The new one is for later streams; this one goes now.
                    Some(c) => Checkout::Ready(c),
                    None => Checkout::Wait(f),
                }
            }
            Choice::Wait(i) => match &slots[i] {
                PoolEntry::Connecting(f) => Checkout::Wait(f.clone()),
                _ => Checkout::Http1,
            },
            // No slot at all (`connections` is at least 1): answered
            // rather than asserted.
            Choice::Nothing => Checkout::Http1,
        }
    }
}

/// A slot as [`choose`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    Empty,
    Connecting,
    /// Open, with this many streams in flight.
    Ready(u32),
}

/// Where a request goes, by slot number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// On this open connection.
    Use(usize),
    /// Make a connection in slot `at`; the request goes on `meanwhile`
    /// (an open one) if any, else waits for it.
    Connect {
        at: usize,
        meanwhile: Option<usize>,
    },
    /// Wait for the connection being made there.
    Wait(usize),
    Nothing,
}

/// The rule: an idle open connection first; else, when none is being
/// made, a new one in an empty slot (one at a time, so a burst while the
/// protocol is unknown waits for the first); else the open connection with
/// the fewest streams; else the one being made.
fn choose(slots: &[View]) -> Choice {
    let least = slots
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match v {
            View::Ready(n) => Some((*n, i)),
            _ => None,
        })
        .min()
        .map(|(n, i)| (i, n));
    if let Some((i, 0)) = least {
        return Choice::Use(i);
    }
    let connecting = slots.iter().position(|v| *v == View::Connecting);
    let empty = slots.iter().position(|v| *v == View::Empty);
    match (least, connecting, empty) {
        (least, None, Some(at)) => Choice::Connect {
            at,
            meanwhile: least.map(|(i, _)| i),
        },
        (Some((i, _)), _, _) => Choice::Use(i),
        (None, Some(i), _) => Choice::Wait(i),
        (None, None, None) => Choice::Nothing,
    }
}

impl PoolEntry {
    fn view(&self) -> View {
        match self {
            PoolEntry::Empty => View::Empty,
            PoolEntry::Connecting(_) => View::Connecting,
            PoolEntry::Ready(c) => View::Ready(c.state.streams.get()),
        }
    }
}

impl Inner {
    fn usable(&self, c: &Conn, now: Instant) -> bool {
        let st = &c.state;
        !st.dead.get()
            && now.saturating_duration_since(c.created) < self.max_age
            && (st.streams.get() > 0
                || now.saturating_duration_since(st.idle_since.get()) < self.keep_alive)
    }
}

/// Makes the connection of slot `slot` and puts it there (or empties the
/// slot: an error, or a server that chose HTTP/1.1).
async fn connect(pool: Weak<Inner>, slot: usize, uri: Uri) -> Result<Option<Conn>, TransportError> {
    let r = match pool.upgrade() {
        Some(inner) => open(&inner, &uri).await,
        None => Err(TransportError::new(
            ErrorKind::Lost,
            "the node's transport is gone",
        )),
    };
    if let Some(inner) = pool.upgrade() {
        let mut slots = inner.slots.borrow_mut();
        if let Some(s) = slots.get_mut(slot) {
            *s = match &r {
                Ok(Some(c)) => PoolEntry::Ready(c.clone()),
                _ => PoolEntry::Empty,
            };
        }
        match &r {
            Ok(Some(_)) if uri.scheme_str() == Some("https") => inner.speaks.set(Speaks::H2),
            Ok(None) => {
                log::debug!(
                    "node {uri}: the server chose HTTP/1.1 over ALPN; HTTP/1.1 from now on"
                );
                inner.speaks.set(Speaks::Http1);
            }
            _ => {}
        }
    }
    r
}

/// TCP, TLS when `https` (module `connect`), then the HTTP/2 handshake;
/// `None` when the server chose HTTP/1.1 over ALPN.
async fn open(inner: &Inner, uri: &Uri) -> Result<Option<Conn>, TransportError> {
    let https = uri.scheme_str() == Some("https");
    #[cfg(feature = "tls")]
    if https && inner.tls.is_none() {
        return Ok(None);
    }
    let io = super::connect::open(
        uri,
        inner.connect_timeout,
        #[cfg(feature = "tls")]
        inner.tls.clone(),
    )
    .await?;
    if https && !io.chose_h2() {
        *inner.http1.borrow_mut() = Some(io);
        return Ok(None);
    }
    handshake(io).await.map(Some)
}

async fn handshake<T>(io: T) -> Result<Conn, TransportError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .max_header_list_size(MAX_HEAD as u32)
        .enable_push(false)
        .max_concurrent_streams(0)
        .initial_max_send_streams(MAX_SEND_STREAMS)
        .max_concurrent_reset_streams(MAX_RESET_STREAMS)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| TransportError::new(ErrorKind::Connect, format!("HTTP/2 handshake: {e}")))?;
    let now = Instant::now();
    let state = Rc::new(ConnState {
        streams: Cell::new(0),
        idle_since: Cell::new(now),
        dead: Cell::new(false),
    });
    let st = Rc::downgrade(&state);
    // The connection's driver: reads and writes its frames for every
    // stream; it ends when the connection closes.
    actix_rt::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("HTTP/2 connection closed: {e}");
        }
        if let Some(st) = st.upgrade() {
            st.dead.set(true);
        }
    });
    Ok(Conn {
        send,
        created: now,
        state,
    })
}

/// A stream in flight: counted on its connection until dropped.
struct InFlight(Rc<ConnState>);

impl InFlight {
    fn new(c: &Conn) -> Self {
        c.state.streams.set(c.state.streams.get() + 1);
        InFlight(c.state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let st = &self.0;
        st.streams.set(st.streams.get().saturating_sub(1));
        st.idle_since.set(Instant::now());
    }
}

/// The head of an answer over HTTP/2, its body to read.
struct Head {
    status: u16,
    headers: HeaderMap,
    body: h2::RecvStream,
    stream: InFlight,
}

/// Sends `req` as a stream on `conn` and waits for the answer's head.
async fn exchange(conn: Conn, req: HttpRequest) -> Result<Head, TransportError> {
    let stream = InFlight::new(&conn);
    let dead = |e: &h2::Error| {
        if e.is_io() || e.is_go_away() {
            conn.state.dead.set(true);
        }
    };
    let mut send = conn.send.clone().ready().await.map_err(|e| {
        dead(&e);
        not_sent(e)
    })?;
    let mut request = http::Request::builder()
        .method(req.method)
        .uri(req.url)
        .body(())
        .map_err(|e| TransportError::new(ErrorKind::Invalid, e.to_string()))?;
    if !req.headers.is_empty() {
        let headers = request.headers_mut();
        for (k, v) in req.headers {
            headers.append(k, v);
        }
    }
    let end = req.body.is_empty();
    let (answer, mut body) = send.send_request(request, end).map_err(|e| {
        dead(&e);
        not_sent(e)
    })?;
    if !end {
        // h2 queues it and sends it as the peer's window allows.
        body.send_data(req.body, true).map_err(|e| {
            dead(&e);
            classify(e)
        })?;
    }
    let res = answer.await.map_err(|e| {
        dead(&e);
        classify(e)
    })?;
    let (head, body) = res.into_parts();
    Ok(Head {
        status: head.status.as_u16(),
        headers: HeaderMap::from(head.headers),
        body,
        stream,
    })
}

/// Sends `req` on `conn` and reads the whole answer under `max_body`.
pub(super) async fn send(conn: Conn, req: HttpRequest) -> Result<HttpReply, TransportError> {
    let max_body = req.max_body;
    let Head {
        status,
        headers,
        mut body,
        stream,
    } = exchange(conn, req).await?;
    let declared = headers
        .get(::awc::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return Err(over(max_body));
    }
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(classify)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if buf.len() + chunk.len() > max_body {
            return Err(over(max_body));
        }
        buf.extend_from_slice(&chunk);
    }
    drop(stream);
    Ok(HttpReply {
        status,
        headers,
        body: buf.freeze(),
        protocol: Some(Protocol::H2),
    })
}

/// Sends `req` on `conn`; resolves at the head, the body a stream.
pub(super) async fn send_streaming(
    conn: Conn,
    req: HttpRequest,
) -> Result<StreamedReply, TransportError> {
    let Head {
        status,
        headers,
        body,
        stream,
    } = exchange(conn, req).await?;
    let chunks = futures::stream::unfold((body, stream), |(mut body, stream)| async move {
        let chunk = body.data().await?;
        let item = chunk.map_err(classify).inspect(|c| {
            let _ = body.flow_control().release_capacity(c.len());
        });
        Some((item, (body, stream)))
    })
    .boxed_local();
    Ok(StreamedReply {
        head: HttpReply {
            status,
            headers,
            body: Bytes::new(),
            protocol: Some(Protocol::H2),
        },
        body: chunks,
    })
}

fn over(max_body: usize) -> TransportError {
    TransportError::new(
        ErrorKind::Body,
        format!("response body over max_body ({max_body} bytes)"),
    )
}

/// An error before the request was queued on its connection: not sent.
fn not_sent(e: h2::Error) -> TransportError {
    TransportError::new(ErrorKind::NotSent, format!("HTTP/2: {e} (not sent)"))
}

/// An error after the request left, by what the server can have done
/// with the request.
fn classify(e: h2::Error) -> TransportError {
    let (kind, what) = meaning(e.reason(), e.is_go_away(), e.is_remote());
    TransportError::new(kind, format!("HTTP/2: {e}{what}"))
}

/// What a stream's error means for a retry, from its reason, whether it
/// came of a GOAWAY, and whether the server sent it (else h2 did): the
/// server's `REFUSED_STREAM` (RFC 9113 §8.7), and its GOAWAY for a stream
/// past the last one it processed (§6.8; h2 fails only those streams with
/// it, the others end with their connection), were not processed. h2's own
/// `REFUSED_STREAM` on one of our streams is its answer to a header list
/// over `max_header_list_size`. Anything else may have been processed.
fn meaning(reason: Option<h2::Reason>, go_away: bool, remote: bool) -> (ErrorKind, &'static str) {
    match reason {
        Some(h2::Reason::REFUSED_STREAM) if remote => (
            ErrorKind::NotSent,
            " (refused by the server, not processed)",
        ),
        Some(h2::Reason::REFUSED_STREAM) => (
            ErrorKind::Reset,
            " (the answer's header list is over 128 KiB)",
        ),
        _ if go_away && remote => (
            ErrorKind::NotSent,
            " (past the server's GOAWAY, not processed)",
        ),
        _ => (ErrorKind::Reset, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(connections: u32) -> H2Pool {
        let mut s = ConnectionSettings::default();
        s.http2.connections = connections;
        s.http2.prior_knowledge = true;
        H2Pool::new(
            &s,
            Duration::from_secs(1),
            #[cfg(feature = "tls")]
            None,
        )
    }

    #[test]
    fn a_connection_is_made_only_when_every_open_one_is_busy() {
        use View::*;
        // The first request makes the first connection; a burst waits for
        // it rather than opening more.
        assert_eq!(
            choose(&[Empty, Empty]),
            Choice::Connect {
                at: 0,
                meanwhile: None
            }
        );
        assert_eq!(choose(&[Connecting, Empty]), Choice::Wait(0));
        // An idle connection is used; a busy one alone starts a second
        // (while the request goes on the first) ...
        assert_eq!(choose(&[Ready(0), Empty]), Choice::Use(0));
        assert_eq!(
            choose(&[Ready(3), Empty]),
            Choice::Connect {
                at: 1,
                meanwhile: Some(0)
            }
        );
        // ... but only one at a time, and with one allowed never.
        assert_eq!(choose(&[Ready(3), Connecting, Empty]), Choice::Use(0));
        assert_eq!(choose(&[Ready(9)]), Choice::Use(0));
        // The fewest streams win; the first on a tie.
        assert_eq!(choose(&[Ready(4), Ready(2), Ready(2)]), Choice::Use(1));
        assert_eq!(choose(&[Ready(4), Ready(0)]), Choice::Use(1));
        assert_eq!(choose(&[]), Choice::Nothing);
    }

    #[test]
    fn only_what_the_server_says_it_did_not_process_is_not_sent() {
        use h2::Reason;
        let kind = |r, go_away, remote| meaning(r, go_away, remote).0;
        let refused = Some(Reason::REFUSED_STREAM);
        assert_eq!(kind(refused, false, true), ErrorKind::NotSent);
        assert_eq!(kind(Some(Reason::NO_ERROR), true, true), ErrorKind::NotSent);
        assert_eq!(
            kind(Some(Reason::INTERNAL_ERROR), true, true),
            ErrorKind::NotSent
        );
        // h2's own refusal: an answer too large, after the server acted.
        assert_eq!(kind(refused, false, false), ErrorKind::Reset);
        assert!(meaning(refused, false, false).1.contains("header list"));
        // h2's own GOAWAY (a protocol error it found), a reset by the
        // server, a broken connection: the request may have been acted on.
        assert_eq!(
            kind(Some(Reason::PROTOCOL_ERROR), true, false),
            ErrorKind::Reset
        );
        assert_eq!(kind(Some(Reason::CANCEL), false, true), ErrorKind::Reset);
        assert_eq!(kind(None, false, false), ErrorKind::Reset);
    }

    #[test]
    fn plain_http_goes_over_h2_only_with_prior_knowledge() {
        let p = pool(1);
        assert!(p.takes("http://127.0.0.1:1/"));
        let no = H2Pool::new(
            &ConnectionSettings::default(),
            Duration::from_secs(1),
            #[cfg(feature = "tls")]
            None,
        );
        assert!(!no.takes("http://127.0.0.1:1/"));
        assert_eq!(no.takes("https://127.0.0.1:1/"), cfg!(feature = "tls"));
    }
}
