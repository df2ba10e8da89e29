//! The [`Dispatcher`] handle: start the pipelines, submit, feed, observe, stop.
//!
//! One pipeline (QueueActor → BalancerActor → NodeActors) per service, all on
//! the arbiter that calls [`Dispatcher::start`]. The handle is `Clone + Send`:
//! it can be shared with actix-web handlers on other workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::Addr;
use futures::{Stream, StreamExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::actors::messages::*;
use crate::actors::pool::{
    AddEndpoint, CrashNode, PoolError, ReloadEndpoints, ReloadSummary, RemoveEndpoint, SetActive,
    SetWeight,
};
use crate::actors::{BalancerActor, QueueActor};
use crate::config::{Config, ConfigError, EndpointConfig, OnFull, ServiceConfig};
use crate::outcome::{Attempt, Outcome, Rejection, TaskResult};
use crate::stats::{ServiceStats, Stats};
use crate::task::{Job, ReplyTx, Task, TaskId};
use crate::transport::{awc_factory, TransportFactory};

pub(crate) struct ServiceHandle {
    pub name: Arc<str>,
    pub cfg: Arc<ServiceConfig>,
    pub queue: Addr<QueueActor>,
    /// Where `submit` puts tasks for the queue (one message per burst).
    pub inbox: crate::actors::queue::InboxSender,
    pub balancer: Addr<BalancerActor>,
    /// Set once a rebuild of this (dead) pipeline is under way.
    pub rebuilding: AtomicBool,
}

impl ServiceHandle {
    /// Whether the pipeline's queue and balancer are both alive.
    fn alive(&self) -> bool {
        self.queue.connected() && self.balancer.connected()
    }
}

struct Inner {
    services: RwLock<HashMap<String, Arc<ServiceHandle>>>,
    order: RwLock<Vec<String>>,
    factory: TransportFactory,
    ids: Arc<AtomicU64>,
    refused: AtomicU64,
    closed: AtomicBool,
    /// Threads that run node actors (see [`DispatcherBuilder::node_threads`]).
    node_threads: std::sync::Mutex<Vec<actix::Arbiter>>,
    /// The arbiter `start` ran on: every pipeline runs there, whoever starts
    /// it (a reload may come from an actix-web worker, which can stop).
    home: actix::dev::ArbiterHandle,
    /// The Prometheus families (zero-sized without the `metrics` feature).
    metrics: crate::metrics::Families,
    /// The Redis connection shared limits and breakers go through.
    #[cfg(feature = "redis")]
    shared: Option<crate::redis::SharedLimits>,
    /// The durable task streams consumed ([`Dispatcher::consume`]).
    #[cfg(feature = "redis")]
    streams: crate::redis::stream::Streams,
}

/// Handle to a running engine. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

/// Options for [`Dispatcher::start`].
pub struct DispatcherBuilder {
    config: Config,
    factory: Option<TransportFactory>,
    node_threads: usize,
    metrics: bool,
}

impl DispatcherBuilder {
    /// Turns the Prometheus series off (feature `metrics`): every update is
    /// a no-op. For benchmarks that measure what metrics cost, in one run.
    #[doc(hidden)]
    pub fn without_metrics(mut self) -> Self {
        self.metrics = false;
        self
    }

    /// Uses `factory` to make each node's transport (default: awc).
    pub fn transport(mut self, factory: TransportFactory) -> Self {
        self.factory = Some(factory);
        self
    }

    /// Runs the node actors (the HTTP attempts: awc, sockets, parsing) on
    /// `n` threads of their own, nodes spread over them round robin, while
    /// the queues and balancers stay on the calling arbiter. Default 0: all
    /// on the calling arbiter. One thread moves the HTTP work off the
    /// caller's core; more rarely helps (see the README's performance notes).
    pub fn node_threads(mut self, n: usize) -> Self {
        self.node_threads = n;
        self
    }

    /// Starts the pipelines on the current arbiter.
    pub fn start(self) -> Result<Dispatcher, StartError> {
        if actix::System::try_current().is_none() {
            return Err(StartError::NoSystem);
        }
        let factory = self
            .factory
            .unwrap_or_else(|| awc_factory(Duration::from_secs(5)));
        #[cfg(feature = "redis")]
        let shared = self
            .config
            .redis
            .as_ref()
            .map(crate::redis::SharedLimits::start)
            .transpose()
            .map_err(|e| ConfigError::Top {
                field: "redis.url".into(),
                message: e.to_string(),
            })?;
        let inner = Arc::new(Inner {
            services: RwLock::new(HashMap::new()),
            order: RwLock::new(Vec::new()),
            factory,
            ids: Arc::new(AtomicU64::new(1)),
            refused: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            node_threads: std::sync::Mutex::new(
                (0..self.node_threads)
                    .map(|_| actix::Arbiter::new())
                    .collect(),
            ),
            home: actix::Arbiter::current(),
            metrics: if self.metrics {
                crate::metrics::Families::default()
            } else {
                crate::metrics::Families::disabled()
            },
            #[cfg(feature = "redis")]
            shared,
            #[cfg(feature = "redis")]
            streams: Default::default(),
        });
        let d = Dispatcher { inner };
        for svc in self.config.services {
            d.start_service(svc);
        }
        log::info!("dispatcher started: {} service(s)", d.service_names().len());
        Ok(d)
    }
}

/// Why [`Dispatcher::start`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// It was called outside a running actix `System` (start one with
    /// `#[actix::main]`, `actix_rt::System::new()` or inside actix-web).
    #[error("Dispatcher::start must be called inside a running actix System")]
    NoSystem,
    /// A part of the configuration that is only checked at start (the Redis
    /// connection, say) is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A task the dispatcher could not finish before shutting down.
#[derive(Debug, Clone)]
pub struct Unfinished {
    /// The task's id.
    pub id: TaskId,
    /// Its service.
    pub service: String,
    /// The task as submitted, to resubmit elsewhere.
    pub task: Task,
    /// Attempts it made.
    pub attempts: Vec<Attempt>,
    /// Whether an attempt was out when the grace period ended.
    pub was_in_flight: bool,
}

/// What [`Dispatcher::shutdown`] did.
#[derive(Debug, Clone)]
pub struct ShutdownReport {
    /// Whether everything finished within the grace period.
    pub drained: bool,
    /// Every task that was not finished (each also answered `ShuttingDown`).
    pub unfinished: Vec<Unfinished>,
    /// Final counters.
    pub stats: Stats,
}

impl Dispatcher {
    /// Starts one pipeline per service with the default (awc) transport.
    /// Must be called inside a running actix `System`.
    pub fn start(config: Config) -> Result<Dispatcher, StartError> {
        Self::builder(config).start()
    }

    /// Starts from options (another transport, for benchmarks).
    pub fn builder(config: Config) -> DispatcherBuilder {
        DispatcherBuilder {
            config,
            factory: None,
            node_threads: 0,
            metrics: true,
        }
    }

    fn start_service(&self, svc: ServiceConfig) {
        let cfg = Arc::new(svc);
        let arbiters = self
            .inner
            .node_threads
            .lock()
            .expect("lock")
            .iter()
            .map(|a| a.handle())
            .collect();
        let (queue, balancer, inbox) = QueueActor::start(
            cfg.clone(),
            self.inner.factory.clone(),
            self.inner.ids.clone(),
            arbiters,
            self.inner.metrics.service(&cfg.name),
        );
        #[cfg(feature = "redis")]
        if let Some(s) = &self.inner.shared {
            balancer.do_send(crate::redis::UseShared(s.clone()));
        }
        let name = cfg.name.clone();
        #[cfg(not(feature = "tls"))]
        for ep in cfg
            .endpoints
            .iter()
            .filter(|e| e.address.starts_with("https:"))
        {
            log::warn!(
                "service {name}: endpoint {}: this build has no TLS (cargo feature `tls`); \
                 attempts to it will fail to connect",
                ep.address
            );
        }
        log::info!(
            "service {name}: started, mode {:?}, {} endpoint(s)",
            cfg.mode,
            cfg.endpoints.len()
        );
        // Keyed lower-cased: names match case-insensitively, as the seed's.
        self.inner.services.write().expect("lock").insert(
            name.to_lowercase(),
            Arc::new(ServiceHandle {
                name: name.as_str().into(),
                cfg,
                queue,
                inbox,
                balancer,
                rebuilding: AtomicBool::new(false),
            }),
        );
        let mut order = self.inner.order.write().expect("lock");
        if !order.contains(&name) {
            order.push(name);
        }
    }

    /// A dead pipeline (its balancer or queue stopped: a bug inside the
    /// engine) is logged at `error`, its tasks are answered `Internal`, and
    /// a new pipeline is started from the service's config on the
    /// dispatcher's arbiter, once. Endpoint changes made at runtime since
    /// the start or the last reload are not carried over.
    fn rebuild(&self, h: &Arc<ServiceHandle>) {
        if h.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!(
            "service {}: its pipeline has stopped (a bug inside the engine); rebuilding it",
            h.name
        );
        h.queue.do_send(PipelineDown(
            "the service's pipeline stopped; it is being rebuilt",
        ));
        let d = self.clone();
        let cfg = (*h.cfg).clone();
        if !self.inner.home.spawn_fn(move || d.start_service(cfg)) {
            log::error!(
                "dispatcher: its arbiter has stopped; service {} not rebuilt",
                h.name
            );
        }
    }

    /// The service named `service`, case-insensitively.
    pub(crate) fn handle(&self, service: &str) -> Option<Arc<ServiceHandle>> {
        let map = self.inner.services.read().expect("lock");
        map.get(service)
            .or_else(|| map.get(&service.to_lowercase()))
            .cloned()
    }

    /// Names of the services, in config order.
    pub fn service_names(&self) -> Vec<String> {
        self.inner.order.read().expect("lock").clone()
    }

    /// The queue of `service`: `Task` messages sent to it are answered with a
    /// `TaskResult` like [`Dispatcher::submit`].
    pub fn queue(&self, service: &str) -> Option<Addr<QueueActor>> {
        self.handle(service).map(|h| h.queue.clone())
    }

    /// Submits one task; the returned future resolves to its result. The
    /// task is checked and handed to its service's queue at once, when
    /// `submit` is called (not when the future is first polled), so the
    /// future only waits for the answer and is small. It never fails:
    /// problems come back as a rejection or failure inside the result.
    pub fn submit(&self, task: Task) -> Submission {
        self.submit_inner(task, false)
    }

    fn submit_inner(&self, task: Task, wait: bool) -> Submission {
        let now = Instant::now();
        let id = self.inner.ids.fetch_add(1, Ordering::Relaxed);
        let Some(h) = self.handle(task.service()) else {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            let id = task.given_id().unwrap_or(id);
            let service: Arc<str> = task.service().into();
            let why = Rejection::UnknownService(task.service().to_owned());
            return Submission::ready(rejected(id, service, why, now));
        };
        if self.inner.closed.load(Ordering::Acquire) {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            let id = task.given_id().unwrap_or(id);
            return Submission::ready(rejected(id, h.name.clone(), Rejection::ShuttingDown, now));
        }
        let job = match task.prepare(id, now) {
            Ok(job) => job,
            Err((id, reason)) => {
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                let why = Rejection::InvalidTask(reason);
                return Submission::ready(rejected(id, h.name.clone(), why, now));
            }
        };
        if !h.alive() {
            self.rebuild(&h);
            let why = Rejection::Internal(
                "the service's pipeline stopped; it is being rebuilt, submit again".into(),
            );
            return Submission::ready(rejected(job.id, h.name.clone(), why, now));
        }
        // One allocation for the task's state and the slot of its result.
        let job = Arc::new(job);
        let submission = Submission::waiting(job.clone(), h.name.clone());
        h.inbox.send(Submit {
            task: ReplyTx::new(job),
            wait: wait || h.cfg.queue.on_full == OnFull::Wait,
        });
        submission
    }

    /// Consumes a (possibly endless) stream of tasks and yields their results
    /// as they finish. Backpressure: it pulls a task only while fewer than
    /// the largest queue capacity are unanswered, and waits for room instead
    /// of taking `QueueFull`, so no queue ever holds more than its capacity.
    pub fn feed<S>(&self, tasks: S) -> impl Stream<Item = TaskResult> + 'static
    where
        S: Stream<Item = Task> + 'static,
    {
        let window = self
            .inner
            .services
            .read()
            .expect("lock")
            .values()
            .map(|h| h.cfg.queue.capacity)
            .max()
            .unwrap_or(1)
            .max(1);
        let d = self.clone();
        tasks
            .map(move |t| d.submit_inner(t, true))
            .buffer_unordered(window)
    }

    /// Registers the `dispatch_*` Prometheus families in the application's
    /// own `registry` (feature `metrics`; see [`crate::metrics`]). The
    /// series are updated in place by the pipelines, never by a message per
    /// task, so a scrape reads atomics and never waits on an actor.
    #[cfg(feature = "metrics")]
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.metrics.register(registry);
    }

    /// Counters of every service and the view of every node.
    pub async fn stats(&self) -> Stats {
        let handles: Vec<Arc<ServiceHandle>> = {
            let map = self.inner.services.read().expect("lock");
            self.service_names()
                .iter()
                .filter_map(|n| map.get(&n.to_lowercase()).cloned())
                .collect()
        };
        let mut services = Vec::with_capacity(handles.len());
        for h in handles {
            let queue = h.queue.send(GetQueueStats).await.unwrap_or_default();
            let nodes = h.balancer.send(GetNodeStats).await.unwrap_or_default();
            services.push(ServiceStats {
                name: h.cfg.name.clone(),
                mode: h.cfg.mode,
                queue,
                nodes,
                #[cfg(feature = "redis")]
                stream: self.inner.streams.stats(&h.cfg.name),
            });
        }
        Stats {
            services,
            refused: self.inner.refused.load(Ordering::Relaxed),
            #[cfg(feature = "redis")]
            shared: self.inner.shared.as_ref().map(|s| s.stats()),
        }
    }

    /// Stops intake, lets queued and in-flight tasks finish for up to
    /// `grace`, then answers every remaining task `ShuttingDown`, stops the
    /// actors and returns the report (which lists those tasks).
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.inner.closed.store(true, Ordering::Release);
        let handles: Vec<Arc<ServiceHandle>> = self
            .inner
            .services
            .read()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        let mut drains = Vec::new();
        for h in &handles {
            h.queue.do_send(CloseIntake);
            let (tx, rx) = oneshot::channel();
            h.queue.do_send(Drain { reply: tx });
            drains.push(rx);
        }
        let drained = tokio::time::timeout(grace, futures::future::join_all(drains))
            .await
            .is_ok();
        let mut unfinished = Vec::new();
        for h in &handles {
            if let Ok(left) = h.queue.send(Abort).await {
                unfinished.extend(left);
            }
        }
        // Every task answered: the stream's result writes finish.
        #[cfg(feature = "redis")]
        self.inner.streams.settle().await;
        let stats = self.stats().await;
        for h in &handles {
            h.queue.do_send(Stop);
        }
        for a in self.inner.node_threads.lock().expect("lock").drain(..) {
            a.stop();
        }
        let done: u64 = stats
            .services
            .iter()
            .map(|s| s.queue.succeeded + s.queue.failed)
            .sum();
        let submitted: u64 = stats.services.iter().map(|s| s.queue.submitted).sum();
        log::info!(
            "dispatcher shut down: {} submitted, {} finished, {} unfinished{}",
            submitted,
            done,
            unfinished.len(),
            if drained {
                ""
            } else {
                " (grace period ran out)"
            }
        );
        ShutdownReport {
            drained,
            unfinished,
            stats,
        }
    }
}

