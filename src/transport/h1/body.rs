//! An answer's body over HTTP/1.1: read through the connection's payload
//! codec, the connection back in the pool only once the body's end was
//! read (see the parent module); or, for a body that runs to the
//! connection's close (module `framing`), every byte up to the close, the
//! connection then gone.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_codec::{Decoder, Framed};
use actix_http::error::PayloadError;
use actix_http::h1::{ClientCodec, ClientPayloadCodec};
use bytes::{Bytes, BytesMut};

use super::framing::Framing;
use super::{Conn, Inner, Io, Meta};
use crate::outcome::ErrorKind;
use crate::transport::TransportError;

/// A body being read, its connection back in the pool at its end.
pub(super) struct Body {
    reading: Reading,
    meta: Option<Meta>,
    pool: Rc<Inner>,
}

enum Reading {
    /// Framed by its length or chunks: the close before its end cuts it.
    Framed(Framed<Io, ClientPayloadCodec>),
    /// Ended by the connection's close, which is then never kept.
    ToClose(Framed<Io, ToClose>),
    Done,
}

/// The decoder of a body that runs to the close: whatever came, as it came.
pub(super) struct ToClose;

impl Decoder for ToClose {
    type Item = Bytes;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, io::Error> {
        Ok((!src.is_empty()).then(|| src.split().freeze()))
    }
}

impl Body {
    /// The body of `conn`'s answer, framed as `framing` says (not
    /// [`Framing::Empty`]: that answer has no body to read).
    pub(super) fn new(conn: Conn, pool: Rc<Inner>, framing: Framing) -> Self {
        let reading = match framing {
            Framing::ToClose => Reading::ToClose(conn.framed.into_map_codec(|_| ToClose)),
            _ => Reading::Framed(conn.framed.into_map_codec(ClientCodec::into_payload_codec)),
        };
        Body {
            reading,
            meta: Some(conn.meta),
            pool,
        }
    }

    /// The next chunk; `None` at the body's end (its connection then back
    /// in the pool if it may be kept).
    pub(super) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, TransportError>>> {
        let end = match &mut self.reading {
            Reading::Done => return Poll::Ready(None),
            Reading::ToClose(framed) => match Pin::new(framed).next_item(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => return Poll::Ready(Some(Ok(chunk))),
                Poll::Ready(None) => None,
                Poll::Ready(Some(Err(e))) => Some(TransportError::new(
                    ErrorKind::Reset,
                    format!("read error within a body ended by the close: {e}"),
                )),
            },
            Reading::Framed(framed) => match Pin::new(framed).next_item(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(Some(chunk)))) => return Poll::Ready(Some(Ok(chunk))),
                Poll::Ready(Some(Ok(None))) => {
                    let reading = std::mem::replace(&mut self.reading, Reading::Done);
                    if let (Reading::Framed(framed), Some(meta)) = (reading, self.meta.take()) {
                        self.pool.release(Conn {
                            framed: framed.into_map_codec(ClientPayloadCodec::into_message_codec),
                            meta,
                        });
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(None) => Some(TransportError::new(
                    ErrorKind::Reset,
                    "the connection closed before the end of the body",
                )),
                Poll::Ready(Some(Err(e))) => Some(classify_payload(e)),
            },
        };
        self.reading = Reading::Done;
        Poll::Ready(end.map(Err))
    }
}

impl futures::Stream for Body {
    type Item = Result<Bytes, TransportError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx)
    }
}

/// A body the codec could not read: cut or malformed chunks are the
/// node's doing ([`ErrorKind::Reset`]), a body it could not decode the
/// task's ([`ErrorKind::Body`]).
pub(super) fn classify_payload(e: PayloadError) -> TransportError {
    // The chunk decoder's word for a bad size line, extension or CRLF.
    let malformed = |e: &io::Error| e.kind() == io::ErrorKind::InvalidInput;
    match &e {
        PayloadError::Io(io) | PayloadError::Incomplete(Some(io)) if malformed(io) => {
            TransportError::new(ErrorKind::Reset, format!("a malformed chunked body: {io}"))
        }
        PayloadError::Incomplete(_) | PayloadError::Io(_) => {
            TransportError::new(ErrorKind::Reset, e.to_string())
        }
        _ => TransportError::new(ErrorKind::Body, e.to_string()),
    }
}

pub(super) fn over(max_body: usize) -> TransportError {
    TransportError::new(
        ErrorKind::Body,
        format!("response body over max_body ({max_body} bytes)"),
    )
}

/// The whole body, under `max_body`; a body that comes in one chunk is
/// not copied.
pub(super) async fn read_whole(mut body: Body, max_body: usize) -> Result<Bytes, TransportError> {
    let mut first = None::<Bytes>;
    let mut rest = BytesMut::new();
    let mut len = 0;
    while let Some(chunk) = poll_fn(|cx| body.poll_chunk(cx)).await {
        let chunk = chunk?;
        len += chunk.len();
        if len > max_body {
            return Err(over(max_body));
        }
        match &first {
            None if rest.is_empty() => first = Some(chunk),
            _ => {
                if let Some(f) = first.take() {
                    rest.extend_from_slice(&f);
                }
                rest.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}
