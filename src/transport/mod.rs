//! How one attempt reaches a backend: a small trait, and the engine's own
//! HTTP client behind it.
//!
//! Every node actor owns one [`Transport`], made on the
//! node's own thread by a [`TransportFactory`] (its connections are `Rc`s,
//! `!Send`) and then told its service's [`ConnectionSettings`] with
//! [`Transport::configure`]. The default, [`AwcTransport`], speaks
//! HTTP/1.1 over the node's own connections with actix-http's codec
//! (module `h1`) and HTTP/2 over the node's multiplexed connections
//! (module `h2`). It follows no redirect (the node that answers must be the
//! node the task was sent to), has no connection cap (`max_concurrent` is
//! the cap), keeps idle connections `keep_alive` and any connection at most
//! `max_connection_age`, reads the body under a size limit, and classifies
//! its failures into [`ErrorKind`]s by what they mean for a retry. awc
//! itself now serves only [`crate::Lease::client`]: the caller's own awc
//! `Client`, connected as the engine's.
//!
//! # Was the request sent?
//!
//! A pooling client meets one race with every HTTP/1.1 server: it reuses an
//! idle connection just as the server closes it. The request then fails,
//! though the server never read it, and a POST may only be retried if the
//! engine knows that. What the HTTP/1 path sees, and what the engine makes
//! of it:
//!
//! - **A pooled connection already seen closed** is never used: before
//!   reusing one, the pool polls a read on it and drops it on EOF or error
//!   (and on unexpected bytes), as awc's pool does. But it sees only what
//!   tokio's reactor has noticed; a FIN that arrived since the last reactor
//!   turn is missed, so the race remains.
//! - **The write fails**: the connection was already reset when the
//!   request was written. A request of at most 8 KiB (the codec's write
//!   buffer) goes out in one write, which then wrote nothing; on a reused
//!   connection, the race: [`ErrorKind::NotSent`] either way.
//! - **EOF or a read error before any byte of the answer's head**: on a
//!   reused connection this is the race (the server closed an idle
//!   connection, or reset it with our request unread), so
//!   [`ErrorKind::NotSent`], the rule of Chromium's `ShouldResendRequest`
//!   and Firefox for reused connections, and Envoy's `reset-before-request`
//!   in spirit. On a new connection it is ambiguous (the server may have
//!   read the request and died): [`ErrorKind::Reset`]. So is a connection
//!   that closes after part of the head came, reused or not: the server
//!   read the request.
//! - **After the head, while reading the body** (EOF before a framed
//!   body's end, a read error, a malformed chunk): [`ErrorKind::Reset`], a
//!   node failure. A body over `max_body` (a declared Content-Length over
//!   it is refused before a byte of the body is read) is
//!   [`ErrorKind::Body`]: the task's failure, not the node's.
//! - **A malformed answer** (a bad status line or header, two
//!   Content-Lengths, Content-Length beside Transfer-Encoding, a coding
//!   other than `chunked`, a `101` to a request for no upgrade, a head over
//!   128 KiB or 96 header fields): [`ErrorKind::Reset`], reused
//!   connection or not (the server read the request), its words naming
//!   what was wrong; the connection is closed.
//! - Connect errors (refused, connect timeout, resolver) were never sent:
//!   [`ErrorKind::Connect`].
//!
//! The pool knows whether it lent a connection from its idle list or
//! opened one for the request, so reuse is known, not inferred.
//!
//! What the engine cannot tell: whether a server that closed a *reused*
//! connection without answering had read the request (a server that reads a
//! request, then dies before writing one byte of the answer, looks exactly
//! like the race; such a request is retried, as browsers do), and, for a
//! request over 8 KiB whose write failed on a new connection, how much of it
//! left (then [`ErrorKind::Reset`]). For HTTP/2 (below), a stream the
//! server refused (`REFUSED_STREAM`), or one past the last stream its
//! `GOAWAY` says it processed, was not processed ([`ErrorKind::NotSent`]);
//! other errors after sending are [`ErrorKind::Reset`].
//!
//! # Framing: one caller's answer never reaches another
//!
//! A pooled HTTP/1.1 connection carries answers one after another, so a
//! client that misreads where one answer ends hands the rest to the next
//! caller on that connection. The HTTP/1 path keeps RFC 9112's rules
//! (module `h1::framing`, a pure function of the method and the head):
//!
//! - every interim `1xx` is skipped and the final answer read, a `100
//!   Continue` to a request that sent no `Expect` among them;
//! - an answer with neither Content-Length nor Transfer-Encoding has a body
//!   that runs to the close (§6.3), HTTP/1.1 or 1.0: read to the close,
//!   under `max_body` and the attempt's timeout, and that connection is
//!   never pooled;
//! - answers to `HEAD`, and `204` and `304`, have no body, whatever they
//!   declare; the connection stays reusable;
//! - a connection goes back to the pool only when its answer was read to
//!   its framed end, nothing is left in its read buffer (surplus bytes
//!   would be the next caller's answer), and the answer was persistent
//!   (HTTP/1.1 without `Connection: close`, HTTP/1.0 with `keep-alive`);
//!   bytes that arrive while it is idle are found by the read polled
//!   before its reuse, and close it;
//! - a redirect is an answer: nothing is followed.
//!
//! HTTP/2 frames its answers itself; what it bounds is the answer: a
//! header list of at most 128 KiB (as an HTTP/1 head), no server push,
//! no stream the server opens (module `h2`).
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
//! for another name; no common protocol) is [`ErrorKind::Tls`]; its detail
//! names the endpoint and the reason. Both paths connect through one
//! function (module `connect`), so the words are the same on both.
//!
//! # HTTP/2
//!
//! A pool that lends a connection to one request at a time would open a
//! connection per concurrent request. So the node keeps its HTTP/2
//! connections apart (module `h2`, the `h2` crate): its requests are
//! streams over one connection, or the few of `http2.connections`. An
//! `https://` node's first connection learns the server's ALPN choice, the
//! requests that arrive meanwhile waiting for it; a server that chose
//! `http/1.1` is served by the HTTP/1 path from then on, starting on that
//! first connection (the ones it makes itself offer only `http/1.1`). `http://` nodes speak h2c with
//! `http2.prior_knowledge`, HTTP/1.1 otherwise.
//!
//! # Streamed bodies
//!
//! [`Transport::send_streaming`] resolves at the answer's head and hands
//! over the unread body as a stream (the node forwards its chunks; see
//! [`crate::Task::stream`]). The HTTP/1 codec's payload decoder knows
//! where a body framed by its length or its chunks ends, so a connection
//! that closes before that end is a cut body, an error item
//! ([`ErrorKind::Reset`]); only a body with neither (one that runs to the
//! close, HTTP/1.1 or 1.0) ends cleanly at the close. A stream dropped before
//! its end closes its connection; one read to its end gives it back to the
//! pool.
//!
//! Benchmarks and tests of pure scheduling may plug another transport with
//! [`crate::DispatcherBuilder::transport`]; behaviour tests use the real one.
//!
//! # Layout
//!
//! `awc`: [`AwcTransport`] (the one place that chooses HTTP/1 or HTTP/2
//! for a request) and awc's client for a lease's caller; `h1`: the node's
//! HTTP/1.1 pool, exchange and body, and the classification of their
//! failures; `h2`: the node's HTTP/2 connections and their streams;
//! `connect`: TCP and TLS for both; `tls`: the rustls config.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

