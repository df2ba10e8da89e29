//! Shared support for the integration tests: a real HTTP backend with knobs.
//!
//! [`Backend`] is an actix-web server on `127.0.0.1` with an ephemeral port. It
//! runs on its own OS thread with its own `actix_rt::System`, so it never shares
//! the test's event loop, and its behaviour can be changed at any time from the
//! test thread (latency, injected failures, health) while it counts what it
//! received (hits, concurrency, errors, arrival times).
//!
//! Routes (any method):
//!
//! - `/health`: `200 ok`, or `503` after `set_healthy(false)`. Counted in
//!   `health_hits` only; no latency and no injected failures.
//! - `/status/{code}`: answers `code` (200..=599).
//! - `/retry-after/{secs}`: `429` with `Retry-After: {secs}`.
//! - `/echo`: `200` with the request body and `content-type` echoed back.
//! - `/sleep/{ms}`: sleeps `ms` (on top of the latency knob), then `200`.
//! - `/large/{bytes}`: `200` with a body of `bytes` bytes (at most 64 MiB).
//! - `/broken/{bytes}`: `200`, a chunked body of `bytes` bytes, then the
//!   connection breaks (a reset mid-body).
//! - `/sse/{count}/{ms}`: `200 text/event-stream`, `count` server-sent
//!   events (`id: i`, `data: event i`) `ms` apart, the first at once;
//!   `sse_sent` counts the events handed to the server so far.
//!   `/sse/{count}/{ms}/cut/{k}`: the same, but the connection breaks
//!   after `k` events.
//! - anything else: `200` with
//!   `{"backend":"NAME","port":PORT,"path":"/p","method":"GET","n":N}`.
//!
//! Every response carries `x-backend: NAME`. All routes but `/health` are
//! counted, wait for the latency knob, and are subject to `set_status` and
//! `fail_every` (which answer the body `injected failure`).

#![allow(dead_code)]
// The backends measure wall time on their own threads, outside the engine.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

pub mod capacity;
pub mod cfg;
pub mod echo;
pub mod logs;
pub mod open_loop;
#[cfg(feature = "tls")]
pub mod pki;
pub mod wait;

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{middleware, web, App, HttpRequest, HttpResponse, HttpServer};

/// How long the test thread waits for a server thread to start or to stop.
const THREAD_WAIT: Duration = Duration::from_secs(10);
/// How long `stop` waits for the port to refuse connections.
const PORT_CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long `restart` retries binding the same port.
const REBIND_WAIT: Duration = Duration::from_secs(2);
/// Largest `/echo` body accepted.
const ECHO_LIMIT: usize = 64 * 1024 * 1024;

/// Initialise `env_logger` once for tests (`RUST_LOG` controls it).
pub fn init_logs() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// Starts `n` backends named `"b0"` .. `"b{n-1}"`.
pub fn backends(n: usize) -> Vec<Backend> {
    (0..n).map(|i| Backend::named(&format!("b{i}"))).collect()
}

/// Locks a mutex, ignoring poisoning (a panicking test must not cascade).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The name and port, fixed by the first bind.
struct Identity {
    name: String,
    port: u16,
}

/// State shared between the test thread and the server thread.
struct Knobs {
    /// The name given to `Backend::named`, if any.
    preset_name: Option<String>,
    identity: OnceLock<Identity>,

    // knobs
    latency_us: AtomicU64,
    fail_every: AtomicU32,
    fail_status: AtomicU16,
    /// 0 means "no forced status".
    forced_status: AtomicU16,
    healthy: AtomicBool,
    /// The server's idle keep-alive in µs, fixed at start (0: actix-web's
    /// default of 5 s).
    keep_alive_us: AtomicU64,

    // counters
    hits: AtomicU64,
    health_hits: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
    errors_sent: AtomicU64,
    /// Shared with the streams of `/sse/...` answers.
    sse_sent: Arc<AtomicU64>,
    hit_times: Mutex<Vec<Instant>>,
}

impl Knobs {
    fn new(preset_name: Option<String>) -> Knobs {
        Knobs {
            preset_name,
            identity: OnceLock::new(),
            latency_us: AtomicU64::new(0),
            fail_every: AtomicU32::new(0),
            fail_status: AtomicU16::new(500),
            forced_status: AtomicU16::new(0),
            healthy: AtomicBool::new(true),
            keep_alive_us: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            health_hits: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            errors_sent: AtomicU64::new(0),
            sse_sent: Arc::new(AtomicU64::new(0)),
            hit_times: Mutex::new(Vec::new()),
        }
    }

