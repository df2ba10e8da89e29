//! A backend that tells what it received: `200` with one line per request
//! header (`name: value`) and a last line `version: HTTP/2.0` (or 1.1).
//! Plain HTTP/1.1, or (feature `tls`) HTTPS offering h2 and http/1.1 or
//! http/1.1 only, with a certificate from [`super::pki`].
//!
//! It runs on its own thread and `actix_rt::System`, on 127.0.0.1 with an
//! ephemeral port, built from actix-http services (not `HttpServer`, which
//! always offers h2 over TLS), and stops when dropped.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use actix_http::{HttpMessage, HttpService, Request, Response};
use actix_server::ServerHandle;
use actix_service::fn_service;
#[cfg(feature = "tls")]
use actix_service::ServiceFactoryExt;

/// How the echo backend speaks.
#[derive(Clone)]
pub enum Mode {
    /// Plain HTTP/1.1.
    Plain,
    /// HTTPS offering h2 and http/1.1 (ALPN).
    #[cfg(feature = "tls")]
    TlsH2(Arc<rustls::ServerConfig>),
    /// HTTPS offering http/1.1 only.
    #[cfg(feature = "tls")]
    TlsH1(Arc<rustls::ServerConfig>),
    /// Plain HTTP/1.1, and HTTP/2 to a client that starts with its
    /// preface (h2c with prior knowledge).
    #[allow(dead_code)]
    PlainH2c,
}

/// A running echo backend.
pub struct Echo {
    port: u16,
    hits: Arc<AtomicU64>,
    conns: Arc<AtomicU64>,
    handle: ServerHandle,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    /// Starts one in `mode`.
    pub fn start(mode: Mode) -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let hits = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&hits);
        let conns = Arc::new(AtomicU64::new(0));
        let accepted = Arc::clone(&conns);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let handler = move || {
                    let counter = Arc::clone(&counter);
                    fn_service(move |req: Request| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        async move { Ok::<_, Infallible>(echo(&req)) }
                    })
                };
                let builder = actix_server::Server::build()
                    .workers(1)
                    .disable_signals()
                    .shutdown_timeout(1);
                let server = match mode {
                    Mode::Plain => builder.listen("echo", listener, move || {
                        HttpService::build()
                            .on_connect_ext(counting(Arc::clone(&accepted)))
                            .h1(handler())
                            .tcp()
                    }),
                    Mode::PlainH2c => builder.listen("echo", listener, move || {
                        HttpService::build()
                            .on_connect_ext(counting(Arc::clone(&accepted)))
                            .finish(handler())
                            .tcp_auto_h2c()
                    }),
                    #[cfg(feature = "tls")]
                    Mode::TlsH2(cfg) => builder.listen("echo", listener, move || {
                        HttpService::build()
                            .on_connect_ext(counting(Arc::clone(&accepted)))
                            .finish(handler())
                            .rustls_0_23((*cfg).clone())
                            .map_err(|_| ())
                    }),
                    #[cfg(feature = "tls")]
                    Mode::TlsH1(cfg) => builder.listen("echo", listener, move || {
                        let mut cfg = (*cfg).clone();
                        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
                        HttpService::build()
                            .on_connect_ext(counting(Arc::clone(&accepted)))
                            .h1(handler())
                            .rustls_0_23(cfg)
                            .map_err(|_| ())
                    }),
                }
                .expect("listen")
                .run();
                tx.send(server.handle()).expect("report the handle");
                let _ = server.await;
            })
        });
        let handle = rx.recv().expect("echo server started");
        Echo {
            port,
            hits,
            conns,
            handle,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/` (or `https://` for `tls`).
    pub fn url(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Requests answered.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Connections accepted.
    #[allow(dead_code)]
    pub fn connections(&self) -> u64 {
        self.conns.load(Ordering::SeqCst)
    }
}

/// Counts the connections a server accepted, whatever their stream type.
fn counting<T>(accepted: Arc<AtomicU64>) -> impl Fn(&T, &mut actix_http::Extensions) {
    move |_, _| {
        accepted.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let stop = self.handle.stop(false);
        // The server's own System runs the stop; wait for its thread.
        drop(stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn echo(req: &Request) -> Response<String> {
    let mut body = String::new();
    let mut names: Vec<_> = req.headers().iter().collect();
    names.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    for (k, v) in names {
        let _ = writeln!(body, "{}: {}", k, v.to_str().unwrap_or("<bytes>"));
    }
    let _ = write!(body, "version: {:?}", req.version());
    Response::ok().set_body(body)
}
