//! The HTTP syntax a request of the engine must keep: a path that stays
//! under its endpoint's prefix, and headers that do not change where or how
//! the request travels. Tasks, leases, the config's fixed headers and health
//! checks, and the durable stream's entries are all checked here (public as
//! [`crate::task::check_path`] and [`crate::task::check_header_name`]).
//!
//! A task's path is appended to an endpoint address such as `http://h/v1/`.
//! Servers and proxies normalise dot-segments (RFC 3986 §5.2.4) and many
//! decode `%2e`, `%2f` and `%5c` first, or treat `\` as `/` (IIS, some
//! proxies), or drop `;params` from a segment (Tomcat's `..;/`). So the path
//! part (before `?`) is refused when any spelling of it, percent-decoded
//! again and again (double encoding) with `\` read as `/` and `;params`
//! dropped, has a `.` or `..` segment; a dot there may be a fullwidth one
//! (U+FF0E and the other characters Unicode normalisation turns into `.`),
//! and a segment's trailing spaces are dropped first (`.. ` is `..` on
//! Windows). A decoding that holds NUL, CR or LF (`%00`) is refused too.
//! A `://`, a `..` or a `%00` in the query is data and fine.
//!
//! Headers that change routing or framing (`Host`, `Connection`,
//! `Transfer-Encoding`, `Content-Length`, `Upgrade`, `TE`, `Trailer`,
//! `Keep-Alive`, `Proxy-*`) belong to the engine and the HTTP client, not to
//! the task: a `Host: evil.example` would reach a virtual host the endpoint
//! was never meant to serve, and a framing header lets a request smuggle
//! another. They are refused at submit.
//!
//! ```
//! use actix_dispatch::task::{check_header_name, check_path};
//! assert!(check_path("/v1/chat?next=http://x/../y").is_ok());
//! assert!(check_path("/v1/%2E%2e/admin").is_err());
//! assert!(check_path("..%2f..%2fadmin").is_err());
//! assert!(check_path(r"\..\..\admin").is_err());
//! assert!(check_header_name("Host").is_err());
//! assert!(check_header_name("accept").is_ok());
//! ```

use bytes::Bytes;

/// How many rounds of percent-decoding are looked through; a path still
/// encoded after that many is refused (nobody encodes a path 4 times).
const DECODE_ROUNDS: usize = 4;

/// Checks that a path is relative to its endpoint, stays under the
/// endpoint's prefix, and is a valid URI path (with an optional query).
pub fn check_path(path: &str) -> Result<(), String> {
    if plainly_fine(path.as_bytes()) {
        return Ok(());
    }
    check_path_fully(path)
}

/// The common path in one pass, without a copy: it starts with one `/`,
/// has no `%`, `\`, `;` or `:` before its query, no `.` or `..`
/// segment, and only bytes [`PathAndQuery`] takes as they are (so no CR,
/// LF, NUL or `#`). Everything it accepts the full check accepts too (a
/// property test holds them together); anything else, including every
/// path that is refused, goes to [`check_path_fully`], which gives the
/// reason.
///
/// [`PathAndQuery`]: awc::http::uri::PathAndQuery
fn plainly_fine(path: &[u8]) -> bool {
    if path.len() > 8192 || path.first() != Some(&b'/') || path.get(1) == Some(&b'/') {
        return false;
    }
    // The current segment's length and how many of its bytes are dots.
    let (mut len, mut dots) = (0usize, 0usize);
    for (i, &b) in path.iter().enumerate() {
        match b {
            b'/' | b'?' => {
                if len > 0 && len == dots && dots <= 2 {
                    return false; // a `.` or `..` segment
                }
                if b == b'?' {
                    return path[i + 1..].iter().all(|&q| QUERY_BYTES[usize::from(q)]);
                }
                (len, dots) = (0, 0);
            }
            b'%' | b'\\' | b';' | b':' => return false,
            _ if PATH_BYTES[usize::from(b)] => {
                len += 1;
                dots += usize::from(b == b'.');
            }
            _ => return false,
        }
    }
    !(len > 0 && len == dots && dots <= 2)
}

