//! The one connection an instance's shared-state calls go through: a
//! single Redis (the connection manager, which reconnects by itself) or a
//! Redis Cluster (`cluster-async`: the slot map read from the nodes,
//! `MOVED` and `ASK` followed, the map refreshed after a `MOVED`).
//!
//! Also here: the one-node [`client`] (TLS with the `ca_file`), and
//! [`check`], for an application that must not start without Redis.
//!
//! Both connections are lazy: made without a round trip, connecting on the first call,
//! so a start never waits on Redis. Every script's keys share one hash tag,
//! so in a Cluster each call goes to the one node owning that slot.

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::AsyncConnectionConfig;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use std::time::Duration;

use super::members_key;
use crate::config::RedisConfig;

/// A single Redis or a Cluster. Cheap to clone (all are handles).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// One multiplexed connection with its own response timeout: the
    /// durable stream's (its blocking reads need a connection of their own,
    /// whose timeout outlasts the block).
    Multiplexed(MultiplexedConnection),
}

impl Conn {
    /// The (lazy) connection of `cfg`: a Cluster when `cfg.cluster`.
    pub fn open(cfg: &RedisConfig) -> redis::RedisResult<Conn> {
        if cfg.cluster {
            let (client, cc) = cluster_client(cfg, cfg.timeout, cfg.timeout)?;
            return Ok(Conn::Cluster(
                client.get_pending_async_connection_with_config(cc),
            ));
        }
        let client = client(cfg)?;
        let mc = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout))
            .set_response_timeout(Some(cfg.timeout))
            .set_number_of_retries(1)
            .set_max_delay(cfg.heartbeat);
        let conn =
            ConnectionManager::new_lazy_with_config(client, mc).map_err(|e| redacted(cfg, e))?;
        Ok(Conn::Single(conn))
    }

    /// A connection of its own to `cfg`'s Redis (or Cluster) whose calls
    /// may take up to `response` (a blocking read's block, plus margin).
    pub async fn dedicated(cfg: &RedisConfig, response: Duration) -> redis::RedisResult<Conn> {
        let connect = cfg.timeout.max(Duration::from_secs(1));
        if cfg.cluster {
            let (client, cc) = cluster_client(cfg, connect, response)?;
            return client
                .get_async_connection_with_config(cc)
                .await
                .map(Conn::Cluster)
                .map_err(|e| redacted(cfg, e));
        }
        let ac = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        client(cfg)?
            .get_multiplexed_async_connection_with_config(&ac)
            .await
            .map(Conn::Multiplexed)
            .map_err(|e| redacted(cfg, e))
    }
}

/// The Cluster client of `cfg` (TLS with the `ca_file`) and its
/// connection settings.
fn cluster_client(
    cfg: &RedisConfig,
    connect: Duration,
    response: Duration,
) -> redis::RedisResult<(redis::cluster::ClusterClient, ClusterConfig)> {
    let mut b = ClusterClientBuilder::new([cfg.url.as_str()])
        .connection_timeout(connect)
        .response_timeout(response)
        .retries(2);
    if let Some(ca) = &cfg.ca {
        b = b.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem(&ca.certs)),
        });
    }
    let client = b.build().map_err(|e| redacted(cfg, e))?;
    let cc = ClusterConfig::new()
        .set_connection_timeout(connect)
        .set_response_timeout(response);
    Ok((client, cc))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
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
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
        }
    }
}

/// `e` with `cfg`'s URL and secrets scrubbed from its message.
pub(crate) fn redacted(cfg: &RedisConfig, e: redis::RedisError) -> redis::RedisError {
    (e.kind(), "redis", cfg.scrub(&e.to_string())).into()
}

/// The client for `cfg`'s URL (one node; see [`check`] for a Cluster):
/// over TLS for `rediss://`, trusting the `ca_file`'s authorities when
/// given. Errors are redacted.
pub fn client(cfg: &RedisConfig) -> redis::RedisResult<redis::Client> {
    let redact = |e| redacted(cfg, e);
    match &cfg.ca {
        Some(ca) if cfg.url.starts_with("rediss://") => {
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem(&ca.certs)),
            };
            redis::Client::build_with_tls(cfg.url.as_str(), certs).map_err(redact)
        }
        _ => redis::Client::open(cfg.url.as_str()).map_err(redact),
    }
}

/// DER certificates as PEM (what the redis client reads).
pub(crate) fn pem(certs: &[Vec<u8>]) -> Vec<u8> {
    use base64::Engine as _;
    let mut out = String::new();
    for c in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c);
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// Connects to `cfg`'s Redis and sends `PING`, within `timeout` (at least
/// a second) for each: an application that must not run without a
/// working Redis (unreachable, a wrong password, a TLS error) calls it
/// before `Dispatcher::start` and refuses to start on `Err`. The error is
/// redacted.
pub async fn check(cfg: &RedisConfig) -> redis::RedisResult<()> {
    let limit = cfg.timeout.max(Duration::from_secs(1));
    let redact = |e| redacted(cfg, e);
    if cfg.cluster {
        // A key's slot, so the call needs the slot map: a Cluster that
        // answers but has no owner for it fails here too.
        let mut con = Conn::open(cfg)?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(members_key(&cfg.prefix));
        let f = cmd.query_async::<i64>(&mut con);
        return match tokio::time::timeout(limit, f).await {
            Ok(r) => r.map(|_| ()).map_err(redact),
            Err(_) => Err((
                redis::ErrorKind::Io,
                "redis check",
                format!("no answer within {limit:?}"),
            )
                .into()),
        };
    }
    let c = client(cfg)?;
    let ac = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit));
    let mut con = c
        .get_multiplexed_async_connection_with_config(&ac)
        .await
        .map_err(redact)?;
    redis::cmd("PING")
        .query_async::<()>(&mut con)
        .await
        .map_err(redact)
}
