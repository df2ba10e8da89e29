//! Where an HTTP/1.x answer's body ends, and whether its connection may
//! carry another request: RFC 9112 §6.3 and §9.3, as a pure function of
//! the request's method and the answer's head.
//!
//! The codec (actix-http's `ClientCodec`) frames most answers right, but
//! not every one: it reads an HTTP/1.1 answer with neither
//! `Content-Length` nor `Transfer-Encoding` as empty (its body runs to the
//! close), waits for the body a `204` or `304` declares (they have none),
//! and lets `Transfer-Encoding` override a `Content-Length` beside it (a
//! sign of response splitting). Each of these leaves the connection out of
//! step with the answers on it, and a pooled connection out of step hands
//! one caller's answer to the next. So the exchange asks this module, not
//! the codec, and the codec only reads what this module framed.
//!
//! The rules, in RFC 9112 §6.3's order:
//!
//! 1. An answer to `HEAD`, a `1xx`, `204` or `304`: no body, whatever its
//!    headers say; a `2xx` to `CONNECT` is a tunnel, never kept.
//! 2. `Transfer-Encoding` with `Content-Length`: malformed (§6.3 ¶3: "ought
//!    to be handled as an error"); `Transfer-Encoding` in an HTTP/1.0 answer:
//!    malformed (§6.1); a coding other than `chunked` alone: malformed (the
//!    engine asks for none).
//! 3. `chunked`: its chunks; a valid `Content-Length`: that many bytes (the
//!    codec already refuses two of them, or one that is not a number).
//! 4. Neither: the body runs to the connection's close, which is then
//!    never kept.
//!
//! A connection is kept only when the answer is persistent (§9.3: HTTP/1.1
//! without `Connection: close`, HTTP/1.0 only with `keep-alive`), which the
//! codec read into the head's connection type, and its body is framed.

use ::awc::http::header::{HeaderMap, CONTENT_LENGTH, TRANSFER_ENCODING};
use ::awc::http::{Method, StatusCode, Version};
use actix_http::ResponseHead;

/// Where the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body.
    Empty,
    /// This many bytes (more than zero).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything up to the connection's close.
    ToClose,
}

/// What the request asked, as far as the answer's framing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    /// `HEAD`: the answer has no body.
    Head,
    /// `CONNECT`: a `2xx` answer is a tunnel.
    Connect,
    Other,
}

impl Asked {
    pub(super) fn of(method: &Method) -> Self {
        if *method == Method::HEAD {
            Asked::Head
        } else if *method == Method::CONNECT {
            Asked::Connect
        } else {
            Asked::Other
        }
    }
}

/// How to read an answer's body and what to do with its connection after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) framing: Framing,
    /// The connection may carry another request once the body is read.
    pub(super) keep: bool,
}

/// The plan for the final answer `head` to a request that `asked`, or why
/// the answer is malformed (its connection is then closed).
pub(super) fn plan(asked: Asked, head: &ResponseHead) -> Result<Plan, &'static str> {
    let tunnel = asked == Asked::Connect && head.status.is_success();
    framing(asked, head.status, head.version, &head.headers).map(|framing| Plan {
        framing,
        keep: head.keep_alive() && framing != Framing::ToClose && !tunnel,
    })
}

