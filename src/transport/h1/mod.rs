//! HTTP/1.1 of the node's own: actix-http's client codec over the node's
//! own pool of connections.
//!
//! - **One codec per connection.** Each connection is a
//!   `Framed<Io, ClientCodec>` made once, when the connection is opened,
//!   and kept with it in the pool. Every codec is made from the node's one
//!   `ServiceConfig` (an `Rc`, cloned): that config's date task (the
//!   request's `Date` header, a 500 ms interval) runs once per node, not
//!   once per request as with a codec made per request.
//! - **The exchange** follows awc's `h1proto`: the request's head goes into
//!   the write buffer, then its body, one flush, then the answer's head,
//!   every interim `1xx` skipped. Module `framing`, not the codec, then
//!   says where the body ends and whether the connection may be kept
//!   (RFC 9112 §6.3, §9.3: the codec reads an HTTP/1.1 body that runs to
//!   the close as empty and waits for the body a `304` declares); a
//!   malformed answer fails the attempt and drops the connection. A framed
//!   body is read through the payload codec (`into_payload_codec`), a body
//!   that runs to the close by reading to the close; the connection goes
//!   back to the pool with its message codec (`into_message_codec`) only
//!   once a framed body's end has been read, nothing is left unread, and
//!   the answer was persistent. Anything else drops it: a body cut short,
//!   a body that ran to the close, an attempt dropped (its timeout, a
//!   cancel), a streamed body dropped before its end.
//! - **Host** is set as awc sets it (host, and the port unless 80 or 443),
//!   and `accept-encoding: identity` unless the task set one (the engine
//!   decodes no compression). `Expect: 100-continue` is honoured: the head
//!   goes first, the body only after a `100 Continue`; any other final
//!   answer ends it and the connection, its body unsent, is not kept. A
//!   request with `Expect` and no body is refused, as awc refuses it. A
//!   `100 Continue` nobody asked for is interim, as any `1xx`.
//! - **The pool** (module `idle`): last in, first out, idle at most
//!   `keep_alive`, at most `max_connection_age` old, no cap on the count.
//!   Before an idle connection is lent, one read is polled on it, as awc's
//!   pool does: a connection with EOF, an error or unexpected bytes waiting
//!   is dropped and the next one tried.
//!
//! Errors follow the parent module's "Was the request sent?", with reuse
//! known directly (a connection from the pool, or a new one).
//!
//! Here: the pool's handle and the exchange up to the answer's head;
//! `framing`: where an answer's body ends and whether its connection is
//! kept, as a pure function; `idle`: the idle list, as plain data; `body`:
//! the answer's body and the connection's return to the pool.

use std::cell::{OnceCell, RefCell};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::awc::http::header::{HeaderValue, ACCEPT_ENCODING, EXPECT, HOST};
use ::awc::http::uri::Authority;
use ::awc::http::{StatusCode, Uri};
use actix_codec::{Framed, FramedParts};
use actix_http::body::BodySize;
use actix_http::error::ParseError;
use actix_http::h1::{ClientCodec, Message, MessageType};
use actix_http::{RequestHead, RequestHeadType, ResponseHead, ServiceConfig};
use bytes::Bytes;
use futures::stream::LocalBoxStream;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::connect::{self, Io};
use super::{ConnectionSettings, HttpReply, HttpRequest, StreamedReply, TransportError, MAX_HEAD};
use crate::outcome::Protocol;

mod body;
mod failure;
mod framing;
mod idle;

use body::{over, read_whole, Body};
#[cfg(test)]
use failure::kind;
use failure::{failed, invalid, Failure};
use framing::{Asked, Framing};
use idle::IdleList;

/// Most header fields in an answer's head (actix-http's decoder's bound).
const MAX_HEADERS: usize = 96;

/// Largest request written in one piece (the codec's write buffer's high
/// water mark, as awc's): a failed write of one that fits sent nothing.
const ONE_WRITE: usize = 8 * 1024;

/// A node's HTTP/1 connections (a handle: clones share them).
#[derive(Clone)]
pub(super) struct H1Pool {
    inner: Rc<Inner>,
}

