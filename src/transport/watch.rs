//! What awc does not say: whether a request went out on a reused
//! connection, and whether a streamed body ended because the connection
//! closed (see "Was the request sent?" and "Streamed bodies" in the parent
//! module).
//!
//! awc opens and writes HTTP/1.1 connections inside the poll of the
//! request's own future, on the node's thread, and its HTTP/1 payload reads
//! its connection inside the poll of the body. So the engine wraps awc's
//! TCP connector ([`MarkOpened`]): while an attempt's future is polled,
//! [`Marked`] puts the attempt's mark in the transport's slot, and the
//! connector raises it when awc opens a connection. An attempt left
//! unmarked went out on a pooled connection. Each connection is wrapped in
//! the same way ([`WatchedIo`]): a read that finds it closed raises the mark
//! of the streamed body being polled ([`WatchEof`]), and a framed body that
//! ends after such a read is cut, though awc ends the stream as if it were
//! complete.

use std::cell::{Cell, RefCell};
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

/// The mark of the attempt being polled, if any: set by [`Marked`] around
/// each poll, raised by [`MarkOpened`] when awc opens a connection.
pub(super) type Slot = Rc<RefCell<Option<Rc<Cell<bool>>>>>;

// === impl Marked ===

/// An attempt's future, with its mark in the transport's slot while it is
/// polled: awc opens a connection (and writes an HTTP/1.1 request) inside
/// the poll of the request's own future.
pub(super) struct Marked<F> {
    pub(super) inner: F,
    pub(super) mark: Rc<Cell<bool>>,
    pub(super) slot: Slot,
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
pub(super) struct WatchEof<S> {
    pub(super) inner: S,
    pub(super) seen: Rc<Cell<bool>>,
    pub(super) slot: Slot,
    /// Whether the body has a length or chunks (not ended by the close).
    pub(super) framed: bool,
    pub(super) done: bool,
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
pub(super) struct WatchedIo {
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
pub(super) struct MarkOpened<S> {
    pub(super) inner: S,
    pub(super) slot: Slot,
    pub(super) eof: Slot,
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