// === durable task stream (feature redis) ===

#[cfg(feature = "redis")]
impl Dispatcher {
    /// Consumes the durable task streams of the services (every one, or
    /// `cfg.services`) through the config's `redis` section, with
    /// at-least-once calls to backends and exactly one recorded result per
    /// task (see [`crate::redis::stream`]). Runs on the calling arbiter
    /// until [`Dispatcher::shutdown`], which leaves unfinished entries
    /// pending for other instances to claim.
    pub async fn consume(
        &self,
        cfg: crate::redis::stream::StreamConfig,
    ) -> Result<(), crate::redis::stream::StreamError> {
        use crate::redis::stream::{start, StreamError};
        let redis = self
            .inner
            .shared
            .as_ref()
            .map(|s| s.config().clone())
            .ok_or(StreamError::NoRedis)?;
        let names = if cfg.services.is_empty() {
            self.service_names()
        } else {
            cfg.services.clone()
        };
        for n in names {
            let h = self
                .handle(&n)
                .ok_or_else(|| StreamError::UnknownService(n.clone()))?;
            let prom = self.inner.metrics.stream(&h.cfg.name);
            start(
                self.clone(),
                &self.inner.streams,
                &redis,
                &h.cfg,
                &cfg,
                prom,
            )
            .await?;
        }
        Ok(())
    }

