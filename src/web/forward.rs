//! [`forward`]: an incoming request becomes a task (path tail, query,
//! end-to-end headers, `X-Forwarded-For` and `Forwarded`, body).

use actix_web::error::PayloadError;
use actix_web::http::header::HeaderValue;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;

use super::*;

// === forward ===

/// A route (any method) that forwards each request to `service`. Mount it
/// on a path with a tail, `{tail:.*}` or `{tail}*`: the tail and the query
/// become the task's path. Without a `tail` parameter, the part of the path
/// the routing has not consumed is the path (a scope's default service).
///
/// The scope is the cheaper of the two on a busy gateway:
/// `web::scope("/inference").default_service(forward("inference"))` is
/// matched as a prefix, where actix-web matches a route with a `{tail}` by
/// a regular expression (without its `unicode` feature, `regex-lite`'s
/// PikeVM, some 12 000 instructions for a short path: 15 % of what the
/// gateway bench spent on a request).
pub fn forward(service: impl Into<String>) -> Route {
    let service: Arc<str> = service.into().into();
    web::to(move |req: HttpRequest, body: web::Payload| {
        let service = Arc::clone(&service);
        async move { forward_one(&service, req, body).await }
    })
}

async fn forward_one(service: &str, req: HttpRequest, body: web::Payload) -> HttpResponse {
    let Some(dispatcher) = dispatcher_of(&req) else {
        let msg = "no Dispatcher in the app data (App::app_data(web::Data::new(dispatcher)))";
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no_dispatcher",
            msg,
            service,
        );
    };
    let cfg = ForwardConfig::of(&req);
    if !cfg.allows(req.method()) {
        return not_allowed(req.method(), cfg, service);
    }
    if let Err(over) = cfg.headers.check(req.headers()) {
        let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        return error(status, "headers_too_large", &over.to_string(), service);
    }
    let too_large = || {
        let msg = format!("request body over {} bytes", cfg.max_body);
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &msg,
            service,
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cfg.max_body as u64) {
        return too_large();
    }
    let body = match read_body(body, cfg.max_body).await {
        Ok(body) => body,
        Err(BodyError::Read(e)) => {
            let msg = format!("cannot read the request body: {e}");
            return error(StatusCode::BAD_REQUEST, "bad_body", &msg, service);
        }
        Err(BodyError::Over) => return too_large(),
    };
    let priority = match cfg.priority(&req) {
        Ok(p) => p,
        Err(msg) => return error(StatusCode::BAD_REQUEST, "bad_priority", &msg, service),
    };
    let tenant = match cfg.tenant(&req) {
        Ok(t) => t,
        Err(msg) => return error(StatusCode::BAD_REQUEST, "bad_tenant", &msg, service),
    };
    let strip = Strip {
        own: cfg.priority_header.as_ref(),
        proxy: !cfg.trust_proxy_headers,
    };
    let headers = match outgoing_headers(&req, strip) {
        Ok(headers) => headers,
        Err(msg) => return error(StatusCode::BAD_REQUEST, "bad_header", &msg, service),
    };
    let mut task = Task::new(service, req.method().clone(), task_path(&req))
        .body(body)
        .priority(priority)
        .typed_headers(headers);
    if let Some(t) = tenant {
        task = task.tenant(t);
    }
    if let Some(d) = cfg.deadline {
        task = task.deadline_in(d);
    }
    if cfg.streams(&req) {
        task = task
            .stream(true)
            .stream_send_timeout(cfg.stream_send_timeout);
        if let Some(life) = cfg.stream_max_duration {
            task = task.stream_max_duration(life);
        }
    }
    let result = dispatcher.submit(task).await;
    respond(result, cfg)
}

/// A 405 for a method the route does not forward, with its `Allow`.
fn not_allowed(method: &Method, cfg: &ForwardConfig, service: &str) -> HttpResponse {
    let msg = format!("method {method} is not forwarded");
    let mut res = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &msg,
        service,
    );
    if let Ok(allow) = HeaderValue::try_from(cfg.allow_field()) {
        res.headers_mut().insert(header::ALLOW, allow);
    }
    res
}

