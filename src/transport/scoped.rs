//! The endpoint's configured headers (credentials among them) on a lease
//! client's requests to that endpoint only.
//!
//! A [`crate::Lease::client`] is an awc client the caller may point at any
//! URL: a `Location` it follows by hand, a link in a body, a URL built from
//! input. awc's default headers go on every request of a client, so an
//! endpoint's `Authorization: Bearer ...` would reach whatever host the
//! caller names. [`ScopedHeaders`] is an awc middleware that adds them only
//! when the request's origin (scheme, host, port) is the endpoint's, and
//! never replaces a header the request sets itself. [`same_origin`] is the
//! rule, pure.

use std::rc::Rc;

use actix_service::Service;
use awc::error::SendRequestError;
use awc::http::header::{HeaderMap, HeaderName, HeaderValue};
use awc::http::Uri;
use awc::middleware::Transform;
use awc::{ConnectRequest, ConnectResponse};

/// Whether `req` goes to the origin of `endpoint`: the same scheme, host
/// (ASCII case-insensitively) and port (the scheme's default when none is
/// written). A request without a scheme or host is another origin.
pub(crate) fn same_origin(endpoint: &Uri, req: &Uri) -> bool {
    let port = |u: &Uri| {
        u.port_u16().or(match u.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        })
    };
    let (Some(es), Some(rs)) = (endpoint.scheme_str(), req.scheme_str()) else {
        return false;
    };
    let (Some(eh), Some(rh)) = (endpoint.host(), req.host()) else {
        return false;
    };
    es.eq_ignore_ascii_case(rs) && eh.eq_ignore_ascii_case(rh) && port(endpoint) == port(req)
}

/// An awc middleware adding the endpoint's headers to requests to its
/// origin only (see the module docs).
#[derive(Clone)]
pub(crate) struct ScopedHeaders {
    origin: Rc<Uri>,
    headers: Rc<Vec<(HeaderName, HeaderValue)>>,
}

impl ScopedHeaders {
    /// The headers for requests to `address`'s origin. An address that is
    /// not a URL (config validation makes that impossible) matches nothing.
    pub(crate) fn new(address: &str, headers: Vec<(HeaderName, HeaderValue)>) -> ScopedHeaders {
        ScopedHeaders {
            origin: Rc::new(address.parse().unwrap_or_default()),
            headers: Rc::new(headers),
        }
    }

    /// Adds the headers `map` does not hold yet.
    fn fill(&self, map: &mut HeaderMap) {
        for (k, v) in self.headers.iter() {
            if !map.contains_key(k) {
                map.insert(k.clone(), v.clone());
            }
        }
    }

    /// `req` with the headers added when it goes to the endpoint's origin.
    fn scope(&self, req: ConnectRequest) -> ConnectRequest {
        use actix_http::RequestHeadType::{Owned, Rc as Shared};
        match req {
            ConnectRequest::Client(mut head, body, addr) => {
                let uri = match &head {
                    Owned(h) => &h.uri,
                    Shared(h, _) => &h.uri,
                };
                if same_origin(&self.origin, uri) {
                    match &mut head {
                        Owned(h) => self.fill(&mut h.headers),
                        Shared(h, extra) => {
                            // The shared head stays as it is; the headers
                            // it lacks go in the extra map.
                            let mut map = extra.take().unwrap_or_default();
                            for (k, v) in self.headers.iter() {
                                if !h.headers.contains_key(k) && !map.contains_key(k) {
                                    map.insert(k.clone(), v.clone());
                                }
                            }
                            *extra = Some(map);
                        }
                    }
                }
                ConnectRequest::Client(head, body, addr)
            }
            ConnectRequest::Tunnel(mut head, addr) => {
                if same_origin(&self.origin, &head.uri) {
                    self.fill(&mut head.headers);
                }
                ConnectRequest::Tunnel(head, addr)
            }
        }
    }
}

