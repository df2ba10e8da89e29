//! Modelled backends: `k` workers each with a FIFO queue inside, a
//! service-time distribution, a capacity that changes at chosen times,
//! errors and hangs. Served to the engine as its [`Transport`].
//!
//! A request's service time is its task's own (common random numbers): it
//! is drawn from the run's seed, the request's path and how many times that
//! path was sent before, not from the order the backend sees requests in.
//! The oracle draws the same time for the same task, so the engine and the
//! oracle are compared on the same work, not on different luck (a
//! heavy-tailed service's few long draws would otherwise land in different
//! bursts of the two runs).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use futures::future::LocalBoxFuture;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;

/// A service-time distribution (means in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceTime {
    /// Always `ms`.
    Fixed(f64),
    /// Exponential around a mean of `ms`.
    Exp(f64),
    /// `fast` ms, or `slow` ms with probability `p_slow`.
    Bimodal { fast: f64, slow: f64, p_slow: f64 },
    /// Pareto (shape `alpha` > 1) with mean `ms`, capped at 50 × the mean.
    Pareto { mean: f64, alpha: f64 },
}

impl ServiceTime {
    /// The mean in seconds (the Pareto's as capped, near enough).
    pub fn mean_secs(&self) -> f64 {
        let ms = match *self {
            ServiceTime::Fixed(ms) | ServiceTime::Exp(ms) => ms,
            ServiceTime::Bimodal { fast, slow, p_slow } => fast * (1.0 - p_slow) + slow * p_slow,
            ServiceTime::Pareto { mean, .. } => mean,
        };
        ms / 1000.0
    }

    /// The 99th percentile of one service, in ms (of 100 000 seeded draws,
    /// in whole milliseconds as served).
    pub fn p99_ms(&self) -> f64 {
        let mut rng = SmallRng::seed_from_u64(99);
        let mut v: Vec<Duration> = (0..100_000).map(|_| self.draw(&mut rng)).collect();
        v.sort();
        v[99_000].as_secs_f64() * 1000.0
    }

    /// The service time of the `n`th send (from 0) of the request for
    /// `path` in a run seeded `seed`.
    pub fn of_task(&self, seed: u64, path: &str, n: u32) -> Duration {
        // FNV-1a: stable across Rust releases, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in path.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let key = seed ^ h ^ u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.draw(&mut SmallRng::seed_from_u64(key))
    }

    /// One draw.
    pub fn draw(&self, rng: &mut SmallRng) -> Duration {
        let ms = match *self {
            ServiceTime::Fixed(ms) => ms,
            ServiceTime::Exp(ms) => -ms * (1.0 - rng.random::<f64>()).ln(),
            ServiceTime::Bimodal { fast, slow, p_slow } => {
                if rng.random::<f64>() < p_slow {
                    slow
                } else {
                    fast
                }
            }
            ServiceTime::Pareto { mean, alpha } => {
                let xm = mean * (alpha - 1.0) / alpha;
                let u = 1.0 - rng.random::<f64>();
                (xm / u.powf(1.0 / alpha)).min(mean * 50.0)
            }
        };
        // Whole milliseconds: tokio's timers fire on millisecond ticks, so
        // a fraction would lengthen every service in the engine's run and
        // not in the oracle's.
        Duration::from_millis(ms.round().max(1.0) as u64)
    }
}

/// One modelled backend.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Workers at the start.
    pub workers: u32,
    /// Service time of one request.
    pub service: ServiceTime,
    /// `(at, workers)`: the worker count from `at` on (since the run's start).
    pub changes: Vec<(Duration, u32)>,
    /// Share of requests answered 500 (after their service time).
    pub error_rate: f64,
    /// Share of requests that hang (never answered).
    pub hang_rate: f64,
}

impl BackendSpec {
    /// `workers` workers of `service`, no change, no error.
    pub fn new(workers: u32, service: ServiceTime) -> Self {
        BackendSpec {
            workers,
            service,
            changes: Vec::new(),
            error_rate: 0.0,
            hang_rate: 0.0,
        }
    }

    /// Workers in service at `t` since the start.
    pub fn workers_at(&self, t: Duration) -> u32 {
        self.changes
            .iter()
            .rfind(|(at, _)| *at <= t)
            .map_or(self.workers, |(_, w)| *w)
    }

    /// Requests per second at `t`.
    pub fn capacity_at(&self, t: Duration) -> f64 {
        f64::from(self.workers_at(t)) / self.service.mean_secs()
    }
}

/// What a backend saw, for checks.
#[derive(Debug, Default, Clone)]
pub struct BackendCounts {
    pub received: u64,
    pub answered: u64,
    /// Most requests inside at once (in service or in its queue).
    pub peak_inside: u64,
    inside: u64,
}

struct Model {
    spec: BackendSpec,
    workers: Arc<Semaphore>,
    rng: RefCell<SmallRng>,
    counts: Rc<RefCell<BackendCounts>>,
    seed: u64,
    /// Sends so far of each path, over all backends.
    sends: Rc<RefCell<HashMap<String, u32>>>,
}

