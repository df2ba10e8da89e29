//! From the file's raw structs to validated [`super::Config`] values.

use std::collections::HashSet;

use serde_json::Value;

use super::raw::{RawBucket, RawEndpoint, RawService};
use super::*;
use crate::algo::time;

/// Why a config was refused. Each variant names where the problem is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {message}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The text is not JSON.
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
    #[error("config: field `{field}`: {message}")]
    Top {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A problem inside one service.
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

fn service(raw: RawService) -> Result<ServiceConfig, ConfigError> {
    let name = raw.name.trim().to_owned();
    let cx = Ctx { service: &name };
    if name.is_empty() {
        return Err(cx.err("name", "must not be empty"));
    }
    let mode = match &raw.mode {
        None => Mode::P2c,
        Some(m) => Mode::parse(m).ok_or_else(|| {
            cx.err(
                "mode",
                format!(
                    "unknown mode {m:?} (expected round_robin/Poll, weighted/Weight, least_load, p2c, consistent_hash)"
                ),
            )
        })?,
    };
    let endpoints = endpoints(&cx, raw.endpoints)?;
    let headers = super::headers::resolve("headers", &raw.headers, &super::headers::process_env)
        .map_err(|(f, m)| cx.err(f, m))?;
    let tls = raw
        .tls
        .as_ref()
        .map(|t| super::tls::validate("tls", t))
        .transpose()
        .map_err(|(f, m)| cx.err(f, m))?;
    // Every duration from the file, bounded before any arithmetic on it.
    let hc = raw.health_check.as_ref();
    for (field, d) in [
        ("timeout", Some(raw.timeout)),
        ("keep_alive", Some(raw.keep_alive)),
        ("max_connection_age", Some(raw.max_connection_age)),
        ("retry.backoff_base", Some(raw.retry.backoff_base)),
        ("retry.backoff_max", Some(raw.retry.backoff_max)),
        ("retry.max_retry_after", Some(raw.retry.max_retry_after)),
        (
            "balancer.refresh_interval",
            Some(raw.balancer.refresh_interval),
        ),
        ("balancer.decay", Some(raw.balancer.decay)),
        ("balancer.default_rtt", Some(raw.balancer.default_rtt)),
        (
            "balancer.failure_penalty",
            Some(raw.balancer.failure_penalty),
        ),
        ("balancer.slow_start", raw.balancer.slow_start),
        ("breaker.slow_call", raw.breaker.slow_call),
        ("breaker.open_for", Some(raw.breaker.open_for)),
        ("breaker.max_open_for", Some(raw.breaker.max_open_for)),
        ("breaker.reset_after", Some(raw.breaker.reset_after)),
        ("breaker.probe_timeout", raw.breaker.probe_timeout),
        ("health_check.interval", hc.map(|h| h.interval)),
        ("health_check.timeout", hc.map(|h| h.timeout)),
        ("hedge.after", raw.hedge.as_ref().and_then(|h| h.after)),
    ] {
        cx.bounded(field, d)?;
    }
    if raw.timeout.is_zero() {
        return Err(cx.err("timeout", "must be greater than zero"));
    }
    if raw.max_body == 0 {
        return Err(cx.err("max_body", "must be greater than zero"));
    }

    let r = raw.retry;
    if r.backoff_base.is_zero() {
        return Err(cx.err("retry.backoff_base", "must be greater than zero"));
    }
    if r.backoff_max < r.backoff_base {
        return Err(cx.err("retry.backoff_max", "must be at least retry.backoff_base"));
    }
    if !(0.0..=10.0).contains(&r.budget_percent) || r.budget_percent.is_nan() {
        return Err(cx.err(
            "retry.budget_percent",
            "must be a ratio between 0 and 10 (0.2 = 20 %)",
        ));
    }
    let retry = RetryConfig {
        max_retries: r.max_retries,
        backoff_base: r.backoff_base,
        backoff_max: r.backoff_max,
        max_retry_after: r.max_retry_after,
        budget: BudgetConfig {
            percent: r.budget_percent,
            min_per_sec: r.min_retries_per_sec,
            ..BudgetConfig::default()
        },
    };

    if raw.queue.capacity == 0 {
        return Err(cx.err("queue.capacity", "must be greater than zero"));
    }
    let on_full = match raw.queue.on_full.to_ascii_lowercase().as_str() {
        "reject" => OnFull::Reject,
        "wait" | "block" => OnFull::Wait,
        other => {
            return Err(cx.err(
                "queue.on_full",
                format!("unknown value {other:?} (expected reject or wait)"),
            ))
        }
    };
    let queue = QueueConfig {
        capacity: raw.queue.capacity,
        on_full,
        max_waiting: raw
            .queue
            .max_waiting
            .unwrap_or(raw.queue.capacity.max(10_000)),
    };

    let b = raw.balancer;
    if b.refresh_interval.is_zero() {
        return Err(cx.err("balancer.refresh_interval", "must be greater than zero"));
    }
    for (f, v) in [
        ("balancer.least_load.in_flight", b.least_load.in_flight),
        ("balancer.least_load.latency", b.least_load.latency),
        ("balancer.least_load.errors", b.least_load.errors),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(cx.err(f, "must be a finite number >= 0"));
        }
    }
    if b.decay.is_zero() {
        return Err(cx.err("balancer.decay", "must be greater than zero"));
    }
    if b.default_rtt.is_zero() {
        return Err(cx.err("balancer.default_rtt", "must be greater than zero"));
    }
    if !(b.slow_start_floor > 0.0 && b.slow_start_floor <= 1.0) {
        return Err(cx.err("balancer.slow_start_floor", "must be in (0, 1]"));
    }
    if b.slow_start.is_some_and(|d| d.is_zero()) {
        return Err(cx.err("balancer.slow_start", "must be greater than zero when set"));
    }
    let balancer = BalancerConfig {
        refresh_interval: b.refresh_interval,
        least_load: LeastLoadWeights {
            in_flight: b.least_load.in_flight,
            latency: b.least_load.latency,
            errors: b.least_load.errors,
        },
        decay: b.decay,
        default_rtt: b.default_rtt,
        failure_penalty: b.failure_penalty,
        slow_start: b.slow_start,
        slow_start_floor: b.slow_start_floor,
        seed: b.seed,
    };

    let br = raw.breaker;
    if !(br.failure_rate > 0.0 && br.failure_rate <= 1.0) {
        return Err(cx.err("breaker.failure_rate", "must be in (0, 1]"));
    }
    if br.window == 0 {
        return Err(cx.err("breaker.window", "must be greater than zero"));
    }
    if br.min_calls > br.window {
        return Err(cx.err("breaker.min_calls", "must not exceed breaker.window"));
    }
    if br.open_for.is_zero() {
        return Err(cx.err("breaker.open_for", "must be greater than zero"));
    }
    if br.max_open_for < br.open_for {
        return Err(cx.err("breaker.max_open_for", "must be at least breaker.open_for"));
    }
    if br.half_open_probes == 0 {
        return Err(cx.err("breaker.half_open_probes", "must be at least 1"));
    }
    if br.max_ejected_percent > 100 {
        return Err(cx.err("breaker.max_ejected_percent", "must be in 0..=100"));
    }
    let on_all_open = match br.on_all_open.to_ascii_lowercase().as_str() {
        "fail_fast" | "failfast" | "reject" => OnAllOpen::FailFast,
        "wait" => OnAllOpen::Wait,
        other => {
            return Err(cx.err(
                "breaker.on_all_open",
                format!("unknown value {other:?} (expected fail_fast or wait)"),
            ))
        }
    };
    let breaker = BreakerSettings {
        enabled: br.enabled,
        breaker: BreakerConfig {
            consecutive_failures: br.consecutive_failures,
            failure_rate: br.failure_rate,
            window: br.window,
            min_calls: br.min_calls,
            slow_call: br.slow_call,
            open_for: br.open_for,
            max_open_for: br.max_open_for,
            reset_after: br.reset_after,
            half_open_probes: br.half_open_probes,
            // A probe that outlives two attempt timeouts is not coming back.
            probe_timeout: br.probe_timeout.unwrap_or(time::mul(raw.timeout, 2)),
        },
        on_all_open,
        max_ejected_percent: br.max_ejected_percent,
        shared: br.shared,
        quorum: br.quorum.max(1),
    };

    let rate_limit = match raw.rate_limit {
        None => RateLimitConfig {
            per_node: None,
            service: None,
            on_limit: OnLimit::Wait,
            shared: false,
        },
        Some(rl) => RateLimitConfig {
            per_node: rl
                .per_node
                .map(|b| bucket(&cx, "rate_limit.per_node", b))
                .transpose()?,
            service: rl
                .service
                .map(|b| bucket(&cx, "rate_limit.service", b))
                .transpose()?,
            on_limit: match rl.on_limit.to_ascii_lowercase().as_str() {
                "wait" => OnLimit::Wait,
                "reject" => OnLimit::Reject,
                other => {
                    return Err(cx.err(
                        "rate_limit.on_limit",
                        format!("unknown value {other:?} (expected wait or reject)"),
                    ))
                }
            },
            shared: rl.shared,
        },
    };

    // `shared` shares every bucket set: the service's and the nodes'.
    if rate_limit.shared && rate_limit.service.is_none() && rate_limit.per_node.is_none() {
        return Err(cx.err(
            "rate_limit.shared",
            "shares the configured buckets: set rate_limit.service or rate_limit.per_node",
        ));
    }

    let fallback = match raw.fallback {
        None => None,
        Some(f) => {
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
            Some(FallbackConfig {
                status: f.status,
                headers: f.headers,
                body: f.body,
            })
        }
    };

    let health_check = match raw.health_check {
        None => None,
        Some(h) => {
            if h.interval.is_zero() {
                return Err(cx.err("health_check.interval", "must be greater than zero"));
            }
            if h.timeout.is_zero() {
                return Err(cx.err("health_check.timeout", "must be greater than zero"));
            }
            if h.unhealthy_threshold == 0 {
                return Err(cx.err("health_check.unhealthy_threshold", "must be at least 1"));
            }
            if h.healthy_threshold == 0 {
                return Err(cx.err("health_check.healthy_threshold", "must be at least 1"));
            }
            crate::task::check_path(&h.path).map_err(|m| cx.err("health_check.path", m))?;
            Some(HealthCheckConfig {
                path: h.path.trim_start_matches('/').to_owned(),
                interval: h.interval,
                timeout: h.timeout,
                unhealthy_threshold: h.unhealthy_threshold,
                healthy_threshold: h.healthy_threshold,
            })
        }
    };

    let hedge = match raw.hedge {
        None => None,
        Some(h) => match (h.after, h.percentile) {
            (Some(d), None) if !d.is_zero() => Some(HedgeAfter::Delay(d)),
            (None, Some(p)) if p > 0.0 && p < 100.0 => Some(HedgeAfter::Percentile(p)),
            _ => return Err(cx.err(
                "hedge",
                "give exactly one of `after` (a non-zero duration) or `percentile` (0 < p < 100)",
            )),
        },
    };

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
    })
}

