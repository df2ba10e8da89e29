//! A task's result as the gateway's response (the table in [`super`]).

use super::*;

// === the outcome mapping ===

impl Responder for TaskResult {
    type Body = BoxBody;

    fn respond_to(self, req: &HttpRequest) -> HttpResponse {
        respond(self, ForwardConfig::of(req))
    }
}

/// The response for a task's result (see the module docs' table).
pub(super) fn respond(mut r: TaskResult, cfg: &ForwardConfig) -> HttpResponse {
    // The backend's answers first: nothing of the error's words is made
    // for them.
    let (status, retry_after) = match &mut r.outcome {
        Outcome::Success(resp) | Outcome::Fallback { response: resp, .. } => return proxied(resp),
        Outcome::Failure(f) => match (f.reason, f.response.as_mut()) {
            (FailReason::NotRetryable, Some(resp)) => return proxied(resp),
            (FailReason::DeadlineExceeded, _) => (StatusCode::GATEWAY_TIMEOUT, None),
            _ => (StatusCode::BAD_GATEWAY, None),
        },
        Outcome::Rejected(why) => rejection_status(why, cfg),
    };
    let code = reason_code(&r.outcome).unwrap_or("error");
    // The detail names backends (addresses, TLS peers, URLs): it stays in
    // the result, the logs and the stats, and the client gets the code.
    if log::log_enabled!(log::Level::Debug) {
        let detail = error_message(&r).unwrap_or_default();
        log::debug!(
            "service {}: task {}: answered {status}: {detail}",
            r.service,
            r.id
        );
    }
    let message = public_message(&r.outcome);
    let (service, attempts) = (&*r.service, r.attempts.len());
    let mut body = json!({"error": code, "message": message, "service": service});
    if attempts > 0 {
        body["attempts"] = attempts.into();
    }
    let mut res = HttpResponse::build(status);
    if let Some(after) = retry_after {
        // Whole seconds, rounded up: never tell a client to come back early.
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        let secs = secs.max(1);
        body["retry_after"] = secs.into();
        res.insert_header((header::RETRY_AFTER, secs));
    }
    res.content_type("application/json").body(body.to_string())
}

/// What the client is told of a result the gateway answers itself: a short
/// text that names no backend. Only an invalid task's reason, which is
/// about the client's own request, is told as it is.
fn public_message(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Success(_) => "",
        Outcome::Failure(f) => match f.reason {
            FailReason::NotRetryable => "the backend could not serve the request",
            FailReason::RetriesExhausted => "no backend served the request",
            FailReason::BudgetExhausted => "the backends are failing; the request was not retried",
            FailReason::DeadlineExceeded => "no answer within the deadline",
        },
        Outcome::Rejected(why) | Outcome::Fallback { reason: why, .. } => match why {
            Rejection::InvalidTask(reason) => reason,
            Rejection::QueueFull => "too many requests are waiting",
            Rejection::RateLimited { .. } => "rate limited",
            Rejection::CircuitOpen { .. } => "no backend is available",
            Rejection::Overloaded { .. } => "overloaded",
            Rejection::ShuttingDown => "shutting down",
            Rejection::UnknownService(_) => "no such service",
            Rejection::DeadlinePassed => "the deadline passed before the request was sent",
            Rejection::Cancelled => "the client left",
            Rejection::Internal(_) => "internal error",
        },
    }
}

/// The status and `Retry-After` of a rejection.
fn rejection_status(why: &Rejection, cfg: &ForwardConfig) -> (StatusCode, Option<Duration>) {
    match why {
        Rejection::QueueFull => (cfg.queue_full_status, Some(cfg.queue_full_retry_after)),
        Rejection::RateLimited { retry_after } => (cfg.rate_limited_status, Some(*retry_after)),
        Rejection::CircuitOpen { retry_after, .. } | Rejection::Overloaded { retry_after } => {
            (StatusCode::SERVICE_UNAVAILABLE, Some(*retry_after))
        }
        Rejection::ShuttingDown | Rejection::UnknownService(_) | Rejection::Internal(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, None)
        }
        Rejection::DeadlinePassed => (StatusCode::GATEWAY_TIMEOUT, None),
        Rejection::InvalidTask(_) => (StatusCode::BAD_REQUEST, None),
        // Nobody reads it (the client left); nginx's "client closed
        // request".
        Rejection::Cancelled => (
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            None,
        ),
    }
}

