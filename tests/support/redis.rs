//! A real `redis-server` for the tests: ephemeral port, no persistence.
//!
//! [`RedisServer::start`] picks a free loopback port (binds `127.0.0.1:0`,
//! releases it), runs `redis-server --port P --bind 127.0.0.1 --save ''
//! --appendonly no`, and waits (at most 5 s) until it answers. Dropping it
//! kills the process (after a `SIGCONT`, in case a test paused it).
//!
//! [`RedisServer::start_with`] adds arguments (`--requirepass`, ...);
//! [`RedisServer::start_tls`] adds a `tls-port` with a CA and a server
//! certificate for 127.0.0.1 made at test time (rcgen), written to a fresh
//! temporary directory removed on drop.
//!
//! When `redis-server` is not installed, `start` returns `None` and the test
//! skips, unless `CI` (or `REDIS_REQUIRED`) is set: then it fails.

#![allow(dead_code)]
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long to wait for the server to answer `PING`.
const READY_WAIT: Duration = Duration::from_secs(5);

/// A running `redis-server`, killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    tls: Option<Tls>,
}

/// The TLS side of a server: its port and the CA's PEM file.
struct Tls {
    port: u16,
    dir: std::path::PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl RedisServer {
    /// Starts one, or `None` when redis-server is missing and not required.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// Starts one with `extra` arguments (`--requirepass`, ...).
    pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
        Self::spawn(extra.iter().map(|s| s.to_string()).collect(), None)
    }

    /// Starts one with a `tls-port` too (no client certificates asked),
    /// its certificate for 127.0.0.1 signed by a CA of its own
    /// ([`RedisServer::ca_file`]).
    pub fn start_tls() -> Option<RedisServer> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-redis-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        write_certs(&dir);
        let port = free_port();
        let f = |n: &str| dir.join(n).display().to_string();
        let args = vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            f("server.pem"),
            "--tls-key-file".into(),
            f("server.key"),
            "--tls-ca-cert-file".into(),
            f("ca.pem"),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        Self::spawn(args, Some(Tls { port, dir }))
    }

    fn spawn(extra: Vec<String>, tls: Option<Tls>) -> Option<RedisServer> {
        let required =
            std::env::var_os("CI").is_some() || std::env::var_os("REDIS_REQUIRED").is_some();
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if !required => {
                eprintln!("redis-server not available ({e}): test skipped");
                return None;
            }
            Err(e) => panic!("redis-server is required (CI is set) but cannot run: {e}"),
        };
        let s = RedisServer { child, port, tls };
        let start = Instant::now();
        while start.elapsed() < READY_WAIT {
            if s.ping() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {port} did not answer within {READY_WAIT:?}");
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT/0`.
    pub fn url_with_password(&self, password: &str) -> String {
        format!("redis://:{password}@127.0.0.1:{}/0", self.port)
    }

    /// `rediss://127.0.0.1:TLS_PORT/0` (a server of [`Self::start_tls`]).
    pub fn tls_url(&self) -> String {
        let tls = self.tls.as_ref().expect("a TLS server");
        format!("rediss://127.0.0.1:{}/0", tls.port)
    }

    /// The PEM file of the CA that signed the TLS certificate.
    pub fn ca_file(&self) -> String {
        let tls = self.tls.as_ref().expect("a TLS server");
        tls.dir.join("ca.pem").display().to_string()
    }

    /// The plain port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id (for `kill -STOP`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it answers `PING` within 200 ms.
    pub fn ping(&self) -> bool {
        let Ok(mut c) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
        if c.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        // `-NOAUTH` answers too (a server with `--requirepass`).
        matches!(c.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
    }

    /// Pauses the process (`kill -STOP`): connections stay open, nothing
    /// answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes it (`kill -CONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = &self.tls {
            let _ = std::fs::remove_dir_all(&t.dir);
        }
    }
}

