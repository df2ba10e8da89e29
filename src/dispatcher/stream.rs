//! The durable task streams (feature `redis`): [`Dispatcher::consume`],
//! [`Dispatcher::consume_configured`] (the config file's `redis.stream`
//! settings) and [`Dispatcher::enqueue_durable`].

use std::sync::atomic::Ordering;

use super::Dispatcher;

#[cfg(feature = "redis")]
impl Dispatcher {
    /// The config's `redis` section, or `NoRedis`.
    fn redis_config(
        &self,
    ) -> Result<&crate::config::RedisConfig, crate::redis::stream::DurableStreamError> {
        self.inner
            .shared
            .as_ref()
            .map(|s| s.config())
            .ok_or(crate::redis::stream::DurableStreamError::NoRedis)
    }

    /// Consumes the durable task streams of the services (every one, or
    /// `cfg.services`) through the config's `redis` section, with
    /// at-least-once calls to backends and exactly one recorded result per
    /// task (see [`crate::redis::stream`]). Runs on the calling arbiter
    /// until [`Dispatcher::shutdown`], which leaves unfinished entries
    /// pending for other instances to claim.
    pub async fn consume(
        &self,
        cfg: crate::redis::stream::StreamConfig,
    ) -> Result<(), crate::redis::stream::DurableStreamError> {
        use crate::redis::stream::{start, DurableStreamError};
        let redis = self.redis_config()?.clone();
        let names = if cfg.services.is_empty() {
            self.service_names()
        } else {
            cfg.services.clone()
        };
        for n in names {
            let h = self
                .handle(&n)
                .ok_or_else(|| DurableStreamError::UnknownService(n.clone()))?;
            let prom = self.inner.metrics.stream(&h.cfg.name);
            start(
                Box::new(self.clone()),
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

    /// [`Dispatcher::consume`] with the config's settings: its
    /// `redis.stream` object, or `StreamConfig::default()` when it has none
    /// (see [`crate::config::RedisConfig::stream_config`]). To override some
    /// of them, change that value and call [`Dispatcher::consume`]:
    ///
    /// ```no_run
    /// # async fn run(d: actix_dispatch::Dispatcher, cfg: &actix_dispatch::Config) {
    /// let mut sc = cfg.redis.as_ref().expect("redis section").stream_config();
    /// sc.consumer = "worker-1".into();
    /// d.consume(sc).await.expect("consume");
    /// # }
    /// ```
    pub async fn consume_configured(&self) -> Result<(), crate::redis::stream::DurableStreamError> {
        let cfg = self.redis_config()?.stream_config();
        self.consume(cfg).await
    }

    /// Adds a task line to its service's durable stream (`XADD`, field
    /// `task`); returns the entry id. Any instance consuming the stream
    /// runs it.
    pub async fn enqueue_durable(
        &self,
        task: &crate::codec::TaskLine,
    ) -> Result<String, crate::redis::stream::DurableStreamError> {
        use crate::redis::stream::DurableStreamError;
        let redis = self.redis_config()?.clone();
        let h = self
            .handle(&task.service)
            .ok_or_else(|| DurableStreamError::UnknownService(task.service.clone()))?;
        self.inner.streams.enqueue(&redis, &h.cfg.name, task).await
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

#[cfg(feature = "redis")]
impl crate::redis::stream::Intake for Dispatcher {
    fn is_closed(&self) -> bool {
        Dispatcher::is_closed(self)
    }

    fn submit_waiting(&self, task: crate::Task) -> crate::Submission {
        Dispatcher::submit_waiting(self, task)
    }
}
