//! [`AwcTransport`]: awc set up for an engine, one exchange per attempt,
//! and awc's errors classified by what they mean for a retry (the rules are
//! in the parent module's "Was the request sent?").
//!
//! The client follows no redirect (the node that answers must be the node
//! the task was sent to), has no connection cap of its own (`limit(0)`:
//! `max_concurrent` is the cap) and no awc timeout (the node bounds every
//! attempt, head and body, with one timer of its own). Its TCP connector is
//! wrapped ([`super::watch`]) so that an attempt knows whether it opened its
//! connection; TLS handshake failures are found as rustls's error inside
//! awc's `ConnectError::Io`.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use actix_tls::connect::Resolver;
use awc::error::{ConnectError, PayloadError, SendRequestError};
use awc::http::header::HeaderMap;
use awc::http::uri::Authority;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::stream::StreamExt;

use super::h2::{self, H2Pool, Route};
#[cfg(feature = "tls")]
use super::tls;
use super::watch::{Counts, Sending, WatchEof, WatchedConnector};
use super::{ConnectionSettings, HttpReply, HttpRequest, StreamedReply, Transport, TransportError};
use crate::outcome::{ErrorKind, Protocol};

/// Largest request that awc writes in one piece (its write buffer's high
/// water mark), so that a failed write means no byte of it left.
const ONE_WRITE: usize = 8 * 1024;

/// awc, set up for an engine: no redirects, no connection cap, own timeouts,
/// connections kept as configured, and reuse known (see [the module
/// docs](super)).
pub struct AwcTransport {
    client: RefCell<awc::Client>,
    connect_timeout: Duration,
    counts: Rc<Counts>,
    /// The node's HTTP/2 connections (module `h2`): awc lends a
    /// connection to one request at a time, so HTTP/2 is kept here.
    h2: RefCell<H2Pool>,
}

impl AwcTransport {
    /// A client whose connects give up after `connect_timeout`, with the
    /// default [`ConnectionSettings`].
    pub fn new(connect_timeout: Duration) -> Self {
        let counts = Rc::<Counts>::default();
        let settings = ConnectionSettings::default();
        #[cfg(feature = "tls")]
        let tls = tls::client_config(None);
        let client = client(
            connect_timeout,
            &settings,
            &counts,
            None,
            #[cfg(feature = "tls")]
            tls.clone(),
        );
        let h2 = H2Pool::new(
            &settings,
            connect_timeout,
            #[cfg(feature = "tls")]
            tls,
        );
        Self {
            client: RefCell::new(client),
            connect_timeout,
            counts,
            h2: RefCell::new(h2),
        }
    }
}

/// A client for a lease's caller ([`crate::Lease::client`]): connected as
/// the engine's (TLS, keep-alive, connection age, no redirects), with the
/// endpoint's configured headers on every request and `timeout` per request.
pub(crate) fn caller_client(
    settings: &ConnectionSettings,
    timeout: Duration,
    headers: &crate::config::HeaderSet,
) -> awc::Client {
    client(
        timeout,
        settings,
        &Rc::default(),
        Some((headers, timeout)),
        #[cfg(feature = "tls")]
        tls::client_config(settings.tls.as_ref()),
    )
}

/// The engine's client (`caller`: `None`), or a lease caller's (its
/// default headers and request timeout).
fn client(
    connect_timeout: Duration,
    settings: &ConnectionSettings,
    counts: &Rc<Counts>,
    caller: Option<(&crate::config::HeaderSet, Duration)>,
    #[cfg(feature = "tls")] tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> awc::Client {
    let tcp = WatchedConnector::new(
        actix_tls::connect::Connector::new(Resolver::default()).service(),
        counts.clone(),
    );
    let connector = awc::Connector::new()
        .connector(tcp)
        .limit(0)
        .timeout(connect_timeout)
        .conn_keep_alive(settings.keep_alive)
        .conn_lifetime(settings.max_connection_age);
    #[cfg(feature = "tls")]
    let connector = match tls {
        Some(config) => connector.rustls_0_23(config),
        None => connector,
    };
    // No awc timeout: the node bounds every attempt (head and body) with
    // one timer of its own, so each request costs one timer, not two.
    let builder = awc::Client::builder()
        .disable_redirects()
        .connector(connector);
    match caller {
        None => builder.disable_timeout().finish(),
        Some((headers, timeout)) => headers
            .iter()
            .fold(builder.timeout(timeout), |b, h| {
                b.add_default_header((h.name.clone(), h.value.expose().clone()))
            })
            .finish(),
    }
}

// Each method boxes one future: the exchange up to the head is inlined in
// it, not boxed on its own.
impl Transport for AwcTransport {
    fn configure(&self, settings: &ConnectionSettings) {
        #[cfg(feature = "tls")]
        let tls = tls::client_config(settings.tls.as_ref());
        *self.client.borrow_mut() = client(
            self.connect_timeout,
            settings,
            &self.counts,
            None,
            #[cfg(feature = "tls")]
            tls.clone(),
        );
        *self.h2.borrow_mut() = H2Pool::new(
            settings,
            self.connect_timeout,
            #[cfg(feature = "tls")]
            tls,
        );
    }

    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        self.by_route(req, h2::send, |client, counts, req| {
            let max_body = req.max_body;
            whole(exchange(client, counts, req), max_body)
        })
    }

    fn send_streaming(
        &self,
        req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<StreamedReply, TransportError>> {
        self.by_route(req, h2::send_streaming, |client, counts, req| {
            streamed(exchange(client, counts, req), counts.clone())
        })
    }
}