// `::awc`: the crate, not this module's `awc` file.
use ::awc::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::awc::http::Method;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::stream::LocalBoxStream;

use crate::config::TlsConfig;
use crate::outcome::{ErrorKind, Protocol};

mod awc;
mod connect;
mod h1;
mod h2;
mod scoped;
#[cfg(feature = "tls")]
mod tls;

pub(crate) use self::awc::caller_client;
pub use self::awc::AwcTransport;
pub(crate) use scoped::ScopedHeaders;

/// Largest answer head, in bytes, on either protocol: HTTP/1's head as
/// the codec reads it (actix-http's bound, with at most 96 header fields),
/// and HTTP/2's decoded header list (`SETTINGS_MAX_HEADER_LIST_SIZE`).
pub(crate) const MAX_HEAD: usize = 128 * 1024;

/// One HTTP request of one attempt.
#[derive(Debug, Clone)]
#[non_exhaustive]
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

/// The answer to one attempt. Built with [`HttpReply::new`] and its
/// `with_` methods (a field may be added: the struct is
/// `#[non_exhaustive]`).
#[derive(Debug, Clone)]
#[non_exhaustive]
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
/// ([`Transport::send_streaming`]). Built with [`StreamedReply::new`] or
/// [`StreamedReply::buffered`].
#[non_exhaustive]
pub struct StreamedReply {
    /// Status, headers and protocol; `head.body` is empty.
    pub head: HttpReply,
    /// The body's chunks as the backend sends them. An error item ends it
    /// ([`ErrorKind::Reset`] for a connection broken mid-body).
    pub body: LocalBoxStream<'static, Result<Bytes, TransportError>>,
}

impl HttpReply {
    /// A reply of `status`: no headers, an empty body, and no protocol
    /// said (as a test's stand-in transport answers).
    #[inline]
    pub fn new(status: u16) -> Self {
        HttpReply {
            status,
            headers: HeaderMap::default(),
            body: Bytes::new(),
            protocol: None,
        }
    }

    /// With these headers.
    #[inline]
    pub fn with_headers(mut self, headers: HeaderMap) -> Self {
        self.headers = headers;
        self
    }

    /// With this body.
    #[inline]
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Over this HTTP version (`None`: not said).
    #[inline]
    pub fn with_protocol(mut self, protocol: Option<Protocol>) -> Self {
        self.protocol = protocol;
        self
    }
}

impl StreamedReply {
    /// An answer's head (its `body` left empty) and its body's chunks.
    #[inline]
    pub fn new(
        head: HttpReply,
        body: LocalBoxStream<'static, Result<Bytes, TransportError>>,
    ) -> Self {
        StreamedReply { head, body }
    }

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
#[non_exhaustive]
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
#[non_exhaustive]
pub struct ConnectionSettings {
    /// Idle time after which a pooled connection is closed (zero: none is
    /// reused).
    pub keep_alive: Duration,
    /// Longest life of a connection, idle or not.
    pub max_connection_age: Duration,
    /// Trusted authorities or skip-verify for `https://` (`None`: the
    /// webpki roots, full verification).
    pub tls: Option<TlsConfig>,
    /// How HTTP/2 connections are kept (`http2`): how many per node, and
    /// h2c for `http://`.
    pub http2: crate::config::Http2Config,
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
            http2: Default::default(),
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
            http2: cfg.http2,
        }
    }
}

/// Builds a node's transport on the node's thread; gets the endpoint address.
pub type TransportFactory = Arc<dyn Fn(&str) -> Rc<dyn Transport> + Send + Sync>;

/// The default factory: one [`AwcTransport`] per node.
pub fn awc_factory(connect_timeout: Duration) -> TransportFactory {
    Arc::new(move |_addr: &str| Rc::new(AwcTransport::new(connect_timeout)) as Rc<dyn Transport>)
}