    /// Adds a task line to its service's durable stream (`XADD`, field
    /// `task`); returns the entry id. Any instance consuming the stream
    /// runs it.
    pub async fn enqueue_durable(
        &self,
        task: &crate::codec::TaskLine,
    ) -> Result<String, crate::redis::stream::StreamError> {
        use crate::redis::stream::StreamError;
        let redis = self
            .inner
            .shared
            .as_ref()
            .map(|s| s.config().clone())
            .ok_or(StreamError::NoRedis)?;
        let h = self
            .handle(&task.service)
            .ok_or_else(|| StreamError::UnknownService(task.service.clone()))?;
        self.inner.streams.enqueue(&redis, &h.cfg.name, task).await
    }

    /// Submits and, when the queue is full, waits for room.
    pub(crate) fn submit_waiting(&self, task: Task) -> Submission {
        self.submit_inner(task, true)
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

// === runtime pool changes ===

/// What [`Dispatcher::reload`] changed.
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    /// Services started by the reload.
    pub started: Vec<String>,
    /// Services no longer in the config: their intake is closed, they drain and stop.
    pub stopped: Vec<String>,
    /// Endpoint changes of the services kept.
    pub changed: Vec<(String, ReloadSummary)>,
}

impl Dispatcher {
    /// The balancer of `service`, to send it pool-change messages directly.
    pub fn balancer(&self, service: &str) -> Option<Addr<BalancerActor>> {
        self.handle(service).map(|h| h.balancer.clone())
    }

