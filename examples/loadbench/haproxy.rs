//! HAProxy as a peer of the `peers` scenario: found (or installed with
//! `bench/install-haproxy.sh`), configured in a temporary directory, run in
//! the foreground on 127.0.0.1 as a child process, killed at the end.
//!
//! The config is what an operator would write for this job: `balance
//! leastconn` (the nearest HAProxy has to the engine's load-aware picks),
//! HTTP keep-alive on both sides, `http-reuse always` so that idle server
//! connections are shared by every client connection (keep-alive to the
//! backends, like nginx's `keepalive`), one thread (`nbthread 1`, like
//! nginx's one worker), no logging, the same timeouts as the other
//! contenders, and `retries` / `option redispatch` for connect failures.
//!
//! The `overload` scenario's config ([`Haproxy::start_overload`]) is what an
//! operator protecting fixed-capacity backends writes: `maxconn` per server
//! (at most that many requests on a server at once, the rest wait in
//! HAProxy's queue) and `timeout queue` (a request that waited that long is
//! answered 503 by HAProxy itself). `maxconn` is per server (each its
//! true worker count), and an admin socket in the temporary directory lets
//! [`Haproxy::set_maxconn`] follow a backend whose workers change, as an
//! operator who knows the truth would (`set maxconn server`).

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where haproxy lives, if it is installed.
fn find() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file())
}

/// haproxy's path, installing it first when allowed. `Err` says why not.
pub fn find_or_install(allow_install: bool) -> Result<PathBuf, String> {
    if let Some(p) = find() {
        return Ok(p);
    }
    if !allow_install {
        return Err("haproxy is not installed (and --no-install-haproxy was given)".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/install-haproxy.sh");
    eprintln!("haproxy not found: running {}", script.display());
    let status = Command::new("timeout")
        .arg("600")
        .arg("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", script.display()));
    }
    find().ok_or_else(|| "haproxy still not found after installing it".into())
}

/// A free port on 127.0.0.1 (bound, then released for haproxy to take).
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    Ok(port)
}

/// The configuration text: one frontend on `port`, `leastconn` over `ports`.
fn config(port: u16, ports: &[u16], timeout: Duration) -> String {
    let ms = timeout.as_millis().max(1);
    let mut servers = String::new();
    for (i, p) in ports.iter().enumerate() {
        let _ = writeln!(servers, "    server s{i} 127.0.0.1:{p}");
    }
    format!(
        "global
    nbthread 1
    maxconn 4096

defaults
    mode http
    option http-keep-alive
    http-reuse always
    retries 2
    option redispatch
    timeout connect {ms}ms
    timeout client {ms}ms
    timeout server {ms}ms
    timeout http-keep-alive {ms}ms

frontend bench
    bind 127.0.0.1:{port}
    default_backend backends

backend backends
    balance leastconn
{servers}"
    )
}

/// The `overload` config: as [`config`], plus `maxconn` on every server
/// (one count per server, the last repeats), `timeout queue` and an admin
/// socket at `admin`; no retries (a queue timeout is final, a 503 from
/// HAProxy).
fn overload_config(
    port: u16,
    ports: &[u16],
    maxconn: &[usize],
    queue: Duration,
    timeout: Duration,
    admin: &Path,
) -> String {
    let ms = timeout.as_millis().max(1);
    let queue_ms = queue.as_millis().max(1);
    let mut servers = String::new();
    for (i, p) in ports.iter().enumerate() {
        let m = maxconn
            .get(i)
            .or(maxconn.last())
            .copied()
            .unwrap_or(1)
            .max(1);
        let _ = writeln!(servers, "    server s{i} 127.0.0.1:{p} maxconn {m}");
    }
    format!(
        "global
    nbthread 1
    maxconn 8192
    stats socket {} mode 600 level admin

defaults
    mode http
    option http-keep-alive
    http-reuse always
    retries 0
    timeout connect {ms}ms
    timeout client {ms}ms
    timeout server {ms}ms
    timeout http-keep-alive {ms}ms
    timeout queue {queue_ms}ms

frontend bench
    bind 127.0.0.1:{port}
    maxconn 8192
    default_backend backends

backend backends
    balance leastconn
{servers}",
        admin.display()
    )
}

/// The temporary directory of the haproxy on `port`.
fn dir_for(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!(
        "actix-dispatch-bench-haproxy-{}-{port}",
        std::process::id()
    ))
}

