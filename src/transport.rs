//! How one attempt reaches a backend: a small trait, and awc behind it.
//!
//! Every [`crate::actors::NodeActor`] owns one [`Transport`], made on the
//! node's own thread by a [`TransportFactory`] (awc's `Client` is `!Send`)
//! and then told its service's [`ConnectionSettings`] with
//! [`Transport::configure`]. The default, [`AwcTransport`], disables
//! redirects (the node that answers must be the node the task was sent to),
//! lifts awc's 100-connection limit (`max_concurrent` is the cap), keeps idle
//! connections `keep_alive` and any connection at most `max_connection_age`,
//! reads the body under a size limit, and maps awc's errors onto
//! [`ErrorKind`]s by what they mean for a retry.
//!
//! # Was the request sent?
//!
//! A pooling client meets one race with every HTTP/1.1 server: it reuses an
//! idle connection just as the server closes it. The request then fails,
//! though the server never read it, and a POST may only be retried if the
//! engine knows that. What awc 3 (its pool and h1 dispatcher) reports, and
//! what the engine makes of it:
//!
//! - **A pooled connection already seen closed** is never used: before
//!   reusing one, awc's pool polls a read on it and drops it on EOF or error
//!   (and on unexpected bytes). But it sees only what tokio's reactor has
//!   noticed; a FIN that arrived since the last reactor turn is missed, so
//!   the race remains.
//! - **The write fails** (`SendRequestError::Send`): the connection was
//!   already reset when the request was written. A request of at most 8 KiB
//!   (awc's write buffer) goes out in one write, which then wrote nothing:
//!   [`ErrorKind::NotSent`].
//! - **EOF before any byte of the answer** (`SendRequestError::Connect(
//!   ConnectError::Disconnected)`), or **a read error before the answer's
//!   head** (`SendRequestError::Response(ParseError::Io)`, a reset): on a
//!   reused connection this is the race (the server closed an idle
//!   connection, or reset it with our request unread), so
//!   [`ErrorKind::NotSent`], the rule of Chromium's `ShouldResendRequest`
//!   and Firefox for reused connections, and Envoy's `reset-before-request`
//!   in spirit. On a new connection it is ambiguous (the server may have
//!   read the request and died): [`ErrorKind::Reset`].
//! - **After the head, while reading the body** (`PayloadError::Incomplete`
//!   or `Io`): [`ErrorKind::Reset`], a node failure. A body over `max_body`
//!   (`PayloadError::Overflow`) or one that cannot be decoded is
//!   [`ErrorKind::Body`]: the task's failure, not the node's.
//! - Connect errors (refused, connect timeout, resolver) were never sent:
//!   [`ErrorKind::Connect`].
//!
//! awc does not say whether it reused a connection. The engine learns it by
//! wrapping awc's TCP connector: it marks the attempt being polled when awc
//! opens a connection for it (awc opens and writes HTTP/1.1 connections
//! inside the request's own future, on the node's thread). An attempt that
//! opened none was sent on a pooled connection.
//!
//! What the engine cannot tell: whether a server that closed a *reused*
//! connection without answering had read the request (a server that reads a
//! request, then dies before writing one byte of the answer, looks exactly
//! like the race; such a request is retried, as browsers do), and, for a
//! request over 8 KiB whose write failed on a new connection, how much of it
//! left (then [`ErrorKind::Reset`]). HTTP/2 (with the `tls` feature) runs its
//! connections on tasks of their own; its errors stay [`ErrorKind::Reset`].
//!
//! The race itself is avoided where it can be: `keep_alive` defaults to
//! 1 s, below the idle timeouts of common servers (gunicorn 2 s; uvicorn,
//! Node.js, Apache and actix-web 5 s; nginx 75 s), so the engine closes idle
//! connections before the server does.
//!
//! # TLS (feature `tls`)
//!
//! Each node builds its own rustls `ClientConfig` from its
//! [`ConnectionSettings::tls`] (the endpoint's settings, else the
//! service's): the webpki roots plus the certificates of the configured
//! `ca_file`, or a verifier that accepts any certificate for
//! `insecure_skip_verify`; ALPN offers `h2` then `http/1.1`, so a server
//! that offers HTTP/2 gets it ([`HttpReply::protocol`] says which was used).
//! A failed handshake (a certificate from an unknown authority, expired, or
//! for another name; no common protocol) is [`ErrorKind::Tls`], found by
//! rustls's error inside awc's `ConnectError::Io`; its detail names the
//! endpoint and the reason.
//!
//! # Streamed bodies
//!
//! [`Transport::send_streaming`] resolves at the answer's head and hands
//! over the unread body as a stream (the node forwards its chunks; see
//! [`crate::Task::stream`]). awc's HTTP/1 payload ends such a stream
//! cleanly when the connection closes before a chunked or length-framed
//! body is complete (its decoder sees an empty buffer at EOF). The engine
//! catches that as it catches reuse: its connections are wrapped so that a
//! read finding the connection closed raises the mark of the body being
//! polled, and a framed body that ends after such a read is cut
//! ([`ErrorKind::Reset`]). A complete body never reads the close: its
//! decoder finds the body's end first.
//!
//! Benchmarks and tests of pure scheduling may plug another transport with
//! [`crate::DispatcherBuilder::transport`]; behaviour tests use the real one.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_service::Service;
use actix_tls::connect::{ConnectError as TcpConnectError, ConnectInfo, Connection, Resolver};
use awc::error::{ConnectError, PayloadError, SendRequestError};
use awc::http::header::{HeaderMap, HeaderName, HeaderValue};
use awc::http::Method;
use awc::http::Uri;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::stream::{LocalBoxStream, StreamExt};