    async fn ask<M>(&self, service: &str, msg: M) -> Result<M::Result, PoolError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        BalancerActor: actix::Handler<M>,
    {
        let h = self
            .handle(service)
            .ok_or_else(|| PoolError::UnknownService(service.to_owned()))?;
        h.balancer.send(msg).await.map_err(|_| PoolError::Stopped)
    }

    /// Adds an endpoint to `service` (it ramps up if slow start is on).
    pub async fn add_endpoint(
        &self,
        service: &str,
        endpoint: EndpointConfig,
    ) -> Result<(), PoolError> {
        self.ask(service, AddEndpoint(endpoint)).await?
    }

    /// Removes an endpoint: no new task goes to it, its attempts in flight
    /// finish and are answered, then it leaves the pool.
    pub async fn remove_endpoint(&self, service: &str, address: &str) -> Result<(), PoolError> {
        self.ask(service, RemoveEndpoint(address.to_owned()))
            .await?
    }

    /// Changes an endpoint's weight (clamped to 1..=100).
    pub async fn set_weight(
        &self,
        service: &str,
        address: &str,
        weight: u32,
    ) -> Result<(), PoolError> {
        self.ask(
            service,
            SetWeight {
                address: address.to_owned(),
                weight: weight as i64,
            },
        )
        .await?
    }