/// [`check_path`] for any path: every rule, with the reason of a refusal.
fn check_path_fully(path: &str) -> Result<(), String> {
    // Bytes, not chars: these are ASCII, and a byte scan is much cheaper.
    if path.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err("path contains CR, LF or NUL".into());
    }
    if path.contains('#') {
        return Err(format!("path {path:?} has a fragment"));
    }
    let (part, _query) = path.split_once('?').unwrap_or((path, ""));
    if part.starts_with("//") || part.starts_with("\\\\") {
        return Err(format!(
            "path {path:?} starts with `//`: a path must be relative to the endpoint"
        ));
    }
    if part.contains("://") {
        return Err(format!(
            "path {path:?} is an absolute URL: a path must be relative to the endpoint"
        ));
    }
    if !part.starts_with('/') {
        let first = part.split(['/', '\\']).next().unwrap_or("");
        if first.contains(':') {
            return Err(format!(
                "path {path:?} starts with a scheme-like segment; start it with `/`"
            ));
        }
    }
    check_segments(path, part.as_bytes())?;
    if plainly_valid(path) {
        // What `PathAndQuery` accepts, checked without the copy it needs.
        return Ok(());
    }
    let with_slash = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    awc::http::uri::PathAndQuery::from_maybe_shared(Bytes::from(with_slash))
        .map_err(|e| format!("path {path:?} is not a valid URI path: {e}"))?;
    Ok(())
}

/// Whether `path` (no `#`) is made only of bytes the `http` crate's
/// `PathAndQuery` takes as they are, in the path and in the query: a subset
/// of what it accepts, so a path this passes needs no copy to be checked
/// (one allocation fewer per task); anything else goes to `PathAndQuery`,
/// which gives the error. Long paths go there too (it counts in `u16`).
fn plainly_valid(path: &str) -> bool {
    if path.len() > 8192 {
        return false;
    }
    let mut in_query = false;
    for &b in path.as_bytes() {
        let ok = if in_query {
            QUERY_BYTES[usize::from(b)]
        } else if b == b'?' {
            in_query = true;
            true
        } else {
            PATH_BYTES[usize::from(b)]
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The bytes `PathAndQuery` takes as they are before the `?` ...
static PATH_BYTES: [bool; 256] = byte_table(false);
/// ... and after it.
static QUERY_BYTES: [bool; 256] = byte_table(true);

const fn byte_table(query: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = if query {
            matches!(b, 0x21 | 0x24..=0x3B | 0x3D | 0x3F..=0x7E)
        } else {
            matches!(
                b,
                0x21 | 0x24..=0x3B | 0x3D | 0x40..=0x5F | 0x61..=0x7A | 0x7C | 0x7E | b'"' | b'{' | b'}'
            )
        };
        i += 1;
    }
    t
}

/// Refuses dot-segments in `part` and in every percent-decoding of it,
/// and a decoding that holds NUL, CR or LF (`%00`, `%0d`, `%0a`: C-based
/// servers end the path at the NUL, `/admin%00.png` reaches `/admin`).
fn check_segments(path: &str, part: &[u8]) -> Result<(), String> {
    let mut decoded: Option<Vec<u8>> = None;
    for _ in 0..=DECODE_ROUNDS {
        let current = decoded.as_deref().unwrap_or(part);
        if decoded.is_some() && current.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            return Err(format!(
                "path {path:?} decodes to CR, LF or NUL (`%0d`, `%0a`, `%00`)"
            ));
        }
        if has_dot_segment(current) {
            return Err(format!(
                "path {path:?} has a dot-segment (`.` or `..`, in some spelling): \
                 a path must stay under the endpoint's prefix"
            ));
        }
        match percent_decode(current) {
            Some(next) => decoded = Some(next),
            None => return Ok(()),
        }
    }
    Err(format!(
        "path {path:?} is percent-encoded more than {DECODE_ROUNDS} times over"
    ))
}

/// Whether a segment, split on `/` or `\` and without its `;params`, is `.` or `..`
/// as some server reads it (see [`is_dot_name`]).
fn has_dot_segment(part: &[u8]) -> bool {
    part.split(|&b| b == b'/' || b == b'\\').any(|seg| {
        let name = seg.split(|&b| b == b';').next().unwrap_or(seg);
        is_dot_name(name)
    })
}

/// Characters that Unicode normalisation (NFKC) turns into `.`, in UTF-8:
/// FULLWIDTH FULL STOP (U+FF0E), SMALL FULL STOP (U+FE52), ONE DOT LEADER
/// (U+2024). A server or framework that normalises a path reads `\u{ff0e}\u{ff0e}`
/// as `..`.
const DOT_LOOKALIKES: [&[u8]; 3] = [b"\xEF\xBC\x8E", b"\xEF\xB9\x92", b"\xE2\x80\xA4"];

/// Whether a segment's name is `.` or `..` once read as lenient servers
/// read it: a dot may be any of [`DOT_LOOKALIKES`], and trailing spaces
/// and tabs are dropped (Windows and IIS drop them from a file name, so
/// `.. ` is `..` there).
fn is_dot_name(name: &[u8]) -> bool {
    let (mut dots, mut i) = (0usize, 0usize);
    while i < name.len() {
        if name[i] == b'.' {
            (dots, i) = (dots + 1, i + 1);
        } else if let Some(d) = DOT_LOOKALIKES.iter().find(|d| name[i..].starts_with(d)) {
            (dots, i) = (dots + 1, i + d.len());
        } else {
            break;
        }
    }
    (1..=2).contains(&dots) && name[i..].iter().all(|b| matches!(b, b' ' | b'\t'))
}

/// One round of percent-decoding, or `None` when there is nothing to decode.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    if !s.contains(&b'%') {
        return None; // the common case: no copy
    }
    let mut out = Vec::with_capacity(s.len());
    let mut changed = false;
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                changed = true;
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    changed.then_some(out)
}

