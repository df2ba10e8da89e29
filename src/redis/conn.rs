//! The one connection an instance's shared-state calls go through: a
//! single Redis (the connection manager, which reconnects by itself) or a
//! Redis Cluster (`cluster-async`: the slot map read from the nodes,
//! `MOVED` and `ASK` followed, the map refreshed after a `MOVED`).
//!
//! Both are lazy: made without a round trip, connecting on the first call,
//! so a start never waits on Redis. Every script's keys share one hash tag,
//! so in a Cluster each call goes to the one node owning that slot.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::RedisConfig;

/// A single Redis or a Cluster. Cheap to clone (both are handles).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The (lazy) connection of `cfg`: a Cluster when `cfg.cluster`.
    pub fn open(cfg: &RedisConfig) -> redis::RedisResult<Conn> {
        if cfg.cluster {
            let mut b = ClusterClientBuilder::new([cfg.url.as_str()])
                .connection_timeout(cfg.timeout)
                .response_timeout(cfg.timeout)
                .retries(2);
            if let Some(ca) = &cfg.ca {
                b = b.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(super::pem(&ca.certs)),
                });
            }
            let client = b.build().map_err(|e| super::redacted(cfg, e))?;
            let cc = ClusterConfig::new()
                .set_connection_timeout(cfg.timeout)
                .set_response_timeout(cfg.timeout);
            return Ok(Conn::Cluster(
                client.get_pending_async_connection_with_config(cc),
            ));
        }
        let client = super::client(cfg)?;
        let mc = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout))
            .set_response_timeout(Some(cfg.timeout))
            .set_number_of_retries(1)
            .set_max_delay(cfg.heartbeat);
        let conn = ConnectionManager::new_lazy_with_config(client, mc)
            .map_err(|e| super::redacted(cfg, e))?;
        Ok(Conn::Single(conn))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