impl<S> Transform<S, ConnectRequest> for ScopedHeaders
where
    S: Service<ConnectRequest, Response = ConnectResponse, Error = SendRequestError>,
{
    type Transform = ScopedHeadersService<S>;

    fn new_transform(self, service: S) -> Self::Transform {
        ScopedHeadersService {
            scope: self,
            service,
        }
    }
}

/// The service [`ScopedHeaders`] wraps around awc's connector.
pub(crate) struct ScopedHeadersService<S> {
    scope: ScopedHeaders,
    service: S,
}

impl<S> Service<ConnectRequest> for ScopedHeadersService<S>
where
    S: Service<ConnectRequest, Response = ConnectResponse, Error = SendRequestError>,
{
    type Response = ConnectResponse;
    type Error = SendRequestError;
    type Future = S::Future;

    actix_service::forward_ready!(service);

    fn call(&self, req: ConnectRequest) -> Self::Future {
        self.service.call(self.scope.scope(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn only_the_endpoints_origin_is_the_same() {
        let e = uri("http://10.0.0.7:8080/v1/");
        for same in [
            "http://10.0.0.7:8080/v1/x",
            "http://10.0.0.7:8080/other",
            "HTTP://10.0.0.7:8080/",
        ] {
            assert!(same_origin(&e, &uri(same)), "{same}");
        }
        for other in [
            "http://10.0.0.8:8080/v1/x",
            "http://10.0.0.7:8081/v1/x",
            "https://10.0.0.7:8080/v1/x",
            "http://10.0.0.7/v1/x",
            "http://evil.example/v1/",
            "/v1/x",
        ] {
            assert!(!same_origin(&e, &uri(other)), "{other}");
        }
        let e = uri("https://API.example/");
        assert!(same_origin(&e, &uri("https://api.example:443/a")));
        assert!(!same_origin(&e, &uri("http://api.example:443/a")));
        assert!(!same_origin(&e, &uri("https://api.example.evil/")));
        let e = uri("http://[::1]/");
        assert!(same_origin(&e, &uri("http://[::1]:80/")));
    }

    /// Through a real awc client built with the middleware: the endpoint
    /// gets the header, another origin does not, and a header the request
    /// sets itself is kept.
    #[actix_rt::test]
    async fn the_headers_reach_the_endpoint_only() {
        use std::sync::{Arc, Mutex};
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut ports = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..2 {
            let seen = seen.clone();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let srv = actix_web::HttpServer::new(move || {
                let seen = seen.clone();
                actix_web::App::new().default_service(actix_web::web::to(
                    move |req: actix_web::HttpRequest| {
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_owned();
                        let port = req.app_config().local_addr().port();
                        seen.lock().unwrap().push(format!("{port}:{auth}"));
                        async { "ok" }
                    },
                ))
            })
            .workers(1)
            .disable_signals()
            .listen(listener)
            .unwrap()
            .run();
            handles.push(srv.handle());
            actix_rt::spawn(srv);
        }
        let (ep, other) = (ports[0], ports[1]);
        let scope = ScopedHeaders::new(
            &format!("http://127.0.0.1:{ep}/v1/"),
            vec![(
                HeaderName::from_static("authorization"),
                HeaderValue::from_static("Bearer s3cret"),
            )],
        );
        let client = awc::Client::builder()
            .disable_redirects()
            .wrap(scope)
            .finish();
        for url in [
            format!("http://127.0.0.1:{ep}/v1/a"),
            format!("http://127.0.0.1:{other}/steal"),
        ] {
            let res = client.get(url).send().await.unwrap();
            assert_eq!(res.status(), 200);
        }
        let res = client
            .get(format!("http://127.0.0.1:{ep}/v1/b"))
            .insert_header(("authorization", "Basic mine"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                format!("{ep}:Bearer s3cret"),
                format!("{other}:none"),
                format!("{ep}:Basic mine"),
            ]
        );
        for h in handles {
            h.stop(false).await;
        }
    }
}