    /// Marks an endpoint active (takes traffic) or inactive.
    pub async fn set_active(
        &self,
        service: &str,
        address: &str,
        active: bool,
    ) -> Result<(), PoolError> {
        self.ask(
            service,
            SetActive {
                address: address.to_owned(),
                active,
            },
        )
        .await?
    }

    /// Stops the actor of one node as a fault drill; its supervisor restarts
    /// it with its counters and breaker, and the restart is logged.
    pub async fn restart_node(&self, service: &str, address: &str) -> Result<(), PoolError> {
        self.ask(service, CrashNode(address.to_owned())).await?
    }

    /// Fault drill: makes the queue or the balancer of `service` panic, to
    /// check that no caller is left waiting (see `actors::drill`).
    #[doc(hidden)]
    pub async fn fault_drill(
        &self,
        service: &str,
        target: crate::actors::drill::DrillTarget,
    ) -> Result<(), PoolError> {
        use crate::actors::drill::{DrillTarget, PanicDrill};
        let h = self
            .handle(service)
            .ok_or_else(|| PoolError::UnknownService(service.to_owned()))?;
        match target {
            DrillTarget::Queue => h.queue.send(PanicDrill).await,
            // The balancer dies with the panic: its answer never comes.
            DrillTarget::Balancer => {
                h.balancer.do_send(PanicDrill);
                Ok(())
            }
        }
        .map_err(|_| PoolError::Stopped)
    }