/// Why a request's body was not read.
enum BodyError {
    /// Over the limit.
    Over,
    /// The client's stream failed.
    Read(PayloadError),
}

/// The request's body, whole, at most `limit` bytes. A body of one chunk
/// (or none, as a GET's) is taken as it came; only a longer one is copied
/// into a buffer, of the size it reaches (actix-web's `to_bytes_limited`
/// starts every body, an empty one too, with a 32 KiB buffer).
async fn read_body(mut body: web::Payload, limit: usize) -> Result<Bytes, BodyError> {
    let Some(first) = next(&mut body).await? else {
        return Ok(Bytes::new());
    };
    if first.len() > limit {
        return Err(BodyError::Over);
    }
    let Some(second) = next(&mut body).await? else {
        return Ok(first);
    };
    let mut buf = BytesMut::with_capacity(first.len() + second.len());
    buf.extend_from_slice(&first);
    let mut chunk = Some(second);
    while let Some(c) = chunk {
        if buf.len() + c.len() > limit {
            return Err(BodyError::Over);
        }
        buf.extend_from_slice(&c);
        chunk = next(&mut body).await?;
    }
    Ok(buf.freeze())
}

async fn next(body: &mut web::Payload) -> Result<Option<Bytes>, BodyError> {
    body.next().await.transpose().map_err(BodyError::Read)
}

/// The task's path: the route's tail (re-encoded where actix decoded it)
/// and the raw query.
fn task_path(req: &HttpRequest) -> String {
    let info = req.match_info();
    let tail = info.get("tail").unwrap_or_else(|| info.unprocessed());
    let mut path = String::with_capacity(tail.len() + 1 + req.query_string().len() + 1);
    path.push('/');
    encode_path(tail.trim_start_matches('/'), &mut path);
    if !req.query_string().is_empty() {
        path.push('?');
        path.push_str(req.query_string());
    }
    path
}

/// Percent-encodes what a URI path may not hold. actix-web's router decodes
/// a path except `%`, `/` and `+` (kept as `%25`, `%2F`, `%2B`), so a `%`
/// here starts an escape and stays; a decoded `?`, `#` or space does not.
fn encode_path(tail: &str, out: &mut String) {
    for b in tail.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Whether a header is the connection's and not the message's (RFC 9110
/// §7.6.1), or one the engine sets for the endpoint (`Host`, `Content-Length`).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    ) || n.starts_with("proxy-")
}

/// Whether a client's header tells a backend where the request came from
/// or went to: a proxy's to set, a client's to forge (`X-Original-URL` and
/// `X-Rewrite-URL` reroute a request in IIS and Symfony past the path the
/// gateway checked). `X-Forwarded-For` and `Forwarded` are not among them:
/// the gateway appends the client's address to those.
pub(super) fn is_proxy_set(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "x-forwarded-host" | "x-forwarded-proto" | "x-real-ip" | "x-original-url" | "x-rewrite-url"
    )
}

/// The headers named in `Connection` (lowercase); empty, and nothing
/// allocated, when there is no `Connection` field.
pub(super) fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Which of a request's headers [`outgoing_headers`] drops besides the
/// hop-by-hop ones.
#[derive(Clone, Copy, Default)]
struct Strip<'a> {
    /// The gateway's own (the priority header).
    own: Option<&'a HeaderName>,
    /// Those a proxy sets ([`is_proxy_set`]).
    proxy: bool,
}

