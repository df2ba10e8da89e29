//! What real clients found (issue 23), over raw sockets: request header
//! limits answered 431 before anything is sent, and `HEAD` on the admin
//! routes answered as `GET` without a body.

use super::*;

/// A request to `/svc/x` with `fields` extra header fields, closing after.
fn request_with(fields: &[(String, String)]) -> String {
    let mut r = String::from("GET /svc/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n");
    for (k, v) in fields {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r
}

fn addr_of(gw: &Gateway) -> String {
    gw.url["http://".len()..].to_owned()
}

#[actix_rt::test]
async fn headers_over_the_default_limits_are_431_and_never_sent() {
    let b = Backend::start();
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], ""),
        Default::default(),
    );
    // A browser's worth of headers passes.
    let ok = request_with(&[
        ("user-agent".into(), "x".repeat(200)),
        ("cookie".into(), "c".repeat(4000)),
    ]);
    let (status, _, _) = raw(addr_of(&gw), ok).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(b.hits(), 1);
    // One field of 16 KiB (nginx refuses it), and one of 64 KiB (what was
    // forwarded before).
    for size in [16 * 1024, 64 * 1024] {
        let big = request_with(&[("x-big".into(), "v".repeat(size))]);
        let (status, headers, body) = raw(addr_of(&gw), big).await;
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
        assert_eq!(headers["content-type"], "application/json");
        let body = json(body.as_bytes());
        assert_eq!(body["error"], "headers_too_large");
        assert!(
            body["message"].as_str().unwrap().contains("x-big"),
            "{body}"
        );
    }
    // Five fields of 7 KiB: each within 8 KiB, 35 KiB in all.
    let many: Vec<(String, String)> = (0..5)
        .map(|i| (format!("x-part-{i}"), "v".repeat(7 * 1024)))
        .collect();
    let (status, _, body) = raw(addr_of(&gw), request_with(&many)).await;
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(body.contains("max_header_bytes"), "{body}");
    assert_eq!(b.hits(), 1, "nothing over a limit reached the backend");
    gw.stop().await;
}

#[actix_rt::test]
async fn configured_header_limits_count_fields_and_bytes() {
    let b = Backend::start();
    let fwd = ForwardConfig::default()
        .max_headers(10)
        .max_header_line(200)
        .max_header_bytes(1000);
    let gw = Gateway::start(config("round_robin", &[(&b, 1, 10)], ""), fwd);
    // Host and Connection count too: 2 + 8 = 10 fields, at the limit.
    let fields: Vec<(String, String)> = (0..8).map(|i| (format!("x-{i}"), "v".into())).collect();
    let (status, _, _) = raw(addr_of(&gw), request_with(&fields)).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let fields: Vec<(String, String)> = (0..9).map(|i| (format!("x-{i}"), "v".into())).collect();
    let (status, _, body) = raw(addr_of(&gw), request_with(&fields)).await;
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(body.contains("max_headers"), "{body}");
    let long = request_with(&[("x-long".into(), "v".repeat(200))]);
    let (status, _, body) = raw(addr_of(&gw), long).await;
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(body.contains("max_header_line"), "{body}");
    let wide: Vec<(String, String)> = (0..6)
        .map(|i| (format!("x-{i}"), "v".repeat(180)))
        .collect();
    let (status, _, body) = raw(addr_of(&gw), request_with(&wide)).await;
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(body.contains("max_header_bytes"), "{body}");
    assert_eq!(b.hits(), 1);
    gw.stop().await;
}

/// Sends `method path` on its own connection, closed after the answer,
/// and returns the status line, the `Content-Length` and every byte after
/// the head. (One request per connection: actix-http decides whether an
/// answer has a body by the last request it parsed, so a HEAD pipelined
/// before a GET would get one.)
async fn exchange(addr: String, method: &str, path: &str) -> (String, usize, String) {
    let request = format!("{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    let text = actix_rt::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read the answer");
        String::from_utf8(out).expect("text")
    })
    .await
    .unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse().unwrap())
        .expect("a Content-Length");
    (status, length, rest.to_owned())
}

#[actix_rt::test]
async fn head_on_the_admin_routes_answers_as_get_without_a_body() {
    let b = Backend::start();
    let gw = Gateway::start(
        config("round_robin", &[(&b, 1, 10)], ""),
        Default::default(),
    );
    let mut paths = vec!["/health", "/stats"];
    if cfg!(feature = "metrics") {
        paths.push("/metrics");
    }
    for path in paths {
        let head = exchange(addr_of(&gw), "HEAD", path).await;
        let get = exchange(addr_of(&gw), "GET", path).await;
        assert_eq!(head.0, "HTTP/1.1 200 OK", "HEAD {path}");
        assert_eq!(head.2, "", "HEAD {path} sent a body");
        assert!(head.1 > 0, "HEAD {path} tells the body's length");
        assert_eq!(get.0, "HTTP/1.1 200 OK", "GET {path}");
        assert_eq!(get.2.len(), get.1, "GET {path} has its body");
        if path == "/health" {
            assert_eq!(head.1, get.1, "the same length as GET's");
        }
    }
    gw.stop().await;
}
