//! From the file's raw structs to validated [`super::Config`] values.
//!
//! [`parse`] reads the top level (the `services` list, the `redis` section,
//! checked by `super::redis`); each service is then checked section by
//! section, one small module each, every error naming the service and the
//! field path through [`Ctx`].

mod attempt;
mod balancer;
mod breaker;
mod endpoints;
mod fallback;
mod health_check;
mod hedge;
mod limits;
mod queue;
mod retry;
#[cfg(test)]
mod tests;

use std::collections::HashSet;

use serde_json::Value;

use super::raw::RawService;
use super::*;
use crate::algo::time;

pub(crate) use endpoints::{clamp_weight, normalize_address};

/// Why a config was refused. Each variant names where the problem is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[non_exhaustive]
    #[error("cannot read config file {path}: {message}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The text is not JSON.
    #[non_exhaustive]
    #[error("malformed config JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// A top-level problem (no services, unknown top-level field).
    #[non_exhaustive]
    #[error("config: field `{field}`: {message}")]
    Top {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A problem inside one service.
    #[non_exhaustive]
    #[error("service {service:?}: field `{field}`: {message}")]
    Service {
        /// The service's name (or `#index` when it has none).
        service: String,
        /// The field path, e.g. `endpoints[1].address`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn top(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Top {
        field: field.into(),
        message: message.into(),
    }
}

pub(super) fn parse(json: &str) -> Result<Config, ConfigError> {
    let value: Value = serde_json::from_str(json).map_err(|e| ConfigError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let Value::Object(map) = value else {
        return Err(top("(root)", "expected a JSON object"));
    };
    let mut services_value = None;
    let mut redis = None;
    for (k, v) in map {
        match k.as_str() {
            "redis" => {
                let raw: super::raw::RawRedis = serde_path_to_error::deserialize(&v)
                    .map_err(|e| top(&format!("redis.{}", e.path()), e.inner().to_string()))?;
                redis = Some(super::redis::validate(raw).map_err(|(f, m)| top(&f, m))?);
            }
            "services" | "ApiServers" | "Services" => {
                if services_value.is_some() {
                    return Err(top(&k, "services given twice"));
                }
                services_value = Some(v)
            }
            other => {
                return Err(top(
                    other,
                    "unknown field (expected `services` or `ApiServers`)",
                ))
            }
        }
    }
    let Some(Value::Array(list)) = services_value else {
        return Err(top("services", "missing, or not a list of services"));
    };
    if list.is_empty() {
        return Err(top("services", "no services configured"));
    }
    let mut services = Vec::with_capacity(list.len());
    let mut names = HashSet::new();
    for (i, v) in list.into_iter().enumerate() {
        let label = v
            .get("name")
            .or_else(|| v.get("Name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("#{i}"));
        let raw: RawService = serde_path_to_error::deserialize(&v).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Service {
                service: label.clone(),
                field: if path == "." {
                    "(service)".into()
                } else {
                    path
                },
                message: e.inner().to_string(),
            }
        })?;
        let svc = service(raw)?;
        // Names match case-insensitively, as the seed's (lower-cased on load
        // and on lookup): "Did" and "did" are one service.
        if !names.insert(svc.name.to_lowercase()) {
            return Err(ConfigError::Service {
                service: svc.name,
                field: "name".into(),
                message: "duplicate service name (names match case-insensitively)".into(),
            });
        }
        services.push(svc);
    }
    let shared = services
        .iter()
        .find(|s| s.rate_limit.shared || s.breaker.shared);
    if let (Some(s), None) = (shared, &redis) {
        return Err(ConfigError::Service {
            service: s.name.clone(),
            field: "rate_limit.shared".into(),
            message: "shared limits or breakers need a top-level `redis` section".into(),
        });
    }
    if let (Some(s), None) = (services.iter().find(|s| s.tenants.shared), &redis) {
        return Err(ConfigError::Service {
            service: s.name.clone(),
            field: "tenants.shared".into(),
            message: "a shared rate per tenant needs a top-level `redis` section".into(),
        });
    }
    let config = Config { services, redis };
    check_stream_services(&config)?;
    Ok(config)
}

/// Refuses a `redis.stream.services` entry that names no configured service.
#[cfg(feature = "redis")]
fn check_stream_services(config: &Config) -> Result<(), ConfigError> {
    let Some(stream) = config.redis.as_ref().and_then(|r| r.stream.as_ref()) else {
        return Ok(());
    };
    for (i, s) in stream.services.iter().enumerate() {
        if config.service(s).is_none() {
            return Err(top(
                &format!("redis.stream.services[{i}]"),
                format!("unknown service {s:?}"),
            ));
        }
    }
    Ok(())
}

/// Without the feature a `redis` section is refused before this.
#[cfg(not(feature = "redis"))]
fn check_stream_services(_: &Config) -> Result<(), ConfigError> {
    Ok(())
}

/// The service being checked: every error names it.
struct Ctx<'a> {
    service: &'a str,
}