/// The request's headers as the task carries them: end to end only (and
/// not those `strip` names), each name once (repeated values joined, as
/// RFC 9110 §5.3 allows), in order of first appearance, with the client's
/// address appended to `X-Forwarded-For` and `Forwarded`. A value that
/// comes once is passed on as it is (its bytes shared, not copied).
fn outgoing_headers(
    req: &HttpRequest,
    strip: Strip<'_>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let own = strip.own;
    let headers = req.headers();
    let listed = connection_listed(headers);
    let mut out: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(headers.len() + 2);
    // The joined values of repeated names, by their index in `out`.
    let mut joined: Vec<(usize, String)> = Vec::new();
    let (mut xff, mut fwd): (Option<String>, Option<String>) = (None, None);
    for (name, value) in headers.iter() {
        if is_hop_by_hop(name)
            || Some(name) == own
            || (strip.proxy && is_proxy_set(name))
            || listed.iter().any(|l| l == name.as_str())
        {
            continue;
        }
        let text = value
            .to_str()
            .map_err(|_| format!("header {name} has a value that is not visible ASCII"))?;
        let sep = if name == header::COOKIE { "; " } else { ", " };
        let slot = if name.as_str() == "x-forwarded-for" {
            &mut xff
        } else if name == header::FORWARDED {
            &mut fwd
        } else {
            // A repeated name's values come one after another from the map;
            // the search is for a map that would not keep them together.
            match out.iter().rposition(|(n, _)| n == name) {
                Some(i) => {
                    let at = match joined.iter().position(|(j, _)| *j == i) {
                        Some(at) => at,
                        None => {
                            // Checked visible ASCII when it was pushed.
                            let first = out[i].1.to_str().unwrap_or_default().to_owned();
                            joined.push((i, first));
                            joined.len() - 1
                        }
                    };
                    let all = &mut joined[at].1;
                    all.push_str(sep);
                    all.push_str(text);
                }
                None => out.push((name.clone(), value.clone())),
            }
            continue;
        };
        match slot {
            Some(all) => {
                all.push_str(sep);
                all.push_str(text);
            }
            None => *slot = Some(text.to_owned()),
        }
    }
    for (i, all) in joined {
        out[i].1 = text_value(&out[i].0, all)?;
    }
    let xff_name = HeaderName::from_static("x-forwarded-for");
    if let Some(ip) = req.peer_addr().map(|a| a.ip()) {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| is_token_or_host(h));
        let proto = if req.app_config().secure() {
            ";proto=https"
        } else {
            ";proto=http"
        };
        // Both values are written into one buffer and split: one
        // allocation (and one shared count) for the pair.
        let prev = |v: &Option<String>| v.as_ref().map_or(0, |v| v.len() + 2);
        let room = prev(&xff) + prev(&fwd) + 2 * 48 + 24 + host.map_or(0, |h| h.len() + 6);
        let mut buf = BytesMut::with_capacity(room);
        if let Some(prev) = &xff {
            buf.extend_from_slice(prev.as_bytes());
            buf.extend_from_slice(b", ");
        }
        let node_at = buf.len();
        push_ip(ip, &mut buf);
        let xff = buf.split().freeze();
        let node = &xff[node_at..];
        if let Some(prev) = &fwd {
            buf.extend_from_slice(prev.as_bytes());
            buf.extend_from_slice(b", ");
        }
        buf.extend_from_slice(b"for=");
        if ip.is_ipv6() {
            // RFC 7239 §6: an IPv6 node is quoted and bracketed.
            buf.extend_from_slice(b"\"[");
            buf.extend_from_slice(node);
            buf.extend_from_slice(b"]\"");
        } else {
            buf.extend_from_slice(node);
        }
        if let Some(host) = host {
            buf.extend_from_slice(b";host=");
            buf.extend_from_slice(host.as_bytes());
        }
        buf.extend_from_slice(proto.as_bytes());
        let invalid = |name: &HeaderName| format!("header {name}: its joined value is not valid");
        let xff = HeaderValue::from_maybe_shared(xff).map_err(|_| invalid(&xff_name))?;
        let fwd = HeaderValue::from_maybe_shared(buf.freeze())
            .map_err(|_| invalid(&header::FORWARDED))?;
        out.push((xff_name, xff));
        out.push((header::FORWARDED, fwd));
    } else {
        if let Some(v) = xff {
            out.push((xff_name.clone(), text_value(&xff_name, v)?));
        }
        if let Some(v) = fwd {
            out.push((header::FORWARDED, text_value(&header::FORWARDED, v)?));
        }
    }
    Ok(out)
}