/// The backend's answer, end-to-end headers only; a streamed body passes
/// through chunk by chunk (an error item ends the client's response early).
pub(super) fn proxied(resp: &mut Response) -> HttpResponse {
    let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
    // The answer's header map becomes the response's, less the hop-by-hop
    // fields: no header is copied.
    let mut headers = std::mem::take(&mut resp.headers);
    let listed = connection_listed(&headers);
    headers.retain(|name, _| !is_hop_by_hop(name) && !listed.iter().any(|l| l == name.as_str()));
    let mut res = match resp.take_stream() {
        Some(stream) => HttpResponse::build(status).streaming(stream),
        None => {
            HttpResponse::with_body(status, std::mem::take(&mut resp.body)).map_into_boxed_body()
        }
    };
    // What the builder set (a streamed body's default `Content-Type`)
    // stays only where the backend sent no such field.
    let defaults = std::mem::replace(res.headers_mut(), headers);
    for (name, value) in defaults {
        if !res.headers().contains_key(&name) {
            res.headers_mut().insert(name, value);
        }
    }
    res
}

/// A JSON error the gateway makes itself.
pub(super) fn error(status: StatusCode, code: &str, message: &str, service: &str) -> HttpResponse {
    let body = json!({"error": code, "message": message, "service": service});
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    #[actix_rt::test]
    async fn an_error_answer_names_no_backend() {
        let last = "connect to 10.0.0.7:8443: I/O error (https://gpu-a.internal:8443/v1/)";
        let cases = [
            Outcome::Rejected(Rejection::CircuitOpen {
                retry_after: Duration::from_secs(1),
                last_error: Some(last.into()),
            }),
            Outcome::Rejected(Rejection::Internal(last.into())),
            Outcome::Rejected(Rejection::UnknownService(last.into())),
            Outcome::Failure(crate::outcome::Failure::new(
                FailReason::RetriesExhausted,
                Some(crate::outcome::AttemptOutcome::Error(
                    crate::outcome::ErrorKind::Connect,
                )),
                None,
            )),
        ];
        for outcome in cases {
            let mut r = TaskResult::new(1, "svc", outcome);
            let mut attempt = crate::outcome::Attempt::new(
                "https://gpu-a.internal:8443/v1/",
                crate::outcome::AttemptOutcome::Error(crate::outcome::ErrorKind::Connect),
                Duration::from_millis(1),
            );
            attempt.error = Some(last.into());
            r.attempts = vec![attempt];
            let res = respond(r, &ForwardConfig::DEFAULT);
            assert!(res.status().is_server_error());
            let body = res.into_body().try_into_bytes().ok().unwrap();
            let body = String::from_utf8_lossy(&body);
            for secret in ["10.0.0.7", "8443", "gpu-a", "https://", "I/O"] {
                assert!(!body.contains(secret), "{secret} in {body}");
            }
        }
    }

    #[test]
    fn the_answers_hop_by_hop_fields_are_dropped_and_the_rest_kept_whole() {
        let mut resp = Response::new(201, "hello");
        let h = &mut resp.headers;
        for (k, v) in [
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("proxy-authenticate", "Basic"),
            ("content-type", "text/plain"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ] {
            h.append(
                HeaderName::from_static(k),
                actix_web::http::header::HeaderValue::from_static(v),
            );
        }
        let res = proxied(&mut resp);
        assert_eq!(res.status(), StatusCode::CREATED);
        let mut names: Vec<&str> = res.headers().keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "set-cookie"]);
        let cookies: Vec<&[u8]> = res
            .headers()
            .get_all(header::SET_COOKIE)
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(cookies, [&b"a=1"[..], &b"b=2"[..]]);
        let body = res.into_body().try_into_bytes().ok().unwrap();
        assert_eq!(&body[..], b"hello");
    }
}