impl Ctx<'_> {
    /// Refuses a duration longer than [`time::MAX_DURATION`], naming the field.
    fn bounded(&self, field: &str, d: Option<Duration>) -> Result<(), ConfigError> {
        match d {
            Some(d) => time::bounded(field, d)
                .map(drop)
                .map_err(|m| self.err(field, m)),
            None => Ok(()),
        }
    }

    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Service {
            service: self.service.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// One service, section by section. Every duration is bounded first, before
/// any check does arithmetic on one.
fn service(raw: RawService) -> Result<ServiceConfig, ConfigError> {
    let name = raw.name.trim().to_owned();
    let cx = Ctx { service: &name };
    if name.is_empty() {
        return Err(cx.err("name", "must not be empty"));
    }
    let mode = balancer::mode(&cx, raw.mode.as_deref())?;
    let concurrency = concurrency(&cx, &raw.concurrency)?;
    let endpoints = endpoints::validate(&cx, &raw.endpoints, concurrency.max)?;
    let (headers, tls) = attempt::headers_and_tls(&cx, &raw)?;
    let durations = attempt::durations(&raw)
        .into_iter()
        .chain(retry::durations(&raw.retry))
        .chain(balancer::durations(&raw.balancer))
        .chain(breaker::durations(&raw.breaker))
        .chain(health_check::durations(raw.health_check.as_ref()))
        .chain(hedge::durations(raw.hedge.as_ref()));
    for (field, d) in durations {
        cx.bounded(field, d)?;
    }
    attempt::validate(&cx, &raw)?;
    let http2 = attempt::http2(&cx, &raw.http2)?;
    let retry = retry::validate(&cx, raw.retry)?;
    let queue = queue::validate(&cx, raw.queue)?;
    let balancer = balancer::validate(&cx, raw.balancer)?;
    let breaker = breaker::validate(&cx, raw.breaker, raw.timeout)?;
    let rate_limit = limits::validate(&cx, raw.rate_limit)?;
    let fallback = fallback::validate(&cx, raw.fallback)?;
    let health_check = health_check::validate(&cx, raw.health_check)?;
    let hedge = hedge::validate(&cx, raw.hedge)?;
    let throttle = throttle(&cx, raw.throttle)?;
    let lines = super::lines::validate(&raw.lines, LineLimits::for_service(raw.timeout, &retry))
        .map_err(|(f, m)| cx.err(f, m))?;
    let tenants = tenants(&cx, &raw.tenants)?;
    Ok(ServiceConfig {
        name: name.clone(),
        mode,
        endpoints,
        timeout: raw.timeout,
        max_body: raw.max_body,
        keep_alive: raw.keep_alive,
        max_connection_age: raw.max_connection_age,
        retry,
        queue,
        balancer,
        breaker,
        rate_limit,
        fallback,
        health_check,
        hedge,
        headers,
        tls,
        http2,
        concurrency,
        throttle,
        lines,
        tenants,
    })
}

/// `tenants`: weights per tenant, the default weight, the bound on the
/// tenants tracked and the rate per tenant; the error names the field
/// (`tenants.weights.<key>`, `tenants.rate.burst`).
fn tenants(
    cx: &Ctx<'_>,
    raw: &crate::config::raw::RawTenants,
) -> Result<crate::algo::tenants::TenantsConfig, ConfigError> {
    // Out-of-range numbers saturate here and are refused, by name, below.
    let small = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let c = crate::algo::tenants::TenantsConfig {
        weights: raw
            .weights
            .iter()
            .map(|(k, &w)| (k.clone(), small(w)))
            .collect(),
        default_weight: small(raw.default_weight),
        max_tracked: usize::try_from(raw.max_tracked).unwrap_or(usize::MAX),
        rate: raw.rate.as_ref().map(|b| crate::algo::tenants::TenantRate {
            rate: b.rate,
            burst: b.burst,
        }),
        shared: raw.shared,
    };
    c.validate()
        .map_err(|(f, m)| cx.err(format!("tenants.{f}"), m))?;
    Ok(c)
}

/// `throttle`: client-side throttling per node; the error names the field.
fn throttle(
    cx: &Ctx<'_>,
    raw: Option<crate::config::raw::RawThrottle>,
) -> Result<Option<crate::algo::throttle::ThrottleConfig>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let c = crate::algo::throttle::ThrottleConfig {
        k: raw.k,
        window: raw.window,
    };
    c.validate().map_err(|m| {
        let field = if m.starts_with("window") {
            "throttle.window"
        } else {
            "throttle.k"
        };
        cx.err(field, m.clone())
    })?;
    Ok(Some(c))
}

/// `concurrency`: the bounds of learned limits (`max_concurrent: "auto"`).
fn concurrency(
    cx: &Ctx<'_>,
    raw: &crate::config::raw::RawConcurrency,
) -> Result<crate::algo::concurrency::LearnedLimitConfig, ConfigError> {
    let c = crate::algo::concurrency::LearnedLimitConfig {
        min: raw.min,
        max: raw.max,
        initial: raw.initial,
        ..Default::default()
    };
    c.validate().map_err(|m| {
        let f = ["min", "max", "initial"]
            .into_iter()
            .find(|f| m.starts_with(f))
            .unwrap_or("initial");
        cx.err(format!("concurrency.{f}"), m.clone())
    })?;
    Ok(c)
}
