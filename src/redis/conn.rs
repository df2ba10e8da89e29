//! The one connection an instance's shared-state calls go through: a
//! single Redis (the connection manager, which reconnects by itself), a
//! Redis Cluster (`cluster-async`: the slot map read from the nodes,
//! `MOVED` and `ASK` followed, the map refreshed after a `MOVED`), or the
//! master that Redis Sentinel names (`sentinel.rs`: the sentinels asked
//! again whenever the connection is lost or the node stops being master,
//! so a failover is followed; redis-rs's own connection manager cannot,
//! bound as it is to one address).
//!
//! Also here: the one-node [`client`] (TLS with the `ca_file`), and
//! [`check`], for an application that must not start without Redis.
//!
//! These connections are lazy: made without a round trip, connecting on the first call,
//! so a start never waits on Redis. Every script's keys share one hash tag,
//! so in a Cluster each call goes to the one node owning that slot.
//!
//! The durable stream's connections ([`Conn::dedicated`]) have a response
//! timeout of their own; with Sentinel each is a [`SentinelConn`] of its
//! own, following a failover as the shared state's does.

mod link;
mod sentinel;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, TlsMode};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use std::time::Duration;

use super::members_key;
use crate::config::{RedisConfig, SentinelConfig};
use sentinel::SentinelConn;

/// A single Redis, a Cluster or Sentinel's master. Cheap to clone (all
/// are handles).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master the sentinels name, asked for again when lost.
    Sentinel(SentinelConn),
}

impl Conn {
    /// The (lazy) connection of `cfg`: a Cluster when `cfg.cluster`.
    pub fn open(cfg: &RedisConfig) -> redis::RedisResult<Conn> {
        if let Some(s) = &cfg.sentinel {
            return sentinel_conn(cfg, s, cfg.timeout).map(Conn::Sentinel);
        }
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
        if let Some(s) = &cfg.sentinel {
            // Made now, as the others are: a start that cannot reach the
            // master says so.
            let con = sentinel_conn(cfg, s, response)?;
            con.connection().await.map_err(|e| redacted(cfg, e))?;
            return Ok(Conn::Sentinel(con));
        }
        if cfg.cluster {
            let (client, cc) = cluster_client(cfg, connect, response)?;
            return client
                .get_async_connection_with_config(cc)
                .await
                .map(Conn::Cluster)
                .map_err(|e| redacted(cfg, e));
        }
        // A connection manager of its own: it reconnects by itself after
        // Redis restarts or drops the connection, so a stream's reader
        // resumes instead of failing on a dead socket for good.
        let mc = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response))
            .set_number_of_retries(1)
            .set_max_delay(cfg.heartbeat);
        ConnectionManager::new_with_config(client(cfg)?, mc)
            .await
            .map(Conn::Single)
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
            Conn::Sentinel(c) => c.req_packed_command(cmd),
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
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// The connection to the master of `s` (lazy), calls answered within
/// `response`. Each resolve (every sentinel asked, the master's `ROLE`
/// checked, the connection made) is bounded by three connect timeouts.
fn sentinel_conn(
    cfg: &RedisConfig,
    s: &SentinelConfig,
    response: Duration,
) -> redis::RedisResult<SentinelConn> {
    let connect = cfg.timeout.max(Duration::from_secs(1));
    let client = sentinel_client(cfg, s)?;
    let db = cfg
        .url
        .as_str()
        .into_connection_info()
        .map(|i| i.redis_settings().db())
        .unwrap_or(0);
    let ac = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(Some(response));
    let scrubbing = cfg.clone();
    Ok(SentinelConn::new(
        client,
        ac,
        connect * 3,
        response,
        db,
        s.master.clone(),
        Box::new(move |t| scrubbing.scrub(t)),
    ))
}

