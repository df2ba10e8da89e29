//! A real `redis-server` for the tests: ephemeral port, no persistence.
//!
//! [`RedisServer::start`] picks a free loopback port (binds `127.0.0.1:0`,
//! releases it), runs `redis-server --port P --bind 127.0.0.1 --save ''
//! --appendonly no`, and waits (at most 5 s) until it answers. Dropping it
//! kills the process (after a `SIGCONT`, in case a test paused it).
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
}

impl RedisServer {
    /// Starts one, or `None` when redis-server is missing and not required.
    pub fn start() -> Option<RedisServer> {
        let required =
            std::env::var_os("CI").is_some() || std::env::var_os("REDIS_REQUIRED").is_some();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
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
        let s = RedisServer { child, port };
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
        matches!(c.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
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
    }
}