struct Inner {
    connect_timeout: Duration,
    /// The node's rustls config, ALPN `http/1.1` only: a connection made
    /// here speaks HTTP/1.1 whatever the server prefers.
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The codecs' config, made on the first request (it spawns its date
    /// task, which needs the node's runtime).
    config: OnceCell<ServiceConfig>,
    idle: RefCell<IdleList<Key, Framed<Io, ClientCodec>>>,
    /// The Host header of the last backend, made once (a node has one).
    host: RefCell<Option<(Key, HeaderValue)>>,
    /// The request head of the last exchange, written and given back, for
    /// the next one: its header map keeps its room (`RequestHead`'s own
    /// default allocates a map for 16 headers, some 6 KiB, per request).
    spare_head: RefCell<Option<Rc<RequestHead>>>,
    /// A connection made elsewhere and not used yet (the HTTP/2 path's
    /// first, on which the server chose HTTP/1.1): the next request to its
    /// backend goes on it, as on a new connection.
    unused: RefCell<Option<(Key, Io)>>,
}

/// Which backend a connection goes to.
#[derive(Debug, Clone)]
struct Key {
    https: bool,
    authority: Authority,
}

/// Byte for byte: a node's URLs all start with its one address, so the
/// case-insensitive comparison of `Authority`'s own `eq` (a few hundred
/// instructions per request, the pool's and the Host cache's) finds
/// nothing more.
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.https == other.https && self.authority.as_str() == other.authority.as_str()
    }
}

impl Eq for Key {}

/// A connection lent to one request.
struct Conn {
    framed: Framed<Io, ClientCodec>,
    meta: Meta,
}

/// What the pool knows of a lent connection.
struct Meta {
    key: Key,
    created: Instant,
    /// It came from the pool (else it was opened for this request).
    reused: bool,
    /// Still in step with the server (false: the body of an `Expect`
    /// request was not sent).
    reusable: bool,
}

impl H1Pool {
    /// The pool of a node with `settings` (feature `tls`: `tls` is the
    /// node's rustls config; its ALPN is narrowed to `http/1.1` here).
    pub(super) fn new(
        settings: &ConnectionSettings,
        connect_timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Self {
        #[cfg(feature = "tls")]
        let tls = tls.map(|c| {
            let mut c = (*c).clone();
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            std::sync::Arc::new(c)
        });
        H1Pool {
            inner: Rc::new(Inner {
                connect_timeout,
                #[cfg(feature = "tls")]
                tls,
                config: OnceCell::new(),
                host: RefCell::new(None),
                spare_head: RefCell::new(None),
                unused: RefCell::new(None),
                idle: RefCell::new(IdleList::new(
                    settings.keep_alive,
                    settings.max_connection_age,
                )),
            }),
        }
    }

    /// Takes `io`, a new connection to `uri`'s backend that speaks
    /// HTTP/1.1, for the next request there.
    pub(super) fn adopt(&self, uri: &Uri, io: Io) {
        if let Some(authority) = uri.authority().cloned() {
            let https = uri.scheme_str() == Some("https");
            *self.inner.unused.borrow_mut() = Some((Key { https, authority }, io));
        }
    }

    /// How many connections are idle.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.inner.idle.borrow().len()
    }
}

impl Inner {
    /// An idle connection to `key` that a read polled once finds quiet.
    fn checkout(&self, key: &Key, cx: &mut Context<'_>) -> Option<Conn> {
        let now = Instant::now();
        let (framed, created) = self
            .idle
            .borrow_mut()
            .take(key, now, |framed| quiet(framed, cx))?;
        Some(Conn {
            framed,
            meta: Meta {
                key: key.clone(),
                created,
                reused: true,
                reusable: true,
            },
        })
    }

    /// Puts `conn` back, when its last answer was read to its end, left
    /// nothing unread (surplus bytes would be the next caller's answer),
    /// and may be kept (module `framing`).
    fn release(&self, conn: Conn) {
        let Conn { framed, meta } = conn;
        if meta.reusable && framed.is_read_buf_empty() {
            let now = Instant::now();
            let _ = self
                .idle
                .borrow_mut()
                .put(meta.key, rested(framed), meta.created, now);
        }
    }

