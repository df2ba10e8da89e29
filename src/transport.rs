//! How one attempt reaches a backend: a small trait, and awc behind it.
//!
//! Every [`crate::actors::NodeActor`] owns one [`Transport`], made on the
//! node's own thread by a [`TransportFactory`] (awc's `Client` is `!Send`).
//! The default, [`AwcTransport`], disables redirects (the node that answers
//! must be the node the task was sent to), lifts awc's 100-connection limit
//! (`max_concurrent` is the cap), reads the body under a size limit, and maps
//! awc's errors onto [`ErrorKind`]s by what they mean for a retry: connect
//! failures were never sent; timeouts and resets are ambiguous.
//!
//! Benchmarks and tests of pure scheduling may plug another transport with
//! [`crate::DispatcherBuilder::transport`]; behaviour tests use the real one.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use awc::error::{ConnectError, PayloadError, SendRequestError};
use awc::http::header::{HeaderMap, HeaderName, HeaderValue};
use awc::http::Method;
use bytes::Bytes;
use futures::future::LocalBoxFuture;

use crate::outcome::ErrorKind;

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
}

/// Builds a node's transport on the node's thread; gets the endpoint address.
pub type TransportFactory = Arc<dyn Fn(&str) -> Rc<dyn Transport> + Send + Sync>;

/// The default factory: one [`AwcTransport`] per node.
pub fn awc_factory(connect_timeout: Duration) -> TransportFactory {
    Arc::new(move |_addr: &str| Rc::new(AwcTransport::new(connect_timeout)) as Rc<dyn Transport>)
}

/// awc, set up for an engine: no redirects, no connection cap, own timeouts.
pub struct AwcTransport {
    client: awc::Client,
}

impl AwcTransport {
    /// A client whose connects give up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        let connector = awc::Connector::new().limit(0).timeout(connect_timeout);
        // No awc timeout: the node bounds every attempt (head and body) with
        // one timer of its own, so each request costs one timer, not two.
        let client = awc::Client::builder()
            .disable_redirects()
            .disable_timeout()
            .connector(connector)
            .finish();
        Self { client }
    }
}

impl Transport for AwcTransport {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let mut r = self.client.request(req.method, req.url.as_str());
        // Append, not insert: a task's repeated headers (two `accept`) are kept.
        for (k, v) in req.headers {
            r = r.append_header((k, v));
        }
        let max_body = req.max_body;
        let send = r.send_body(req.body);
        Box::pin(async move {
            let res = send.await.map_err(classify_send)?;
            let status = res.status().as_u16();
            // Take the headers out of the response head rather than cloning them.
            let mut headers = HeaderMap::new();
            let mut res = res.map_body(|head, payload| {
                headers = std::mem::take(&mut head.headers);
                payload
            });
            let body = res.body().limit(max_body).await.map_err(classify_payload)?;
            Ok(HttpReply {
                status,
                headers,
                body,
            })
        })
    }
}

/// awc's send errors by what they mean for a retry (see ACTIX notes).
fn classify_send(e: SendRequestError) -> TransportError {
    let kind = match &e {
        SendRequestError::Connect(ConnectError::Disconnected) => ErrorKind::Reset,
        SendRequestError::Connect(ConnectError::Timeout) => ErrorKind::Connect,
        SendRequestError::Connect(_) => ErrorKind::Connect,
        SendRequestError::Timeout => ErrorKind::Timeout,
        SendRequestError::Url(_) | SendRequestError::Http(_) | SendRequestError::Body(_) => {
            ErrorKind::Invalid
        }
        SendRequestError::Send(_) | SendRequestError::Response(_) | SendRequestError::H2(_) => {
            ErrorKind::Reset
        }
        _ => ErrorKind::Reset,
    };
    TransportError::new(kind, e.to_string())
}

fn classify_payload(e: PayloadError) -> TransportError {
    let kind = match &e {
        PayloadError::Overflow => ErrorKind::Body,
        PayloadError::Incomplete(_) | PayloadError::Io(_) => ErrorKind::Reset,
        _ => ErrorKind::Body,
    };
    TransportError::new(kind, e.to_string())
}