/// A running haproxy.
pub struct Haproxy {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl Haproxy {
    /// Starts haproxy in front of `ports` (see the module doc for the config).
    pub fn start(bin: &Path, ports: &[u16], timeout: Duration) -> Result<Haproxy, String> {
        let port = free_port()?;
        Self::run(bin, port, config(port, ports, timeout))
    }

    /// Starts haproxy in front of `ports` with `maxconn` per server (one
    /// count per server, the last repeats) and `timeout queue` (the
    /// `overload` scenario's config).
    pub fn start_overload(
        bin: &Path,
        ports: &[u16],
        maxconn: &[usize],
        queue: Duration,
        timeout: Duration,
    ) -> Result<Haproxy, String> {
        let port = free_port()?;
        let admin = dir_for(port).join("admin.sock");
        Self::run(
            bin,
            port,
            overload_config(port, ports, maxconn, queue, timeout, &admin),
        )
    }

    /// Sets server `i`'s `maxconn` while haproxy runs (through the admin
    /// socket of the `overload` config).
    pub fn set_maxconn(&self, i: usize, maxconn: usize) -> Result<(), String> {
        let sock = self.set_maxconn_later(i, maxconn)?;
        Self::answered(sock)
    }

    /// Sends [`Haproxy::set_maxconn`]'s command without waiting for the
    /// answer (a load loop's thread must not wait on haproxy); read it
    /// with [`Haproxy::answered`].
    pub fn set_maxconn_later(&self, i: usize, maxconn: usize) -> Result<UnixStream, String> {
        use std::io::Write;
        let path = self.dir.join("admin.sock");
        let mut sock = UnixStream::connect(&path)
            .map_err(|e| format!("haproxy admin socket {}: {e}", path.display()))?;
        sock.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        writeln!(sock, "set maxconn server backends/s{i} {}", maxconn.max(1))
            .map_err(|e| format!("haproxy admin socket: {e}"))?;
        Ok(sock)
    }

    /// The answer to a command sent by [`Haproxy::set_maxconn_later`].
    pub fn answered(mut sock: UnixStream) -> Result<(), String> {
        use std::io::Read;
        // haproxy answers, then closes the connection (non-interactive mode).
        let mut answer = String::new();
        let _ = sock.read_to_string(&mut answer);
        let answer = answer.trim();
        if answer.is_empty() {
            Ok(())
        } else {
            Err(format!("haproxy refused set maxconn: {answer}"))
        }
    }

    fn run(bin: &Path, port: u16, text: String) -> Result<Haproxy, String> {
        let dir = dir_for(port);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let conf_path = dir.join("haproxy.cfg");
        std::fs::write(&conf_path, text).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        // -db: foreground, no daemon; -f: the config.
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut h = Haproxy { child, dir, port };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        for _ in 0..250 {
            if let Ok(Some(status)) = h.child.try_wait() {
                return Err(format!("haproxy exited at once ({status})"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok() {
                return Ok(h);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("haproxy did not listen within 5 s".into())
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        // One process, one thread: SIGKILL leaves nothing behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_lists_every_server_under_leastconn() {
        let c = config(9000, &[1, 2, 3], Duration::from_secs(5));
        assert!(c.contains("balance leastconn\n    server s0 127.0.0.1:1\n"));
        assert!(c.contains("server s2 127.0.0.1:3"));
        assert!(c.contains("bind 127.0.0.1:9000"));
        assert!(c.contains("timeout server 5000ms"));
    }

    #[test]
    fn overload_config_caps_every_server_and_bounds_the_queue() {
        let c = overload_config(
            9000,
            &[1, 2, 3],
            &[2, 8],
            Duration::from_millis(100),
            Duration::from_secs(5),
            Path::new("/tmp/x/admin.sock"),
        );
        assert!(c.contains("server s0 127.0.0.1:1 maxconn 2\n"));
        assert!(c.contains("server s1 127.0.0.1:2 maxconn 8\n"));
        assert!(c.contains("server s2 127.0.0.1:3 maxconn 8\n"));
        assert!(c.contains("stats socket /tmp/x/admin.sock mode 600 level admin\n"));
        assert!(c.contains("timeout queue 100ms"));
        assert!(c.contains("retries 0"));
    }
}