    /// The Host header for `key`'s `uri`.
    fn host(&self, key: &Key, uri: &Uri) -> Result<HeaderValue, TransportError> {
        let mut cached = self.host.borrow_mut();
        match &*cached {
            Some((k, v)) if k == key => Ok(v.clone()),
            _ => {
                let v = host(uri)?;
                *cached = Some((key.clone(), v.clone()));
                Ok(v)
            }
        }
    }

    /// A request head with no headers: the spare one when it is free.
    fn head(&self) -> Rc<RequestHead> {
        match self.spare_head.borrow_mut().take() {
            Some(mut rc) if Rc::strong_count(&rc) == 1 => {
                Rc::make_mut(&mut rc).headers.clear();
                rc
            }
            _ => Rc::new(RequestHead::default()),
        }
    }

    /// Keeps `head`, written, for the next request.
    fn give_back(&self, head: Rc<RequestHead>) {
        *self.spare_head.borrow_mut() = Some(head);
    }

    /// A codec as new on `conn` when its own still expects a body that
    /// module `framing` says is not there (a `304` that declares a length,
    /// an interim answer with one): its next decode would read that body.
    fn settle(&self, conn: &mut Conn) {
        if !matches!(conn.framed.codec_ref().message_type(), MessageType::None) {
            let config = self.config.get_or_init(ServiceConfig::default).clone();
            *conn.framed.codec_mut() = ClientCodec::new(config);
        }
    }

    async fn open(&self, uri: &Uri, key: Key) -> Result<Conn, TransportError> {
        let unused = self.unused.borrow_mut().take();
        let io = match unused {
            Some((k, io)) if k == key => io,
            _ => {
                connect::open(
                    uri,
                    self.connect_timeout,
                    #[cfg(feature = "tls")]
                    self.tls.clone(),
                )
                .await?
            }
        };
        let config = self.config.get_or_init(ServiceConfig::default).clone();
        Ok(Conn {
            framed: Framed::new(io, ClientCodec::new(config)),
            meta: Meta {
                key,
                created: Instant::now(),
                reused: false,
                reusable: true,
            },
        })
    }
}

/// `framed` with its buffers, as if new: a `Framed` that last decoded a
/// frame tries its decoder on its (empty) buffer before it reads, and the
/// head decoder's every call first fills an array of 96 header slots
/// (about 3 000 instructions per answer, wasted).
fn rested(framed: Framed<Io, ClientCodec>) -> Framed<Io, ClientCodec> {
    let old = framed.into_parts();
    let mut parts = FramedParts::new(old.io, old.codec);
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    Framed::from_parts(parts)
}

/// Whether an idle connection is still usable: a read polled once finds
/// nothing (no EOF, no error, no bytes the server should not have sent).
fn quiet(framed: &mut Framed<Io, ClientCodec>, cx: &mut Context<'_>) -> bool {
    if !framed.is_read_buf_empty() {
        return false;
    }
    let mut buf = [0_u8; 2];
    let mut read = ReadBuf::new(&mut buf);
    matches!(
        Pin::new(framed.io_mut()).poll_read(cx, &mut read),
        Poll::Pending
    )
}

// === the exchange ===

/// The answer's head, with the connection it came on: still lent when a
/// body follows (framed as `framing` says), already back in the pool or
/// closed (`None`) when none does.
struct Answer {
    head: ResponseHead,
    body: Option<Conn>,
    framing: Framing,
}