use crate::config::TlsConfig;
use crate::outcome::{ErrorKind, Protocol};

/// One HTTP request of one attempt.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// Method.
    pub method: Method,
    /// Full URL: the endpoint address plus the task's path.
    pub url: String,
    /// Headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Body.
    pub body: Bytes,
    /// Time allowed for the whole attempt, body included.
    pub timeout: Duration,
    /// Largest body read.
    pub max_body: usize,
}

/// The answer to one attempt.
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// The HTTP version the answer came over (`None`: the transport does
    /// not say, as a test's stand-in).
    pub protocol: Option<Protocol>,
}

/// The head of an answer whose body is still to come
/// ([`Transport::send_streaming`]).
pub struct StreamedReply {
    /// Status, headers and protocol; `head.body` is empty.
    pub head: HttpReply,
    /// The body's chunks as the backend sends them. An error item ends it
    /// ([`ErrorKind::Reset`] for a connection broken mid-body).
    pub body: LocalBoxStream<'static, Result<Bytes, TransportError>>,
}

impl StreamedReply {
    /// A buffered reply as a stream of one chunk (none when it is empty).
    pub fn buffered(mut reply: HttpReply) -> Self {
        let body = std::mem::take(&mut reply.body);
        let chunks = (!body.is_empty()).then_some(Ok(body));
        Self {
            head: reply,
            body: Box::pin(futures::stream::iter(chunks)),
        }
    }
}

impl std::fmt::Debug for StreamedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedReply")
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// Why an attempt got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct TransportError {
    /// What it means for retries.
    pub kind: ErrorKind,
    /// The underlying message.
    pub detail: String,
}

impl TransportError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

/// Sends one request. Implementations need not enforce `timeout`: the node
/// wraps every attempt, body included, in its own.
pub trait Transport {
    /// Sends `req` and resolves to the reply or the error.
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>>;

