//! A backend of fixed capacity, as a worker pool is: it serves at most
//! `workers` requests at once, each for a fixed service time, and the rest
//! wait in its own queue (accepted, not yet served). So its capacity is
//! `workers / service` requests per second, and a request sent past that
//! waits longer and longer inside the backend.
//!
//! It runs on its own thread and `actix_rt::System`, on 127.0.0.1 with an
//! ephemeral port, and stops when dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tokio::sync::Semaphore;

struct State {
    workers: Semaphore,
    service: Duration,
    served: AtomicU64,
    busy: AtomicU64,
    peak_busy: AtomicU64,
    /// By the first segment of their path, the requests that found no
    /// worker free and waited inside.
    waited: Mutex<HashMap<String, u64>>,
}

/// A running fixed-capacity backend.
pub struct Capped {
    port: u16,
    state: Arc<State>,
    handle: actix_web::dev::ServerHandle,
    thread: Option<JoinHandle<()>>,
}

impl Capped {
    /// Serves `workers` requests at once, each for `service`.
    pub fn start(workers: usize, service: Duration) -> Capped {
        let state = Arc::new(State {
            workers: Semaphore::new(workers),
            service,
            served: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            peak_busy: AtomicU64::new(0),
            waited: Mutex::new(HashMap::new()),
        });
        let shared = Arc::clone(&state);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let data = web::Data::from(shared);
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .default_service(web::to(serve))
                })
                .workers(1)
                .backlog(1024)
                .max_connections(4096)
                .disable_signals()
                .shutdown_timeout(1)
                .bind(("127.0.0.1", 0))
                .expect("bind 127.0.0.1:0");
                let port = server.addrs()[0].port();
                let server = server.run();
                tx.send((port, server.handle())).expect("report the port");
                let _ = server.await;
            })
        });
        let (port, handle) = rx.recv().expect("capped backend started");
        Capped {
            port,
            state,
            handle,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Requests served to the end.
    pub fn served(&self) -> u64 {
        self.state.served.load(Ordering::SeqCst)
    }

    /// The most requests it ever served at once (at most `workers`).
    pub fn peak_busy(&self) -> u64 {
        self.state.peak_busy.load(Ordering::SeqCst)
    }

    /// Requests whose path starts with `/{first}/` that found no worker
    /// free and waited inside for one.
    pub fn waited(&self, first: &str) -> u64 {
        let waited = self.state.waited.lock().unwrap();
        waited.get(first).copied().unwrap_or(0)
    }
}

async fn serve(req: HttpRequest, state: web::Data<State>) -> HttpResponse {
    let worker = match state.workers.try_acquire() {
        Ok(w) => Ok(w),
        Err(_) => {
            let first = req.path().trim_start_matches('/').split('/').next();
            let key = first.unwrap_or("").to_owned();
            *state.waited.lock().unwrap().entry(key).or_default() += 1;
            state.workers.acquire().await
        }
    };
    let Ok(_worker) = worker else {
        return HttpResponse::ServiceUnavailable().finish();
    };
    let busy = state.busy.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak_busy.fetch_max(busy, Ordering::SeqCst);
    actix_rt::time::sleep(state.service).await;
    state.busy.fetch_sub(1, Ordering::SeqCst);
    state.served.fetch_add(1, Ordering::SeqCst);
    HttpResponse::Ok().body("ok")
}

impl Drop for Capped {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