/// Sends `req` and reads the answer's head.
async fn exchange(pool: &Inner, req: HttpRequest) -> Result<Answer, TransportError> {
    let one_write = one_write(&req);
    let uri = Uri::try_from(req.url).map_err(|e| invalid(e.to_string()))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(invalid(format!("{uri}: not an http:// or https:// URL"))),
    };
    let Some(authority) = uri.authority().cloned() else {
        return Err(invalid(format!("{uri}: no host")));
    };
    let key = Key { https, authority };
    let has = |name| req.headers.iter().any(|(k, _)| *k == name);
    let expect = has(EXPECT);
    if expect && req.body.is_empty() {
        return Err(invalid("`Expect` on a request without a body"));
    }
    let host = if has(HOST) {
        None
    } else {
        Some(pool.host(&key, &uri)?)
    };
    let identity = !has(ACCEPT_ENCODING);
    let asked = Asked::of(&req.method);
    let idle = poll_fn(|cx| Poll::Ready(pool.checkout(&key, cx))).await;
    let mut conn = match idle {
        Some(conn) => conn,
        // Boxed: the connect's state (a resolver, a timeout, TLS) would be
        // a third of this future, which the node boxes for every request;
        // only a new connection pays for this box.
        None => Box::pin(pool.open(&uri, key)).await?,
    };
    let mut rc = pool.head();
    let head = Rc::make_mut(&mut rc);
    head.method = req.method;
    head.uri = uri;
    for (k, v) in req.headers {
        // Append, not insert: a task's repeated headers (two `accept`)
        // are kept.
        head.headers.append(k, v);
    }
    if let Some(host) = host {
        head.headers.insert(HOST, host);
    }
    if identity {
        head.headers
            .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    let body = req.body;
    let size = BodySize::Sized(body.len() as u64);
    let mut framed = Pin::new(&mut conn.framed);
    let written = framed.as_mut().write(Message::Item((
        RequestHeadType::Rc(Rc::clone(&rc), None),
        size,
    )));
    pool.give_back(rc);
    written.map_err(|e| invalid(format!("the request's head: {e}")))?;
    let mut early = None;
    if expect {
        // The head alone, then its answer: `100 Continue` asks for the
        // body, anything else is the final answer, and the connection,
        // its body unsent, is out of step: not kept.
        if let Err(e) = flush(framed.as_mut()).await {
            return Err(failed(Failure::Write(e), &conn, one_write));
        }
        let head = read_head(pool, &mut conn, one_write, true).await?;
        if head.status != StatusCode::CONTINUE {
            conn.meta.reusable = false;
            early = Some(head);
        }
    }
    let head = match early {
        Some(head) => head,
        None if expect => {
            // The body as it is (a sized body has no framing of its own),
            // past the codec: an interim answer before the `100` may have
            // left it a new codec (`settle`), whose encoder would drop it.
            let io = conn.framed.io_mut();
            let sent = match io.write_all(&body).await {
                Ok(()) => io.flush().await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                return Err(failed(Failure::Write(e), &conn, one_write));
            }
            read_head(pool, &mut conn, one_write, false).await?
        }
        None => {
            let mut framed = Pin::new(&mut conn.framed);
            if !body.is_empty() {
                let write = |f: Pin<&mut Framed<Io, ClientCodec>>, m| {
                    f.write(m)
                        .map_err(|e| invalid(format!("the request's body: {e}")))
                };
                write(framed.as_mut(), Message::Chunk(Some(body)))?;
                write(framed.as_mut(), Message::Chunk(None))?;
            }
            if let Err(e) = flush(framed).await {
                return Err(failed(Failure::Write(e), &conn, one_write));
            }
            read_head(pool, &mut conn, one_write, false).await?
        }
    };
    let plan = match framing::plan(asked, &head) {
        Ok(plan) => plan,
        Err(why) => return Err(failed(Failure::Malformed(why), &conn, one_write)),
    };
    conn.meta.reusable &= plan.keep;
    let codec_reads = !matches!(conn.framed.codec_ref().message_type(), MessageType::None);
    if !codec_reads && matches!(plan.framing, Framing::Length(_) | Framing::Chunked) {
        // The two never disagree so (module `framing` follows the codec's
        // reading of the headers); the payload codec would panic on it.
        let why = "a framing the codec did not read";
        return Err(failed(Failure::Malformed(why), &conn, one_write));
    }
    if plan.framing == Framing::Empty {
        pool.settle(&mut conn);
        pool.release(conn);
        return Ok(Answer {
            head,
            body: None,
            framing: plan.framing,
        });
    }
    Ok(Answer {
        head,
        body: Some(conn),
        framing: plan.framing,
    })
}

/// The value of the Host header for `uri`, as awc writes it.
fn host(uri: &Uri) -> Result<HeaderValue, TransportError> {
    let host = uri.host().unwrap_or_default();
    let value = match uri.port_u16() {
        None | Some(80) | Some(443) => HeaderValue::from_str(host),
        Some(port) => HeaderValue::from_str(&format!("{host}:{port}")),
    };
    value.map_err(|e| invalid(format!("{uri}: host: {e}")))
}

