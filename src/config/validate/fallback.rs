//! `fallback`: the canned response's status and headers.

use super::{ConfigError, Ctx};
use crate::config::raw::RawFallback;
use crate::config::FallbackConfig;

pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<RawFallback>,
) -> Result<Option<FallbackConfig>, ConfigError> {
    let Some(f) = raw else {
        return Ok(None);
    };
    if !(100..=999).contains(&f.status) {
        return Err(cx.err("fallback.status", "must be an HTTP status code"));
    }
    for (k, v) in &f.headers {
        if awc::http::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return Err(cx.err(format!("fallback.headers.{k}"), "invalid header name"));
        }
        if awc::http::header::HeaderValue::from_str(v).is_err() {
            return Err(cx.err(format!("fallback.headers.{k}"), "invalid header value"));
        }
    }
    Ok(Some(FallbackConfig {
        status: f.status,
        headers: f.headers,
        body: f.body,
    }))
}
