//! The live status page ([`status_page`]): one self-contained HTML page
//! (`status.html`, included whole) and a JSON snapshot of `stats()` it
//! polls, both read at request time only.

use std::sync::OnceLock;

use actix_web::dev::{AppService, HttpServiceFactory};
use actix_web::http::header::{CacheControl, CacheDirective, ContentType};
use serde::Serialize;

use super::*;
use crate::config::Mode;
use crate::stats::{BreakerStatus, ByPriority, ServiceStats};

/// The page: HTML, CSS and script in one file.
const PAGE: &str = include_str!("status.html");

/// What the page may load: nothing but itself and its JSON.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// A live status page of the pool, in a browser, as HAProxy's stats page
/// or Envoy's admin page give one; mount it with `App::service` or
/// `Scope::service`:
///
/// ```no_run
/// use actix_dispatch::web::{configure, status_page};
/// use actix_dispatch::Dispatcher;
/// use actix_web::{guard, web, App, HttpServer};
///
/// async fn admin(dispatcher: Dispatcher) -> std::io::Result<()> {
///     // An admin listener on loopback: /admin/status, /admin/status.json,
///     // /admin/stats, /admin/health.
///     let data = web::Data::new(dispatcher);
///     HttpServer::new(move || {
///         App::new()
///             .app_data(data.clone())
///             .service(web::scope("/admin").service(status_page()).configure(configure))
///     })
///     .bind(("127.0.0.1", 9901))?
///     .run()
///     .await
/// }
///
/// // Or in the public app, for loopback clients only.
/// fn loopback_only() -> actix_web::Scope {
///     web::scope("/admin")
///         .guard(guard::fn_guard(|ctx| {
///             ctx.head().peer_addr.is_some_and(|a| a.ip().is_loopback())
///         }))
///         .service(status_page())
/// }
/// ```
///
/// Two read-only resources, relative to where it is mounted:
///
/// - `GET /status`: one self-contained HTML page (inline CSS and script, no
///   external asset; its `Content-Security-Policy` forbids loading any).
/// - `GET /status.json`: the [`Dispatcher::stats`] figures the page shows,
///   one snapshot per request (the schema below); the page polls it once a
///   second.
///
/// `HEAD` answers as `GET` without the body. Everything the page shows
/// over time (rates per second, the charts of the last five minutes, the
/// log of state changes, which node changed lately) it derives itself from
/// successive snapshots, and its history lives in the browser. The server
/// keeps nothing for it, and the engine does no work for it per task: a
/// snapshot is `stats()`, read when asked (the counters the engine keeps
/// anyway, and one pass over each node's latency histogram).
///
/// Nothing secret is served: a node's address loses any userinfo
/// (`user:password@`), as does any URL in a gate's reason; no header value
/// of any request or endpoint is in `stats()`. Mount it where only
/// operators reach it (an admin listener, or behind a guard), as
/// `configure`'s `/stats`.
///
/// The JSON, `version` 1 (a field added later keeps the version; a field
/// removed or changed in meaning bumps it):
///
/// ```text
/// { "version": 1, "clock_ms": u64, "refused": u64,
///   "services": [ { "name": str, "mode": str,
///       "submitted": u64, "succeeded": u64, "failed": u64, "rejected": u64,
///       "shed": u64, "shed_at_intake": u64,
///       "shed_by_class": { "critical": u64, "default": u64, "sheddable": u64 },
///       "ready_by_class": { "critical": u64, "default": u64, "sheddable": u64 },
///       "retried": u64, "hedged": u64, "cancelled": u64,
///       "queued": u64, "waiting": u64, "capacity": u64, "peak_queued": u64,
///       "in_flight": u64, "overloaded": bool, "retry_budget_left": u64,
///       "gate": str | null,
///       "tenants": [ { "tenant": str | null, "offered": u64, "served": u64,
///           "shed": u64, "rate_limited": u64 } ],
///       "nodes": [ { "address": str, "weight": u32, "effective_weight": u32,
///           "active": bool, "draining": bool, "health": str,
///           "breaker": "closed" | "open" | "half-open", "open_for_ms": u64 | null,
///           "trips": u64, "in_flight": u32, "max_concurrent": u32,
///           "concurrency_limit": u32, "free_limit": u32,
///           "total": u64, "errors": u64, "error_rate": f64,
///           "latency_p50_ms": f64, "latency_p99_ms": f64, "ewma_latency_ms": f64,
///           "tokens": u32 | null } ] } ] }
/// ```
///
/// `clock_ms` is a monotonic clock (milliseconds since the process first
/// served a snapshot): the page divides the change of a counter between two
/// snapshots by the change of `clock_ms`, so a slow poll never inflates a
/// rate.
pub fn status_page() -> StatusPage {
    StatusPage { _private: () }
}

