//! [`AwcTransport`]: the node's default transport, and awc set up for a
//! lease's caller.
//!
//! [`AwcTransport`] sends HTTP/1.1 over the node's own connections and
//! codec (module `h1`) and HTTP/2 over the node's multiplexed connections
//! (module `h2`); [`AwcTransport::by_route`] is the one place that chooses.
//! It follows no redirect (the node that answers must be the node the task
//! was sent to), has no connection cap of its own (`max_concurrent` is the
//! cap) and no timeout of its own (the node bounds every attempt, head and
//! body, with one timer).
//!
//! awc itself serves [`crate::Lease::client`] ([`caller_client`]): the
//! caller gets an awc `Client` connected as the engine's (TLS, keep-alive,
//! connection age, no redirects).

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use actix_tls::connect::Resolver;
use futures::future::LocalBoxFuture;

use super::h1::{self, H1Pool};
use super::h2::{self, H2Pool, Route};
#[cfg(feature = "tls")]
use super::tls;
use super::{ConnectionSettings, HttpReply, HttpRequest, StreamedReply, Transport, TransportError};
use crate::outcome::ErrorKind;

/// The engine's transport: HTTP/1.1 over the node's own pool and codec,
/// HTTP/2 over its multiplexed connections, no redirects, no connection
/// cap, own timeouts, connections kept as configured (see [the module
/// docs](super)). The name is kept from when awc carried every request.
pub struct AwcTransport {
    connect_timeout: Duration,
    /// The node's HTTP/1 connections (module `h1`).
    h1: RefCell<H1Pool>,
    /// The node's HTTP/2 connections (module `h2`).
    h2: RefCell<H2Pool>,
}

impl AwcTransport {
    /// A transport whose connects give up after `connect_timeout`, with
    /// the default [`ConnectionSettings`].
    pub fn new(connect_timeout: Duration) -> Self {
        let (h1, h2) = pools(&ConnectionSettings::default(), connect_timeout);
        Self {
            connect_timeout,
            h1: RefCell::new(h1),
            h2: RefCell::new(h2),
        }
    }
}

/// The node's HTTP/1 and HTTP/2 pools for `settings`, sharing one rustls
/// config (feature `tls`).
fn pools(settings: &ConnectionSettings, connect_timeout: Duration) -> (H1Pool, H2Pool) {
    #[cfg(feature = "tls")]
    let tls = tls::client_config(settings.tls.as_ref());
    let h1 = H1Pool::new(
        settings,
        connect_timeout,
        #[cfg(feature = "tls")]
        tls.clone(),
    );
    let h2 = H2Pool::new(
        settings,
        connect_timeout,
        #[cfg(feature = "tls")]
        tls,
    );
    (h1, h2)
}

/// A client for a lease's caller ([`crate::Lease::client`]): connected as
/// the engine's (TLS, keep-alive, connection age, no redirects), with
/// `timeout` per request and `scoped` around it (the endpoint's configured
/// headers on requests to the endpoint only).
pub(crate) fn caller_client(
    settings: &ConnectionSettings,
    timeout: Duration,
    scoped: super::ScopedHeaders,
) -> awc::Client {
    let tcp = actix_tls::connect::Connector::new(Resolver::default()).service();
    let connector = awc::Connector::new()
        .connector(tcp)
        .limit(0)
        .timeout(timeout)
        .conn_keep_alive(settings.keep_alive)
        .conn_lifetime(settings.max_connection_age);
    #[cfg(feature = "tls")]
    let connector = match tls::client_config(settings.tls.as_ref()) {
        Some(config) => connector.rustls_0_23(config),
        None => connector,
    };
    awc::Client::builder()
        .disable_redirects()
        .connector(connector)
        .timeout(timeout)
        .wrap(scoped)
        .finish()
}

// Each method boxes one future: the exchange is inlined in it, not boxed
// on its own.
impl Transport for AwcTransport {
    fn configure(&self, settings: &ConnectionSettings) {
        let (h1, h2) = pools(settings, self.connect_timeout);
        *self.h1.borrow_mut() = h1;
        *self.h2.borrow_mut() = h2;
    }

    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        self.by_route(req, h2::send, h1::send)
    }

    fn send_streaming(
        &self,
        req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<StreamedReply, TransportError>> {
        self.by_route(req, h2::send_streaming, h1::send_streaming)
    }
}

impl AwcTransport {
    /// Sends `req` the way its URL goes, the one place that chooses: over
    /// the node's HTTP/2 connection (`over_h2`) when its pool takes the URL
    /// and the server speaks h2, else over the node's HTTP/1 pool
    /// (`over_h1`): at once for a URL the HTTP/2 pool does not take, after
    /// the first connection's ALPN for one it does.
    fn by_route<T, H2, H2Fut, H1, H1Fut>(
        &self,
        req: HttpRequest,
        over_h2: H2,
        over_h1: H1,
    ) -> LocalBoxFuture<'static, Result<T, TransportError>>
    where
        T: 'static,
        H2: FnOnce(h2::Conn, HttpRequest) -> H2Fut + 'static,
        H2Fut: Future<Output = Result<T, TransportError>> + 'static,
        H1: FnOnce(H1Pool, HttpRequest) -> H1Fut + 'static,
        H1Fut: Future<Output = Result<T, TransportError>> + 'static,
    {
        if !self.h2.borrow().takes(&req.url) {
            return Box::pin(over_h1(self.h1.borrow().clone(), req));
        }
        let uri = match awc::http::Uri::try_from(req.url.as_str()) {
            Ok(uri) => uri,
            Err(e) => {
                let e = TransportError::new(ErrorKind::Invalid, e.to_string());
                return Box::pin(std::future::ready(Err(e)));
            }
        };
        let h2 = self.h2.borrow().clone();
        let route = h2.route(&uri);
        let h1 = self.h1.borrow().clone();
        Box::pin(async move {
            match route.await? {
                Route::H2(conn) => over_h2(conn, req).await,
                Route::Http1 => {
                    // The connection that learnt the server's choice is
                    // new: the first request over HTTP/1.1 goes on it.
                    if let Some(io) = h2.take_http1() {
                        h1.adopt(&uri, io);
                    }
                    over_h1(h1, req).await
                }
            }
        })
    }
}

#[cfg(test)]
impl AwcTransport {
    /// The node's HTTP/1 pool (the one `configure` made last).
    pub(super) fn h1_pool(&self) -> H1Pool {
        self.h1.borrow().clone()
    }
}