    /// Sends `req` and resolves as soon as the answer's head arrives, with
    /// its body still to read ([`crate::Task::stream`]); the node reads it
    /// chunk by chunk and enforces `max_body` itself. The default reads the
    /// whole body with [`Transport::send`] and hands it over as one chunk,
    /// so a transport without streaming still serves streamed tasks.
    fn send_streaming(
        &self,
        req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<StreamedReply, TransportError>> {
        let reply = self.send(req);
        Box::pin(async move { reply.await.map(StreamedReply::buffered) })
    }

    /// Takes the service's connection settings; the node calls it once,
    /// right after the factory made the transport. The default ignores them
    /// (a transport without connections of its own has nothing to keep).
    fn configure(&self, _settings: &ConnectionSettings) {}
}

/// How a node's connections are made and kept (from its service's and
/// endpoint's config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Idle time after which a pooled connection is closed (zero: none is
    /// reused).
    pub keep_alive: Duration,
    /// Longest life of a connection, idle or not.
    pub max_connection_age: Duration,
    /// Trusted authorities or skip-verify for `https://` (`None`: the
    /// webpki roots, full verification).
    pub tls: Option<TlsConfig>,
}

impl ConnectionSettings {
    /// The settings of the node at `address`: its service's keep-alive, and
    /// its endpoint's TLS settings, else its service's.
    pub fn for_endpoint(cfg: &crate::config::ServiceConfig, address: &str) -> Self {
        Self {
            tls: cfg.tls_for(address).cloned(),
            ..Self::from(cfg)
        }
    }

    /// Whether certificates go unchecked (`insecure_skip_verify`).
    pub fn skips_verify(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.insecure_skip_verify)
    }
}

impl Default for ConnectionSettings {
    /// The config's defaults: 1 s idle (below gunicorn's 2 s and the 5 s of
    /// uvicorn and Node.js), 60 s of life.
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_secs(1),
            max_connection_age: Duration::from_secs(60),
            tls: None,
        }
    }
}

impl From<&crate::config::ServiceConfig> for ConnectionSettings {
    /// The service's settings (its own `tls`, not an endpoint's).
    fn from(cfg: &crate::config::ServiceConfig) -> Self {
        Self {
            keep_alive: cfg.keep_alive,
            max_connection_age: cfg.max_connection_age,
            tls: cfg.tls.clone(),
        }
    }
}

/// Builds a node's transport on the node's thread; gets the endpoint address.
pub type TransportFactory = Arc<dyn Fn(&str) -> Rc<dyn Transport> + Send + Sync>;

/// The default factory: one [`AwcTransport`] per node.
pub fn awc_factory(connect_timeout: Duration) -> TransportFactory {
    Arc::new(move |_addr: &str| Rc::new(AwcTransport::new(connect_timeout)) as Rc<dyn Transport>)
}

/// The mark of the attempt being polled, if any: set by [`Marked`] around
/// each poll, raised by [`MarkOpened`] when awc opens a connection.
type Slot = Rc<RefCell<Option<Rc<Cell<bool>>>>>;

/// Largest request that awc writes in one piece (its write buffer's high
/// water mark), so that a failed write means no byte of it left.
const ONE_WRITE: usize = 8 * 1024;

/// awc, set up for an engine: no redirects, no connection cap, own timeouts,
/// connections kept as configured, and reuse known (see the module docs).
pub struct AwcTransport {
    client: RefCell<awc::Client>,
    connect_timeout: Duration,
    slot: Slot,
    eof: Slot,
}

impl AwcTransport {
    /// A client whose connects give up after `connect_timeout`, with the
    /// default [`ConnectionSettings`].
    pub fn new(connect_timeout: Duration) -> Self {
        let (slot, eof) = (Slot::default(), Slot::default());
        let client = client(connect_timeout, &ConnectionSettings::default(), &slot, &eof);
        Self {
            client: RefCell::new(client),
            connect_timeout,
            slot,
            eof,
        }
    }
}

fn client(
    connect_timeout: Duration,
    settings: &ConnectionSettings,
    slot: &Slot,
    eof: &Slot,
) -> awc::Client {
    let tcp = MarkOpened {
        inner: actix_tls::connect::Connector::new(Resolver::default()).service(),
        slot: slot.clone(),
        eof: eof.clone(),
    };
    let connector = awc::Connector::new()
        .connector(tcp)
        .limit(0)
        .timeout(connect_timeout)
        .conn_keep_alive(settings.keep_alive)
        .conn_lifetime(settings.max_connection_age);
    #[cfg(feature = "tls")]
    let connector = match tls::client_config(settings.tls.as_ref()) {
        Some(config) => connector.rustls_0_23(config),
        None => connector,
    };
    // No awc timeout: the node bounds every attempt (head and body) with
    // one timer of its own, so each request costs one timer, not two.
    awc::Client::builder()
        .disable_redirects()
        .disable_timeout()
        .connector(connector)
        .finish()
}