fn framing(
    asked: Asked,
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
) -> Result<Framing, &'static str> {
    if asked == Asked::Head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || (asked == Asked::Connect && status.is_success())
    {
        return Ok(Framing::Empty);
    }
    let length = headers.get(CONTENT_LENGTH);
    if let Some(coding) = headers.get(TRANSFER_ENCODING) {
        if length.is_some() {
            return Err("both Content-Length and Transfer-Encoding");
        }
        if version != Version::HTTP_11 {
            return Err("Transfer-Encoding in an HTTP/1.0 answer");
        }
        if !coding
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked")
        {
            return Err("a Transfer-Encoding other than chunked");
        }
        return Ok(Framing::Chunked);
    }
    match length {
        None => Ok(Framing::ToClose),
        Some(v) => match std::str::from_utf8(v.as_bytes()).map(|s| s.trim().parse::<u64>()) {
            Ok(Ok(0)) => Ok(Framing::Empty),
            Ok(Ok(n)) => Ok(Framing::Length(n)),
            _ => Err("a Content-Length that is not a number"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::awc::http::header::{HeaderValue, CONNECTION};
    use actix_http::ConnectionType;

    fn head(status: u16, version: Version, headers: &[(&str, &str)]) -> ResponseHead {
        let mut h = ResponseHead::new(StatusCode::from_u16(status).unwrap());
        h.version = version;
        for (k, v) in headers {
            let name = ::awc::http::header::HeaderName::from_bytes(k.as_bytes()).unwrap();
            if name == CONNECTION {
                // As the codec's decoder does.
                h.set_connection_type(if v.eq_ignore_ascii_case("close") {
                    ConnectionType::Close
                } else {
                    ConnectionType::KeepAlive
                });
            }
            h.headers.append(name, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn get(status: u16, headers: &[(&str, &str)]) -> Result<Plan, &'static str> {
        plan(Asked::Other, &head(status, Version::HTTP_11, headers))
    }

    fn kept(framing: Framing) -> Result<Plan, &'static str> {
        Ok(Plan {
            framing,
            keep: true,
        })
    }

    fn closed(framing: Framing) -> Result<Plan, &'static str> {
        Ok(Plan {
            framing,
            keep: false,
        })
    }

    #[test]
    fn a_framed_body_keeps_its_connection() {
        assert_eq!(
            get(200, &[("content-length", "5")]),
            kept(Framing::Length(5))
        );
        assert_eq!(
            get(200, &[("transfer-encoding", "chunked")]),
            kept(Framing::Chunked)
        );
        assert_eq!(
            get(200, &[("transfer-encoding", " Chunked ")]),
            kept(Framing::Chunked)
        );
        assert_eq!(get(200, &[("content-length", "0")]), kept(Framing::Empty));
        assert_eq!(
            get(500, &[("content-length", "3")]),
            kept(Framing::Length(3))
        );
    }

    #[test]
    fn an_http11_answer_with_neither_length_nor_chunks_runs_to_the_close() {
        assert_eq!(get(200, &[]), closed(Framing::ToClose));
        assert_eq!(
            get(200, &[("connection", "keep-alive")]),
            closed(Framing::ToClose)
        );
        let http10 = head(200, Version::HTTP_10, &[]);
        assert_eq!(plan(Asked::Other, &http10), closed(Framing::ToClose));
    }

    #[test]
    fn head_204_and_304_have_no_body_whatever_they_declare() {
        let declared = [("content-length", "100")];
        let head_req = head(200, Version::HTTP_11, &declared);
        assert_eq!(plan(Asked::Head, &head_req), kept(Framing::Empty));
        assert_eq!(get(204, &declared), kept(Framing::Empty));
        assert_eq!(get(304, &declared), kept(Framing::Empty));
        assert_eq!(get(204, &[]), kept(Framing::Empty));
        assert_eq!(
            get(304, &[("transfer-encoding", "chunked")]),
            kept(Framing::Empty)
        );
        assert_eq!(get(103, &[]), kept(Framing::Empty));
    }

    #[test]
    fn connection_close_and_http10_without_keep_alive_are_not_kept() {
        assert_eq!(
            get(200, &[("content-length", "2"), ("connection", "close")]),
            closed(Framing::Length(2))
        );
        assert_eq!(get(204, &[("connection", "close")]), closed(Framing::Empty));
        let http10 = |h: &[(&str, &str)]| plan(Asked::Other, &head(200, Version::HTTP_10, h));
        assert_eq!(
            http10(&[("content-length", "2")]),
            closed(Framing::Length(2))
        );
        assert_eq!(
            http10(&[("content-length", "2"), ("connection", "keep-alive")]),
            kept(Framing::Length(2))
        );
    }

    #[test]
    fn a_tunnel_is_never_kept() {
        let ok = head(200, Version::HTTP_11, &[]);
        assert_eq!(plan(Asked::Connect, &ok), closed(Framing::Empty));
        let refused = head(403, Version::HTTP_11, &[("content-length", "1")]);
        assert_eq!(plan(Asked::Connect, &refused), kept(Framing::Length(1)));
    }

    #[test]
    fn conflicting_framing_is_malformed() {
        assert_eq!(
            get(
                200,
                &[("content-length", "5"), ("transfer-encoding", "chunked")]
            ),
            Err("both Content-Length and Transfer-Encoding")
        );
        assert_eq!(
            get(200, &[("transfer-encoding", "gzip, chunked")]),
            Err("a Transfer-Encoding other than chunked")
        );
        assert_eq!(
            get(200, &[("transfer-encoding", "identity")]),
            Err("a Transfer-Encoding other than chunked")
        );
        let te10 = head(200, Version::HTTP_10, &[("transfer-encoding", "chunked")]);
        assert_eq!(
            plan(Asked::Other, &te10),
            Err("Transfer-Encoding in an HTTP/1.0 answer")
        );
        assert_eq!(
            get(200, &[("content-length", "x")]),
            Err("a Content-Length that is not a number")
        );
    }
}
