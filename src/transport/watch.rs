//! What awc does not say: whether a request went out on a reused
//! connection, and whether a streamed body ended because the connection
//! closed (see "Was the request sent?" and "Streamed bodies" in the parent
//! module).
//!
//! awc opens and writes HTTP/1.1 connections inside the poll of the
//! request's own future, on the node's thread, and its HTTP/1 payload reads
//! its connection inside the poll of the body. So the transport wraps awc's
//! TCP connector ([`WatchedConnector`]) and each connection it opens
//! ([`WatchedIo`]), and they count what they see in the transport's
//! [`Counts`]: connections opened, and reads that found a connection
//! closed. A future reads a count before and after each poll of its own;
//! what changed in between happened inside that poll, on its behalf (one
//! thread, one poll at a time). So [`Sending`] knows whether its attempt
//! opened a connection (one that opened none went out on a pooled
//! connection), and [`WatchEof`] whether its body's reads met the
//! connection's end: a framed body that ends after such a read is cut,
//! though awc ends the stream as if it were complete.
//!
//! Per request this costs two reads of a `Cell` per poll and one count held
//! by the request's future; per read of a connection, one comparison.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_service::Service;
use actix_tls::connect::{ConnectError as TcpConnectError, ConnectInfo, Connection};
use awc::http::Uri;
use bytes::Bytes;
use futures::future::LocalBoxFuture;

use super::TransportError;
use crate::outcome::ErrorKind;

/// What a transport's connector and connections saw, counted (wrapping):
/// a future compares a count across its own poll.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Connections opened by the connector.
    opened: Cell<u32>,
    /// Reads that found their connection closed.
    closed: Cell<u32>,
}

fn bump(count: &Cell<u32>) {
    count.set(count.get().wrapping_add(1));
}

// === impl Sending ===

/// An attempt's future until the answer's head, noting whether awc opened a
/// connection inside one of its polls; resolves to its output and whether
/// the attempt went out on a reused connection (it opened none).
pub(super) struct Sending<F> {
    inner: F,
    counts: Rc<Counts>,
    opened: bool,
}

impl<F> Sending<F> {
    pub(super) fn new(inner: F, counts: Rc<Counts>) -> Self {
        Self {
            inner,
            counts,
            opened: false,
        }
    }
}

impl<F: Future + Unpin> Future for Sending<F> {
    /// The output, and whether the connection was a reused one.
    type Output = (F::Output, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let before = this.counts.opened.get();
        let out = Pin::new(&mut this.inner).poll(cx);
        this.opened |= this.counts.opened.get() != before;
        out.map(|out| (out, !this.opened))
    }
}

// === impl WatchEof ===

/// A streamed body that notes whether a read inside one of its polls found
/// the connection closed (awc's HTTP/1 payload reads its connection inside
/// that poll): a framed body whose poll met the connection's end before the
/// body's own end was cut, though awc ends the stream as if it were
/// complete.
pub(super) struct WatchEof<S> {
    inner: S,
    counts: Rc<Counts>,
    /// A read found the connection closed.
    seen: bool,
    /// Whether the body has a length or chunks (not ended by the close).
    framed: bool,
    done: bool,
}

impl<S> WatchEof<S> {
    pub(super) fn new(inner: S, counts: Rc<Counts>, framed: bool) -> Self {
        Self {
            inner,
            counts,
            seen: false,
            framed,
            done: false,
        }
    }
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
        let before = this.counts.closed.get();
        let out = Pin::new(&mut this.inner).poll_next(cx);
        this.seen |= this.counts.closed.get() != before;
        match out {
            Poll::Ready(None) if this.framed && this.seen => {
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

/// A TCP connection that counts the reads that find it closed (see
/// [`WatchEof`]).
#[derive(Debug)]
pub(super) struct WatchedIo {
    io: actix_rt::net::TcpStream,
    counts: Rc<Counts>,
}

impl tokio::io::AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let room = buf.remaining();
        let out = Pin::new(&mut this.io).poll_read(cx, buf);
        // Nothing read into a buffer with room: the connection's end.
        if room > 0 && buf.remaining() == room && matches!(out, Poll::Ready(Ok(()))) {
            bump(&this.counts.closed);
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

// === impl WatchedConnector ===

/// awc's TCP connector, counting the connections it opens (see
/// [`Sending`]) and wrapping each in a [`WatchedIo`].
#[derive(Clone)]
pub(super) struct WatchedConnector<S> {
    inner: S,
    counts: Rc<Counts>,
}

impl<S> WatchedConnector<S> {
    pub(super) fn new(inner: S, counts: Rc<Counts>) -> Self {
        Self { inner, counts }
    }
}

impl<S> Service<ConnectInfo<Uri>> for WatchedConnector<S>
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
        bump(&self.counts.opened);
        let connect = self.inner.call(req);
        let counts = self.counts.clone();
        // One box per connection, not per request.
        Box::pin(async move {
            let (io, conn) = connect.await?.replace_io(());
            Ok(conn.replace_io(WatchedIo { io, counts }).1)
        })
    }
}