impl Transport for AwcTransport {
    fn configure(&self, settings: &ConnectionSettings) {
        *self.client.borrow_mut() = client(self.connect_timeout, settings, &self.slot, &self.eof);
    }

    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let max_body = req.max_body;
        self.exchange(req, move |status, protocol, headers, mut res| {
            Box::pin(async move {
                let body = res.body().limit(max_body).await.map_err(classify_payload)?;
                Ok(HttpReply {
                    status,
                    headers,
                    body,
                    protocol,
                })
            })
        })
    }

    fn send_streaming(
        &self,
        req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<StreamedReply, TransportError>> {
        let slot = self.eof.clone();
        self.exchange(req, move |status, protocol, headers, res| {
            // A body framed by its length or chunks that meets the
            // connection's end is cut; awc's HTTP/1 payload reports that
            // as a clean end, so the reads of its poll are watched.
            let framed = protocol == Some(Protocol::Http1)
                && (headers.contains_key(awc::http::header::CONTENT_LENGTH)
                    || headers.contains_key(awc::http::header::TRANSFER_ENCODING));
            // The payload is read only as the node polls it: a dropped
            // stream drops the unread body, which closes the connection.
            let body = WatchEof {
                inner: res.map(|chunk| chunk.map_err(classify_payload)),
                seen: Rc::new(Cell::new(false)),
                slot,
                framed,
                done: false,
            }
            .boxed_local();
            Box::pin(std::future::ready(Ok(StreamedReply {
                head: HttpReply {
                    status,
                    headers,
                    body: Bytes::new(),
                    protocol,
                },
                body,
            })))
        })
    }
}

/// A response of awc's, its body unread.
type AwcResponse = awc::ClientResponse;

/// What follows the head of an answer: the status, protocol, headers (taken
/// out of the response) and the response with its unread body.
type AfterHead<T> = Box<
    dyn FnOnce(
        u16,
        Option<Protocol>,
        HeaderMap,
        AwcResponse,
    ) -> LocalBoxFuture<'static, Result<T, TransportError>>,
>;

impl AwcTransport {
    /// Sends `req`, classifies a failure before the head (see the module
    /// docs), then hands the head and the unread response to `then`.
    fn exchange<T: 'static>(
        &self,
        req: HttpRequest,
        then: impl FnOnce(
                u16,
                Option<Protocol>,
                HeaderMap,
                AwcResponse,
            ) -> LocalBoxFuture<'static, Result<T, TransportError>>
            + 'static,
    ) -> LocalBoxFuture<'static, Result<T, TransportError>> {
        let then: AfterHead<T> = Box::new(then);
        let one_write = req.body.len()
            + req.url.len()
            + req
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 4)
                .sum::<usize>()
            + 256
            <= ONE_WRITE;
        let mut r = self.client.borrow().request(req.method, req.url.as_str());
        // Append, not insert: a task's repeated headers (two `accept`) are kept.
        for (k, v) in req.headers {
            r = r.append_header((k, v));
        }
        let send = r.send_body(req.body);
        let url = req.url;
        let opened = Rc::new(Cell::new(false));
        let mark = opened.clone();
        let attempt = Box::pin(async move {
            let res = send.await.map_err(|e| {
                let mut err = classify_send(e, !opened.get(), one_write);
                if err.kind == ErrorKind::Tls {
                    err.detail = format!("TLS with {}: {}", authority(&url), err.detail);
                }
                err
            })?;
            let status = res.status().as_u16();
            let protocol = Protocol::of(res.version());
            // Take the headers out of the response head rather than cloning them.
            let mut headers = HeaderMap::new();
            let res = res.map_body(|head, payload| {
                headers = std::mem::take(&mut head.headers);
                payload
            });
            then(status, protocol, headers, res).await
        });
        Box::pin(Marked {
            inner: attempt,
            mark,
            slot: self.slot.clone(),
        })
    }
}

