//! Opening a node's connections, for both of its HTTP paths (`h1`, `h2`):
//! TCP through actix-tls's connector and resolver under `connect_timeout`,
//! then, for `https://` (feature `tls`), rustls under the same limit with
//! the node's config and its ALPN list. One place, so that a failed
//! handshake has the same words whichever path made the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ::awc::http::Uri;
use actix_rt::net::TcpStream;
use actix_service::Service;
use actix_tls::connect::{ConnectInfo, Connector, Resolver};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::TransportError;
use crate::outcome::ErrorKind;

/// One connection to a backend: plain TCP, or rustls over it.
#[derive(Debug)]
pub(super) enum Io {
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Io {
    /// Whether the server chose HTTP/2 over ALPN (never for plain TCP).
    pub(super) fn chose_h2(&self) -> bool {
        match self {
            Io::Tcp(_) => false,
            #[cfg(feature = "tls")]
            Io::Tls(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }
}

/// The host (without an IPv6 literal's brackets) and port of `uri`.
pub(super) fn host_port(uri: &Uri) -> (&str, u16) {
    let https = uri.scheme_str() == Some("https");
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    (host, uri.port_u16().unwrap_or(if https { 443 } else { 80 }))
}

/// Connects to `uri`'s host within `limit`; then, when `uri` is
/// `https://`, makes the TLS handshake with `tls` (feature `tls`; `None`:
/// no usable config, see `tls::client_config`). Errors are
/// [`ErrorKind::Connect`], or [`ErrorKind::Tls`] for a refused handshake
/// (its detail: "TLS with host:port: reason").
pub(super) async fn open(
    uri: &Uri,
    limit: Duration,
    #[cfg(feature = "tls")] tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Io, TransportError> {
    let (host, port) = host_port(uri);
    let connect = Connector::new(Resolver::default())
        .service()
        .call(ConnectInfo::new(uri.clone()));
    let tcp = tokio::time::timeout(limit, connect)
        .await
        .map_err(|_| {
            TransportError::new(
                ErrorKind::Connect,
                format!("connect timeout after {limit:?}"),
            )
        })?
        .map_err(|e| {
            TransportError::new(ErrorKind::Connect, format!("connect to {host}:{port}: {e}"))
        })?
        .into_parts()
        .0;
    let _ = tcp.set_nodelay(true);
    if uri.scheme_str() != Some("https") {
        return Ok(Io::Tcp(tcp));
    }
    #[cfg(feature = "tls")]
    {
        let endpoint = format!("{host}:{port}");
        let Some(config) = tls else {
            return Err(TransportError::new(
                ErrorKind::Tls,
                format!("TLS with {endpoint}: no usable TLS config"),
            ));
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
            TransportError::new(ErrorKind::Tls, format!("TLS with {endpoint}: {e}"))
        })?;
        let tls = tokio::time::timeout(
            limit,
            tokio_rustls::TlsConnector::from(config).connect(name, tcp),
        )
        .await
        .map_err(|_| {
            TransportError::new(
                ErrorKind::Connect,
                format!("TLS handshake timeout after {limit:?}"),
            )
        })?
        .map_err(|e| tls_error(&endpoint, e))?;
        Ok(Io::Tls(Box::new(tls)))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = tcp;
        Err(TransportError::new(
            ErrorKind::Connect,
            format!("{host}:{port}: https:// needs the `tls` feature"),
        ))
    }
}

/// A failed handshake: rustls's reason in words when it gave one.
#[cfg(feature = "tls")]
fn tls_error(endpoint: &str, e: io::Error) -> TransportError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(t) => TransportError::new(
            ErrorKind::Tls,
            format!("TLS with {endpoint}: {}", super::tls::describe(t)),
        ),
        None => TransportError::new(ErrorKind::Connect, format!("TLS with {endpoint}: {e}")),
    }
}

// === impl Io ===

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(io) => Pin::new(io).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(io) => Pin::new(io).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(io) => io.is_write_vectored(),
            #[cfg(feature = "tls")]
            Io::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(io) => Pin::new(io).poll_flush(cx),
            #[cfg(feature = "tls")]
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}