    /// Fixes the name and port at the first bind; later binds keep them.
    fn identify(&self, port: u16) -> &Identity {
        self.identity.get_or_init(|| Identity {
            name: self
                .preset_name
                .clone()
                .unwrap_or_else(|| format!("b{port}")),
            port,
        })
    }

    fn name(&self) -> String {
        match self.identity.get() {
            Some(id) => id.name.clone(),
            None => self.preset_name.clone().unwrap_or_default(),
        }
    }

    fn port(&self) -> u16 {
        self.identity.get().map_or(0, |id| id.port)
    }

    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::SeqCst))
    }

    /// The injected status for the `n`-th counted request, if any.
    fn injected_status(&self, n: u64) -> Option<u16> {
        match self.forced_status.load(Ordering::SeqCst) {
            0 => {}
            status => return Some(status),
        }
        // `checked_rem` is `None` for `every == 0` (off).
        let every = u64::from(self.fail_every.load(Ordering::SeqCst));
        if n.checked_rem(every) == Some(0) {
            return Some(self.fail_status.load(Ordering::SeqCst));
        }
        None
    }
}

/// Counts a request as in flight for as long as it lives (so a cancelled
/// handler leaves the gauge too).
struct InFlight<'a>(&'a Knobs);

impl<'a> InFlight<'a> {
    fn enter(knobs: &'a Knobs) -> InFlight<'a> {
        let now = knobs.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        knobs.peak.fetch_max(now, Ordering::SeqCst);
        InFlight(knobs)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running server: the signal that stops it and the thread it runs on.
struct Running {
    stop_tx: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

/// A real HTTP backend on `127.0.0.1`, with its own thread and actix system.
///
/// All methods take `&self`, so one `Backend` can be shared by reference
/// across a test. Dropping it stops the server (with a bounded wait).
pub struct Backend {
    port: u16,
    knobs: Arc<Knobs>,
    server: Mutex<Option<Running>>,
}

impl Backend {
    /// Starts a new backend on an ephemeral port, named `"b{port}"`.
    pub fn start() -> Backend {
        Backend::launch(None)
    }

    /// Starts a new backend on an ephemeral port with the given name.
    pub fn named(name: &str) -> Backend {
        Backend::launch(Some(name.to_owned()))
    }

    /// Starts a backend that closes connections idle for `keep_alive`
    /// (actix-web's `HttpServer::keep_alive`; kept across restarts).
    pub fn with_keep_alive(name: &str, keep_alive: Duration) -> Backend {
        let knobs = Knobs::new(Some(name.to_owned()));
        let us = u64::try_from(keep_alive.as_micros()).unwrap_or(u64::MAX);
        knobs.keep_alive_us.store(us.max(1), Ordering::SeqCst);
        Backend::launch_with(knobs)
    }

    fn launch(name: Option<String>) -> Backend {
        Backend::launch_with(Knobs::new(name))
    }

    fn launch_with(knobs: Knobs) -> Backend {
        let knobs = Arc::new(knobs);
        let running = spawn_server(Arc::clone(&knobs), 0)
            .unwrap_or_else(|e| panic!("test backend: cannot start: {e}"));
        let port = knobs.port();
        log::debug!("test backend {} listening on port {port}", knobs.name());
        Backend {
            port,
            knobs,
            server: Mutex::new(Some(running)),
        }
    }

    /// `"http://127.0.0.1:PORT/"`, with a trailing slash.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The name echoed in `x-backend` and in the default JSON body.
    pub fn name(&self) -> String {
        self.knobs.name()
    }

    // ---- knobs ----

    /// Every counted request sleeps `d` (asynchronously) before answering.
    pub fn set_latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.knobs.latency_us.store(us, Ordering::SeqCst);
    }

    /// Every `n`-th counted request (by `hits`, 1-based: n, 2n, ...) answers
    /// `status`. `n = 0` turns it off.
    pub fn fail_every(&self, n: u32, status: u16) {
        check_status(status);
        self.knobs.fail_status.store(status, Ordering::SeqCst);
        self.knobs.fail_every.store(n, Ordering::SeqCst);
    }

    /// `Some(code)`: every counted request answers `code`; `None`: normal.
    pub fn set_status(&self, status: Option<u16>) {
        if let Some(status) = status {
            check_status(status);
        }
        self.knobs
            .forced_status
            .store(status.unwrap_or(0), Ordering::SeqCst);
    }

    /// `/health` answers 200 when healthy (the default), 503 otherwise.
    pub fn set_healthy(&self, ok: bool) {
        self.knobs.healthy.store(ok, Ordering::SeqCst);
    }

    // ---- counters ----

    /// Requests received on every route but `/health`.
    pub fn hits(&self) -> u64 {
        self.knobs.hits.load(Ordering::SeqCst)
    }

    /// Requests received on `/health`.
    pub fn health_hits(&self) -> u64 {
        self.knobs.health_hits.load(Ordering::SeqCst)
    }

    /// Counted requests currently being handled.
    pub fn in_flight(&self) -> u64 {
        self.knobs.in_flight.load(Ordering::SeqCst)
    }

    /// Largest `in_flight` seen since the start or the last reset.
    pub fn peak_concurrent(&self) -> u64 {
        self.knobs.peak.load(Ordering::SeqCst)
    }

    /// Responses with status >= 400 sent by counted routes (not `/health`).
    pub fn errors_sent(&self) -> u64 {
        self.knobs.errors_sent.load(Ordering::SeqCst)
    }

    /// Server-sent events handed to the server so far (`/sse/...`).
    pub fn sse_sent(&self) -> u64 {
        self.knobs.sse_sent.load(Ordering::SeqCst)
    }

    /// Arrival time of every counted request since the start or last reset.
    pub fn hit_times(&self) -> Vec<Instant> {
        lock(&self.knobs.hit_times).clone()
    }

    /// Zeroes the counters (the peak restarts from the current `in_flight`).
    /// Knobs are left as they are.
    pub fn reset_counters(&self) {
        let k = &self.knobs;
        k.hits.store(0, Ordering::SeqCst);
        k.health_hits.store(0, Ordering::SeqCst);
        k.errors_sent.store(0, Ordering::SeqCst);
        k.peak
            .store(k.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
        lock(&k.hit_times).clear();
    }

    // ---- lifecycle ----

    /// Stops the server (not gracefully: in-flight requests may be dropped)
    /// and waits until the port refuses connections. A no-op when stopped.
    ///
    /// This blocks the calling thread. An awc client on the test's event loop
    /// only notices that its pooled keep-alive connections were closed once
    /// its reactor runs: a request sent right after `stop`/`restart`, with no
    /// `.await` that yields in between, may reuse a dead connection and fail
    /// with `Connect(Disconnected)`. Sleep a few ms first if that matters.
    ///
    /// # Panics
    ///
    /// If the port still accepts connections after ~2 s.
    pub fn stop(&self) {
        let mut server = lock(&self.server);
        if let Some(running) = server.take() {
            if let Err(e) = self.shut_down(running) {
                panic!("test backend {}: {e}", self.name());
            }
        }
    }

    /// Starts the server again on the same port, keeping knobs and counters
    /// (stops it first if it is running). Retries the bind for ~2 s. Returns
    /// once the port accepts connections. See `stop` about pooled
    /// connections of clients.
    ///
    /// # Panics
    ///
    /// If the port cannot be bound again within that time.
    pub fn restart(&self) {
        let mut server = lock(&self.server);
        if let Some(running) = server.take() {
            if let Err(e) = self.shut_down(running) {
                log::warn!("test backend {}: {e}", self.name());
            }
        }
        let deadline = Instant::now() + REBIND_WAIT;
        loop {
            match spawn_server(Arc::clone(&self.knobs), self.port) {
                Ok(running) => {
                    *server = Some(running);
                    log::debug!("test backend {} restarted on {}", self.name(), self.port);
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    log::debug!(
                        "test backend {}: rebind failed ({e}); retrying",
                        self.name()
                    );
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!(
                    "test backend {}: cannot bind port {} again: {e}",
                    self.name(),
                    self.port
                ),
            }
        }
    }

    /// Whether the server is started and its thread still alive.
    pub fn is_running(&self) -> bool {
        lock(&self.server)
            .as_ref()
            .is_some_and(|running| !running.thread.is_finished())
    }

    /// Signals the server thread to stop, waits (bounded) for it to end and
    /// for the port to refuse connections.
    fn shut_down(&self, running: Running) -> Result<(), String> {
        let Running { stop_tx, thread } = running;
        // An error only means the thread already ended.
        let _ = stop_tx.send(());
        let deadline = Instant::now() + THREAD_WAIT;
        while !thread.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            if thread.join().is_err() {
                log::warn!("test backend {}: server thread panicked", self.name());
            }
        } else {
            // Detach it rather than hang the test.
            log::warn!(
                "test backend {}: server thread still running after {THREAD_WAIT:?}",
                self.name()
            );
        }
        wait_port_closed(self.port)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let running = lock(&self.server).take();
        if let Some(running) = running {
            if let Err(e) = self.shut_down(running) {
                log::warn!("test backend {}: {e}", self.name());
            }
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

fn check_status(status: u16) {
    assert!(
        (200..=599).contains(&status),
        "test backend: status {status} is not in 200..=599"
    );
}

/// Waits until nothing accepts connections on `port` any more.
fn wait_port_closed(port: u16) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + PORT_CLOSE_WAIT;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            Err(_) => return Ok(()),
            Ok(_) if Instant::now() >= deadline => {
                return Err(format!(
                    "port {port} still accepts connections {PORT_CLOSE_WAIT:?} after stop"
                ))
            }
            Ok(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Starts a server thread bound to `127.0.0.1:port` (0: ephemeral). Returns
/// once the port is listening.
fn spawn_server(knobs: Arc<Knobs>, port: u16) -> std::io::Result<Running> {
    let (ready_tx, ready_rx) = mpsc::channel::<std::io::Result<()>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = thread::Builder::new()
        .name(format!("test-backend-{port}"))
        .spawn(move || serve(knobs, port, ready_tx, stop_rx))?;
    match ready_rx.recv_timeout(THREAD_WAIT) {
        Ok(Ok(())) => Ok(Running { stop_tx, thread }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(std::io::Error::other(
            "server thread did not report that it was listening",
        )),
    }
}

/// The body of a server thread.
fn serve(
    knobs: Arc<Knobs>,
    port: u16,
    ready_tx: mpsc::Sender<std::io::Result<()>>,
    stop_rx: tokio::sync::oneshot::Receiver<()>,
) {
    let system = actix_rt::System::new();
    system.block_on(async move {
        let app_knobs = Arc::clone(&knobs);
        let keep_alive = match knobs.keep_alive_us.load(Ordering::SeqCst) {
            0 => actix_web::http::KeepAlive::Timeout(Duration::from_secs(5)),
            us => actix_web::http::KeepAlive::Timeout(Duration::from_micros(us)),
        };
        let bound = HttpServer::new(move || {
            let name = app_knobs.name();
            App::new()
                .app_data(web::Data::from(Arc::clone(&app_knobs)))
                .wrap(middleware::DefaultHeaders::new().add(("x-backend", name)))
                .default_service(web::to(handle))
        })
        .workers(1)
        .keep_alive(keep_alive)
        .disable_signals()
        .shutdown_timeout(0)
        .backlog(1024)
        .max_connections(25_000)
        .bind(("127.0.0.1", port));
        let bound = match bound {
            Ok(bound) => bound,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let actual = bound.addrs().first().map_or(port, SocketAddr::port);
        // Before `run`: the app factory (run by the worker) reads the name.
        knobs.identify(actual);

        let server = bound.run();
        let server_handle = server.handle();
        let task = actix_rt::spawn(server);
        let _ = ready_tx.send(Ok(()));

        // A dropped sender (Backend gone) stops the server too.
        let _ = stop_rx.await;
        server_handle.stop(false).await;
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::warn!("test backend on port {actual}: {e}"),
            Err(e) => log::warn!("test backend on port {actual}: {e}"),
        }
    });
}

/// The one handler behind every route.
async fn handle(req: HttpRequest, payload: web::Payload, knobs: web::Data<Knobs>) -> HttpResponse {
    if req.path() == "/health" {
        knobs.health_hits.fetch_add(1, Ordering::SeqCst);
        return if knobs.healthy.load(Ordering::SeqCst) {
            text(StatusCode::OK, "ok")
        } else {
            text(StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
        };
    }

    let n = knobs.hits.fetch_add(1, Ordering::SeqCst) + 1;
    lock(&knobs.hit_times).push(Instant::now());
    let _in_flight = InFlight::enter(&knobs);

    let latency = knobs.latency();
    if !latency.is_zero() {
        actix_rt::time::sleep(latency).await;
    }

    let response = match knobs.injected_status(n) {
        Some(status) => text(status_code(status), "injected failure"),
        None => route(&req, payload, &knobs, n).await,
    };
    if response.status().as_u16() >= 400 {
        knobs.errors_sent.fetch_add(1, Ordering::SeqCst);
    }
    response
}

/// Answers a counted request that no knob has failed.
async fn route(req: &HttpRequest, payload: web::Payload, knobs: &Knobs, n: u64) -> HttpResponse {
    let path = req.path();

    if let Some(code) = path.strip_prefix("/status/") {
        return match code.parse::<u16>() {
            Ok(code) if (200..=599).contains(&code) => {
                let status = status_code(code);
                if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
                    HttpResponse::build(status).finish()
                } else {
                    text(status, &format!("status {code}"))
                }
            }
            _ => text(StatusCode::BAD_REQUEST, "bad status code"),
        };
    }

    if let Some(secs) = path.strip_prefix("/retry-after/") {
        return match HeaderValue::from_str(secs) {
            Ok(value) if !secs.is_empty() => HttpResponse::TooManyRequests()
                .insert_header((header::RETRY_AFTER, value))
                .content_type("text/plain")
                .body("too many requests"),
            _ => text(StatusCode::BAD_REQUEST, "bad retry-after value"),
        };
    }

    if path == "/echo" {
        return match payload.to_bytes_limited(ECHO_LIMIT).await {
            Ok(Ok(body)) => {
                let mut response = HttpResponse::Ok();
                if let Some(content_type) = req.headers().get(header::CONTENT_TYPE) {
                    response.insert_header((header::CONTENT_TYPE, content_type.clone()));
                }
                response.body(body)
            }
            Ok(Err(_)) => text(StatusCode::BAD_REQUEST, "cannot read body"),
            Err(_) => text(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
        };
    }

    if let Some(ms) = path.strip_prefix("/sleep/") {
        return match ms.parse::<u64>() {
            Ok(ms) => {
                actix_rt::time::sleep(Duration::from_millis(ms)).await;
                text(StatusCode::OK, &format!("slept {ms}ms"))
            }
            Err(_) => text(StatusCode::BAD_REQUEST, "bad sleep duration"),
        };
    }

    if let Some(bytes) = path.strip_prefix("/large/") {
        return match bytes.parse::<usize>() {
            Ok(n) if n <= ECHO_LIMIT => HttpResponse::Ok()
                .content_type("application/octet-stream")
                .body(vec![b'x'; n]),
            _ => text(StatusCode::BAD_REQUEST, "bad size"),
        };
    }

    if let Some(bytes) = path.strip_prefix("/broken/") {
        return match bytes.parse::<usize>() {
            Ok(n) if n <= ECHO_LIMIT => {
                let chunks: Vec<Result<web::Bytes, std::io::Error>> = vec![
                    Ok(web::Bytes::from(vec![b'x'; n])),
                    Err(std::io::Error::other("broken on purpose")),
                ];
                HttpResponse::Ok().streaming(futures::stream::iter(chunks))
            }
            _ => text(StatusCode::BAD_REQUEST, "bad size"),
        };
    }

    if let Some(spec) = path.strip_prefix("/sse/") {
        let parts: Vec<&str> = spec.split('/').collect();
        let num = |i: usize| parts.get(i).and_then(|p| p.parse::<u64>().ok());
        return match (num(0), num(1), parts.get(2), num(3)) {
            (Some(count), Some(ms), None, _) => sse(knobs, count, ms, None),
            (Some(count), Some(ms), Some(&"cut"), Some(k)) => sse(knobs, count, ms, Some(k)),
            _ => text(StatusCode::BAD_REQUEST, "bad sse spec"),
        };
    }

    let body = format!(
        r#"{{"backend":"{}","port":{},"path":"{}","method":"{}","n":{n}}}"#,
        json_escape(&knobs.name()),
        knobs.port(),
        json_escape(path),
        json_escape(req.method().as_str()),
    );
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

/// `count` server-sent events `ms` apart (the first at once), the
/// connection broken after `cut` events if given.
fn sse(knobs: &Knobs, count: u64, ms: u64, cut: Option<u64>) -> HttpResponse {
    let sent = knobs.sse_sent.clone();
    let every = Duration::from_millis(ms);
    let events = futures::stream::unfold(0u64, move |i| {
        let sent = sent.clone();
        async move {
            if i >= count {
                return None;
            }
            if i > 0 {
                actix_rt::time::sleep(every).await;
            }
            if cut == Some(i) {
                let e = std::io::Error::other("stream cut on purpose");
                return Some((Err(e), count));
            }
            sent.fetch_add(1, Ordering::SeqCst);
            let event = format!("id: {i}\ndata: event {i}\n\n");
            Some((Ok::<_, std::io::Error>(web::Bytes::from(event)), i + 1))
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .streaming(events)
}

fn status_code(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn text(status: StatusCode, body: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body.to_owned())
}

/// Escapes a string for a JSON string literal.
fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}