    /// Starts a service on the dispatcher's own arbiter, whichever thread
    /// asks.
    async fn start_at_home(&self, svc: ServiceConfig) {
        let (tx, rx) = oneshot::channel();
        let d = self.clone();
        let sent = self.inner.home.spawn_fn(move || {
            d.start_service(svc);
            let _ = tx.send(());
        });
        if !sent || rx.await.is_err() {
            log::error!("dispatcher: its arbiter has stopped; a reloaded service was not started");
        }
    }

    /// Applies a new config: services are matched by name; the endpoints of
    /// a kept service are diffed by address (kept nodes keep their counters
    /// and breaker; removed ones drain); new services start; services gone
    /// from the config stop taking tasks, drain and stop. Other settings of a
    /// kept service stay as they were started. New services start on the
    /// arbiter that started the dispatcher, whichever thread calls this (an
    /// actix-web worker, say), and so outlive the caller.
    pub async fn reload(&self, config: Config) -> Result<ReloadReport, PoolError> {
        let mut report = ReloadReport::default();
        let wanted: Vec<String> = config
            .services
            .iter()
            .map(|s| s.name.to_lowercase())
            .collect();
        for svc in config.services {
            if self.handle(&svc.name).is_some() {
                let name = svc.name.clone();
                let summary = self.ask(&name, ReloadEndpoints(svc.endpoints)).await??;
                report.changed.push((name, summary));
            } else {
                report.started.push(svc.name.clone());
                self.start_at_home(svc).await;
            }
        }
        let gone: Vec<String> = self
            .service_names()
            .into_iter()
            .filter(|n| !wanted.contains(&n.to_lowercase()))
            .collect();
        for name in gone {
            let h = {
                let mut map = self.inner.services.write().expect("lock");
                self.inner
                    .order
                    .write()
                    .expect("lock")
                    .retain(|n| n != &name);
                map.remove(&name.to_lowercase())
            };
            if let Some(h) = h {
                log::info!("service {name}: removed from the config; draining");
                h.queue.do_send(CloseIntake);
                let (tx, rx) = oneshot::channel();
                h.queue.do_send(Drain { reply: tx });
                // On the dispatcher's arbiter too: the caller's may stop first.
                self.inner.home.spawn(async move {
                    let _ = rx.await;
                    h.queue.do_send(Stop);
                });
                report.stopped.push(name);
            }
        }
        Ok(report)
    }
}

/// The result of one submitted task, on its way: resolves to exactly one
/// [`TaskResult`]. It waits on the result slot inside the task's own
/// allocation (no channel per task; see `task/reply.rs`). A queue that
/// let go of the task unanswered (its pipeline died) answers `Internal`.
#[must_use = "the task is already submitted; await this to get its result"]
pub struct Submission(SubmissionState);

enum SubmissionState {
    Ready(Box<TaskResult>),
    Waiting { job: Arc<Job>, service: Arc<str> },
    Done,
}

impl Submission {
    pub(crate) fn ready(result: TaskResult) -> Self {
        Submission(SubmissionState::Ready(Box::new(result)))
    }

    /// Waits for `job`'s answer (the queue holds its [`ReplyTx`]).
    pub(crate) fn waiting(job: Arc<Job>, service: Arc<str>) -> Self {
        Submission(SubmissionState::Waiting { job, service })
    }
}

impl std::future::Future for Submission {
    type Output = TaskResult;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<TaskResult> {
        use std::task::Poll;
        let out = match &mut self.0 {
            SubmissionState::Ready(_) => {
                let SubmissionState::Ready(r) =
                    std::mem::replace(&mut self.0, SubmissionState::Done)
                else {
                    unreachable!()
                };
                return Poll::Ready(*r);
            }
            SubmissionState::Waiting { job, service } => match job.reply.poll_take(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(r)) => *r,
                Poll::Ready(None) => {
                    // The queue went away without answering: only a dead
                    // pipeline does that (shutdown answers every task).
                    let why = "the service's queue stopped before answering".to_owned();
                    let (id, since) = (job.id, job.submitted);
                    rejected(id, service.clone(), Rejection::Internal(why), since)
                }
            },
            SubmissionState::Done => panic!("Submission polled after it resolved"),
        };
        self.0 = SubmissionState::Done;
        Poll::Ready(out)
    }
}

