//! [`configure`]: `GET /stats`, `GET /health` and, with `metrics`, `GET /metrics`;
//! `HEAD` on each as `GET` (actix-http sends the head, with the body's
//! `Content-Length`, and no body).

use super::*;

// === configure: /stats, /health, /metrics ===

/// Serves `GET /stats`, `GET /health` and, with the `metrics` feature,
/// `GET /metrics`, and `HEAD` on each; mount it at the root or in a scope
/// (`web::scope("/admin").configure(configure)`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/stats", get_or_head().to(stats))
        .route("/health", get_or_head().to(health));
    #[cfg(feature = "metrics")]
    cfg.route("/metrics", get_or_head().to(metrics));
}

/// `GET /metrics`: the metrics of the dispatcher in the app data, in the
/// format the request's `Accept` asks for
/// ([`crate::metrics::Format::negotiate`]), with `Vary: Accept`.
#[cfg(feature = "metrics")]
async fn metrics(req: HttpRequest) -> HttpResponse {
    use crate::metrics::{encode_as, Format};
    use actix_web::http::header;
    let accept: Vec<&str> = req
        .headers()
        .get_all(header::ACCEPT)
        .filter_map(|v| v.to_str().ok())
        .collect();
    let accept = accept.join(",");
    let format = Format::negotiate(Some(accept.as_str()).filter(|a| !a.is_empty()));
    match dispatcher_of(&req) {
        Some(d) => HttpResponse::Ok()
            .content_type(format.content_type())
            .insert_header((header::VARY, "Accept"))
            .body(encode_as(&d, format)),
        None => HttpResponse::InternalServerError().body("no dispatcher"),
    }
}

/// A route for `GET` and `HEAD` (a monitor's probe is often a `HEAD`).
pub(super) fn get_or_head() -> Route {
    use actix_web::guard;
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// `GET /stats`: the JSON of [`Dispatcher::stats`].
async fn stats(req: HttpRequest) -> HttpResponse {
    let Some(d) = dispatcher_of(&req) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_dispatcher", "", "");
    };
    HttpResponse::Ok().json(d.stats().await)
}

/// `GET /health`: 200 while every service has an eligible node, else 503.
async fn health(req: HttpRequest) -> HttpResponse {
    let Some(d) = dispatcher_of(&req) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_dispatcher", "", "");
    };
    let (ok, body) = health_of(&d.stats().await);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    HttpResponse::build(status).json(body)
}

/// Why a node cannot take a task now, if it cannot.
fn unavailable(n: &NodeStats) -> Option<&'static str> {
    if !n.active {
        Some("inactive")
    } else if n.draining {
        Some("draining")
    } else if n.health == "unhealthy" {
        Some("unhealthy")
    } else if n.breaker == "open" {
        Some("breaker open")
    } else {
        None
    }
}

/// Whether every service has an eligible node (active, not draining, not
/// unhealthy, breaker not open), and the per-service report.
pub fn health_of(stats: &Stats) -> (bool, serde_json::Value) {
    let mut all_ok = true;
    let mut services = serde_json::Map::new();
    for s in &stats.services {
        let down: Vec<serde_json::Value> = s
            .nodes
            .iter()
            .filter_map(|n| unavailable(n).map(|why| json!({"address": n.address, "why": why})))
            .collect();
        let eligible = s.nodes.len() - down.len();
        let ok = eligible > 0;
        all_ok &= ok;
        let entry = json!({
            "status": if ok { "ok" } else { "unavailable" },
            "eligible": eligible,
            "nodes": s.nodes.len(),
            "queued": s.queue.queued,
            "in_flight": s.queue.in_flight,
            "unavailable": down,
        });
        services.insert(s.name.clone(), entry);
    }
    let status = if all_ok { "ok" } else { "unavailable" };
    (all_ok, json!({"status": status, "services": services}))
}