/// awc's send errors by what they mean for a retry (see the module docs):
/// `reused` when the attempt opened no connection, `one_write` when the
/// request fits awc's write buffer.
fn classify_send(e: SendRequestError, reused: bool, one_write: bool) -> TransportError {
    if let Some(reason) = tls_failure(&e) {
        return TransportError::new(ErrorKind::Tls, reason);
    }
    let kind = match &e {
        // EOF before any byte of the answer.
        SendRequestError::Connect(ConnectError::Disconnected) if reused => ErrorKind::NotSent,
        SendRequestError::Connect(ConnectError::Disconnected) => ErrorKind::Reset,
        SendRequestError::Connect(_) => ErrorKind::Connect,
        // The write failed: the connection was reset before it.
        SendRequestError::Send(_) if reused || one_write => ErrorKind::NotSent,
        // A read error before the answer's head was complete.
        SendRequestError::Response(p) if reused && is_io(p) => ErrorKind::NotSent,
        SendRequestError::Timeout => ErrorKind::Timeout,
        SendRequestError::Url(_) | SendRequestError::Http(_) | SendRequestError::Body(_) => {
            ErrorKind::Invalid
        }
        _ => ErrorKind::Reset,
    };
    let conn = if reused { "reused" } else { "new" };
    let detail = format!("{e} (on a {conn} connection)");
    TransportError::new(kind, detail)
}

fn classify_payload(e: PayloadError) -> TransportError {
    let kind = match &e {
        PayloadError::Overflow => ErrorKind::Body,
        PayloadError::Incomplete(_) | PayloadError::Io(_) => ErrorKind::Reset,
        _ => ErrorKind::Body,
    };
    TransportError::new(kind, e.to_string())
}

/// `host:port` of a URL, for messages.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

/// Why the TLS handshake failed, when that is why the request failed:
/// rustls's error inside awc's `ConnectError::Io`.
#[cfg(feature = "tls")]
fn tls_failure(e: &SendRequestError) -> Option<String> {
    match e {
        SendRequestError::Connect(ConnectError::Io(io)) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(tls::describe),
        _ => None,
    }
}

#[cfg(not(feature = "tls"))]
fn tls_failure(_e: &SendRequestError) -> Option<String> {
    None
}

/// Whether awc's `ParseError` (not exported) is its `Io` variant: a read
/// that failed, rather than an answer that made no sense.
fn is_io(e: &(dyn std::error::Error + 'static)) -> bool {
    e.source().is_some_and(|s| s.is::<std::io::Error>()) || e.to_string().starts_with("I/O error")
}

// === impl Marked ===

/// An attempt's future, with its mark in the transport's slot while it is
/// polled: awc opens a connection (and writes an HTTP/1.1 request) inside
/// the poll of the request's own future.
struct Marked<F> {
    inner: F,
    mark: Rc<Cell<bool>>,
    slot: Slot,
}

impl<F: Future + Unpin> Future for Marked<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let outer = this.slot.replace(Some(this.mark.clone()));
        let out = Pin::new(&mut this.inner).poll(cx);
        *this.slot.borrow_mut() = outer;
        out
    }
}

// === impl WatchEof ===

/// A streamed body, with its mark in the transport's EOF slot while it is
/// polled (awc's HTTP/1 payload reads its connection inside that poll): a
/// framed body whose poll met the connection's end before the body's own
/// end was cut, though awc ends the stream as if it were complete.
struct WatchEof<S> {
    inner: S,
    seen: Rc<Cell<bool>>,
    slot: Slot,
    /// Whether the body has a length or chunks (not ended by the close).
    framed: bool,
    done: bool,
}

impl<S> futures::Stream for WatchEof<S>
where
    S: futures::Stream<Item = Result<Bytes, TransportError>> + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let outer = this.slot.replace(Some(this.seen.clone()));
        let out = Pin::new(&mut this.inner).poll_next(cx);
        *this.slot.borrow_mut() = outer;
        match out {
            Poll::Ready(None) if this.framed && this.seen.get() => {
                this.done = true;
                Poll::Ready(Some(Err(TransportError::new(
                    ErrorKind::Reset,
                    "the connection closed before the end of the body",
                ))))
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                this.done = true;
                out
            }
            out => out,
        }
    }
}