pub(crate) fn rejected(
    id: TaskId,
    service: Arc<str>,
    reason: Rejection,
    since: Instant,
) -> TaskResult {
    TaskResult {
        id,
        service,
        outcome: Outcome::Rejected(reason),
        attempts: Vec::new(),
        total: since.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{AttemptOutcome, ErrorKind, FailReason};
    use crate::transport::{HttpReply, HttpRequest, Transport, TransportError};
    use futures::future::LocalBoxFuture;
    use std::rc::Rc;

    /// Never answers: the attempt is only ever ended by its node's timeout.
    struct Silent;

    impl Transport for Silent {
        fn send(
            &self,
            _req: HttpRequest,
        ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
            Box::pin(futures::future::pending())
        }
    }

    /// Answers every request 200 at once.
    struct Ok200;

    impl Transport for Ok200 {
        fn send(
            &self,
            _req: HttpRequest,
        ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
            Box::pin(async {
                Ok(HttpReply {
                    status: 200,
                    headers: Default::default(),
                    body: Default::default(),
                    protocol: None,
                })
            })
        }
    }

    /// Regression (issue 8, item 4): a service added by `reload` started on
    /// the caller's arbiter, so it died with the caller (an actix-web
    /// worker, say) and every later task was refused.
    #[actix_rt::test]
    async fn reload_starts_new_services_on_the_dispatchers_arbiter() {
        let json = |names: &[&str]| {
            let services: Vec<String> = names
                .iter()
                .map(|n| {
                    format!(r#"{{"name":"{n}","endpoints":[{{"address":"http://127.0.0.1:9/"}}]}}"#)
                })
                .collect();
            Config::from_json(&format!(r#"{{"services":[{}]}}"#, services.join(","))).unwrap()
        };
        let ok: TransportFactory = Arc::new(|_: &str| Rc::new(Ok200) as Rc<dyn Transport>);
        let d = Dispatcher::builder(json(&["a"]))
            .transport(ok)
            .start()
            .unwrap();
        // A worker thread reloads, then stops.
        let worker = actix::Arbiter::new();
        let (tx, rx) = oneshot::channel();
        let d2 = d.clone();
        worker.spawn(async move {
            let _ = tx.send(d2.reload(json(&["a", "b"])).await);
        });
        let report = rx.await.unwrap().unwrap();
        assert_eq!(report.started, vec!["b".to_string()]);
        worker.stop();
        worker.join().unwrap();
        // The new service lives on.
        let r = d.submit(Task::get("b", "/x")).await;
        assert!(r.is_success(), "{:?}", r.outcome);
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// The watchdog answers attempts whose node died with them in flight:
    /// here the node thread is stopped, so not even the node's timeout can
    /// end the attempt. Queue and balancer run under paused time.
    #[actix_rt::test]
    async fn attempts_of_a_dead_node_are_answered_by_the_watchdog() {
        tokio::time::pause();
        let config = Config::from_json(
            r#"{"services":[{"name":"svc","timeout":"1s",
                "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":10}],
                "breaker":{"enabled":false},
                "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}}]}"#,
        )
        .unwrap();
        let silent: TransportFactory = Arc::new(|_: &str| Rc::new(Silent) as Rc<dyn Transport>);
        let d = Dispatcher::builder(config)
            .node_threads(1)
            .transport(silent)
            .start()
            .unwrap();
        let pending = d.submit(Task::get("svc", "/x"));
        // The node thread dies with the attempt (or its dispatch) in flight.
        for a in d.inner.node_threads.lock().expect("lock").drain(..) {
            a.stop();
        }
        let r = pending.await;
        match &r.outcome {
            Outcome::Failure(f) => {
                assert_eq!(f.reason, FailReason::RetriesExhausted);
                assert_eq!(f.last, Some(AttemptOutcome::Error(ErrorKind::Lost)));
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(r.attempts.len(), 2);
        let s = d.stats().await;
        assert!(s.services[0].is_balanced());
        assert_eq!(s.services[0].queue.failed, 1);
    }
}
