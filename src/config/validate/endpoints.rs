//! `endpoints`: each a normalized http(s) address with its weight, cap,
//! headers and TLS.

use std::collections::HashSet;

use super::{ConfigError, Ctx};
use crate::config::raw::{RawEndpoint, RawMaxConcurrent};
use crate::config::{headers, tls, EndpointConfig};

pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: &[RawEndpoint],
    learned_max: u32,
) -> Result<Vec<EndpointConfig>, ConfigError> {
    if raw.is_empty() {
        return Err(cx.err("endpoints", "no endpoints configured"));
    }
    let mut out: Vec<EndpointConfig> = Vec::with_capacity(raw.len());
    let mut seen: HashSet<String> = HashSet::new();
    for (i, e) in raw.iter().enumerate() {
        let field = |f: &str| format!("endpoints[{i}].{f}");
        let address = normalize_address(&e.address).map_err(|m| cx.err(field("address"), m))?;
        let (max_concurrent, learned) = match &e.max_concurrent {
            RawMaxConcurrent::Fixed(0) => {
                return Err(cx.err(field("max_concurrent"), "must be greater than zero"))
            }
            RawMaxConcurrent::Fixed(n) => (*n, false),
            RawMaxConcurrent::Word(w) if w.eq_ignore_ascii_case("auto") => (learned_max, true),
            RawMaxConcurrent::Word(w) => {
                return Err(cx.err(
                    field("max_concurrent"),
                    format!("{w:?} is neither a number nor \"auto\""),
                ))
            }
        };
        // As the seed: a repeated address keeps its first entry.
        if !seen.insert(address.clone()) {
            log::warn!(
                "service {}: endpoint {} listed again as endpoints[{i}]; the first entry is kept",
                cx.service,
                address
            );
            continue;
        }
        let headers = headers::resolve(&field("headers"), &e.headers, &headers::process_env)
            .map_err(|(f, m)| cx.err(f, m))?;
        let tls = e
            .tls
            .as_ref()
            .map(|t| tls::validate(&field("tls"), t))
            .transpose()
            .map_err(|(f, m)| cx.err(f, m))?;
        let weight = clamp_weight(cx.service, &address, e.weight);
        out.push(EndpointConfig {
            address,
            weight,
            max_concurrent,
            learned,
            active: e.active,
            headers,
            tls,
        });
    }
    Ok(out)
}

/// Clamps a configured weight to 1..=100, warning when it had to.
pub(crate) fn clamp_weight(service: &str, address: &str, weight: i64) -> u32 {
    let clamped = weight.clamp(1, 100) as u32;
    if clamped as i64 != weight {
        log::warn!("service {service}: endpoint {address}: weight {weight} clamped to {clamped}");
    }
    clamped
}

/// Checks that `address` is an absolute http(s) URL with a host and returns
/// it with a trailing `/` (so task paths append to it).
pub(crate) fn normalize_address(address: &str) -> Result<String, String> {
    let a = address.trim();
    let uri: awc::http::Uri = a
        .parse()
        .map_err(|e| format!("{address:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        Some(s) => return Err(format!("{address:?}: scheme {s:?} is not http or https")),
        None => return Err(format!("{address:?} is not an http(s) URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{address:?} has no host"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        // Never echoed: the userinfo may be a password. An address is
        // shown in stats, labels and logs and sent as HTTP/2's
        // `:authority`; credentials go in `headers` (a `Secret`).
        let shown = format!(
            "{}://<redacted>@{}",
            uri.scheme_str().unwrap_or("http"),
            uri.host().unwrap_or("")
        );
        return Err(format!(
            "{shown}: an address must not hold a user or password (`user:password@`); \
             set an `Authorization` header in the endpoint's `headers` instead"
        ));
    }
    if uri.query().is_some() || a.contains('#') {
        return Err(format!("{address:?} must not have a query or fragment"));
    }
    let mut s = a.to_owned();
    if !s.ends_with('/') {
        s.push('/');
    }
    Ok(s)
}