// === impl WatchedIo ===

/// A TCP connection that raises the mark in its transport's EOF slot when a
/// read finds it closed (see [`WatchEof`]).
#[derive(Debug)]
struct WatchedIo {
    io: actix_rt::net::TcpStream,
    eof: Slot,
}

impl tokio::io::AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let out = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(out, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0
        {
            if let Some(mark) = this.eof.borrow().as_ref() {
                mark.set(true);
            }
        }
        out
    }
}

impl tokio::io::AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl actix_rt::net::ActixStream for WatchedIo {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<actix_rt::net::Ready>> {
        actix_rt::net::ActixStream::poll_read_ready(&self.io, cx)
    }

    fn poll_write_ready(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<actix_rt::net::Ready>> {
        actix_rt::net::ActixStream::poll_write_ready(&self.io, cx)
    }
}

// === impl MarkOpened ===

/// awc's TCP connector, raising the polled attempt's mark when it opens a
/// connection (an attempt left unmarked went out on a pooled connection),
/// and watching each connection's end for streamed bodies ([`WatchedIo`]).
#[derive(Clone)]
struct MarkOpened<S> {
    inner: S,
    slot: Slot,
    eof: Slot,
}

impl<S> Service<ConnectInfo<Uri>> for MarkOpened<S>
where
    S: Service<
        ConnectInfo<Uri>,
        Response = Connection<Uri, actix_rt::net::TcpStream>,
        Error = TcpConnectError,
    >,
    S::Future: 'static,
{
    type Response = Connection<Uri, WatchedIo>;
    type Error = S::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    actix_service::forward_ready!(inner);

    fn call(&self, req: ConnectInfo<Uri>) -> Self::Future {
        if let Some(mark) = self.slot.borrow().as_ref() {
            mark.set(true);
        }
        let connect = self.inner.call(req);
        let eof = self.eof.clone();
        Box::pin(async move {
            let (io, conn) = connect.await?.replace_io(());
            Ok(conn.replace_io(WatchedIo { io, eof }).1)
        })
    }
}

// === mod tls ===

/// The node's rustls client config (feature `tls`).
#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};

    use crate::config::TlsConfig;

    /// A config for `tls` (the webpki roots, the configured CA, or no
    /// verification), offering h2 and http/1.1 over ALPN. `None` only if
    /// rustls refuses its own default protocol versions (then awc's
    /// default config is kept).
    pub(super) fn client_config(tls: Option<&TlsConfig>) -> Option<Arc<ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| log::error!("TLS: no usable protocol versions: {e}"))
            .ok()?;
        let mut config = match tls {
            Some(t) if t.insecure_skip_verify => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth(),
            _ => {
                let mut roots = actix_tls::connect::rustls_0_23::webpki_roots_cert_store();
                for der in tls
                    .and_then(|t| t.ca.as_ref())
                    .iter()
                    .flat_map(|c| c.certs.iter())
                {
                    // Checked when the config was loaded.
                    let _ = roots.add(CertificateDer::from(der.clone()));
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Some(Arc::new(config))
    }

    /// A handshake failure in words, rustls's own message after it.
    pub(super) fn describe(e: &rustls::Error) -> String {
        let hint = match e {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => {
                    "certificate signed by an unknown authority (trust its CA with `tls.ca_file`)"
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "certificate expired"
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "certificate not valid yet"
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    "certificate is for another host name"
                }
                _ => "invalid certificate",
            },
            rustls::Error::NoApplicationProtocol => "no common application protocol (ALPN)",
            rustls::Error::AlertReceived(_) => "the server refused the handshake",
            _ => "handshake failed",
        };
        format!("{hint} ({e})")
    }

    /// `insecure_skip_verify`: any certificate is accepted, but the
    /// handshake's signatures are still checked against it.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
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
}
