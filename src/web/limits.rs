//! Request header limits of [`super::forward`]: how many header fields, how
//! large one field, how large all of them together, checked before anything
//! is read or sent; over a limit the client gets a 431 (RFC 6585 §5).
//!
//! Sizes are counted as on the wire, `name: value\r\n` per field, as nginx
//! measures its header lines. The defaults follow the proxies clients meet:
//! a field up to 8 KiB and 32 KiB in all (nginx's
//! `large_client_header_buffers 4 8k`, below Envoy's 60 KiB), at most 100
//! fields (Envoy's `max_headers_count`). actix-http's own HTTP/1 parser
//! still refuses a head over 128 KiB or of more than 96 fields with a 400
//! before a route sees it.

use actix_web::http::header::HeaderMap;

/// Default largest header field (`name: value\r\n`), bytes: nginx's 8 KiB.
pub(super) const MAX_HEADER_LINE: usize = 8 * 1024;
/// Default largest total of all header fields, bytes: nginx's 4 × 8 KiB.
pub(super) const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Default most header fields: Envoy's 100.
pub(super) const MAX_HEADERS: usize = 100;

/// The three limits, as [`super::ForwardConfig`] holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeaderLimits {
    pub(super) line: usize,
    pub(super) total: usize,
    pub(super) count: usize,
}

impl HeaderLimits {
    /// nginx's and Envoy's limits (the module docs).
    pub(super) const DEFAULT: HeaderLimits = HeaderLimits {
        line: MAX_HEADER_LINE,
        total: MAX_HEADER_BYTES,
        count: MAX_HEADERS,
    };
}

impl Default for HeaderLimits {
    fn default() -> Self {
        HeaderLimits::DEFAULT
    }
}

/// Which limit a request's headers broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OverLimit {
    /// More than `limit` fields.
    Count { limit: usize },
    /// Field `name` is over `limit` bytes.
    Line { name: String, limit: usize },
    /// All fields together are over `limit` bytes.
    Total { limit: usize },
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OverLimit::Count { limit } => {
                write!(f, "more than {limit} request header fields (max_headers)")
            }
            OverLimit::Line { name, limit } => write!(
                f,
                "request header {name} is over {limit} bytes (max_header_line)"
            ),
            OverLimit::Total { limit } => {
                write!(
                    f,
                    "request headers over {limit} bytes in all (max_header_bytes)"
                )
            }
        }
    }
}

impl HeaderLimits {
    /// Whether `headers` keep within the limits; the first limit broken
    /// otherwise (count first: it costs nothing to check).
    pub(super) fn check(&self, headers: &HeaderMap) -> Result<(), OverLimit> {
        if headers.len() > self.count {
            return Err(OverLimit::Count { limit: self.count });
        }
        let mut total = 0usize;
        for (name, value) in headers.iter() {
            let line = name.as_str().len() + value.len() + 4;
            if line > self.line {
                return Err(OverLimit::Line {
                    name: name.as_str().to_owned(),
                    limit: self.line,
                });
            }
            total = total.saturating_add(line);
            if total > self.total {
                return Err(OverLimit::Total { limit: self.total });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn map(fields: &[(&str, usize)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (name, len) in fields {
            m.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(&"v".repeat(*len)).unwrap(),
            );
        }
        m
    }

    const SMALL: HeaderLimits = HeaderLimits {
        line: 20,
        total: 50,
        count: 3,
    };

    #[test]
    fn a_field_counts_its_name_value_colon_space_and_crlf() {
        // "ab: " + 14 + "\r\n" = 20 bytes: at the limit, not over it.
        assert_eq!(SMALL.check(&map(&[("ab", 14)])), Ok(()));
        assert_eq!(
            SMALL.check(&map(&[("ab", 15)])),
            Err(OverLimit::Line {
                name: "ab".into(),
                limit: 20
            })
        );
    }

    #[test]
    fn the_total_and_the_count_are_limits_of_their_own() {
        // 20 + 20 + 10 = 50: at the limit.
        assert_eq!(
            SMALL.check(&map(&[("a1", 14), ("a2", 14), ("a3", 4)])),
            Ok(())
        );
        assert_eq!(
            SMALL.check(&map(&[("a1", 14), ("a2", 14), ("a3", 5)])),
            Err(OverLimit::Total { limit: 50 })
        );
        // Repeated fields count one each.
        assert_eq!(
            SMALL.check(&map(&[("a", 1), ("a", 1), ("a", 1), ("a", 1)])),
            Err(OverLimit::Count { limit: 3 })
        );
    }

    #[test]
    fn the_defaults_take_a_browsers_headers_and_refuse_a_16_kib_field() {
        let d = HeaderLimits::default();
        let browser = map(&[("user-agent", 120), ("accept", 200), ("cookie", 4000)]);
        assert_eq!(d.check(&browser), Ok(()));
        assert!(matches!(
            d.check(&map(&[("x-big", 16 * 1024)])),
            Err(OverLimit::Line { .. })
        ));
        let many: Vec<(String, usize)> = (0..101).map(|i| (format!("x-{i}"), 1)).collect();
        let many: Vec<(&str, usize)> = many.iter().map(|(n, l)| (n.as_str(), *l)).collect();
        assert_eq!(
            d.check(&map(&many)),
            Err(OverLimit::Count { limit: MAX_HEADERS })
        );
    }
}