fn bucket(cx: &Ctx<'_>, field: &str, b: RawBucket) -> Result<BucketConfig, ConfigError> {
    if !(b.rate.is_finite() && b.rate > 0.0) {
        return Err(cx.err(format!("{field}.rate"), "must be greater than zero"));
    }
    // One token per `1/rate` seconds: that period is bounded like any duration.
    if b.rate < 1.0 / time::MAX_DURATION.as_secs_f64() {
        return Err(cx.err(
            format!("{field}.rate"),
            format!(
                "{} per second is less than one token per {} days",
                b.rate,
                time::MAX_DURATION.as_secs() / 86_400
            ),
        ));
    }
    if b.burst == 0 {
        return Err(cx.err(format!("{field}.burst"), "must be at least 1"));
    }
    Ok(BucketConfig {
        rate: b.rate,
        burst: b.burst,
    })
}

fn endpoints(cx: &Ctx<'_>, raw: Vec<RawEndpoint>) -> Result<Vec<EndpointConfig>, ConfigError> {
    if raw.is_empty() {
        return Err(cx.err("endpoints", "no endpoints configured"));
    }
    let mut out: Vec<EndpointConfig> = Vec::with_capacity(raw.len());
    let mut seen: HashSet<String> = HashSet::new();
    for (i, e) in raw.into_iter().enumerate() {
        let field = |f: &str| format!("endpoints[{i}].{f}");
        let address = normalize_address(&e.address).map_err(|m| cx.err(field("address"), m))?;
        if e.max_concurrent == 0 {
            return Err(cx.err(field("max_concurrent"), "must be greater than zero"));
        }
        // As the seed: a repeated address keeps its first entry.
        if !seen.insert(address.clone()) {
            log::warn!(
                "service {}: endpoint {} listed again as endpoints[{i}]; the first entry is kept",
                cx.service,
                address
            );
            continue;
        }
        let headers =
            super::headers::resolve(&field("headers"), &e.headers, &super::headers::process_env)
                .map_err(|(f, m)| cx.err(f, m))?;
        let tls = e
            .tls
            .as_ref()
            .map(|t| super::tls::validate(&field("tls"), t))
            .transpose()
            .map_err(|(f, m)| cx.err(f, m))?;
        let weight = clamp_weight(cx.service, &address, e.weight);
        out.push(EndpointConfig {
            address,
            weight,
            max_concurrent: e.max_concurrent,
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
    if uri.query().is_some() || a.contains('#') {
        return Err(format!("{address:?} must not have a query or fragment"));
    }
    let mut s = a.to_owned();
    if !s.ends_with('/') {
        s.push('/');
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        Config::from_json(json).unwrap_err().to_string()
    }

    #[test]
    fn seed_config_loads_unchanged() {
        let c = Config::from_json(
            r#"{"ApiServers":[{"Name":"Did","Mode":"Poll","ApiEndPoints":[{"Address":"http://localhost:10100/","Weight":1}]}]}"#,
        )
        .unwrap();
        let s = &c.services[0];
        assert_eq!(s.name, "Did");
        assert_eq!(s.mode, Mode::RoundRobin);
        assert_eq!(s.endpoints[0].address, "http://localhost:10100/");
        assert_eq!(s.endpoints[0].weight, 1);
        assert!(s.endpoints[0].active);
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert_eq!(s.retry.max_retries, 3);
        assert_eq!(s.queue.capacity, 10_000);
    }

    #[test]
    fn modes_are_case_insensitive_with_aliases() {
        for (m, want) in [
            ("poll", Mode::RoundRobin),
            ("ROUND_ROBIN", Mode::RoundRobin),
            ("Weight", Mode::Weighted),
            ("weighted", Mode::Weighted),
            ("Least_Load", Mode::LeastLoad),
            ("P2C", Mode::P2c),
            ("consistent_hash", Mode::ConsistentHash),
        ] {
            assert_eq!(Mode::parse(m), Some(want), "{m}");
        }
        assert_eq!(Mode::parse("random"), None);
    }

    #[test]
    fn weights_clamped_and_a_repeated_address_keeps_its_first_entry() {
        let c = Config::from_json(
            r#"{"services":[{"name":"a","endpoints":[
                {"address":"http://127.0.0.1:1","weight":0},
                {"address":"http://127.0.0.1:2/","weight":500},
                {"address":"http://127.0.0.1:1/","weight":3,"max_concurrent":5}]}]}"#,
        )
        .unwrap();
        let e = &c.services[0].endpoints;
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].address, "http://127.0.0.1:1/");
        assert_eq!(e[0].weight, 1);
        assert_eq!(e[0].max_concurrent, 10);
        assert_eq!(e[1].weight, 100);
    }

    #[test]
    fn bad_configs_name_service_and_field() {
        let cases = [
            (
                r#"{"services":[{"name":"a","mode":"random","endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `mode`"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[]}]}"#,
                r#"service "a": field `endpoints`"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[{"address":"ftp://h/"}]}]}"#,
                r#"service "a": field `endpoints[0].address`"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[{"address":"not a url"}]}]}"#,
                r#"service "a": field `endpoints[0].address`"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/"}]},{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `name`: duplicate"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/","max_concurrent":0}]}]}"#,
                r#"service "a": field `endpoints[0].max_concurrent`"#,
            ),
            (
                r#"{"services":[{"name":"a","queue":{"capacity":0},"endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `queue.capacity`"#,
            ),
            (
                r#"{"services":[{"name":"a","colour":"red","endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `colour`"#,
            ),
            (
                r#"{"services":[{"name":"a","endpoints":[{"address":"http://h/","wieght":2}]}]}"#,
                r#"service "a": field `endpoints[0].wieght`"#,
            ),
            (
                r#"{"services":[{"name":"a","retry":{"max_retries":"x"},"endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `retry.max_retries`"#,
            ),
            (
                r#"{"services":[{"name":"a","timeout":"soon","endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `timeout`"#,
            ),
            (
                r#"{"services":[{"name":"a","breaker":{"failure_rate":1.5},"endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `breaker.failure_rate`"#,
            ),
            (
                r#"{"services":[{"name":"a","rate_limit":{"per_node":{"rate":0,"burst":1}},"endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `rate_limit.per_node.rate`"#,
            ),
            (
                r#"{"services":[{"name":"a","rate_limit":{"service":{"rate":5,"burst":0}},"endpoints":[{"address":"http://h/"}]}]}"#,
                r#"service "a": field `rate_limit.service.burst`"#,
            ),
            (r#"{"services":[{"name":"a","#, "malformed config JSON"),
            (r#"{"servers":[]}"#, "field `servers`"),
            (r#"{"services":[]}"#, "field `services`"),
        ];
        for (json, want) in cases {
            let e = err(json);
            assert!(e.contains(want), "{json}\n  gave: {e}\n  want: {want}");
        }
    }

    #[test]
    fn durations_are_human_strings() {
        let c = Config::from_json(
            r#"{"services":[{"name":"a","timeout":"250ms","retry":{"backoff_base":"10ms","backoff_max":"2s"},"endpoints":[{"address":"https://h:8443/v1"}]}]}"#,
        )
        .unwrap();
        let s = &c.services[0];
        assert_eq!(s.timeout, Duration::from_millis(250));
        assert_eq!(s.retry.backoff_base, Duration::from_millis(10));
        assert_eq!(s.endpoints[0].address, "https://h:8443/v1/");
        assert_eq!(s.mode, Mode::P2c);
    }
}