/// The sentinel client of `s`: the sentinels' `AUTH` from the first
/// node's userinfo (validation made them all the same), the data nodes'
/// `AUTH`, db and TLS from `cfg.url`, the `ca_file` trusted by whichever
/// side is over TLS.
fn sentinel_client(cfg: &RedisConfig, s: &SentinelConfig) -> redis::RedisResult<SentinelClient> {
    let redact = |e| redacted(cfg, e);
    let nodes = s
        .nodes
        .iter()
        .map(|n| n.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()
        .map_err(redact)?;
    let addrs: Vec<ConnectionAddr> = nodes.iter().map(|n| n.addr().clone()).collect();
    let sentinels_tls = addrs
        .iter()
        .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
    let mut b =
        SentinelClientBuilder::new(addrs, &s.master, SentinelServerType::Master).map_err(redact)?;
    if let Some(first) = nodes.first() {
        if let Some(u) = first.redis_settings().username() {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = first.redis_settings().password() {
            b = b.set_client_to_sentinel_password(p);
        }
    }
    let data = cfg.url.as_str().into_connection_info().map_err(redact)?;
    if let Some(u) = data.redis_settings().username() {
        b = b.set_client_to_redis_username(u);
    }
    if let Some(p) = data.redis_settings().password() {
        b = b.set_client_to_redis_password(p);
    }
    b = b.set_client_to_redis_db(data.redis_settings().db());
    let certs = |ca: &crate::config::CaFile| redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem(&ca.certs)),
    };
    if let ConnectionAddr::TcpTls { insecure, .. } = data.addr() {
        b = b.set_client_to_redis_tls_mode(if *insecure {
            TlsMode::Insecure
        } else {
            TlsMode::Secure
        });
        if let Some(ca) = &cfg.ca {
            b = b.set_client_to_redis_certificates(certs(ca));
        }
    }
    if let (true, Some(ca)) = (sentinels_tls, &cfg.ca) {
        b = b.set_client_to_sentinel_certificates(certs(ca));
    }
    b.build().map_err(redact)
}

/// `e` with `cfg`'s URL and secrets scrubbed from its message.
pub(crate) fn redacted(cfg: &RedisConfig, e: redis::RedisError) -> redis::RedisError {
    (e.kind(), "redis", cfg.scrub(&e.to_string())).into()
}

/// The client for `cfg`'s URL (one node; see [`check`] for a Cluster):
/// over TLS for `rediss://`, trusting the `ca_file`'s authorities when
/// given. Errors are redacted. A Sentinel config has no fixed node: an
/// error (`InvalidClientConfig`).
pub fn client(cfg: &RedisConfig) -> redis::RedisResult<redis::Client> {
    let redact = |e| redacted(cfg, e);
    if cfg.sentinel.is_some() {
        return Err((
            redis::ErrorKind::InvalidClientConfig,
            "redis.sentinel",
            "the master's address comes from the sentinels, not from `url`".to_string(),
        )
            .into());
    }
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
/// redacted. With Sentinel: the sentinels asked, the master's role
/// checked, then `PING` on it (within four times that limit).
pub async fn check(cfg: &RedisConfig) -> redis::RedisResult<()> {
    let limit = cfg.timeout.max(Duration::from_secs(1));
    let redact = |e| redacted(cfg, e);
    if let Some(s) = &cfg.sentinel {
        // The sentinels asked, the master's role checked, then PING on it:
        // the call waits out a whole resolve (three connect timeouts).
        let mut con = Conn::Sentinel(sentinel_conn(cfg, s, limit * 3)?);
        let ping = redis::cmd("PING");
        let f = ping.query_async::<()>(&mut con);
        return match tokio::time::timeout(limit * 4, f).await {
            Ok(r) => r.map_err(redact),
            Err(_) => Err((
                redis::ErrorKind::Io,
                "redis check",
                format!("no answer within {:?}", limit * 4),
            )
                .into()),
        };
    }
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
        .map_err(redact)?;
    // A key's command: a Cluster node answers MOVED for a key of another
    // node's slots, which `PING` never shows.
    match redis::cmd("EXISTS")
        .arg(members_key(&cfg.prefix))
        .query_async::<i64>(&mut con)
        .await
    {
        Err(e) if super::repairs::is_moved(&e) => Err((
            redis::ErrorKind::InvalidClientConfig,
            "redis.cluster",
            super::repairs::moved_message(&cfg.redacted_url()),
        )
            .into()),
        r => r.map(drop).map_err(redact),
    }
}

/// A connection of its own to `cfg`'s Redis, whichever its kind: one node
/// (TLS with the `ca_file`), a Cluster (`MOVED`/`ASK` followed), or the
/// master the sentinels name (asked for again when lost); each call
/// answered within `timeout`, at least 5 s. For tools that write to Redis
/// themselves, as `actix-dispatch enqueue` does. Errors are redacted.
pub async fn connect(cfg: &RedisConfig) -> redis::RedisResult<Connection> {
    Conn::dedicated(cfg, cfg.timeout.max(Duration::from_secs(5)))
        .await
        .map(Connection)
}

/// A connection made by [`connect`]: use it with redis-rs's commands and
/// pipelines (`redis::aio::ConnectionLike`). Cheap to clone (a handle).
#[derive(Clone)]
pub struct Connection(Conn);

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}
