//! A backend's `Retry-After`: read from a 429 or 503, bounded, never a panic.

use std::time::Duration;

use crate::algo::time;
use crate::transport::HttpReply;

/// `Retry-After` of a 429 or 503, as delta-seconds or an HTTP date.
pub(super) fn retry_after(reply: &HttpReply) -> Option<Duration> {
    if reply.status != 429 && reply.status != 503 {
        return None;
    }
    let value = reply
        .headers
        .get(awc::http::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    #[allow(clippy::disallowed_methods)] // an HTTP date is wall-clock time
    let wall = std::time::SystemTime::now();
    parse_retry_after(value, wall)
}

/// Parses a `Retry-After` value: delta-seconds, or an HTTP date (a date in
/// the past means "now"). A value from a backend can be anything: it is
/// bounded here by [`time::MAX_DURATION`] (the queue caps it further by the
/// service's `max_retry_after` and the task's deadline); what does not parse
/// (a negative number, garbage) is ignored.
fn parse_retry_after(value: &str, wall_now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    let d = if value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty() {
        // Digits only: delta-seconds, however many (past u64 is "huge").
        value
            .parse::<u64>()
            .map_or(time::MAX_DURATION, Duration::from_secs)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(wall_now).unwrap_or(Duration::ZERO)
    };
    Some(d.min(time::MAX_DURATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        // 2015-10-21 07:28:00 GMT is `now`; one minute later:
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_extremes_are_bounded_never_a_panic() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let max = Some(time::MAX_DURATION);
        assert_eq!(parse_retry_after("18446744073709551615", now), max);
        assert_eq!(parse_retry_after("99999999999999999999999999", now), max);
        assert_eq!(parse_retry_after("31536001", now), max);
        assert_eq!(
            parse_retry_after("31536000", now),
            Some(Duration::from_secs(31_536_000))
        );
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("-18446744073709551615", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(parse_retry_after("\u{0}\u{ff}garbage", now), None);
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), max);
        // From the earliest wall clock too: no overflow either way.
        let epoch = std::time::UNIX_EPOCH;
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", epoch),
            max
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now),
            Some(Duration::ZERO)
        );
    }
}
