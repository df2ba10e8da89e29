//! An answer's body over HTTP/1.1: read through the connection's payload
//! codec, the connection back in the pool only once the body's end was
//! read (see the parent module).

use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use ::awc::http::header::{HeaderMap, CONTENT_LENGTH, TRANSFER_ENCODING};
use actix_codec::Framed;
use actix_http::error::PayloadError;
use actix_http::h1::{ClientCodec, ClientPayloadCodec};
use bytes::{Bytes, BytesMut};

use super::{Conn, Inner, Io, Meta};
use crate::outcome::ErrorKind;
use crate::transport::TransportError;

/// A body being read, its connection back in the pool at its end.
pub(super) struct Body {
    framed: Option<Framed<Io, ClientPayloadCodec>>,
    meta: Option<Meta>,
    pool: Rc<Inner>,
    /// Framed by a length or chunks (not ended by the connection's close):
    /// the close before its end cuts it.
    framed_body: bool,
}

impl Body {
    pub(super) fn new(conn: Conn, pool: Rc<Inner>, headers: &HeaderMap) -> Self {
        let framed_body =
            headers.contains_key(CONTENT_LENGTH) || headers.contains_key(TRANSFER_ENCODING);
        Body {
            framed: Some(conn.framed.into_map_codec(ClientCodec::into_payload_codec)),
            meta: Some(conn.meta),
            pool,
            framed_body,
        }
    }

    /// The next chunk; `None` at the body's end (its connection then back
    /// in the pool if it may be kept).
    pub(super) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, TransportError>>> {
        let Some(framed) = self.framed.as_mut() else {
            return Poll::Ready(None);
        };
        let item = match Pin::new(framed).next_item(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item,
        };
        match item {
            Some(Ok(Some(chunk))) => return Poll::Ready(Some(Ok(chunk))),
            Some(Ok(None)) => {
                if let (Some(framed), Some(meta)) = (self.framed.take(), self.meta.take()) {
                    self.pool.release(Conn {
                        framed: framed.into_map_codec(ClientPayloadCodec::into_message_codec),
                        meta,
                    });
                }
                return Poll::Ready(None);
            }
            _ => {}
        }
        self.framed = None;
        Poll::Ready(match item {
            None if self.framed_body => Some(Err(TransportError::new(
                ErrorKind::Reset,
                "the connection closed before the end of the body",
            ))),
            Some(Err(e)) => Some(Err(classify_payload(e))),
            _ => None,
        })
    }
}

impl futures::Stream for Body {
    type Item = Result<Bytes, TransportError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx)
    }
}

pub(super) fn classify_payload(e: PayloadError) -> TransportError {
    let kind = match &e {
        PayloadError::Overflow => ErrorKind::Body,
        PayloadError::Incomplete(_) | PayloadError::Io(_) => ErrorKind::Reset,
        _ => ErrorKind::Body,
    };
    TransportError::new(kind, e.to_string())
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