/// The service [`status_page`] returns (mount it with `App::service` or
/// `Scope::service`).
#[derive(Debug, Clone)]
pub struct StatusPage {
    _private: (),
}

impl HttpServiceFactory for StatusPage {
    fn register(self, config: &mut AppService) {
        web::resource("/status")
            .route(admin::get_or_head().to(page))
            .register(config);
        web::resource("/status.json")
            .route(admin::get_or_head().to(snapshot))
            .register(config);
    }
}

/// `GET /status`: the page.
async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(ContentType::html())
        .insert_header(CacheControl(vec![CacheDirective::NoCache]))
        .insert_header(("content-security-policy", CSP))
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header(("referrer-policy", "no-referrer"))
        .body(PAGE)
}

/// `GET /status.json`: one snapshot.
async fn snapshot(req: HttpRequest) -> HttpResponse {
    let Some(d) = dispatcher_of(&req) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_dispatcher", "", "");
    };
    let stats = d.stats().await;
    HttpResponse::Ok()
        .insert_header(CacheControl(vec![CacheDirective::NoStore]))
        .insert_header(("x-content-type-options", "nosniff"))
        .json(Snapshot::of(&stats, clock_ms()))
}

/// Milliseconds on the monotonic clock since the first snapshot served.
fn clock_ms() -> u64 {
    static EPOCH: OnceLock<crate::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(crate::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `text` with the userinfo of every URL in it removed: what stands
/// between a `://` and an `@` before the authority ends (`/`, `?`, `#`,
/// whitespace, a quote or the end).
fn without_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>') || c.is_whitespace()
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => out.push_str(&authority[at + 1..]),
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

// === impl Snapshot ===

/// What `/status.json` serves (the module's schema).
#[derive(Debug, Serialize)]
struct Snapshot {
    version: u32,
    clock_ms: u64,
    refused: u64,
    services: Vec<ServiceSnapshot>,
}

#[derive(Debug, Serialize)]
struct ServiceSnapshot {
    name: String,
    mode: Mode,
    submitted: u64,
    succeeded: u64,
    failed: u64,
    rejected: u64,
    shed: u64,
    shed_at_intake: u64,
    shed_by_class: ByPriority,
    ready_by_class: ByPriority,
    retried: u64,
    hedged: u64,
    cancelled: u64,
    queued: u64,
    waiting: u64,
    capacity: u64,
    peak_queued: u64,
    in_flight: u64,
    overloaded: bool,
    retry_budget_left: u64,
    gate: Option<String>,
    /// The tenants that shed most, then offered most (at most
    /// [`TOP_TENANTS`]; `tenant: null` is the overflow queue).
    tenants: Vec<crate::stats::TenantStats>,
    nodes: Vec<NodeSnapshot>,
}

/// Most tenants a service's snapshot lists: the page stays small whatever
/// `tenants.max_tracked` is.
const TOP_TENANTS: usize = 10;

/// The [`TOP_TENANTS`] tenants that shed most, then offered most.
fn top_tenants(all: &[crate::stats::TenantStats]) -> Vec<crate::stats::TenantStats> {
    let mut v: Vec<&crate::stats::TenantStats> = all.iter().collect();
    v.sort_by_key(|t| std::cmp::Reverse((t.shed, t.offered)));
    v.into_iter().take(TOP_TENANTS).cloned().collect()
}

#[derive(Debug, Serialize)]
struct NodeSnapshot {
    address: String,
    weight: u32,
    effective_weight: u32,
    active: bool,
    draining: bool,
    health: &'static str,
    breaker: BreakerStatus,
    open_for_ms: Option<u64>,
    trips: u64,
    in_flight: u32,
    max_concurrent: u32,
    concurrency_limit: u32,
    free_limit: u32,
    total: u64,
    errors: u64,
    error_rate: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    ewma_latency_ms: f64,
    tokens: Option<u32>,
}

impl Snapshot {
    fn of(stats: &Stats, clock_ms: u64) -> Snapshot {
        Snapshot {
            version: 1,
            clock_ms,
            refused: stats.refused,
            services: stats.services.iter().map(ServiceSnapshot::of).collect(),
        }
    }
}

impl ServiceSnapshot {
    fn of(s: &ServiceStats) -> ServiceSnapshot {
        let q = &s.queue;
        ServiceSnapshot {
            name: s.name.clone(),
            mode: s.mode,
            submitted: q.submitted,
            succeeded: q.succeeded,
            failed: q.failed,
            rejected: q.rejected,
            shed: q.shed,
            shed_at_intake: q.shed_at_intake,
            shed_by_class: q.shed_by_class,
            ready_by_class: q.ready_by_class,
            retried: q.retried,
            hedged: q.hedged,
            cancelled: q.cancelled,
            queued: q.queued,
            waiting: q.waiting,
            capacity: q.capacity,
            peak_queued: q.peak_queued,
            in_flight: q.in_flight,
            overloaded: q.overloaded,
            retry_budget_left: q.retry_budget_left,
            gate: q.gate.as_deref().map(without_userinfo),
            tenants: top_tenants(&q.tenants),
            nodes: s.nodes.iter().map(NodeSnapshot::of).collect(),
        }
    }
}

impl NodeSnapshot {
    fn of(n: &NodeStats) -> NodeSnapshot {
        NodeSnapshot {
            address: without_userinfo(&n.address),
            weight: n.weight,
            effective_weight: n.effective_weight,
            active: n.active,
            draining: n.draining,
            health: n.health,
            breaker: n.breaker,
            open_for_ms: n.open_for_ms,
            trips: n.trips,
            in_flight: n.in_flight,
            max_concurrent: n.max_concurrent,
            concurrency_limit: n.concurrency_limit,
            free_limit: n.free_limit,
            total: n.total,
            errors: n.errors,
            error_rate: finite(n.error_rate),
            latency_p50_ms: finite(n.latency_p50_ms),
            latency_p99_ms: finite(n.latency_p99_ms),
            ewma_latency_ms: finite(n.ewma_latency_ms),
            tokens: n.tokens,
        }
    }
}

/// `x`, or 0 when it is not finite (JSON has no NaN; serde would write
/// `null` where the schema says a number).
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_userinfo_is_removed_from_addresses_and_text() {
        let cases = [
            ("http://10.0.0.7:8080/", "http://10.0.0.7:8080/"),
            (
                "http://user:pw@10.0.0.7:8080/v1/",
                "http://10.0.0.7:8080/v1/",
            ),
            ("https://a%40b:p@ss@host/", "https://host/"),
            ("http://host/path@x/", "http://host/path@x/"),
            ("http://u@host", "http://host"),
            (
                "circuit open; last error: connect http://u:p@h:1/ refused, see https://k@m?x",
                "circuit open; last error: connect http://h:1/ refused, see https://m?x",
            ),
            ("no url at all", "no url at all"),
            ("trailing ://", "trailing ://"),
        ];
        for (input, want) in cases {
            assert_eq!(without_userinfo(input), want, "{input}");
        }
    }

    #[test]
    fn status_page_loads_nothing_from_elsewhere() {
        // No element or style that fetches: the only URL in the page is
        // the SVG namespace, and its data comes from a relative path.
        for needle in [
            "src=", "href=", "url(", "@import", "<link", "<iframe", "<img",
        ] {
            assert!(!PAGE.contains(needle), "{needle}");
        }
        let urls: Vec<&str> = PAGE
            .match_indices("://")
            .map(|(i, _)| &PAGE[i.saturating_sub(4)..(i + 22).min(PAGE.len())])
            .collect();
        assert_eq!(urls, ["http://www.w3.org/2000/svg"]);
        assert!(PAGE.contains(r#"fetch("status.json""#));
        assert!(
            PAGE.lines().count() < 400,
            "keep the page small enough to read"
        );
    }

    #[test]
    fn status_lists_the_tenants_that_shed_most_at_most_ten() {
        let all: Vec<crate::stats::TenantStats> = (0..30u64)
            .map(|i| crate::stats::TenantStats {
                tenant: Some(format!("t{i}")),
                offered: 100 + i,
                served: 50,
                shed: i % 3,
                rate_limited: 0,
            })
            .collect();
        let top = top_tenants(&all);
        let names: Vec<_> = top.iter().filter_map(|t| t.tenant.as_deref()).collect();
        assert_eq!(
            names,
            ["t29", "t26", "t23", "t20", "t17", "t14", "t11", "t8", "t5", "t2"]
        );
        assert!(top_tenants(&[]).is_empty());
    }

    #[test]
    fn status_non_finite_figures_are_zero() {
        assert_eq!(finite(f64::NAN), 0.0);
        assert_eq!(finite(f64::INFINITY), 0.0);
        assert_eq!(finite(2.5), 2.5);
    }
}
