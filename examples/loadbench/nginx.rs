//! nginx as the reference proxy: found (or installed with
//! `bench/install-nginx.sh`), configured in a temporary directory, run in the
//! foreground on 127.0.0.1, stopped at the end.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where nginx lives, if it is installed.
fn find() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// nginx's path, installing it first when allowed. `Err` says why not.
pub fn find_or_install(allow_install: bool) -> Result<PathBuf, String> {
    if let Some(p) = find() {
        return Ok(p);
    }
    if !allow_install {
        return Err("nginx is not installed (and --no-install-nginx was given)".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/install-nginx.sh");
    eprintln!("nginx not found: running {}", script.display());
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
    find().ok_or_else(|| "nginx still not found after installing it".into())
}

/// A free port on 127.0.0.1 (bound, then released for nginx to take).
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    Ok(port)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// A running nginx.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl Nginx {
    /// Starts nginx in front of `ports` with `least_conn` and `keepalive`
    /// idle connections per worker, one worker process, `timeout` for
    /// connect and read (after which it tries the next upstream, like the
    /// engine's retry).
    pub fn start(
        bin: &Path,
        ports: &[u16],
        keepalive: usize,
        timeout: Duration,
    ) -> Result<Nginx, String> {
        Self::start_with_workers(bin, ports, keepalive, timeout, 1)
    }

    /// As [`Nginx::start`], with `workers` worker processes.
    pub fn start_with_workers(
        bin: &Path,
        ports: &[u16],
        keepalive: usize,
        timeout: Duration,
        workers: usize,
    ) -> Result<Nginx, String> {
        let port = free_port()?;
        let workers = workers.max(1);
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-bench-nginx-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let d = dir.display();
        let ms = timeout.as_millis().max(1);
        let mut servers = String::new();
        for p in ports {
            let _ = writeln!(servers, "        server 127.0.0.1:{p};");
        }
        let user = if is_root() { "user root;\n" } else { "" };
        let conf = format!(
            "{user}worker_processes {workers};
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    upstream backends {{
        least_conn;
{servers}        keepalive {keepalive};
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_connect_timeout {ms}ms;
            proxy_read_timeout {ms}ms;
            proxy_send_timeout {ms}ms;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .arg("-g")
            .arg("daemon off;")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut n = Nginx { child, dir, port };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        for _ in 0..250 {
            if let Ok(Some(status)) = n.child.try_wait() {
                let log = std::fs::read_to_string(n.dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited at once ({status}): {log}"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok() {
                return Ok(n);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("nginx did not listen within 5 s".into())
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers and exits (SIGKILL would
        // orphan the worker).
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let mut gone = false;
        for _ in 0..150 {
            if let Ok(Some(_)) = self.child.try_wait() {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !gone {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
