//! The service's attempt settings: `timeout`, `max_body`, `keep_alive`,
//! `max_connection_age`, and the `headers` and `tls` of every endpoint.

use std::time::Duration;

use super::{ConfigError, Ctx};
use crate::config::raw::RawService;
use crate::config::{headers, tls, HeaderSet, TlsConfig};

/// The section's durations, for the bounds check that precedes every other.
pub(super) fn durations(raw: &RawService) -> [(&'static str, Option<Duration>); 3] {
    [
        ("timeout", Some(raw.timeout)),
        ("keep_alive", Some(raw.keep_alive)),
        ("max_connection_age", Some(raw.max_connection_age)),
    ]
}

/// Refuses a zero `timeout` or `max_body`.
pub(super) fn validate(cx: &Ctx<'_>, raw: &RawService) -> Result<(), ConfigError> {
    if raw.timeout.is_zero() {
        return Err(cx.err("timeout", "must be greater than zero"));
    }
    if raw.max_body == 0 {
        return Err(cx.err("max_body", "must be greater than zero"));
    }
    Ok(())
}

/// `http2`: `connections` from 1 to [`crate::config::MAX_H2_CONNECTIONS`].
pub(super) fn http2(
    cx: &Ctx<'_>,
    raw: &crate::config::raw::RawHttp2,
) -> Result<crate::config::Http2Config, ConfigError> {
    let max = crate::config::MAX_H2_CONNECTIONS;
    if raw.connections == 0 || raw.connections > max {
        let msg = format!("must be 1 to {max}, got {}", raw.connections);
        return Err(cx.err("http2.connections", msg));
    }
    Ok(crate::config::Http2Config {
        connections: raw.connections,
        prior_knowledge: raw.prior_knowledge,
    })
}

/// The service's `headers` and `tls`, which its endpoints' replace.
pub(super) fn headers_and_tls(
    cx: &Ctx<'_>,
    raw: &RawService,
) -> Result<(HeaderSet, Option<TlsConfig>), ConfigError> {
    let headers = headers::resolve("headers", &raw.headers, &headers::process_env)
        .map_err(|(f, m)| cx.err(f, m))?;
    let tls = raw
        .tls
        .as_ref()
        .map(|t| tls::validate("tls", t))
        .transpose()
        .map_err(|(f, m)| cx.err(f, m))?;
    Ok((headers, tls))
}