impl AwcTransport {
    /// Sends `req` the way its URL goes, the one place that chooses: over
    /// the node's HTTP/2 connection (`over_h2`) when its pool takes the URL
    /// and the server speaks h2, else with awc (`over_awc`, given the
    /// client and the reuse counts): at once for a URL the pool does not
    /// take, after the first connection's ALPN for one it does.
    fn by_route<T, H2, H2Fut, H1, H1Fut>(
        &self,
        req: HttpRequest,
        over_h2: H2,
        over_awc: H1,
    ) -> LocalBoxFuture<'static, Result<T, TransportError>>
    where
        T: 'static,
        H2: FnOnce(h2::Conn, HttpRequest) -> H2Fut + 'static,
        H2Fut: Future<Output = Result<T, TransportError>> + 'static,
        H1: FnOnce(&awc::Client, &Rc<Counts>, HttpRequest) -> H1Fut + 'static,
        H1Fut: Future<Output = Result<T, TransportError>> + 'static,
    {
        if !self.h2.borrow().takes(&req.url) {
            return Box::pin(over_awc(&self.client.borrow(), &self.counts, req));
        }
        let uri = match awc::http::Uri::try_from(req.url.as_str()) {
            Ok(uri) => uri,
            Err(e) => {
                let e = TransportError::new(ErrorKind::Invalid, e.to_string());
                return Box::pin(std::future::ready(Err(e)));
            }
        };
        let route = self.h2.borrow().route(&uri);
        let (client, counts) = (self.client.borrow().clone(), self.counts.clone());
        Box::pin(async move {
            match route.await? {
                Route::H2(conn) => over_h2(conn, req).await,
                Route::Http1 => over_awc(&client, &counts, req).await,
            }
        })
    }
}

/// The whole answer of an exchange over awc, its body read under `max_body`.
async fn whole(
    head: impl Future<Output = Result<Head, TransportError>>,
    max_body: usize,
) -> Result<HttpReply, TransportError> {
    let Head {
        status,
        protocol,
        mut res,
    } = head.await?;
    // The body's reader first: it refuses a declared length over the
    // limit before reading a byte, which needs the headers.
    let body = res.body().limit(max_body);
    let (headers, _) = take_headers(res);
    let body = body.await.map_err(classify_payload)?;
    Ok(HttpReply {
        status,
        headers,
        body,
        protocol,
    })
}

/// The head of an exchange over awc, its body a stream.
async fn streamed(
    head: impl Future<Output = Result<Head, TransportError>>,
    counts: Rc<Counts>,
) -> Result<StreamedReply, TransportError> {
    let Head {
        status,
        protocol,
        res,
    } = head.await?;
    let (headers, res) = take_headers(res);
    // A body framed by its length or chunks that meets the connection's
    // end is cut; awc's HTTP/1 payload reports that as a clean end, so the
    // reads of its poll are watched.
    let framed = protocol == Some(Protocol::Http1)
        && (headers.contains_key(awc::http::header::CONTENT_LENGTH)
            || headers.contains_key(awc::http::header::TRANSFER_ENCODING));
    // The payload is read only as the node polls it: a dropped stream
    // drops the unread body, which closes the connection.
    let body = WatchEof::new(
        res.map(|chunk| chunk.map_err(classify_payload)),
        counts,
        framed,
    )
    .boxed_local();
    Ok(StreamedReply {
        head: HttpReply {
            status,
            headers,
            body: Bytes::new(),
            protocol,
        },
        body,
    })
}

/// The head of an answer: status, protocol, and the response with its
/// headers and its body unread.
struct Head {
    status: u16,
    protocol: Option<Protocol>,
    res: awc::ClientResponse,
}

/// The headers of `res`, taken out of its head rather than cloned, and the
/// response without them.
fn take_headers(res: awc::ClientResponse) -> (HeaderMap, awc::ClientResponse) {
    let mut headers = HeaderMap::new();
    let res = res.map_body(|head, payload| {
        headers = std::mem::take(&mut head.headers);
        payload
    });
    (headers, res)
}

/// Sends `req` with `client` and waits for the answer's head, classifying
/// a failure before it (see the module docs).
fn exchange(
    client: &awc::Client,
    counts: &Rc<Counts>,
    req: HttpRequest,
) -> impl Future<Output = Result<Head, TransportError>> {
    let one_write = req.body.len()
        + req.url.len()
        + req
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
        + 256
        <= ONE_WRITE;
    // The URL moves into awc's `Uri` without a copy; the endpoint is
    // kept (a shared count) for the message of a failed handshake.
    let mut r = client.request(req.method, req.url);
    let endpoint = r.get_uri().authority().cloned();
    if !req.headers.is_empty() {
        // Append, not insert: a task's repeated headers (two `accept`)
        // are kept.
        let headers = r.headers_mut();
        for (k, v) in req.headers {
            headers.append(k, v);
        }
    }
    let sending = Sending::new(r.send_body(req.body), counts.clone());
    async move {
        let (res, reused) = sending.await;
        let res = res.map_err(|e| {
            let mut err = classify_send(e, reused, one_write);
            if err.kind == ErrorKind::Tls {
                let endpoint = endpoint.as_ref().map_or("", Authority::as_str);
                err.detail = format!("TLS with {endpoint}: {}", err.detail);
            }
            err
        })?;
        let status = res.status().as_u16();
        let protocol = Protocol::of(res.version());
        Ok(Head {
            status,
            protocol,
            res,
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

#[cfg(test)]
mod tests;