/// Whether `req` fits the codec's write buffer (head estimated).
fn one_write(req: &HttpRequest) -> bool {
    req.body.len()
        + req.url.len()
        + req
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
        + 256
        <= ONE_WRITE
}

async fn flush(mut framed: Pin<&mut Framed<Io, ClientCodec>>) -> io::Result<()> {
    poll_fn(|cx| {
        framed
            .as_mut()
            .flush::<Message<(RequestHeadType, BodySize)>>(cx)
    })
    .await
}

/// The next answer head on `conn` that is not interim: every `1xx` is
/// skipped (RFC 9112 §6.3: a client must read past unexpected ones, `100
/// Continue` to a request without `Expect` among them), except `100
/// Continue` when `continue_asked` (the head of an `Expect` request went
/// alone and waits for it). A `101` is malformed: the engine never asks
/// for an upgrade. Interim answers are read and dropped, so they hold no
/// memory; the attempt's timeout bounds how long they may come.
async fn read_head(
    pool: &Inner,
    conn: &mut Conn,
    one_write: bool,
    continue_asked: bool,
) -> Result<ResponseHead, TransportError> {
    loop {
        let next = poll_fn(|cx| Pin::new(&mut conn.framed).next_item(cx)).await;
        let failure = match next {
            // The decoder bounds a head only while it is incomplete: one
            // that completes within a single large read passes its bound.
            Some(Ok(head)) if head_size(&head) > MAX_HEAD => Failure::Garbled(ParseError::TooLarge),
            Some(Ok(head)) => match head.status {
                StatusCode::SWITCHING_PROTOCOLS => {
                    Failure::Malformed("101 Switching Protocols to a request for no upgrade")
                }
                StatusCode::CONTINUE if continue_asked => return Ok(head),
                s if s.is_informational() => {
                    // An interim answer has no body, whatever it declares.
                    pool.settle(conn);
                    continue;
                }
                _ => return Ok(head),
            },
            None => Failure::Eof,
            Some(Err(ParseError::Io(e))) => Failure::Read(e),
            Some(Err(e)) => Failure::Garbled(e),
        };
        return Err(failed(failure, conn, one_write));
    }
}

/// The bytes of `head`'s fields as sent (each `name: value` and its line
/// end), the status line aside: at most a few bytes less than the head.
fn head_size(head: &ResponseHead) -> usize {
    head.headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum()
}

/// Sends `req` over `pool` and reads the whole answer under `max_body`.
pub(super) async fn send(pool: H1Pool, req: HttpRequest) -> Result<HttpReply, TransportError> {
    let max_body = req.max_body;
    let Answer {
        mut head,
        body,
        framing,
    } = exchange(&pool.inner, req).await?;
    let headers = std::mem::take(&mut head.headers);
    let body = match body {
        None => Bytes::new(),
        Some(conn) => {
            // A declared length over the limit is refused before a byte
            // of it is read.
            if matches!(framing, Framing::Length(n) if n > max_body as u64) {
                return Err(over(max_body));
            }
            read_whole(Body::new(conn, pool.inner.clone(), framing), max_body).await?
        }
    };
    Ok(HttpReply {
        status: head.status.as_u16(),
        headers,
        body,
        protocol: Protocol::of(head.version),
    })
}

/// Sends `req` over `pool`; resolves at the answer's head, its body a
/// stream read as the node polls it (dropping it closes the connection).
pub(super) async fn send_streaming(
    pool: H1Pool,
    req: HttpRequest,
) -> Result<StreamedReply, TransportError> {
    let Answer {
        mut head,
        body,
        framing,
    } = exchange(&pool.inner, req).await?;
    let headers = std::mem::take(&mut head.headers);
    let body: LocalBoxStream<'static, _> = match body {
        None => Box::pin(futures::stream::empty()),
        Some(conn) => Box::pin(Body::new(conn, pool.inner.clone(), framing)),
    };
    Ok(StreamedReply {
        head: HttpReply {
            status: head.status.as_u16(),
            headers,
            body: Bytes::new(),
            protocol: Protocol::of(head.version),
        },
        body,
    })
}

#[cfg(test)]
mod tests;