/// `text` (made of visible ASCII values) as `name`'s value, its bytes
/// moved, not copied.
fn text_value(name: &HeaderName, text: String) -> Result<HeaderValue, String> {
    HeaderValue::try_from(text).map_err(|_| format!("header {name}: its joined value is not valid"))
}

/// `ip` as text, an IPv4 address without the formatting machinery (it is
/// written on every request).
fn push_ip(ip: IpAddr, out: &mut BytesMut) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b".");
                }
                if octet >= 100 {
                    out.extend_from_slice(&[b'0' + octet / 100]);
                }
                if octet >= 10 {
                    out.extend_from_slice(&[b'0' + octet / 10 % 10]);
                }
                out.extend_from_slice(&[b'0' + octet % 10]);
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// A `Host` value that can go into `Forwarded` unquoted.
fn is_token_or_host(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use std::collections::BTreeMap;

    fn as_text(h: Vec<(HeaderName, HeaderValue)>) -> BTreeMap<String, String> {
        h.into_iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn decoded_specials_are_encoded_again() {
        let mut out = String::new();
        encode_path("a b/c?d#e/%2F/ü/x:y@z", &mut out);
        assert_eq!(out, "a%20b/c%3Fd%23e/%2F/%C3%BC/x:y@z");
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_dropped() {
        let req = TestRequest::default()
            .insert_header(("connection", "keep-alive, x-hop"))
            .insert_header(("x-hop", "1"))
            .insert_header(("keep-alive", "timeout=5"))
            .insert_header(("proxy-authorization", "Basic eA=="))
            .insert_header(("te", "trailers"))
            .insert_header(("trailer", "x-t"))
            .insert_header(("upgrade", "h2c"))
            .insert_header(("host", "gw.example"))
            .insert_header(("content-length", "0"))
            .insert_header(("x-keep", "yes"))
            .append_header(("x-many", "a"))
            .append_header(("x-many", "b"))
            .insert_header(("x-forwarded-for", "10.0.0.1"))
            .peer_addr("192.0.2.7:5000".parse().unwrap())
            .to_http_request();
        let h = as_text(outgoing_headers(&req, Strip::default()).unwrap());
        let names: Vec<&str> = h.keys().map(String::as_str).collect();
        assert_eq!(names, ["forwarded", "x-forwarded-for", "x-keep", "x-many"]);
        assert_eq!(h["x-many"], "a, b");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(h["forwarded"], "for=192.0.2.7;host=gw.example;proto=http");
    }

    #[test]
    fn headers_a_proxy_sets_are_dropped_unless_trusted() {
        let req = TestRequest::default()
            .insert_header(("x-forwarded-host", "admin.internal"))
            .insert_header(("x-forwarded-proto", "https"))
            .insert_header(("x-real-ip", "10.0.0.1"))
            .insert_header(("x-original-url", "/admin"))
            .insert_header(("x-rewrite-url", "/admin"))
            .insert_header(("x-forwarded-for", "10.0.0.2"))
            .insert_header(("x-keep", "yes"))
            .peer_addr("192.0.2.7:5000".parse().unwrap())
            .to_http_request();
        let strip = Strip {
            own: None,
            proxy: true,
        };
        let h = as_text(outgoing_headers(&req, strip).unwrap());
        let names: Vec<&str> = h.keys().map(String::as_str).collect();
        assert_eq!(names, ["forwarded", "x-forwarded-for", "x-keep"]);
        assert_eq!(h["x-forwarded-for"], "10.0.0.2, 192.0.2.7");
        let h = as_text(outgoing_headers(&req, Strip::default()).unwrap());
        assert_eq!(h.len(), 8, "{h:?}");
        assert_eq!(h["x-original-url"], "/admin");
    }

    #[test]
    fn ipv4_addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "10.20.255.7",
            "192.0.2.7",
            "255.255.255.255",
            "1.100.99.9",
        ] {
            let mut out = BytesMut::new();
            push_ip(ip.parse().unwrap(), &mut out);
            assert_eq!(out, ip);
        }
    }

    #[test]
    fn repeated_forwarding_headers_are_joined_before_the_client_is_added() {
        let req = TestRequest::default()
            .append_header(("x-forwarded-for", "10.0.0.1"))
            .append_header(("x-forwarded-for", "10.0.0.2"))
            .insert_header(("forwarded", "for=10.0.0.1"))
            .append_header(("cookie", "a=1"))
            .append_header(("cookie", "b=2"))
            .peer_addr("192.0.2.7:5000".parse().unwrap())
            .to_http_request();
        let h = as_text(outgoing_headers(&req, Strip::default()).unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 192.0.2.7");
        assert_eq!(h["forwarded"], "for=10.0.0.1, for=192.0.2.7;proto=http");
        assert_eq!(h["cookie"], "a=1; b=2");
    }

    #[actix_rt::test]
    async fn under_a_scope_the_rest_of_the_path_is_the_tasks_path() {
        use actix_web::{test, App};
        let echo = |req: HttpRequest| async move { HttpResponse::Ok().body(task_path(&req)) };
        let app = App::new().service(web::scope("/bench").default_service(web::to(echo)));
        let app = test::init_service(app).await;
        for (uri, want) in [
            ("/bench/items/1?q=1", "/items/1?q=1"),
            ("/bench/a%20b/%2F", "/a%20b/%2F"),
            ("/bench", "/"),
        ] {
            let req = test::TestRequest::get().uri(uri).to_request();
            let body = test::call_and_read_body(&app, req).await;
            assert_eq!(body, want.as_bytes(), "{uri}");
        }
    }

    /// The body of `chunks` (then an error, when `fail`) read under `limit`.
    async fn body_of(
        chunks: &[&'static str],
        fail: bool,
        limit: usize,
    ) -> Result<Bytes, BodyError> {
        use actix_web::FromRequest as _;
        let (mut tx, rx) = actix_http::h1::Payload::create(false);
        for c in chunks {
            tx.feed_data(Bytes::from_static(c.as_bytes()));
        }
        if fail {
            tx.set_error(PayloadError::Incomplete(None));
        } else {
            tx.feed_eof();
        }
        let req = TestRequest::default().to_http_request();
        let mut dev = actix_web::dev::Payload::from(rx);
        let body = web::Payload::from_request(&req, &mut dev).await.unwrap();
        read_body(body, limit).await
    }

    #[actix_rt::test]
    async fn bodies_are_read_whole_under_the_limit() {
        let ok = |r: Result<Bytes, BodyError>| match r {
            Ok(b) => b,
            Err(BodyError::Over) => panic!("over"),
            Err(BodyError::Read(e)) => panic!("{e}"),
        };
        assert_eq!(ok(body_of(&[], false, 0).await), "");
        assert_eq!(ok(body_of(&["abc"], false, 3).await), "abc");
        assert_eq!(ok(body_of(&["ab", "cd", "e"], false, 5).await), "abcde");
        assert!(matches!(
            body_of(&["abc"], false, 2).await,
            Err(BodyError::Over)
        ));
        assert!(matches!(
            body_of(&["ab", "cd", "ef"], false, 5).await,
            Err(BodyError::Over)
        ));
        assert!(matches!(
            body_of(&["ab"], true, 5).await,
            Err(BodyError::Read(_))
        ));
        assert!(matches!(
            body_of(&["ab", "c"], true, 5).await,
            Err(BodyError::Read(_))
        ));
        // A GET's payload: none at all.
        let req = TestRequest::default().to_http_request();
        let body = {
            use actix_web::FromRequest as _;
            web::Payload::from_request(&req, &mut actix_web::dev::Payload::None)
                .await
                .unwrap()
        };
        assert_eq!(ok(read_body(body, 10).await), "");
    }

    #[test]
    fn ipv6_clients_are_quoted_in_forwarded() {
        let req = TestRequest::default()
            .peer_addr("[2001:db8::1]:443".parse().unwrap())
            .to_http_request();
        let h = outgoing_headers(&req, Strip::default()).unwrap();
        let h: Vec<(&str, &str)> = h
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(h[0], ("x-forwarded-for", "2001:db8::1"));
        assert_eq!(h[1].1, "for=\"[2001:db8::1]\";proto=http");
    }
}
