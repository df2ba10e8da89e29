//! Why an HTTP/1 exchange failed before the answer's head, and what that
//! means for a retry (the parent modules' "Was the request sent?").

use std::io;

use actix_http::error::ParseError;

use super::{Conn, MAX_HEADERS};
use crate::outcome::ErrorKind;
use crate::transport::{TransportError, MAX_HEAD};

/// Why an exchange failed before the answer's head, for [`kind`].
#[derive(Debug)]
pub(super) enum Failure {
    /// The write failed.
    Write(io::Error),
    /// EOF before the answer's head was complete.
    Eof,
    /// A read failed before the answer's head was complete.
    Read(io::Error),
    /// The answer's head made no sense to the codec.
    Garbled(ParseError),
    /// The answer's head parsed, but breaks HTTP/1.1's framing rules.
    Malformed(&'static str),
}

/// What a failure before the head means for a retry (the parent module's
/// "Was the request sent?"): `reused` when the connection came from the
/// pool, `one_write` when the request fits one write, `answered` when some
/// bytes of the answer had arrived.
pub(super) fn kind(failure: &Failure, reused: bool, one_write: bool, answered: bool) -> ErrorKind {
    match failure {
        Failure::Write(_) if reused || one_write => ErrorKind::NotSent,
        Failure::Eof | Failure::Read(_) if reused && !answered => ErrorKind::NotSent,
        _ => ErrorKind::Reset,
    }
}

pub(super) fn failed(failure: Failure, conn: &Conn, one_write: bool) -> TransportError {
    let answered = !conn.framed.is_read_buf_empty();
    let kind = kind(&failure, conn.meta.reused, one_write, answered);
    let what = match &failure {
        Failure::Write(e) => format!("failed to send the request: {e}"),
        Failure::Eof if answered => "the connection closed within the answer's head".to_owned(),
        Failure::Eof => "the connection closed before the answer".to_owned(),
        Failure::Read(e) => format!("read error before the answer's head: {e}"),
        Failure::Garbled(ParseError::TooLarge) => format!(
            "a malformed answer: its head is over {} KiB or {} headers",
            MAX_HEAD / 1024,
            MAX_HEADERS
        ),
        Failure::Garbled(e) => format!("a malformed answer: {e}"),
        Failure::Malformed(why) => format!("a malformed answer: {why}"),
    };
    let on = if conn.meta.reused { "reused" } else { "new" };
    TransportError::new(kind, format!("{what} (on a {on} connection)"))
}

pub(super) fn invalid(detail: impl Into<String>) -> TransportError {
    TransportError::new(ErrorKind::Invalid, detail)
}