/// Checks that a task may set header `name` (case-insensitive): headers
/// that change routing or framing are refused, with the reason.
pub fn check_header_name(name: &str) -> Result<(), String> {
    const ENGINE_OWNED: [&str; 8] = [
        "host",
        "connection",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
    ];
    // Compared without a lower-case copy: this runs for every header of
    // every task.
    let owned = ENGINE_OWNED.iter().any(|h| h.eq_ignore_ascii_case(name));
    let proxy = name
        .get(..6)
        .is_some_and(|p| p.eq_ignore_ascii_case("proxy-"));
    if owned || proxy {
        return Err(format!(
            "header {name:?} changes how the request is routed or framed; \
             the engine sets it, not the task"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The one-pass check never accepts what the full check refuses.
        #[test]
        fn the_fast_path_accepts_only_what_the_full_check_accepts(
            path in "[/a-z.%;:?#\\\\=&2eEfF5cC\r\n ]{0,24}"
        ) {
            if plainly_fine(path.as_bytes()) {
                prop_assert!(check_path_fully(&path).is_ok(), "{path:?}");
            }
        }

        /// And it takes the plain paths tasks use (no fallback for them).
        #[test]
        fn plain_paths_take_the_fast_path(path in "(/[a-z0-9_-]{1,8}){1,4}(\\?[a-z]{1,4}=[a-z0-9./:]{0,8})?") {
            prop_assert!(plainly_fine(path.as_bytes()), "{path:?}");
            prop_assert!(check_path_fully(&path).is_ok(), "{path:?}");
        }
    }

    #[test]
    fn the_fast_path_leaves_every_refusal_to_the_full_check() {
        for p in [
            "/.", "/..", "/a/./b", "/a/../b", "/a/..?x", "/..;/a", "/%2e%2e", r"/a\..\b", "//evil",
            "/a#f", "/a\r\nb", "/a b", "/x://y", "",
        ] {
            assert!(!plainly_fine(p.as_bytes()), "{p:?}");
        }
        for p in [
            "/",
            "/a",
            "/a/b/",
            "/a.b/..c/...",
            "/v1/chat?next=http://x/../y",
            "/a?",
        ] {
            assert!(plainly_fine(p.as_bytes()), "{p:?}");
            assert!(check_path_fully(p).is_ok(), "{p:?}");
        }
    }

    #[test]
    fn dot_segments_in_every_spelling_are_refused() {
        for p in [
            "../../admin",
            "/../admin",
            "/v1/..",
            "/./admin",
            ".",
            "/a/./b",
            "/%2e%2e/admin",
            "/%2E%2E/admin",
            "/.%2e/admin",
            "/.%2E/admin",
            "/%2E./admin",
            "/%2e/admin",
            "..%2f..%2fadmin",
            "..%2F..%2Fadmin",
            "/a%2f..%2fadmin",
            r"\..\..\admin",
            r"/a\..\admin",
            "/a%5c..%5cadmin",
            "/a%5C..%5Cadmin",
            "/%252e%252e/admin",
            "/%25252e%25252e/admin",
            "/..;/admin",
            "/..;x=1/admin",
            "/..?x=1",
            // A trailing space or tab (trimmed by Windows and IIS).
            "/..%20/admin",
            "/.%20/admin",
            "/..%09/admin",
            "/..%2520/admin",
            "/a/.. ",
            // Fullwidth and other dots that normalise to `.`.
            "/\u{ff0e}\u{ff0e}/admin",
            "/.\u{ff0e}/admin",
            "/%EF%BC%8E%EF%BC%8E/admin",
            "/%ef%bc%8e./admin",
            "/%25EF%25BC%258E%25EF%25BC%258E/admin",
            "/\u{fe52}\u{fe52}/admin",
            "/\u{2024}\u{2024}/admin",
        ] {
            let e = check_path(p).expect_err(p);
            assert!(e.contains("dot-segment"), "{p}: {e}");
        }
    }

    #[test]
    fn encoded_nul_cr_and_lf_are_refused() {
        for p in [
            "/admin%00.png",
            "/a%2500b",
            "/a%0d%0aX-Injected:%201",
            "/a%0Ab",
        ] {
            let e = check_path(p).expect_err(p);
            assert!(e.contains("CR, LF or NUL"), "{p}: {e}");
        }
        // In the query they are data.
        assert!(check_path("/a?x=%00").is_ok());
    }

    #[test]
    fn ordinary_paths_and_queries_pass() {
        for p in [
            "/v1/chat",
            "v1/x",
            "/a..b/c",
            "/.well-known/x",
            "/...",
            "/a.b/c.d",
            "/%2e%2e%2e",
            "/a%2fb",
            "/a%20b/..x",
            "/%EF%BC%8E%EF%BC%8E%EF%BC%8E",
            "/%EF%BC%8Etxt",
            "/..x%20",
            "/%20../a",
            "/?next=http://x/y",
            "/search?q=../../etc",
            "/v1/models:predict?x=1",
            "",
            "?x=1",
        ] {
            assert!(check_path(p).is_ok(), "{p}: {:?}", check_path(p));
        }
    }

    #[test]
    fn colon_slash_slash_in_the_query_is_fine_but_not_in_the_path() {
        assert!(check_path("/redirect?to=https://example.com/").is_ok());
        assert!(check_path("/a/http://evil/").is_err());
    }

    #[test]
    fn deeply_encoded_paths_are_refused() {
        let mut p = String::from("%2e");
        for _ in 0..DECODE_ROUNDS {
            p = p.replace('%', "%25");
        }
        assert!(check_path(&format!("/{p}{p}/x")).is_err());
        assert!(check_path(&format!("/a{p}b/x")).is_err());
    }

    /// The allocation-free check never accepts what `PathAndQuery` refuses:
    /// every byte, in the path and in the query.
    #[test]
    fn the_plain_check_accepts_only_what_path_and_query_accepts() {
        let http_ok = |p: &str| {
            awc::http::uri::PathAndQuery::from_maybe_shared(Bytes::from(p.to_owned())).is_ok()
        };
        for b in 0u8..=0x7f {
            if b == b'#' {
                continue; // refused before either check
            }
            let c = b as char;
            for p in [format!("/a{c}b"), format!("/a?x={c}y"), format!("/a?{c}")] {
                if plainly_valid(&p) {
                    assert!(http_ok(&p), "{p:?}");
                }
            }
        }
        for p in ["/a b", "/a\u{e9}", "/a?b c", "/a\"b", "/a?b\u{e9}"] {
            assert!(!plainly_valid(p) || http_ok(p), "{p:?}");
        }
        assert!(plainly_valid("/v1/models:predict?x=1&y=%2F"));
    }

    #[test]
    fn routing_and_framing_headers_are_refused() {
        for h in [
            "Host",
            "host",
            "Connection",
            "Transfer-Encoding",
            "content-length",
            "Upgrade",
            "TE",
            "Trailer",
            "Keep-Alive",
            "Proxy-Authorization",
            "proxy-connection",
            "PROXY-",
        ] {
            let e = check_header_name(h).expect_err(h);
            assert!(e.contains(h) && e.contains("routed or framed"), "{e}");
        }
        for h in [
            "accept",
            "x-request-id",
            "authorization",
            "cookie",
            "hostname",
            "proxy",
            "proxyx-a",
            "prøxy-a",
        ] {
            assert!(check_header_name(h).is_ok(), "{h}");
        }
    }
}
