//! [`DispatcherBuilder`]: the options of [`Dispatcher::start`], and the start.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::{Dispatcher, Inner, Services};
use crate::config::{Config, ConfigError};
use crate::transport::{awc_factory, TransportFactory};

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

    /// Uses `factory` to make each node's transport (default:
    /// [`crate::transport::AwcTransport`], its own HTTP/1.1 and HTTP/2).
    pub fn transport(mut self, factory: TransportFactory) -> Self {
        self.factory = Some(factory);
        self
    }

    /// Runs the node actors (the HTTP attempts: sockets, parsing) on
    /// `n` threads of their own, nodes spread over them round robin, while
    /// the queues and balancers stay on the calling arbiter. Default 0: all
    /// on the calling arbiter. One thread moves the HTTP work off the
    /// caller's core; more rarely helps (see `bench/results/performance.md`).
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
            services: RwLock::new(Services::default()),
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

impl Dispatcher {
    /// Starts one pipeline per service with the default transport.
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
}