/// Writes `ca.pem`, `server.pem` and `server.key` (for 127.0.0.1) to `dir`.
fn write_certs(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "redis test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("leaf params");
    leaf.distinguished_name
        .push(DnType::CommonName, "redis test server");
    let cert = leaf.signed_by(&key, &issuer).expect("server certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("ca.pem");
    std::fs::write(dir.join("server.pem"), cert.pem()).expect("server.pem");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("server.key");
}

/// Three `redis-server --cluster-enabled yes` masters on loopback, joined
/// by `redis-cli --cluster create` (no replicas), killed on drop. `None`
/// when redis-server is missing and not required.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    /// Starts one, trying three times: a node's port, probed free, may be
    /// taken before it binds. The last failure's output is in the panic.
    pub fn start() -> Option<RedisCluster> {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(c) => return c,
                Err(e) => last = e,
            }
        }
        panic!("redis-cli --cluster create failed three times; last:\n{last}");
    }

    fn try_start() -> Result<Option<RedisCluster>, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-redis-cluster-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut nodes = Vec::new();
        for i in 0..3 {
            let conf = dir.join(format!("nodes-{i}.conf")).display().to_string();
            // The bus port defaults to the port + 10000, past 65535 for an
            // ephemeral port above 55535, or taken: one of its own.
            let bus = free_port().to_string();
            let args = [
                "--cluster-port",
                &bus,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "2000",
                "--dir",
                &dir.display().to_string(),
            ];
            let Some(node) = RedisServer::start_with(&args) else {
                return Ok(None);
            };
            nodes.push(node);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        if !out.status.success() {
            drop(nodes);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let c = RedisCluster { nodes, dir };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if c.nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            {
                return Ok(Some(c));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not reach cluster_state:ok within 10 s");
    }

    /// `redis://127.0.0.1:PORT/` of the first node (a seed).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.nodes[0].port)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// Runs `redis-cli -p PORT args...` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// This node's cluster id (`CLUSTER MYID`).
    pub fn node_id(&self) -> String {
        self.cli(&["CLUSTER", "MYID"]).trim().to_string()
    }
}

/// One master, one replica (`--replicaof`) and three sentinels
/// (`redis-server <conf> --sentinel`) monitoring them as `name`, all on
/// loopback ephemeral ports, killed on drop. The data nodes require
/// `data_password` when given (the sentinels and the replica know it), the
/// sentinels `sentinel_password`. Each sentinel's config file is written
/// to a fresh temporary directory (a sentinel rewrites its own): a fixed
/// `myid`, the replica and the other sentinels already known, so that
/// they agree at once instead of after their first hello messages; a
/// master silent for 1 s is down (short, yet long enough that a loaded
/// machine does not fail over by itself), a failover times out after 2 s.
///
/// [`RedisSentinel::start_tls`] adds a `tls-port` to every node (one CA and
/// one certificate for 127.0.0.1, made at test time) with
/// `tls-replication yes`: the sentinels monitor, name and reach one
/// another over TLS only, so a client gets TLS addresses; the plain ports
/// stay for the test's own queries.
pub struct RedisSentinel {
    pub name: String,
    /// The first master (`None` once killed by [`RedisSentinel::kill_master`]).
    pub master: Option<RedisServer>,
    pub replica: RedisServer,
    sentinels: Vec<SentinelNode>,
    data_password: Option<String>,
    sentinel_password: Option<String>,
    /// TLS ports of the master and the replica (with `start_tls`).
    data_tls: Option<(u16, u16)>,
    dir: std::path::PathBuf,
}

struct SentinelNode {
    child: Child,
    port: u16,
    tls_port: Option<u16>,
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisSentinel {
    /// Starts them and waits (at most 10 s) until every sentinel sees the
    /// master up with its replica and the two other sentinels, and the
    /// replica is in sync; `None` when redis-server is missing and not
    /// required.
    pub fn start(
        name: &str,
        data_password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> Option<RedisSentinel> {
        Self::spawn(name, data_password, sentinel_password, false)
    }

    /// The same, every node with a `tls-port` too (see the type's docs;
    /// [`RedisSentinel::ca_file`]).
    pub fn start_tls(name: &str, data_password: Option<&str>) -> Option<RedisSentinel> {
        Self::spawn(name, data_password, None, true)
    }

    fn spawn(
        name: &str,
        data_password: Option<&str>,
        sentinel_password: Option<&str>,
        tls: bool,
    ) -> Option<RedisSentinel> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-redis-sentinel-{}-{n}",
            std::process::id(),
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = |n: &str| dir.join(n).display().to_string();
        let tls_conf: Vec<(String, String)> = if tls {
            write_certs(&dir);
            vec![
                ("tls-cert-file".into(), f("server.pem")),
                ("tls-key-file".into(), f("server.key")),
                ("tls-ca-cert-file".into(), f("ca.pem")),
                ("tls-auth-clients".into(), "no".into()),
                ("tls-replication".into(), "yes".into()),
            ]
        } else {
            Vec::new()
        };
        // A replica writes the RDB of its full sync to `dir`: the temporary
        // directory, not the test's working directory.
        let mut args: Vec<String> = vec!["--dir".into(), dir.display().to_string()];
        if let Some(p) = data_password {
            args.extend(["--requirepass", p, "--masterauth", p].map(String::from));
        }
        for (k, v) in &tls_conf {
            args.extend([format!("--{k}"), v.clone()]);
        }
        let data_tls = tls.then(|| (free_port(), free_port()));
        let with_tls_port = |args: &[String], port: Option<u16>| -> Vec<String> {
            let mut a = args.to_vec();
            if let Some(p) = port {
                a.extend(["--tls-port".to_string(), p.to_string()]);
            }
            a
        };
        let master_args = with_tls_port(&args, data_tls.map(|t| t.0));
        let master =
            RedisServer::start_with(&master_args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let monitored = data_tls.map_or(master.port, |t| t.0);
        let mut replica_args = with_tls_port(&args, data_tls.map(|t| t.1));
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            monitored.to_string(),
        ]);
        let replica =
            RedisServer::start_with(&replica_args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let replica_named = data_tls.map_or(replica.port, |t| t.1);
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let tls_ports: Vec<Option<u16>> = (0..3).map(|_| tls.then(free_port)).collect();
        let ids: Vec<String> = (0..3)
            .map(|i| format!("{:08x}{:08x}{:024x}", std::process::id(), n, i + 1))
            .collect();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let mut conf = format!(
                "port {}\nbind 127.0.0.1\ndir {}\nsentinel myid {}\n\
                 sentinel monitor {name} 127.0.0.1 {monitored} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 2000\n\
                 sentinel parallel-syncs {name} 1\n\
                 sentinel known-replica {name} 127.0.0.1 {replica_named}\n",
                ports[i],
                dir.display(),
                ids[i],
            );
            for (k, v) in &tls_conf {
                conf.push_str(&format!("{k} {v}\n"));
            }
            if let Some(t) = tls_ports[i] {
                conf.push_str(&format!("tls-port {t}\n"));
            }
            for j in (0..3).filter(|&j| j != i) {
                conf.push_str(&format!(
                    "sentinel known-sentinel {name} 127.0.0.1 {} {}\n",
                    tls_ports[j].unwrap_or(ports[j]),
                    ids[j]
                ));
            }
            if let Some(p) = data_password {
                conf.push_str(&format!("sentinel auth-pass {name} {p}\n"));
            }
            if let Some(p) = sentinel_password {
                conf.push_str(&format!("requirepass {p}\nsentinel sentinel-pass {p}\n"));
            }
            let path = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(&path, conf).expect("sentinel conf");
            let child = Command::new("redis-server")
                .arg(&path)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            sentinels.push(SentinelNode {
                child,
                port: ports[i],
                tls_port: tls_ports[i],
            });
        }
        let s = RedisSentinel {
            name: name.to_string(),
            master: Some(master),
            replica,
            sentinels,
            data_password: data_password.map(str::to_string),
            sentinel_password: sentinel_password.map(str::to_string),
            data_tls,
            dir,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if s.ready() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the sentinels did not agree on {name} within 10 s");
    }

    fn ready(&self) -> bool {
        let synced = self
            .data_query(self.replica.port, redis::cmd("INFO").arg("replication"))
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .is_some_and(|info| info.contains("master_link_status:up"));
        synced
            && self.sentinels.iter().all(|s| {
                let info = self
                    .sentinel_query(s.port, redis::cmd("SENTINEL").arg("MASTER").arg(&self.name));
                let Some(map) = info.and_then(|v| {
                    redis::from_redis_value::<std::collections::HashMap<String, String>>(v).ok()
                }) else {
                    return false;
                };
                let get = |k: &str| map.get(k).cloned().unwrap_or_default();
                get("flags") == "master"
                    && get("num-slaves") == "1"
                    && get("num-other-sentinels") == "2"
            })
    }

    fn sentinel_query(&self, port: u16, cmd: &redis::Cmd) -> Option<redis::Value> {
        let url = match &self.sentinel_password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{port}"),
            None => format!("redis://127.0.0.1:{port}"),
        };
        query(&url, cmd)
    }

    fn data_query(&self, port: u16, cmd: &redis::Cmd) -> Option<redis::Value> {
        query(&self.data_url(port), cmd)
    }

    /// `redis://[:PASSWORD@]127.0.0.1:PORT/0` of a data node (its plain
    /// port).
    pub fn data_url(&self, port: u16) -> String {
        match &self.data_password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{port}/0"),
            None => format!("redis://127.0.0.1:{port}/0"),
        }
    }

    /// The engine's `url`: `redis://[:PASSWORD@]NAME/0` (`rediss://` with
    /// TLS).
    pub fn url(&self) -> String {
        let scheme = if self.data_tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.data_password {
            Some(p) => format!("{scheme}://:{p}@{}/0", self.name),
            None => format!("{scheme}://{}/0", self.name),
        }
    }

    /// The sentinels as a JSON array of URLs (with the sentinel password;
    /// their TLS ports with TLS).
    pub fn nodes_json(&self) -> String {
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| {
                let (scheme, port) = match s.tls_port {
                    Some(t) => ("rediss", t),
                    None => ("redis", s.port),
                };
                match &self.sentinel_password {
                    Some(p) => format!("\"{scheme}://:{p}@127.0.0.1:{port}\""),
                    None => format!("\"{scheme}://127.0.0.1:{port}\""),
                }
            })
            .collect();
        format!("[{}]", urls.join(","))
    }

    /// The PEM file of the CA of every node's certificate (`start_tls`).
    pub fn ca_file(&self) -> String {
        assert!(self.data_tls.is_some(), "a TLS setup");
        self.dir.join("ca.pem").display().to_string()
    }

    /// The port every sentinel answering names as the master's (`None`
    /// while they disagree or none answers).
    pub fn master_port(&self) -> Option<u16> {
        let mut seen = None;
        for s in &self.sentinels {
            let v = self.sentinel_query(
                s.port,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.name),
            )?;
            let (_, port): (String, u16) = redis::from_redis_value(v).ok()?;
            if seen.is_some_and(|p| p != port) {
                return None;
            }
            seen = Some(port);
        }
        seen
    }

    /// `kill -9` of the master.
    pub fn kill_master(&mut self) {
        let m = self.master.take().expect("a master to kill");
        m.signal("-KILL");
        drop(m);
    }

    /// Waits (at most `limit`) until every sentinel names the replica as
    /// the master and the replica says it is; true when they do.
    pub fn wait_failover(&self, limit: Duration) -> bool {
        let named = self.data_tls.map_or(self.replica.port, |t| t.1);
        let start = Instant::now();
        while start.elapsed() < limit {
            let role = self
                .data_query(self.replica.port, &redis::cmd("ROLE"))
                .and_then(|v| match v {
                    redis::Value::Array(items) => items.into_iter().next(),
                    _ => None,
                })
                .and_then(|v| redis::from_redis_value::<String>(v).ok());
            if self.master_port() == Some(named) && role.as_deref() == Some("master") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Runs `cmd` on a data node (its plain `port`), panicking on an error.
    pub fn on_data<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> T {
        let v = self
            .data_query(port, cmd)
            .unwrap_or_else(|| panic!("{cmd:?} on {port}"));
        redis::from_redis_value(v).expect("reply type")
    }
}

/// One command over a fresh connection (500 ms limits), `None` on any
/// error.
fn query(url: &str, cmd: &redis::Cmd) -> Option<redis::Value> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    c.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    cmd.query(&mut c).ok()
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        self.sentinels.clear();
        self.master = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `f` with a dispatcher of `cfg` on a System of its own thread (as
/// a separate process would), then shuts it down.
pub fn with_instance<T: Send + 'static>(
    cfg: actix_dispatch::Config,
    f: impl FnOnce(actix_dispatch::Dispatcher) -> futures::future::LocalBoxFuture<'static, T>
        + Send
        + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        actix::System::new().block_on(async move {
            let d = actix_dispatch::Dispatcher::start(cfg).expect("start");
            let out = f(d.clone()).await;
            d.shutdown(Duration::ZERO).await;
            out
        })
    })
}

/// Polls the durable-stream stats of service `svc` (every 25 ms, at most
/// `limit`) until `done` holds for them; the last seen either way.
pub async fn stream_until(
    d: &actix_dispatch::Dispatcher,
    limit: Duration,
    done: impl Fn(&actix_dispatch::redis::stream::StreamStats) -> bool,
) -> Option<actix_dispatch::redis::stream::StreamStats> {
    let start = tokio::time::Instant::now();
    let mut last = None;
    while start.elapsed() < limit {
        last = d
            .stats()
            .await
            .service("svc")
            .and_then(|s| s.stream.clone());
        if last.as_ref().is_some_and(&done) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    last
}

/// The instance's shared-state stats at each mark the test sends over
/// `marks` (polled every 10 ms), and once more when the test hangs up.
pub async fn shared_at_marks(
    d: &actix_dispatch::Dispatcher,
    marks: &std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
) -> Vec<actix_dispatch::redis::SharedStats> {
    use std::sync::mpsc::TryRecvError;
    let mut seen = Vec::new();
    loop {
        let got = marks.lock().unwrap().try_recv();
        match got {
            Ok(()) => seen.push(d.stats().await.shared.expect("shared")),
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen.push(d.stats().await.shared.expect("shared"));
    seen
}