/// The backends of one run, addressed `http://127.0.0.1:{20000 + i}/` (never
/// connected to: the transport serves them in process).
pub struct Backends {
    models: Vec<Rc<Model>>,
}

thread_local! {
    /// The current run's backends: the factory must be `Send`, the models
    /// are not; the simulation runs on one thread.
    static CURRENT: RefCell<Option<Rc<Backends>>> = const { RefCell::new(None) };
}

impl Backends {
    /// The models for `specs`, their randomness from `seed`. Starts the
    /// capacity changes (each a timer on the current runtime's clock).
    pub fn start(specs: &[BackendSpec], seed: u64) -> Rc<Backends> {
        let sends = Rc::new(RefCell::new(HashMap::new()));
        let models = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Rc::new(Model {
                    spec: s.clone(),
                    workers: Arc::new(Semaphore::new(s.workers as usize)),
                    rng: RefCell::new(SmallRng::seed_from_u64(seed ^ (0x9E37 * (i as u64 + 1)))),
                    counts: Rc::default(),
                    seed,
                    sends: sends.clone(),
                })
            })
            .collect::<Vec<_>>();
        let t0 = tokio::time::Instant::now();
        for m in &models {
            let mut now_workers = m.spec.workers;
            for &(at, w) in &m.spec.changes {
                let sem = m.workers.clone();
                let from = now_workers;
                now_workers = w;
                actix_rt::spawn(async move {
                    tokio::time::sleep_until(t0 + at).await;
                    if w > from {
                        sem.add_permits((w - from) as usize);
                    } else if let Ok(p) = sem.acquire_many(from - w).await {
                        // Workers leave as they finish what they serve.
                        p.forget();
                    }
                });
            }
        }
        let b = Rc::new(Backends { models });
        CURRENT.with(|c| *c.borrow_mut() = Some(b.clone()));
        b
    }

    /// The endpoint address of backend `i`.
    pub fn address(i: usize) -> String {
        format!("http://127.0.0.1:{}/", 20000 + i)
    }

    /// The path of a request to one of the addresses, without its leading
    /// slashes (`task/7` for `http://127.0.0.1:20000/task/7`).
    pub fn path_of(url: &str) -> &str {
        let rest = url.strip_prefix("http://").unwrap_or(url);
        rest.find('/')
            .map_or("", |i| &rest[i..])
            .trim_start_matches('/')
    }

    /// What backend `i` saw.
    pub fn counts(&self, i: usize) -> BackendCounts {
        self.models[i].counts.borrow().clone()
    }

    /// The engine's transport factory for the current run's backends.
    pub fn factory() -> TransportFactory {
        Arc::new(|address: &str| {
            let port: usize = address
                .trim_end_matches('/')
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("a simulated address");
            let model = CURRENT.with(|c| {
                c.borrow()
                    .as_ref()
                    .expect("Backends::start before the dispatcher")
                    .models[port - 20000]
                    .clone()
            });
            Rc::new(SimTransport { model }) as Rc<dyn Transport>
        })
    }
}

struct SimTransport {
    model: Rc<Model>,
}

/// Keeps the count of requests inside a backend.
struct Inside(Rc<RefCell<BackendCounts>>);

impl Inside {
    fn enter(c: &Rc<RefCell<BackendCounts>>) -> Inside {
        let mut b = c.borrow_mut();
        b.received += 1;
        b.inside += 1;
        b.peak_inside = b.peak_inside.max(b.inside);
        Inside(c.clone())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.borrow_mut().inside -= 1;
    }
}

impl Transport for SimTransport {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let m = self.model.clone();
        let (service, status, hang) = {
            let path = Backends::path_of(&req.url);
            let n = {
                let mut sends = m.sends.borrow_mut();
                let n = sends.entry(path.to_string()).or_insert(0);
                *n += 1;
                *n - 1
            };
            let service = m.spec.service.of_task(m.seed, path, n);
            let mut rng = m.rng.borrow_mut();
            let hang = m.spec.hang_rate > 0.0 && rng.random::<f64>() < m.spec.hang_rate;
            let error = m.spec.error_rate > 0.0 && rng.random::<f64>() < m.spec.error_rate;
            (service, if error { 500 } else { 200 }, hang)
        };
        let inside = Inside::enter(&m.counts);
        // The backend works on a request to its end even when the engine
        // stops waiting (an attempt cut by its deadline still holds a worker).
        let job = actix_rt::spawn(async move {
            let _inside = inside;
            let _worker = m.workers.clone().acquire_owned().await.ok();
            if hang {
                std::future::pending::<()>().await;
            }
            // tokio's timer wheel rounds a sleep up to the next millisecond
            // tick, and on the paused clock `now` sits on a tick: a sleep of
            // `d` ends `d + 1 ms` later. One tick less ends at `d` exactly
            // (service times are whole milliseconds, at least one).
            tokio::time::sleep(service.saturating_sub(Duration::from_millis(1))).await;
            m.counts.borrow_mut().answered += 1;
            status
        });
        Box::pin(async move {
            let status = job.await.map_err(|e| {
                TransportError::new(actix_dispatch::ErrorKind::Reset, e.to_string())
            })?;
            Ok(HttpReply::new(status))
        })
    }
}
